"""Serialisation of wire objects: msgpack by default, JSON on request.

Pure functions, no IO. A message's encoding is told by the ``Bb-Encoding``
header (absent means msgpack), so a shell user with the ``nats`` CLI can write
JSON by adding ``-H Bb-Encoding:json``.

Both directions are bounded by :mod:`.limits` (``docs/protocol.md``,
"Limits"): nesting depth, integer range, string and collection sizes, no
msgpack extension types. Decoding checks them before or while it builds the
value (msgpack's own length limits, a count of the bytes that could open a
container, brackets counted in JSON before the recursive parser runs), so a
hostile payload ends in :class:`~blackboard.protocol.errors.InvalidPayloadError`,
never in ``RecursionError`` or a huge allocation; encoding checks the same
limits, so a writer cannot send what its readers would refuse.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

import msgpack

from blackboard.protocol.errors import InvalidPayloadError, LimitExceededError
from blackboard.protocol.limits import (
    MAX_DEPTH,
    MAX_ITEMS,
    MAX_STRING_BYTES,
    check_value,
    depth_within,
    may_exceed_json,
    may_exceed_msgpack,
)
from blackboard.protocol.subjects import Header

__all__ = ["Encoding", "decode", "encode", "encoding_of", "headers_for", "is_json_safe", "is_storable_text"]

Encoding = Literal["msgpack", "json"]

_JSON_HEADERS = {Header.ENCODING.value: "json"}


def _default(obj: Any) -> Any:
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"cannot encode object of type {type(obj).__name__}")


def encode(obj: Any, encoding: Encoding = "msgpack", *, max_depth: int = MAX_DEPTH) -> bytes:
    """Encode a wire object.

    ``max_depth`` is :data:`~blackboard.protocol.limits.MAX_DEPTH` for a
    record; a server's reply that carries records passes ``MAX_REPLY_DEPTH``.

    Raises:
        LimitExceededError: the object goes beyond a protocol limit (nesting,
            an integer beyond 64 bits, an oversized string or collection).
        InvalidPayloadError: the object holds something the encoding cannot carry
            (e.g. bytes in JSON, an arbitrary Python object).
    """
    if encoding != "msgpack":
        check_value(obj, max_depth)  # before the recursive encoder, which has no depth bound of its own
    try:
        if encoding == "msgpack":
            data: bytes = msgpack.packb(obj, use_bin_type=True, default=_default)
            # Checked on what a reader will decode (tuples, sets and mappings are arrays and maps by then).
            if may_exceed_msgpack(data, max_depth) and not depth_within(
                    msgpack.unpackb(data, raw=False, strict_map_key=False), max_depth):
                raise _too_deep(max_depth)
            return data
        return json.dumps(obj, default=_default, separators=(",", ":"), ensure_ascii=False).encode()
    except (TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, InvalidPayloadError):
            raise
        if encoding == "msgpack":
            check_value(obj, max_depth)  # msgpack's nesting bound or an integer beyond 64 bits: say which limit
        raise InvalidPayloadError(f"cannot encode value as {encoding}: {exc}") from exc


def _too_deep(max_depth: int) -> LimitExceededError:
    return LimitExceededError("MAX_DEPTH", f"value nested deeper than {max_depth} levels")


#: Strings in JSON text (escapes included), removed before counting brackets.
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def _json_depth(data: bytes) -> int:
    """How deep JSON ``data`` nests (its strings left out), without parsing it."""
    depth = deepest = 0
    for ch in _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS):
        depth += 1 if ch in _OPENERS else -1
        if depth > deepest:
            deepest = depth
    return deepest


_OPENERS = frozenset(b"[{")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def decode(data: bytes, encoding: Encoding = "msgpack", *, max_depth: int = MAX_DEPTH,
           str_keys: bool = False) -> Any:
    """Decode a wire object, within the protocol's limits.

    ``max_depth`` is :data:`~blackboard.protocol.limits.MAX_DEPTH` for a
    record; a reader of a server's reply passes ``MAX_REPLY_DEPTH``.
    ``str_keys=True`` refuses msgpack map keys other than strings and bytes
    (the worker's fast path).

    Raises:
        LimitExceededError: the payload goes beyond a protocol limit (nesting,
            an integer beyond 64 bits, an oversized string or collection).
        InvalidPayloadError: the bytes are not valid msgpack / JSON / UTF-8,
            or hold a msgpack extension type.
    """
    try:
        if encoding == "msgpack":
            if len(data) <= MAX_ITEMS:  # msgpack bounds every length by len(data) then
                obj = msgpack.unpackb(data, raw=False, strict_map_key=str_keys, max_ext_len=0)
            else:
                obj = msgpack.unpackb(data, raw=False, strict_map_key=str_keys, max_ext_len=0,
                                      max_str_len=MAX_STRING_BYTES, max_bin_len=MAX_STRING_BYTES,
                                      max_array_len=MAX_ITEMS, max_map_len=MAX_ITEMS)
            # Integers are 64-bit in msgpack and lengths bounded above: only the depth is left.
            if may_exceed_msgpack(data, max_depth) and not depth_within(obj, max_depth):
                raise _too_deep(max_depth)
            return obj
        if not may_exceed_json(data, max_depth):
            return json.loads(data)
        if _json_depth(data) > max_depth:  # before the recursive parser
            raise _too_deep(max_depth)
        obj = json.loads(data)
        check_value(obj, max_depth)  # integers beyond 64 bits, sizes
        return obj
    except msgpack.StackError as exc:  # msgpack's own bound (1,024 levels), far beyond ours
        raise _too_deep(max_depth) from exc
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError) as exc:
        # UnicodeDecodeError and json.JSONDecodeError are ValueErrors; so is InvalidPayloadError.
        if isinstance(exc, InvalidPayloadError):
            raise
        raise InvalidPayloadError(f"payload is not valid {encoding}: {exc}") from exc


def encoding_of(headers: Mapping[str, str] | None, data: bytes | None = None) -> Encoding:
    """The encoding of a message: its ``Bb-Encoding`` header, else sniffed, else msgpack.

    Without a header, a payload starting with ``{`` (after white space) is
    JSON: every wire object is a map, and a msgpack map never starts with that
    byte (fixmap is 0x80-0x8f, map16/map32 0xde/0xdf). This lets tools that
    cannot set headers (``nats kv put``) write JSON entries.
    """
    if headers:
        value = headers.get(Header.ENCODING.value)
        if value is not None:
            return "json" if value.lower() == "json" else "msgpack"
    if data:
        head = data[:64].lstrip()
        if head[:1] == b"{":
            return "json"
    return "msgpack"


def headers_for(encoding: Encoding) -> dict[str, str]:
    """Headers announcing ``encoding`` (none for the msgpack default)."""
    return dict(_JSON_HEADERS) if encoding == "json" else {}


def is_storable_text(s: str) -> bool:
    """Whether PostgreSQL ``text`` and ``jsonb`` can hold ``s`` (no NUL, valid UTF-8)."""
    if "\x00" in s:
        return False
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_json_safe(value: Any, _depth: int = 0) -> bool:
    """Whether ``value`` can be stored as PostgreSQL ``jsonb`` unchanged (the worker stores
    any other entry value as msgpack, its jsonb column null; ``where`` reads it so)."""
    if _depth > 200:
        return False
    if value is None or isinstance(value, bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return is_storable_text(value)
    if isinstance(value, list):
        return all(is_json_safe(v, _depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_storable_text(k) and is_json_safe(v, _depth + 1)
                   for k, v in value.items())
    return False
