"""Fast paths of the hot wire records, beside their schemas (pure, no IO).

Every record has one schema (:mod:`blackboard.protocol.schemas`). A few are
encoded or decoded on hot paths (the SDK's ``remember`` and entry reads, the
worker's ingest of entries and memories), where pydantic's validation is a
large part of the cost. This module has the fast paths of those records:

- :func:`fast_entry` and :func:`fast_memory` take a decoded payload (a dict)
  and return the schema's own model, built without running pydantic, when
  the payload is certainly valid, else ``None`` ("not sure": ask the schema);
- :func:`decode_entry_envelope` and :func:`decode_memory` are the decoders:
  the fast path, else the schema (which decides and explains);
- :func:`entry_wire` and :func:`memory_wire` build the wire map of an
  :class:`EntryEnvelope` and a :class:`MemoryRecord` in the schema's field
  order, refusing what the schema refuses;
- :func:`canonical_entry` gives the canonical encoding (what a signature
  covers, :mod:`blackboard.protocol.canonical`) of an entry's wire map without
  building the schema: user maps sorted, integral floats as integers, NaN
  normalised; it answers ``None`` for anything unusual (a key that is not a
  ``str``, a subclass, a set, deep nesting), which the caller hands to
  :func:`~blackboard.protocol.canonical.canonical_bytes`.

Their limits (lengths, ranges, versions, kinds, defaults) are read from the
schemas' declared fields at import, never restated. ``tests/protocol/test_records.py``
proves on generated valid and invalid inputs that each fast path agrees with
its schema: same values, same rejections; and that :func:`canonical_entry`
gives the bytes of ``canonical_bytes`` whenever it answers.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TypeVar, get_args

from blackboard.protocol import codec
from blackboard.protocol.canonical import canonical_key_order, canonical_timestamp, extension_fields
from blackboard.protocol.errors import InvalidKeyError, InvalidPayloadError
from blackboard.protocol.limits import MAX_DEPTH, MAX_LABEL_CHARS, check_value, timestamp_ok
from blackboard.protocol.schemas import (
    EntryEnvelope,
    MemoryForget,
    MemoryRecord,
    WireModel,
    validate_wire,
)
from blackboard.protocol.subjects import validate_name

__all__ = [
    "canonical_entry",
    "decode_entry_envelope",
    "decode_memory",
    "entry_wire",
    "fast_entry",
    "fast_memory",
    "memory_wire",
    "metadata_order_of",
    "utc_now_iso",
]

M = TypeVar("M", bound=WireModel)

_MISSING: Final = object()


# -- limits, read from the schemas -------------------------------------------
def _constraint(model: type[WireModel], field: str, name: str) -> Any:
    """A constraint (``min_length``, ``max_length``, ``ge``, ``le``) declared on a field."""
    for item in model.model_fields[field].metadata:
        value = getattr(item, name, None)
        if value is not None:
            return value
    raise LookupError(f"{model.__name__}.{field} declares no {name}")


def _default(model: type[WireModel], field: str) -> Any:
    return model.model_fields[field].get_default(call_default_factory=True)


def _choices(model: type[WireModel], field: str) -> frozenset[Any]:
    """The values of a ``Literal`` field."""
    return frozenset(get_args(model.model_fields[field].annotation))


_ENTRY_VERSIONS = _choices(EntryEnvelope, "v")
_ENTRY_V: Final[int] = _default(EntryEnvelope, "v")
_ENTRY_CTYPE: Final[str] = _default(EntryEnvelope, "content_type")
_ENTRY_FIELDS = set(EntryEnvelope.model_fields)  # a set: pydantic updates a copy's fields set

_MEM_VERSIONS = _choices(MemoryRecord, "v")
_MEM_V: Final[int] = _default(MemoryRecord, "v")
_MEM_KINDS = _choices(MemoryRecord, "kind")
_MEM_KIND: Final[str] = _default(MemoryRecord, "kind")
_MEM_ID_MIN: Final[int] = _constraint(MemoryRecord, "id", "min_length")
_MEM_ID_MAX: Final[int] = _constraint(MemoryRecord, "id", "max_length")
_MEM_TEXT_MIN: Final[int] = _constraint(MemoryRecord, "text", "min_length")
_MEM_IMPORTANCE_MIN: Final[float] = _constraint(MemoryRecord, "importance", "ge")
_MEM_IMPORTANCE_MAX: Final[float] = _constraint(MemoryRecord, "importance", "le")
_MEM_IMPORTANCE: Final[float] = _default(MemoryRecord, "importance")
_MEM_SOURCE: Final[str | None] = _default(MemoryRecord, "source")
_MEM_READ_ONLY: Final[bool] = _default(MemoryRecord, "read_only")
_MEM_FIELDS = set(MemoryRecord.model_fields)
_MEM_V2: Final = max(_MEM_VERSIONS)
_MEM_EXTENSIONS = extension_fields(MemoryRecord)
_MEM_KEY_MIN: Final[int] = _constraint(MemoryRecord, "key", "min_length")
_MEM_KEY_MAX: Final[int] = _constraint(MemoryRecord, "key", "max_length")
#: The schema's pattern of a subject key (matched in full: Python's ``$`` also matches before a final newline).
_MEM_KEY_RE: Final = re.compile(_constraint(MemoryRecord, "key", "pattern"))
_MEM_CONFIDENCE_MIN: Final[float] = _constraint(MemoryRecord, "confidence", "ge")
_MEM_CONFIDENCE_MAX: Final[float] = _constraint(MemoryRecord, "confidence", "le")
_MEM_ORDER_MAX: Final[int] = _constraint(MemoryRecord, "metadata_order", "max_length")


# -- building a model from checked values --------------------------------------
def _trusted(model: type[M], values: dict[str, Any], fields_set: set[str]) -> M:
    """An instance of ``model`` holding ``values`` (every field, already checked).

    What ``model_construct`` does, without its per-field default and alias
    handling (which costs more than validating): the fast paths fill every
    field themselves. The tests compare the result with the schema's.
    """
    m = model.__new__(model)
    _setattr(m, "__dict__", values)
    _setattr(m, "__pydantic_fields_set__", fields_set)
    _setattr(m, "__pydantic_extra__", None)
    _setattr(m, "__pydantic_private__", None)
    return m


_setattr = object.__setattr__


# -- the checks the schemas' field types make ------------------------------------
def _timestamp(value: Any) -> datetime | None:
    """What ``Timestamp`` makes of an ISO 8601 string with a UTC offset within the
    protocol's limits, else None (not sure)."""
    if type(value) is not str:
        return None
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        return None
    return dt if dt.tzinfo is not None and timestamp_ok(dt) else None


