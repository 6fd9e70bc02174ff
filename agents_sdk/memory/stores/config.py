"""The memory config file: stores declared by name, and each agent's attachments.

TOML (``.toml``) or YAML (``.yaml``/``.yml``, needs PyYAML: the ``yaml``
extra)::

    [stores.notes]
    type = "conversation"
    board = "team"

    [stores.docs]
    type = "file"
    paths = ["docs"]              # relative to this file's folder
    suffixes = [".md"]

    [stores.events]
    type = "log"
    max_count = 500

    [agents.scraper.attach.notes]
    read = true
    write = true
    top_k = 3
    similarity_threshold = 0.2
    stages = ["pre", "gen"]

Every mistake is a :class:`ConfigFileError` (a ``ConfigurationError``) whose
message starts with ``<file>:<line>:``: a duplicate store name (or any key
given twice), an unknown store type, an unknown or invalid field of a store
or of an attachment, an attachment of an undeclared store, ``write = true`` on
a read-only store type. Loading is pure (no agent, no IO but reading the
file); stores are made when an agent attaches them.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents_sdk.memory.stores.base import STAGES, Stage, StoreSpec
from agents_sdk.memory.stores.registry import store_types
from blackboard.protocol.errors import ConfigurationError

__all__ = ["AttachmentSpec", "ConfigFileError", "MemoryConfig", "load_config", "parse_config"]

_Path = tuple[str, ...]
_NAME: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ConfigFileError(ConfigurationError):
    """A mistake in a memory config file, at ``path``:``line`` (the message starts with both)."""

    def __init__(self, path: str, line: int, message: str) -> None:
        self.path = path
        self.line = line
        self.reason = message
        super().__init__(f"{path}:{line}: {message}")


class _AttachmentFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    read: bool = True
    write: bool = False
    top_k: int = Field(5, ge=1, le=1000)
    similarity_threshold: float = Field(0.0, ge=0, le=1)
    stages: list[Stage] = Field(default_factory=lambda: list(STAGES), min_length=1)


@dataclass(frozen=True, slots=True)
class AttachmentSpec:
    """One store attached to an agent by the config file (``[agents.<id>.attach.<store>]``)."""

    store: str
    read: bool = True
    write: bool = False
    top_k: int = 5
    similarity_threshold: float = 0.0
    stages: tuple[Stage, ...] = STAGES
    origin: str = "code"


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """A loaded config file.

    Attributes:
        path: The file (None: parsed from a string without one).
        stores: The declared stores by name.
        agents: Each agent's attachments, by agent id then store name.
    """

    path: Path | None
    stores: Mapping[str, StoreSpec] = field(default_factory=dict)
    agents: Mapping[str, Mapping[str, AttachmentSpec]] = field(default_factory=dict)

    def attachments_for(self, agent_id: str) -> list[AttachmentSpec]:
        """The attachments of ``agent_id``, in the file's order (none: empty)."""
        return list(self.agents.get(agent_id, {}).values())


# -- positions ---------------------------------------------------------------------


_KEY_PART: Final = re.compile(r"""\s*("(?:[^"\\]|\\.)*"|'[^']*'|[A-Za-z0-9_-]+)\s*(\.|$)""")
_TABLE: Final = re.compile(r"^\s*\[(?!\[)(.+?)\]\s*(?:#.*)?$")
_KEY_LINE: Final = re.compile(r"""^\s*((?:"(?:[^"\\]|\\.)*"|'[^']*'|[A-Za-z0-9_-]+)(?:\s*\.\s*(?:"(?:[^"\\]|\\.)*"|'[^']*'|[A-Za-z0-9_-]+))*)\s*=""")


def _dotted(text: str) -> _Path | None:
    parts: list[str] = []
    pos = 0
    while pos < len(text):
        m = _KEY_PART.match(text, pos)
        if m is None:
            return None
        token = m.group(1)
        parts.append(tomllib.loads(f"k = {token}")["k"] if token[0] in "\"'" else token)
        pos = m.end()
        if not m.group(2):
            break
    return tuple(parts) if parts else None


