"""Search queries as pure ``(sql, params)`` builders (no IO).

Semantic queries order by cosine distance on a space's HNSW index with
``hnsw.iterative_scan`` on, so filters applied after the index scan still fill
``top_k``; :func:`semantic_query` with ``exact=True`` builds the exact
(index-free) variant, used when a selective filter leaves the index scan
short. :func:`vector_scores` gives the cosine similarity of chosen items (the
hybrid search's keyword-only candidates).

Keyword queries score with BM25 (binary term frequency, which is what short
memories have) in one scan: the candidates are the items matching any
candidate lexeme and the filters; each query lexeme's document frequency and
the mean length are counted over those candidates with window aggregates, so
no corpus statistics table is kept. The lexemes come from PostgreSQL's own
``english`` configuration (:data:`QUERY_LEXEMES`), so stemming and stop words
are the index's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from psycopg import sql
from psycopg.types.json import Jsonb

from blackboard.db.spaces import Space
from blackboard.schemas.search import EntrySearchRequest, MemorySearchRequest

__all__ = [
    "AS_OF_AT",
    "AS_OF_REVISION",
    "HISTORY",
    "MAX_QUERY_LEXEMES",
    "NEIGHBOURS",
    "QUERY_LEXEMES",
    "SET_SCAN",
    "SET_SCAN_SESSION",
    "TOUCH_MEMORIES",
    "fetch_entries",
    "fetch_memories",
    "filters",
    "keyword_query",
    "or_query",
    "semantic_query",
    "term_stats_query",
    "tsquery_literal",
    "vector_scores",
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
#: The same for the session (the search engine sets it once per pooled connection).
SET_SCAN_SESSION = ("SELECT set_config('hnsw.ef_search', %s, false), "
                    "set_config('hnsw.iterative_scan', 'relaxed_order', false)")
TOUCH_MEMORIES = "UPDATE bb_memories SET last_accessed = now() WHERE mid = ANY(%s)"
#: The distinct lexemes of a query under the index's text search configuration.
QUERY_LEXEMES = "SELECT lexeme FROM unnest(to_tsvector('english', %s))"
#: Most query lexemes a keyword search scores (the rest of a long query is ignored).
MAX_QUERY_LEXEMES = 32
#: Each memory's previous and next memory on its board, in (created_at, mid)
#: order: one probe each of the (board, created_at, mid) index.
NEIGHBOURS = """
SELECT m.mid,
       (SELECT p.mid FROM bb_memories p WHERE p.board = m.board AND (p.created_at, p.mid) < (m.created_at, m.mid)
        ORDER BY p.created_at DESC, p.mid DESC LIMIT 1),
       (SELECT n.mid FROM bb_memories n WHERE n.board = m.board AND (n.created_at, n.mid) > (m.created_at, m.mid)
        ORDER BY n.created_at, n.mid LIMIT 1)
FROM bb_memories m WHERE m.mid = ANY(%s)"""


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


def tsquery_literal(lexemes: Sequence[str]) -> str:
    """A ``tsquery`` text matching any of ``lexemes``, taken as they are (no stemming).

    Raises:
        ValueError: no lexemes (an empty tsquery matches nothing).
    """
    if not lexemes:
        raise ValueError("a tsquery needs at least one lexeme")
    return " | ".join("'" + lx.replace("\\", "\\\\").replace("'", "''") + "'" for lx in lexemes)


def term_stats_query(target: Target) -> tuple[str, list[Any]]:
    """The ``tsv`` column's most common lexemes with their frequencies (from ANALYZE),
    and the table's estimated row count: one row, arrays NULL before the first ANALYZE."""
    table = "bb_memories" if target == "memory" else "bb_entries"
    return ("SELECT s.most_common_elems::text::text[], s.most_common_elem_freqs, c.reltuples "
            "FROM pg_class c LEFT JOIN pg_stats s ON s.schemaname = current_schema() "
            "AND s.tablename = c.relname AND s.attname = 'tsv' "
            "WHERE c.oid = to_regclass(%s)", [table])


