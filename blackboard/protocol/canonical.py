"""The canonical encoding of a wire record: one byte string per record.

What a signature will cover. Two records that the schema reads as equal have
the same canonical bytes, whichever encoding (msgpack or JSON), map order or
number form their writer used; ``docs/protocol.md`` ("Canonical encoding")
specifies the rules so another language can reproduce them. In short:

* the record is a msgpack map holding **every** field of its schema, in the
  schema's declaration order (absent optional fields as nil, unknown fields
  dropped); nested schema records (a proposal's policy, an outcome's counts)
  likewise; except the fields a later version of a record added as
  **extensions** (marked with :data:`EXTENSION`), which are left out when null,
  so the records of the earlier version keep their bytes and signatures;
* a schema timestamp is the string ``YYYY-MM-DDTHH:MM:SS.ffffff+00:00`` (UTC,
  always six fraction digits);
* user maps (``value``, ``metadata``, ``body``, candidates, weights...) have
  their entries sorted by the bytes of their encoded keys, recursively;
* integers take the smallest msgpack form; a float with an integral value
  within ±2**53 is written as that integer, any other float as float64 (NaN
  as ``0x7ff8000000000000``);
* strings are UTF-8 str, binary data is bin, both with the smallest header.

The canonical bytes are a valid wire payload: decoding them gives the same
record. Pure functions, no IO.
"""

from __future__ import annotations

import itertools
import math
import struct
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from blackboard.protocol.errors import InvalidPayloadError

__all__ = ["EXTENSION", "MAX_DEPTH", "canonical_bytes", "canonical_key_order", "canonical_timestamp",
           "extension_fields"]

#: Deepest nesting of maps and arrays with a canonical encoding.
MAX_DEPTH = 256
#: Floats with an integral value up to this magnitude are written as integers
#: (the integers a float64, hence a JavaScript number, holds exactly).
_MAX_EXACT = 2**53
_NAN = b"\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00"
_FLOAT64 = struct.Struct(">d")
#: The ``json_schema_extra`` key that marks a field as an extension added by a later
#: version of its record (the value is that version): left out of the canonical
#: encoding when null, written like any field otherwise (docs/protocol.md §13.1).
EXTENSION = "x-bb-since-version"


