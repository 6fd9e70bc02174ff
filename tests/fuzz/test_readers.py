"""The SDK's readers meet hostile messages on the bus: they return, skip, or raise one of our
errors (a :class:`BlackboardError`), never a raw exception, and they keep going.

Each example publishes a batch of generated messages raw (``tests/fuzz/strategies.py``)
to a fresh board or agent, then a valid sentinel written through the SDK, and reads:

* ``board.get`` of every hostile key, ``board.history`` of one;
* a view opened before the garbage and one opened after it: both must come to
  hold the sentinel (one bad entry does not kill a view);
* a watch from the start: iterated to the sentinel;
* the inbox of the agent the direct messages went to: iterated to the sentinel;
* a vote: hostile ballots, closes and outcomes on a real proposal's subjects, then
  a valid ballot; ``outcome()``, ``proposal()`` and a vote watch.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest
from hypothesis import given

from agents_sdk import Agent, BlackboardError
from blackboard.protocol.subjects import Subjects
from tests.fuzz.accounting import publish_all
from tests.fuzz.conftest import FuzzStack
from tests.fuzz.profile import fuzz_settings
from tests.fuzz.strategies import Ctx, Plan, plans_of

pytestmark = pytest.mark.asyncio

T = TypeVar("T")
#: How long a reader may take to reach the sentinel.
REACH = 10.0


def _ctx() -> Ctx:
    return Ctx(board="fr" + uuid.uuid4().hex[:10], agent="r" + uuid.uuid4().hex[:8])


class Raw(AssertionError):
    """A reader raised an exception outside the error tree."""


async def typed(what: str, call: Callable[[], Awaitable[T]]) -> T | BlackboardError:
    """``await call()``; one of our errors is returned, anything else fails the test naming ``what``."""
    try:
        return await call()
    except BlackboardError as exc:
        return exc
    except Exception as exc:
        raise Raw(f"{what} raised {type(exc).__name__} outside the error tree: {exc!s:.300}") from exc


async def until(what: str, items: AsyncIterator[Any], found: Callable[[Any], bool]) -> list[BlackboardError]:
    """Iterate ``items`` until ``found``; typed errors are collected (the iterator must go on after one)."""
    errors: list[BlackboardError] = []

    async def run() -> None:
        while True:
            try:
                item = await items.__anext__()
            except StopAsyncIteration:
                raise AssertionError(f"{what} ended before the sentinel (typed errors: {errors[:3]})") from None
            except BlackboardError as exc:
                errors.append(exc)
                if len(errors) > 1000:
                    raise AssertionError(f"{what} keeps raising {exc!r}") from exc
                continue
            except Exception as exc:
                raise Raw(f"{what} raised {type(exc).__name__} outside the error tree: {exc!s:.300}") from exc
            if found(item):
                return

    try:
        await asyncio.wait_for(run(), REACH)
    except TimeoutError:
        raise AssertionError(f"{what} did not reach the sentinel within {REACH:g}s "
                             f"(typed errors: {errors[:3]})") from None
    return errors


@fuzz_settings(5)
@given(batch=plans_of(("entry",), min_size=15, max_size=30))
async def test_board_readers_survive_hostile_entries(fuzz: FuzzStack, batch: list[Plan]) -> None:
    ctx = _ctx()
    board = fuzz.agent.board(ctx.board)
    early = await typed("view (opened before)", lambda: board.view("fz").start())
    assert not isinstance(early, BlackboardError), early
    watch = board.watch("fz", start="all")
    await typed("board.watch start", watch.start)
    wires = [plan.wire(ctx, i) for i, plan in enumerate(batch)]
    await publish_all(fuzz.nc.jetstream(), wires)
    for i in range(len(wires)):
        await typed(f"board.get of {wires[i]!r}", lambda i=i: board.get("fz", f"k{i}"))  # type: ignore[misc]
    await typed("board.history", lambda: board.history("fz", "k0"))
    await typed("board.sections", board.sections)
    await typed("board.keys", lambda: board.keys("fz"))
    late = await typed("view (opened after)", lambda: board.view("fz").start())
    await board.put("fz", "sentinel", "still alive")
    for name, view in (("view opened before the garbage", early), ("view opened after the garbage", late)):
        assert not isinstance(view, BlackboardError), f"{name}: {view!r}"
        done = await typed(name, lambda view=view: view.wait_for(  # type: ignore[misc]
            lambda v: ("fz", "sentinel") in v, timeout=REACH))
        assert not isinstance(done, BlackboardError), f"{name} did not reach the sentinel: {done!r}"
        await view.close()
    try:
        await until("board.watch", aiter(watch), lambda change: change.entry.key == "sentinel")
    finally:
        await watch.stop()


@fuzz_settings(5)
@given(batch=plans_of(("direct",), min_size=15, max_size=30))
async def test_inbox_survives_hostile_direct_messages(fuzz: FuzzStack, batch: list[Plan]) -> None:
    ctx = _ctx()
    async with Agent.connect(ctx.agent, settings=fuzz.settings) as reader:
        inbox = reader.inbox(timeout=REACH)
        await inbox.open()
        await publish_all(fuzz.nc.jetstream(), [plan.wire(ctx, i) for i, plan in enumerate(batch)])
        await fuzz.agent.send(ctx.agent, "sentinel", "after the garbage")

        def sentinel(msg: Any) -> bool:
            return msg.type == "sentinel"

        async def acked() -> AsyncIterator[Any]:
            async for msg in inbox:
                await msg.ack()
                yield msg

        try:
            await until("inbox iteration", acked(), sentinel)
        finally:
            await inbox.close()


@fuzz_settings(5)
@given(batch=plans_of(("ballot", "close", "outcome", "applied", "proposal"), min_size=10, max_size=25))
async def test_vote_readers_survive_hostile_vote_messages(fuzz: FuzzStack, batch: list[Plan]) -> None:
    ctx = _ctx()
    voter = fuzz.agent
    board = voter.board(ctx.board)
    handle = await board.propose("fz", "k", ["a", "b"], voters=[voter.id], proposal_id="p0")
    watch = board.watch_votes(start="all")
    await watch.start()
    wires = [plan.wire(ctx, 0 if plan.kind != "proposal" else i + 1) for i, plan in enumerate(batch)]
    await publish_all(fuzz.nc.jetstream(), wires)
    for i, w in enumerate(wires):
        if w.kind == "proposal":
            await typed(f"voting.proposal of {w!r}", lambda i=i: board.proposal(f"p{i + 1}"))  # type: ignore[misc]
    await typed("board.vote", lambda: board.vote("p0", "a"))
    outcome = await typed("outcome()", lambda: handle.outcome(timeout=REACH))
    await typed("proposal()", lambda: board.proposal("p0"))
    try:
        await until("vote watch", aiter(watch),
                    lambda event: getattr(event, "kind", None) in ("outcome", "applied"))
    finally:
        await watch.stop()
    assert Subjects.vote(ctx.board, "p0", "outcome")  # the subjects fuzzed were the proposal's own
    del outcome
