"""JetStream assets of a deployment, declared as objects and created idempotently.

* ``KV_<bucket>``: the KV bucket holding every board (subjects ``$KV.<bucket>.>``).
* ``BB_MEMORY``: long-term memories published by agents (``bb.mem.>``).
* ``BB_MSG``: agent messages: direct, broadcast, topic (``bb.msg.>``).
* ``BB_VOTE``: proposals, ballots and outcomes (``bb.vote.>``).
* Object store ``<objects_bucket>`` for large binaries.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from nats.js import JetStreamContext, api
from nats.js.errors import APIError, BadRequestError, NotFoundError, ServiceUnavailableError

from blackboard.protocol.errors import ConfigurationError, OperationTimeoutError
from blackboard.protocol.subjects import MEMORY_STREAM, MESSAGE_STREAM, VOTE_STREAM, Subjects
from blackboard.settings import Settings

__all__ = ["CLUSTER_NOT_READY", "NO_JETSTREAM_GRACE", "StreamSpec", "cluster_not_ready", "ensure_streams",
           "no_jetstream", "stream_specs"]

log = logging.getLogger("blackboard.client.streams")

_DAY = 24 * 3600.0


@dataclass(frozen=True)
class StreamSpec:
    """One JetStream stream of the deployment."""

    name: str
    subjects: tuple[str, ...]
    description: str
    max_age: float | None = None
    max_msg_size: int | None = None
    duplicate_window: float = 120.0

    def config(self, replicas: int) -> api.StreamConfig:
        return api.StreamConfig(
            name=self.name,
            description=self.description,
            subjects=list(self.subjects),
            retention=api.RetentionPolicy.LIMITS,
            storage=api.StorageType.FILE,
            num_replicas=replicas,
            max_age=self.max_age,
            max_msg_size=self.max_msg_size,
            duplicate_window=self.duplicate_window,
            allow_direct=True,
            allow_msg_ttl=True,
        )


def stream_specs(settings: Settings) -> list[StreamSpec]:
    """The plain streams (the KV bucket and object store are created separately)."""
    size = settings.board.max_value_size
    return [
        StreamSpec(MEMORY_STREAM, (Subjects.memory_all(),), "blackboard long-term memories", max_msg_size=size),
        StreamSpec(MESSAGE_STREAM, (Subjects.messages_all(),), "blackboard agent messages", max_msg_size=size),
        StreamSpec(VOTE_STREAM, (Subjects.votes_all(),), "blackboard proposals, ballots and outcomes",
                   max_msg_size=size),
    ]


def kv_config(settings: Settings) -> api.KeyValueConfig:
    b = settings.board
    return api.KeyValueConfig(
        bucket=b.bucket,
        description="blackboard entries: <board>.<section>.<key>",
        history=b.history,
        replicas=b.replicas,
        max_value_size=b.max_value_size,
        storage=api.StorageType.FILE,
        direct=True,
        limit_marker_ttl=b.expiry_marker_ttl or None,
    )


#: JetStream API error codes of a cluster that is forming or electing leaders:
#: no suitable peers for placement (a peer not yet seen online), temporarily
#: unavailable, this server cannot handle the request (no meta leader yet).
CLUSTER_NOT_READY = frozenset({10005, 10008, 10009})
#: Seconds ``ensure_streams`` waits for a JetStream API that nothing answers
#: (a server starting up) before it concludes that JetStream is off.
NO_JETSTREAM_GRACE = 2.0


def no_jetstream(exc: BaseException) -> bool:
    """Whether nothing answered a JetStream API request (nats-py's bare 503): JetStream is
    not enabled for the account, or the server is still starting."""
    return isinstance(exc, ServiceUnavailableError) and exc.err_code is None


def cluster_not_ready(exc: BaseException) -> bool:
    """Whether a JetStream API failure is one a forming cluster gives (worth retrying)."""
    if isinstance(exc, TimeoutError) or no_jetstream(exc):
        return True
    return isinstance(exc, APIError) and exc.err_code in CLUSTER_NOT_READY


async def ensure_streams(js: JetStreamContext, settings: Settings, *, update: bool = False,
                         ready_timeout: float = 30.0) -> None:
    """Create the KV bucket, the streams and the object store if they are missing.

    Idempotent. With ``update=True`` an existing asset whose configuration
    differs is updated to match the settings (what ``blackboard setup`` and
    ``blackboard dev`` do), except that a stream's replicas are never lowered
    (a warning says so); otherwise it is left as it is.

    A cluster that has just started answers for a while that it has no
    suitable peers, or no leader: such failures are retried (with a warning,
    backing off up to 2 s) for ``ready_timeout`` seconds, so that ``setup``
    and workers started together with the NATS nodes wait for them.

    Raises:
        ConfigurationError: an asset exists with an incompatible configuration
            that cannot be updated, or nothing answers JetStream API requests
            (after :data:`NO_JETSTREAM_GRACE` seconds): JetStream is off.
        OperationTimeoutError: the cluster was still not ready after ``ready_timeout``.
    """
    started = time.monotonic()
    deadline = started + ready_timeout
    delay = 0.1
    warned = False
    while True:
        try:
            await _ensure(js, settings, update=update)
            return
        except Exception as exc:
            if not cluster_not_ready(exc):
                raise
            unanswered = no_jetstream(exc)
            if unanswered and time.monotonic() - started >= min(NO_JETSTREAM_GRACE, ready_timeout):
                raise ConfigurationError(
                    f"no JetStream at {settings.nats.url}: nothing answers its API requests. Enable it "
                    "on the server (nats-server -js, or a jetstream block in its configuration) and "
                    "for this account") from exc
            reason = ("nothing answers JetStream API requests" if unanswered
                      else getattr(exc, "description", None) or type(exc).__name__)
            if time.monotonic() + delay > deadline:
                raise OperationTimeoutError(
                    f"JetStream not ready after {ready_timeout:g}s ({reason}): are all the cluster's "
                    "nodes up and routed to each other?") from exc
            if not warned:
                log.warning("JetStream not ready (%s); retrying for up to %gs", reason, ready_timeout)
                warned = True
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)


def _replicas(stream: str, have: int, want: int) -> int:
    """The replicas an update gives a stream: the settings', but never fewer than it has.

    Settings left at their default (1) must not quietly take a cluster's
    copies away: lowering them is an explicit operation (the nats CLI).
    """
    if have > want:
        log.warning("stream %s has %d replicas and the settings ask for %d: kept at %d "
                    "(lower it with the nats CLI if you mean to)", stream, have, want, have)
        return have
    return want


async def _update(js: JetStreamContext, config: api.StreamConfig) -> None:
    try:
        await js.update_stream(config)
    except BadRequestError as exc:
        raise ConfigurationError(f"cannot update stream {config.name}: {exc.description}") from exc


async def _ensure(js: JetStreamContext, settings: Settings, *, update: bool) -> None:
    subjects = Subjects(settings.board.bucket)
    want = settings.board.replicas
    try:
        cfg = (await js.stream_info(subjects.kv_stream)).config
        if update:
            want_marker = settings.board.expiry_marker_ttl or None
            replicas = _replicas(subjects.kv_stream, cfg.num_replicas or 1, want)
            if (cfg.max_msgs_per_subject != settings.board.history
                    or cfg.max_msg_size != settings.board.max_value_size
                    or (cfg.subject_delete_marker_ttl or None) != want_marker
                    or (cfg.num_replicas or 1) != replicas):
                cfg.max_msgs_per_subject = settings.board.history
                cfg.max_msg_size = settings.board.max_value_size
                cfg.allow_msg_ttl = True
                cfg.subject_delete_marker_ttl = want_marker
                cfg.num_replicas = replicas
                await _update(js, cfg)
    except NotFoundError:
        await js.create_key_value(kv_config(settings))
        log.info("created KV bucket %s", settings.board.bucket)

    for spec in stream_specs(settings):
        config = spec.config(want)
        try:
            info = await js.stream_info(spec.name)
            if update:
                config.num_replicas = _replicas(spec.name, info.config.num_replicas or 1, want)
                await _update(js, config)
        except NotFoundError:
            await js.add_stream(config)
            log.info("created stream %s", spec.name)

    objects = Subjects.objects_stream(settings.board.objects_bucket)
    try:
        cfg = (await js.stream_info(objects)).config
        if update and (cfg.num_replicas or 1) != (replicas := _replicas(objects, cfg.num_replicas or 1, want)):
            cfg.num_replicas = replicas
            await _update(js, cfg)
    except NotFoundError:
        await js.create_object_store(
            settings.board.objects_bucket,
            config=api.ObjectStoreConfig(description="blackboard binaries", replicas=want,
                                         storage=api.StorageType.FILE),
        )
