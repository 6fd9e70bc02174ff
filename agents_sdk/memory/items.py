"""Memory items: one step of an agent's execution history, and condensation summaries.

A :class:`MemoryItem` is what :class:`~agents_sdk.memory.ShortTermMemory` stores: the
standard fields agent frameworks keep per step (``action``, ``arguments``,
``observation``, ``result``, ``cost``, ``error``), any custom field, tags and a
creation time. A :class:`Summary` stands in for items a condenser forgot. A
*view* of a history is a sequence of both (:data:`ViewItem`).

Field values are JSON values (``None``, bool, int, float, str, lists, dicts with
string keys) or ``bytes``; ``bytes`` survive the JSON round trip as
``{"__bytes__": "<base64>"}``.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from blackboard.protocol.errors import InvalidPayloadError

__all__ = [
    "RESERVED_FIELDS",
    "STANDARD_FIELDS",
    "ItemId",
    "MemoryItem",
    "Summary",
    "ViewItem",
    "decode_json_value",
    "encode_json_value",
    "render_item",
    "render_value",
]

#: The standard per-step fields, in display order.
STANDARD_FIELDS: Final = ("action", "arguments", "observation", "result", "cost", "error")
#: Names a custom field may not take.
RESERVED_FIELDS: Final = frozenset({"id", "step", "tags", "created_at", "extra"})

#: Id of an item in a view: ``int`` for memory items, ``str`` for summaries.
ItemId: TypeAlias = int | str

_BYTES_KEY: Final = "__bytes__"


@dataclass(frozen=True, slots=True)
class MemoryItem:
    """One entry of the short-term memory (read-only once created).

    Attributes:
        id: Sequence number given by the memory; increases with every add.
        step: The agent step the item belongs to (several items may share a step).
        created_at: Clock reading (seconds) when the item was added.
        tags: Labels, de-duplicated, in the order given.
        action: What the agent did (tool name, message kind...).
        arguments: The action's arguments.
        observation: What the agent saw as a result.
        result: The outcome of the step.
        cost: Tokens, money, seconds... any JSON value.
        error: The error text or object, if the step failed.
        extra: Custom fields by name.
        nbytes: Size that counts against the memory's byte bound: the UTF-8
            length of the item's compact JSON encoding (:meth:`to_dict`).
    """

    id: int
    step: int
    created_at: float
    tags: tuple[str, ...] = ()
    action: Any = None
    arguments: Any = None
    observation: Any = None
    result: Any = None
    cost: Any = None
    error: Any = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    nbytes: int = field(default=0, compare=False)

    def __hash__(self) -> int:
        # Field values may be unhashable (dicts); identity within a memory is enough.
        return hash((self.id, self.step, self.created_at))

    def get(self, name: str, default: Any = None) -> Any:
        """Value of a standard or custom field, ``default`` when unset (``None``)."""
        if name in STANDARD_FIELDS:
            value = getattr(self, name)
        else:
            value = self.extra.get(name)
        return default if value is None else value

    def has(self, name: str) -> bool:
        """Whether the field ``name`` is set (not ``None``)."""
        return self.get(name) is not None

    def fields(self) -> dict[str, Any]:
        """The set fields (standard ones first, then custom ones), by name."""
        out = {name: getattr(self, name) for name in STANDARD_FIELDS}
        out = {k: v for k, v in out.items() if v is not None}
        out.update((k, v) for k, v in self.extra.items() if v is not None)
        return out

    def pick(self, *names: str) -> dict[str, Any]:
        """The named fields that are set, by name (a projection)."""
        return {n: v for n in names if (v := self.get(n)) is not None}

    def to_dict(self) -> dict[str, Any]:
        """Plain dict: ``id``, ``step``, ``created_at``, ``tags`` and the set fields."""
        out: dict[str, Any] = {
            "id": self.id,
            "step": self.step,
            "created_at": self.created_at,
            "tags": list(self.tags),
        }
        out.update(self.fields())
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryItem:
        """Rebuild an item from :meth:`to_dict` output (unknown keys become custom fields).

        Raises:
            InvalidPayloadError: ``id``/``step`` missing or not integers, bad tags.
        """
        try:
            item_id = data["id"]
            step = data["step"]
        except KeyError as exc:
            raise InvalidPayloadError(f"memory item lacks {exc.args[0]!r}") from exc
        if not _is_int(item_id) or not _is_int(step):
            raise InvalidPayloadError("memory item id and step must be integers")
        created = data.get("created_at", 0.0)
        if not isinstance(created, int | float) or isinstance(created, bool):
            raise InvalidPayloadError("memory item created_at must be a number")
        standard = {k: data.get(k) for k in STANDARD_FIELDS}
        extra = {
            k: v
            for k, v in data.items()
            if k not in RESERVED_FIELDS and k not in STANDARD_FIELDS and v is not None
        }
        return make_item(
            item_id, step, float(created), normalize_tags(data.get("tags", ())), standard, extra
        )


@dataclass(frozen=True, slots=True)
class Summary:
    """A condenser's summary, standing in a view for the items it forgot.

    Attributes:
        id: Derived from the forgotten ids (see ``CondensationEvent``).
        text: The summary text.
        count: How many view items it replaced.
    """

    id: str
    text: str
    count: int = 0


#: An element of a (possibly condensed) view of a history.
ViewItem: TypeAlias = MemoryItem | Summary


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def normalize_tags(tags: Iterable[str] | str) -> tuple[str, ...]:
    """De-duplicate tags keeping their order.

    Raises:
        InvalidPayloadError: a tag is not a non-empty string.
    """
    if isinstance(tags, str):
        tags = (tags,)
    out = tuple(dict.fromkeys(tags))
    for tag in out:
        if not isinstance(tag, str) or not tag:
            raise InvalidPayloadError(f"tags must be non-empty strings, got {tag!r}")
    return out


def _json_default(value: object) -> object:
    if isinstance(value, bytes | bytearray | memoryview):
        return {_BYTES_KEY: base64.b64encode(bytes(value)).decode("ascii")}
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def encode_json_value(value: Any) -> str:
    """Compact, key-sorted JSON (``bytes`` as ``{"__bytes__": base64}``).

    Raises:
        InvalidPayloadError: the value holds something that is not a JSON value,
            bytes, or a non-finite float.
    """
    try:
        return json.dumps(
            value,
            default=_json_default,
            separators=(",", ":"),
            ensure_ascii=False,
            sort_keys=True,
            allow_nan=False,
        )
    except (TypeError, ValueError) as exc:
        raise InvalidPayloadError(f"not a JSON value: {exc}") from exc


def _json_hook(obj: dict[str, Any]) -> Any:
    if len(obj) == 1 and isinstance(raw := obj.get(_BYTES_KEY), str):
        return base64.b64decode(raw)
    return obj


def decode_json_value(text: str | bytes) -> Any:
    """Inverse of :func:`encode_json_value`.

    Raises:
        InvalidPayloadError: not valid JSON.
    """
    try:
        return json.loads(text, object_hook=_json_hook)
    except ValueError as exc:
        raise InvalidPayloadError(f"invalid JSON: {exc}") from exc


# Key order does not change the length, so sizing skips sort_keys.
_SIZER = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_json_default
)


def make_item(
    item_id: int,
    step: int,
    created_at: float,
    tags: tuple[str, ...],
    standard: Mapping[str, Any],
    extra: Mapping[str, Any],
) -> MemoryItem:
    """Build an item and measure its size (internal; validates JSON-ability).

    Raises:
        InvalidPayloadError: a field holds a non-JSON value or a custom field
            has a reserved name.
    """
    for name in extra:
        if name in RESERVED_FIELDS or name in STANDARD_FIELDS:
            raise InvalidPayloadError(f"custom field name {name!r} is reserved")
    if not math.isfinite(created_at):
        raise InvalidPayloadError("created_at must be finite")
    doc: dict[str, Any] = {"id": item_id, "step": step, "created_at": created_at, "tags": tags}
    for name, value in standard.items():
        if value is not None:
            doc[name] = value
    doc.update(extra)
    try:
        size = len(_SIZER.encode(doc).encode())
    except (TypeError, ValueError) as exc:
        raise InvalidPayloadError(f"not a JSON value: {exc}") from exc
    return MemoryItem(item_id, step, created_at, tags, **standard, extra=extra, nbytes=size)


def render_value(value: Any, max_chars: int | None = None) -> str:
    """Text of a field value for a prompt: strings as they are, bytes as a
    placeholder, anything else as compact key-sorted JSON; cut to ``max_chars``
    with a ``… [+N chars]`` marker."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, bytes | bytearray | memoryview):
        text = f"<{len(bytes(value))} bytes>"
    else:
        try:
            text = encode_json_value(value)
        except InvalidPayloadError:
            text = repr(value)
    return truncate(text, max_chars)


