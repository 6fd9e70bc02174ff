"""Run the team: connect three agents, run them concurrently, check and summarise the outcome."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agents_sdk import Agent, NotConnectedError, NotFoundError
from blackboard.protocol.errors import ConfigurationError
from blackboard.settings import Settings
from examples.team.agents import FINAL, FINAL_KEY, TASKS, Actor, Planner, Transcript, outcome_fields
from examples.team.policy import LLMPolicy, Policy, ScriptedPolicy, llm_configured

__all__ = ["PolicyChoice", "TeamConfig", "TeamResult", "open_policy", "run_team", "task_problems"]

PolicyChoice = Literal["auto", "scripted", "llm"]
ACTOR_STYLES = ("bullets", "paragraph")


@dataclass(frozen=True, slots=True)
class TeamConfig:
    """What the team works on and how long it may take."""

    goal: str = "release notes for blackboard 0.1"
    tasks: int = 4
    #: Team name: the board's name and the agent ids' prefix (default ``team-<random>``,
    #: so runs against a long-lived server never see each other's inboxes).
    team: str | None = None
    #: Seconds the whole run may take.
    timeout: float = 120.0
    #: Seconds any single wait (a message, a view update, a reply) may take.
    step_timeout: float = 30.0
    #: Seconds to wait for NATS when connecting each agent.
    connect_timeout: float = 10.0
    policy: PolicyChoice = "auto"


@dataclass
class TeamResult:
    """What happened, as checked on the board afterwards."""

    team: str
    policy: str
    #: Final value of every task entry, by id.
    tasks: dict[str, dict[str, Any]]
    #: Tasks each actor completed, by actor name.
    done_by: dict[str, list[str]]
    conflicts: int
    proposal_id: str | None
    outcome_status: str
    accepted: Any
    #: The value of ``final/notes`` on the board after the vote.
    committed: Any
    #: Short-term memory steps per member.
    memory_steps: dict[str, int]
    #: Prompts built per member and the largest one, in characters.
    prompts: dict[str, tuple[int, int]]
    transcript: list[str]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every task done exactly once, the vote accepted and its value committed."""
        return not self.problems

    def summary(self) -> str:
        """A few lines for people."""
        lines = [f"team {self.team} ({self.policy} policy): {len(self.tasks)} tasks, "
                 f"{sum(len(v) for v in self.done_by.values())} completions, {self.conflicts} CAS conflicts"]
        for actor, ids in sorted(self.done_by.items()):
            lines.append(f"  {actor}: {', '.join(ids) or '-'}")
        lines.append(f"  vote {self.proposal_id}: {self.outcome_status}; final/notes "
                     + ("committed" if self.committed is not None and self.committed == self.accepted
                        else "NOT committed"))
        lines.append("  memory steps: " + ", ".join(f"{k} {v}" for k, v in sorted(self.memory_steps.items()))
                     + "; prompts: " + ", ".join(f"{k} {n} (max {m} chars)"
                                                 for k, (n, m) in sorted(self.prompts.items())))
        if isinstance(self.committed, str):
            lines.append("accepted notes:")
            lines.extend("  | " + line for line in self.committed.splitlines())
        lines.append("result: " + ("OK" if self.ok else "FAILED: " + "; ".join(self.problems)))
        return "\n".join(lines)


def task_problems(histories: Mapping[str, Sequence[Mapping[str, Any] | None]]) -> list[str]:
    """Check each task's revisions: exactly ``open -> claimed -> done``, by one assignee.

    ``histories`` maps a task id to its values oldest first (``None`` for a deletion).
    """
    problems = []
    for task_id, values in sorted(histories.items()):
        states = [v.get("state") if v is not None else "deleted" for v in values]
        if states != ["open", "claimed", "done"]:
            problems.append(f"{task_id}: states {states}, expected open, claimed, done")
            continue
        claimed, done = values[1], values[2]
        assert claimed is not None and done is not None
        if claimed.get("assignee") != done.get("assignee") or not done.get("result"):
            problems.append(f"{task_id}: claimed by {claimed.get('assignee')}, done by {done.get('assignee')}")
    return problems


@contextlib.asynccontextmanager
async def open_policy(settings: Settings, choice: PolicyChoice) -> AsyncIterator[Policy]:
    """The scripted policy, or the LLM one when chosen (``auto``: when an LLM is configured).

    Raises:
        ConfigurationError: ``llm`` chosen but no API key or base URL is configured.
    """
    use_llm = choice == "llm" or (choice == "auto" and llm_configured(settings.llm))
    if not use_llm:
        yield ScriptedPolicy()
        return
    if not llm_configured(settings.llm):
        raise ConfigurationError("the llm policy needs BLACKBOARD_LLM__API_KEY or BLACKBOARD_LLM__BASE_URL")
    async with LLMPolicy.from_settings(settings.llm) as policy:
        yield policy