def extension_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields of ``model`` marked as extensions (:data:`EXTENSION`)."""
    return _layout(model)[1]


#: Per schema: (field name, is a schema timestamp, is an extension) in order, and the extensions.
_LAYOUTS: dict[type[BaseModel], tuple[tuple[tuple[str, bool, bool], ...], frozenset[str]]] = {}


def _layout(model: type[BaseModel]) -> tuple[tuple[tuple[str, bool, bool], ...], frozenset[str]]:
    layout = _LAYOUTS.get(model)
    if layout is None:
        fields = []
        for name, info in model.model_fields.items():
            extra = info.json_schema_extra
            ext = isinstance(extra, dict) and EXTENSION in extra
            fields.append((name, info.annotation is not Any, ext))
        layout = (tuple(fields), frozenset(n for n, _, e in fields if e))
        _LAYOUTS[model] = layout
    return layout


def canonical_timestamp(value: datetime) -> str:
    """The canonical text of a schema timestamp: UTC, microseconds, ``+00:00``.

    Raises:
        InvalidPayloadError: a naive datetime, or one that has no UTC form.
    """
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidPayloadError("a timestamp needs a UTC offset")
    try:
        utc = value.astimezone(UTC)
    except OverflowError as exc:
        raise InvalidPayloadError(f"timestamp out of range: {value!r}") from exc
    return utc.replace(tzinfo=None).isoformat(timespec="microseconds") + "+00:00"


def canonical_key_order(keys: list[str]) -> list[str]:
    """The order the canonical encoding gives a map's text keys (by the bytes of each key
    encoded: shorter keys first up to 31 bytes, then by their UTF-8 bytes).

    Raises:
        InvalidPayloadError: a key that is not valid Unicode.
    """
    def encoded(key: str) -> bytes:
        out = bytearray()
        _str(key, out)
        return bytes(out)

    return sorted(keys, key=encoded)


def canonical_bytes(record: BaseModel) -> bytes:
    """The canonical encoding of a wire record (see the module docstring).

    Raises:
        InvalidPayloadError: the record holds something with no canonical
            encoding (an integer beyond 64 bits, text that is not valid
            Unicode, a set, nesting deeper than :data:`MAX_DEPTH`, ...).
    """
    out = bytearray()
    try:
        _record(record, out, 0)
    except RecursionError as exc:
        raise InvalidPayloadError("value nested too deeply for a canonical encoding") from exc
    return bytes(out)


def _header(out: bytearray, n: int, fix: int, fix_max: int, codes: tuple[int, int, int], what: str) -> None:
    """The smallest header of a str, bin, array or map of ``n`` items or bytes.

    ``codes`` are the 8-, 16- and 32-bit length forms (0 when the type has none).
    """
    if n <= fix_max:
        out.append(fix | n)
    elif n < 0x100 and codes[0]:
        out += bytes((codes[0], n))
    elif n < 0x10000:
        out.append(codes[1])
        out += n.to_bytes(2, "big")
    elif n < 0x100000000:
        out.append(codes[2])
        out += n.to_bytes(4, "big")
    else:
        raise InvalidPayloadError(f"{what} too long for msgpack ({n})")


def _int(value: int, out: bytearray) -> None:
    if 0 <= value <= 0x7F:
        out.append(value)
    elif -32 <= value < 0:
        out.append(value & 0xFF)
    elif value > 0:
        for code, size in ((0xCC, 1), (0xCD, 2), (0xCE, 4), (0xCF, 8)):
            if value < 1 << (8 * size):
                out.append(code)
                out += value.to_bytes(size, "big")
                return
        raise InvalidPayloadError(f"integer {value} does not fit in 64 bits")
    else:
        for code, size in ((0xD0, 1), (0xD1, 2), (0xD2, 4), (0xD3, 8)):
            if value >= -(1 << (8 * size - 1)):
                out.append(code)
                out += value.to_bytes(size, "big", signed=True)
                return
        raise InvalidPayloadError(f"integer {value} does not fit in 64 bits")


def _float(value: float, out: bytearray) -> None:
    if math.isnan(value):
        out += _NAN
    elif value.is_integer() and abs(value) <= _MAX_EXACT:
        _int(int(value), out)
    else:
        out.append(0xCB)
        out += _FLOAT64.pack(value)


def _str(value: str, out: bytearray) -> None:
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidPayloadError("text is not valid Unicode (lone surrogate)") from exc
    _header(out, len(data), 0xA0, 31, (0xD9, 0xDA, 0xDB), "string")
    out += data


def _value(value: Any, out: bytearray, depth: int) -> None:
    """A user value, as the codec carries it (datetime as its ISO text, tuple as array)."""
    if value is None:
        out.append(0xC0)
    elif value is True:
        out.append(0xC3)
    elif value is False:
        out.append(0xC2)
    elif isinstance(value, int):
        _int(int(value), out)
    elif isinstance(value, float):
        _float(float(value), out)
    elif isinstance(value, str):
        _str(value, out)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        _header(out, len(data), 0, -1, (0xC4, 0xC5, 0xC6), "binary")
        out += data
    elif isinstance(value, (list, tuple)):
        if depth >= MAX_DEPTH:
            raise InvalidPayloadError(f"value nested deeper than {MAX_DEPTH} levels")
        _header(out, len(value), 0x90, 15, (0, 0xDC, 0xDD), "array")
        for item in value:
            _value(item, out, depth + 1)
    elif isinstance(value, dict):
        if depth >= MAX_DEPTH:
            raise InvalidPayloadError(f"value nested deeper than {MAX_DEPTH} levels")
        items: list[tuple[bytes, bytes]] = []
        for k, v in value.items():
            key, val = bytearray(), bytearray()
            _value(k, key, depth + 1)
            _value(v, val, depth + 1)
            items.append((bytes(key), bytes(val)))
        items.sort()
        for (a, _), (b, _) in itertools.pairwise(items):
            if a == b:
                raise InvalidPayloadError("a map has two keys with the same canonical encoding")
        _header(out, len(items), 0x80, 15, (0, 0xDE, 0xDF), "map")
        for key_bytes, val_bytes in items:
            out += key_bytes
            out += val_bytes
    elif isinstance(value, datetime):
        _str(value.isoformat(), out)  # what codec.encode writes for a datetime
    elif isinstance(value, BaseModel):
        _record(value, out, depth)
    else:
        raise InvalidPayloadError(f"no canonical encoding for a {type(value).__name__}")


def _record(record: BaseModel, out: bytearray, depth: int) -> None:
    """A schema record: every field, in declaration order (extensions only when set); its
    timestamps canonical."""
    if depth >= MAX_DEPTH:
        raise InvalidPayloadError(f"value nested deeper than {MAX_DEPTH} levels")
    fields, extensions = _layout(type(record))
    if extensions:
        fields = tuple(f for f in fields if not f[2] or getattr(record, f[0]) is not None)
    _header(out, len(fields), 0x80, 15, (0, 0xDE, 0xDF), "map")
    for name, schema_time, _ in fields:
        _str(name, out)
        value = getattr(record, name)
        if schema_time and isinstance(value, datetime):
            _str(canonical_timestamp(value), out)
        else:
            _value(value, out, depth + 1)
