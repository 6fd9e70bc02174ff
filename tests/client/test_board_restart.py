"""Server crashes: acknowledged writes survive, writes wait out the outage, watches resume."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from agents_sdk import Agent, NotConnectedError, Operation
from blackboard.devstack import EmbeddedNats
from blackboard.protocol.errors import OperationTimeoutError
from tests.conftest import make_settings

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


async def _restart_after(server: EmbeddedNats, delay: float, down_for: float) -> None:
    await asyncio.sleep(delay)
    server.kill()
    await asyncio.sleep(down_for)
    await asyncio.to_thread(server.start)


async def test_server_killed_mid_run_loses_no_acknowledged_write(
        nats_factory: Callable[[], EmbeddedNats]) -> None:
    server = nats_factory()
    settings = make_settings(server.url)
    acked: dict[str, tuple[int, int]] = {}
    async with Agent.connect("survivor", settings=settings) as agent:
        board = agent.board("crash")

        loop = asyncio.get_running_loop()
        restart = asyncio.create_task(_restart_after(server, 0.3, 1.0))
        slowest = 0.0
        i = 0
        # Write before, during and after the outage.
        after_restart = 0
        while after_restart < 200:
            t0 = loop.time()
            rev = await board.put("s", f"k{i}", i)
            slowest = max(slowest, loop.time() - t0)
            acked[f"k{i}"] = (rev, i)
            i += 1
            if restart.done():
                after_restart += 1
        await restart
        assert server.running
        assert slowest >= 0.5, "no write spanned the outage"

        # Every acknowledged write is there, once, with its revision and value.
        for key, (rev, value) in acked.items():
            entry = await board.get("s", key)
            assert (entry.revision, entry.value) == (rev, value)
        assert len(await board.keys("s")) == len(acked)
        for key in acked:
            if int(key[1:]) % 50 == 0:
                assert len(await board.history("s", key)) == 1


async def test_pipelined_writes_survive_a_restart(nats_factory: Callable[[], EmbeddedNats]) -> None:
    server = nats_factory()
    settings = make_settings(server.url)
    async with Agent.connect("bulk", settings=settings) as agent:
        board = agent.board("crash-pipe")
        restart = asyncio.create_task(_restart_after(server, 0.2, 0.8))
        revisions: list[int] = []
        batch = 0
        while not restart.done() or batch < 5:
            async with board.pipeline() as pipe:
                for i in range(200):
                    await pipe.put("s", f"b{batch}-{i}", i)
                revisions.extend(await pipe.flush())
            batch += 1
        await restart
        keys = await board.keys("s")
    assert batch >= 5
    assert len(revisions) == 200 * batch
    assert len(set(revisions)) == len(revisions)  # no write applied twice
    assert len(keys) == len(revisions)


async def test_write_during_long_outage_fails_with_typed_error(
        nats_factory: Callable[[], EmbeddedNats]) -> None:
    server = nats_factory()
    settings = make_settings(server.url)
    settings = settings.model_copy(update={"nats": settings.nats.model_copy(
        update={"write_timeout": 1.0, "request_timeout": 0.5})})  # keeps the credentials and the CA
    async with Agent.connect("impatient", settings=settings) as agent:
        board = agent.board("outage")
        await board.put("s", "before", 1)
        server.kill()
        with pytest.raises((NotConnectedError, OperationTimeoutError)):
            await board.put("s", "during", 2)
        await asyncio.to_thread(server.start)
        # the connection comes back by itself
        for _ in range(100):
            try:
                await board.put("s", "after", 3)
                break
            except (NotConnectedError, OperationTimeoutError):
                await asyncio.sleep(0.1)
        assert (await board.get("s", "after")).value == 3
        assert (await board.get("s", "before")).value == 1


async def test_watch_resumes_after_restart_without_gaps_or_duplicates(
        nats_factory: Callable[[], EmbeddedNats]) -> None:
    server = nats_factory()
    settings = make_settings(server.url)
    async with Agent.connect("w", settings=settings) as writer, Agent.connect("r", settings=settings) as reader:
        board = writer.board("crash-watch")
        async with reader.board("crash-watch").watch() as watch:
            written = [await board.put("s", f"k{i % 5}", i) for i in range(20)]
            server.kill()
            await asyncio.sleep(0.5)
            await asyncio.to_thread(server.start)
            written += [await board.put("s", f"k{i % 5}", i) for i in range(20, 40)]
            seen = [await watch.next(20) for _ in range(40)]
    assert [c.revision for c in seen] == written
    assert all(c.operation is Operation.PUT for c in seen)
