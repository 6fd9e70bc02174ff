"""Rows to wire hits (pure): what a search or a history read returns, built by column name
from the rows of :mod:`blackboard.db.search_sql`."""

from __future__ import annotations

import json
from typing import Any

from blackboard.db.search_sql import EntryRow, MemoryRow, RevisionRow, SourceRow
from blackboard.protocol import codec
from blackboard.protocol.schemas.search import EntryHit, EntryRevision, MemoryHit, MemorySource

__all__ = ["entry_hit", "memory_hit", "memory_source", "revision", "stored_value"]


def stored_value(value: Any, raw: bytes | None) -> Any:
    """A stored value: ``raw`` (the msgpack of a value JSON cannot hold) decoded if there is
    one, else ``value``."""
    return codec.decode(bytes(raw)) if raw is not None else value


def _json(text: str | None) -> Any:
    """A JSON column read as text (see :func:`blackboard.db.search_sql.with_rows`)."""
    return None if text is None else json.loads(text)


def memory_hit(row: MemoryRow, score: float, scores: dict[str, float]) -> MemoryHit:
    """The hit of a memory candidate with its fused score and its retrievers' scores."""
    return MemoryHit(id=row.id, board=row.board, agent=row.agent, kind=row.kind, text=row.text, tags=row.tags,
                     metadata=_json(row.metadata), importance=row.importance, source=row.source,
                     created_at=row.created_at, updated_at=row.updated_at, revision=row.revision, score=score,
                     scores=scores, verdict=row.verdict, key=row.key, occurred_at=row.occurred_at,
                     valid_from=row.valid_from, valid_to=row.valid_to, superseded_by=row.superseded_by,
                     confidence=row.confidence, seen_count=row.seen_count, hits=row.hits,
                     archived_at=row.archived_at, archive_reason=row.archive_reason, merged_into=row.merged_into,
                     contested_by=row.contested_by)


def memory_source(row: SourceRow) -> MemorySource:
    """One memory merged into a kept memory."""
    return MemorySource(id=row.id, agent=row.agent, created_at=row.created_at, stream=row.stream, seq=row.seq,
                        sig_key=row.sig_key, sig=row.sig, verdict=row.verdict, how=row.how,
                        merged_at=row.merged_at)


def entry_hit(row: EntryRow, score: float, scores: dict[str, float]) -> EntryHit:
    """The hit of an entry candidate with its fused score and its retrievers' scores."""
    return EntryHit(board=row.board, section=row.section, key=row.key, revision=row.revision,
                    value=stored_value(_json(row.value), row.value_raw), content_type=row.content_type,
                    tags=row.tags, metadata=_json(row.metadata), author=row.author, created_at=row.created_at,
                    updated_at=row.updated_at, score=score, scores=scores, verdict=row.verdict)


def revision(row: RevisionRow) -> EntryRevision:
    """One stored revision of a key."""
    return EntryRevision(board=row.board, section=row.section, key=row.key, revision=row.revision, op=row.op,
                         value=stored_value(row.value, row.value_raw), content_type=row.content_type,
                         tags=row.tags, metadata=row.metadata, author=row.author, created_at=row.created_at,
                         stored_at=row.stored_at, verdict=row.verdict)
