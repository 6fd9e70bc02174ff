"""Helpers shared by every service that runs its work in a task group.

The SDK's task hosts, the worker and the search service all report a failed
start as one error, not as the :class:`ExceptionGroup` a task group raises:
:func:`first_error` is that one rule.
"""

from __future__ import annotations

__all__ = ["first_error"]


def first_error(exc: BaseException) -> BaseException:
    """The error a task group failed with: its first leaf (``exc`` itself if it is no group)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
