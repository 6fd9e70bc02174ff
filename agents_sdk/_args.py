"""Checks of the SDK's public arguments, at the boundary, into the error tree.

Agents driven by LLMs pass whatever they are told: a dict for a section, a
float for a recipient, bytes for metadata. Every public entry point turns a
wrong type into :class:`InvalidKeyError` (names, keys, ids) or
:class:`InvalidPayloadError` (everything else), both ``ValueError``\\ s, never
a raw ``TypeError`` from deep inside. These checks run once per call, before
any IO; the values the schemas check (strings, numbers in range) are left to
the schemas.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from blackboard.protocol.errors import InvalidKeyError, InvalidPayloadError

__all__ = ["mapping_arg", "name_list", "positive_count", "seconds", "sequence_arg", "str_list"]


def _shown(value: Any) -> str:
    """A refused argument as an error shows it: short scalars whole, strings cut,
    containers by their type and size (``repr`` of a value nested thousands deep
    raises RecursionError)."""
    if value is None or isinstance(value, bool | float) or (isinstance(value, int) and value.bit_length() < 64):
        text = repr(value)
    elif isinstance(value, str | bytes):
        text = repr(value[:61])
    else:
        return f"<{type(value).__name__}>"
    return text if len(text) <= 64 else text[:61] + "..."


def sequence_arg(value: Any, what: str) -> list[Any]:
    """``value`` as a list: any iterable but a string, bytes or a mapping.

    Raises:
        InvalidPayloadError: ``value`` is not such a sequence.
    """
    if type(value) is list or type(value) is tuple:  # the common case, without the ABC check
        return list(value)
    if isinstance(value, (str, bytes, bytearray, memoryview, Mapping)):
        raise InvalidPayloadError(f"{what} must be a list, not {type(value).__name__} {_shown(value)}")
    try:
        return list(value)
    except TypeError as exc:
        raise InvalidPayloadError(f"{what} must be a list, not {type(value).__name__} {_shown(value)}") from exc


def str_list(value: Any, what: str) -> list[str]:
    """``value`` as a list of strings (a sequence as :func:`sequence_arg`).

    Raises:
        InvalidPayloadError: not such a sequence, or an item that is not a string.
    """
    items = sequence_arg(value, what)
    for item in items:
        if not isinstance(item, str):
            raise InvalidPayloadError(f"{what} must hold strings, not {type(item).__name__} {_shown(item)}")
    return items


def name_list(value: Any, what: str) -> list[Any]:
    """``value`` as a list of names (checked by the caller): a sequence as :func:`sequence_arg`.

    Raises:
        InvalidKeyError: ``value`` is not such a sequence.
    """
    try:
        return sequence_arg(value, what)
    except InvalidPayloadError as exc:
        raise InvalidKeyError(_shown(value), exc.reason) from exc


def mapping_arg(value: Any, what: str) -> dict[Any, Any]:
    """``value`` as a dict (``None``: empty).

    Raises:
        InvalidPayloadError: ``value`` is not a mapping.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidPayloadError(f"{what} must be a mapping, not {type(value).__name__} {_shown(value)}")
    return dict(value)


def seconds(value: Any, what: str, *, minimum: float = 0.0) -> float:
    """A finite number of seconds of at least ``minimum``.

    Raises:
        InvalidPayloadError: not a number, not finite, or below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidPayloadError(f"{what} must be a number of seconds, not {type(value).__name__} {_shown(value)}")
    try:
        number = float(value)
    except OverflowError as exc:
        raise InvalidPayloadError(f"{what} is out of range: {_shown(value)}") from exc
    if not math.isfinite(number) or number < minimum:
        raise InvalidPayloadError(f"{what} must be a finite number of seconds >= {minimum:g}, not {_shown(value)}")
    return number


def positive_count(value: Any, what: str, *, minimum: int = 1) -> int:
    """An integer of at least ``minimum``.

    Raises:
        InvalidPayloadError: not an integer, or below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidPayloadError(f"{what} must be an integer >= {minimum}, not {_shown(value)}")
    return value