def _label_list(value: Any) -> list[str] | None:
    """A ``list[Label]`` as the schema keeps it (exact ``str`` items of at most
    ``MAX_LABEL_CHARS``), else None."""
    if type(value) is not list:
        return None
    for v in value:
        if type(v) is not str or len(v) > MAX_LABEL_CHARS:
            return None
    return value


def _str_dict(value: Any) -> dict[str, Any] | None:
    """A ``dict[str, Any]`` as the schema keeps it (exact ``str`` keys), else None."""
    if type(value) is not dict:
        return None
    for k in value:
        if type(k) is not str:
            return None
    return value


#: Names already found valid (boards and agents repeat from record to record).
_NAMES: set[str] = set()
_NAMES_MAX = 4096


def _is_name(value: Any) -> bool:
    """Whether ``Name`` accepts ``value`` unchanged."""
    if type(value) is not str:
        return False
    if value in _NAMES:
        return True
    try:
        validate_name(value)
    except InvalidKeyError:
        return False
    if len(_NAMES) >= _NAMES_MAX:
        _NAMES.clear()
    _NAMES.add(value)
    return True


def _check_free(*values: Any) -> None:
    """Free-form fields within the protocol's limits, before the schema dumps them
    (pydantic's serializer stops at 255 levels with an error of its own).

    Raises:
        LimitExceededError: a value beyond a limit.
    """
    for value in values:
        check_value(dict(value) if isinstance(value, Mapping) and not isinstance(value, dict) else value,
                    MAX_DEPTH - 1)


