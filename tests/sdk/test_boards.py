"""``agent.boards()``: the boards that hold at least one live key (issue 18, finding 7)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agents_sdk import Agent
from blackboard.devstack import EmbeddedNats
from blackboard.settings import Settings
from tests.conftest import make_settings

pytestmark = pytest.mark.asyncio


async def test_boards_lists_the_boards_with_a_live_key(settings: Settings, unique: str) -> None:
    async with Agent.connect("lister", settings=settings) as agent:
        live, other, deleted, purged = (f"{unique}{s}" for s in ("a", "b", "c", "d"))
        await agent.board(live).put("s", "k", 1)
        await agent.board(live).put("t", "k", 2)
        await agent.board(deleted).put("s", "gone", 1)
        await agent.board(other).put("s", "k", 1)
        await agent.board(deleted).delete("s", "gone")
        await agent.board(other).delete("s", "k")
        await agent.board(other).put("s", "k2", 2)  # its deleted key comes first: the live one is read after it
        await agent.board(purged).put("s", "k", 1)
        await agent.board(purged).purge()
        boards = await agent.boards()
        assert boards == sorted(boards)
        assert {b for b in boards if b.startswith(unique)} == {live, other}
        # The same boards as a scan of every key's latest revision.
        store = agent.store
        scanned = sorted({p.board for p in await store._scan_keys(store.subjects.entry_filter())})
        assert boards == scanned


async def test_boards_of_an_empty_bucket(nats_factory: Callable[[], EmbeddedNats]) -> None:
    server = nats_factory()
    async with Agent.connect("lister", settings=make_settings(server.url)) as agent:
        assert await agent.boards() == []
