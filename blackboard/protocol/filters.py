"""Comparison filters (``where``): their parsed form, the parser and the evaluator (pure, no IO).

A ``where`` maps a dotted path to a condition, ANDed::

    {"metadata.confidence": {"$gt": 0.8}, "value.status": {"$in": ["open", "blocked"]},
     "metadata.reviewed": {"$exists": False}, "metadata.owner": "ana"}

Paths: the first segment is the root, ``metadata`` (memories and entries) or
``value`` (entries only: the entry's JSON value); the rest walks down the JSON
document, one segment a level (at most :data:`MAX_PATH_DEPTH` below the root;
a bare root names the whole document). Dots cannot be escaped: a key holding a
dot cannot be named. A segment that is an integer indexes an array (0-based;
negative from the end), as PostgreSQL's ``#>`` does.

Conditions: a JSON value (equality), or an object of operators, ANDed:
``$eq``/``$ne`` (any JSON value), ``$gt``/``$gte``/``$lt``/``$lte`` (a number
or a string), ``$in``/``$nin`` (a list of at most :data:`MAX_IN` JSON
scalars), ``$exists`` (a boolean). An object without ``$`` keys is a value to
compare with (``{"$eq": {...}}`` compares with an object whose keys start with
``$``).

Semantics (the SQL of ``blackboard.db.search_sql`` and :func:`matches` agree):
ordered comparisons hold only when the stored value has the operand's JSON type
(numbers by value, strings by code point); booleans are not numbers; ``1`` equals
``1.0``; ``$eq`` and ``$in`` need the path present; ``$ne`` and ``$nin`` also
hold when it is missing; ``$exists: true`` holds for a present JSON null. An
entry value JSON cannot hold (bytes, say) reads as JSON null.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, Literal, cast, get_args

from blackboard.protocol.codec import is_json_safe, is_storable_text
from blackboard.protocol.errors import InvalidPayloadError

__all__ = [
    "EMPTY_WHERE",
    "MAX_IN",
    "MAX_PATHS",
    "MAX_PATH_CHARS",
    "MAX_PATH_DEPTH",
    "OPERATORS",
    "Condition",
    "Operator",
    "PathFilter",
    "Root",
    "Where",
    "matches",
    "parse_where",
]

Root = Literal["metadata", "value"]
Operator = Literal["$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists"]
OPERATORS: Final[tuple[str, ...]] = get_args(Operator)
_ORDERED: Final = frozenset({"$gt", "$gte", "$lt", "$lte"})
#: Most paths in one ``where``.
MAX_PATHS: Final = 32
#: Most characters of one path (root included).
MAX_PATH_CHARS: Final = 256
#: Most segments of a path below its root.
MAX_PATH_DEPTH: Final = 8
#: Most scalars of one ``$in`` / ``$nin`` list.
MAX_IN: Final = 100
#: Deepest an ``$eq`` / ``$ne`` operand may nest (containers).
_MAX_OPERAND_DEPTH: Final = 32
_ROOTS: Final = frozenset(get_args(Root))


@dataclass(frozen=True, slots=True)
class Condition:
    """One operator and its operand: ``$in``/``$nin`` a tuple of scalars, ``$exists`` a bool,
    an ordered comparison an int, float or str, ``$eq``/``$ne`` any JSON value."""

    op: Operator
    operand: Any


@dataclass(frozen=True, slots=True)
class PathFilter:
    """The conditions (ANDed) on one path: ``root`` and the ``keys`` below it."""

    path: str
    root: Root
    keys: tuple[str, ...]
    conditions: tuple[Condition, ...]


@dataclass(frozen=True, slots=True)
class Where:
    """A parsed ``where`` (:func:`parse_where`): its path filters, ANDed (none: everything
    matches). False when empty."""

    paths: tuple[PathFilter, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.paths)

    @property
    def reads_value(self) -> bool:
        """Whether a path reads the entry's value (``value.``: entries only)."""
        return any(p.root == "value" for p in self.paths)

    def to_json(self) -> dict[str, Any]:
        """The wire form (every condition as an operator object; :func:`parse_where` of it
        gives this value back)."""
        out: dict[str, Any] = {}
        for p in self.paths:
            out[p.path] = {c.op: list(c.operand) if c.op in ("$in", "$nin") else c.operand
                           for c in p.conditions}
        return out


#: The ``where`` that filters nothing.
EMPTY_WHERE: Final = Where()


