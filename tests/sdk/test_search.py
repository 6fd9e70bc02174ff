"""End to end through the SDK: remember -> JetStream -> worker -> Postgres -> recall; board search,
stored history and as-of reads."""

from __future__ import annotations

import pytest

from agents_sdk import Agent
from blackboard.protocol.errors import NotFoundError
from blackboard.settings import Settings
from tests._worker_helpers import HashProvider, running_worker, worker_settings

pytestmark = pytest.mark.asyncio


async def test_remember_then_recall_and_board_search(pg_settings: Settings, unique: str) -> None:
    settings = worker_settings(pg_settings, name=f"w{unique}", batch_wait=0.02)
    async with Agent.connect("alice", settings=settings) as alice, Agent.connect("bob", settings=settings) as bob:
        board = alice.board(unique)
        await alice.remember("the staging cluster runs out of disk every friday", board=unique,
                             tags=["ops"], kind="episodic")
        await bob.remember("lunch is pizza on fridays", board=unique, tags=["food"], kind="semantic")
        await bob.remember("disk alerts on staging must page the on-call", board=unique, kind="procedural",
                           metadata={"team": "sre"})
        r1 = await board.put("facts", "db", "postgres with pgvector")
        r2 = await board.put("facts", "db", "postgres 18 with pgvector 0.8")
        await board.put("notes", "lunch", "pizza friday")
        async with running_worker(settings, provider=HashProvider()) as worker:
            await worker.wait_caught_up(60, embedded=True)

            hits = await alice.recall("staging disk", board=unique)
            assert hits and "disk" in hits[0].text
            assert {h.agent for h in hits[:2]} == {"alice", "bob"}
            only_bob = await alice.recall("staging disk", board=unique, author="bob")
            assert [h.text for h in only_bob][:1] == ["disk alerts on staging must page the on-call"]
            by_meta = await alice.recall("disk", board=unique, metadata={"team": "sre"})
            assert [h.agent for h in by_meta] == ["bob"]
            assert await alice.recall("disk", board=unique, kind="semantic", mode="keyword") == []
            assert await board.recall("pizza", mode="keyword")

            # exact ranks are the search tests' business; here: the SDK path returns current entries
            entry_hits = await board.search("pgvector", mode="keyword")
            assert entry_hits and entry_hits[0].key == "db" and entry_hits[0].revision == r2
            assert "db" in [h.key for h in await board.search("pgvector")]
            assert [h.key for h in await board.search("pizza", section="notes", mode="keyword")] == ["lunch"]

            history = await board.stored_history("facts", "db")
            assert [h.revision for h in history] == [r1, r2]
            assert (await board.as_of("facts", "db", revision=r1)).value == "postgres with pgvector"
            with pytest.raises(NotFoundError):
                await board.stored_history("facts", "nothing-here")
