"""Short-term memory: items, bounds and eviction, indexes, tag-weighted retrieval, round trips."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agents_sdk.memory as memory_pkg
from agents_sdk.memory import MemoryItem, ShortTermMemory
from agents_sdk.memory.items import encode_json_value, render_item
from blackboard.protocol.errors import ConfigurationError, InvalidPayloadError, PayloadTooLargeError


class Clock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_memory_package_exports_are_pinned() -> None:
    assert sorted(memory_pkg.__all__) == sorted(
        [
            "STANDARD_FIELDS",
            "BoardEntryLike",
            "ChatMessage",
            "CondensationEvent",
            "CondensedHistory",
            "Condenser",
            "CondenserPipeline",
            "ConsolidationRequest",
            "ItemId",
            "LLMSummarizingCondenser",
            "MemoryItem",
            "OpenAISummarizer",
            "PromptBudget",
            "PromptContext",
            "RecalledMemoryLike",
            "Remember",
            "RollingWindowCondenser",
            "ShortTermMemory",
            "Summarizer",
            "Summary",
            "TokenCounter",
            "ViewItem",
            "WorkingItem",
            "WorkingMemory",
            "apply_events",
            "approx_tokens",
            "build_prompt",
            "consolidate",
            "consolidation_requests",
            "item_text",
            "prompt_cost",
            "render_item",
            "render_prompt",
            "summary_id",
            "summary_messages",
            # the memory toolkit (issue 23): the facade, layers, episodes, router, metrics
            "AgentMemory", "Episode", "EpisodeSummary", "LAYERS", "LLMRouter", "LatencyStats", "Layer",
            "LayerHit", "MemoryMetrics", "PruneResult", "PruneStrategy", "RouteRule", "Router", "RuleRouter",
            "SummaryResult", "extractive_summary",
            # memory actions as tools
            "ACTION_NAMES", "ActionResult", "ExtraTool", "ToolLoopResult", "call_action", "memory_tools",
            "run_tool_loop",
            # stores, attachments, prompt context, tokenizers
            "Attachment", "Attachments", "ConfigFileError", "ConversationStore", "FileStore", "LogStore",
            "MemoryConfig", "MemoryStore", "ModelTokenCounter", "RenderedContext", "STAGES", "Stage", "StoreSpec",
            "TiktokenCounter", "chars_counter", "create_store", "load_config", "register_store_type",
            "render_related", "token_counter",
        ]
    )
    for name in memory_pkg.__all__:
        assert hasattr(memory_pkg, name), name


# -- items ----------------------------------------------------------------


def test_add_assigns_ids_steps_and_clock_time() -> None:
    mem = ShortTermMemory(clock=Clock(100.0))
    first = mem.add(action="search", arguments={"q": "x"}, observation="found")
    second = mem.add(action="read")
    explicit = mem.add(step=10, result="done")
    after = mem.add(error="boom")
    assert (first.id, second.id, explicit.id, after.id) == (1, 2, 3, 4)
    assert (first.step, second.step, explicit.step, after.step) == (1, 2, 10, 11)
    assert (first.created_at, second.created_at) == (101.0, 102.0)
    assert mem.last_step == 11


def test_item_holds_standard_and_custom_fields() -> None:
    mem = ShortTermMemory()
    item = mem.add(
        action="tool",
        arguments={"a": 1},
        observation="obs",
        result={"ok": True},
        cost=0.25,
        error=None,
        screenshot_ref="obj://1",
        tokens=12,
    )
    assert item.fields() == {
        "action": "tool",
        "arguments": {"a": 1},
        "observation": "obs",
        "result": {"ok": True},
        "cost": 0.25,
        "screenshot_ref": "obj://1",
        "tokens": 12,
    }
    assert item.get("tokens") == 12
    assert item.get("error", "none") == "none"
    assert item.has("cost") and not item.has("error")
    assert item.pick("action", "tokens", "missing") == {"action": "tool", "tokens": 12}


def test_reserved_custom_field_names_are_refused() -> None:
    mem = ShortTermMemory()
    with pytest.raises(InvalidPayloadError):
        mem.add(action="x", created_at=1.0)
    with pytest.raises(InvalidPayloadError):
        mem.add(action="x", extra=1)
    assert len(mem) == 0


def test_non_json_values_are_refused_at_add() -> None:
    mem = ShortTermMemory()
    with pytest.raises(InvalidPayloadError):
        mem.add(observation=object())
    with pytest.raises(InvalidPayloadError):
        mem.add(cost=float("nan"))
    assert len(mem) == 0


def test_tags_are_deduplicated_and_validated() -> None:
    mem = ShortTermMemory()
    assert mem.add(action="a", tags=["x", "y", "x"]).tags == ("x", "y")
    assert mem.add(action="a", tags="solo").tags == ("solo",)
    with pytest.raises(InvalidPayloadError):
        mem.add(action="a", tags=["ok", ""])


def test_item_nbytes_is_its_compact_json_length() -> None:
    mem = ShortTermMemory()
    item = mem.add(action="héllo", observation=b"\x00\x01", tags=["t"])
    assert item.nbytes == len(encode_json_value(item.to_dict()).encode("utf-8"))
    assert mem.nbytes == item.nbytes


def test_render_item_is_deterministic_text() -> None:
    mem = ShortTermMemory()
    item = mem.add(step=3, action="search", arguments={"b": 2, "a": 1}, tags=["web"], note="n")
    assert render_item(item) == (
        '[step 3 #1 tags: web] action: search\n  arguments: {"a":1,"b":2}\n  note: n'
    )


# -- reading --------------------------------------------------------------


def test_latest_and_recent_return_newest_in_chronological_order() -> None:
    mem = ShortTermMemory()
    assert mem.latest() is None and mem.recent(3) == []
    items = [mem.add(action=str(i)) for i in range(6)]
    assert mem.latest() is items[-1]
    assert mem.recent(3) == items[3:]
    assert mem.recent(100) == items
    assert mem.recent(0) == [] and mem.recent(-1) == []
    assert list(mem) == items and list(reversed(mem)) == items[::-1]
    assert mem.items() == items and len(mem) == 6
    assert items[2] in mem and items[2].id in mem and 999 not in mem
    assert mem.get(items[2].id) is items[2] and mem.get(999) is None


def test_filter_by_fields_steps_and_tags() -> None:
    mem = ShortTermMemory()
    a = mem.add(step=1, action="search", tags=["web"])
    b = mem.add(step=1, observation="page", tags=["web", "io"])
    c = mem.add(step=2, action="write", error="disk full", tags=["io"])
    d = mem.add(step=3, action="think")
    assert mem.filter(fields=["action"]) == [a, c, d]
    assert mem.filter(fields=["action", "error"]) == [c]
    assert mem.filter(steps=[1]) == [a, b]
    assert mem.filter(steps=range(2, 4)) == [c, d]
    assert mem.filter(tags=["web"]) == [a, b]
    assert mem.filter(tags=["web", "io"]) == [a, b, c]
    assert mem.filter(tags=["web", "io"], all_tags=True) == [b]
    assert mem.filter(steps=[1, 2], tags=["io"], fields=["action"]) == [c]
    assert mem.filter(tags=["nope"]) == []
    assert mem.filter() == [a, b, c, d]
    assert mem.steps() == [1, 2, 3]
    assert mem.tags() == ["io", "web"]


def test_delete_and_delete_step_update_indexes() -> None:
    mem = ShortTermMemory()
    a = mem.add(step=1, action="a", tags=["x"])
    b = mem.add(step=1, action="b", tags=["x"])
    c = mem.add(step=2, action="c", tags=["y"])
    assert mem.delete(c.id) is True
    assert mem.delete(c.id) is False
    assert mem.tags() == ["x"] and mem.best({"y": 1}) is None
    assert mem.delete_step(1) == 2
    assert mem.delete_step(1) == 0
    assert len(mem) == 0 and mem.nbytes == 0 and mem.steps() == [] and mem.tags() == []
    assert a not in mem and b not in mem


def test_clear_empties_but_keeps_counting() -> None:
    mem = ShortTermMemory()
    mem.add(action="a", tags=["x"])
    mem.add(action="b", tags=["x"])
    mem.clear()
    assert len(mem) == 0 and mem.nbytes == 0 and mem.tags() == [] and mem.latest() is None
    assert mem.best({"x": 1}) is None
    item = mem.add(action="c")
    assert (item.id, item.step) == (3, 3)


# -- bounds ---------------------------------------------------------------


def test_item_count_bound_evicts_oldest_first() -> None:
    evicted: list[MemoryItem] = []
    mem = ShortTermMemory(max_items=3, on_evict=evicted.append)
    items = [mem.add(action=str(i), tags=["t"]) for i in range(5)]
    assert mem.items() == items[2:]
    assert evicted == items[:2]
    assert mem.nbytes == sum(i.nbytes for i in items[2:])
    assert mem.filter(tags=["t"]) == items[2:]
    assert mem.best_all({"t": 1}) == items[:1:-1]


def test_byte_bound_evicts_oldest_until_it_fits() -> None:
    mem = ShortTermMemory(max_items=None, max_bytes=300)
    small = [mem.add(action="s", observation="x" * 10) for _ in range(3)]
    assert mem.nbytes == sum(i.nbytes for i in small) <= 300
    big = mem.add(action="b", observation="y" * 150)
    kept = mem.items()
    assert kept[-1] is big
    assert mem.nbytes == sum(i.nbytes for i in kept) <= 300
    # Oldest first: what remains is a suffix of the insertion order.
    assert kept == [*small, big][-len(kept) :]
    assert len(kept) < 4


def test_item_larger_than_byte_bound_is_refused_and_nothing_evicted() -> None:
    mem = ShortTermMemory(max_bytes=200)
    kept = mem.add(action="ok")
    with pytest.raises(PayloadTooLargeError) as info:
        mem.add(observation="z" * 500)
    assert info.value.limit == 200 and info.value.size > 200
    assert mem.items() == [kept]
    assert mem.add(action="next").id == kept.id + 1


def test_both_bounds_apply() -> None:
    mem = ShortTermMemory(max_items=10, max_bytes=400)
    for i in range(30):
        mem.add(action=f"a{i}", observation="o" * (i % 7) * 10)
        assert len(mem) <= 10 and mem.nbytes <= 400


def test_invalid_bounds_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError):
        ShortTermMemory(max_items=0)
    with pytest.raises(ConfigurationError):
        ShortTermMemory(max_bytes=0)


# -- tag-weighted retrieval -------------------------------------------------


def test_best_returns_highest_score() -> None:
    mem = ShortTermMemory()
    both = mem.add(action="both", tags=["bug", "db"])
    mem.add(action="bug", tags=["bug"])
    mem.add(action="db", tags=["db"])
    assert mem.best({"bug": 1.0, "db": 1.0}) is both
    assert mem.best({"bug": 1.0, "db": 5.0}) is both  # 6 beats 5
    db_only = mem.best({"bug": -1.0, "db": 5.0})  # both: 4, db: 5
    assert db_only is not None and db_only.action == "db"
    assert mem.score(both, {"bug": 1.0, "db": 5.0}) == 6.0


def test_best_breaks_ties_by_recency() -> None:
    mem = ShortTermMemory()
    mem.add(action="old", tags=["x"])
    mem.add(action="mid", tags=["x", "y"])
    new = mem.add(action="new", tags=["x"])
    mem.add(action="other", tags=["z"])
    assert mem.best({"x": 1.0}) is new
    assert [i.action for i in mem.best_all({"x": 1.0})] == ["new", "mid", "old"]
    assert [i.action for i in mem.best_all({"x": 1.0, "y": 1.0})] == ["mid"]


def test_negative_weights_penalise_and_do_not_make_candidates() -> None:
    mem = ShortTermMemory()
    good = mem.add(action="good", tags=["plan"])
    mem.add(action="stale", tags=["plan", "stale"])
    mem.add(action="only-stale", tags=["stale"])
    assert mem.best({"plan": 1.0, "stale": -2.0}) is good
    assert mem.best({"stale": -1.0}) is None
    assert [(s, i.action) for s, i in mem.rank({"plan": 1.0, "stale": -2.0})] == [
        (1.0, "good"),
        (-1.0, "stale"),
    ]


def test_no_candidates_and_bad_weights() -> None:
    mem = ShortTermMemory()
    mem.add(action="a", tags=["x"])
    mem.add(action="untagged")
    assert mem.best({}) is None and mem.best_all({"nope": 1.0}) == []
    assert mem.best({"x": 0.0}) is None
    with pytest.raises(InvalidPayloadError):
        mem.best({"x": float("inf")})


def test_rank_orders_by_score_then_recency_and_honours_limit() -> None:
    mem = ShortTermMemory()
    for i in range(6):
        mem.add(action=str(i), tags=["a", "b"] if i % 3 == 0 else ["a"])
    ranked = mem.rank({"a": 1.0, "b": 2.0})
    assert [(s, i.action) for s, i in ranked] == [
        (3.0, "3"),
        (3.0, "0"),
        (1.0, "5"),
        (1.0, "4"),
        (1.0, "2"),
        (1.0, "1"),
    ]
    assert [i.action for _, i in mem.rank({"a": 1.0, "b": 2.0}, limit=3)] == ["3", "0", "5"]


def test_equal_scores_compare_equal_whatever_the_summation_order() -> None:
    mem = ShortTermMemory()
    older = mem.add(action="older", tags=["a", "b", "c"])
    newer = mem.add(action="newer", tags=["c", "b", "a", "d"])
    weights = {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.0}
    assert mem.score(older, weights) == mem.score(newer, weights)
    assert mem.best_all(weights) == [newer, older]


# -- round trips ------------------------------------------------------------


def test_round_trip_dicts_and_json() -> None:
    mem = ShortTermMemory(clock=Clock())
    mem.add(action="a", arguments={"k": [1, 2]}, tags=["x"], custom={"deep": True})
    mem.add(step=7, observation=b"\x89PNG\x00", error="e", cost=1.5)
    mem.add(result="r", tags=["x", "y"])
    back = ShortTermMemory.from_dicts(mem.to_dicts())
    assert back.items() == mem.items()
    text = mem.to_json()
    json.loads(text)
    again = ShortTermMemory.from_json(text)
    assert again.items() == mem.items()
    assert again.items()[1].observation == b"\x89PNG\x00"
    assert again.best({"y": 1}) == mem.best({"y": 1})
    assert again.add(action="next").id == 4 and again.last_step == 9


def test_from_dicts_applies_bounds_and_rejects_bad_input() -> None:
    mem = ShortTermMemory()
    for i in range(5):
        mem.add(action=str(i))
    small = ShortTermMemory.from_dicts(mem.to_dicts(), max_items=2)
    assert [i.action for i in small] == ["3", "4"]
    data = mem.to_dicts()
    with pytest.raises(InvalidPayloadError):
        ShortTermMemory.from_dicts([data[0], data[0]])
    with pytest.raises(InvalidPayloadError):
        ShortTermMemory.from_dicts([{"step": 1}])
    with pytest.raises(InvalidPayloadError):
        ShortTermMemory.from_dicts([{"id": "x", "step": 1}])
    with pytest.raises(InvalidPayloadError):
        ShortTermMemory.from_json("{not json")
    with pytest.raises(InvalidPayloadError):
        ShortTermMemory.from_json('{"a": 1}')


# -- model-based property test ----------------------------------------------

_TAGS = ["a", "b", "c", "d"]
_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.integers(0, 4),
            st.lists(st.sampled_from(_TAGS), max_size=3),
            st.integers(0, 60),
        ),
        st.tuples(st.just("delete_step"), st.integers(0, 4)),
        st.tuples(st.just("delete"), st.integers(1, 40)),
    ),
    max_size=40,
)


def _brute_best_all(items: list[MemoryItem], weights: dict[str, float]) -> list[MemoryItem]:
    scored = [
        (sum(weights.get(t, 0.0) for t in set(i.tags)), i)
        for i in items
        if any(weights.get(t, 0.0) > 0 for t in i.tags)
    ]
    if not scored:
        return []
    top = max(s for s, _ in scored)
    return sorted((i for s, i in scored if s == top), key=lambda i: -i.id)


@settings(max_examples=150, deadline=None)
@given(
    ops=_ops,
    max_items=st.integers(1, 8),
    weights=st.dictionaries(st.sampled_from(_TAGS), st.sampled_from([-1.0, 0.0, 1.0, 2.0])),
)
def test_memory_matches_a_plain_list_model(
    ops: list[tuple[Any, ...]], max_items: int, weights: dict[str, float]
) -> None:
    mem = ShortTermMemory(max_items=max_items, max_bytes=400)
    model: list[MemoryItem] = []
    for op in ops:
        if op[0] == "add":
            _, step, tags, size = op
            item = mem.add(step=step, observation="x" * size, tags=tags)
            model.append(item)
            while len(model) > max_items or sum(i.nbytes for i in model) > 400:
                model.pop(0)
        elif op[0] == "delete_step":
            mem.delete_step(op[1])
            model = [i for i in model if i.step != op[1]]
        else:
            mem.delete(op[1])
            model = [i for i in model if i.id != op[1]]
        assert mem.items() == model
    assert mem.nbytes == sum(i.nbytes for i in model)
    assert mem.recent(3) == model[-3:]
    assert mem.filter(tags=["a", "b"]) == [i for i in model if {"a", "b"} & set(i.tags)]
    assert mem.filter(steps=[1, 2]) == [i for i in model if i.step in (1, 2)]
    expected = _brute_best_all(model, weights)
    assert mem.best_all(weights) == expected
    assert mem.best(weights) == (expected[0] if expected else None)
    assert mem.tags() == sorted({t for i in model for t in i.tags})
    ranked = mem.rank(weights)
    assert [i for _, i in ranked[: len(expected)]] == expected
