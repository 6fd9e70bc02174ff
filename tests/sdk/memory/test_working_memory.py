"""Working memory: TTL expiry (lazy, injected clock), refresh on update, listings."""

from __future__ import annotations

import pytest

from agents_sdk.memory import WorkingMemory
from agents_sdk.memory.working import GOAL, HYPOTHESIS, REASONING
from blackboard.protocol.errors import ConfigurationError, InvalidPayloadError, NotFoundError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_set_and_get_with_kind_defaulting_to_key(clock: Clock) -> None:
    wm = WorkingMemory(clock=clock)
    item = wm.set("goal", "fix the bug")
    assert item.kind == "goal" and item.key == "goal"
    assert wm.get("goal") == "fix the bug" and wm.goal == "fix the bug"
    assert wm.set("h", "race", kind=HYPOTHESIS).kind == HYPOTHESIS
    assert wm.get("missing", "dflt") == "dflt"


def test_item_expires_exactly_at_its_ttl(clock: Clock) -> None:
    wm = WorkingMemory(clock=clock)
    wm.set("focus", "parser", ttl=10)
    clock.advance(9.999)
    assert wm.get("focus") == "parser" and "focus" in wm and len(wm) == 1
    clock.advance(0.001)
    assert wm.get("focus") is None
    assert "focus" not in wm and len(wm) == 0 and wm.live() == []


def test_expiry_is_lazy_and_reported_by_expire(clock: Clock) -> None:
    wm = WorkingMemory(clock=clock)
    wm.set("a", 1, ttl=5)
    wm.set("b", 2, ttl=1)
    wm.set("c", 3, ttl=None)
    clock.advance(10)
    expired = wm.expire()
    assert [i.key for i in expired] == ["b", "a"]  # soonest deadline first
    assert [i.key for i in wm.live()] == ["c"]
    assert wm.expire() == []


def test_updating_an_item_refreshes_its_ttl_and_keeps_its_position(clock: Clock) -> None:
    wm = WorkingMemory(clock=clock)
    first = wm.set("goal", "v1", ttl=10)
    wm.set("note", "n", ttl=100)
    clock.advance(8)
    updated = wm.set("goal", "v2", ttl=10)
    assert updated.created_at == first.created_at == 0.0
    assert updated.updated_at == 8.0 and updated.expires_at == 18.0
    clock.advance(5)  # the first deadline (10) has passed; the stale one must not expire it
    assert wm.get("goal") == "v2"
    assert [i.key for i in wm.live()] == ["goal", "note"]
    clock.advance(5)
    assert wm.get("goal") is None


def test_update_can_remove_or_set_a_ttl(clock: Clock) -> None:
    wm = WorkingMemory(clock=clock, default_ttl=None)
    wm.set("k", 1)
    assert wm.item("k") is not None and wm.item("k").expires_at is None  # type: ignore[union-attr]
    wm.set("k", 2, ttl=3)
    clock.advance(3)
    assert "k" not in wm
    wm.set("j", 1, ttl=3)
    wm.set("j", 2, ttl=None)
    clock.advance(100)
    assert wm.get("j") == 2


def test_default_ttl_applies_when_none_given(clock: Clock) -> None:
    wm = WorkingMemory(clock=clock, default_ttl=30)
    item = wm.set("x", 1)
    assert item.expires_at == 30 and item.remaining(clock.now) == 30
    clock.advance(30)
    assert wm.get("x") is None


def test_touch_refreshes_and_fails_on_missing(clock: Clock) -> None:
    wm = WorkingMemory(clock=clock)
    wm.set("focus", "f", ttl=5)
    clock.advance(4)
    assert wm.touch("focus", ttl=5).expires_at == 9
    clock.advance(4)
    assert wm.focus == "f"
    clock.advance(1)
    with pytest.raises(NotFoundError):
        wm.touch("focus")


def test_append_reasoning_and_hypotheses_get_fresh_keys(clock: Clock) -> None:
    wm = WorkingMemory(clock=clock)
    wm.set_goal("ship it", ttl=None)
    r1 = wm.add_reasoning("step one")
    r2 = wm.add_reasoning("step two", ttl=1)
    h1 = wm.add_hypothesis("cache is stale")
    wm.set_focus("module x")
    assert (r1.key, r2.key, h1.key) == ("reasoning-1", "reasoning-2", "hypothesis-1")
    assert [i.value for i in wm.live(REASONING)] == ["step one", "step two"]
    assert [i.key for i in wm.live()] == [
        GOAL,
        "reasoning-1",
        "reasoning-2",
        "hypothesis-1",
        "focus",
    ]
    clock.advance(1)
    assert [i.value for i in wm.live(REASONING)] == ["step one"]
    # A key still in use is skipped, not overwritten.
    wm.set("note-1", "mine")
    assert wm.append("note", "auto").key == "note-2"
    assert [i.key for i in wm] == [i.key for i in wm.live()]


def test_delete_and_clear(clock: Clock) -> None:
    wm = WorkingMemory(clock=clock)
    wm.set("a", 1, ttl=5)
    wm.set("b", 2)
    assert wm.delete("a") is True and wm.delete("a") is False
    clock.advance(5)  # the deleted item's deadline passes harmlessly
    assert [i.key for i in wm.live()] == ["b"]
    wm.clear()
    assert len(wm) == 0 and wm.expire() == []


def test_invalid_ttls_and_keys_are_refused(clock: Clock) -> None:
    with pytest.raises(ConfigurationError):
        WorkingMemory(default_ttl=0)
    wm = WorkingMemory(clock=clock)
    for bad in (0, -1, float("nan")):
        with pytest.raises(InvalidPayloadError):
            wm.set("k", 1, ttl=bad)
    with pytest.raises(InvalidPayloadError):
        wm.set("", 1)
    assert len(wm) == 0
