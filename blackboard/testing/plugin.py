"""The pytest plugin of ``blackboard.testing`` (entry point ``pytest11``: ``blackboard``), loaded
by pytest wherever blackboard is installed. Its fixtures, all named ``blackboard_*``:

``blackboard_stack``          the session's :class:`~blackboard.testing.Stack` (started on first use)
``blackboard_settings``       an agent's settings for it (credentials issued by its authority)
``blackboard_agent``          ``async with blackboard_agent("alice") as agent``: a connected agent
``blackboard_board``          a board name of the test's own
``blackboard_stack_factory``  private stacks (a 3-node cluster, a stack a test kills parts of)
``blackboard_mode``           ``embedded`` or ``containers``
``blackboard_base_settings``  the settings every stack starts from (override it in a conftest)

The mode comes from ``--blackboard-mode``, else the ``blackboard_mode`` ini option, else
``BLACKBOARD_CONTAINERS__MODE`` (``Settings.containers.mode``; default ``embedded``). A stack
that cannot start (no Docker engine, an image missing) is an error of the tests that use it,
with the reason: never a skip. The ``containers`` marker is registered for tests that need
the containers mode (``-m containers`` / ``-m "not containers"``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import pytest

from blackboard.settings import Settings
from blackboard.testing.modes import make_stack
from blackboard.testing.stack import Stack, StackMode

if TYPE_CHECKING:
    from agents_sdk import Agent

__all__ = [
    "blackboard_agent",
    "blackboard_base_settings",
    "blackboard_board",
    "blackboard_mode",
    "blackboard_settings",
    "blackboard_stack",
    "blackboard_stack_factory",
]

_MODES = ("embedded", "containers")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("blackboard", "blackboard test stacks (blackboard.testing)")
    group.addoption("--blackboard-mode", choices=_MODES, default=None,
                    help="run the blackboard_* fixtures' stacks as embedded processes or containers "
                         "(default: the blackboard_mode ini option, else BLACKBOARD_CONTAINERS__MODE, "
                         "else embedded)")
    parser.addini("blackboard_mode", "embedded or containers: how blackboard_stack runs its servers",
                  default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "containers: runs blackboard stacks in containers (a Docker engine and the images of "
                   "Settings.containers); -m 'not containers' leaves them out")


_SWEPT: list[bool] = []


def _sweep_once() -> None:
    """Remove, once a session, the containers that runs killed on this host left behind."""
    if not _SWEPT:
        from blackboard.testing.containers import sweep_containers

        sweep_containers()
        _SWEPT.append(True)


@pytest.fixture(scope="session")
def blackboard_base_settings() -> Settings:
    """The settings every stack starts from: the environment's (``BLACKBOARD_*``). Override this
    fixture to give the stacks' workers and agents other settings (a model, a bucket, ...)."""
    return Settings()


@pytest.fixture(scope="session")
def blackboard_mode(request: pytest.FixtureRequest, blackboard_base_settings: Settings) -> StackMode:
    """How this session's stacks run: ``--blackboard-mode``, the ini option, the settings."""
    chosen = request.config.getoption("--blackboard-mode") or request.config.getini("blackboard_mode")
    if chosen and chosen not in _MODES:
        raise pytest.UsageError(f"blackboard_mode must be one of {', '.join(_MODES)}, not {chosen!r}")
    return cast(StackMode, chosen or blackboard_base_settings.containers.mode)


@pytest.fixture(scope="session")
def blackboard_stack(blackboard_mode: StackMode, blackboard_base_settings: Settings) -> Iterator[Stack]:
    """The session's stack: one NATS node, PostgreSQL + pgvector and a worker, ready."""
    if blackboard_mode == "containers":
        _sweep_once()
    stack = make_stack(blackboard_mode, settings=blackboard_base_settings).start()
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def blackboard_settings(blackboard_stack: Stack) -> Settings:
    """An agent's settings for the session's stack."""
    return blackboard_stack.settings()


@pytest.fixture
def blackboard_agent(blackboard_stack: Stack) -> Callable[..., contextlib.AbstractAsyncContextManager[Agent]]:
    """``blackboard_agent(agent_id=None, **connect_options)``: ``Agent.connect`` to the session's
    stack, for ``async with`` (a unique id when none is given)."""
    return blackboard_stack.agent


@pytest.fixture
def blackboard_board() -> str:
    """A board name no other test uses."""
    return f"board-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def blackboard_stack_factory(blackboard_mode: StackMode,
                             blackboard_base_settings: Settings) -> Iterator[Callable[..., Stack]]:
    """``blackboard_stack_factory(nats_nodes=1, worker=True, policy=None, mode=None)``: a private
    stack, started (ready), stopped when the test ends."""
    stacks: list[Stack] = []

    def make(*, mode: StackMode | None = None, **options: Any) -> Stack:
        options.setdefault("settings", blackboard_base_settings)
        if (mode or blackboard_mode) == "containers":
            _sweep_once()
        stack = make_stack(mode or blackboard_mode, **options)
        stacks.append(stack)
        return stack.start()

    try:
        yield make
    finally:
        for stack in reversed(stacks):
            stack.stop()
