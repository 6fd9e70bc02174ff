"""The protocol's limits: what a payload may hold (``docs/protocol.md``, "Limits").

Pure, no IO. Every decoder and encoder of :mod:`.codec` and every timestamp
of :mod:`.schemas` checks these, so that a reader meets nothing a writer could
not have sent: a payload too deep for a recursive reader, an integer no
msgpack reader can hold, or a time that PostgreSQL stores but Python (or Java,
or JavaScript) cannot read back. They are protocol constants, not settings:
a writer (in any language) and every reader must agree on them without
sharing a configuration. The size of a whole message is the deployment's
(``board.max_value_size``, ``worker.max_message_bytes``, nats-server's
``max_payload``) and bounds the sizes below it.

Checks that cost a walk over a decoded value are skipped when the bytes
alone prove the value is within the limits (see :func:`may_exceed_msgpack`
and :func:`may_exceed_json`), so the hot paths pay a byte count, not a walk.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

from blackboard.protocol.errors import LimitExceededError

__all__ = [
    "MAX_DEPTH",
    "MAX_ID_CHARS",
    "MAX_INT",
    "MAX_ITEMS",
    "MAX_LABEL_CHARS",
    "MAX_REPLY_DEPTH",
    "MAX_STRING_BYTES",
    "MAX_TIMESTAMP",
    "MAX_UTC_OFFSET",
    "MIN_INT",
    "MIN_TIMESTAMP",
    "check_timestamp",
    "check_value",
    "depth_within",
    "may_exceed_json",
    "may_exceed_msgpack",
    "timestamp_ok",
]

#: Containers (maps and arrays) nested in one record, its top-level map
#: included: an entry's ``value`` may nest ``MAX_DEPTH - 1`` levels, a
#: proposal's candidate ``MAX_DEPTH - 2``. Far below what a recursive reader
#: can take (Python's default recursion limit is 1,000 frames, pydantic's
#: serializer stops at 255 levels, orjson at 1,024) and far above what a
#: record needs.
MAX_DEPTH: Final = 64
#: Nesting a server's reply may reach: a reply carries stored records one map
#: and one array below its top (a search hit, a history revision), so it is
#: allowed a few levels more than the records it carries.
MAX_REPLY_DEPTH: Final = MAX_DEPTH + 8
#: Bytes of one string (UTF-8) or bytes value. Above any message nats-server
#: can carry (its ``max_payload`` is at most 64 MiB): the message's size is the
#: binding limit; this one bounds what a decoder allocates for a length prefix.
MAX_STRING_BYTES: Final = 64 * 1024 * 1024
#: Elements of one array, or pairs of one map.
MAX_ITEMS: Final = 1_000_000
#: Characters of a record's id (a memory's, a message's, a ballot's), and of
#: each id a forget names. Ids are indexed by PostgreSQL.
MAX_ID_CHARS: Final = 128
#: Characters of every other short text PostgreSQL indexes: an entry's author,
#: a tag (entries and memories), a message's type, correlation id, reply
#: subject and topic. A btree index row holds at most 2,704 bytes (a GIN key
#: about as much): 256 characters are at most 1,024 bytes of UTF-8, so an index
#: row of them, its other columns included, always fits; one unbounded string
#: made PostgreSQL refuse its row ("index row requires 11464 bytes").
MAX_LABEL_CHARS: Final = 256
#: Integers are 64-bit: what msgpack carries (int64 and uint64).
MIN_INT: Final = -(2**63)
MAX_INT: Final = 2**64 - 1
#: Timestamps, in UTC once their offset is applied: from the Unix epoch to
#: the last instant with a four-digit year (RFC 3339's range; Python's
#: ``datetime`` and PostgreSQL's ``timestamptz`` read anything in it back).
MIN_TIMESTAMP: Final = datetime(1970, 1, 1, tzinfo=UTC)
MAX_TIMESTAMP: Final = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
#: A timestamp's UTC offset: whole minutes, at most 18 hours either way (what
#: Java's ``ZoneOffset`` holds; the zones in use span -12:00 to +14:00).
MAX_UTC_OFFSET: Final = timedelta(hours=18)

_MINUTE = timedelta(minutes=1)
_ZERO = timedelta(0)
_MIN_NAIVE = MIN_TIMESTAMP.replace(tzinfo=None)
_MAX_NAIVE = MAX_TIMESTAMP.replace(tzinfo=None)


# -- timestamps ----------------------------------------------------------------
def _timestamp_problem(dt: datetime) -> tuple[str, str] | None:
    """The limit ``dt`` breaks and how, or None."""
    offset = dt.utcoffset()
    if offset is None:
        return "MAX_UTC_OFFSET", "has no UTC offset"
    if offset:
        if abs(offset) > MAX_UTC_OFFSET:
            return "MAX_UTC_OFFSET", f"has the UTC offset {_offset(offset)}, beyond ±18:00"
        if offset % _MINUTE:
            return "MAX_UTC_OFFSET", f"has the UTC offset {_offset(offset)}, not whole minutes"
    year = dt.year
    if 1970 < year < 9999:  # the common case: no arithmetic needed
        return None
    # naive - offset is the UTC time; compared without computing it, which could
    # leave datetime's range (9999-12-31T23:59-23:59 is in year 10000 in UTC).
    naive, off = dt.replace(tzinfo=None), offset or _ZERO
    if year <= 1970 and naive < _MIN_NAIVE + off:
        return "MIN_TIMESTAMP", f"is before {MIN_TIMESTAMP.isoformat()}"
    if year >= 9999 and off < _ZERO and naive > _MAX_NAIVE + off:
        return "MAX_TIMESTAMP", f"is after {MAX_TIMESTAMP.isoformat()} (in UTC)"
    return None


def timestamp_ok(dt: datetime) -> bool:
    """Whether ``dt`` is a timestamp the protocol carries (see :func:`check_timestamp`)."""
    return _timestamp_problem(dt) is None


def check_timestamp(dt: datetime) -> datetime:
    """``dt`` when it is timezone-aware, its offset whole minutes within
    :data:`MAX_UTC_OFFSET`, and it lies between :data:`MIN_TIMESTAMP` and
    :data:`MAX_TIMESTAMP` once in UTC.

    Raises:
        LimitExceededError: it does not (``limit`` names the bound).
    """
    problem = _timestamp_problem(dt)
    if problem is None:
        return dt
    limit, how = problem
    raise LimitExceededError(limit, f"timestamp {dt.isoformat()} {how}")


def _offset(offset: timedelta) -> str:
    sign = "-" if offset < _ZERO else "+"
    seconds = int(abs(offset).total_seconds())
    text = f"{sign}{seconds // 3600:02d}:{seconds // 60 % 60:02d}"
    return text + f":{seconds % 60:02d}" if seconds % 60 else text


# -- values ------------------------------------------------------------------------
#: The bytes that start a msgpack map or array: fixmap, fixarray, array 16/32, map 16/32.
_CONTAINER_BYTES = bytes([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])
_OTHER_BYTES = bytes(b for b in range(256) if b not in _CONTAINER_BYTES)
#: Every digit mapped to ``0``, to find a run long enough to be an integer beyond
#: 64 bits (2**63 has 19 digits) with one ``find`` (several times faster than a regex).
_DIGITS_AS_ZERO = bytes.maketrans(b"0123456789", b"0000000000")
_LONG_DIGITS = b"0" * 19


def may_exceed_msgpack(data: bytes, max_depth: int) -> bool:
    """False when msgpack ``data`` certainly nests at most ``max_depth`` containers.

    Every container has its own header byte, so a payload with at most
    ``max_depth`` bytes that could start one cannot nest deeper. (Lengths and
    integers are bounded by the decoder's options and by msgpack itself.)
    """
    return len(data) > max_depth and len(data.translate(None, _OTHER_BYTES)) > max_depth


def may_exceed_json(data: bytes, max_depth: int) -> bool:
    """False when JSON ``data`` certainly holds nothing beyond the limits: at most
    ``max_depth`` brackets, no digit run as long as a 64-bit integer's, too
    short for an oversized string or collection."""
    return ((data.count(b"[") + data.count(b"{") > max_depth)
            or data.translate(_DIGITS_AS_ZERO).find(_LONG_DIGITS) >= 0
            or len(data) > min(MAX_STRING_BYTES, 2 * MAX_ITEMS))


def depth_within(value: Any, max_depth: int) -> bool:
    """Whether a decoded value (exact ``list`` and ``dict`` containers, as msgpack
    and JSON decoders build them) nests at most ``max_depth`` containers.

    Iterative, one level at a time, only containers carried to the next level:
    measured faster here than a stack of (node, depth) pairs or C iterator
    pipelines (``map``/``compress``) on the shapes records have.
    """
    level = [value] if type(value) is dict or type(value) is list else []
    depth = 0
    while level:
        depth += 1
        if depth > max_depth:
            return False
        deeper: list[Any] = []
        add = deeper.append
        for node in level:
            for v in node.values() if type(node) is dict else node:
                tv = type(v)
                if tv is dict or tv is list:
                    add(v)
        level = deeper
    return True


def check_value(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """Check a decoded (or to-be-encoded) value against the limits, without recursion.

    The value itself counts as one level when it is a container. Integers
    must fit 64 bits; strings and bytes :data:`MAX_STRING_BYTES` (strings
    counted in characters, a lower bound of their UTF-8 size that is exact for
    the ASCII text a size attack uses); arrays and maps :data:`MAX_ITEMS`.

    Raises:
        LimitExceededError: the first limit found exceeded.
    """
    stack: list[tuple[Any, int]] = []
    _leaf(value, stack, 1)
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise LimitExceededError("MAX_DEPTH", f"value nested deeper than {max_depth} levels")
        if len(node) > MAX_ITEMS:
            raise LimitExceededError("MAX_ITEMS", f"a collection of {len(node)} items, over {MAX_ITEMS}")
        if isinstance(node, dict):
            for k, v in node.items():
                _leaf(k, stack, depth + 1)
                _leaf(v, stack, depth + 1)
        else:
            for v in node:
                _leaf(v, stack, depth + 1)


def _leaf(v: Any, stack: list[tuple[Any, int]], depth: int) -> None:
    t = type(v)
    if t is str or t is bytes:
        if len(v) > MAX_STRING_BYTES:
            raise LimitExceededError("MAX_STRING_BYTES", f"a string of {len(v)} bytes, over {MAX_STRING_BYTES}")
    elif t is int:
        if not MIN_INT <= v <= MAX_INT:
            raise LimitExceededError("MAX_INT", f"integer {v} does not fit 64 bits")
    elif t is list or t is dict:
        stack.append((v, depth))
    elif t is float or t is bool or v is None:
        return
    elif isinstance(v, (list, tuple, dict, set, frozenset)):  # what an encoder accepts besides the exact types
        stack.append((v, depth))
    elif isinstance(v, int) and not isinstance(v, bool):
        _leaf(int(v), stack, depth)
    elif isinstance(v, (str, bytes, bytearray, memoryview)):
        size = memoryview(v).nbytes if isinstance(v, memoryview) else len(v)
        if size > MAX_STRING_BYTES:
            raise LimitExceededError("MAX_STRING_BYTES", f"a string of {size} bytes, over {MAX_STRING_BYTES}")
