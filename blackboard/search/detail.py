"""One memory by id (``bb.search.<principal>.memory``): the memory, its provenance and the
versions of its subject key.

Not search: a read of what the worker stored about one memory. The id of a
memory merged into another (``bb_memory_sources``) answers with the kept memory;
the id of an archived memory answers with it (``archived_at`` set), unless it was
merged (then the kept memory answers). See docs/memory-lifecycle.md.
"""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from blackboard.db import search_sql as q
from blackboard.protocol.errors import NotFoundError, SearchError
from blackboard.protocol.schemas.search import MemoryDetail, MemoryGetRequest
from blackboard.search.hits import memory_hit, memory_source
from blackboard.search.pool import fetch
from blackboard.search.rows import READ_ERRORS, SkippedRows, readable

__all__ = ["memory_detail"]

_MEMORY_ROWS = q.named_rows(q.MemoryRow)
_SOURCE_ROWS = q.named_rows(q.SourceRow)


async def memory_detail(pool: AsyncConnectionPool, req: MemoryGetRequest, *,
                        skipped: SkippedRows | None = None) -> MemoryDetail:
    """The memory ``req.id`` of ``req.board`` (or the memory it was merged into), the memories
    merged into it (oldest first) and every version of its subject key (valid-time order).

    A source or version row that cannot be read back is left out (logged, counted in
    ``skipped``).

    Raises:
        NotFoundError: no memory of that id on that board (never stored, forgotten, or on
            another board), nor one it was merged into.
        SearchError: the memory's own row cannot be read back.
        StorageError: PostgreSQL is unavailable.
    """
    skipped = skipped if skipped is not None else SkippedRows()
    found = SkippedRows()
    rows = await fetch(pool, q.MEMORY_BY_ID, {"id": req.id, "board": req.board}, _MEMORY_ROWS,
                       kind="memory", skipped=found)
    skipped.counts.update(found.counts)
    if found.total:
        raise SearchError(f"memory {req.id!r} cannot be read back (a stored value out of range)")
    if not rows:
        raise NotFoundError(req.id, f"no memory {req.id!r} on board {req.board!r}")
    row = rows[0]
    try:
        memory = memory_hit(row, 0.0, {})
    except READ_ERRORS as exc:
        skipped.skip("memory", f"memory {row.id!r}", exc)
        raise SearchError(f"memory {req.id!r} cannot be read back: {exc}") from exc
    sources = await fetch(pool, q.MEMORY_SOURCES, {"mid": row.mid}, _SOURCE_ROWS, kind="source", skipped=skipped)
    versions: list[Any] = []
    if row.key is not None:
        versions = await fetch(pool, q.MEMORY_VERSIONS, {"board": row.board, "key": row.key}, _MEMORY_ROWS,
                               kind="memory", skipped=skipped)
    return MemoryDetail(
        memory=memory,
        sources=readable(sources, memory_source, "source", skipped, lambda s: f"source {s.id!r}"),
        versions=readable(versions, lambda r: memory_hit(r, 0.0, {}), "memory", skipped,
                          lambda r: f"memory {r.id!r}"))
