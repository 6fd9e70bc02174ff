"""The decision points of the team and two policies that take them.

Every agent decides through a :class:`Policy`: the planner plans, the actors
choose a task, do it and draft the final note, and everyone votes. The agent
builds a prompt for each decision (its short-term memory, its working memory
and its board view, rendered by ``build_prompt``) and hands it to the policy
with the structured choices, so both policies go through the same decision
points:

* :class:`ScriptedPolicy` ignores the prompt text and decides by fixed rules
  (deterministic; used when no LLM is configured);
* :class:`LLMPolicy` sends the prompt to an OpenAI-compatible chat model and
  parses a JSON answer; an answer it cannot use is replaced by the scripted
  decision and reported (so a weak model cannot break the protocol).

The parsing and the scripted rules are pure functions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from openai import AsyncOpenAI, OpenAIError

from agents_sdk.memory import PromptContext
from blackboard.protocol.errors import LLMError
from blackboard.settings import LLMSettings

__all__ = [
    "DECISION_MARKER",
    "Decision",
    "LLMPolicy",
    "OpenTask",
    "Policy",
    "ScriptedPolicy",
    "TaskSpec",
    "VoteChoice",
    "llm_configured",
    "parse_json_answer",
    "scripted_choice",
    "scripted_draft",
    "scripted_plan",
    "scripted_result",
    "scripted_vote",
]

#: Every decision prompt's task text starts with ``DECISION: <name>``.
DECISION_MARKER = "DECISION:"


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A task of the plan."""

    id: str
    title: str


@dataclass(frozen=True, slots=True)
class OpenTask:
    """A task an actor may claim (as its board view shows it)."""

    id: str
    title: str
    revision: int


@dataclass(frozen=True, slots=True)
class VoteChoice:
    """A ballot: the index of the chosen candidate and why."""

    index: int
    reason: str


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Decision(Generic[T]):
    """What a policy decided, and a note when it had to fall back to the rules."""

    value: T
    source: str
    note: str = ""
    raw: str | None = field(default=None, repr=False)


class Policy(Protocol):
    """Takes the team's decisions. ``prompt`` is the agent's rendered context."""

    name: str

    async def plan(self, prompt: PromptContext, goal: str, n_tasks: int) -> Decision[list[TaskSpec]]:
        """Split ``goal`` into ``n_tasks`` tasks."""
        ...

    async def choose_task(self, prompt: PromptContext, agent: str, open_tasks: Sequence[OpenTask]
                          ) -> Decision[str | None]:
        """Pick a task to claim among ``open_tasks`` (None: none)."""
        ...

    async def work(self, prompt: PromptContext, agent: str, task: TaskSpec) -> Decision[str]:
        """Do ``task``; return its result text."""
        ...

    async def draft(self, prompt: PromptContext, agent: str, style: str,
                    results: Mapping[str, str]) -> Decision[str]:
        """Write the final note from the task results (``task id -> result``)."""
        ...

    async def vote(self, prompt: PromptContext, agent: str, task_ids: Sequence[str],
                   candidates: Sequence[str]) -> Decision[VoteChoice]:
        """Choose one of ``candidates``."""
        ...


# ------------------------------------------------------------------ the rules
_TOPICS: tuple[tuple[str, str], ...] = (
    ("the versioned board", "every write gets a revision; compare-and-set updates prevent lost updates"),
    ("agent messages", "direct messages wait in durable inboxes; board broadcasts reach every member"),
    ("consensus voting", "a proposal settles a disputed entry by majority and commits the winner once"),
    ("agent memory", "short-term memory records each step; prompts are built within a budget"),
    ("live views", "a view keeps a local copy of board entries current and shows the agent's own writes"),
    ("long-term memory", "memories are embedded by the worker and found again by semantic search"),
)


def scripted_plan(goal: str, n_tasks: int) -> list[TaskSpec]:
    """``n_tasks`` tasks ``t1..tN``, one per feature to describe (cycling)."""
    if n_tasks < 1:
        raise ValueError("a plan needs at least one task")
    return [TaskSpec(f"t{i + 1}", f"Describe {_TOPICS[i % len(_TOPICS)][0]} for: {goal}")
            for i in range(n_tasks)]


