"""``agent.boards()``: the boards that hold at least one live key (issue 18, finding 7).

With a credential the listing is the system service's (``bb.search.<agent>.boards``,
issue 19): an agent may not read the board stream's subjects across every board
(``$JS.API.STREAM.INFO`` with a subjects filter, or a consumer on ``$KV.<bucket>.>``), so
the worker lists them and answers with the boards the agent may read. On an open bus the
agent lists them itself, as before.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agents_sdk import Agent, PermissionDeniedError, SearchError
from blackboard.client.board_store import BoardStore
from blackboard.client.connection import connect_nats, permission_violations
from blackboard.devstack import EmbeddedNats
from blackboard.settings import Settings
from tests._worker_helpers import running_worker, worker_settings

pytestmark = pytest.mark.asyncio


def _refused_anything(agent: Agent) -> bool:
    """Whether the server refused one of the forbidden listing requests to the agent."""
    violations = permission_violations(agent.nc)
    assert violations is not None
    kv = agent.store.subjects.kv_stream
    return violations.refused("publish", f"$JS.API.STREAM.INFO.{kv}")


async def test_boards_lists_the_boards_with_a_live_key(pg_settings: Settings, unique: str) -> None:
    settings = worker_settings(pg_settings, name=f"w{unique}", batch_wait=0.02)
    async with Agent.connect("lister", settings=settings) as agent, running_worker(settings):
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
        assert not _refused_anything(agent)
        # The same boards as a scan of every key's latest revision, by the system identity.
        nc = await connect_nats(settings.nats, name="scan")
        try:
            store = BoardStore(nc, settings)
            scanned = sorted({p.board for p in await store._scan_keys(store.subjects.entry_filter())})
        finally:
            await nc.close()
        assert {b for b in boards if b.startswith(unique)} == {b for b in scanned if b.startswith(unique)}


async def test_boards_lists_only_the_boards_the_agent_may_read(pg_settings: Settings, unique: str) -> None:
    settings = worker_settings(pg_settings, name=f"w{unique}", batch_wait=0.02)
    async with (Agent.connect("writer", settings=settings) as writer,
                Agent.connect(f"solo-{unique}", settings=settings) as solo,
                Agent.connect(f"reader-{unique}", settings=settings) as reader,
                Agent.connect(f"outsider-{unique}", settings=settings) as outsider,
                running_worker(settings)):
        await writer.board(unique).put("s", "k", 1)
        await solo.board("solo-board").put("s", unique, 1)
        assert await solo.boards() == ["solo-board"]  # the policy grants it that board only
        assert unique in await reader.boards()  # read rights are enough
        assert await outsider.boards() == []  # declared, but no right on any board
        assert {unique, "solo-board"} <= set(await writer.boards())
        assert not any(_refused_anything(a) for a in (solo, reader, outsider, writer))


async def test_boards_needs_a_running_system_service(settings: Settings, unique: str) -> None:
    """No worker serves the session's bus here: the listing fails with a typed error saying so."""
    s = settings.model_copy(update={"search": settings.search.model_copy(update={"timeout": 2.0})})
    async with Agent.connect("lister", settings=s) as agent:
        await agent.board(unique).put("s", "k", 1)
        with pytest.raises(SearchError, match="not running") as raised:
            await agent.boards()
        assert "boards" in str(raised.value)
        assert not _refused_anything(agent)


async def test_a_principal_the_policy_does_not_know_is_refused(pg_settings: Settings, unique: str) -> None:
    """The service reads the rights of the principal the subject names from the policy: the
    worker's own credential names a principal that is not an agent, and the service's
    RightsSource refuses an id it does not declare."""
    from blackboard.protocol.schemas.search import BoardsResponse
    from blackboard.search.service import SearchService
    from tests._worker_helpers import HashProvider

    class _Nobody:
        def rights(self, principal: str) -> None:
            return None

    settings = worker_settings(pg_settings, name=f"w{unique}")
    nc = await connect_nats(settings.nats, name="system")
    try:
        async with SearchService(nc, settings, provider=HashProvider(), rights=_Nobody()):
            from agents_sdk.search import search_request

            with pytest.raises(PermissionDeniedError, match="not declared"):
                await search_request(nc, "boards", None, BoardsResponse, principal=f"x{unique}", timeout=5)
    finally:
        await nc.close()


async def test_boards_on_an_open_bus_are_listed_by_the_agent(tmp_path: Path) -> None:
    """Without a credential (``nats.insecure_open_bus``) the agent lists the boards itself."""
    server = EmbeddedNats(tmp_path / "nats", port=0)
    server.start()
    try:
        s = Settings()
        s = s.model_copy(update={"nats": s.nats.model_copy(update={
            "url": server.url, "insecure_open_bus": True, "creds_file": None, "credentials_dir": None,
            "tls_ca_file": None}), "dev": s.dev.model_copy(update={"data_dir": tmp_path / "dev"}),
            "security": s.security.model_copy(update={"authority_dir": None, "policy_file": None})})
        async with Agent.connect("lister", settings=s) as agent:  # creates the streams: an empty bucket
            assert await agent.boards() == []
            await agent.board("one").put("s", "k", 1)
            await agent.board("two").put("s", "k", 1)
            await agent.board("two").delete("s", "k")
            assert await agent.boards() == ["one"]
    finally:
        server.stop()
