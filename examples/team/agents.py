"""The three team members: a planner and two actors.

Each member is one :class:`~agents_sdk.Agent` with its own short-term memory
(every step: action, arguments, observation, result), a working memory (its
goal and focus), a live view of the team's board, and a mailbox on its durable
inbox. Before each decision it renders a prompt from its memories and its view
(``build_prompt``) and asks its :class:`~examples.team.policy.Policy`.

Board layout (board = the team's name):

* ``plan/current``: the goal and the task ids (planner);
* ``tasks/<id>``: ``{"id", "title", "state": open|claimed|done, "assignee", "result"}``;
  actors claim with compare-and-set, so no task is taken twice;
* ``drafts/<actor>``: each actor's draft of the final notes;
* ``final/notes``: the draft the team voted for (committed by the vote).

Messages: actors tell the planner ``ready`` (direct), the planner broadcasts
``plan-ready``, actors report ``task-done`` (direct), the planner asks each
actor for a ``draft`` (request/reply), broadcasts ``vote-open`` and, at the
end, ``team-done``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents_sdk import Agent, ConflictError
from agents_sdk.memory import (
    PromptBudget,
    PromptContext,
    ShortTermMemory,
    WorkingMemory,
    build_prompt,
)
from agents_sdk.messaging.inbox import Message
from agents_sdk.view import View
from blackboard.protocol.errors import OperationTimeoutError, ProposalClosedError, VoteError
from blackboard.protocol.schemas import Outcome
from examples.team.policy import DECISION_MARKER, Decision, OpenTask, Policy, TaskSpec

__all__ = ["Actor", "Mailbox", "Member", "Planner", "Transcript", "outcome_fields", "reached"]

TASKS = "tasks"
PLAN = "plan"
DRAFTS = "drafts"
FINAL = "final"
FINAL_KEY = "notes"


def reached(section: str, key: str, revision: int) -> Callable[[View], bool]:
    """A view predicate: the entry is at ``revision`` or later (deleted keys never are)."""

    def check(view: View) -> bool:
        entry = view.get(section, key)
        return entry is not None and entry.revision >= revision

    return check


# ------------------------------------------------------------------ transcript
@dataclass
class Transcript:
    """What the team did, one line per event, in the order it happened."""

    echo: Callable[[str], None] | None = None
    lines: list[str] = field(default_factory=list)
    events: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    _t0: float = field(default_factory=time.monotonic)

    def log(self, who: str, event: str, text: str, **data: Any) -> None:
        """Record ``event`` by ``who`` (``data`` is kept for the checks, ``text`` is shown)."""
        line = f"{time.monotonic() - self._t0:7.3f}s  {who:<8} {text}"
        self.lines.append(line)
        self.events.append((who, event, data))
        if self.echo is not None:
            self.echo(line)

    def of(self, event: str) -> list[tuple[str, dict[str, Any]]]:
        """The ``(who, data)`` of every event named ``event``."""
        return [(who, data) for who, ev, data in self.events if ev == event]


# --------------------------------------------------------------------- mailbox
class Mailbox:
    """Reads the agent's durable inbox in the background and sorts messages by type.

    ``await mailbox.get("task-done", timeout=10)`` returns the next message of
    that type; the caller acknowledges it (``await msg.ack()``) once handled.
    """

    def __init__(self, agent: Agent) -> None:
        self._agent = agent
        self._queues: defaultdict[str, asyncio.Queue[Message]] = defaultdict(asyncio.Queue)
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Mailbox:
        self._task = asyncio.create_task(self._run(), name=f"mailbox:{self._agent.id}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        async with self._agent.inbox() as inbox:
            async for msg in inbox:
                self._queues[msg.type].put_nowait(msg)

    async def get(self, type: str, timeout: float) -> Message:
        """The next message of ``type``.

        Raises:
            OperationTimeoutError: none within ``timeout`` seconds.
        """
        assert self._task is not None, "use the mailbox as an async context manager"
        getter = asyncio.ensure_future(self._queues[type].get())
        done, _ = await asyncio.wait({getter, self._task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            return getter.result()
        getter.cancel()
        if self._task in done:
            self._task.result()  # raises the reader's error
            raise OperationTimeoutError(f"the inbox of {self._agent.id} closed")
        raise OperationTimeoutError(f"{self._agent.id}: no {type!r} message within {timeout:g}s")


# ---------------------------------------------------------------------- member
class Member:
    """What every team member has: agent, board, memories, view, mailbox and policy."""

    role = "member"
    system = "You are a member of a small team of agents that coordinate through a shared board."

    def __init__(self, agent: Agent, name: str, board: str, policy: Policy, transcript: Transcript, *,
                 step_timeout: float = 30.0, prompt_chars: int = 12_000) -> None:
        self.agent = agent
        self.name = name
        self.board = agent.board(board)
        self.policy = policy
        self.transcript = transcript
        self.step_timeout = step_timeout
        self.memory = ShortTermMemory(max_items=1000)
        self.working = WorkingMemory()
        self.budget = PromptBudget(max_chars=prompt_chars)
        self.mailbox = Mailbox(agent)
        self._view: View | None = None
        #: Characters of every prompt this member built.
        self.prompt_costs: list[int] = []

    @property
    def view(self) -> View:
        assert self._view is not None, "the member is not started"
        return self._view

    async def open_view(self) -> None:
        """A live view of the whole team board (snapshot loaded on return)."""
        self._view = await self.board.view()

    def _short(self, agent_id: str) -> str:
        """A teammate's short name (agent ids are ``<team>-<name>``; the board is named after the team)."""
        return agent_id.removeprefix(self.board.name + "-")

    def say(self, event: str, text: str, **data: Any) -> None:
        self.transcript.log(self.name, event, text, **data)

    def prompt(self, decision: str, instruction: str) -> PromptContext:
        """This member's context for one decision: working memory, board view, recent steps."""
        ctx = build_prompt(system=self.system, task=f"{DECISION_MARKER} {decision}\n{instruction}",
                           working=self.working, history=self.memory, board=self.view.entries(),
                           budget=self.budget, recent_steps=8, max_field_chars=600)
        self.prompt_costs.append(ctx.cost)
        return ctx

    def record(self, action: str, arguments: Mapping[str, Any], observation: Any, result: Any,
               decision: Decision[Any] | None = None, prompt: PromptContext | None = None, **extra: Any) -> None:
        """Add one step to short-term memory."""
        if decision is not None:
            extra["policy"] = decision.source
            if decision.note:
                extra["error"] = decision.note
        if prompt is not None:
            extra["cost"] = {"prompt_chars": prompt.cost}
        self.memory.add(action=action, arguments=dict(arguments), observation=observation, result=result,
                        tags=[self.role, action], **extra)

    def tasks(self) -> dict[str, dict[str, Any]]:
        """The tasks as this member's view shows them, by id."""
        return {e.key: dict(e.value) for e in self.view.entries()
                if e.section == TASKS and isinstance(e.value, dict)}

    async def cast_vote(self, proposal_id: str, task_ids: Sequence[str], candidates: Sequence[str]) -> None:
        """Decide and cast this member's ballot (a settled proposal refuses late ballots)."""
        prompt = self.prompt("vote", "Vote for the draft of the release notes the team should publish.\n"
                             + "\n".join(f"Candidate {i}:\n{c}" for i, c in enumerate(candidates)))
        decision = await self.policy.vote(prompt, self.agent.id, task_ids, candidates)
        choice = decision.value
        try:
            receipt = await self.board.vote(proposal_id, choice.index, reason=choice.reason, index=True)
        except VoteError as exc:  # e.g. ProposalClosedError: two ballots already decided it
            self.record("vote", {"proposal": proposal_id, "choice": choice.index}, f"not counted: {exc}",
                        "late", decision, prompt)
            why = "the vote was already decided" if isinstance(exc, ProposalClosedError) else str(exc)
            self.say("vote-late", f"ballot for candidate {choice.index} not counted: {why} ({type(exc).__name__})")
            return
        self.record("vote", {"proposal": proposal_id, "choice": choice.index}, choice.reason, "cast",
                    decision, prompt)
        self.say("vote", f"votes for candidate {choice.index}: {choice.reason}"
                 + (" (this ballot decided it)" if receipt.decided else ""), choice=choice.index)


