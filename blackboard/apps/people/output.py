"""What the commands for people print (pure): records as JSON for scripts, tables and short
previews for people.

``--json`` output is JSON text with no NaN or infinity (``allow_nan=False``: a float the
value cannot carry is written as a string); bytes are ``{"$base64": "..."}`` and instants
ISO 8601 strings in UTC. A command that prints records prints one JSON object per line
(JSON lines); the others print one JSON document.

Text for people never carries the terminal's control characters: a board holds what any
agent wrote, and an escape sequence in a value must not reach the terminal as one
(:func:`printable`).
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel

from blackboard.protocol.entries import Entry

__all__ = [
    "dumps",
    "entry_json",
    "instant",
    "jsonable",
    "preview",
    "printable",
    "table",
    "value_text",
]

#: C0 and C1 control characters but newline and tab, and DEL.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
#: Also newline and tab (one-line previews and table cells).
_CONTROL_OR_BREAK = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data: bytes as ``{"$base64": ...}``, instants as ISO 8601 (UTC),
    enums as their value, tuples and sets as lists, pydantic models as their fields, a float
    that is not finite as its text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Enum):
        return jsonable(value.value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$base64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC).isoformat()
    if isinstance(value, BaseModel):
        return jsonable(value.model_dump())
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    return str(value)


def dumps(value: Any, *, indent: int | None = None) -> str:
    """``value`` as JSON text (:func:`jsonable` first; non-ASCII kept)."""
    return json.dumps(jsonable(value), ensure_ascii=False, allow_nan=False, indent=indent)


def entry_json(entry: Entry) -> dict[str, Any]:
    """An entry as a JSON object: its address, revision, operation, value and record fields."""
    return {
        "board": entry.board, "section": entry.section, "key": entry.key, "revision": entry.revision,
        "operation": entry.operation.value, "value": jsonable(entry.value), "content_type": entry.content_type,
        "author": entry.author, "tags": list(entry.tags), "metadata": jsonable(entry.metadata),
        "created_at": jsonable(entry.created_at), "stored_at": jsonable(entry.stored_at),
        "verdict": entry.verdict.value,
    }


def printable(text: str, *, one_line: bool = False) -> str:
    """``text`` with its control characters shown as escapes (``\\x1b``), so that nothing a
    board holds can drive the terminal; with ``one_line``, newlines and tabs too."""
    pattern = _CONTROL_OR_BREAK if one_line else _CONTROL
    return pattern.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def value_text(value: Any) -> str:
    """A value for people: a string as it is, anything else as indented JSON."""
    if isinstance(value, str):
        return printable(value)
    return printable(dumps(value, indent=2))


def preview(value: Any, width: int = 60) -> str:
    """A value on one line of at most ``width`` characters (a string as it is, else compact JSON)."""
    text = value if isinstance(value, str) else dumps(value)
    text = printable(text, one_line=True)
    return text if len(text) <= width else text[:width - 3] + "..."


def instant(at: datetime | None) -> str:
    """An instant for people: ``2026-11-26 01:02:03`` (UTC); ``-`` when unknown."""
    if at is None:
        return "-"
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, right: Sequence[str] = ()) -> str:
    """Rows under their headers, in columns as wide as their widest cell (the last column is
    not padded); the columns named in ``right`` are aligned right (numbers)."""
    cells = [[printable(str(c), one_line=True) for c in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    lines = []
    for row in [list(headers), *cells]:
        parts = []
        for i, cell in enumerate(row):
            if headers[i] in right:
                parts.append(cell.rjust(widths[i]))
            elif i == len(row) - 1:
                parts.append(cell)
            else:
                parts.append(cell.ljust(widths[i]))
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)
