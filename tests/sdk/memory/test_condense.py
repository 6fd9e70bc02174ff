"""Condensation: condensers, events, replay, pipelines, and consolidation to long-term memory."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents_sdk.memory import (
    CondensationEvent,
    CondensedHistory,
    Condenser,
    CondenserPipeline,
    LLMSummarizingCondenser,
    MemoryItem,
    RollingWindowCondenser,
    ShortTermMemory,
    Summarizer,
    Summary,
    ViewItem,
    apply_events,
    consolidate,
    consolidation_requests,
    render_item,
    summary_id,
    summary_messages,
)
from blackboard.protocol.errors import ConfigurationError, InvalidPayloadError


class RecordingSummarizer:
    """Deterministic summarizer at the swap point: records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[list[ViewItem]] = []

    async def summarize(self, items: Sequence[ViewItem]) -> str:
        self.calls.append(list(items))
        return "S(" + ",".join(str(i.id) for i in items) + ")"


def history(n: int) -> list[MemoryItem]:
    mem = ShortTermMemory(max_items=None)
    for i in range(n):
        mem.add(action=f"act{i}", observation=f"obs{i}")
    return mem.items()


def ids(view: Sequence[ViewItem]) -> list[int | str]:
    return [item.id for item in view]


def test_protocols_are_implemented() -> None:
    assert isinstance(RollingWindowCondenser(), Condenser)
    assert isinstance(LLMSummarizingCondenser(RecordingSummarizer()), Condenser)
    assert isinstance(CondenserPipeline(), Condenser)
    assert isinstance(RecordingSummarizer(), Summarizer)


# -- rolling window ---------------------------------------------------------


def test_rolling_window_keeps_first_and_last_and_forgets_the_middle() -> None:
    items = history(10)
    condenser = RollingWindowCondenser(keep_first=2, keep_last=3)
    event = condenser.plan(items)
    assert event == CondensationEvent(forgotten_ids=(3, 4, 5, 6, 7))
    assert ids(apply_events(items, [event])) == [1, 2, 8, 9, 10]


def test_rolling_window_is_quiet_within_budget() -> None:
    condenser = RollingWindowCondenser(keep_first=1, keep_last=4, max_size=8)
    assert condenser.plan(history(8)) is None
    event = condenser.plan(history(9))
    assert event is not None and event.forgotten_ids == (2, 3, 4, 5)
    assert condenser.plan([]) is None


@pytest.mark.asyncio
async def test_rolling_window_as_async_condenser() -> None:
    condenser = RollingWindowCondenser(keep_first=0, keep_last=2)
    assert await condenser.condense(history(2)) == []
    assert await condenser.condense(history(4)) == [CondensationEvent((1, 2))]


def test_rolling_window_configuration_errors() -> None:
    with pytest.raises(ConfigurationError):
        RollingWindowCondenser(keep_first=-1)
    with pytest.raises(ConfigurationError):
        RollingWindowCondenser(keep_first=2, keep_last=3, max_size=4)


# -- events and replay ----------------------------------------------------------


def test_apply_events_inserts_summary_at_offset() -> None:
    items = history(6)
    event = CondensationEvent((2, 3, 4), "sum", 1, summary_id((2, 3, 4)))
    view = apply_events(items, [event])
    assert ids(view) == [1, summary_id((2, 3, 4)), 5, 6]
    summary = view[1]
    assert isinstance(summary, Summary) and summary.text == "sum" and summary.count == 3


def test_apply_events_keeps_later_items_at_the_end_and_ignores_missing_ids() -> None:
    items = history(8)
    event = CondensationEvent((2, 3), "s", 1, "s1")
    assert ids(apply_events(items[:5], [event])) == [1, "s1", 4, 5]
    assert ids(apply_events(items, [event])) == [1, "s1", 4, 5, 6, 7, 8]
    # Items already gone (e.g. evicted) are skipped; the offset is clamped.
    assert ids(apply_events(items[2:4], [CondensationEvent((2, 3, 99), "s", 5, "s2")])) == [
        4,
        "s2",
    ]


def test_events_can_forget_earlier_summaries() -> None:
    items = history(10)
    first = CondensationEvent((2, 3), "a", 1, "s1")
    second = CondensationEvent(("s1", 4, 5), "b", 1, "s2")
    assert ids(apply_events(items, [first, second])) == [1, "s2", 6, 7, 8, 9, 10]


