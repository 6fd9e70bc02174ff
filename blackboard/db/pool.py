"""The PostgreSQL connection pool, with pgvector types registered on every connection."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from pgvector.psycopg import register_vector_async
from psycopg.conninfo import conninfo_to_dict
from psycopg.types import TypeInfo
from psycopg_pool import AsyncConnectionPool

from blackboard.protocol.errors import ConfigurationError, StorageError
from blackboard.settings import PostgresSettings

__all__ = ["configure_connection", "connect", "open_pool"]

log = logging.getLogger("blackboard.db")


async def configure_connection(conn: psycopg.AsyncConnection[object],
                               session: Mapping[str, str] | None = None) -> None:
    """Register pgvector's binary adapters when the extension exists, and set
    the ``session`` settings (name -> value, for the connection's lifetime).

    Before the first migration the ``vector`` type is missing; the connection
    is then left as it is (``migrate`` creates the extension first).
    """
    if await TypeInfo.fetch(conn, "vector") is not None:
        await register_vector_async(conn)
    for name, value in (session or {}).items():
        await conn.execute("SELECT set_config(%s, %s, false)", (name, value))
    # The queries above leave a transaction open unless in autocommit: commit
    # it (a rollback would undo the settings), leaving the connection idle.
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        await conn.commit()


def _checked_dsn(settings: PostgresSettings) -> str:
    """The DSN, parsed once before use: a malformed one is a configuration error at once (a
    pool would retry it until its timeout).

    Raises:
        ConfigurationError: psycopg cannot parse the DSN.
    """
    dsn = settings.dsn.get_secret_value()
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"invalid PostgreSQL DSN (postgres.dsn): {str(exc).strip()}") from exc
    return dsn


def _configure(session: Mapping[str, str] | None) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]:
    async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
        await configure_connection(conn, session)

    return configure


@asynccontextmanager
async def open_pool(settings: PostgresSettings, *, name: str = "blackboard",
                    min_size: int | None = None, max_size: int | None = None,
                    wait: bool = True, check: bool = True, autocommit: bool = False,
                    session: Mapping[str, str] | None = None) -> AsyncIterator[AsyncConnectionPool]:
    """An open pool (closed on exit).

    With ``check`` (the default) a connection is checked (a round trip)
    every time it is taken from the pool; without it a caller meets a
    connection broken meanwhile (PostgreSQL restarted) as an
    ``OperationalError`` on first use, and the pool then discards it: callers
    retry. With ``autocommit`` every statement commits by itself (read-only
    work: no ROLLBACK round trip after use, and psycopg keeps its prepared
    statements, which a rollback clears). ``session``: settings given to
    every connection of the pool (name -> value). With ``wait=True`` the pool
    waits until its first connections are up.

    Raises:
        ConfigurationError: the DSN is malformed.
        StorageError: PostgreSQL is not reachable in time (only with ``wait``).
    """
    pool: AsyncConnectionPool = AsyncConnectionPool(
        _checked_dsn(settings),
        min_size=settings.pool_min if min_size is None else min_size,
        max_size=settings.pool_max if max_size is None else max_size,
        configure=_configure(session),
        check=AsyncConnectionPool.check_connection if check else None,
        kwargs={"autocommit": autocommit, "application_name": name},
        name=name,
        open=False,
        timeout=settings.connect_timeout,
    )
    await pool.open(wait=False)
    try:
        if wait and pool.min_size > 0:
            try:
                await pool.wait(timeout=settings.connect_timeout)
            except Exception as exc:  # psycopg_pool.PoolTimeout
                raise StorageError(f"cannot connect to PostgreSQL: {exc}") from exc
        yield pool
    finally:
        await pool.close()


async def connect(settings: PostgresSettings, *, autocommit: bool = True,
                  name: str = "blackboard") -> psycopg.AsyncConnection[tuple[Any, ...]]:
    """One connection outside the pool (migrations, reindex).

    Raises:
        ConfigurationError: the DSN is malformed.
        StorageError: PostgreSQL is not reachable.
    """
    try:
        conn = await psycopg.AsyncConnection.connect(
            _checked_dsn(settings), autocommit=autocommit,
            application_name=name, connect_timeout=max(1, int(settings.connect_timeout)),
        )
    except psycopg.OperationalError as exc:
        raise StorageError(f"cannot connect to PostgreSQL: {exc}") from exc
    await configure_connection(conn)
    return conn
