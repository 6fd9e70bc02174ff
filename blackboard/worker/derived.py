"""Memories the worker derives: published signed, with provenance, and stored conditionally.

The consolidator (:mod:`blackboard.worker.consolidator`) asks the chat model to
merge two near-duplicates into one text, or to turn a memory into atomic
facts. It does not write those into PostgreSQL itself: :class:`DerivedPublisher`
publishes each result to ``BB_MEM`` as a memory record of the worker's own
(``agent`` = the worker's principal, on ``bb.mem.<board>.<principal>``), signed by
the worker identity like its vote outcomes, whose ``provenance`` names the exact
versions read (:class:`~blackboard.protocol.schemas.SourceRef`: stream,
sequence, and the signature each source carried). So a derived memory is
authentic and checkable like any other record, and a replay of the stream
rebuilds it.

At ingest (:func:`store_derived`, in the memory batch's transaction), a record
with provenance must be signed by a ``worker`` identity (:func:`derived_kind`,
else a dead letter ``wrong_author``). A merge (``source`` = :data:`MERGE_SOURCE`)
takes its sources' place only if each is still current at the sequence named:
they are archived (``merged_into`` = the derived id), their own sources move to
it, and it counts them all; if any source changed meanwhile, the derived memory
is stored archived with the reason ``conflict`` (nothing is overwritten). A fact
(``source`` = :data:`EXTRACT_SOURCE`) is a plain row, deduplicated like any memory.

:func:`revive_merged` makes a memory merged away live again when its writer
stores a newer version of it (its merge was about the older version).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS
from psycopg.rows import dict_row

from blackboard.client.publisher import Publisher
from blackboard.client.signing import signing_of
from blackboard.db import consolidate_sql as q
from blackboard.protocol.errors import BlackboardError
from blackboard.protocol.schemas import MemoryRecord
from blackboard.protocol.schemas.provenance import SourceRef, source_ref
from blackboard.protocol.subjects import MEMORY_STREAM, Header, Subjects
from blackboard.settings import Settings
from blackboard.worker.decode import MemoryRow
from blackboard.worker.stream_handler import Conn

__all__ = [
    "EXTRACT_SOURCE",
    "MERGE_SOURCE",
    "DerivedPublisher",
    "MemoryVersion",
    "derived_kind",
    "fact_records",
    "merge_record",
    "revive_merged",
    "store_derived",
]

log = logging.getLogger("blackboard.worker.derived")

#: The ``source`` of a memory the worker merged from the memories its provenance names.
MERGE_SOURCE = "bb:merge"
#: The ``source`` of a fact the worker extracted from the memory its provenance names.
EXTRACT_SOURCE = "bb:extract"


@dataclass(frozen=True, slots=True)
class MemoryVersion:
    """One stored version of a memory, as a consolidation read it (its row at ``seq``)."""

    mid: int
    id: str
    seq: int
    stream: str
    board: str
    agent: str
    kind: str
    text: str
    tags: list[str]
    metadata: dict[str, Any]
    importance: float
    subject_key: str | None
    created_at: datetime
    #: Its valid time's start: its event time, else its write time.
    valid_from: datetime
    verdict: str
    seen_count: int
    hits: int
    last_seen: datetime

    @classmethod
    def of(cls, row: dict[str, Any]) -> MemoryVersion:
        """The version of a row read with the consolidation's columns (``consolidate_sql``)."""
        return cls(int(row["mid"]), row["id"], int(row["seq"]), row["stream"], row["board"], row["agent"],
                   row["kind"], row["text"], list(row["tags"] or []), dict(row["metadata"] or {}),
                   float(row["importance"]), row["subject_key"], row["created_at"], row["valid_from"], row["verdict"],
                   int(row["seen_count"]), int(row["hits"]), row["last_seen"])


