"""Entry history and as-of reads from PostgreSQL (``bb.search.history``, ``bb.search.as_of``).

Not search: the revisions of one key, as the worker stored them
(``bb_entry_revisions``). JetStream keeps only the last ``board.history``
revisions of a key; PostgreSQL keeps them all.
"""

from __future__ import annotations

from psycopg_pool import AsyncConnectionPool

from blackboard.db import search_sql as q
from blackboard.protocol.errors import NotFoundError
from blackboard.protocol.schemas.search import (
    AsOfRequest,
    EntryRevision,
    HistoryRequest,
    HistoryResponse,
)
from blackboard.search.hits import revision
from blackboard.search.pool import fetch

__all__ = ["EntryHistory"]

_ROWS = q.named_rows(q.RevisionRow)


class EntryHistory:
    """Reads the stored revisions of keys.

    Args:
        pool: open connection pool (the search service's).
    """

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    async def history(self, req: HistoryRequest) -> HistoryResponse:
        """Every stored revision of a key, oldest first.

        Raises:
            NotFoundError: the key has no stored revision.
            StorageError: PostgreSQL is unavailable.
        """
        rows = await fetch(self.pool, q.HISTORY, (req.board, req.section, req.key, req.limit or 2**62), _ROWS)
        if not rows:
            raise NotFoundError(f"{req.board}.{req.section}.{req.key}", "no stored revision of this key")
        return HistoryResponse(revisions=[revision(r) for r in rows])

    async def as_of(self, req: AsOfRequest) -> EntryRevision:
        """The revision of a key current at ``req.revision`` or ``req.at``.

        Raises:
            NotFoundError: the key did not exist then, was deleted, or (at a time) had expired.
            StorageError: PostgreSQL is unavailable.
        """
        sql_, when = (q.AS_OF_REVISION, req.revision) if req.revision is not None else (q.AS_OF_AT, req.at)
        rows = await fetch(self.pool, sql_, (req.board, req.section, req.key, when), _ROWS)
        row = rows[0] if rows else None
        name = f"{req.board}.{req.section}.{req.key}"
        if row is None:
            raise NotFoundError(name, f"{name!r} did not exist at that point")
        rev = revision(row)
        if rev.op != "PUT":
            raise NotFoundError(name, f"{name!r} was deleted at that point (revision {rev.revision})")
        if req.at is not None and row.expires_at is not None and row.expires_at <= req.at:
            raise NotFoundError(name, f"{name!r} had expired at that point (revision {rev.revision}, "
                                      f"its TTL ended at {row.expires_at.isoformat()})")
        return rev
