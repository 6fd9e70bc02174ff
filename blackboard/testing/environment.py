"""The ``BLACKBOARD_*`` environment that gives another process (a worker started by a test
stack, as a child process or in a container) the settings of this one."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

from pydantic import BaseModel, SecretStr
from pydantic_core import to_json

from blackboard.settings import Settings

__all__ = ["settings_env"]

_PREFIX = "BLACKBOARD_"


def _env_value(value: object) -> str:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, str | int | float | Path):
        return str(value)
    return to_json(value).decode()  # lists, dicts, models: pydantic-settings parses JSON


def settings_env(settings: Settings) -> dict[str, str]:
    """The ``BLACKBOARD_<SECTION>__<FIELD>`` variables of every field of ``settings`` that
    differs from its default (secrets in clear: the environment of a child process).

    A field set to None whose default is not None has no variable (the environment cannot
    say None); such a field keeps its default in the other process.
    """
    defaults = Settings.model_construct()
    env: dict[str, str] = {}
    for section_name in type(settings).model_fields:
        section = getattr(settings, section_name)
        default = getattr(defaults, section_name)
        if not isinstance(section, BaseModel):
            continue
        for name in type(section).model_fields:
            value = getattr(section, name)
            if value is None or value == getattr(default, name):
                continue
            env[f"{_PREFIX}{section_name.upper()}__{name.upper()}"] = _env_value(value)
    return env