def _digest(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def merge_record(kept: MemoryVersion, newer: MemoryVersion, text: str, *, agent: str,
                 refs: Sequence[SourceRef], now: datetime | None = None) -> MemoryRecord:
    """The derived memory merging ``kept`` and ``newer`` into ``text`` (pure).

    Its id depends only on the versions merged, so the same merge published twice
    (a restarted consolidator) is one memory. Kind, metadata and subject key are the
    kept memory's, tags both memories', importance the greater; on a subject key its event
    time is the later of theirs (it is that version of the fact, not a newer one).
    """
    tags = list(dict.fromkeys([*kept.tags, *newer.tags]))
    return MemoryRecord(
        v=2, id="merge-" + _digest(*(f"{r.stream}:{r.seq}" for r in refs))[:32], board=kept.board, agent=agent,
        kind=kept.kind,
        text=text, tags=tags, metadata=kept.metadata, importance=max(kept.importance, newer.importance),
        source=MERGE_SOURCE, created_at=now or datetime.now(UTC), key=kept.subject_key,
        occurred_at=max(kept.valid_from, newer.valid_from) if kept.subject_key is not None else None,
        provenance=list(refs))


def fact_records(memory: MemoryVersion, facts: Sequence[str], *, agent: str, ref: SourceRef,
                 now: datetime | None = None) -> list[MemoryRecord]:
    """The ``semantic`` memories stating ``facts``, extracted from ``memory`` (pure); their ids
    depend on the version read and the fact, so an extraction repeated is the same memories."""
    at = now or datetime.now(UTC)
    base = _digest(ref.stream, str(ref.seq))[:16]
    return [MemoryRecord(v=2, id=f"fact-{base}-{_digest(fact)[:12]}", board=memory.board, agent=agent,
                         kind="semantic", text=fact, tags=list(memory.tags), importance=memory.importance,
                         source=EXTRACT_SOURCE, created_at=at, provenance=[ref])
            for fact in facts]


def derived_kind(row: MemoryRow) -> str | None:
    """The kind of identity that must have signed a memory: ``worker`` for one with provenance
    (a derived memory), None for any other (its author signs it)."""
    return "worker" if row.provenance else None


class DerivedPublisher:
    """Publishes the worker's derived memories, signed by its connection's key.

    Args:
        nc: the worker's connection (its own credential; signs when ``security.sign``).
        settings: the deployment's settings (``nats.*``; ``worker.name`` names the
            author on a connection that does not sign).
    """

    def __init__(self, nc: NATS, settings: Settings) -> None:
        self.nc = nc
        self.settings = settings
        self._signing = signing_of(nc)
        signer = self._signing.signer
        #: The derived memories' author: the signing key's principal (else the worker's name).
        self.principal = signer.principal if signer is not None else settings.worker.name
        self._publisher = Publisher(nc, nc.jetstream(timeout=settings.nats.request_timeout), settings.nats)

    async def publish(self, record: MemoryRecord) -> int:
        """Publish one derived memory; its stream sequence. The Msg-Id is its id and a digest
        of what it says, so a repeat within the duplicate window is stored once.

        Raises:
            BlackboardError: not stored (timeout, refused, not connected).
        """
        payload = record.canonical_bytes()
        subject = Subjects.memory(record.board, record.agent)
        headers = {Header.MSG_ID.value: f"{record.id}.{_digest(record.text)[:16]}"}
        ack = await self._publisher.publish(subject, payload, headers, what=f"derived memory {record.id!r}",
                                            sign=self._signing.sign_before_send(subject, headers, payload))
        return ack.seq

    async def source_ref(self, version: MemoryVersion) -> SourceRef:
        """The reference of a stored memory version: its stream and sequence, with the key and
        signature its message carries (both None when it is unsigned or no longer in the
        stream)."""
        try:
            msg = await self.nc.request(Subjects.direct_get(version.stream), json.dumps({"seq": version.seq}).encode(),
                                        timeout=self.settings.nats.request_timeout)
        except (nats.errors.Error, TimeoutError) as exc:
            log.warning("cannot read %s seq %d for its signature: %r", version.stream, version.seq, exc)
            return SourceRef(stream=version.stream, seq=version.seq)
        headers = msg.headers or {}
        if headers.get(Header.STATUS.value):  # 404: gone from the stream (limits, purge)
            return SourceRef(stream=version.stream, seq=version.seq)
        return source_ref(version.stream, version.seq, headers)

    async def close(self) -> None:
        """Release the publisher's ack subscription."""
        try:
            await self._publisher.close()
        except BlackboardError as exc:  # on the way out: the connection may be gone already
            log.debug("closing the derived-memory publisher: %r", exc)


# -- ingest ------------------------------------------------------------------------------

async def store_derived(conn: Conn, rows: Sequence[MemoryRow]) -> None:
    """Apply the derived merges among ``rows`` (just stored, in the same transaction): each
    takes its sources' place if every source is still current at the version named, else it
    is archived as a ``conflict``. A replay finds its sources merged into it already: nothing
    to do."""
    for row in rows:
        if row.source == MERGE_SOURCE and len(row.provenance) >= 2 and row.stream == MEMORY_STREAM:
            await _store_merge(conn, row)


async def _store_merge(conn: Conn, row: MemoryRow) -> None:
    cur = await conn.execute("SELECT mid, seq, archived_at FROM bb_memories WHERE id = %s", (row.id,))
    found = await cur.fetchone()
    if found is None or int(found[1]) != row.seq or found[2] is not None:
        return  # deduplicated into another memory, forgotten, replaced, or settled before
    mid = int(found[0])
    todo: list[tuple[MemoryVersion, SourceRef]] = []
    done = conflict = 0
    async with conn.cursor(row_factory=dict_row) as c:
        for ref in sorted(row.provenance, key=lambda r: (r.stream, r.seq)):  # one lock order
            await c.execute(q.LOCK_BY_VERSION, (ref.stream, ref.seq, row.board))
            stored = await c.fetchone()
            if stored is not None and stored["current"]:
                todo.append((MemoryVersion.of(stored), ref))
            elif stored is not None and stored["merged_into"] == row.id:
                done += 1
            else:
                conflict += 1
    if done:
        return  # a replay of a merge stored before
    if conflict or not todo:
        log.info("derived memory %s: its sources changed since they were read; stored archived (conflict)", row.id)
        await conn.execute(q.ARCHIVE_CONFLICT, {"mid": mid, "seq": row.seq})
        return
    seen = hits = 0
    last_seen = row.created_at
    for src, ref in todo:
        cur = await conn.execute(q.ARCHIVE_MERGED, {"into": row.id, "mid": src.mid, "seq": src.seq})
        assert await cur.fetchone() is not None  # locked and current above
        await conn.execute(q.MOVE_SOURCES, {"into": mid, "mid": src.mid})
        await conn.execute(q.INSERT_SOURCES, (src.id, mid, src.board, src.agent, src.stream, src.seq, src.created_at,
                                              ref.key, ref.sig, src.verdict, "llm"))
        seen += src.seen_count
        hits += src.hits
        last_seen = max(last_seen, src.last_seen)
    await conn.execute(q.SET_SEEN, {"mid": mid, "seq": row.seq, "seen": seen, "hits": hits, "last_seen": last_seen})


async def revive_merged(conn: Conn, rows: Sequence[MemoryRow]) -> None:
    """Make live again the memories merged away of which ``rows`` stored a newer version."""
    if rows:
        await conn.execute(q.REVIVE_MERGED, ([r.id for r in rows], [r.seq for r in rows]))
