"""Embedding spaces: one pair of vector tables per (model, dimensions).

A space's tables are ``bb_vec_<id>_memories`` and ``bb_vec_<id>_entries``
(``item``, the revision embedded, the item's board, the vector) with an HNSW
cosine index and a covering ``(board) INCLUDE (item, embedding)`` index. The
board is there so that a board filter is applied inside the vector scan (no
join probe per visited row), and so that a small board is scanned exactly, by
an index-only scan of its own rows, instead of the HNSW scan wading through
the other boards' vectors. Tables are created on first use under an advisory
lock; identifiers are built with ``psycopg.sql`` only. Changing model or dimension therefore never rewrites a
live table: it starts a new space, filled by ``reindex``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg import sql

__all__ = ["ItemType", "Space", "board_index", "create_space_tables", "drop_space_tables", "ensure_space", "find_space",
           "hnsw_index"]

ItemType = Literal["memory", "entry"]

_LOCK_KEY = 0x62627370616365  # "bbspace"

_FIND = "SELECT id FROM bb_embedding_spaces WHERE model = %s AND dims = %s"
_INSERT = ("INSERT INTO bb_embedding_spaces (model, dims) VALUES (%s, %s) "
           "ON CONFLICT (model, dims) DO UPDATE SET model = EXCLUDED.model RETURNING id")


@dataclass(frozen=True, slots=True)
class Space:
    """A registered embedding space."""

    id: int
    model: str
    dims: int

    def table_name(self, item_type: ItemType, suffix: str = "") -> str:
        return f"bb_vec_{self.id}_{'memories' if item_type == 'memory' else 'entries'}{suffix}"

    def table(self, item_type: ItemType, suffix: str = "") -> sql.Identifier:
        return sql.Identifier(self.table_name(item_type, suffix))


def _ddl(space: Space, item_type: ItemType, suffix: str, *, index: bool) -> list[sql.Composed]:
    name = space.table_name(item_type, suffix)
    stmts = [sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} (item bigint PRIMARY KEY, revision bigint NOT NULL, board text NOT NULL, "
        "embedding vector({}) NOT NULL)").format(sql.Identifier(name), sql.Literal(space.dims))]
    if index:
        stmts += [hnsw_index(space, item_type, suffix), board_index(space, item_type, suffix)]
    return stmts


def hnsw_index(space: Space, item_type: ItemType, suffix: str = "") -> sql.Composed:
    """``CREATE INDEX IF NOT EXISTS`` of the space table's HNSW cosine index."""
    name = space.table_name(item_type, suffix)
    return sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} USING hnsw (embedding vector_cosine_ops)").format(
        sql.Identifier(f"{name}_hnsw"), sql.Identifier(name))


def board_index(space: Space, item_type: ItemType, suffix: str = "") -> sql.Composed:
    """``CREATE INDEX IF NOT EXISTS`` of the covering ``(board) INCLUDE (item, embedding)`` index.

    An index-only scan of it reads one board's vectors packed together (the
    heap has them scattered over the whole table): the exact scan of a small
    board.
    """
    name = space.table_name(item_type, suffix)
    return sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (board) INCLUDE (item, embedding)").format(
        sql.Identifier(f"{name}_board"), sql.Identifier(name))


async def find_space(conn: psycopg.AsyncConnection[Any], model: str, dims: int) -> Space | None:
    """The registered space of (model, dims), or None."""
    cur = await conn.execute(_FIND, (model, dims))
    row = await cur.fetchone()
    return Space(int(row[0]), model, dims) if row else None


async def create_space_tables(conn: psycopg.AsyncConnection[Any], space: Space, *, suffix: str = "",
                              index: bool = True) -> None:
    """Create the space's tables (and indexes) if missing, in the caller's transaction."""
    for item_type in ("memory", "entry"):
        for stmt in _ddl(space, item_type, suffix, index=index):
            await conn.execute(stmt)


async def drop_space_tables(conn: psycopg.AsyncConnection[Any], space: Space, *, suffix: str = "") -> None:
    for item_type in ("memory", "entry"):
        await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(space.table(item_type, suffix)))


async def ensure_space(conn: psycopg.AsyncConnection[Any], model: str, dims: int) -> Space:
    """Register (model, dims) and create its tables if needed; commits.

    Safe when several workers start at once (transaction-level advisory lock).
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        cur = await conn.execute(_INSERT, (model, dims))
        row = await cur.fetchone()
        assert row is not None
        space = Space(int(row[0]), model, dims)
        await create_space_tables(conn, space)
    return space
