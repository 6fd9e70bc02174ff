"""The registry of memory store types: the built-ins (``conversation``, ``file``,
``log``) and those added with :func:`register_store_type`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from agents_sdk.memory.stores import conversation, file, log
from agents_sdk.memory.stores.base import (
    MemoryStore,
    StoreFactory,
    StoreOptions,
    StoreSpec,
    validate_store_name,
)
from blackboard.protocol.errors import ConfigurationError

if TYPE_CHECKING:
    from agents_sdk.agent import Agent

__all__ = ["StoreType", "build_store", "create_store", "register_store_type", "store_type", "store_types"]


@dataclass(frozen=True, slots=True)
class StoreType:
    """A registered store type.

    Attributes:
        name: The type's name (``type = "..."`` in the config file).
        factory: Makes a store from a :class:`StoreSpec` and the agent.
        options: The pydantic model its options are validated with (None: any mapping).
        writable: Whether its stores take writes (``write = true`` attachments).
    """

    name: str
    factory: StoreFactory
    options: type[StoreOptions] | None = None
    writable: bool = True


_TYPES: dict[str, StoreType] = {
    "conversation": StoreType("conversation", conversation.make_store, conversation.ConversationOptions, True),
    "file": StoreType("file", file.make_store, file.FileOptions, False),
    "log": StoreType("log", log.make_store, log.LogOptions, True),
}


def register_store_type(type_name: str, factory: StoreFactory, *, options: type[StoreOptions] | None = None,
                        writable: bool = True, replace: bool = False) -> StoreType:
    """Add a store type, so that config files and :func:`create_store` can name it.

    Args:
        type_name: Its name (a store name: ``[A-Za-z0-9_-]``).
        factory: ``factory(spec, agent) -> MemoryStore``.
        options: The pydantic model of its options (errors point at the config file's lines).
        writable: Whether its stores take writes.
        replace: Replace a type of that name instead of refusing it.

    Raises:
        ConfigurationError: the name is taken (and not ``replace``) or invalid.
    """
    validate_store_name(type_name)
    if type_name in _TYPES and not replace:
        raise ConfigurationError(f"store type {type_name!r} is already registered")
    kind = StoreType(type_name, factory, options, writable)
    _TYPES[type_name] = kind
    return kind


def store_types() -> dict[str, StoreType]:
    """The registered store types by name (the built-ins first)."""
    return dict(_TYPES)


def store_type(type_name: str) -> StoreType:
    """The registered type ``type_name``.

    Raises:
        ConfigurationError: no such type (the message lists the known ones).
    """
    types = store_types()
    if type_name not in types:
        raise ConfigurationError(f"unknown store type {type_name!r}; known: {', '.join(sorted(types))}")
    return types[type_name]


def create_store(agent: Agent, name: str, type: str, *, base_dir: Path | None = None,
                 **options: Any) -> MemoryStore:
    """Make a store of a registered type in code (``create_store(agent, "notes",
    "conversation", board="team")``).

    Raises:
        ConfigurationError: an invalid name, an unknown type or invalid options.
    """
    spec = StoreSpec(validate_store_name(name), type, options, "code", base_dir)
    return build_store(spec, agent)


def build_store(spec: StoreSpec, agent: Agent) -> MemoryStore:
    """Make the store ``spec`` declares (its options validated first).

    Raises:
        ConfigurationError: an unknown type or invalid options.
    """
    kind = store_type(spec.type)
    if kind.options is not None:
        try:
            kind.options.model_validate(dict(spec.options))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "options"
            raise ConfigurationError(f"{spec.origin}: store {spec.name!r} ({spec.type}): {where}: "
                                     f"{first['msg']}") from exc
    return kind.factory(spec, agent)
