"""Run the two members: each turn is one member resuming the shared thread from the board.

:func:`run_turn` is one member's turn (connect as its agent, resume the thread if its node
is next); :func:`run_team` runs both members in one process, turn after turn, and reads the
result back: the thread's history with who wrote each checkpoint, the findings and the
approved notes in the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.types import StateSnapshot

from agents_sdk import Agent
from agents_sdk.langgraph import BlackboardSaver, BlackboardStore
from blackboard.protocol.errors import NotConnectedError
from blackboard.settings import Settings
from examples.langgraph_team.graph import NODES_OF, Member, Role, build_graph, topic_key

__all__ = ["TeamConfig", "TeamResult", "TurnResult", "member_id", "run_team", "run_turn"]

ROLES: tuple[Role, ...] = ("researcher", "writer")


@dataclass(frozen=True)
class TeamConfig:
    """What to work on and where."""

    topic: str = "the blackboard"
    #: Team name: the agent ids' prefix (``<team>-researcher``, ``<team>-writer``) and the
    #: thread id. None: ``team-<random>``.
    team: str | None = None
    checkpoint_board: str = "langgraph-checkpoints"
    store_board: str = "langgraph"
    timeout: float = 60.0
    connect_timeout: float = 10.0


def member_id(team: str, role: Role) -> str:
    """The agent id of a member (the dev policy declares ``team-*``)."""
    return f"{team}-{role}"


@dataclass(frozen=True)
class TurnResult:
    """One member's turn: the nodes it ran, and the node the thread waits on next (None: done)."""

    role: Role
    ran: tuple[str, ...]
    next: str | None


@dataclass
class TeamResult:
    """What the team did, read back from the board."""

    team: str
    topic: str
    draft: str = ""
    approved: bool = False
    #: (step, node that wrote it or the source, author) of each checkpoint, newest first.
    history: list[tuple[int, str, str | None]] = field(default_factory=list)
    facts: list[dict[str, Any]] = field(default_factory=list)
    notes: dict[str, Any] | None = None
    transcript: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        lines = [f"team {self.team}, topic {self.topic!r}", f"draft: {self.draft}",
                 "history (newest first): step, what, written by"]
        lines += [f"  {step:>3}  {what:<9} {author}" for step, what, author in self.history]
        lines.append(f"facts in the store: {len(self.facts)}; notes approved by: "
                     f"{(self.notes or {}).get('approved_by')}")
        lines += [f"problem: {p}" for p in self.problems]
        lines.append("result: OK" if self.ok else "result: FAILED")
        return "\n".join(lines)


def _thread(team: str) -> RunnableConfig:
    return {"configurable": {"thread_id": team}}


def _produced(history: list[StateSnapshot]) -> list[tuple[StateSnapshot, str]]:
    """Each checkpoint of a history (newest first) with what made it: the node its parent
    waited on, or ``input`` for the first."""
    return [(child, ",".join(parent.next) if parent is not None else "input")
            for child, parent in zip(history, [*history[1:], None], strict=True)]


def _step(snapshot: StateSnapshot) -> int:
    return int((snapshot.metadata or {}).get("step", -2))


async def _turn(agent: Agent, role: Role, team: str, config: TeamConfig) -> TurnResult:
    """Resume the thread as ``agent`` if the node it waits on is the member's (the researcher
    starts a new thread)."""
    saver = BlackboardSaver(agent, board=config.checkpoint_board)
    store = BlackboardStore(agent, board=config.store_board)
    graph = build_graph(Member(agent.id, role), saver=saver, store=store)
    thread = _thread(team)
    state = await graph.aget_state(thread)
    waiting = state.next[0] if state.next else (None if state.values else "research")
    if waiting is None or waiting not in NODES_OF[role]:
        return TurnResult(role, (), waiting)
    await graph.ainvoke(None if state.values else {"topic": config.topic}, thread)
    history = [s async for s in graph.aget_state_history(thread)]
    ran = tuple(what for s, what in reversed(_produced(history)) if _step(s) > _step(state) and what != "input")
    return TurnResult(role, ran, history[0].next[0] if history and history[0].next else None)


async def _connect(agent_id: str, settings: Settings, config: TeamConfig,
                   stack: contextlib.AsyncExitStack) -> Agent:
    try:
        return await asyncio.wait_for(stack.enter_async_context(Agent.connect(agent_id, settings=settings)),
                                      config.connect_timeout)
    except TimeoutError:
        raise NotConnectedError(f"no NATS server answered at {settings.nats.url} within "
                                f"{config.connect_timeout:g}s") from None


