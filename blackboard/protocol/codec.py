"""Serialisation of wire objects: msgpack by default, JSON on request.

Pure functions, no IO. A message's encoding is told by the ``Bb-Encoding``
header (absent means msgpack), so a shell user with the ``nats`` CLI can write
JSON by adding ``-H Bb-Encoding:json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

import msgpack

from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.subjects import Header

__all__ = ["Encoding", "decode", "encode", "encoding_of", "headers_for"]

Encoding = Literal["msgpack", "json"]

_JSON_HEADERS = {Header.ENCODING.value: "json"}


def _default(obj: Any) -> Any:
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"cannot encode object of type {type(obj).__name__}")


def encode(obj: Any, encoding: Encoding = "msgpack") -> bytes:
    """Encode a wire object.

    Raises:
        InvalidPayloadError: the object holds something the encoding cannot carry
            (e.g. bytes in JSON, an arbitrary Python object).
    """
    try:
        if encoding == "msgpack":
            return msgpack.packb(obj, use_bin_type=True, default=_default)  # type: ignore[no-any-return]
        return json.dumps(obj, default=_default, separators=(",", ":"), ensure_ascii=False).encode()
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidPayloadError(f"cannot encode value as {encoding}: {exc}") from exc


def decode(data: bytes, encoding: Encoding = "msgpack") -> Any:
    """Decode a wire object.

    Raises:
        InvalidPayloadError: the bytes are not valid msgpack / JSON / UTF-8.
    """
    try:
        if encoding == "msgpack":
            return msgpack.unpackb(data, raw=False, strict_map_key=False)
        return json.loads(data)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        # UnicodeDecodeError and json.JSONDecodeError are ValueErrors.
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