# --------------------------------------------------------------------- planner
class Planner(Member):
    """Plans the tasks, follows their completion, collects drafts and runs the vote."""

    role = "planner"
    system = ("You are the planner of a team of agents. You split the goal into tasks that two actors "
              "carry out, and the team votes on the final release notes.")

    def __init__(self, agent: Agent, name: str, board: str, policy: Policy, transcript: Transcript, *,
                 goal: str, n_tasks: int, actors: Sequence[str], **kwargs: Any) -> None:
        super().__init__(agent, name, board, policy, transcript, **kwargs)
        self.goal = goal
        self.n_tasks = n_tasks
        self.actors = list(actors)
        self.plan: list[TaskSpec] = []
        self.completed: dict[str, str] = {}
        self.proposal_id: str | None = None
        self.candidates: list[str] = []
        self.outcome: Outcome | None = None

    async def run(self) -> None:
        """The planner's whole part, start to finish."""
        self.working.set_goal(self.goal, ttl=None)
        await self.open_view()
        async with self.mailbox:
            await self._wait_for_actors()
            await self._make_plan()
            await self._follow_tasks()
            drafts = await self._collect_drafts()
            await self._run_vote(drafts)

    async def _wait_for_actors(self) -> None:
        ready: set[str] = set()
        while len(ready) < len(self.actors):
            msg = await self.mailbox.get("ready", self.step_timeout)
            ready.add(msg.sender)
            self.record("receive", {"type": "ready", "from": msg.sender}, msg.body, f"{len(ready)} ready")
            await msg.ack()
        self.say("ready", f"{len(ready)} actors ready")

    async def _make_plan(self) -> None:
        self.working.set_focus("planning")
        prompt = self.prompt("plan", f"Split the goal into {self.n_tasks} independent tasks.\nGoal: {self.goal}")
        decision = await self.policy.plan(prompt, self.goal, self.n_tasks)
        self.plan = decision.value
        for task in self.plan:
            await self.board.create(TASKS, task.id, {"id": task.id, "title": task.title, "state": "open",
                                                     "assignee": None, "result": None})
        ids = [t.id for t in self.plan]
        await self.board.put(PLAN, "current", {"goal": self.goal, "tasks": ids, "planner": self.agent.id})
        self.record("plan", {"goal": self.goal, "n_tasks": self.n_tasks}, decision.note or "plan written",
                    ids, decision, prompt)
        for task in self.plan:
            self.say("task", f"created {task.id}: {task.title}", task=task.id)
        sent = await self.board.broadcast("plan-ready", {"tasks": ids, "goal": self.goal})
        self.record("broadcast", {"type": "plan-ready"}, f"stored at seq {sent.seq}", ids)
        self.say("broadcast", f"plan-ready ({len(ids)} tasks)")

    async def _follow_tasks(self) -> None:
        self.working.set_focus("following the tasks")
        ids = {t.id for t in self.plan}
        while set(self.completed) < ids:
            msg = await self.mailbox.get("task-done", self.step_timeout)
            task_id, revision = str(msg.body["task"]), int(msg.body["revision"])
            # The report may overtake the watch: wait until the view has the revision it names.
            await self.view.wait_for(reached(TASKS, task_id, revision), self.step_timeout)
            entry = self.view.get(TASKS, task_id)
            assert entry is not None
            ok = entry.value.get("state") == "done" and entry.value.get("assignee") == msg.sender
            self.completed[task_id] = msg.sender
            self.record("receive", {"type": "task-done", "from": msg.sender, "task": task_id},
                        entry.value.get("result"), "verified" if ok else "MISMATCH")
            self.say("done", f"{task_id} reported done by {self._short(msg.sender)}"
                     + ("" if ok else " (board disagrees!)"), task=task_id, by=msg.sender, ok=ok)
            await msg.ack()

    async def _collect_drafts(self) -> list[str]:
        self.working.set_focus("collecting drafts")
        ids = [t.id for t in self.plan]
        replies = await asyncio.gather(*(self.agent.request(a, "draft", {"tasks": ids}, timeout=self.step_timeout)
                                         for a in self.actors))
        drafts = [str(r["draft"]) for r in replies]
        for actor, draft in zip(self.actors, drafts, strict=True):
            self.record("request", {"type": "draft", "to": actor}, f"{len(draft)} characters", "received")
            self.say("draft", f"draft from {self._short(actor)} ({len(draft)} characters)")
        return drafts

    async def _run_vote(self, drafts: Sequence[str]) -> None:
        self.working.set_focus("voting on the final notes")
        self.candidates = list(dict.fromkeys(drafts))  # distinct, in actor order
        ids = [t.id for t in self.plan]
        voters = [self.agent.id, *self.actors]
        handle = await self.board.propose(FINAL, FINAL_KEY, candidates=self.candidates, voters=voters,
                                          policy="majority", question="Which draft becomes the release notes?",
                                          proposal_id="final-notes")
        self.proposal_id = handle.id
        self.record("propose", {"section": FINAL, "key": FINAL_KEY, "candidates": len(self.candidates),
                                "voters": voters}, f"proposal {handle.id}", "open")
        self.say("propose", f"proposal {handle.id}: {len(self.candidates)} candidates, majority of {len(voters)}")
        await self.board.broadcast("vote-open", {"proposal": handle.id, "candidates": self.candidates, "tasks": ids})
        await self.cast_vote(handle.id, ids, self.candidates)
        outcome = await handle.outcome(timeout=self.step_timeout)
        self.outcome = outcome
        status, value = outcome_fields(outcome)
        self.record("outcome", {"proposal": handle.id}, status, value)
        self.say("outcome", f"proposal {handle.id} {status}"
                 + (f": candidate {self.candidates.index(value)} committed to {FINAL}/{FINAL_KEY}"
                    if value in self.candidates else ""), status=status)
        await self.board.broadcast("team-done", {"status": status, "notes": value})
        if status == "accepted" and isinstance(value, str):
            await self.board.remember(value, kind="summary", tags=["release-notes"],
                                      metadata={"proposal": handle.id})
        self.say("broadcast", "team-done")



