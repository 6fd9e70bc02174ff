"""PostgreSQL binary COPY encoding of the ingest rows (pure, no IO).

The worker writes every batch with ``COPY ... FROM STDIN (FORMAT BINARY)``.
Encoding the rows here, with one ``struct`` call per fixed-width field and
pre-encoded JSON, costs a few microseconds a row in Python; psycopg's
``write_row`` goes through a dumper lookup per value and re-serialises every
JSON value. In binary, PostgreSQL does not parse timestamps, numbers or
arrays either, which saves server CPU on the hot path.

Format (PostgreSQL docs, "COPY ... Binary Format"): an 11-byte signature,
flags and header-extension length, then per row a 16-bit field count and per
field a 32-bit length (-1 for NULL) followed by the value in the type's binary
send format; a 16-bit -1 ends the stream.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

__all__ = [
    "COPY_HEADER",
    "COPY_TRAILER",
    "NULL",
    "bigint",
    "bigint_array_literal",
    "boolean",
    "bytea",
    "float4",
    "jsonb",
    "row",
    "stream",
    "text",
    "text_array",
    "text_array_literal",
    "timestamptz",
    "timestamptz_ns",
]

#: The stream's signature, flags (0) and header extension length (0).
COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
#: The end-of-data marker.
COPY_TRAILER = struct.pack(">h", -1)
#: A NULL field.
NULL = struct.pack(">i", -1)

_I = struct.Struct(">i")
_Q = struct.Struct(">iq")
_F = struct.Struct(">if")
_H = struct.Struct(">h")
_ARRAY1 = struct.Struct(">iiiiii")  # length, ndim, flags, elem oid, dim size, lower bound
_EMPTY_TEXT_ARRAY = struct.pack(">iiii", 12, 0, 0, 25)
_TEXT_OID = 25
_TRUE = struct.pack(">ib", 1, 1)
_FALSE = struct.pack(">ib", 1, 0)
#: Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
_PG_EPOCH_US = 946_684_800_000_000
_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def text(value: str | None) -> bytes:
    """A ``text`` field (UTF-8); None is NULL.

    Raises:
        UnicodeEncodeError: the string holds lone surrogates.
    """
    if value is None:
        return NULL
    data = value.encode()
    return _I.pack(len(data)) + data


def bytea(value: bytes | None) -> bytes:
    """A ``bytea`` field; None is NULL."""
    if value is None:
        return NULL
    return _I.pack(len(value)) + value


def jsonb(value: str | bytes | None) -> bytes:
    """A ``jsonb`` field from JSON text (``str``, or UTF-8 ``bytes``; version byte 1, then the text); None is NULL."""
    if value is None:
        return NULL
    data = value.encode() if isinstance(value, str) else value
    return _I.pack(len(data) + 1) + b"\x01" + data


def bigint(value: int | None) -> bytes:
    """An ``int8`` field; None is NULL."""
    return NULL if value is None else _Q.pack(8, value)


def float4(value: float | None) -> bytes:
    """A ``real`` field; None is NULL."""
    return NULL if value is None else _F.pack(4, value)


def boolean(value: bool | None) -> bytes:
    """A ``boolean`` field; None is NULL."""
    if value is None:
        return NULL
    return _TRUE if value else _FALSE


def timestamptz(value: datetime | None) -> bytes:
    """A ``timestamptz`` field (microseconds since 2000-01-01 UTC); None is NULL.

    Naive datetimes are taken as UTC.
    """
    if value is None:
        return NULL
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - _UNIX_EPOCH
    us = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return _Q.pack(8, us - _PG_EPOCH_US)


def timestamptz_ns(unix_ns: int) -> bytes:
    """A ``timestamptz`` field from nanoseconds since the Unix epoch (truncated to µs)."""
    return _Q.pack(8, unix_ns // 1000 - _PG_EPOCH_US)


def text_array(values: Sequence[str]) -> bytes:
    """A one-dimensional ``text[]`` field without NULL elements."""
    if not values:
        return _EMPTY_TEXT_ARRAY
    parts = []
    size = 20
    for v in values:
        data = v.encode()
        parts.append(_I.pack(len(data)))
        parts.append(data)
        size += 4 + len(data)
    return _ARRAY1.pack(size, 1, 0, _TEXT_OID, len(values), 1) + b"".join(parts)


def text_array_literal(values: Iterable[str]) -> str:
    """A ``text[]`` input literal (``{"a","b \\"c\\""}``) for a query parameter cast with ``::text[]``.

    Every element is double-quoted, backslashes and quotes escaped; the
    strings must hold no NUL. A few times cheaper in Python than letting the
    driver dump a list element by element, and one string for the server.
    """
    items = [v.replace("\\", "\\\\").replace('"', '\\"') for v in values]
    return '{"' + '","'.join(items) + '"}' if items else "{}"


def bigint_array_literal(values: Iterable[int]) -> str:
    """A ``bigint[]`` input literal (``{1,2,3}``) for a query parameter cast with ``::bigint[]``."""
    return "{" + ",".join(map(str, values)) + "}"


def row(fields: Sequence[bytes]) -> bytes:
    """One row: the field count, then the encoded fields."""
    return _H.pack(len(fields)) + b"".join(fields)


def stream(rows: Iterable[bytes]) -> bytes:
    """A whole COPY stream: header, encoded rows, trailer."""
    return COPY_HEADER + b"".join(rows) + COPY_TRAILER