def _toml_lines(text: str, path: str) -> dict[_Path, int]:
    """The line of each table and key of a TOML text, by dotted path; a table declared twice
    is a :class:`ConfigFileError` (naming both lines)."""
    lines: dict[_Path, int] = {}
    tables: dict[_Path, int] = {}
    table: _Path = ()
    in_string = False
    for number, raw in enumerate(text.splitlines(), 1):
        toggles = raw.count('"""') + raw.count("'''")
        if in_string:  # inside a multi-line string: no keys here
            in_string = toggles % 2 == 0
            continue
        in_string = toggles % 2 == 1  # one opens on this line (after its key)
        header = _TABLE.match(raw)
        if header is not None:
            found = _dotted(header.group(1))
            if found is None:
                continue
            if found in tables:
                what = (f"duplicate store name {found[1]!r}" if len(found) == 2 and found[0] == "stores"
                        else f"table [{'.'.join(found)}] declared twice")
                raise ConfigFileError(path, number, f"{what} (first at line {tables[found]})")
            tables[found] = number
            table = found
            for i in range(1, len(found) + 1):
                lines.setdefault(found[:i], number)
            continue
        key = _KEY_LINE.match(raw)
        if key is not None:
            found = _dotted(key.group(1))
            if found is not None:
                for i in range(1, len(found) + 1):
                    lines.setdefault(table + found[:i], number)
    return lines


def _yaml_tree(text: str, path: str) -> tuple[Any, dict[_Path, int]]:
    """The YAML document as Python values, with the line of each mapping key by path; a key
    given twice in one mapping is a :class:`ConfigFileError` (PyYAML keeps the last)."""
    try:
        import yaml
    except ImportError as exc:
        raise ConfigurationError(f"{path}: reading YAML needs PyYAML: pip install 'blackboard[yaml]'") from exc
    lines: dict[_Path, int] = {}
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            raise ConfigFileError(path, (mark.line + 1) if mark else 1, str(exc.problem or exc)) from exc

        def build(node: Any, at: _Path) -> Any:
            if isinstance(node, yaml.MappingNode):
                out: dict[Any, Any] = {}
                for key_node, value_node in node.value:
                    key = loader.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    if key in out:
                        first = lines.get((*at, str(key)), line)
                        what = (f"duplicate store name {key!r}" if at == ("stores",)
                                else f"key {'.'.join((*at, str(key)))!r} given twice")
                        raise ConfigFileError(path, line, f"{what} (first at line {first})")
                    lines[(*at, str(key))] = line
                    out[key] = build(value_node, (*at, str(key)))
                return out
            if isinstance(node, yaml.SequenceNode):
                return [build(item, (*at, str(i))) for i, item in enumerate(node.value)]
            return loader.construct_object(node, deep=True)

        data = build(node, ()) if node is not None else {}
    finally:
        loader.dispose()
    return data, lines


# -- validation --------------------------------------------------------------------