async def run_turn(settings: Settings, config: TeamConfig, role: Role) -> TurnResult:
    """One member's turn in its own process: connect as ``<team>-<role>``, resume the thread
    if its node is next (the researcher starts a new thread), return what it ran.

    Raises:
        ValueError: no ``config.team`` (a turn continues a named team).
        NotConnectedError, AuthenticationError: as :meth:`agents_sdk.Agent.connect`.
    """
    if not config.team:
        raise ValueError("a turn needs the team's name (--team)")
    async with contextlib.AsyncExitStack() as stack:
        agent = await _connect(member_id(config.team, role), settings, config, stack)
        return await _turn(agent, role, config.team, config)
    raise AssertionError("unreachable")  # pragma: no cover


async def run_team(settings: Settings, config: TeamConfig, *,
                   echo: Callable[[str], None] | None = print) -> TeamResult:
    """Run both members in this process, turn after turn, until the thread is done.

    Raises:
        TimeoutError: the run took longer than ``config.timeout``.
        NotConnectedError, AuthenticationError: as :meth:`agents_sdk.Agent.connect`.
    """
    team = config.team or f"team-{uuid.uuid4().hex[:6]}"
    result = TeamResult(team=team, topic=config.topic)
    started = time.monotonic()

    def log(who: str, text: str) -> None:
        line = f"{time.monotonic() - started:6.2f}s {who:<10} {text}"
        result.transcript.append(line)
        if echo is not None:
            echo(line)

    async with contextlib.AsyncExitStack() as stack:
        agents = {role: await _connect(member_id(team, role), settings, config, stack) for role in ROLES}
        log("team", f"{team} on {settings.nats.url}: checkpoints on board {config.checkpoint_board!r}, "
                    f"store on board {config.store_board!r}")
        async with asyncio.timeout(config.timeout):
            waiting: str | None = "research"
            while waiting is not None:
                role = next(r for r in ROLES if waiting in NODES_OF[r])
                log(role, f"resumes thread {team} at {waiting!r} as {agents[role].id}")
                turn = await _turn(agents[role], role, team, config)
                log(role, f"ran {', '.join(turn.ran) or 'nothing'}; "
                          + (f"the thread waits on {turn.next!r}" if turn.next else "the thread is done"))
                if not turn.ran:
                    result.problems.append(f"{role} could not run {waiting!r}")
                    break
                waiting = turn.next
        await _read_back(agents["writer"], team, config, result)
    return result


async def _read_back(agent: Agent, team: str, config: TeamConfig, result: TeamResult) -> None:
    saver = BlackboardSaver(agent, board=config.checkpoint_board)
    store = BlackboardStore(agent, board=config.store_board)
    graph = build_graph(Member(agent.id, "writer"), saver=saver, store=store)
    thread = _thread(team)
    final = await graph.aget_state(thread)
    result.draft = str(final.values.get("draft", ""))
    result.approved = bool(final.values.get("approved"))
    history = [s async for s in graph.aget_state_history(thread)]
    for snapshot, what in _produced(history):
        result.history.append((_step(snapshot), what, await saver.aget_author(snapshot.config)))
    result.facts = [dict(item.value) for item in await store.asearch(("facts", topic_key(config.topic)), limit=100)]
    notes = await store.aget(("notes", topic_key(config.topic)), "final")
    result.notes = dict(notes.value) if notes is not None else None
    result.problems += team_problems(result, team)


def team_problems(result: TeamResult, team: str) -> list[str]:
    """What is wrong with a finished run (nothing: an empty list)."""
    problems: list[str] = []
    if not result.approved:
        problems.append("the draft was not approved")
    expected = {"research": member_id(team, "researcher"), "write": member_id(team, "writer"),
                "review": member_id(team, "researcher")}
    for step, what, author in result.history:
        if what in expected and author != expected[what]:
            problems.append(f"step {step} ({what}) was written by {author}, not {expected[what]}")
    if sorted(what for _, what, _ in result.history if what in expected) != sorted(expected):
        problems.append(f"the history does not hold one research, write and review: {result.history}")
    if len(result.facts) != 3 or any(f.get("by") != member_id(team, "researcher") for f in result.facts):
        problems.append(f"the store does not hold the researcher's three findings: {result.facts}")
    if not result.notes or result.notes.get("text") != result.draft:
        problems.append("the approved notes are not in the store")
    return problems
