"""A stack of either mode, by name."""

from __future__ import annotations

from typing import Any

from blackboard.testing.stack import Stack, StackMode

__all__ = ["make_stack"]


def make_stack(mode: StackMode, **options: Any) -> Stack:
    """A new, not yet started stack of ``mode`` (``options``: those of :class:`Stack`)."""
    if mode == "containers":
        from blackboard.testing.containers import ContainerStack

        return ContainerStack(**options)
    from blackboard.testing.embedded import EmbeddedStack

    return EmbeddedStack(**options)