def parse_where(obj: Any) -> Where:
    """The parsed form of a ``where`` (a mapping of paths to conditions; None or a
    :class:`Where` as they are).

    Raises:
        InvalidPayloadError: not a mapping, more than :data:`MAX_PATHS` paths, a bad path
            (root, empty segment, too long or deep), an unknown operator, or an operand of the
            wrong type; the message names the path and the operator.
    """
    if obj is None:
        return EMPTY_WHERE
    if isinstance(obj, Where):
        return obj
    if not isinstance(obj, Mapping):
        raise InvalidPayloadError(f"where must be an object of path: condition, not {type(obj).__name__}")
    if len(obj) > MAX_PATHS:
        raise InvalidPayloadError(f"where has {len(obj)} paths, at most {MAX_PATHS}")
    if not obj:
        return EMPTY_WHERE
    return Where(tuple(_parse_path(path, cond) for path, cond in obj.items()))


def _parse_path(path: Any, cond: Any) -> PathFilter:
    if not isinstance(path, str):
        raise InvalidPayloadError(f"where: a path must be a string, not {type(path).__name__}")
    shown = path if len(path) <= 64 else path[:61] + "..."
    if len(path) > MAX_PATH_CHARS:
        raise InvalidPayloadError(f"where: path {shown!r} is longer than {MAX_PATH_CHARS} characters")
    root, *keys = path.split(".")
    if root not in _ROOTS:
        raise InvalidPayloadError(f"where: path {shown!r} must start with 'metadata.' or 'value.'")
    if len(keys) > MAX_PATH_DEPTH:
        raise InvalidPayloadError(f"where: path {shown!r} is more than {MAX_PATH_DEPTH} levels deep")
    if any(not k for k in keys):
        raise InvalidPayloadError(f"where: path {shown!r} has an empty segment")
    if not is_storable_text(path):
        raise InvalidPayloadError(f"where: path {shown!r} holds NUL or text that is not UTF-8")
    if isinstance(cond, Mapping) and any(isinstance(k, str) and k.startswith("$") for k in cond):
        if not all(isinstance(k, str) and k.startswith("$") for k in cond):
            raise InvalidPayloadError(f"where: the condition on {shown!r} mixes operators and fields "
                                      "(compare with an object through $eq)")
        conditions = tuple(_parse_condition(shown, op, operand) for op, operand in cond.items())
    else:
        conditions = (_parse_condition(shown, "$eq", cond),)
    return PathFilter(path, cast(Root, root), tuple(keys), conditions)


def _parse_condition(path: str, op: str, operand: Any) -> Condition:
    if op not in OPERATORS:
        raise InvalidPayloadError(f"where: unknown operator {op[:32]!r} on {path!r} "
                                  f"(known: {', '.join(OPERATORS)})")
    if op in _ORDERED:
        if isinstance(operand, bool) or not isinstance(operand, int | float | str):
            raise InvalidPayloadError(f"where: {op} on {path!r} takes a number or a string, "
                                      f"not {_type_name(operand)}")
        _check_json(path, op, operand, 0)
        return Condition(cast(Operator, op), operand)
    if op == "$exists":
        if not isinstance(operand, bool):
            raise InvalidPayloadError(f"where: $exists on {path!r} takes true or false, not {_type_name(operand)}")
        return Condition("$exists", operand)
    if op in ("$in", "$nin"):
        if not isinstance(operand, list | tuple):
            raise InvalidPayloadError(f"where: {op} on {path!r} takes a list, not {_type_name(operand)}")
        if len(operand) > MAX_IN:
            raise InvalidPayloadError(f"where: {op} on {path!r} has {len(operand)} values, at most {MAX_IN}")
        for item in operand:
            if isinstance(item, list | tuple | Mapping):
                raise InvalidPayloadError(f"where: {op} on {path!r} takes JSON scalars, not {_type_name(item)}")
            _check_json(path, op, item, 0)
        return Condition(cast(Operator, op), tuple(operand))
    _check_json(path, op, operand, 0)
    return Condition(cast(Operator, op), operand)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _check_json(path: str, op: str, value: Any, depth: int) -> None:
    """Refuse an operand that is not JSON PostgreSQL can store (bytes, NaN, NUL, deep)."""
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidPayloadError(f"where: {op} on {path!r} takes finite numbers, not {value!r}")
        return
    if isinstance(value, str):
        if not is_storable_text(value):
            raise InvalidPayloadError(f"where: {op} on {path!r} takes text without NUL, in UTF-8")
        return
    if depth >= _MAX_OPERAND_DEPTH:
        raise InvalidPayloadError(f"where: the operand of {op} on {path!r} nests more than "
                                  f"{_MAX_OPERAND_DEPTH} levels")
    if isinstance(value, list | tuple):
        for item in value:
            _check_json(path, op, item, depth + 1)
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str) or not is_storable_text(k):
                raise InvalidPayloadError(f"where: the operand of {op} on {path!r} has a key that is not text")
            _check_json(path, op, v, depth + 1)
        return
    raise InvalidPayloadError(f"where: {op} on {path!r} takes JSON values, not {_type_name(value)}")


