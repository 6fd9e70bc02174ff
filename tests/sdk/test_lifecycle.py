"""Background work of the SDK: the task host's readiness handshake, and an agent's close ending it all."""

from __future__ import annotations

import asyncio

import pytest

from agents_sdk import Agent, Message
from agents_sdk.lifecycle import TaskHost, TaskStatus
from blackboard.protocol.errors import NotConnectedError
from blackboard.settings import Settings
from tests._lost_cancel import lose_a_cancel

pytestmark = pytest.mark.asyncio


async def test_start_returns_what_the_service_reported_and_close_cancels_it() -> None:
    cancelled = asyncio.Event()

    async def service(status: TaskStatus[str]) -> None:
        status.started("up")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with TaskHost("test") as host:
        assert await host.start(service) == "up"
        assert not cancelled.is_set()
    assert cancelled.is_set()
    assert not host.running


async def test_a_service_failing_before_it_is_up_raises_from_start_only() -> None:
    async def service(status: TaskStatus[None]) -> None:
        raise ValueError("no snapshot")

    host = await TaskHost("test").open()
    with pytest.raises(ValueError, match="no snapshot"):
        await host.start(service)
    await host.aclose()  # start reported it: closing does not raise it again


async def test_a_service_returning_before_it_is_up_is_not_connected() -> None:
    async def service(status: TaskStatus[None]) -> None:
        return

    async with TaskHost("test") as host:
        with pytest.raises(NotConnectedError):
            await host.start(service)


async def test_a_failure_after_start_cancels_the_siblings_and_is_raised_by_close() -> None:
    sibling_cancelled = asyncio.Event()
    fail = asyncio.Event()

    async def sibling() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            sibling_cancelled.set()
            raise

    async def service(status: TaskStatus[None]) -> None:
        status.started()
        await fail.wait()
        raise KeyError("lost")

    host = await TaskHost("test").open()
    host.spawn(sibling())
    await host.start(service)
    fail.set()
    await asyncio.wait_for(sibling_cancelled.wait(), 5)
    assert not host.running
    with pytest.raises(NotConnectedError):
        host.spawn(asyncio.sleep(0))
    with pytest.raises(KeyError, match="lost"):
        await host.aclose()


async def test_stopping_is_set_before_a_failure_cancels_the_siblings() -> None:
    """A sibling whose cancel is lost (Python 3.11's ``asyncio.wait_for`` returns a result
    that is ready instead of raising it) ends its loop on ``stopping``; close() then returns."""
    fail = asyncio.Event()
    entered = asyncio.Event()
    turns = 0

    async def sibling(host: TaskHost) -> None:
        nonlocal turns
        while not host.stopping:
            turns += 1
            if turns == 1:
                entered.set()
                await lose_a_cancel()  # an answer "arrives" while the group cancels
            else:
                await asyncio.sleep(0.01)

    async def failing() -> None:
        await fail.wait()
        raise KeyError("lost")

    host = await TaskHost("test").open()
    task = host.spawn(sibling(host))
    host.spawn(failing())
    await asyncio.wait_for(entered.wait(), 5)
    assert not host.stopping
    fail.set()
    done, _ = await asyncio.wait([task], timeout=5)
    assert done, "the sibling ran on after the failure"
    assert host.stopping and turns == 1
    with pytest.raises(KeyError, match="lost"):
        await host.aclose()


async def test_spawn_needs_an_open_host() -> None:
    host = TaskHost("test")
    with pytest.raises(NotConnectedError):
        host.spawn(asyncio.sleep(0))
    await host.open()
    await host.aclose()
    with pytest.raises(NotConnectedError):
        host.spawn(asyncio.sleep(0))
    with pytest.raises(NotConnectedError):
        await host.open()


def _sdk_tasks(agent_id: str, board: str) -> list[str]:
    names = (f"view:{board}", f"rpc {agent_id}", f"inbox {agent_id}", f"inbox keepalive {agent_id}")
    return sorted(t.get_name() for t in asyncio.all_tasks() if not t.done() and t.get_name().startswith(names))


async def test_closing_an_agent_ends_its_views_handlers_and_inbox(settings: Settings, unique: str) -> None:
    me, peer = f"{unique}-me", f"{unique}-peer"
    started = asyncio.Event()
    handler_cancelled = asyncio.Event()

    async def slow(request: Message) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            handler_cancelled.set()
            raise

    async with Agent.connect(peer, settings=settings) as other:
        agent = await Agent.connect(me, settings=settings)
        board = agent.board(unique)
        await board.put("s", "k", 1)
        view = await board.view("s")
        await agent.handle("slow", slow)
        pending = asyncio.create_task(other.request(me, "slow", timeout=30))
        await asyncio.wait_for(started.wait(), 10)
        await agent.send(me, "note", {"n": 1})
        inbox = agent.inbox(timeout=5)
        msg = await inbox.__anext__()
        assert msg.type == "note"
        running = _sdk_tasks(me, unique)
        assert any(n.startswith("view:") for n in running), running
        assert any(n.startswith("rpc ") for n in running), running
        assert any(n.startswith("inbox keepalive") for n in running), running

        await agent.close()

        assert _sdk_tasks(me, unique) == []
        assert handler_cancelled.is_set()
        assert inbox.closed
        assert agent.context.views.watching(unique) is False
        assert view.value("s", "k") == 1  # the local copy stays readable
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)
