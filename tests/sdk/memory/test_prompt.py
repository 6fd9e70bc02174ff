"""Prompt context: sections, images, budgets (never exceeded), priority order, determinism."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents_sdk.memory import (
    BoardEntryLike,
    PromptBudget,
    RecalledMemoryLike,
    ShortTermMemory,
    Summary,
    ViewItem,
    WorkingMemory,
    approx_tokens,
    build_prompt,
    prompt_cost,
    render_prompt,
)
from blackboard.protocol.entries import Entry
from blackboard.protocol.errors import BudgetExceededError, ConfigurationError


@dataclass(frozen=True)
class Recalled:
    text: str
    score: float
    kind: str = "episodic"
    id: str = "m"
    metadata: Mapping[str, Any] = field(default_factory=dict)


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))


def entry(key: str, value: Any, rev: int, content_type: str = "application/json") -> Entry:
    return Entry(
        board="team",
        section="plan",
        key=key,
        revision=rev,
        value=value,
        content_type=content_type,
        author="alice",
        tags=("t",),
    )


def sample_history(n: int = 6, size: int = 20) -> list[ViewItem]:
    mem = ShortTermMemory(max_items=None, clock=lambda: 0.0)
    for i in range(n):
        mem.add(action=f"act{i}", observation=f"{i}" * size)
    return [*mem.items()]


def test_protocols_accept_the_board_entry_and_a_recalled_memory() -> None:
    e: BoardEntryLike = entry("k", 1, 1)
    m: RecalledMemoryLike = Recalled("t", 0.5)
    assert build_prompt(board=[e], memories=[m]).included == ("board:team/plan/k", "memory:m")


def test_unlimited_prompt_has_every_section_in_display_order() -> None:
    wm = WorkingMemory(clock=Clock())
    wm.add_reasoning("think")
    wm.set_goal("win")
    history: list[ViewItem] = [Summary("summary-1", "long ago", 3), *sample_history(2)]
    messages = render_prompt(
        system="You are an agent.",
        task="What next?",
        working=wm,
        history=history,
        board=[entry("k", {"b": 1, "a": 2}, 7)],
        memories=[Recalled("remembered fact", 0.9, id="m1")],
    )
    assert messages[0] == {"role": "system", "content": "You are an agent."}
    assert messages[-1] == {"role": "user", "content": "What next?"}
    context = messages[1]["content"]
    assert isinstance(context, str)
    headers = ["## Working memory", "## Recalled memories", "## Shared board", "## History"]
    positions = [context.index(h) for h in headers]
    assert positions == sorted(positions)
    assert context.index("- goal: win") < context.index("- reasoning [reasoning-1]: think")
    assert '- team/plan/k [rev 7 by alice; tags: t]: {"a":2,"b":1}' in context
    assert "- (episodic, score 0.900) remembered fact" in context
    assert context.index("[summary of 3 earlier items] long ago") < context.index("act0")


def test_empty_inputs_render_only_what_is_given() -> None:
    assert render_prompt() == []
    assert render_prompt(task="t") == [{"role": "user", "content": "t"}]


def test_history_accepts_a_short_term_memory() -> None:
    mem = ShortTermMemory()
    mem.add(action="one")
    mem.add(action="two")
    ctx = build_prompt(history=mem)
    assert ctx.included == ("step:2", "step:1")


def test_image_entries_become_image_parts() -> None:
    ctx = build_prompt(
        board=[
            entry("shot", PNG, 5, "image/png"),
            entry("file", b"\x00\x01\x02", 4, "application/octet-stream"),
            entry("note", "hello", 3, "text/plain"),
        ]
    )
    content = ctx.messages[0]["content"]
    assert isinstance(content, list)
    images = [p for p in content if p["type"] == "image_url"]
    assert images == [
        {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()},
        }
    ]
    text = "".join(p["text"] for p in content if p["type"] == "text")
    assert "team/plan/file [rev 4 by alice, application/octet-stream; tags: t]: <3 bytes>" in text
    assert "<image, 48 bytes>" in text and "hello" in text
    # Display order (board, section, key): file, note, shot - the image part comes last.
    assert content[-1]["type"] == "image_url"
    assert ctx.cost == prompt_cost(ctx.messages, PromptBudget())


def test_image_costs_count_against_the_budget() -> None:
    shot = entry("shot", PNG, 5, "image/png")
    budget = PromptBudget(max_tokens=100, image_cost=1000)
    ctx = build_prompt(board=[shot, entry("note", "hi", 1)], budget=budget)
    assert ctx.included == ("board:team/plan/note",) and ctx.omitted == ("board:team/plan/shot",)
    assert isinstance(ctx.messages[0]["content"], str)
    ctx = build_prompt(board=[shot], budget=PromptBudget(max_tokens=1000))
    assert ctx.included == ("board:team/plan/shot",)
    assert ctx.cost == prompt_cost(ctx.messages, PromptBudget(max_tokens=1000)) >= 765


def test_fields_are_cut_to_max_field_chars() -> None:
    mem = ShortTermMemory()
    mem.add(action="read", observation="x" * 5000)
    text = render_prompt(history=mem, max_field_chars=100)[0]["content"]
    line = next(line for line in text.splitlines() if "observation" in line)
    assert len(line) == len("  observation: ") + 100 and line.endswith("chars]")


def test_required_parts_over_budget_raise() -> None:
    with pytest.raises(BudgetExceededError) as info:
        build_prompt(system="s" * 50, task="t" * 60, budget=PromptBudget(max_chars=100))
    assert (info.value.cost, info.value.budget, info.value.unit) == (110, 100, "chars")


def test_budget_configuration_errors() -> None:
    with pytest.raises(ConfigurationError):
        PromptBudget(max_chars=10, max_tokens=10)
    with pytest.raises(ConfigurationError):
        PromptBudget(max_chars=-1)
    assert PromptBudget(max_tokens=5).unit == "tokens" and PromptBudget().limit is None
    assert approx_tokens("") == 0 and approx_tokens("abcde") == 2


def test_expired_working_items_are_not_rendered() -> None:
    clock = Clock()
    wm = WorkingMemory(clock=clock)
    wm.set_goal("stay", ttl=None)
    wm.set_focus("fleeting", ttl=1)
    clock.now = 1
    assert build_prompt(working=wm).included == ("working:goal",)


# -- priority -------------------------------------------------------------------

_BIG = "z" * 200


def _one_of_each() -> dict[str, Any]:
    wm = WorkingMemory(clock=Clock())
    wm.set_goal(_BIG)
    mem = ShortTermMemory(max_items=None, clock=lambda: 0.0)
    mem.add(action="old", observation=_BIG)
    mem.add(action="new", observation=_BIG)
    history: list[ViewItem] = [*mem.items()]
    history.insert(1, Summary("summary-x", _BIG, 5))
    return {
        "working": wm,
        "history": history,
        "board": [entry("k", _BIG, 3)],
        "memories": [Recalled(_BIG, 0.5)],
        "recent_steps": 1,
    }


PRIORITY = [
    "working:goal",
    "summary:summary-x",
    "step:2",
    "board:team/plan/k",
    "memory:m",
    "step:1",
]


@pytest.mark.parametrize("unit", ["chars", "tokens"])
@pytest.mark.parametrize("k", range(len(PRIORITY) + 1))
def test_tight_budgets_keep_the_highest_priority_blocks(unit: str, k: int) -> None:
    inputs = _one_of_each()
    full = build_prompt(system="sys", **inputs)
    assert full.included == tuple(PRIORITY)
    # The exact cost of the top-k blocks plus slack smaller than any block.
    top = set(PRIORITY[:k])
    wm = inputs["working"] if "working:goal" in top else None
    partial = {
        "working": wm,
        "history": [
            i
            for i in inputs["history"]
            if (f"summary:{i.id}" if isinstance(i, Summary) else f"step:{i.id}") in top
        ],
        "board": inputs["board"] if "board:team/plan/k" in top else [],
        "memories": inputs["memories"] if "memory:m" in top else [],
    }
    if unit == "chars":
        need = build_prompt(system="sys", **partial).cost
        budget = PromptBudget(max_chars=need + 40)
    else:
        need = prompt_cost(
            build_prompt(system="sys", **partial).messages, PromptBudget(max_tokens=0)
        )
        budget = PromptBudget(max_tokens=need + 25)
    ctx = build_prompt(system="sys", budget=budget, **inputs)
    assert ctx.included == tuple(PRIORITY[:k])
    assert ctx.omitted == tuple(PRIORITY[k:])
    assert ctx.cost <= budget.limit  # type: ignore[operator]


def test_history_is_a_contiguous_tail() -> None:
    mem = ShortTermMemory(max_items=None, clock=lambda: 0.0)
    mem.add(action="oldest")
    mem.add(action="huge", observation="h" * 1000)
    mem.add(action="older")
    mem.add(action="newest")
    ctx = build_prompt(history=mem, budget=PromptBudget(max_chars=300))
    assert ctx.included == ("step:4", "step:3")
    assert ctx.omitted == ("step:2", "step:1")  # step 1 would fit, but not after a gap


# -- budgets never exceeded; determinism -----------------------------------------------

_text = st.text(alphabet="abc xyz\né", min_size=0, max_size=120)


@st.composite
def contexts(draw: st.DrawFn) -> dict[str, Any]:
    clock = Clock()
    wm = WorkingMemory(clock=clock)
    for value in draw(st.lists(_text, max_size=3)):
        wm.add_reasoning(value)
    mem = ShortTermMemory(max_items=None, clock=lambda: 0.0)
    for obs in draw(st.lists(_text, max_size=8)):
        mem.add(action="a", observation=obs)
    history: list[ViewItem] = [*mem.items()]
    if draw(st.booleans()):
        history.insert(min(1, len(history)), Summary("summary-s", draw(_text), 2))
    board = [
        entry(f"k{n}", draw(st.one_of(_text, st.just(PNG))), n + 1, ct)
        for n, ct in enumerate(
            draw(st.lists(st.sampled_from(["image/png", "text/plain"]), max_size=4))
        )
    ]
    memories = [
        Recalled(t, draw(st.sampled_from([0.1, 0.5, 0.9])), id=f"m{n}")
        for n, t in enumerate(draw(st.lists(_text, max_size=4)))
    ]
    return {
        "system": draw(_text),
        "task": draw(_text),
        "working": wm,
        "history": history,
        "board": board,
        "memories": memories,
        "recent_steps": draw(st.integers(0, 4)),
    }


def _odd_counter(text: str) -> int:
    # Deliberately not additive over concatenation.
    return len(text.split()) * 2 + (len(text) % 7)


@settings(max_examples=200, deadline=None)
@given(
    inputs=contexts(),
    limit=st.integers(0, 1500),
    mode=st.sampled_from(["chars", "tokens", "odd-tokens"]),
    image_cost=st.sampled_from([None, 0, 50]),
)
def test_budget_is_never_exceeded(
    inputs: dict[str, Any], limit: int, mode: str, image_cost: int | None
) -> None:
    if mode == "chars":
        budget = PromptBudget(max_chars=limit, image_cost=image_cost)
    elif mode == "tokens":
        budget = PromptBudget(max_tokens=limit, image_cost=image_cost)
    else:
        budget = PromptBudget(max_tokens=limit, count_tokens=_odd_counter, image_cost=image_cost)
    try:
        ctx = build_prompt(budget=budget, **inputs)
    except BudgetExceededError as exc:
        required = prompt_cost(render_prompt(system=inputs["system"], task=inputs["task"]), budget)
        assert exc.cost == required > limit
        return
    assert ctx.cost == prompt_cost(ctx.messages, budget) <= limit
    if mode == "chars" and image_cost == 0:
        chars = sum(
            len(m["content"])
            if isinstance(m["content"], str)
            else sum(len(p.get("text", "")) for p in m["content"])
            for m in ctx.messages
        )
        assert chars <= limit
    assert set(ctx.included).isdisjoint(ctx.omitted)


@settings(max_examples=50, deadline=None)
@given(inputs=contexts(), limit=st.integers(200, 2000), seed=st.integers(0, 1000))
def test_same_inputs_give_identical_output(inputs: dict[str, Any], limit: int, seed: int) -> None:
    budget = PromptBudget(max_chars=limit + len(inputs["system"]) + len(inputs["task"]))
    first = build_prompt(budget=budget, **inputs)
    shuffled = dict(inputs)
    rng = random.Random(seed)
    shuffled["board"] = rng.sample(inputs["board"], len(inputs["board"]))
    shuffled["memories"] = rng.sample(inputs["memories"], len(inputs["memories"]))
    again = build_prompt(budget=budget, **shuffled)
    assert json.dumps(first.messages) == json.dumps(again.messages)
    assert first == again