_MISSING: Final = object()


def matches(where: Where | Mapping[str, Any], *, metadata: Mapping[str, Any] | None, value: Any = None) -> bool:
    """Whether an item with ``metadata`` (and, for an entry, ``value``) passes ``where``: the
    evaluator of the semantics the search's SQL applies (see the module's docstring).

    Args:
        where: a parsed :class:`Where`, or a mapping to parse.
        metadata: the item's metadata (None: an empty object).
        value: the entry's value (decoded); a value JSON cannot hold reads as null.

    Raises:
        InvalidPayloadError: ``where`` is a mapping :func:`parse_where` refuses.
    """
    w = where if isinstance(where, Where) else parse_where(where)
    if not w.paths:
        return True
    meta: Any = {} if metadata is None else metadata
    doc_value: Any = _MISSING
    for p in w.paths:
        if p.root == "metadata":
            node = _walk(meta, p.keys)
        else:
            if doc_value is _MISSING:
                doc_value = value if is_json_safe(value) else None
            node = _walk(doc_value, p.keys)
        for c in p.conditions:
            if not _holds(c, node):
                return False
    return True


def _walk(node: Any, keys: tuple[str, ...]) -> Any:
    for k in keys:
        if isinstance(node, Mapping):
            node = node.get(k, _MISSING)
            if node is _MISSING:
                return _MISSING
        elif isinstance(node, list | tuple):
            i = _array_index(k, len(node))
            if i is None:
                return _MISSING
            node = node[i]
        else:
            return _MISSING
    return node


_INT_RE: Final = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1


def _array_index(key: str, n: int) -> int | None:
    """The element of an ``n``-array ``key`` names as PostgreSQL's ``#>`` reads it (``strtol``:
    leading blanks, a sign, digits; an int32; negative from the end), or None."""
    m = _INT_RE.fullmatch(key)
    if m is None:
        return None
    i = int(m.group(1))
    if i < _INT_MIN or i > _INT_MAX:
        return None
    if i < 0:
        if i == _INT_MIN or -i > n:
            return None
        i += n
    return i if i < n else None


def _holds(c: Condition, node: Any) -> bool:
    op = c.op
    if op == "$eq":
        return node is not _MISSING and _json_eq(node, c.operand)
    if op == "$ne":
        return node is _MISSING or not _json_eq(node, c.operand)
    if op == "$in":
        return node is not _MISSING and any(_json_eq(node, x) for x in c.operand)
    if op == "$nin":
        return node is _MISSING or not any(_json_eq(node, x) for x in c.operand)
    if op == "$exists":
        return (node is not _MISSING) is c.operand
    operand = c.operand
    if isinstance(operand, str):
        if not isinstance(node, str):
            return False
    elif isinstance(node, bool) or not isinstance(node, int | float):
        return False
    else:
        node, operand = _comparable(node, operand)
    if op == "$gt":
        return bool(node > operand)
    if op == "$gte":
        return bool(node >= operand)
    if op == "$lt":
        return bool(node < operand)
    return bool(node <= operand)


def _json_eq(a: Any, b: Any) -> bool:
    """JSON equality: numbers by value (``1 == 1.0``), booleans apart from numbers, objects
    by their keys, arrays in order."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if isinstance(a, int | float):
        if not isinstance(b, int | float):
            return False
        a, b = _comparable(a, b)
        return bool(a == b)
    if isinstance(a, str):
        return isinstance(b, str) and a == b
    if isinstance(a, list | tuple):
        return (isinstance(b, list | tuple) and len(a) == len(b)
                and all(_json_eq(x, y) for x, y in zip(a, b, strict=True)))
    if isinstance(a, Mapping):
        return (isinstance(b, Mapping) and len(a) == len(b)
                and all(k in b and _json_eq(v, b[k]) for k, v in a.items()))
    return False


#: Below this magnitude a float's shortest decimal (its JSON text) lies on the same side of
#: every integer as the float itself.
_EXACT_FLOAT: Final = 2.0**53


def _comparable(a: int | float, b: int | float) -> tuple[Any, Any]:
    """Two JSON numbers as PostgreSQL compares them: by the decimal value of their JSON text
    (a float's shortest repr). Python's int/float comparison agrees but for an int against a
    float beyond 2**53 (``1e300`` is not ``10**300`` in binary): those compare as decimals."""
    if type(a) is type(b) or (abs(a) < _EXACT_FLOAT and abs(b) < _EXACT_FLOAT):
        return a, b
    return _decimal(a), _decimal(b)


def _decimal(x: int | float) -> Decimal:
    return Decimal(repr(x)) if isinstance(x, float) else Decimal(x)