def scripted_choice(open_tasks: Sequence[OpenTask]) -> str | None:
    """The open task with the lowest id (so actors race for it: the CAS decides)."""
    if not open_tasks:
        return None
    return min(open_tasks, key=lambda t: (len(t.id), t.id)).id


def scripted_result(task: TaskSpec) -> str:
    """The canned answer for a task of :func:`scripted_plan`."""
    for topic, text in _TOPICS:
        if topic in task.title:
            return f"{topic[0].upper()}{topic[1:]}: {text}."
    return f"{task.title}: done."


def scripted_draft(style: str, results: Mapping[str, str]) -> str:
    """The final note in ``style`` (``bullets`` or ``paragraph``), tasks in id order."""
    ordered = [results[k] for k in sorted(results, key=lambda k: (len(k), k))]
    ids = ", ".join(sorted(results, key=lambda k: (len(k), k)))
    if style == "bullets":
        return "Release notes (" + ids + ")\n" + "\n".join(f"- {r}" for r in ordered)
    return "Release notes (" + ids + "). " + " ".join(ordered)


def scripted_vote(task_ids: Sequence[str], candidates: Sequence[str]) -> VoteChoice:
    """The shortest candidate that covers every task; ties go to the lowest index."""
    if not candidates:
        raise ValueError("nothing to vote on")
    covering = [i for i, c in enumerate(candidates) if all(t in c for t in task_ids)] or list(range(len(candidates)))
    best = min(covering, key=lambda i: (len(candidates[i]), i))
    return VoteChoice(best, f"covers all {len(task_ids)} tasks in the fewest words "
                            f"({len(candidates[best])} characters)")


class ScriptedPolicy:
    """Deterministic decisions by the rules above (no LLM)."""

    name = "scripted"

    async def plan(self, prompt: PromptContext, goal: str, n_tasks: int) -> Decision[list[TaskSpec]]:
        return Decision(scripted_plan(goal, n_tasks), self.name)

    async def choose_task(self, prompt: PromptContext, agent: str, open_tasks: Sequence[OpenTask]
                          ) -> Decision[str | None]:
        return Decision(scripted_choice(open_tasks), self.name)

    async def work(self, prompt: PromptContext, agent: str, task: TaskSpec) -> Decision[str]:
        return Decision(scripted_result(task), self.name)

    async def draft(self, prompt: PromptContext, agent: str, style: str,
                    results: Mapping[str, str]) -> Decision[str]:
        return Decision(scripted_draft(style, results), self.name)

    async def vote(self, prompt: PromptContext, agent: str, task_ids: Sequence[str],
                   candidates: Sequence[str]) -> Decision[VoteChoice]:
        return Decision(scripted_vote(task_ids, candidates), self.name)


# --------------------------------------------------------------------- LLM
_JSON_RE = re.compile(r"\{.*\}", re.DOTALL)


def parse_json_answer(text: str | None) -> dict[str, Any] | None:
    """The first JSON object in a model's answer (code fences and prose around it allowed)."""
    if not text:
        return None
    match = _JSON_RE.search(text)
    if match is None:
        return None
    try:
        obj = json.loads(match.group(0))
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def llm_configured(settings: LLMSettings) -> bool:
    """Whether an OpenAI-compatible chat endpoint is configured (an API key or a base URL)."""
    return settings.api_key is not None or settings.base_url is not None


_ANSWER_FORMATS = {
    "plan": 'Answer with JSON only: {"tasks": ["<title of task 1>", "..."]} with exactly %d titles.',
    "choose_task": 'Answer with JSON only: {"task": "<id of one open task>"} or {"task": null}.',
    "work": 'Answer with JSON only: {"result": "<one or two sentences>"}.',
    "draft": 'Answer with JSON only: {"draft": "<the release notes, mentioning every task id>"}.',
    "vote": 'Answer with JSON only: {"choice": <candidate index>, "reason": "<why, one sentence>"}.',
}


