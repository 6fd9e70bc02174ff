"""The pure core of :class:`~agents_sdk.langgraph.store.BlackboardStore`: where an item lives
on the board, the metadata it carries, LangGraph filters as ``where`` filters, namespace
matching and the order of a listing. No IO here.

An item ``(namespace, key)`` is the board entry ``(section, entry_key)``:

- ``section`` is the namespace's first label, escaped into ``[A-Za-z0-9_-]``: letters, digits
  and ``_`` stay, every other character becomes ``-`` and the two hex digits of each of its
  UTF-8 bytes; a label whose escape would pass 128 characters becomes ``--`` and a SHA-256
  (``-`` is never followed by ``-`` in an escape, so the two forms never meet).
- ``entry_key`` is the JSON array of the other labels and the key (``["u1","prefs"]``), or, when
  that is too long for a KV key, ``#`` and its SHA-256.

The entry's metadata (``langgraph``: :func:`item_metadata`) names the namespace and the key
again, with the times, the TTL and the namespace's prefixes (``"a"``, ``"a.b"``...: labels have
no ``.``), which a search matches by containment. A reader takes an entry for an item only when
its location is the one its metadata names (:func:`item_of`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from langgraph.store.base import InvalidNamespaceError, Item, MatchCondition

from blackboard.protocol.errors import InvalidKeyError
from blackboard.protocol.filters import parse_where
from blackboard.protocol.subjects import encode_key

__all__ = [
    "META",
    "ItemRecord",
    "Location",
    "item_metadata",
    "item_of",
    "listing_order",
    "location",
    "namespace_matches",
    "prefix_metadata",
    "section_of",
    "ttl_seconds",
    "where_of",
]

T = TypeVar("T")

#: The metadata field of an item's entry.
META: Final = "langgraph"
#: The version of that field's layout.
_LAYOUT: Final = 1
_PLAIN: Final = re.compile(r"[A-Za-z0-9_]")
_MAX_SECTION: Final = 128


@dataclass(frozen=True, slots=True)
class Location:
    """The board entry of an item."""

    section: str
    key: str


@dataclass(frozen=True, slots=True)
class ItemRecord:
    """An item as the board holds it: the item, its entry's revision and its TTL."""

    item: Item
    revision: int
    #: The item's TTL in seconds (None: it never expires).
    ttl: int | None
    #: The entry's metadata, as written (a refresh writes it again unchanged).
    metadata: Mapping[str, Any]


def section_of(label: str) -> str:
    """The section of the namespaces whose first label is ``label`` (see the module's docstring)."""
    out: list[str] = []
    for ch in label:
        if _PLAIN.fullmatch(ch):
            out.append(ch)
        else:
            out.extend(f"-{b:02x}" for b in ch.encode("utf-8"))
    section = "".join(out)
    if len(section) > _MAX_SECTION:
        return "--" + hashlib.sha256(label.encode("utf-8")).hexdigest()
    return section


def location(namespace: Sequence[str], key: str) -> Location:
    """Where the item ``(namespace, key)`` lives on the board."""
    entry_key = json.dumps([*namespace[1:], key], ensure_ascii=False, separators=(",", ":"))
    try:
        encode_key(entry_key)
    except InvalidKeyError:
        entry_key = "#" + hashlib.sha256(entry_key.encode("utf-8")).hexdigest()
    return Location(section_of(namespace[0]), entry_key)


def _prefixes(namespace: Sequence[str]) -> list[str]:
    return [".".join(namespace[:i]) for i in range(1, len(namespace) + 1)]


def prefix_metadata(prefix: Sequence[str], *, indexed_only: bool = False) -> dict[str, Any]:
    """The metadata containment that selects the items under ``prefix`` (all items for ``()``),
    only the indexed ones with ``indexed_only``."""
    inner: dict[str, Any] = {"v": _LAYOUT}
    if prefix:
        inner["prefixes"] = [".".join(prefix)]
    if indexed_only:
        inner["index"] = True
    return {META: inner}


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat(timespec="microseconds")


def item_metadata(namespace: Sequence[str], key: str, *, created_at: datetime, updated_at: datetime,
                  ttl_minutes: float | None, index: bool) -> dict[str, Any]:
    """The metadata of an item's entry."""
    inner: dict[str, Any] = {"v": _LAYOUT, "ns": list(namespace), "key": key, "created_at": _iso(created_at),
                             "updated_at": _iso(updated_at), "index": index, "prefixes": _prefixes(namespace)}
    if ttl_minutes is not None:
        inner["ttl"] = ttl_minutes
    return {META: inner}


def ttl_seconds(ttl_minutes: float | None) -> int | None:
    """A TTL in minutes (LangGraph's unit) as the whole seconds of a message TTL (at least 1).

    Raises:
        ValueError: not a positive finite number.
    """
    if ttl_minutes is None:
        return None
    if isinstance(ttl_minutes, bool) or not isinstance(ttl_minutes, int | float) \
            or not math.isfinite(ttl_minutes) or ttl_minutes <= 0:
        raise ValueError(f"ttl must be a positive number of minutes, not {ttl_minutes!r}")
    return max(1, math.ceil(ttl_minutes * 60))