class _Checker:
    def __init__(self, path: str, lines: Mapping[_Path, int]) -> None:
        self.path = path
        self.lines = lines

    def line(self, at: Sequence[str]) -> int:
        """The line of ``at``, else of its nearest enclosing path, else 1."""
        at = tuple(at)
        while at:
            if at in self.lines:
                return self.lines[at]
            at = at[:-1]
        return 1

    def fail(self, at: Sequence[str], message: str) -> ConfigFileError:
        return ConfigFileError(self.path, self.line(at), message)

    def table(self, value: Any, at: _Path, what: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(at, f"{what} must be a table (mapping), not {type(value).__name__}")
        return value

    def pydantic(self, exc: ValidationError, at: _Path, what: str) -> ConfigFileError:
        first = exc.errors()[0]
        loc = tuple(str(p) for p in first["loc"])
        name = ".".join(loc) if loc else "options"
        reason = "unknown field" if first["type"] == "extra_forbidden" else first["msg"]
        return self.fail((*at, *loc), f"{what}: {name}: {reason}")


def _validate(data: Any, path: Path | None, label: str, lines: Mapping[_Path, int]) -> MemoryConfig:
    check = _Checker(label, lines)
    top = check.table(data, (), "the file")
    for key in top:
        if key not in ("stores", "agents"):
            raise check.fail((key,), f"unknown section {key!r} (expected 'stores' and 'agents')")
    types = store_types()
    base_dir = path.parent.resolve() if path is not None else None
    stores: dict[str, StoreSpec] = {}
    for name, raw in check.table(top.get("stores", {}), ("stores",), "stores").items():
        at = ("stores", str(name))
        if not isinstance(name, str) or not _NAME.match(name):
            raise check.fail(at, f"invalid store name {name!r}: 1-64 characters of A-Z a-z 0-9 _ -")
        body = dict(check.table(raw, at, f"store {name!r}"))
        type_name = body.pop("type", None)
        if type_name is None:
            raise check.fail(at, f"store {name!r} has no type (one of: {', '.join(sorted(types))})")
        if type_name not in types:
            raise check.fail((*at, "type"), f"store {name!r}: unknown store type {type_name!r} "
                                            f"(known: {', '.join(sorted(types))})")
        model = types[type_name].options
        if model is not None:
            try:
                model.model_validate(body)
            except ValidationError as exc:
                raise check.pydantic(exc, at, f"store {name!r} ({type_name})") from exc
        stores[name] = StoreSpec(name, type_name, body, f"{label}:{check.line(at)}", base_dir)
    agents: dict[str, dict[str, AttachmentSpec]] = {}
    for agent_id, raw in check.table(top.get("agents", {}), ("agents",), "agents").items():
        at = ("agents", str(agent_id))
        agent_body = check.table(raw, at, f"agent {agent_id!r}")
        for key in agent_body:
            if key != "attach":
                raise check.fail((*at, str(key)), f"agent {agent_id!r}: unknown field {key!r} (expected 'attach')")
        attached: dict[str, AttachmentSpec] = {}
        for store, fields in check.table(agent_body.get("attach", {}), (*at, "attach"), "attach").items():
            where = (*at, "attach", str(store))
            if store not in stores:
                raise check.fail(where, f"agent {agent_id!r} attaches {store!r}, which no [stores.{store}] declares")
            try:
                spec = _AttachmentFields.model_validate(check.table(fields, where, f"attachment {store!r}"))
            except ValidationError as exc:
                raise check.pydantic(exc, where, f"agent {agent_id!r}, attachment {store!r}") from exc
            if spec.write and not types[stores[store].type].writable:
                raise check.fail((*where, "write"), f"agent {agent_id!r}: store {store!r} "
                                                    f"({stores[store].type}) is read-only: write = true")
            attached[store] = AttachmentSpec(store, spec.read, spec.write, spec.top_k, spec.similarity_threshold,
                                             tuple(dict.fromkeys(spec.stages)), f"{label}:{check.line(where)}")
        agents[str(agent_id)] = attached
    return MemoryConfig(path, stores, agents)


def parse_config(text: str, *, format: Literal["toml", "yaml"], path: Path | None = None) -> MemoryConfig:
    """Parse a config file's text (see the module doc).

    Raises:
        ConfigFileError: a mistake, at its file and line.
        ConfigurationError: YAML without PyYAML.
    """
    label = str(path) if path is not None else "<config>"
    if format == "toml":
        lines = _toml_lines(text, label)
        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            m = re.search(r"\(at line (\d+)", str(exc))
            raise ConfigFileError(label, int(m.group(1)) if m else 1, str(exc)) from exc
    else:
        data, lines = _yaml_tree(text, label)
        if data is None:
            data = {}
    return _validate(data, path, label, lines)


def load_config(path: str | Path) -> MemoryConfig:
    """Read and check a TOML or YAML config file (by its suffix).

    Raises:
        ConfigFileError: a mistake, at its file and line.
        ConfigurationError: the file is missing, has another suffix, or is YAML without PyYAML.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml"):
        raise ConfigurationError(f"{path}: a memory config file is .toml, .yaml or .yml")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"{path}: cannot read the memory config file: {exc}") from exc
    return parse_config(text, format="toml" if suffix == ".toml" else "yaml", path=path)
