"""The declared access policy: who may do what, on which boards (pure).

A policy is a TOML document (docs/security.md)::

    version = 1

    [roles.member]                       # a named set of rights
    boards = { "*" = ["read", "write", "vote"] }
    topics = [">"]                       # topic patterns it may publish and subscribe
    objects = "write"                    # the shared object store: none, read or write

    [roles.auditor]
    boards = { "*" = ["read"] }

    [agents.planner]                     # one agent (its id), with roles and its own grants
    roles = ["member"]
    boards = { "secret-plans" = ["admin"] }

    [agents."ci-*"]                      # a glob: any agent id it matches may be issued
    roles = ["auditor"]

    [workers.worker]                     # the system: ingest, search, vote commits
    [operators.admin]                    # operators: administration

Rights on a board are ``read``, ``write``, ``vote`` and ``admin`` (which
implies the other three); the board ``"*"`` means every board. An agent's
rights are the union of its roles' and its own. An id is declared by its
exact table if there is one, else by the longest glob that matches it (so
``"ci-untrusted-*"`` can narrow what ``"ci-*"`` grants).
"""

from __future__ import annotations

import fnmatch
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from blackboard.protocol.errors import ConfigurationError
from blackboard.protocol.subjects import validate_name

__all__ = [
    "ALL_BOARDS",
    "DEFAULT_POLICY",
    "OPEN_RIGHTS",
    "STANDARD_ROLES",
    "AccessPolicy",
    "Kind",
    "ObjectAccess",
    "Right",
    "Rights",
]

ALL_BOARDS = "*"
Kind = Literal["agent", "worker", "operator"]
ObjectAccess = Literal["none", "read", "write"]
_KINDS: dict[str, Kind] = {"agents": "agent", "workers": "worker", "operators": "operator"}
_OBJECT_LEVELS: tuple[ObjectAccess, ...] = ("none", "read", "write")


class Right(StrEnum):
    """A right on a board."""

    READ = "read"
    WRITE = "write"
    VOTE = "vote"
    #: Implies read, write and vote (reserved for board administration).
    ADMIN = "admin"


_IMPLIED: dict[Right, frozenset[Right]] = {
    Right.READ: frozenset({Right.READ}),
    Right.WRITE: frozenset({Right.WRITE}),
    Right.VOTE: frozenset({Right.VOTE}),
    Right.ADMIN: frozenset(Right),
}


@dataclass(frozen=True, slots=True)
class Rights:
    """One principal's rights, resolved from the policy."""

    principal: str
    kind: Kind
    #: board name (or ``"*"``) -> its rights (``admin`` expanded).
    grants: Mapping[str, frozenset[Right]] = field(default_factory=dict)
    #: Topic patterns it may publish and subscribe (NATS wildcards, below ``bb.msg.topic.``).
    topics: tuple[str, ...] = (">",)
    objects: ObjectAccess = "none"

    @property
    def system(self) -> bool:
        """Whether the principal is the system (a worker) or an operator: every right, everywhere."""
        return self.kind != "agent"

    def can(self, board: str, right: Right) -> bool:
        """Whether the principal holds ``right`` on ``board``."""
        if self.system:
            return True
        for name in (board, ALL_BOARDS):
            held = self.grants.get(name)
            if held is not None and right in held:
                return True
        return False

    def boards(self, right: Right) -> frozenset[str] | None:
        """The boards it holds ``right`` on; None means every board."""
        if self.system:
            return None
        named = frozenset(b for b, held in self.grants.items() if right in held)
        return None if ALL_BOARDS in named else named

    def topic_allowed(self, topic: str) -> bool:
        """Whether a topic (or a topic pattern it subscribes with) lies within its topic patterns."""
        from blackboard.protocol.subjects import pattern_covers

        return self.system or any(pattern_covers(p, topic) for p in self.topics)


def OPEN_RIGHTS(principal: str) -> Rights:
    """Everything, for anyone: the rights of every principal on an open (insecure) bus."""
    return Rights(principal, "agent", {ALL_BOARDS: frozenset(Right)}, (">",), "write")


@dataclass(frozen=True, slots=True)
class _Grant:
    roles: tuple[str, ...]
    boards: Mapping[str, frozenset[Right]]
    topics: tuple[str, ...] | None
    objects: ObjectAccess | None


