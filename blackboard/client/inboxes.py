"""An agent's durable inbox consumer on ``BB_MSG``: its grants and its configuration (pure).

The one place the configuration of ``inbox-<agent>`` is built: the SDK uses it
on an open bus (``nats.insecure_open_bus``), where an agent manages its own
consumer, and the system service's inbox administration
(:mod:`blackboard.worker.inbox_admin`, ``bb.inbox.<agent>``) uses it
everywhere else, where agents may not create or update consumers on
``BB_MSG`` (a consumer with several filter subjects is created through the API
subject without a filter, so the server cannot check its filters).

An inbox's filter subjects are the agent's direct subject plus the broadcast
subjects of the boards it joined and the topic patterns it subscribed to. Each
of those *grants* is stored with the stream sequence it was added at, in the
consumer's metadata (``bb.start:<subject> = <seq>``); a message is admitted
when a grant matches its subject and its sequence is above that grant's start,
so joining a board does not replay the board's old broadcasts, while direct
messages (start 0) are all delivered, including those sent before the agent
ever connected. See docs/messaging.md.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from nats.js import api

from blackboard.protocol.errors import InvalidKeyError
from blackboard.protocol.subjects import Subjects, pattern_covers, patterns_overlap, subject_matches
from blackboard.settings import MessagingSettings

__all__ = [
    "admitted",
    "consumer_filters",
    "grants_from_metadata",
    "grants_of",
    "inbox_config",
    "metadata_from_grants",
    "with_grant",
    "without_grant",
]

log = logging.getLogger("blackboard.client.inboxes")

_START_PREFIX = Subjects.inbox_start_key("")
#: Metadata the server sets on a consumer (never copied into a new configuration).
_SERVER_METADATA_PREFIX = "_nats."


def consumer_filters(grants: Mapping[str, int]) -> list[str]:
    """The consumer's filter subjects for a set of grants: the maximal patterns.

    A pattern covered by another (``build.failed`` under ``build.>``) needs no
    filter of its own. JetStream refuses overlapping filters, so two patterns
    that overlap without one covering the other are refused.

    Raises:
        InvalidKeyError: two grants overlap partially (e.g. ``a.*.c`` and ``a.b.*``).
    """
    patterns = sorted(grants)
    maximal = [p for p in patterns if not any(q != p and pattern_covers(q, p) for q in patterns)]
    for i, p in enumerate(maximal):
        for q in maximal[i + 1:]:
            if patterns_overlap(p, q):
                raise InvalidKeyError(p, f"overlaps the subscription {q!r} without covering it or "
                                         f"being covered by it; unsubscribe one first")
    return maximal


def with_grant(grants: Mapping[str, int], pattern: str, start: int) -> dict[str, int]:
    """Grants plus ``pattern`` admitted from stream sequence ``start + 1`` on.

    An existing grant for the same pattern keeps its (earlier) start.

    Raises:
        InvalidKeyError: the pattern overlaps an existing one partially.
    """
    if pattern in grants:
        return dict(grants)
    new = {**grants, pattern: start}
    consumer_filters(new)
    return new


def without_grant(grants: Mapping[str, int], pattern: str) -> dict[str, int]:
    """Grants without ``pattern`` (unchanged when it is not there)."""
    return {p: s for p, s in grants.items() if p != pattern}


def admitted(subject: str, seq: int, grants: Mapping[str, int]) -> bool:
    """Whether the inbox delivers the message at stream sequence ``seq`` on ``subject``."""
    return any(seq > start and subject_matches(subject, p) for p, start in grants.items())


def grants_from_metadata(metadata: Mapping[str, str] | None, filters: Collection[str]) -> dict[str, int]:
    """Read grants back from consumer metadata; a filter without a start entry starts at 0."""
    grants: dict[str, int] = {}
    for key, value in (metadata or {}).items():
        if key.startswith(_START_PREFIX):
            try:
                grants[key[len(_START_PREFIX):]] = int(value)
            except ValueError:
                log.warning("ignoring inbox metadata %s=%r (not a sequence)", key, value)
    for f in filters:
        if not any(p == f or pattern_covers(f, p) for p in grants):
            grants[f] = 0
    return grants


def metadata_from_grants(grants: Mapping[str, int]) -> dict[str, str]:
    """Consumer metadata entries that record ``grants``."""
    return {Subjects.inbox_start_key(p): str(s) for p, s in sorted(grants.items())}


def grants_of(config: api.ConsumerConfig, agent: str) -> dict[str, int]:
    """The grants an inbox consumer's configuration records (its direct subject always among
    them, from 0 when missing)."""
    filters = list(config.filter_subjects or ([config.filter_subject] if config.filter_subject else []))
    grants = grants_from_metadata(config.metadata, filters)
    grants.setdefault(Subjects.direct(agent), 0)
    return grants


def inbox_config(agent: str, grants: Mapping[str, int], settings: MessagingSettings, *,
                 base: api.ConsumerConfig | None = None, ack_wait: float | None = None,
                 max_ack_pending: int | None = None) -> api.ConsumerConfig:
    """The configuration of ``agent``'s inbox consumer ``inbox-<agent>`` for ``grants``.

    Explicit acks, never given up on (``max_deliver`` -1), filter subjects from
    :func:`consumer_filters`, the grants' starts in the metadata. ``base`` (the
    consumer's current configuration) keeps its start policy and the metadata
    that is not ours; ``ack_wait`` and ``max_ack_pending`` default to the
    settings' ``inbox_ack_wait`` and ``inbox_max_ack_pending``.

    Raises:
        InvalidKeyError: an invalid agent id, or two grants overlap partially.
    """
    name = Subjects.inbox_consumer(agent)
    metadata = {k: v for k, v in ((base.metadata if base else None) or {}).items()
                if not k.startswith(_START_PREFIX) and not k.startswith(_SERVER_METADATA_PREFIX)}
    metadata.update(metadata_from_grants(grants))
    return api.ConsumerConfig(
        name=name,
        durable_name=name,
        description=f"inbox of agent {agent}",
        deliver_policy=base.deliver_policy if base else api.DeliverPolicy.ALL,
        opt_start_seq=base.opt_start_seq if base else None,
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=ack_wait if ack_wait is not None else settings.inbox_ack_wait,
        max_ack_pending=max_ack_pending if max_ack_pending is not None else settings.inbox_max_ack_pending,
        max_deliver=-1,
        max_waiting=64,
        filter_subjects=consumer_filters(grants),
        metadata=metadata,
    )
