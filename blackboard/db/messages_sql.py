"""SQL of stored agent messages: the ingest statements and the search query builder (no IO).

A batch is COPYed into a session temp table and inserted ``ON CONFLICT (stream,
seq) DO NOTHING``, so a redelivered batch stores nothing twice. Search queries
are built as ``(sql, params)``; the copies of a multi-recipient direct message
(same id) come back as one hit, the first stored copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import sql

from blackboard.db.search_sql import or_query
from blackboard.protocol.schemas.message_search import MessageSearchRequest

__all__ = [
    "COPY_MESSAGES",
    "CREATE_STAGE_MESSAGES",
    "MESSAGE_COLUMNS",
    "MOVE_MESSAGES",
    "TRUNCATE_STAGE_MESSAGES",
    "MessageScope",
    "message_search",
]

MESSAGE_COLUMNS = ("stream", "seq", "id", "sender", "recipients", "kind", "board", "topic", "type", "body",
                   "body_raw", "correlation_id", "reply_to", "metadata", "subject", "created_at", "stored_at",
                   "search_text", "verdict")
_COLS = ", ".join(MESSAGE_COLUMNS)

CREATE_STAGE_MESSAGES = """
CREATE TEMP TABLE IF NOT EXISTS bb_stage_messages (
    stream text, seq bigint, id text, sender text, recipients text[], kind text, board text, topic text,
    type text, body jsonb, body_raw bytea, correlation_id text, reply_to text, metadata jsonb,
    subject text, created_at timestamptz, stored_at timestamptz, search_text text, verdict text
) ON COMMIT DELETE ROWS"""
TRUNCATE_STAGE_MESSAGES = "DELETE FROM bb_stage_messages"
COPY_MESSAGES = f"COPY bb_stage_messages ({_COLS}) FROM STDIN"
MOVE_MESSAGES = f"""
INSERT INTO bb_messages ({_COLS})
SELECT {_COLS} FROM bb_stage_messages
ON CONFLICT (stream, seq) DO NOTHING"""

#: Columns of a hit, in :class:`~blackboard.protocol.schemas.message_search.MessageHit` order, then the score.
HIT_COLUMNS = ("id", "seq", "sender", "recipients", "kind", "board", "topic", "type", "body", "body_raw",
               "correlation_id", "reply_to", "metadata", "created_at", "stored_at", "verdict")


@dataclass(frozen=True, slots=True)
class MessageScope:
    """The stored messages one principal may find (the search service's
    :func:`blackboard.search.access.message_scope`): by the subject each copy was stored
    under, which the server's permissions bind, never by the payload's sender or recipients.

    Attributes:
        principal: the principal (a recipient of its direct messages: lets the recipients index serve).
        direct: the principal's direct subject (its own copies of direct messages).
        boards: boards whose broadcasts it may find (None: every board).
        topics: POSIX regular expressions of the topic subjects it may find.
    """

    principal: str
    direct: str
    boards: frozenset[str] | None
    topics: tuple[str, ...]


def _scope_condition(scope: MessageScope, params: list[Any]) -> sql.Composable:
    """``(own direct copy OR readable broadcast OR topic within its patterns)``."""
    parts: list[sql.Composable] = [sql.SQL("(m.kind = 'direct' AND m.subject = %s AND m.recipients && %s::text[])")]
    params += [scope.direct, [scope.principal]]
    if scope.boards is None:
        parts.append(sql.SQL("m.kind = 'broadcast'"))
    elif scope.boards:
        parts.append(sql.SQL("(m.kind = 'broadcast' AND m.board = ANY(%s))"))
        params.append(sorted(scope.boards))
    if scope.topics:
        parts.append(sql.SQL("(m.kind = 'topic' AND m.subject ~ ANY(%s::text[]))"))
        params.append(list(scope.topics))
    return sql.SQL("(") + sql.SQL(" OR ").join(parts) + sql.SQL(")")


def message_search(req: MessageSearchRequest, scope: MessageScope | None = None) -> tuple[sql.Composed, list[Any]]:
    """The query of a message search: rows of :data:`HIT_COLUMNS` plus ``score``; with ``scope``,
    only the messages it admits."""
    conds: list[sql.Composable] = []
    params: list[Any] = []

    def add(cond: str, value: Any) -> None:
        conds.append(sql.SQL(cond))
        params.append(value)

    source = sql.SQL("bb_messages m")
    score = sql.SQL("0.0::real")
    if req.query is not None:
        words = or_query(req.query)
        source = sql.SQL("bb_messages m, websearch_to_tsquery('english', %s) AS q(q)")
        params.append(words)
        conds.append(sql.SQL("m.tsv @@ q.q"))
        score = sql.SQL("ts_rank(m.tsv, q.q)")
    if scope is not None:
        conds.append(_scope_condition(scope, params))
    if req.senders:
        add("m.sender = ANY(%s)", list(req.senders))
    if req.recipients:
        add("m.recipients && %s::text[]", list(req.recipients))
    if req.kinds:
        add("m.kind = ANY(%s)", list(req.kinds))
    if req.types:
        add("m.type = ANY(%s)", list(req.types))
    if req.boards:
        add("m.board = ANY(%s)", list(req.boards))
    if req.topics:
        add("m.topic = ANY(%s)", list(req.topics))
    if req.correlation_id is not None:
        add("m.correlation_id = %s", req.correlation_id)
    if req.since is not None:
        add("m.stored_at >= %s", req.since)
    if req.until is not None:
        add("m.stored_at < %s", req.until)
    where = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conds) if conds else sql.SQL("")
    if req.query is not None:
        order = sql.SQL("h.score DESC, h.seq DESC")
    else:
        order = sql.SQL("h.seq DESC" if req.order == "newest" else "h.seq ASC")
    query = sql.SQL(
        "SELECT {hcols}, h.score FROM ("
        "SELECT DISTINCT ON (m.id) {mcols}, {score} AS score FROM {source}{where} ORDER BY m.id, m.seq"
        ") h ORDER BY {order} LIMIT %s"
    ).format(
        hcols=sql.SQL(", ").join(sql.SQL("h.") + sql.Identifier(c) for c in HIT_COLUMNS),
        mcols=sql.SQL(", ").join(sql.SQL("m.") + sql.Identifier(c) for c in HIT_COLUMNS),
        score=score, source=source, where=where, order=order,
    )
    params.append(req.top_k)
    return query, params