def truncate(text: str, max_chars: int | None) -> str:
    """``text`` cut to at most ``max_chars`` characters, marker included."""
    if max_chars is None or len(text) <= max_chars:
        return text
    marker = f"… [+{len(text)} chars]"
    keep = max(0, max_chars - len(marker))
    marker = f"… [+{len(text) - keep} chars]"
    keep = max(0, max_chars - len(marker))
    return (text[:keep] + marker)[:max_chars]


def render_item(item: ViewItem, max_field_chars: int | None = None) -> str:
    """Deterministic text of a view item, as used in prompts and summaries.

    A memory item renders as ``[step 3 #12 tags: a, b] action: search`` followed
    by one ``  name: value`` line per other set field; a summary as
    ``[summary of N earlier items] text``.
    """
    if isinstance(item, Summary):
        return f"[summary of {item.count} earlier items] {truncate(item.text, max_field_chars)}"
    head = f"[step {item.step} #{item.id}"
    if item.tags:
        head += " tags: " + ", ".join(item.tags)
    head += "]"
    lines = [head]
    for name, value in item.fields().items():
        lines.append(f"  {name}: {render_value(value, max_field_chars)}")
    if len(lines) > 1 and item.action is not None:
        # The action reads best on the header line.
        lines[0] = f"{head} {lines.pop(1).strip()}"
    return "\n".join(lines)
