"""Reads through the search pool: one retry on a broken connection, errors mapped.

The search service's pool hands out connections without checking them (two to
four round trips less per query, see :mod:`blackboard.search.service`), so a
read may meet a connection PostgreSQL closed meanwhile (a restart closes all
of them): :func:`once_more` has the pool check its idle connections and tries
again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg.rows import AsyncRowFactory
from psycopg_pool import AsyncConnectionPool

from blackboard.protocol.errors import StorageError
from blackboard.search.rows import SkippedRows, fetch_readable

__all__ = ["fetch", "once_more"]

log = logging.getLogger("blackboard.search.pool")
_T = TypeVar("_T")


async def once_more(pool: AsyncConnectionPool, attempt: Callable[[], Awaitable[_T]]) -> _T:
    """``attempt()``; after a broken connection (the pool may hand one out unchecked), the pool
    checks its idle connections, replacing the broken ones (PostgreSQL restarted: all of them),
    and ``attempt()`` runs once more.

    Raises:
        psycopg.OperationalError: the second attempt failed too.
    """
    try:
        return await attempt()
    except psycopg.OperationalError as exc:
        log.info("search: a connection was broken (%s); checking the pool", str(exc).strip()[:200])
        with contextlib.suppress(Exception):
            await pool.check()
        return await attempt()


async def fetch(pool: AsyncConnectionPool, query: str, params: Sequence[Any] | Mapping[str, Any],
                row_factory: AsyncRowFactory[_T], *, kind: str, skipped: SkippedRows) -> list[_T]:
    """The rows of one read query, made by ``row_factory``, run once more on a broken
    connection (:func:`once_more`); a row that cannot be read back is left out, counted in
    ``skipped`` as a ``kind`` (:func:`~blackboard.search.rows.fetch_readable`).

    Raises:
        StorageError: PostgreSQL is unavailable.
    """

    async def read() -> list[_T]:
        async with pool.connection() as conn:
            try:
                cur = conn.cursor(row_factory=row_factory)
                await cur.execute(query, params)
                return await fetch_readable(cur, kind, skipped)
            finally:
                await conn.rollback()

    try:
        return await once_more(pool, read)
    except psycopg.OperationalError as exc:
        raise StorageError(f"PostgreSQL unavailable: {exc}") from exc
