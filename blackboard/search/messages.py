"""Message search (``bb.search.<principal>.messages``): stored agent messages, by keyword and filters.

The worker stores the messages (:mod:`blackboard.worker.messages`); this reads
them. The query is :func:`blackboard.db.messages_sql.message_search`; its rows
become hits by column name.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from psycopg.rows import kwargs_row
from psycopg_pool import AsyncConnectionPool

from blackboard.db import messages_sql as q
from blackboard.protocol import codec
from blackboard.protocol.schemas.message_search import (
    MessageHit,
    MessageSearchRequest,
    MessageSearchResponse,
)
from blackboard.search.rows import SkippedRows, fetch_readable

__all__ = ["message_hit", "search_messages"]


def message_hit(*, id: str | None, seq: int, sender: str | None, recipients: list[str] | None, kind: str | None,
                board: str | None, topic: str | None, type: str | None, body: Any, body_raw: bytes | None,
                correlation_id: str | None, reply_to: str | None, metadata: dict[str, Any] | None,
                created_at: datetime | None, stored_at: datetime, verdict: str, score: float) -> MessageHit:
    """The hit of one row of :func:`~blackboard.db.messages_sql.message_search` (its columns by
    name: :data:`~blackboard.db.messages_sql.HIT_COLUMNS` and ``score``)."""
    return MessageHit(id=id, seq=seq, sender=sender, recipients=list(recipients or []), kind=kind, board=board,
                      topic=topic, type=type, body=codec.decode(bytes(body_raw)) if body_raw is not None else body,
                      correlation_id=correlation_id, reply_to=reply_to, metadata=metadata or {},
                      created_at=created_at, stored_at=stored_at, verdict=verdict, score=float(score))


_HITS = kwargs_row(message_hit)


async def search_messages(pool: AsyncConnectionPool, req: MessageSearchRequest, *,
                          scope: q.MessageScope | None = None,
                          skipped: SkippedRows | None = None) -> MessageSearchResponse:
    """Run a message search (keyword ranked, or listed by time) against PostgreSQL.

    ``scope``: only the messages it admits (the principal's own direct messages, broadcasts and
    topics it may read: :func:`blackboard.search.access.message_scope`); None: every message.

    A stored message that cannot be read back (a timestamp out of Python's range, JSON nested
    too deep, ``body_raw`` that is not msgpack) is left out, logged and counted in ``skipped``
    as a ``message`` (:func:`~blackboard.search.rows.fetch_readable`)."""
    started = time.perf_counter()
    query, params = q.message_search(req, scope)
    async with pool.connection() as conn, conn.cursor(row_factory=_HITS) as cur:
        await cur.execute(query, params)
        hits = await fetch_readable(cur, "message", skipped if skipped is not None else SkippedRows())
    return MessageSearchResponse(hits=hits, took_ms=(time.perf_counter() - started) * 1000)