def _rights_of(value: Any, where: str) -> frozenset[Right]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigurationError(f"{where}: rights must be a list of strings (read, write, vote, admin)")
    out: set[Right] = set()
    for name in value:
        try:
            out |= _IMPLIED[Right(name)]
        except ValueError:
            raise ConfigurationError(f"{where}: unknown right {name!r} (read, write, vote, admin)") from None
    return frozenset(out)


def _boards_of(value: Any, where: str) -> dict[str, frozenset[Right]]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigurationError(f"{where}.boards must be a table of board = [rights]")
    out: dict[str, frozenset[Right]] = {}
    for board, rights in value.items():
        if board != ALL_BOARDS:
            try:
                validate_name(board, "board")
            except ValueError as exc:
                raise ConfigurationError(f"{where}.boards: {exc}") from None
        out[board] = _rights_of(rights, f"{where}.boards.{board}")
    return out


def _topics_of(value: Any, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise ConfigurationError(f"{where}.topics must be a list of topic patterns")
    from blackboard.protocol.subjects import Subjects

    for t in value:
        if t != ">":
            try:
                Subjects.topic(t)
            except ValueError as exc:
                raise ConfigurationError(f"{where}.topics: {exc}") from None
    return tuple(value)


def _objects_of(value: Any, where: str) -> ObjectAccess | None:
    if value is None:
        return None
    for level in _OBJECT_LEVELS:
        if value == level:
            return level
    raise ConfigurationError(f"{where}.objects must be one of none, read, write")


def _grant(table: Any, where: str, *, roles_allowed: bool) -> _Grant:
    if table is None:
        table = {}
    if not isinstance(table, dict):
        raise ConfigurationError(f"{where} must be a table")
    unknown = set(table) - {"roles", "boards", "topics", "objects"}
    if unknown:
        raise ConfigurationError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    roles = table.get("roles", [])
    if not roles_allowed and roles:
        raise ConfigurationError(f"{where}: a role cannot name roles")
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise ConfigurationError(f"{where}.roles must be a list of role names")
    return _Grant(tuple(roles), _boards_of(table.get("boards"), where), _topics_of(table.get("topics"), where),
                  _objects_of(table.get("objects"), where))


class AccessPolicy:
    """A parsed policy: roles and the principals (exact ids or globs) of each kind."""

    def __init__(self, roles: Mapping[str, _Grant], principals: Mapping[Kind, Mapping[str, _Grant]],
                 source: str = "the policy") -> None:
        self._roles = dict(roles)
        self._principals = {k: dict(v) for k, v in principals.items()}
        self.source = source
        seen: dict[str, Kind] = {}
        for kind, entries in self._principals.items():
            for name in entries:
                if name in seen:  # which kind it is would depend on the sections' order
                    raise ConfigurationError(f"{source}: {name!r} is declared as both {seen[name]} and {kind}")
                seen[name] = kind
        for kind, entries in self._principals.items():
            for name, grant in entries.items():
                for role in grant.roles:
                    if role not in self._roles:
                        raise ConfigurationError(f"{source}: {kind} {name!r} names the unknown role {role!r}")

    # -- loading -------------------------------------------------------------
    @classmethod
    def parse(cls, text: str, *, source: str = "the policy") -> AccessPolicy:
        """Parse policy TOML.

        Raises:
            ConfigurationError: not TOML, an unknown field, right, role or kind.
        """
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigurationError(f"{source} is not valid TOML: {exc}") from None
        version = doc.get("version", 1)
        if version != 1:
            raise ConfigurationError(f"{source}: policy version {version!r} is not supported (1)")
        unknown = set(doc) - {"version", "roles", "agents", "workers", "operators"}
        if unknown:
            raise ConfigurationError(f"{source}: unknown section(s) {', '.join(sorted(unknown))}")
        roles_doc = doc.get("roles", {})
        if not isinstance(roles_doc, dict):
            raise ConfigurationError(f"{source}: [roles] must be a table")
        roles = {name: _grant(t, f"roles.{name}", roles_allowed=False) for name, t in roles_doc.items()}
        principals: dict[Kind, dict[str, _Grant]] = {}
        for section, kind in _KINDS.items():
            entries = doc.get(section, {})
            if not isinstance(entries, dict):
                raise ConfigurationError(f"{source}: [{section}] must be a table")
            for name in entries:
                pattern = name.replace("*", "a").replace("?", "a").replace("[", "a").replace("]", "a")
                try:
                    validate_name(pattern, f"{kind} id")
                except ValueError as exc:
                    raise ConfigurationError(f"{source}: {section}.{name}: {exc}") from None
            principals[kind] = {name: _grant(t, f"{section}.{name}", roles_allowed=True)
                                for name, t in entries.items()}
        return cls(roles, principals, source)

    @classmethod
    def load(cls, path: Path) -> AccessPolicy:
        """Read a policy file.

        Raises:
            ConfigurationError: missing, unreadable or invalid.
        """
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(f"cannot read the access policy {path}: {exc.strerror or exc}") from None
        return cls.parse(text, source=str(path))

    # -- queries -------------------------------------------------------------
    def _entry(self, principal: str) -> tuple[Kind, _Grant] | None:
        """The entry that declares ``principal``: its exact id, else the longest glob matching it."""
        for kind, entries in self._principals.items():
            if principal in entries:
                return kind, entries[principal]
        best: tuple[int, Kind, _Grant] | None = None
        for kind, entries in self._principals.items():
            for name, grant in entries.items():
                if fnmatch.fnmatchcase(principal, name) and (best is None or len(name) > best[0]):
                    best = (len(name), kind, grant)
        return None if best is None else (best[1], best[2])

    def kind_of(self, principal: str) -> Kind | None:
        """The kind of a declared principal, or None."""
        entry = self._entry(principal)
        return None if entry is None else entry[0]

    def declared(self) -> dict[Kind, list[str]]:
        """The principals (ids and globs) of each kind, as written."""
        return {kind: sorted(entries) for kind, entries in self._principals.items()}

    def rights(self, principal: str) -> Rights | None:
        """A principal's rights, or None if the policy does not declare it."""
        entry = self._entry(principal)
        if entry is None:
            return None
        kind, grant = entry
        grants = [grant]
        boards: dict[str, set[Right]] = {}
        topics: list[str] | None = None
        objects: ObjectAccess = "none"

        def add(g: _Grant) -> None:
            nonlocal topics, objects
            for b, held in g.boards.items():
                boards.setdefault(b, set()).update(held)
            if g.topics is not None:
                topics = (topics or []) + [t for t in g.topics if t not in (topics or [])]
            if g.objects is not None and _OBJECT_LEVELS.index(g.objects) > _OBJECT_LEVELS.index(objects):
                objects = g.objects

        for g in grants:
            for role in g.roles:
                add(self._roles[role])
            add(g)
        if kind != "agent":
            return Rights(principal, kind, {ALL_BOARDS: frozenset(Right)}, (">",), "write")
        return Rights(principal, kind, {b: frozenset(h) for b, h in boards.items()},
                      tuple(topics) if topics is not None else (">",), objects)

    def principals(self, kind: Kind | None = None) -> Iterable[tuple[Kind, str]]:
        for k, entries in self._principals.items():
            if kind is None or k == kind:
                for name in entries:
                    yield k, name


#: What ``blackboard auth init`` and ``blackboard dev`` start from.
#: The starting policy's roles: ``member`` (read, write and vote on every board, every topic,
#: the object store) and ``reader`` (read everything); other policies build on them.
STANDARD_ROLES = """\
[roles.member]
boards = { "*" = ["read", "write", "vote"] }
topics = [">"]
objects = "write"

[roles.reader]
boards = { "*" = ["read"] }
topics = [">"]
objects = "read"
"""

DEFAULT_POLICY = """\
# The blackboard access policy (docs/security.md). Rights on a board: read,
# write, vote, admin (all three); the board "*" means every board.
version = 1

""" + STANDARD_ROLES + """
# One table per agent id (or a glob such as "ci-*": the longest glob that
# matches an id declares it); `blackboard auth add` appends one.
[agents.planner]
roles = ["member"]

# `blackboard ingest` (knowledge files into memories) writes as this agent by default.
[agents.ingest]
roles = ["member"]

# The example team (python -m examples.team): team-<id>-planner, -actor-1, -actor-2.
[agents."team-*"]
roles = ["member"]

# The system: ingest, search, inbox administration, vote commits.
[workers.worker]

# Administration: streams, migrations, identities.
[operators.operator]
"""
