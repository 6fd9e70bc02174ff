"""JetStream assets of a deployment, declared as objects and created idempotently.

* ``KV_<bucket>``: the KV bucket holding every board (subjects ``$KV.<bucket>.>``).
* ``BB_MEMORY``: long-term memories published by agents (``bb.mem.>``).
* ``BB_MSG``: agent messages: direct, broadcast, topic (``bb.msg.>``).
* ``BB_VOTE``: proposals, ballots and outcomes (``bb.vote.>``).
* ``BB_KEYS``: the key registry: identities' certificates and the revocations (``bb.keys.>``).
* Object store ``<objects_bucket>`` for large binaries.

Every stream but the object store's refuses rollups, message deletes and
purges (``allow_rollup_hdrs: false``, ``deny_delete: true``, ``deny_purge:
true``): whoever may write one subject of a stream could otherwise drop what
others wrote (a ``Nats-Rollup: all`` header empties the whole stream). The
object store keeps them: nats-py's object store rolls up an object's metadata
and purges its old chunks. One exception the server makes: a KV stream with
subject delete markers (``board.expiry_marker_ttl`` > 0) has rollups and
purges switched back on by nats-server, which places its markers as rollups;
``ensure_streams`` warns when that is so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from nats.js import JetStreamContext, api
from nats.js.errors import APIError, BadRequestError, NotFoundError, ServiceUnavailableError

from blackboard.protocol.errors import ConfigurationError, OperationTimeoutError
from blackboard.protocol.subjects import (
    KEYS_STREAM,
    MEMORY_STREAM,
    MESSAGE_STREAM,
    VOTE_STREAM,
    Subjects,
)
from blackboard.settings import Settings

__all__ = ["CLUSTER_NOT_READY", "NO_JETSTREAM_GRACE", "StreamSpec", "cluster_not_ready", "ensure_streams",
           "kv_stream_config", "no_jetstream", "refuses_removal", "stream_specs"]

log = logging.getLogger("blackboard.client.streams")

_DAY = 24 * 3600.0
#: Messages kept per subject of the key registry (a certificate, the revocations).
_KEY_HISTORY = 8


@dataclass(frozen=True)
class StreamSpec:
    """One JetStream stream of the deployment."""

    name: str
    subjects: tuple[str, ...]
    description: str
    max_age: float | None = None
    max_msg_size: int | None = None
    duplicate_window: float = 120.0
    max_msgs_per_subject: int | None = None

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
            max_msgs_per_subject=self.max_msgs_per_subject or -1,
            allow_direct=True,
            allow_msg_ttl=True,
            allow_rollup_hdrs=False,
            deny_delete=True,
            deny_purge=True,
        )


def stream_specs(settings: Settings) -> list[StreamSpec]:
    """The plain streams (the KV bucket and object store are created separately)."""
    size = settings.board.max_value_size
    window = settings.nats.duplicate_window
    return [
        StreamSpec(MEMORY_STREAM, (Subjects.memory_all(),), "blackboard long-term memories", max_msg_size=size,
                   duplicate_window=window),
        StreamSpec(MESSAGE_STREAM, (Subjects.messages_all(),), "blackboard agent messages", max_msg_size=size,
                   duplicate_window=window),
        StreamSpec(VOTE_STREAM, (Subjects.votes_all(),), "blackboard proposals, ballots and outcomes",
                   max_msg_size=size, duplicate_window=window),
        # A reader takes the last message of a subject; a few earlier ones are kept for audit.
        StreamSpec(KEYS_STREAM, (Subjects.keys_all(),), "blackboard signing keys: certificates, revocations",
                   max_msg_size=size, duplicate_window=window, max_msgs_per_subject=_KEY_HISTORY),
    ]


def kv_stream_config(settings: Settings) -> api.StreamConfig:
    """The board bucket's stream: a JetStream KV bucket's configuration (as nats-py's
    ``create_key_value`` makes it), refusing rollups, message deletes and purges (pure)."""
    b = settings.board
    subjects = Subjects(b.bucket)
    return api.StreamConfig(
        name=subjects.kv_stream,
        description="blackboard entries: <board>.<section>.<key>",
        subjects=[subjects.entry_filter()],
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE,
        num_replicas=b.replicas,
        max_consumers=-1,
        max_msgs=-1,
        max_msgs_per_subject=b.history,
        max_msg_size=b.max_value_size,
        discard=api.DiscardPolicy.NEW,
        duplicate_window=settings.nats.duplicate_window,
        allow_direct=True,
        allow_msg_ttl=True,
        allow_rollup_hdrs=False,
        deny_delete=True,
        deny_purge=True,
        subject_delete_marker_ttl=b.expiry_marker_ttl or None,
    )


def refuses_removal(config: api.StreamConfig) -> bool:
    """Whether a stream refuses rollups, message deletes and purges (pure)."""
    return not config.allow_rollup_hdrs and bool(config.deny_delete) and bool(config.deny_purge)


def _refuse_removal(config: api.StreamConfig) -> None:
    config.allow_rollup_hdrs = False
    config.deny_delete = True
    config.deny_purge = True


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


#: nats-server's stream configuration validation error (JSStreamInvalidConfigF, answered as a
#: 500): an update the server will not make, e.g. one that would cancel ``deny_purge``.
_STREAM_INVALID_CONFIG = 10052


async def _update(js: JetStreamContext, config: api.StreamConfig, hint: str = "") -> api.StreamInfo:
    try:
        return await js.update_stream(config)
    except APIError as exc:
        if not isinstance(exc, BadRequestError) and exc.err_code != _STREAM_INVALID_CONFIG:
            raise
        raise ConfigurationError(f"cannot update stream {config.name}: {exc.description}{hint}") from exc


async def _ensure(js: JetStreamContext, settings: Settings, *, update: bool) -> None:
    subjects = Subjects(settings.board.bucket)
    want = settings.board.replicas
    want_marker = settings.board.expiry_marker_ttl or None
    try:
        cfg = (await js.stream_info(subjects.kv_stream)).config
        if update:
            replicas = _replicas(subjects.kv_stream, cfg.num_replicas or 1, want)
            if (cfg.max_msgs_per_subject != settings.board.history
                    or cfg.max_msg_size != settings.board.max_value_size
                    or (cfg.subject_delete_marker_ttl or None) != want_marker
                    or (cfg.num_replicas or 1) != replicas
                    or cfg.duplicate_window != settings.nats.duplicate_window
                    or (want_marker is None and not refuses_removal(cfg))
                    or not cfg.deny_delete):
                cfg.max_msgs_per_subject = settings.board.history
                cfg.max_msg_size = settings.board.max_value_size
                cfg.allow_msg_ttl = True
                cfg.subject_delete_marker_ttl = want_marker
                cfg.num_replicas = replicas
                cfg.duplicate_window = settings.nats.duplicate_window
                sealed = bool(cfg.deny_purge)
                _refuse_removal(cfg)
                cfg = (await _update(js, cfg, hint=(
                    ". A stream that refuses purges cannot take subject delete markers (nats-server "
                    "would turn purges back on, and never lets deny_purge be cancelled): set "
                    "board.expiry_marker_ttl to 0") if sealed and want_marker else "")).config
        created = False
    except NotFoundError:
        cfg = (await js.add_stream(kv_stream_config(settings))).config
        log.info("created KV bucket %s", settings.board.bucket)
        created = True
    if (update or created) and not settings.nats.insecure_open_bus and not refuses_removal(cfg):
        log.warning(
            "stream %s allows rollups or purges: any identity that may write one board key can drop "
            "every board's entries (a Nats-Rollup: all header). %s", subjects.kv_stream,
            "nats-server allows them on a stream with subject delete markers: set board.expiry_marker_ttl "
            "to 0 to refuse them (expired entries then leave no marker)" if cfg.subject_delete_marker_ttl
            else "Run 'blackboard setup' (ensure_streams(update=True)) to refuse them")

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