def keyword_query(req: MemorySearchRequest | EntrySearchRequest, lexemes: Sequence[str],
                  candidate_lexemes: Sequence[str], limit: int, *, max_candidates: int,
                  k1: float = 1.2, b: float = 0.75) -> tuple[sql.Composed, list[Any]]:
    """Ids and BM25 scores of the items matching any of ``candidate_lexemes`` and the filters.

    Every lexeme of ``lexemes`` (the query's) counts in the score; candidates
    are generated from ``candidate_lexemes`` only (a subset without the very
    frequent ones, see :func:`blackboard.search.candidate_lexemes`). Document
    frequency, candidate count and mean length are taken over the candidates
    (at most ``max_candidates`` of them), so the inverse document frequency is
    that of the filtered scope. Term frequency is binary.
    """
    memory = isinstance(req, MemorySearchRequest)
    conds, fparams = filters(req)
    alias, key = ("m", "mid") if memory else ("e", "eid")
    a = sql.Identifier(alias)
    conds.insert(0, sql.SQL("{a}.tsv @@ %s::tsquery").format(a=a))
    terms = list(lexemes)[:MAX_QUERY_LEXEMES]
    cols = [(sql.Identifier(f"h{i}"), sql.Identifier(f"df{i}")) for i in range(len(terms))]
    hit_cols = sql.SQL(", ").join(
        sql.SQL("({a}.tsv @@ %s::tsquery)::int AS {h}").format(a=a, h=h) for h, _ in cols)
    df_cols = sql.SQL(", ").join(
        sql.SQL("count(*) FILTER (WHERE {h} = 1) OVER () AS {df}").format(h=h, df=df) for h, df in cols)
    idf_sum = sql.SQL(" + ").join(
        sql.SQL("{h} * ln(1 + (n - {df} + 0.5) / ({df} + 0.5))").format(h=h, df=df) for h, df in cols)
    query = sql.SQL(
        "SELECT id, ({idf}) * {k1p1} / (1 + {k1} * (1 - {b} + {b} * dl / avgdl)) AS score FROM ("
        "SELECT c.*, {dfs}, count(*) OVER ()::float8 AS n, avg(dl) OVER () AS avgdl FROM ("
        "SELECT {a}.{k} AS id, length({a}.tsv)::float8 AS dl, {hits} FROM {base}{where} LIMIT %s) c) s "
        "ORDER BY score DESC, id LIMIT %s").format(
        idf=idf_sum, k1p1=sql.Literal(float(k1) + 1.0), k1=sql.Literal(float(k1)), b=sql.Literal(float(b)),
        dfs=df_cols, a=a, k=sql.Identifier(key), hits=hit_cols,
        base=sql.SQL("bb_memories m" if memory else "bb_entries e"), where=_where(conds))
    params: list[Any] = [tsquery_literal([t]) for t in terms]
    params += [tsquery_literal(candidate_lexemes), *fparams, max_candidates, limit]
    return query, params


def vector_scores(space: Space, target: Target, items: Sequence[int], vector: Any) -> tuple[sql.Composed, list[Any]]:
    """Cosine similarity of the query to the given items (those that have a vector)."""
    query = sql.SQL("SELECT item, 1 - (embedding <=> %s::vector) FROM {t} WHERE item = ANY(%s)").format(
        t=space.table(target))
    return query, [vector, list(items)]


def fetch_memories() -> str:
    """Full rows of memories by mid."""
    return f"SELECT m.mid, {_MEMORY_COLS} FROM bb_memories m WHERE m.mid = ANY(%s)"


def fetch_entries() -> str:
    """Full rows of entries by eid."""
    return f"SELECT e.eid, {_ENTRY_COLS} FROM bb_entries e WHERE e.eid = ANY(%s)"