def outcome_fields(outcome: Outcome | None) -> tuple[str, Any]:
    """``(status, value)`` of a vote outcome (``("none", None)`` when there is none)."""
    if outcome is None:
        return "none", None
    return str(outcome.status), outcome.value


# ----------------------------------------------------------------------- actor
class Actor(Member):
    """Claims open tasks with compare-and-set, does them, drafts the notes, votes."""

    role = "actor"
    system = ("You are an actor in a team of agents. You claim open tasks from the shared board, do them, "
              "and write concise results.")

    def __init__(self, agent: Agent, name: str, board: str, policy: Policy, transcript: Transcript, *,
                 planner: str, style: str, **kwargs: Any) -> None:
        super().__init__(agent, name, board, policy, transcript, **kwargs)
        self.planner = planner
        self.style = style
        self.done: list[str] = []
        self.conflicts = 0

    async def run(self) -> None:
        """The actor's whole part, start to finish."""
        await self.open_view()
        await self.agent.handle("draft", self._on_draft)
        await self.agent.join(self.board)  # from now on, the board's broadcasts reach the inbox
        async with self.mailbox:
            await self.agent.send(self.planner, "ready", {"style": self.style})
            msg = await self.mailbox.get("plan-ready", self.step_timeout)
            self.working.set_goal(str(msg.body.get("goal", "")), ttl=None)
            self.record("receive", {"type": "plan-ready", "from": msg.sender}, msg.body, "start working")
            await msg.ack()
            await self._work()
            msg = await self.mailbox.get("vote-open", self.step_timeout)
            body = msg.body
            await self.cast_vote(str(body["proposal"]), list(body["tasks"]), list(body["candidates"]))
            await msg.ack()
            msg = await self.mailbox.get("team-done", self.step_timeout)
            self.record("receive", {"type": "team-done", "from": msg.sender}, msg.body.get("status"), "stop")
            await msg.ack()

    async def _work(self) -> None:
        while True:
            tasks = self.tasks()
            open_tasks = [OpenTask(k, str(v["title"]), self.view[(TASKS, k)].revision)
                          for k, v in sorted(tasks.items()) if v.get("state") == "open"]
            if not open_tasks:
                self.record("choose_task", {"open": []}, "no open task left", None)
                self.say("idle", f"no open task left ({len(self.done)} done)")
                return
            self.working.set_focus("choosing a task")
            prompt = self.prompt("choose_task", "Choose one open task to claim:\n"
                                 + "\n".join(f"{t.id}: {t.title}" for t in open_tasks))
            decision = await self.policy.choose_task(prompt, self.agent.id, open_tasks)
            self.record("choose_task", {"open": [t.id for t in open_tasks]}, decision.note or "chosen",
                        decision.value, decision, prompt)
            if decision.value is None:
                return
            task = next(t for t in open_tasks if t.id == decision.value)
            value = tasks[task.id]
            try:
                rev = await self.board.update(TASKS, task.id, {**value, "state": "claimed",
                                                               "assignee": self.agent.id},
                                              expected_revision=task.revision)
            except ConflictError as exc:
                self.conflicts += 1
                self.record("claim", {"task": task.id, "expected_revision": task.revision},
                            f"conflict: the task is at revision {exc.current_revision}", "lost")
                self.say("conflict", f"lost the race for {task.id} (expected revision {task.revision}, "
                         f"now {exc.current_revision})", task=task.id)
                # Let the view catch up with the write that won before deciding again.
                await self.view.wait_for(reached(TASKS, task.id, exc.current_revision), self.step_timeout)
                continue
            self.record("claim", {"task": task.id, "expected_revision": task.revision}, f"revision {rev}", "won")
            self.say("claim", f"claimed {task.id} (revision {task.revision} -> {rev})", task=task.id)
            self.working.set_focus(f"doing {task.id}")
            prompt = self.prompt("work", f"Do task {task.id}: {task.title}\nWrite its result.")
            result = await self.policy.work(prompt, self.agent.id, TaskSpec(task.id, task.title))
            rev = await self.board.update(TASKS, task.id, {**value, "state": "done", "assignee": self.agent.id,
                                                           "result": result.value}, expected_revision=rev)
            self.record("work", {"task": task.id, "title": task.title}, f"result written at revision {rev}",
                        result.value, result, prompt)
            self.done.append(task.id)
            await self.agent.send(self.planner, "task-done", {"task": task.id, "revision": rev})
            self.say("result", f"{task.id} done: {result.value}", task=task.id)

    async def _on_draft(self, request: Message) -> dict[str, Any]:
        """Request handler: draft the final notes from the task results on the board."""
        ids = [str(t) for t in request.body["tasks"]]
        await self.view.wait_for(lambda v: all(self.tasks().get(t, {}).get("state") == "done" for t in ids),
                                 self.step_timeout)
        tasks = self.tasks()
        results = {t: str(tasks[t]["result"]) for t in ids}
        self.working.set_focus("drafting the release notes")
        prompt = self.prompt("draft", f"Write the release notes from the task results ({self.style} style), "
                             "mentioning every task id.")
        decision = await self.policy.draft(prompt, self.agent.id, self.style, results)
        await self.board.put(DRAFTS, self.agent.id, decision.value)
        self.record("draft", {"tasks": ids, "style": self.style}, f"{len(decision.value)} characters",
                    "sent to the planner", decision, prompt)
        return {"draft": decision.value}
