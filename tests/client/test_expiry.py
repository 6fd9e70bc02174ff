"""``ExpiryTimer``: one timer for the expiries of many keys' latest revisions (issue 19: the board
stream has no expiry markers by default, so watches and views expire entries themselves)."""

from __future__ import annotations

import asyncio
import time

import pytest

from blackboard.client.expiry import ExpiryTimer

pytestmark = pytest.mark.asyncio


async def test_expiries_fire_in_deadline_order_for_the_latest_revisions_only() -> None:
    fired: list[tuple[str, int]] = []
    done = asyncio.Event()

    def on_expire(key: str, revision: int, deadline: float) -> None:
        assert deadline <= time.time()
        fired.append((key, revision))
        if key == "last":
            done.set()

    timer: ExpiryTimer[str] = ExpiryTimer(on_expire)
    now = time.time()
    timer.seen("b", 1, now + 0.10)
    timer.seen("a", 2, now + 0.05)
    timer.seen("rewritten", 3, now + 0.02)
    timer.seen("rewritten", 4, now + 0.08)  # a later revision replaces the pending expiry
    timer.seen("kept", 5, now + 0.03)
    timer.seen("kept", 6, None)  # its latest revision has no TTL: nothing expires
    timer.seen("last", 7, now + 0.15)
    assert timer.pending == 4
    await asyncio.wait_for(done.wait(), 2)
    assert fired == [("a", 2), ("rewritten", 4), ("b", 1), ("last", 7)]
    assert timer.pending == 0


async def test_a_past_deadline_fires_at_once_and_close_stops_everything() -> None:
    fired: list[str] = []
    timer: ExpiryTimer[str] = ExpiryTimer(lambda key, rev, at: fired.append(key))
    timer.seen("late", 1, time.time() - 5)  # replayed after its expiry: removed at once
    await asyncio.sleep(0.01)
    assert fired == ["late"]
    timer.seen("never", 2, time.time() + 0.02)
    timer.close()
    timer.seen("after-close", 3, time.time())
    await asyncio.sleep(0.05)
    assert fired == ["late"] and timer.pending == 0


async def test_one_timer_and_a_bounded_heap_for_many_keys_written_again_and_again() -> None:
    timer: ExpiryTimer[int] = ExpiryTimer(lambda key, rev, at: None)
    tasks = len(asyncio.all_tasks())
    far = time.time() + 60
    for revision in range(10_000):
        timer.seen(revision % 10, revision, far + revision)
    assert timer.pending == 10
    assert len(timer._heap) <= 2 * 10 + 64 + 1  # stale items are dropped, not kept forever
    assert len(asyncio.all_tasks()) == tasks  # a loop timer, no task per entry
    timer.close()