# -- entries -----------------------------------------------------------------
def fast_entry(obj: Any) -> EntryEnvelope | None:
    """The :class:`EntryEnvelope` of a decoded payload, built without pydantic; None when not sure.

    Whenever this returns an envelope, ``validate_wire(EntryEnvelope, obj)``
    returns an equal one; shapes it does not vouch for (coercions, missing or
    odd fields) are left to the schema.
    """
    if type(obj) is not dict:
        return None
    value = obj.get("value", _MISSING)
    if value is _MISSING:
        return None
    v = obj.get("v", _ENTRY_V)
    ctype = obj.get("content_type", _ENTRY_CTYPE)
    author = obj.get("author")
    created = _timestamp(obj.get("created_at"))
    if (type(v) is not int or v not in _ENTRY_VERSIONS or type(ctype) is not str or type(author) is not str
            or len(author) > MAX_LABEL_CHARS or created is None):
        return None
    tags = obj.get("tags", _MISSING)
    tags = [] if tags is _MISSING else _label_list(tags)
    metadata = obj.get("metadata", _MISSING)
    metadata = {} if metadata is _MISSING else _str_dict(metadata)
    if tags is None or metadata is None:
        return None
    return _trusted(EntryEnvelope, {
        "v": v, "value": value, "content_type": ctype, "tags": tags, "metadata": metadata,
        "author": author, "created_at": created,
    }, _ENTRY_FIELDS.intersection(obj))


def decode_entry_envelope(obj: Any) -> EntryEnvelope:
    """A decoded payload as an :class:`EntryEnvelope`: the fast path, else the schema.

    Raises:
        InvalidPayloadError: the payload is not a valid envelope.
    """
    env = fast_entry(obj)
    return env if env is not None else validate_wire(EntryEnvelope, obj)


_iso_cache: list[Any] = [-1, ""]


