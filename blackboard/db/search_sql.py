"""Search queries as pure ``(sql, params)`` builders (no IO).

Semantic queries order by cosine distance on a space's HNSW index with
``hnsw.iterative_scan`` on, so filters applied after the index scan still fill
``top_k``; :func:`semantic_query` with ``exact=True`` builds the exact
(index-free) variant, used when a selective filter leaves the index scan
short. Keyword queries OR the query's words (PostgreSQL ``websearch`` syntax,
stemmed, stop words dropped) and rank by ``ts_rank``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from psycopg import sql
from psycopg.types.json import Jsonb

from blackboard.db.spaces import Space
from blackboard.schemas.search import EntrySearchRequest, MemorySearchRequest

__all__ = [
    "AS_OF_AT",
    "AS_OF_REVISION",
    "HISTORY",
    "SET_SCAN",
    "TOUCH_MEMORIES",
    "fetch_entries",
    "fetch_memories",
    "filters",
    "keyword_query",
    "or_query",
    "semantic_query",
]

Target = Literal["memory", "entry"]
_WORD_RE = re.compile(r"\w+", re.UNICODE)

_MEMORY_COLS = ("m.id, m.board, m.agent, m.kind, m.text, m.tags, m.metadata, m.importance, m.source, "
                "m.created_at, m.updated_at, m.seq")
_ENTRY_COLS = ("e.board, e.section, e.key, e.revision, e.value, e.value_raw, e.content_type, e.tags, "
               "e.metadata, e.author, e.created_at, e.updated_at")

REVISION_COLS = ("board, section, key, seq, op, value, value_raw, content_type, tags, metadata, author, "
                 "created_at, stored_at")
HISTORY = f"SELECT {REVISION_COLS} FROM (SELECT * FROM bb_entry_revisions WHERE board = %s AND section = %s " \
          "AND key = %s ORDER BY seq DESC LIMIT %s) r ORDER BY seq"
AS_OF_REVISION = f"SELECT {REVISION_COLS} FROM bb_entry_revisions WHERE board = %s AND section = %s " \
                 "AND key = %s AND seq <= %s ORDER BY seq DESC LIMIT 1"
AS_OF_AT = f"SELECT {REVISION_COLS} FROM bb_entry_revisions WHERE board = %s AND section = %s " \
           "AND key = %s AND stored_at <= %s ORDER BY seq DESC LIMIT 1"
#: Per-transaction HNSW settings: ef_search, and iterative scans so that
#: filters applied after the index scan still fill the limit.
SET_SCAN = ("SELECT set_config('hnsw.ef_search', %s, true), "
            "set_config('hnsw.iterative_scan', 'relaxed_order', true)")
TOUCH_MEMORIES = "UPDATE bb_memories SET last_accessed = now() WHERE mid = ANY(%s)"


def or_query(text: str, max_words: int = 64) -> str:
    """A ``websearch_to_tsquery`` string matching any word of ``text``."""
    words = _WORD_RE.findall(text)[:max_words]
    return " or ".join(w for w in words if w.lower() != "or")


def filters(req: MemorySearchRequest | EntrySearchRequest) -> tuple[list[sql.Composable], list[Any]]:
    """WHERE conditions (ANDed) of a request's filters, on alias ``m`` or ``e``."""
    memory = isinstance(req, MemorySearchRequest)
    a = "m" if memory else "e"
    conds: list[sql.Composable] = []
    params: list[Any] = []

    def add(cond: str, value: Any) -> None:
        conds.append(sql.SQL(cond.replace("{a}", a)))
        params.append(value)

    if not memory:
        conds.append(sql.SQL("NOT e.deleted"))
    if req.boards:
        add("{a}.board = ANY(%s)", list(req.boards))
    if isinstance(req, MemorySearchRequest):
        if req.kinds:
            add("m.kind = ANY(%s)", list(req.kinds))
        if req.author:
            add("m.agent = %s", req.author)
    else:
        if req.sections:
            add("e.section = ANY(%s)", list(req.sections))
        if req.author:
            add("e.author = %s", req.author)
    if req.tags_any:
        add("{a}.tags && %s::text[]", list(req.tags_any))
    if req.tags_all:
        add("{a}.tags @> %s::text[]", list(req.tags_all))
    when = "created_at" if memory else "updated_at"
    if req.since:
        add(f"{{a}}.{when} >= %s", req.since)
    if req.until:
        add(f"{{a}}.{when} < %s", req.until)
    if req.metadata:
        add("{a}.metadata @> %s", Jsonb(req.metadata))
    return conds, params


def _where(conds: list[sql.Composable]) -> sql.Composable:
    return sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conds) if conds else sql.SQL("")


def semantic_query(space: Space, req: MemorySearchRequest | EntrySearchRequest, vector: Any, limit: int,
                   *, exact: bool = False) -> tuple[sql.Composed, list[Any]]:
    """Ids and cosine similarity of the nearest items passing the filters.

    With ``exact`` the ORDER BY cannot use the index (an exact scan of the
    filtered rows, for selective filters).
    """
    memory = isinstance(req, MemorySearchRequest)
    conds, params = filters(req)
    base, alias, key = ("bb_memories m", "m", "mid") if memory else ("bb_entries e", "e", "eid")
    order = sql.SQL("(v.embedding <=> %s::vector) + 0") if exact else sql.SQL("v.embedding <=> %s::vector")
    query = sql.SQL("SELECT {a}.{k}, 1 - (v.embedding <=> %s::vector) AS score FROM {t} v "
                    "JOIN {base} ON {a}.{k} = v.item{where} ORDER BY {order} LIMIT %s").format(
        a=sql.Identifier(alias), k=sql.Identifier(key), t=space.table("memory" if memory else "entry"),
        base=sql.SQL(base), where=_where(conds), order=order)
    return query, [vector, *params, vector, limit]


def keyword_query(req: MemorySearchRequest | EntrySearchRequest, limit: int) -> tuple[sql.Composed, list[Any]]:
    """Ids and ``ts_rank`` of the items matching any query word and the filters."""
    memory = isinstance(req, MemorySearchRequest)
    conds, params = filters(req)
    alias, key = ("m", "mid") if memory else ("e", "eid")
    conds.insert(0, sql.SQL("{a}.tsv @@ q.q").format(a=sql.Identifier(alias)))
    query = sql.SQL("SELECT {a}.{k}, ts_rank({a}.tsv, q.q) AS score "
                    "FROM {base}, websearch_to_tsquery('english', %s) AS q(q){where} "
                    "ORDER BY score DESC LIMIT %s").format(
        a=sql.Identifier(alias), k=sql.Identifier(key),
        base=sql.SQL("bb_memories m" if memory else "bb_entries e"), where=_where(conds))
    return query, [or_query(req.query), *params, limit]


def fetch_memories() -> str:
    """Full rows of memories by mid."""
    return f"SELECT m.mid, {_MEMORY_COLS} FROM bb_memories m WHERE m.mid = ANY(%s)"


def fetch_entries() -> str:
    """Full rows of entries by eid."""
    return f"SELECT e.eid, {_ENTRY_COLS} FROM bb_entries e WHERE e.eid = ANY(%s)"