def item_of(section: str, entry_key: str, revision: int, value: Any, metadata: Mapping[str, Any]) -> ItemRecord | None:
    """The item an entry holds, or None when it holds none: metadata not of an item, a value
    that is not an object, or a location other than the one the metadata names."""
    inner = metadata.get(META) if isinstance(metadata, Mapping) else None
    if not isinstance(inner, Mapping) or inner.get("v") != _LAYOUT or not isinstance(value, Mapping):
        return None
    ns, key = inner.get("ns"), inner.get("key")
    if not isinstance(ns, list) or not ns or not all(isinstance(x, str) and x for x in ns) \
            or not isinstance(key, str):
        return None
    if location(ns, key) != Location(section, entry_key):
        return None
    try:
        created = datetime.fromisoformat(inner["created_at"])
        updated = datetime.fromisoformat(inner["updated_at"])
    except (KeyError, TypeError, ValueError):
        return None
    ttl = inner.get("ttl")
    try:
        seconds = ttl_seconds(ttl) if ttl is not None else None
    except ValueError:
        seconds = None
    item = Item(value=dict(value), key=key, namespace=tuple(ns), created_at=created, updated_at=updated)
    return ItemRecord(item, revision, seconds, metadata)


def where_of(filter: Mapping[str, Any] | None) -> dict[str, Any]:
    """A LangGraph search filter as a ``where`` filter on the entry's value.

    ``{"k": v}`` is ``{"value.k": v}`` (equality), ``{"k": {"$gt": 5}}`` is
    ``{"value.k": {"$gt": 5}}``; a nested object without operators matches the nested keys
    given (``{"a": {"b": 1}}`` is ``{"value.a.b": 1}``), as LangGraph's stores do.

    Raises:
        ValueError: a key that is empty or holds a ``.`` (paths have no escape: nest the
            filter instead), an empty object, an object mixing operators and keys; and
            (``InvalidPayloadError``) what :func:`~blackboard.protocol.filters.parse_where`
            refuses: an unknown operator, an operand of the wrong type, too many or too deep
            paths.
    """
    out: dict[str, Any] = {}

    def walk(path: str, key: Any, cond: Any) -> None:
        if not isinstance(key, str) or not key or "." in key:
            raise ValueError(f"filter key {key!r}: keys must be non-empty strings without '.' "
                             "(nest the filter for a nested field: {'a': {'b': 1}})")
        path = f"{path}.{key}"
        if isinstance(cond, Mapping):
            ops = [k for k in cond if isinstance(k, str) and k.startswith("$")]
            if not cond:
                raise ValueError(f"filter {path[6:]!r}: an empty object filters nothing")
            if ops and len(ops) != len(cond):
                raise ValueError(f"filter {path[6:]!r} mixes operators and keys")
            if ops:
                out[path] = {k: list(v) if isinstance(v, tuple) else v for k, v in cond.items()}
                return
            for k, v in cond.items():
                walk(path, k, v)
            return
        out[path] = list(cond) if isinstance(cond, tuple) else cond

    for k, v in (filter or {}).items():
        walk("value", k, v)
    parse_where(out)
    return out


def namespace_matches(namespace: tuple[str, ...], conditions: Iterable[MatchCondition]) -> bool:
    """Whether ``namespace`` meets every prefix/suffix condition (``"*"`` matches any label).

    Raises:
        InvalidNamespaceError: an unknown match type.
    """
    for cond in conditions:
        path = tuple(cond.path)
        if len(namespace) < len(path):
            return False
        if cond.match_type == "prefix":
            pairs = zip(namespace, path, strict=False)
        elif cond.match_type == "suffix":
            pairs = zip(reversed(namespace), reversed(path), strict=False)
        else:
            raise InvalidNamespaceError(f"unknown namespace match type {cond.match_type!r}")
        if any(p != "*" and n != p for n, p in pairs):
            return False
    return True


def listing_order(records: Iterable[T], item: Callable[[T], Item]) -> list[T]:
    """Records in the insertion order of their items, as LangGraph's in-memory store lists
    them: grouped by namespace, the namespaces in the order of their oldest item, each
    namespace's items by creation (then key)."""
    by_ns: dict[tuple[str, ...], list[tuple[datetime, str, T]]] = {}
    for r in records:
        i = item(r)
        by_ns.setdefault(i.namespace, []).append((i.created_at, i.key, r))
    groups = [sorted(group, key=lambda g: (g[0], g[1])) for group in by_ns.values()]
    groups.sort(key=lambda g: (g[0][0], item(g[0][2]).namespace))
    return [r for group in groups for _, _, r in group]