def test_event_dict_round_trip_and_validation() -> None:
    event = CondensationEvent((1, "summary-x"), "text", 2, "summary-y")
    data = json.loads(json.dumps(event.to_dict()))
    assert CondensationEvent.from_dict(data) == event
    assert CondensationEvent.from_dict(CondensationEvent((3,)).to_dict()) == CondensationEvent((3,))
    for bad in (
        {"forgotten_ids": "1"},
        {"forgotten_ids": [True]},
        {"forgotten_ids": [1], "summary": 3, "summary_offset": 0},
        {"forgotten_ids": [1], "summary": "s", "summary_offset": "0"},
        {"forgotten_ids": [1], "summary_id": 5},
    ):
        with pytest.raises(InvalidPayloadError):
            CondensationEvent.from_dict(bad)
    with pytest.raises(InvalidPayloadError):
        CondensationEvent((1,), "summary without offset")


def test_summary_ids_are_deterministic_and_distinct() -> None:
    assert summary_id((1, 2)) == summary_id([1, 2])
    assert summary_id((1, 2)) != summary_id((1, 3))
    assert summary_id((1, 2)).startswith("summary-")


# -- LLM summarizing condenser (logic, no IO) -------------------------------


@pytest.mark.asyncio
async def test_llm_condenser_summarises_the_middle() -> None:
    summarizer = RecordingSummarizer()
    condenser = LLMSummarizingCondenser(summarizer, max_size=6, keep_first=1, keep_last=2)
    items = history(7)
    assert condenser.select(items[:6]) == []
    assert await condenser.condense(items[:6]) == []
    events = await condenser.condense(items)
    forgotten = (2, 3, 4, 5)
    assert events == [CondensationEvent(forgotten, "S(2,3,4,5)", 1, summary_id(forgotten))]
    assert [ids(call) for call in summarizer.calls] == [list(forgotten)]
    assert ids(apply_events(items, events)) == [1, summary_id(forgotten), 6, 7]


@pytest.mark.asyncio
async def test_llm_condenser_folds_previous_summary_into_the_next() -> None:
    summarizer = RecordingSummarizer()
    condenser = LLMSummarizingCondenser(summarizer, max_size=4, keep_first=1, keep_last=2)
    log = CondensedHistory(condenser)
    items = history(12)
    for n in range(1, 13):
        view = await log.condense(items[:n])
        assert len(view) <= 4
        assert log.view(items[:n]) == view
    summaries = [i for i in log.view(items) if isinstance(i, Summary)]
    assert len(summaries) == 1
    # Each later summary was asked to cover the previous one.
    assert any(isinstance(i, Summary) for call in summarizer.calls[1:] for i in call)


def test_llm_condenser_configuration_errors() -> None:
    with pytest.raises(ConfigurationError):
        LLMSummarizingCondenser(RecordingSummarizer(), max_size=4, keep_first=2, keep_last=2)
    with pytest.raises(ConfigurationError):
        LLMSummarizingCondenser(RecordingSummarizer(), keep_first=-1)


def test_summary_messages_carry_every_item() -> None:
    items: list[ViewItem] = [*history(3), Summary("summary-1", "earlier things", 4)]
    messages = summary_messages(items, instructions="be brief")
    assert messages[0] == {"role": "system", "content": "be brief"}
    assert messages[1]["role"] == "user"
    for item in items:
        assert render_item(item) in messages[1]["content"]
    assert summary_messages(items, instructions="be brief") == messages


# -- pipelines ----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_pipeline_runs_stages_on_the_previous_view_and_replays_exactly() -> None:
    summarizer = RecordingSummarizer()
    pipeline = CondenserPipeline(
        RollingWindowCondenser(keep_first=1, keep_last=8, max_size=10),
        LLMSummarizingCondenser(summarizer, max_size=5, keep_first=1, keep_last=2),
    )
    items = history(20)
    events = await pipeline.condense(items)
    assert len(events) == 2
    assert events[0].forgotten_ids == tuple(range(2, 13))
    # The second stage saw the rolled view: 1 and 13..20.
    assert ids(summarizer.calls[0]) == [13, 14, 15, 16, 17, 18]
    view = apply_events(items, events)
    assert ids(view) == [1, summary_id(tuple(range(13, 19))), 19, 20]
    assert apply_events(apply_events(items, events[:1]), events[1:]) == view


