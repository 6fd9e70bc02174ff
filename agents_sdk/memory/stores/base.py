"""Memory stores: the protocol every store keeps, and the registry of store types.

A memory store is a named place an agent's prompt context draws from (and, when
writable, writes turns to): ``conversation`` (long-term memories on a board),
``file`` (chunks of local files, read-only), ``log`` (an append-only board log,
newest first), or any type added with
:func:`~agents_sdk.memory.stores.registry.register_store_type`. Stores are
declared by name in a TOML or YAML file (:mod:`agents_sdk.memory.stores.config`)
or in code, and attached to an agent with rights, ``top_k``, a similarity
threshold and the stages they are read at (:mod:`agents_sdk.memory.attachments`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from agents_sdk.memory.layers import LayerHit
from blackboard.protocol.errors import ConfigurationError

if TYPE_CHECKING:
    from agents_sdk.agent import Agent

__all__ = ["STAGES", "MemoryStore", "Stage", "StoreFactory", "StoreOptions", "StoreSpec", "store_layer",
           "validate_store_name"]

#: When an attached store is read: before planning (``pre``), while planning, while
#: generating the answer, while critiquing it.
Stage = Literal["pre", "plan", "gen", "critique"]
STAGES: Final[tuple[Stage, ...]] = ("pre", "plan", "gen", "critique")

_NAME: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def validate_store_name(name: object) -> str:
    """``name`` if it is a store name: 1-64 of ``[A-Za-z0-9_-]`` (it names board sections).

    Raises:
        ConfigurationError: it is not.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigurationError(f"invalid store name {name!r}: 1-64 characters of A-Z a-z 0-9 _ -")
    return name


def store_layer(name: str) -> str:
    """The ``layer`` of a store's hits: ``store:<name>``."""
    return f"store:{name}"


@runtime_checkable
class MemoryStore(Protocol):
    """What an attached store does.

    Attributes:
        name: Its name (unique among an agent's stores).
        kind: Its type (``conversation``, ``file``, ``log``, or a registered one).
        writable: Whether :meth:`write` stores anything (read-only stores raise).
    """

    name: str
    kind: str
    writable: bool

    async def start(self) -> None:
        """Get ready (index files, start watchers); idempotent."""

    async def close(self) -> None:
        """Stop what :meth:`start` started; idempotent."""

    async def search(self, query: str, top_k: int, threshold: float) -> list[LayerHit]:
        """At most ``top_k`` hits scoring at least ``threshold`` (0..1), best first; each hit's
        ``layer`` is ``store:<name>``."""
        ...

    async def write(self, text: str, metadata: Mapping[str, Any] | None = None) -> str:
        """Store ``text``; returns its id.

        Raises:
            PermissionDeniedError: the store is read-only.
        """
        ...

    def size(self) -> int:
        """How many items it holds, as far as this process knows (see each store)."""
        ...


class StoreOptions(BaseModel):
    """The base of a store type's options: unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True, slots=True)
class StoreSpec:
    """A declared store: what a factory gets to make it.

    Attributes:
        name: The store's name.
        type: Its type's name.
        options: Its options (validated by the type's options model when it has one).
        origin: Where it was declared: ``"<file>:<line>"``, or ``"code"``.
        base_dir: The folder relative paths of its options start from (the config
            file's folder; the working directory for stores declared in code).
    """

    name: str
    type: str
    options: Mapping[str, Any] = field(default_factory=dict)
    origin: str = "code"
    base_dir: Path | None = None


#: Makes a store of a type from its declaration, for an agent.
StoreFactory = Callable[[StoreSpec, "Agent"], MemoryStore]
