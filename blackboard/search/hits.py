"""Rows to wire hits (pure): what a search or a history read returns, built by column name
from the rows of :mod:`blackboard.db.search_sql`."""

from __future__ import annotations

import json
from typing import Any

from blackboard.db.search_sql import EntryRow, MemoryRow, RevisionRow
from blackboard.protocol import codec
from blackboard.protocol.schemas.search import EntryHit, EntryRevision, MemoryHit

__all__ = ["entry_hit", "memory_hit", "revision", "stored_value"]


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
                     scores=scores, verdict=row.verdict)


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