def utc_now_iso() -> str:
    """``datetime.now(UTC).isoformat()``, several times cheaper (the second is cached)."""
    ns = time.time_ns()
    sec, micro = divmod(ns // 1000, 1_000_000)
    if sec != _iso_cache[0]:
        _iso_cache[0] = sec
        _iso_cache[1] = datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{_iso_cache[1]}.{micro:06d}+00:00"


def entry_wire(value: Any, *, author: str, content_type: str, tags: Sequence[str] = (),
               metadata: Mapping[str, Any] | None = None, created_at: datetime | None = None) -> dict[str, Any]:
    """The wire map of an :class:`EntryEnvelope`, its fields in the schema's order.

    The writer's fast path, like :func:`memory_wire`: arguments of the exact
    types the schema keeps are laid out here, anything else goes through the
    schema. ``created_at`` is a timezone-aware time (now when None), written
    in its canonical form (UTC, six fraction digits, ``+00:00``).

    Raises:
        InvalidPayloadError: an argument the schema refuses.
    """
    tag_list: Any = list(tags) if type(tags) is tuple or type(tags) is list else tags
    meta: Any = {} if metadata is None else metadata
    if created_at is None:
        stamp: str | None = utc_now_iso()
    elif type(created_at) is datetime and created_at.tzinfo is not None and timestamp_ok(created_at):
        stamp = canonical_timestamp(created_at)
    else:
        stamp = None
    if (stamp is not None and type(author) is str and len(author) <= MAX_LABEL_CHARS and type(content_type) is str
            and _label_list(tag_list) is not None and _str_dict(meta) is not None):
        return {
            "v": _ENTRY_V, "value": value, "content_type": content_type, "tags": tag_list, "metadata": dict(meta),
            "author": author, "created_at": stamp,
        }
    _check_free(value, meta)
    env = validate_wire(EntryEnvelope, {
        "v": _ENTRY_V, "value": value, "content_type": content_type, "tags": tag_list, "metadata": meta,
        "author": author, "created_at": stamp if created_at is None else created_at,
    })
    wire = env.model_dump()
    wire["value"] = value  # the value as given: the schema keeps any value
    wire["created_at"] = stamp if created_at is None else canonical_timestamp(env.created_at)
    return wire


# -- the canonical encoding of an entry ------------------------------------------
class _Unusual(Exception):
    """A value the fast canonical path leaves to :mod:`blackboard.protocol.canonical`."""


_UNUSUAL = _Unusual()
#: Floats with an integral value up to this magnitude are integers in the canonical encoding.
_MAX_EXACT: Final = 2**53
#: Nesting the fast path walks; deeper values take the reference encoder (which bounds them).
_FAST_DEPTH: Final = 64
#: The one NaN of the canonical encoding (``cb 7f f8 00 ...``), whatever NaN was given.
_NAN: Final = math.nan


def _key_order(key: str) -> tuple[int, str]:
    """Where a ``str`` key sorts in a canonical map: msgpack writes a string's length before
    its bytes (in ever longer headers), so the order of the encoded keys is by UTF-8 length,
    then by the UTF-8 bytes, which is the order of the code points.

    Raises:
        UnicodeEncodeError: a lone surrogate (no canonical encoding).
    """
    return (len(key) if key.isascii() else len(key.encode()), key)


def _canon(value: Any, depth: int) -> Any:
    """``value`` as the data msgpack packs into its canonical encoding (the same object when
    it already is: no copy of a value that needs no change).

    Raises:
        _Unusual: a type, key or depth the fast path does not vouch for.
    """
    t = type(value)
    if t is str or t is int or t is bool or value is None or t is bytes:
        return value
    if t is float:
        if value != value:
            return _NAN
        if value.is_integer() and -_MAX_EXACT <= value <= _MAX_EXACT:
            return int(value)
        return value
    if depth >= _FAST_DEPTH:
        raise _UNUSUAL
    if t is list or t is tuple:
        out: list[Any] | None = None
        for i, item in enumerate(value):
            ti = type(item)
            if ti is str or ti is int or ti is bool or item is None:  # a leaf as it is (the common case)
                continue
            c = _canon(item, depth + 1)
            if c is not item:
                if out is None:
                    out = list(value)
                out[i] = c
        return value if out is None else out
    if t is dict:
        if not value:
            return value
        changed: dict[str, Any] | None = None
        for k, v in value.items():
            if type(k) is not str:
                raise _UNUSUAL
            tv = type(v)
            if tv is str or tv is int or tv is bool or v is None:
                continue
            c = _canon(v, depth + 1)
            if c is not v:
                if changed is None:
                    changed = {}
                changed[k] = c
        try:
            keys = sorted(value, key=_key_order)
        except UnicodeEncodeError:
            raise _UNUSUAL from None
        if changed is None:
            for a, b in zip(keys, value, strict=True):
                if a is not b:
                    break
            else:
                return value  # in canonical order already
            return {k: value[k] for k in keys}
        return {k: changed[k] if k in changed else value[k] for k in keys}
    if t is datetime:
        return value.isoformat()  # what the codec writes for a datetime in a user value
    raise _UNUSUAL


def canonical_entry(wire: Mapping[str, Any]) -> bytes | None:
    """The canonical encoding of an entry's wire map as :func:`entry_wire` builds it (every
    field in the schema's order, the timestamp canonical), or ``None`` when a user value holds
    something this fast path does not vouch for (then ask
    :func:`~blackboard.protocol.canonical.canonical_bytes` of the decoded record).

    Equal to ``canonical_bytes(validate_wire(EntryEnvelope, decoded payload))`` whenever it
    answers (``tests/protocol/test_records.py``).

    Raises:
        InvalidPayloadError: the codec refuses a value (an integer beyond 64 bits, a lone
            surrogate); ``LimitExceededError`` beyond a protocol limit.
    """
    value, meta = wire["value"], wire["metadata"]
    try:
        cvalue = _canon(value, 1)
        cmeta = _canon(meta, 1)
    except _Unusual:
        return None
    if cvalue is not value or cmeta is not meta:
        wire = {**wire, "value": cvalue, "metadata": cmeta}
    return codec.encode(wire)


# -- memories ----------------------------------------------------------------
def fast_memory(obj: Any) -> MemoryRecord | None:
    """The :class:`MemoryRecord` of a decoded payload, built without pydantic; None when not sure.

    Whenever this returns a record, ``validate_wire(MemoryRecord, obj)``
    returns an equal one. A payload with an ``op`` field (a forget) is left to
    :func:`decode_memory`.
    """
    if type(obj) is not dict or "op" in obj:
        return None
    get = obj.get
    v = get("v", _MEM_V)
    mid = get("id")
    text = get("text")
    kind = get("kind", _MEM_KIND)
    if (type(v) is not int or v not in _MEM_VERSIONS
            or type(mid) is not str or not _MEM_ID_MIN <= len(mid) <= _MEM_ID_MAX
            or type(text) is not str or len(text) < _MEM_TEXT_MIN
            or type(kind) is not str or kind not in _MEM_KINDS):
        return None
    importance = get("importance", _MEM_IMPORTANCE)
    source = get("source", _MEM_SOURCE)
    read_only = get("read_only", _MEM_READ_ONLY)
    t = type(importance)
    if ((t is not float and t is not int) or not _MEM_IMPORTANCE_MIN <= importance <= _MEM_IMPORTANCE_MAX
            or (source is not None and type(source) is not str) or type(read_only) is not bool):
        return None
    created = _timestamp(get("created_at"))
    tags = get("tags", _MISSING)
    tags = [] if tags is _MISSING else _label_list(tags)
    metadata = get("metadata", _MISSING)
    metadata = {} if metadata is _MISSING else _str_dict(metadata)
    board = get("board")
    agent = get("agent")
    if created is None or tags is None or metadata is None or not _is_name(board) or not _is_name(agent):
        return None
    key = get("key")
    occurred_raw = get("occurred_at")
    confidence = get("confidence")
    order = get("metadata_order")
    if key is None and occurred_raw is None and confidence is None and order is None:
        occurred = None
        if get("provenance") is not None:
            return None  # provenance (the worker's derived memories, rare): the schema reads it
    else:
        occurred = None if occurred_raw is None else _timestamp(occurred_raw)
        if (v != _MEM_V2 or get("provenance") is not None
                or (key is not None and not _subject_key_ok(key))
                or (occurred_raw is not None and occurred is None)
                or (confidence is not None and not _unit_float(confidence, _MEM_CONFIDENCE_MIN, _MEM_CONFIDENCE_MAX))
                or (order is not None and not _order_ok(order, metadata))):
            return None
        if confidence is not None:
            confidence = float(confidence)
    return _trusted(MemoryRecord, {
        "v": v, "id": mid, "board": board, "agent": agent, "kind": kind, "text": text, "tags": tags,
        "metadata": metadata, "importance": float(importance), "source": source, "read_only": read_only,
        "created_at": created, "key": key, "occurred_at": occurred, "confidence": confidence, "provenance": None,
        "metadata_order": order,
    }, _MEM_FIELDS.intersection(obj))


def _order_ok(order: Any, metadata: Mapping[str, Any]) -> bool:
    """Whether the schema keeps ``order`` unchanged as the ``metadata_order`` of ``metadata``."""
    return (type(order) is list and len(order) == len(metadata) <= _MEM_ORDER_MAX
            and all(type(k) is str for k in order) and set(order) == metadata.keys())


def metadata_order_of(metadata: Mapping[str, Any] | None) -> list[str] | None:
    """The writer's order of ``metadata``'s keys when the canonical encoding would change it
    (two keys or more, all text, not already in the canonical order), else None: what a
    writer puts in ``metadata_order`` so that the worker embeds the metadata lines in it."""
    if not metadata or len(metadata) < 2 or len(metadata) > _MEM_ORDER_MAX:
        return None
    keys = list(metadata)
    if not all(type(k) is str for k in keys):
        return None
    try:
        return None if canonical_key_order(keys) == keys else keys
    except InvalidPayloadError:
        return None  # a key with no canonical encoding: the schema refuses the record anyway


def _subject_key_ok(value: Any) -> bool:
    """Whether the schema keeps ``value`` unchanged as a subject key."""
    return (type(value) is str and _MEM_KEY_MIN <= len(value) <= _MEM_KEY_MAX
            and _MEM_KEY_RE.fullmatch(value) is not None)


def _unit_float(value: Any, low: float, high: float) -> bool:
    """Whether ``value`` is an exact ``float`` or ``int`` (not bool) within ``[low, high]``."""
    t = type(value)
    return (t is float or t is int) and low <= value <= high


def decode_memory(obj: Any) -> MemoryRecord | MemoryForget:
    """A decoded payload of ``bb.mem.<board>.<agent>``: a forget (``op: forget``) or a record.

    The fast path, else the schema.

    Raises:
        InvalidPayloadError: neither a valid forget nor a valid record.
    """
    rec = fast_memory(obj)
    if rec is not None:
        return rec
    if isinstance(obj, dict) and obj.get("op") == "forget":
        return validate_wire(MemoryForget, obj)
    return validate_wire(MemoryRecord, obj)


def memory_wire(*, id: str, board: str, agent: str, text: str, created_at: datetime,
                kind: str = _MEM_KIND, tags: Sequence[str] = (), metadata: Mapping[str, Any] | None = None,
                importance: float = _MEM_IMPORTANCE, source: str | None = _MEM_SOURCE,
                read_only: bool = _MEM_READ_ONLY, key: str | None = None, occurred_at: datetime | None = None,
                confidence: float | None = None, metadata_order: Sequence[str] | None = None) -> dict[str, Any]:
    """The wire map of a :class:`MemoryRecord`, its fields in the schema's order.

    The writer's fast path: arguments of the exact types the schema keeps are
    checked and laid out here; anything else goes through the schema, which
    coerces or refuses it. Either way ``validate_wire(MemoryRecord, map,
    strict=True)`` holds what the schema makes of the arguments.
    ``created_at`` and ``occurred_at`` are timezone-aware times, written in ISO 8601.
    A record with a subject ``key``, an ``occurred_at`` or a ``confidence`` is
    version 2; the version-2 fields left null are left out of the map (as from
    the canonical encoding), so a version-1 record is what it always was.

    Raises:
        InvalidPayloadError: an argument the schema refuses.
    """
    tag_list: Any = list(tags) if type(tags) is tuple or type(tags) is list else tags
    meta: Any = {} if metadata is None else metadata
    order: Any = list(metadata_order) if type(metadata_order) is tuple or type(metadata_order) is list \
        else metadata_order
    v2 = key is not None or occurred_at is not None or confidence is not None or order is not None
    t = type(importance)
    if ((not v2 or ((key is None or _subject_key_ok(key))
                    and (order is None or (type(meta) is dict and _order_ok(order, meta)))
                    and (occurred_at is None or (type(occurred_at) is datetime and occurred_at.tzinfo is not None
                                                 and timestamp_ok(occurred_at)))
                    and (confidence is None or _unit_float(confidence, _MEM_CONFIDENCE_MIN, _MEM_CONFIDENCE_MAX))))
            and type(id) is str and _MEM_ID_MIN <= len(id) <= _MEM_ID_MAX
            and type(text) is str and len(text) >= _MEM_TEXT_MIN
            and type(kind) is str and kind in _MEM_KINDS
            and (t is float or t is int) and _MEM_IMPORTANCE_MIN <= importance <= _MEM_IMPORTANCE_MAX
            and (source is None or type(source) is str) and type(read_only) is bool
            and _label_list(tag_list) is not None and _str_dict(meta) is not None
            and type(created_at) is datetime and created_at.tzinfo is not None and timestamp_ok(created_at)
            and _is_name(board) and _is_name(agent)):
        wire = {
            "v": _MEM_V2 if v2 else _MEM_V, "id": id, "board": board, "agent": agent, "kind": kind, "text": text,
            "tags": tag_list, "metadata": dict(meta), "importance": float(importance), "source": source,
            "read_only": read_only, "created_at": created_at.isoformat(),
        }
        if v2:
            if key is not None:
                wire["key"] = key
            if occurred_at is not None:
                wire["occurred_at"] = occurred_at.isoformat()
            if confidence is not None:
                wire["confidence"] = float(confidence)
            if order is not None:
                wire["metadata_order"] = order
        return wire
    _check_free(meta)
    args: dict[str, Any] = {
        "v": _MEM_V2 if v2 else _MEM_V, "id": id, "board": board, "agent": agent, "kind": kind, "text": text,
        "tags": tag_list, "metadata": meta, "importance": importance, "source": source, "read_only": read_only,
        "created_at": created_at, "key": key, "occurred_at": occurred_at, "confidence": confidence,
        "metadata_order": order,
    }
    rec = validate_wire(MemoryRecord, args)
    wire = rec.model_dump(exclude={f for f in _MEM_EXTENSIONS if getattr(rec, f) is None})
    wire["created_at"] = rec.created_at.isoformat()
    if rec.occurred_at is not None:
        wire["occurred_at"] = rec.occurred_at.isoformat()
    return wire
