"""The registry of a connection's permission refusals (no server): the server's error text is
parsed, refusals are remembered case-insensitively and bounded, and a guard turns a refusal of
its subject into PermissionDeniedError without swallowing anybody else's cancellation."""

from __future__ import annotations

import asyncio
import gc
import sys

import pytest

from blackboard.client import connection
from blackboard.client.connection import Kind, PermissionViolations, parse_violation
from blackboard.protocol.errors import PermissionDeniedError


@pytest.mark.parametrize(("text", "parsed"), [
    ('nats: permissions violation for publish to "$kv.blackboard.b.s.k"', ("publish", "$kv.blackboard.b.s.k")),
    ("nats: 'Permissions Violation for Publish to \"bb.vote.b.p.outcome\"'", ("publish", "bb.vote.b.p.outcome")),
    ('nats: permissions violation for subscription to "bb.msg.>"', ("subscribe", "bb.msg.>")),
    ('nats: permissions violation for subscription to "bb.rpc.x" using queue "bb-rpc"', ("subscribe", "bb.rpc.x")),
    ("nats: authorization violation", None),
    ("nats: stale connection", None),
])
def test_the_servers_error_text_is_parsed(text: str, parsed: tuple[str, str] | None) -> None:
    assert parse_violation(text) == parsed


@pytest.mark.asyncio
async def test_refusals_are_remembered_case_insensitively_since_a_moment_and_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "_REMEMBERED", 3)
    v = PermissionViolations("alice")
    before = asyncio.get_running_loop().time()
    assert v.record("publish", "$kv.blackboard.secret.s.k")
    assert not v.record("publish", "$KV.blackboard.secret.s.k")  # the same, again
    assert v.refused("publish", "$KV.blackboard.secret.s.k", before)
    assert not v.refused("publish", "$KV.blackboard.secret.s.k", asyncio.get_running_loop().time() + 1)
    assert not v.refused("subscribe", "$KV.blackboard.secret.s.k")
    for i in range(3):
        v.record("publish", f"s{i}")
    assert not v.refused("publish", "$KV.blackboard.secret.s.k")  # the oldest forgotten


@pytest.mark.asyncio
async def test_listeners_are_told_and_held_weakly() -> None:
    v = PermissionViolations("alice")
    heard: list[tuple[Kind, str]] = []

    class Listener:
        def on(self, kind: Kind, subject: str) -> None:
            heard.append((kind, subject))

    one, two = Listener(), Listener()
    v.add_listener(one.on)
    v.add_listener(two.on)
    v.record("publish", "A.b")
    assert heard == [("publish", "a.b")] * 2
    v.remove_listener(one.on)
    del two
    gc.collect()
    v.record("subscribe", "c")
    assert heard == [("publish", "a.b")] * 2


@pytest.mark.asyncio
async def test_a_guard_ends_the_wait_on_a_refusal_of_its_subject() -> None:
    v = PermissionViolations("alice")
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def wait() -> None:
        with v.guard("$JS.API.STREAM.DELETE.X", "deleting X"):
            await never

    task = asyncio.ensure_future(wait())
    await asyncio.sleep(0)
    v.record("publish", "$js.api.stream.delete.y")  # another subject: no effect
    v.record("subscribe", "$js.api.stream.delete.x")  # a subscription: no effect
    await asyncio.sleep(0.01)
    assert not task.done()
    v.record("publish", "$js.api.stream.delete.x")
    with pytest.raises(PermissionDeniedError) as err:
        await task
    assert "$JS.API.STREAM.DELETE.X" in str(err.value) and "deleting X" in str(err.value)
    assert err.value.operation == "publish to $JS.API.STREAM.DELETE.X"
    assert not v.guards
    assert asyncio.current_task() is not None and asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_a_guard_inside_a_timeout_raises_the_refusal_not_a_timeout() -> None:
    v = PermissionViolations("alice")

    async def wait() -> None:
        async with asyncio.timeout(5):
            with v.guard("s", "x"):
                await asyncio.sleep(10)

    task = asyncio.ensure_future(wait())
    await asyncio.sleep(0)
    v.record("publish", "s")
    with pytest.raises(PermissionDeniedError):
        await task


@pytest.mark.asyncio
async def test_a_cancellation_from_elsewhere_is_not_swallowed_by_a_refusal() -> None:
    v = PermissionViolations("alice")

    async def wait() -> None:
        with v.guard("s", "x"):
            await asyncio.sleep(10)

    task = asyncio.ensure_future(wait())
    await asyncio.sleep(0)
    v.record("publish", "s")
    task.cancel()  # the caller cancels too, before the task ran again
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.asyncio
async def test_a_wait_that_finished_before_the_refusal_landed_keeps_its_result() -> None:
    v = PermissionViolations("alice")
    done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def wait() -> int:
        with v.guard("s", "x"):
            result = await asyncio.wait_for(done, 5)
        await asyncio.sleep(0)  # no stray cancellation arrives afterwards
        return result

    task = asyncio.ensure_future(wait())
    await asyncio.sleep(0.01)
    done.set_result(7)  # the answer is in ...
    v.record("publish", "s")  # ... and the refusal (of an earlier send) arrives before the task resumes
    # The cancellation lands in the finished wait_for, which returns its result (Python 3.11;
    # 3.12 raises it: then the guard raises the refusal). Either way no stray CancelledError.
    try:
        assert await task == 7
    except PermissionDeniedError:
        assert sys.version_info >= (3, 12)
