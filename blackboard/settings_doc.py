"""Render the settings reference of ``docs/configuration.md`` from :mod:`blackboard.settings`.

Descriptions come from the ``#:`` comments above each field, so the doc
cannot drift from the code: ``python -m blackboard.settings_doc --write``
refreshes it and a test fails when it is stale.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

from pydantic import BaseModel, SecretStr

from blackboard.settings import Settings

__all__ = ["render_reference", "splice"]

BEGIN = "<!-- BEGIN GENERATED SETTINGS -->"
END = "<!-- END GENERATED SETTINGS -->"
_FIELD_RE = re.compile(r"^\s{4}(\w+)\s*:")


def _comments(model: type[BaseModel]) -> dict[str, str]:
    found: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(model).splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = _FIELD_RE.match(line)
        if match and pending:
            found[match.group(1)] = " ".join(pending)
        if stripped and not stripped.startswith("#"):
            pending = []
    return found


def _default(value: object) -> str:
    if isinstance(value, SecretStr):
        return "(secret)" if value.get_secret_value() else "—"
    if value is None:
        return "—"
    return f"`{value}`"


def render_reference() -> str:
    """The Markdown tables: one per settings group, one row per variable."""
    settings = Settings.model_construct()  # the defaults, never this process's environment
    out: list[str] = []
    for group, field in Settings.model_fields.items():
        sub = getattr(settings, group)
        cls = type(sub)
        out.append(f"### `{group}`\n")
        if cls.__doc__:
            out.append(inspect.cleandoc(cls.__doc__).splitlines()[0] + "\n")
        out.append("| variable | default | meaning |\n| --- | --- | --- |")
        notes = _comments(cls)
        for name in cls.model_fields:
            var = f"BLACKBOARD_{group.upper()}__{name.upper()}"
            text = notes.get(name, "").replace("|", "\\|").replace("``", "`")
            out.append(f"| `{var}` | {_default(getattr(sub, name))} | {text} |")
        out.append("")
        del field
    return "\n".join(out).rstrip() + "\n"


def splice(doc: str, reference: str) -> str:
    """Replace the generated block of ``doc`` with ``reference``."""
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    return doc[:start] + "\n" + reference + doc[end:]


def main(argv: list[str]) -> int:
    path = Path("docs/configuration.md")
    if argv and argv[0] == "--write":
        path.write_text(splice(path.read_text(), render_reference()))
        return 0
    print(render_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
