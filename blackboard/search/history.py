"""Entry history and as-of reads from PostgreSQL (``bb.search.<principal>.history``, ``bb.search.<principal>.as_of``).

Not search: the revisions of one key, as the worker stored them
(``bb_entry_revisions``). JetStream keeps only the last ``board.history``
revisions of a key; PostgreSQL keeps them all.
"""

from __future__ import annotations

from psycopg_pool import AsyncConnectionPool

from blackboard.db import search_sql as q
from blackboard.protocol.errors import NotFoundError, SearchError
from blackboard.protocol.schemas.search import (
    AsOfRequest,
    EntryRevision,
    HistoryRequest,
    HistoryResponse,
)
from blackboard.search.hits import revision
from blackboard.search.pool import fetch
from blackboard.search.rows import READ_ERRORS, SkippedRows, readable

__all__ = ["EntryHistory"]

_ROWS = q.named_rows(q.RevisionRow)


class EntryHistory:
    """Reads the stored revisions of keys.

    Args:
        pool: open connection pool (the search service's).
        skipped: counts the revisions skipped as unreadable (a new counter by default).
    """

    def __init__(self, pool: AsyncConnectionPool, *, skipped: SkippedRows | None = None) -> None:
        self.pool = pool
        #: Stored revisions skipped because they cannot be read back (``revision``).
        self.skipped = skipped if skipped is not None else SkippedRows()

    async def history(self, req: HistoryRequest) -> HistoryResponse:
        """Every stored revision of a key, oldest first (a revision that cannot be read back is
        skipped: logged and counted in ``skipped``).

        Raises:
            NotFoundError: the key has no stored revision.
            StorageError: PostgreSQL is unavailable.
        """
        found = SkippedRows()
        rows = await fetch(self.pool, q.HISTORY, (req.board, req.section, req.key, req.limit or 2**62), _ROWS,
                           kind="revision", skipped=found)
        self.skipped.counts.update(found.counts)
        if not rows and not found.total:
            raise NotFoundError(f"{req.board}.{req.section}.{req.key}", "no stored revision of this key")
        return HistoryResponse(revisions=readable(rows, revision, "revision", self.skipped,
                                                  lambda r: f"revision {r.revision} of {r.board}.{r.section}.{r.key}"))

    async def as_of(self, req: AsOfRequest) -> EntryRevision:
        """The revision of a key current at ``req.revision`` or ``req.at``.

        Raises:
            NotFoundError: the key did not exist then, was deleted, or (at a time) had expired.
            SearchError: that revision's stored row cannot be read back (a timestamp or value out
                of range: logged and counted in ``skipped``).
            StorageError: PostgreSQL is unavailable.
        """
        sql_, when = (q.AS_OF_REVISION, req.revision) if req.revision is not None else (q.AS_OF_AT, req.at)
        name = f"{req.board}.{req.section}.{req.key}"
        found = SkippedRows()
        rows = await fetch(self.pool, sql_, (req.board, req.section, req.key, when), _ROWS,
                           kind="revision", skipped=found)
        self.skipped.counts.update(found.counts)
        at = f"revision {req.revision}" if req.revision is not None else f"the revision current at {req.at}"
        if found.total:  # the one row the read found could not be loaded (the reason is logged)
            raise SearchError(f"{at} of {name!r} cannot be read back (a stored value out of range)")
        if not rows:
            raise NotFoundError(name, f"{name!r} did not exist at that point")
        row = rows[0]
        try:
            rev = revision(row)
        except READ_ERRORS as exc:
            self.skipped.skip("revision", f"revision {row.revision} of {name}", exc)
            raise SearchError(f"{at} of {name!r} cannot be read back: {exc}") from exc
        if rev.op != "PUT":
            raise NotFoundError(name, f"{name!r} was deleted at that point (revision {rev.revision})")
        if req.at is not None and row.expires_at is not None and row.expires_at <= req.at:
            raise NotFoundError(name, f"{name!r} had expired at that point (revision {rev.revision}, "
                                      f"its TTL ended at {row.expires_at.isoformat()})")
        return rev
