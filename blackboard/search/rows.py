"""Reading stored rows so that one bad row never fails a read: it is skipped, logged and counted.

What is stored was checked on its way in, but rows stored before a limit
existed (or written around the worker) can hold what Python cannot take back:
a ``timestamptz`` past the year 9999 once in UTC (``9999-12-31T23:59:59-23:59``
is 10000-01-01 in UTC) or before the year 1, ``infinity``, JSON nested deeper
than the parser goes, a value of the wrong shape for its hit, ``value_raw``
bytes that are not msgpack, or a value the reply's encoding cannot carry (an
integer past 64 bits in msgpack). Each of these failed the whole statement,
and so every search whose candidates held the row, on every board.

* :func:`fetch_readable` reads a statement's rows at C speed
  (``fetchall``); only when that fails does it read them one by one,
  skipping the rows that fail to load (psycopg's row loaders and row
  factories).
* :func:`readable` shapes rows into hits, skipping a row whose hit cannot
  be built.
* :func:`encode_response` encodes a reply; only when that fails are its hits
  encoded one by one, and those the encoding cannot carry dropped.

Every skip is logged (a warning naming the row and the error) and counted in a
:class:`SkippedRows` (``SearchEngine.skipped``, ``EntryHistory.skipped``,
``SearchService.skipped``), by the kind of row.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import psycopg
from pydantic import BaseModel

from blackboard.protocol import codec
from blackboard.protocol.errors import BlackboardError
from blackboard.protocol.limits import MAX_REPLY_DEPTH

__all__ = ["READ_ERRORS", "SkippedRows", "encode_response", "fetch_readable", "readable"]

log = logging.getLogger("blackboard.search.rows")

_T = TypeVar("_T")
_H = TypeVar("_H")

#: What loading or shaping one stored row may raise because of the row itself: psycopg's
#: ``DataError`` (a timestamp out of Python's range), ``ValueError`` (pydantic's
#: ``ValidationError``, ``InvalidPayloadError``, JSON), ``RecursionError`` (JSON nested too
#: deep), ``TypeError`` and ``OverflowError``.
READ_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.DataError, BlackboardError, ValueError, TypeError, OverflowError, RecursionError)


class SkippedRows:
    """How many stored rows a reader skipped, by kind (``memory``, ``entry``, ``revision``,
    ``message``, ``hit``: a hit its reply's encoding could not carry)."""

    def __init__(self) -> None:
        #: Rows skipped, by kind.
        self.counts: Counter[str] = Counter()

    @property
    def total(self) -> int:
        """Rows skipped, of every kind."""
        return self.counts.total()

    def skip(self, kind: str, what: str, exc: BaseException) -> None:
        """Count one skipped row of ``kind`` and log a warning naming it (``what``) and ``exc``."""
        self.counts[kind] += 1
        log.warning("skipping a stored %s that cannot be read back (%s): %s: %s",
                    kind, what, type(exc).__name__, str(exc)[:200])


async def fetch_readable(cur: psycopg.AsyncCursor[_T], kind: str, skipped: SkippedRows) -> list[_T]:
    """The rows of ``cur``'s executed statement, without those that fail to load.

    All rows at once; only when that fails, one by one from where it started, each row
    that fails skipped (:meth:`SkippedRows.skip`)."""
    start = cur.rownumber or 0
    try:
        return await cur.fetchall()
    except READ_ERRORS:
        pass
    await cur.scroll(start, mode="absolute")
    rows: list[_T] = []
    while True:
        position = cur.rownumber or 0
        try:
            row = await cur.fetchone()
        except READ_ERRORS as exc:
            skipped.skip(kind, f"row {position} of its statement", exc)
            if position + 1 >= cur.rowcount:  # that was the last row (scroll stops short of the end)
                return rows
            await cur.scroll(position + 1, mode="absolute")
            continue
        if row is None:
            return rows
        rows.append(row)


def readable(rows: Iterable[_T], shape: Callable[[_T], _H], kind: str, skipped: SkippedRows,
             name: Callable[[_T], str] = repr) -> list[_H]:
    """``shape(row)`` of each row, without the rows it fails on (skipped, ``name(row)`` in the
    warning)."""
    out: list[_H] = []
    for row in rows:
        try:
            out.append(shape(row))
        except READ_ERRORS as exc:
            skipped.skip(kind, name(row), exc)
    return out


def encode_response(response: BaseModel, encoding: codec.Encoding, skipped: SkippedRows) -> bytes:
    """The reply's bytes; a reply with ``hits`` that the encoding cannot carry loses the hits
    that cause it (each skipped as a ``hit``), not the reply.

    Raises:
        InvalidPayloadError: the reply cannot be encoded, even without those hits.
    """
    try:
        return codec.encode(response.model_dump(), encoding, max_depth=MAX_REPLY_DEPTH)
    except READ_ERRORS:
        hits = getattr(response, "hits", None)
        if not isinstance(hits, list):
            raise
    kept: list[dict[str, Any]] = []
    for i, hit in enumerate(hits):
        try:
            data = hit.model_dump()
            codec.encode(data, encoding, max_depth=MAX_REPLY_DEPTH)
        except READ_ERRORS as exc:
            skipped.skip("hit", f"hit {i} of a {type(response).__name__}: "
                                f"{getattr(hit, 'id', None) or getattr(hit, 'key', None)!r}", exc)
            continue
        kept.append(data)
    rest = response.model_dump(exclude={"hits"})
    return codec.encode({name: kept if name == "hits" else rest[name] for name in type(response).model_fields},
                        encoding, max_depth=MAX_REPLY_DEPTH)
