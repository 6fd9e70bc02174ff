"""Search queries as pure ``(sql, params)`` builders (no IO).

The texts depend only on the shape of a request (which filters it sets, how
many query words, which vector table), so each shape's text is composed once
and cached (composing the keyword statement with :mod:`psycopg.sql` cost ~0.45
ms of CPU, a sixth of the statement's own run on 2,000 memories).

Semantic queries order by cosine distance on a space's HNSW index with
``hnsw.iterative_scan`` on, so filters applied after the index scan still fill
``top_k``; the board filter is checked on the vector table's own ``board``
column. :func:`semantic_query` with ``exact=True`` builds the exact
(index-free) variant, used for small boards (an index-only scan of the
covering board index) and when a selective filter leaves the index scan
short. The keyword query can return its candidates' cosine when the query's
vector is known; :func:`vector_scores` gives the cosine similarity of chosen
items (hybrid search's keyword candidates otherwise); :func:`with_rows` adds
each candidate's full row to a retriever's statement, and with ``linked`` the
leading memories' neighbours on their board.

Keyword queries score with BM25 (binary term frequency, which is what short
memories have) in one scan: the candidates are the items matching any
candidate lexeme and the filters; each query lexeme's document frequency and
the mean length are counted over those candidates with window aggregates, so
no corpus statistics table is kept. The lexemes come from PostgreSQL's own
``english`` configuration (:data:`WORD_LEXEMES`), so stemming and stop words
are the index's.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from psycopg import ProgrammingError, pq, sql
from psycopg.rows import RowMaker
from psycopg.types.json import Jsonb

from blackboard.db.filter_sql import where_conditions
from blackboard.db.spaces import Space, ann_order
from blackboard.protocol.schemas.search import SearchFilters, SearchTarget

__all__ = [
    "AS_OF_AT",
    "AS_OF_REVISION",
    "CURRENT_MEMORY",
    "HISTORY",
    "LIVE_MEMORY",
    "MAX_DETAIL_ROWS",
    "MAX_QUERY_LEXEMES",
    "MEMORY_BY_ID",
    "MEMORY_SOURCES",
    "MEMORY_VERSIONS",
    "SET_SCAN_SESSION",
    "WORD_LEXEMES",
    "EntryRow",
    "MemoryRow",
    "RevisionRow",
    "SourceRow",
    "analyze_statements",
    "board_stats_query",
    "filters",
    "keyword_query",
    "named_rows",
    "or_query",
    "probes",
    "query_words",
    "searchable_query",
    "semantic_query",
    "term_stats_query",
    "tsquery_literal",
    "vector_scores",
    "with_rows",
]

Target = SearchTarget
#: The table of each target's items.
_ITEM_TABLE: dict[str, str] = {"memory": "bb_memories", "entry": "bb_entries"}
_WORD_RE = re.compile(r"\w+", re.UNICODE)


class MemoryRow(NamedTuple):
    """A memory candidate as a retriever's statement returns it (:func:`with_rows`): the
    retriever's ``(item, score, flag)``, the memory's row, and with ``linked`` its
    neighbours on its board. ``metadata`` is JSON text (parsed for the results only)."""

    item: int
    score: float
    #: semantic: true (one of the nearest); keyword: the cosine, None without a vector.
    flag: Any
    mid: int
    id: str
    board: str
    agent: str
    kind: str
    text: str
    tags: list[str]
    metadata: str | None
    importance: float
    source: str | None
    created_at: datetime
    updated_at: datetime
    revision: int
    #: The signature's verdict the worker stored (``verified`` or ``unsigned``).
    verdict: str
    # The lifecycle (migration 0015; docs/memory-lifecycle.md).
    key: str | None
    occurred_at: datetime | None
    #: coalesce(valid_from, created_at): rows from before 0015 are valid from their write.
    valid_from: datetime
    valid_to: datetime | None
    superseded_by: str | None
    confidence: float | None
    seen_count: int
    hits: int
    archived_at: datetime | None
    archive_reason: str | None
    merged_into: str | None
    contested_by: str | None
    prev: int | None = None
    next: int | None = None


class EntryRow(NamedTuple):
    """An entry candidate as a retriever's statement returns it (:func:`with_rows`); ``value``
    and ``metadata`` are JSON text, ``value_raw`` the msgpack of a value JSON cannot hold."""

    item: int
    score: float
    flag: Any
    eid: int
    board: str
    section: str
    key: str
    revision: int
    value: str | None
    value_raw: bytes | None
    content_type: str | None
    tags: list[str]
    metadata: str | None
    author: str | None
    created_at: datetime | None
    updated_at: datetime
    #: The signature's verdict the worker stored (``verified`` or ``unsigned``).
    verdict: str


_NT = TypeVar("_NT", bound=tuple[Any, ...])
_ROWS_STATUS = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.SINGLE_TUPLE)


def named_rows(cls: type[_NT]) -> Callable[[Any], RowMaker[_NT]]:
    """A psycopg row factory making ``cls`` (a ``NamedTuple``) of each row, by column name.

    The columns must be ``cls``'s fields, in order; trailing fields with a default may be
    missing. They are checked once per statement shape (a wrong statement raises
    ``ProgrammingError`` at its first result); each row is then made at C speed (psycopg's
    ``class_row`` builds a dict per row: ~10x the cost, on up to 200 candidates a search).
    """

    def factory(cursor: Any) -> RowMaker[_NT]:
        res = cursor.pgresult
        if res is None or res.status not in _ROWS_STATUS:
            return _no_rows
        return _row_maker(cls, tuple(res.fname(i) for i in range(res.nfields)))

    return factory


def _no_rows(values: Sequence[Any]) -> Any:
    raise ProgrammingError("the statement returned no rows")


@functools.lru_cache(maxsize=64)
def _row_maker(cls: type[_NT], columns: tuple[bytes, ...]) -> RowMaker[_NT]:
    """The maker of ``cls`` rows from ``columns`` (checked once per shape of statement)."""
    fields: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
    defaults: dict[str, Any] = cls._field_defaults  # type: ignore[attr-defined]
    make: Callable[[Sequence[Any]], _NT] = cls._make  # type: ignore[attr-defined]
    names = tuple(c.decode() for c in columns)
    missing = fields[len(names):]
    if names != fields[:len(names)] or any(f not in defaults for f in missing):
        raise ProgrammingError(f"{cls.__name__} rows need the columns {fields}, got {names}")
    if not missing:
        return make
    pad = tuple(defaults[f] for f in missing)
    return lambda values: make((*values, *pad))


def _select_list(row: type[tuple[Any, ...]], alias: str, first: str, last: int,
                 exprs: dict[str, str]) -> str:
    """The columns of ``row``'s fields from ``first`` on, but for the ``last`` ones, read from
    ``alias`` (``exprs``: the expressions of the fields that are not a plain column): built
    from the row type, so the two cannot drift apart."""
    fields: tuple[str, ...] = row._fields  # type: ignore[attr-defined]
    names = fields[fields.index(first):len(fields) - last]
    return ", ".join(f"{exprs[n]} AS {n}" if n in exprs else f"{alias}.{n}" for n in names)


# The JSON columns come as text: a search reads every candidate's row and parses only the
# results' (psycopg's jsonb loader parses each value: ~2 µs a row of LoCoMo metadata).
# (confidence is a real: through numeric it reads as written, 0.9 rather than 0.8999999761581421.)
_MEMORY_EXPRS = {"metadata": "m.metadata::text", "revision": "m.seq", "key": "m.subject_key",
                 "valid_from": "coalesce(m.valid_from, m.created_at)",
                 "confidence": "m.confidence::numeric::float8"}
_MEMORY_COLS = _select_list(MemoryRow, "m", "mid", 2, _MEMORY_EXPRS)
_ENTRY_COLS = _select_list(EntryRow, "e", "eid", 0, {"value": "e.value::text", "metadata": "e.metadata::text"})

#: The previous and the next memory on ``m``'s board, in ``(created_at, mid)`` order (scalar
#: subqueries, one probe of the ``(board, created_at, mid)`` index each).
_NEIGHBOURS = (
    "(SELECT p.mid FROM bb_memories p WHERE p.board = m.board AND (p.created_at, p.mid) < (m.created_at, m.mid) "
    "ORDER BY p.created_at DESC, p.mid DESC LIMIT 1)",
    "(SELECT n.mid FROM bb_memories n WHERE n.board = m.board AND (n.created_at, n.mid) > (m.created_at, m.mid) "
    "ORDER BY n.created_at, n.mid LIMIT 1)")



class SourceRow(NamedTuple):
    """One memory merged into a kept memory (a ``bb_memory_sources`` row, :data:`MEMORY_SOURCES`)."""

    id: str
    agent: str
    created_at: datetime
    stream: str
    seq: int
    sig_key: str | None
    sig: str | None
    verdict: str
    how: str
    merged_at: datetime


#: Most sources and versions a memory read returns.
MAX_DETAIL_ROWS = 1000
#: The memory ``%(id)s`` of board ``%(board)s`` as a :class:`MemoryRow` (score 0, no flag):
#: the live memory of that id, else the memory it was merged into (``bb_memory_sources``),
#: else the archived memory of that id. No row: none of these.
MEMORY_BY_ID = (
    f"SELECT m.mid AS item, 0::float8 AS score, NULL::boolean AS flag, {_MEMORY_COLS} FROM ("
    "SELECT m.mid, 0 AS rank FROM bb_memories m WHERE m.id = %(id)s AND m.archived_at IS NULL "
    "UNION ALL SELECT s.mid, 1 FROM bb_memory_sources s WHERE s.id = %(id)s "
    "UNION ALL SELECT m.mid, 2 FROM bb_memories m WHERE m.id = %(id)s) c "
    "JOIN bb_memories m ON m.mid = c.mid WHERE m.board = %(board)s ORDER BY c.rank LIMIT 1")
#: The memories merged into memory ``%(mid)s``, oldest first (:class:`SourceRow`).
MEMORY_SOURCES = (
    f"SELECT {', '.join(SourceRow._fields)} FROM bb_memory_sources WHERE mid = %(mid)s "
    f"ORDER BY created_at, id LIMIT {MAX_DETAIL_ROWS}")
#: Every version of subject key ``%(key)s`` on board ``%(board)s`` (archived ones too), in
#: valid-time order, then stream order (:class:`MemoryRow`, score 0).
MEMORY_VERSIONS = (
    f"SELECT m.mid AS item, 0::float8 AS score, NULL::boolean AS flag, {_MEMORY_COLS} FROM bb_memories m "
    "WHERE m.board = %(board)s AND m.subject_key = %(key)s "
    f"ORDER BY coalesce(m.valid_from, m.created_at), m.seq LIMIT {MAX_DETAIL_ROWS}")


class RevisionRow(NamedTuple):
    """One stored revision of a key (:data:`HISTORY`, :data:`AS_OF_REVISION`; :data:`AS_OF_AT`
    adds the revision's expiry)."""

    board: str
    section: str
    key: str
    revision: int
    op: str
    value: Any
    value_raw: bytes | None
    content_type: str | None
    tags: list[str]
    metadata: dict[str, Any]
    author: str | None
    created_at: datetime | None
    stored_at: datetime
    #: The signature's verdict the worker stored (``verified`` or ``unsigned``).
    verdict: str
    expires_at: datetime | None = None


REVISION_COLS = _select_list(RevisionRow, "r", "board", 1, {"revision": "r.seq"})
HISTORY = f"SELECT {REVISION_COLS} FROM (SELECT * FROM bb_entry_revisions WHERE board = %s AND section = %s " \
          "AND key = %s ORDER BY seq DESC LIMIT %s) r ORDER BY r.seq"
AS_OF_REVISION = f"SELECT {REVISION_COLS} FROM bb_entry_revisions r WHERE board = %s AND section = %s " \
                 "AND key = %s AND seq <= %s ORDER BY seq DESC LIMIT 1"
#: (The revision's expiry last: a revision past it at that time had expired.)
AS_OF_AT = f"SELECT {REVISION_COLS}, r.expires_at FROM bb_entry_revisions r WHERE board = %s AND section = %s " \
           "AND key = %s AND stored_at <= %s ORDER BY seq DESC LIMIT 1"
#: Session HNSW settings: ef_search, and iterative scans so that filters applied
#: after the index scan still fill the limit (the search engine sets them once per
#: pooled connection, and again when ef_search changes).
SET_SCAN_SESSION = ("SELECT set_config('hnsw.ef_search', %s, false), "
                    "set_config('hnsw.iterative_scan', 'relaxed_order', false)")
#: The lexemes of each of the given words (``%s``: text[]) under the index's text search
#: configuration: rows ``(word's position from 1, lexeme)``; a word without one (a stop word,
#: punctuation) has no row.
WORD_LEXEMES = ("SELECT w.i, l.lexeme FROM unnest(%s::text[]) WITH ORDINALITY AS w(word, i), "
                "unnest(to_tsvector('english', w.word)) AS l")
_BLANKS_RE = re.compile(r"[ \t\n\r\f\v]+")
#: Most query lexemes a keyword search scores (the rest of a long query is ignored).
MAX_QUERY_LEXEMES = 32


def query_words(text: str) -> list[str]:
    """The distinct blank-separated words of ``text``, in order.

    PostgreSQL's parser never makes a token across ASCII blanks, so a text's
    lexemes are the union of its words' (checked on 1,700 LoCoMo questions and
    turns and on hyphenated words, URLs, e-mail addresses, numbers,
    apostrophes and non-Latin scripts): the search engine caches lexemes per
    word, and a query whose words were all seen before needs no round trip.
    """
    return list(dict.fromkeys(w for w in _BLANKS_RE.split(text) if w))


def or_query(text: str, max_words: int = 64) -> str:
    """A ``websearch_to_tsquery`` string matching any word of ``text``."""
    words = _WORD_RE.findall(text)[:max_words]
    return " or ".join(w for w in words if w.lower() != "or")


def filters(target: Target, f: SearchFilters, *, boards: bool = True) -> tuple[list[str], list[Any]]:
    """WHERE conditions (ANDed SQL texts) of the filters ``f`` of a ``target`` search, on alias
    ``m`` or ``e`` (without the board filter if not ``boards``), and their parameters.

    ``kinds`` and the lifecycle filters apply to memories only and ``sections`` to entries
    only (a search request never carries the other target's); ``where`` adds
    :func:`~blackboard.db.filter_sql.where_conditions` of each path. A memory search without
    a lifecycle filter ends with :data:`LIVE_MEMORY` and :data:`CURRENT_MEMORY` (recall's
    default: current memories only).

    Raises:
        ValueError: a ``where`` path on ``value.`` in a memory search (the request refuses it).
    """
    memory = target == "memory"
    a = "m" if memory else "e"
    conds: list[str] = []
    params: list[Any] = []

    def add(cond: str, value: Any) -> None:
        conds.append(cond.replace("{a}", a))
        params.append(value)

    if not memory:
        # Deleted, or expired by its TTL (whether or not the server's delete marker was read).
        conds.append("NOT e.deleted AND (e.expires_at IS NULL OR e.expires_at > now())")
    if f.boards and boards:
        add("{a}.board = ANY(%s)", list(f.boards))
    if memory:
        if f.kinds:
            add("m.kind = ANY(%s)", list(f.kinds))
        if f.author:
            add("m.agent = %s", f.author)
    else:
        if f.sections:
            add("e.section = ANY(%s)", list(f.sections))
        if f.author:
            add("e.author = %s", f.author)
    if f.tags_any:
        add("{a}.tags && %s::text[]", list(f.tags_any))
    if f.tags_all:
        add("{a}.tags @> %s::text[]", list(f.tags_all))
    when = "created_at" if memory else "updated_at"
    if f.since:
        add(f"{{a}}.{when} >= %s", f.since)
    if f.until:
        add(f"{{a}}.{when} < %s", f.until)
    if f.metadata:
        add("{a}.metadata @> %s", Jsonb(f.metadata))
    if f.where:
        for path in f.where.paths:
            if path.root == "value" and memory:
                raise ValueError("where: memories have no value (value.<...> paths filter entries only)")
            for cond, values in where_conditions(a, path):
                conds.append(cond)
                params.extend(values)
    if memory:
        _lifecycle(f, conds, params)
    return conds, params


#: A memory not archived (recall's default).
LIVE_MEMORY = "m.archived_at IS NULL"
#: A memory not superseded (its key's newest version) and not contested (recall's default).
CURRENT_MEMORY = "m.valid_to IS NULL AND m.contested_by IS NULL"
#: The default conditions, which need no parameter: the memory query filtered by nothing else
#: checks them in its probe of each nearest vector's row (:func:`semantic_query`).
_DEFAULT_CONDS = frozenset({LIVE_MEMORY, CURRENT_MEMORY})
#: A memory's valid-time start (rows from before migration 0015: their write time).
_VALID_FROM = "coalesce({m}.valid_from, {m}.created_at)"
#: No version of ``m``'s subject key written by then (``%s``) is newer than ``m`` by
#: (valid_from, seq); ``{bound}``: more conditions on that version (as-of). A version that
#: ``m`` closed (a lost vote's challenger), one still contested, or one merged into another
#: memory (which stands for it) does not count.
_NEWEST_KNOWN = (
    "(m.subject_key IS NULL OR NOT EXISTS (SELECT FROM bb_memories o WHERE o.board = m.board "
    "AND o.subject_key = m.subject_key AND o.created_at <= %s{bound} "
    "AND o.contested_by IS NULL AND o.merged_into IS NULL AND o.superseded_by IS DISTINCT FROM m.id "
    "AND (" + _VALID_FROM.format(m="o") + ", o.seq) > (" + _VALID_FROM.format(m="m") + ", m.seq)))")


def _lifecycle(f: SearchFilters, conds: list[str], params: list[Any]) -> None:
    """The memory lifecycle filters of ``f`` (alias ``m``): which versions (current, as of a
    valid time, as known at an instant, or all), live or archived too, event time, confidence
    (docs/memory-lifecycle.md, "Retrieval")."""
    valid_from = _VALID_FROM.format(m="m")
    if not f.include_archived:
        conds.append(LIVE_MEMORY)
    if f.known_at is not None:
        # What the board knew then: written by then, and per key the newest of those.
        conds.append("m.created_at <= %s")
        params.append(f.known_at)
        if f.as_of is not None:
            conds.append(f"{valid_from} <= %s")
            params.append(f.as_of)
        if not f.include_superseded:
            conds.append("m.contested_by IS NULL")
            bound = "" if f.as_of is None else " AND " + _VALID_FROM.format(m="o") + " <= %s"
            conds.append(_NEWEST_KNOWN.format(bound=bound))
            params.append(f.known_at)
            if f.as_of is not None:
                params.append(f.as_of)
    elif f.as_of is not None:
        # Valid then: from valid_from until the next version's (valid_to), closed versions too.
        conds.append(f"{valid_from} <= %s AND (m.valid_to IS NULL OR m.valid_to > %s)")
        params.extend((f.as_of, f.as_of))
        if not f.include_superseded:
            conds.append("m.contested_by IS NULL")
    elif not f.include_superseded:
        conds.append(CURRENT_MEMORY)
    if f.occurred_after is not None:
        conds.append(f"{valid_from} >= %s")
        params.append(f.occurred_after)
    if f.occurred_before is not None:
        conds.append(f"{valid_from} < %s")
        params.append(f.occurred_before)
    if f.min_confidence is not None:
        conds.append("m.confidence >= %s::real")  # (as stored: 0.9 is at least 0.9)
        params.append(f.min_confidence)


def _where(conds: Sequence[str]) -> sql.Composable:
    return sql.SQL(" WHERE " + " AND ".join(conds)) if conds else sql.SQL("")


def probes(target: Target, f: SearchFilters) -> bool:
    """Whether :func:`semantic_query` takes the nearest vectors first and then checks each
    one's row (a memory search filtered by board and the default conditions only: live and
    current, or fewer with the include flags), which may return fewer than ``limit`` rows
    passing the check (rows failing it have a NULL flag)."""
    if target != "memory":
        return False
    conds, params = filters(target, f, boards=False)
    return not params and _DEFAULT_CONDS.issuperset(conds)


def semantic_query(space: Space, target: Target, f: SearchFilters, vector: Any, limit: int,
                   *, exact: bool = False, probe: bool = True) -> tuple[str, list[Any]]:
    """Rows ``(item, cosine similarity, flag)`` of the nearest items passing the filters (the
    third column keeps the rows' shape that :func:`with_rows` wraps).

    The board filter is applied to the vector table's own ``board`` column,
    inside the scan; the other filters (and the board again, the item's
    current one) on the item's row. A memory query filtered by board and the
    default conditions only (:func:`probes`) takes the ``limit`` nearest vectors
    first and probes each one's row, which checks the board and the default
    conditions: ``flag`` is true for the rows that pass, NULL for the others
    (the caller drops them, and when it dropped some, runs the query again with
    ``probe=False``); any other filter is applied to every row the scan visits
    (``flag`` true).

    Args:
        exact: order by an expression the HNSW index cannot serve: an exact
            scan of the rows passing the filters (with a board filter, an
            index-only scan of the covering board index).
        probe: False: never the probing form (every filter applied to the rows the scan visits).
    """
    memory = target == "memory"
    conds, fparams = filters(target, f, boards=False)
    boards = list(f.boards)
    vparams: list[Any] = [boards] if boards else []
    oparams: list[Any] = [vector]  # the order's (the select list's distance is the exact one)
    probing = probe and memory and not fparams and _DEFAULT_CONDS.issuperset(conds)
    text = _semantic_sql(memory, tuple(conds), space.table_name(target), bool(boards), exact, space.dims,
                         probing)
    if probing:
        return text, [vector, *vparams, *oparams, limit]
    return text, [vector, *vparams, *([boards] if boards else []), *fparams, *oparams, limit]


@functools.lru_cache(maxsize=256)
def _semantic_sql(memory: bool, conds: tuple[str, ...], table_name: str, boards: bool, exact: bool,
                  dims: int, probing: bool) -> str:
    """The text of :func:`semantic_query` for one shape of request (built once: composing it
    costs more than the statement's planning on a small board)."""
    base, alias, key = ("bb_memories m", "m", "mid") if memory else ("bb_entries e", "e", "eid")
    table = sql.Identifier(table_name)
    vconds = ["v.board = ANY(%s)"] if boards else []
    # The index scan orders by the index's expression (vectors cast to halfvec, see
    # spaces.ann_order); the scores are the exact distances of the rows it returns, and the
    # caller sorts by them. The exact scan orders by an expression no index serves.
    order = sql.SQL("(v.embedding <=> %s::vector) + 0") if exact else sql.SQL(ann_order(dims, "v.embedding"))
    if probing:
        # Nearest first, then a check that each memory is still on its vector's
        # board and passes the default conditions: one primary-key probe per row
        # (LATERAL ... LIMIT 1), where a join let the planner hash the board's
        # whole part of an index for ~50 rows. A row failing it stays, flagged NULL,
        # so that the caller knows the scan's rows were not all usable.
        check = " AND ".join(["m.mid = s.item", "m.board = s.board", *sorted(conds)])
        query = sql.SQL(
            "SELECT s.item, 1 - s.d, m.ok FROM (SELECT v.item, v.board, v.embedding <=> %s::vector AS d "
            "FROM {t} v{vwhere} ORDER BY {order} LIMIT %s) s "
            "LEFT JOIN LATERAL (SELECT true AS ok FROM bb_memories m WHERE {check} LIMIT 1) m ON true").format(
            t=table, vwhere=_where(vconds), order=order, check=sql.SQL(check))
    else:
        item_conds = ([f"{alias}.board = ANY(%s)"] if boards else []) + list(conds)
        query = sql.SQL(
            "SELECT s.item, 1 - s.d, true FROM (SELECT v.item, v.embedding <=> %s::vector AS d "
            "FROM {t} v JOIN {base} ON {a}.{k} = v.item{where} ORDER BY {order} LIMIT %s) s").format(
            t=table, base=sql.SQL(base), a=sql.Identifier(alias), k=sql.Identifier(key),
            where=_where(vconds + item_conds), order=order)
    return query.as_string()


def analyze_statements(target: Target, space: Space | None) -> list[str]:
    """``ANALYZE`` of ``bb_memories`` or ``bb_entries`` and, with a ``space``, of its vector
    table: the planner's statistics, and the ones the searches read (:func:`term_stats_query`,
    :func:`board_stats_query`)."""
    tables = [_ITEM_TABLE[target]]
    if space is not None:
        tables.append(space.table(target).as_string())
    return [f"ANALYZE {t}" for t in tables]


def board_stats_query(target: Target) -> tuple[str, list[Any]]:
    """ANALYZE's statistics of the ``board`` column of ``bb_memories`` or ``bb_entries``: most
    common boards (``boards``), their frequencies (``freqs``), the distinct count
    (``n_distinct``) and the table's estimated row count (``reltuples``): one row, the column
    statistics NULL before the first ANALYZE. The vector tables hold a row for (almost) every
    item, so this sizes their boards too."""
    table = _ITEM_TABLE[target]
    return ("SELECT s.most_common_vals::text::text[] AS boards, s.most_common_freqs AS freqs, s.n_distinct, "
            "c.reltuples "
            "FROM pg_class c LEFT JOIN pg_stats s ON s.schemaname = current_schema() "
            "AND s.tablename = c.relname AND s.attname = 'board' "
            "WHERE c.oid = to_regclass(%s)", [table])


def tsquery_literal(lexemes: Sequence[str]) -> str:
    """A ``tsquery`` text matching any of ``lexemes``, taken as they are (no stemming).

    Raises:
        ValueError: no lexemes (an empty tsquery matches nothing).
    """
    if not lexemes:
        raise ValueError("a tsquery needs at least one lexeme")
    return " | ".join("'" + lx.replace("\\", "\\\\").replace("'", "''") + "'" for lx in lexemes)


def term_stats_query(target: Target) -> tuple[str, list[Any]]:
    """The ``tsv`` column's most common lexemes (``lexemes``) with their frequencies
    (``freqs``, from ANALYZE), and the table's estimated row count (``reltuples``): one row,
    arrays NULL before the first ANALYZE."""
    table = _ITEM_TABLE[target]
    return ("SELECT s.most_common_elems::text::text[] AS lexemes, s.most_common_elem_freqs AS freqs, c.reltuples "
            "FROM pg_class c LEFT JOIN pg_stats s ON s.schemaname = current_schema() "
            "AND s.tablename = c.relname AND s.attname = 'tsv' "
            "WHERE c.oid = to_regclass(%s)", [table])


def keyword_query(target: Target, f: SearchFilters, lexemes: Sequence[str],
                  candidate_lexemes: Sequence[str], limit: int, *, max_candidates: int,
                  k1: float = 1.2, b: float = 0.75, space: Space | None = None,
                  vector: Any = None) -> tuple[str, list[Any]]:
    """Rows ``(id, BM25 score, cosine)`` of the ``target`` items matching any of
    ``candidate_lexemes`` and the filters ``f``, best first.

    Every lexeme of ``lexemes`` (the query's) counts in the score; candidates
    are generated from ``candidate_lexemes`` only (a subset without the very
    frequent ones, see :func:`blackboard.search.planning.candidate_lexemes`). Document
    frequency, candidate count and mean length are taken over the candidates
    (at most ``max_candidates`` of them), so the inverse document frequency is
    that of the filtered scope. Term frequency is binary.

    Args:
        space, vector: when both are given, the cosine similarity of each
            result's vector to ``vector`` (NULL without a vector); otherwise NULL.
    """
    memory = target == "memory"
    conds, fparams = filters(target, f)
    terms = list(lexemes)[:MAX_QUERY_LEXEMES]
    with_vector = space is not None and vector is not None
    vector_table = space.table_name(target) if with_vector and space is not None else None
    text = _keyword_sql(memory, tuple(conds), len(terms), float(k1), float(b), vector_table)
    params: list[Any] = [vector] if with_vector else []
    params += [tsquery_literal([t]) for t in terms]
    params += [tsquery_literal(candidate_lexemes), *fparams, max_candidates, limit]
    return text, params


@functools.lru_cache(maxsize=1024)
def _keyword_sql(memory: bool, conds: tuple[str, ...], n_terms: int, k1: float, b: float,
                 vector_table: str | None) -> str:
    """The text of :func:`keyword_query` for one shape of request (built once: composing it
    took ~0.45 ms of CPU, a sixth of the statement's run on 2,000 memories)."""
    alias, key = ("m", "mid") if memory else ("e", "eid")
    a = sql.Identifier(alias)
    terms = range(n_terms)
    hits = sql.SQL("").join(
        sql.SQL(", ({a}.tsv @@ %s::tsquery)::int AS {h}").format(a=a, h=sql.Identifier(f"h{i}")) for i in terms)
    dfs = sql.SQL("").join(
        sql.SQL(", sum({h})::float8 AS {df}").format(h=sql.Identifier(f"h{i}"), df=sql.Identifier(f"df{i}"))
        for i in terms)
    idfs = sql.SQL("").join(
        sql.SQL(", ln(1 + (n - {df} + 0.5) / ({df} + 0.5)) AS {idf}").format(
            df=sql.Identifier(f"df{i}"), idf=sql.Identifier(f"idf{i}")) for i in terms)
    total = sql.SQL(" + ").join(
        sql.SQL("{h} * {idf}").format(h=sql.Identifier(f"h{i}"), idf=sql.Identifier(f"idf{i}")) for i in terms)
    # The candidates once (materialised), their statistics in one aggregate
    # row, then every candidate's score: each inverse document frequency is
    # computed once, in float8 (window aggregates per row, and numeric
    # arithmetic, cost about a third more).
    query = sql.SQL(
        "WITH c AS MATERIALIZED (SELECT {a}.{k} AS id, length({a}.tsv)::float8 AS dl{hits} "
        "FROM {base}{where} LIMIT %s), "
        "st AS (SELECT avgdl{idfs} FROM (SELECT count(*)::float8 AS n, avg(dl) AS avgdl{dfs} FROM c) a) "
        "SELECT c.id, ({total}) * {k1p1} / (1 + {k1} * (1 - {b} + {b} * c.dl / st.avgdl)) AS score "
        "FROM c, st ORDER BY score DESC, c.id LIMIT %s").format(
        a=a, k=sql.Identifier(key), hits=hits, dfs=dfs, idfs=idfs, total=total,
        k1p1=sql.Literal(k1 + 1.0), k1=sql.Literal(k1), b=sql.Literal(b),
        base=sql.SQL("bb_memories m" if memory else "bb_entries e"),
        where=_where([f"{alias}.tsv @@ %s::tsquery", *conds]))
    cosine = sql.SQL("1 - (v.embedding <=> %s::vector)") if vector_table else sql.SQL("NULL::float8")
    join = sql.SQL(" LEFT JOIN {t} v ON v.item = k.id").format(t=sql.Identifier(vector_table)) \
        if vector_table else sql.SQL("")
    return sql.SQL("SELECT k.id, k.score, {cos} FROM ({q}) k{join}").format(cos=cosine, q=query, join=join).as_string()


def vector_scores(space: Space, target: Target, items: Sequence[int], vector: Any) -> tuple[str, list[Any]]:
    """Rows ``(item, cosine)``: the cosine similarity of the query to the given items (those
    that have a vector)."""
    return _vector_scores_sql(space.table_name(target)), [vector, list(items)]


@functools.lru_cache(maxsize=64)
def _vector_scores_sql(table_name: str) -> str:
    return sql.SQL("SELECT item, 1 - (embedding <=> %s::vector) AS cosine FROM {t} WHERE item = ANY(%s)").format(
        t=sql.Identifier(table_name)).as_string()


@functools.lru_cache(maxsize=1024)
def with_rows(query: str, target: Target, *, linked: int = 0) -> str:
    """``query``'s three columns ``(item, score, flag)`` followed by the item's full row, for
    the items still there: a search gets its candidates' rows in the retrievers' statements
    (in no particular order). The rows are :class:`MemoryRow` or :class:`EntryRow` (JSON
    columns as text; read them with :func:`named_rows`).

    Args:
        linked: for memories, the rows of the ``linked`` best-scoring items end with the
            previous and the next memory on their board (:data:`_NEIGHBOURS`); the other rows
            end with two NULLs (the neighbour probes cost ~13 µs each).
    """
    cols, table, key = ((_MEMORY_COLS, "bb_memories m", "m.mid") if target == "memory"
                        else (_ENTRY_COLS, "bb_entries e", "e.eid"))
    if linked <= 0 or target != "memory":
        return f"SELECT r.item, r.score, r.flag, {cols} FROM ({query}) AS r(item, score, flag) JOIN {table} ON {key} = r.item"
    prev, nxt = _NEIGHBOURS
    lead = int(linked)
    return (f"SELECT r.item, r.score, r.flag, {cols}, CASE WHEN r.n <= {lead} THEN {prev} END AS prev, "
            f"CASE WHEN r.n <= {lead} THEN {nxt} END AS next "
            f"FROM (SELECT k.*, row_number() OVER (ORDER BY k.score DESC, k.item) AS n "
            f"FROM ({query}) AS k(item, score, flag)) r JOIN {table} ON {key} = r.item")


def searchable_query(space: Space | None, board: str, ids: Sequence[str],
                     seqs: Sequence[int]) -> tuple[str, list[Any]]:
    """Rows ``(id, stored, embedded)`` of the memories ``ids`` of ``board``: ``stored`` when
    the board holds the memory at stream sequence ``seqs[i]`` or later, ``embedded`` when that
    stored version also has its vector in ``space`` (the embedder writes a vector with the
    revision it embedded; without a space, none has). A memory merged into another (that
    version or a later one; ``bb_memory_sources``: exact deduplication, near-duplicate
    consolidation) is answered for by the memory it was merged into. One row per id, in any order."""
    vec = sql.SQL("LEFT JOIN {} v ON v.item = m.mid AND v.revision = m.seq").format(space.table("memory")) \
        if space is not None else sql.SQL("LEFT JOIN (SELECT NULL::bigint AS item) v ON false")
    text = sql.SQL(
        "SELECT r.id, m.mid IS NOT NULL AS stored, v.item IS NOT NULL AS embedded "
        "FROM unnest(%s::text[], %s::bigint[]) AS r(id, seq) "
        "LEFT JOIN LATERAL ("
        " SELECT k.mid, k.seq FROM bb_memories k WHERE k.mid = (SELECT x.mid FROM bb_memory_sources x"
        "  WHERE x.id = r.id AND x.board = %s AND x.seq >= r.seq)"
        " UNION ALL"
        " SELECT m.mid, m.seq FROM bb_memories m WHERE m.id = r.id AND m.board = %s AND m.seq >= r.seq"
        " LIMIT 1) m ON true {vec}"
    ).format(vec=vec).as_string()
    return text, [list(ids), list(seqs), board, board]