async def run_team(settings: Settings, config: TeamConfig = TeamConfig(), *,
                   echo: Callable[[str], None] | None = print, policy: Policy | None = None) -> TeamResult:
    """Run a planner and two actors on a fresh board until the vote is done.

    Args:
        settings: where NATS is (``settings.nats.url``) and the LLM settings.
        config: the goal, the number of tasks, names and time limits.
        echo: called with each transcript line as it happens (None: quiet).
        policy: overrides the policy chosen by ``config.policy``.

    Raises:
        TimeoutError: the run took longer than ``config.timeout``.
        NotConnectedError: NATS is unreachable (within ``config.connect_timeout``).
        ConfigurationError: the LLM policy is chosen but not configured.
    """
    team = config.team or f"team-{uuid.uuid4().hex[:6]}"
    transcript = Transcript(echo=echo)
    async with contextlib.AsyncExitStack() as stack:
        if policy is None:
            policy = await stack.enter_async_context(open_policy(settings, config.policy))
        ids = {name: f"{team}-{name}" for name in ("planner", "actor-1", "actor-2")}
        agents: dict[str, Agent] = {}
        for name, agent_id in ids.items():
            try:
                agents[name] = await asyncio.wait_for(
                    stack.enter_async_context(Agent.connect(agent_id, settings=settings)), config.connect_timeout)
            except TimeoutError:
                raise NotConnectedError(f"no NATS server answered at {settings.nats.url} within "
                                        f"{config.connect_timeout:g}s") from None
        common: dict[str, Any] = {"step_timeout": config.step_timeout}
        planner = Planner(agents["planner"], "planner", team, policy, transcript, goal=config.goal,
                          n_tasks=config.tasks, actors=[ids["actor-1"], ids["actor-2"]], **common)
        actors = [Actor(agents[name], name, team, policy, transcript, planner=ids["planner"], style=style, **common)
                  for name, style in zip(("actor-1", "actor-2"), ACTOR_STYLES, strict=True)]
        transcript.log("team", "start", f"team {team} on {settings.nats.url}, {policy.name} policy, "
                       f"goal: {config.goal}")
        try:
            async with asyncio.timeout(config.timeout), asyncio.TaskGroup() as tg:
                tg.create_task(planner.run(), name="planner")
                for actor in actors:
                    tg.create_task(actor.run(), name=actor.name)
        except ExceptionGroup as group:  # one member failed (the others were cancelled): raise its error
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        return await _result(team, policy, planner, actors, transcript)
    raise AssertionError("unreachable")  # pragma: no cover  (mypy: the exit stack may swallow)


async def _result(team: str, policy: Policy, planner: Planner, actors: Sequence[Actor],
                  transcript: Transcript) -> TeamResult:
    board = planner.board
    histories: dict[str, list[dict[str, Any] | None]] = {}
    tasks: dict[str, dict[str, Any]] = {}
    for task in planner.plan:
        revisions = await board.history(TASKS, task.id)
        histories[task.id] = [dict(e.value) if not e.deleted else None for e in revisions]
        tasks[task.id] = dict(revisions[-1].value) if revisions and not revisions[-1].deleted else {}
    problems = task_problems(histories)
    done_by = {a.name: list(a.done) for a in actors}
    completions = sorted(t for ids in done_by.values() for t in ids)
    if completions != sorted(histories):
        problems.append(f"completions {completions} do not match the tasks {sorted(histories)}")
    status, accepted = outcome_fields(planner.outcome)
    try:
        committed = (await board.get(FINAL, FINAL_KEY)).value
    except NotFoundError:
        committed = None
    if status != "accepted":
        problems.append(f"the vote ended {status!r}")
    elif committed != accepted:
        problems.append("the accepted draft is not on the board at final/notes")
    members = [planner, *actors]
    return TeamResult(
        team=team, policy=policy.name, tasks=tasks, done_by=done_by, conflicts=sum(a.conflicts for a in actors),
        proposal_id=planner.proposal_id, outcome_status=status, accepted=accepted, committed=committed,
        memory_steps={m.name: len(m.memory) for m in members},
        prompts={m.name: (len(m.prompt_costs), max(m.prompt_costs, default=0)) for m in members},
        transcript=list(transcript.lines), problems=problems,
    )