class LLMPolicy:
    """Decisions by an OpenAI-compatible chat model; invalid answers fall back to the rules.

    Use as an async context manager (it closes its HTTP client)::

        async with LLMPolicy.from_settings(settings.llm) as policy: ...

    Raises:
        LLMError: the chat endpoint failed (after the client's retries).
    """

    name = "llm"

    def __init__(self, client: AsyncOpenAI, model: str, *, temperature: float = 0.0) -> None:
        self._client = client
        self._model = model
        self._temperature = temperature
        self._rules = ScriptedPolicy()
        #: Chat requests sent.
        self.calls = 0

    @classmethod
    def from_settings(cls, settings: LLMSettings) -> LLMPolicy:
        """A policy on ``settings.model`` at ``settings.base_url`` (OpenAI's API when None)."""
        key = settings.api_key.get_secret_value() if settings.api_key is not None else "not-needed"
        client = AsyncOpenAI(api_key=key, base_url=settings.base_url, timeout=settings.timeout)
        return cls(client, settings.model)

    async def __aenter__(self) -> LLMPolicy:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.close()

    async def _ask(self, prompt: PromptContext, answer_format: str) -> tuple[dict[str, Any] | None, str]:
        messages: list[Any] = [*prompt.messages, {"role": "user", "content": answer_format}]
        self.calls += 1
        try:
            resp = await self._client.chat.completions.create(model=self._model, messages=messages,
                                                              temperature=self._temperature)
        except OpenAIError as exc:
            raise LLMError(f"chat completion failed: {exc}") from exc
        text = resp.choices[0].message.content if resp.choices else None
        return parse_json_answer(text), text or ""

    async def plan(self, prompt: PromptContext, goal: str, n_tasks: int) -> Decision[list[TaskSpec]]:
        answer, raw = await self._ask(prompt, _ANSWER_FORMATS["plan"] % n_tasks)
        titles = answer.get("tasks") if answer else None
        if (isinstance(titles, list) and len(titles) == n_tasks
                and all(isinstance(t, str) and t.strip() for t in titles)):
            return Decision([TaskSpec(f"t{i + 1}", t.strip()) for i, t in enumerate(titles)], self.name, raw=raw)
        fallback = await self._rules.plan(prompt, goal, n_tasks)
        return Decision(fallback.value, "scripted", "unusable plan from the model", raw)

    async def choose_task(self, prompt: PromptContext, agent: str, open_tasks: Sequence[OpenTask]
                          ) -> Decision[str | None]:
        answer, raw = await self._ask(prompt, _ANSWER_FORMATS["choose_task"])
        ids = {t.id for t in open_tasks}
        if answer is not None and "task" in answer:
            choice = answer["task"]
            if choice is None and not ids:
                return Decision(None, self.name, raw=raw)
            if isinstance(choice, str) and choice in ids:
                return Decision(choice, self.name, raw=raw)
        return Decision(scripted_choice(open_tasks), "scripted", "the model chose no open task", raw)

    async def work(self, prompt: PromptContext, agent: str, task: TaskSpec) -> Decision[str]:
        answer, raw = await self._ask(prompt, _ANSWER_FORMATS["work"])
        result = answer.get("result") if answer else None
        if isinstance(result, str) and result.strip():
            return Decision(result.strip(), self.name, raw=raw)
        return Decision(scripted_result(task), "scripted", "no result from the model", raw)

    async def draft(self, prompt: PromptContext, agent: str, style: str,
                    results: Mapping[str, str]) -> Decision[str]:
        answer, raw = await self._ask(prompt, _ANSWER_FORMATS["draft"])
        text = answer.get("draft") if answer else None
        if isinstance(text, str) and text.strip():
            return Decision(text.strip(), self.name, raw=raw)
        return Decision(scripted_draft(style, results), "scripted", "no draft from the model", raw)

    async def vote(self, prompt: PromptContext, agent: str, task_ids: Sequence[str],
                   candidates: Sequence[str]) -> Decision[VoteChoice]:
        answer, raw = await self._ask(prompt, _ANSWER_FORMATS["vote"])
        choice = answer.get("choice") if answer else None
        if isinstance(choice, int) and not isinstance(choice, bool) and 0 <= choice < len(candidates):
            reason = answer.get("reason") if answer else None
            return Decision(VoteChoice(choice, str(reason or "")[:500]), self.name, raw=raw)
        return Decision(scripted_vote(task_ids, candidates), "scripted", "no valid choice from the model", raw)
