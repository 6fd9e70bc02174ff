"""JetStream assets of a deployment, declared as objects and created idempotently.

* ``KV_<bucket>``: the KV bucket holding every board (subjects ``$KV.<bucket>.>``).
* ``BB_MEMORY``: long-term memories published by agents (``bb.mem.>``).
* ``BB_MSG``: agent messages: direct, broadcast, topic (``bb.msg.>``).
* ``BB_VOTE``: proposals, ballots and outcomes (``bb.vote.>``).
* Object store ``<objects_bucket>`` for large binaries.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError

from blackboard.errors import ConfigurationError
from blackboard.settings import Settings
from blackboard.subjects import MEMORY_STREAM, MESSAGE_STREAM, VOTE_STREAM, Subjects

__all__ = ["StreamSpec", "ensure_streams", "stream_specs"]

log = logging.getLogger("blackboard.streams")

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


async def ensure_streams(js: JetStreamContext, settings: Settings, *, update: bool = False) -> None:
    """Create the KV bucket, the streams and the object store if they are missing.

    Idempotent. With ``update=True`` an existing asset whose configuration
    differs is updated to match the settings (what ``blackboard dev`` and the
    worker do); otherwise it is left as it is.

    Raises:
        ConfigurationError: an asset exists with an incompatible configuration
            that cannot be updated.
    """
    subjects = Subjects(settings.board.bucket)
    try:
        info = await js.stream_info(subjects.kv_stream)
        cfg = info.config
        want_hist = settings.board.history
        want_marker = settings.board.expiry_marker_ttl or None
        if update and (cfg.max_msgs_per_subject != want_hist or cfg.max_msg_size != settings.board.max_value_size
                       or (cfg.subject_delete_marker_ttl or None) != want_marker):
            cfg.max_msgs_per_subject = want_hist
            cfg.max_msg_size = settings.board.max_value_size
            cfg.allow_msg_ttl = True
            cfg.subject_delete_marker_ttl = want_marker
            await js.update_stream(cfg)
    except NotFoundError:
        await js.create_key_value(kv_config(settings))
        log.info("created KV bucket %s", settings.board.bucket)

    for spec in stream_specs(settings):
        config = spec.config(settings.board.replicas)
        try:
            await js.stream_info(spec.name)
            if update:
                try:
                    await js.update_stream(config)
                except BadRequestError as exc:
                    raise ConfigurationError(f"cannot update stream {spec.name}: {exc.description}") from exc
        except NotFoundError:
            await js.add_stream(config)
            log.info("created stream %s", spec.name)

    try:
        await js.object_store(settings.board.objects_bucket)
    except NotFoundError:  # nats-py's BucketNotFoundError is a NotFoundError
        await js.create_object_store(
            settings.board.objects_bucket,
            config=api.ObjectStoreConfig(description="blackboard binaries", replicas=settings.board.replicas,
                                         storage=api.StorageType.FILE),
        )