@pytest.mark.asyncio
async def test_pipelines_nest_and_empty_pipeline_is_a_no_op() -> None:
    inner = CondenserPipeline(RollingWindowCondenser(keep_first=0, keep_last=6))
    outer = CondenserPipeline(inner, RollingWindowCondenser(keep_first=1, keep_last=2))
    items = history(10)
    events = await outer.condense(items)
    assert ids(apply_events(items, events)) == [5, 9, 10]
    assert await CondenserPipeline().condense(items) == []


@pytest.mark.asyncio
async def test_condensed_history_events_round_trip_through_json() -> None:
    log = CondensedHistory(
        LLMSummarizingCondenser(RecordingSummarizer(), max_size=3, keep_first=1, keep_last=1)
    )
    items = history(9)
    for n in range(1, 10):
        await log.condense(items[:n])
    data = json.loads(json.dumps(log.events_to_dicts()))
    restored = CondensedHistory(log.condenser, CondensedHistory.events_from_dicts(data))
    assert restored.view(items) == log.view(items)


_steps = st.lists(st.integers(0, 4), min_size=1, max_size=25)


@pytest.mark.asyncio
@settings(max_examples=60, deadline=None)
@given(
    growth=_steps,
    keep_first=st.integers(0, 2),
    keep_last=st.integers(1, 3),
    use_rolling=st.booleans(),
)
async def test_replaying_recorded_events_reproduces_every_condensed_view(
    growth: list[int], keep_first: int, keep_last: int, use_rolling: bool
) -> None:
    max_size = keep_first + keep_last + 1
    stages: list[Condenser] = [
        LLMSummarizingCondenser(
            RecordingSummarizer(), max_size=max_size, keep_first=keep_first, keep_last=keep_last
        )
    ]
    if use_rolling:
        stages.insert(0, RollingWindowCondenser(keep_first=keep_first, keep_last=max_size))
    log = CondensedHistory(CondenserPipeline(*stages))
    mem = ShortTermMemory(max_items=None)
    for added in growth:
        for _ in range(added):
            mem.add(action="x")
        view = await log.condense(mem.items())
        assert apply_events(mem.items(), log.events) == view
        assert len(view) <= max(max_size, keep_first + keep_last + 1)
        seen = [i.id for i in view]
        assert len(seen) == len(set(seen))


# -- consolidation ----------------------------------------------------------------------


def test_consolidation_requests_are_built_purely() -> None:
    mem = ShortTermMemory()
    item = mem.add(step=4, action="search", observation="the answer is 42", tags=["web"])
    event = CondensationEvent((1, 2), "did things", 1, "summary-a")
    rolled = CondensationEvent((3,))
    requests = consolidation_requests(
        summaries=[event, rolled, Summary("summary-b", "more", 2)],
        items=[item],
        tags=["team"],
        metadata={"run": "r1"},
    )
    assert [(r.text, r.kind, r.tags) for r in requests] == [
        ("did things", "summary", ("team",)),
        ("more", "summary", ("team",)),
        ("action: search\nobservation: the answer is 42", "episodic", ("team", "web")),
    ]
    assert requests[0].metadata == {
        "source": "condensation",
        "summary_id": "summary-a",
        "forgotten_ids": [1, 2],
        "run": "r1",
    }
    assert requests[2].metadata == {
        "source": "short_term",
        "item_id": item.id,
        "step": 4,
        "created_at": item.created_at,
        "run": "r1",
    }


@pytest.mark.asyncio
async def test_consolidate_calls_async_and_sync_remember() -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    async def remember_async(
        text: str, *, kind: str, tags: list[str], metadata: dict[str, Any]
    ) -> str:
        calls.append((text, {"kind": kind, "tags": tags, "metadata": metadata}))
        return f"mem-{len(calls)}"

    def remember_sync(text: str, *, kind: str, tags: list[str], metadata: dict[str, Any]) -> int:
        calls.append((text, {"kind": kind, "tags": tags}))
        return len(text)

    mem = ShortTermMemory()
    item = mem.add(action="deploy", result="ok")
    event = CondensationEvent((9,), "summary text", 0, "summary-z")
    assert await consolidate(remember_async, summaries=[event], items=[item]) == ["mem-1", "mem-2"]
    assert calls[0][0] == "summary text" and calls[0][1]["kind"] == "summary"
    assert calls[1][1]["kind"] == "episodic"
    assert await consolidate(remember_sync, items=[item], item_kind="procedural") == [
        len("action: deploy\nresult: ok")
    ]
    assert calls[2][1] == {"kind": "procedural", "tags": []}
