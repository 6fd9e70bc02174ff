"""Pipelined writes: each future resolves to the write's revision, or to its typed error; none is left
pending, a write re-sent by ``flush`` included (issue 18, finding 7)."""

from __future__ import annotations

import asyncio
from typing import Any

import nats.errors
import pytest

from agents_sdk import Agent, ConflictError
from blackboard.settings import Settings

pytestmark = pytest.mark.asyncio


async def test_futures_resolve_to_the_revision_as_documented(settings: Settings, unique: str) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        async with board.pipeline() as pipe:
            futures = [await pipe.put("s", f"k{i}", i) for i in range(20)]
            futures.append(await pipe.delete("s", "k0"))
            first = await asyncio.wait_for(futures[0], 10)  # resolves with its ack, before any flush
            revisions = await pipe.flush()
        assert isinstance(first, int) and first == revisions[0]
        assert [f.result() for f in futures] == revisions
        assert all(type(f.result()) is int for f in futures)
        assert (await board.get("s", "k19")).revision == revisions[19]


async def test_a_failed_write_resolves_its_future_to_the_typed_error(settings: Settings, unique: str) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        rev = await board.put("s", "k", 0)
        pipe = board.pipeline()
        ok = await pipe.put("s", "k", 1, expected_revision=rev)
        lost = await pipe.put("s", "k", 2, expected_revision=rev)
        with pytest.raises(ConflictError):
            await pipe.flush()
        assert ok.result() == (await board.get("s", "k")).revision
        assert isinstance(lost.exception(), ConflictError)


async def test_a_write_re_sent_by_flush_resolves_its_future(settings: Settings, unique: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        publisher = agent.store._publisher
        send = publisher.send
        calls = 0

        async def flaky_send(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 2:  # the second write cannot go out now: flush sends it again
                raise nats.errors.TimeoutError
            return await send(*args, **kwargs)

        monkeypatch.setattr(publisher, "send", flaky_send)
        pipe = board.pipeline()
        futures = [await pipe.put("s", f"k{i}", i) for i in range(3)]
        revisions = await pipe.flush()
        assert all(f.done() for f in futures)
        assert [f.result() for f in futures] == revisions
        assert (await board.get("s", "k1")).revision == revisions[1]


async def test_futures_of_a_cancelled_flush_do_not_stay_pending(settings: Settings, unique: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        publisher = agent.store._publisher

        async def never(*args: Any, **kwargs: Any) -> Any:
            raise nats.errors.TimeoutError

        monkeypatch.setattr(publisher, "send", never)
        store = agent.store
        resend = asyncio.Event()

        async def hang(*args: Any, **kwargs: Any) -> int:
            resend.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        monkeypatch.setattr(store, "_publish_prepared", hang)
        pipe = board.pipeline()
        futures = [await pipe.put("s", f"k{i}", i) for i in range(2)]
        flush = asyncio.create_task(pipe.flush())
        await asyncio.wait_for(resend.wait(), 30)
        flush.cancel()
        with pytest.raises(asyncio.CancelledError):
            await flush
        assert all(f.done() for f in futures)
