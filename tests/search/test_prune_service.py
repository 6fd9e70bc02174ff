"""The search service's prune, archive and restore, end to end with identities (real servers).

docs/security.md, "Who may prune": an agent prunes and archives its own memories (``write`` on
the board); every author's (``scope="all"``) or another agent's by id needs ``admin`` on the
board (the test policy's ``admin-*``, tests/_auth.py); a refusal archives nothing; dry runs
change nothing; a knowledge file's memories (read-only) are never pruned.
"""

from __future__ import annotations

import pytest

from agents_sdk import Agent
from agents_sdk.search import SearchClient
from blackboard.db import connect
from blackboard.protocol.errors import InvalidPayloadError, PermissionDeniedError
from blackboard.settings import Settings
from tests._worker_helpers import HashProvider, StartWorker

pytestmark = pytest.mark.asyncio


async def archived(client: SearchClient, board: str, *ids: str) -> dict[str, bool]:
    """Whether each memory is archived, as the service reads it back."""
    return {i: (await client.memory(board, i)).memory.archived_at is not None for i in ids}


async def live_ids(client: SearchClient, board: str, query: str) -> set[str]:
    return {h.id for h in await client.recall(query, board=board, mode="keyword", top_k=50)}


async def test_own_prune_and_archive_and_the_refusals(pg_settings: Settings, start_worker: StartWorker,
                                                      unique: str) -> None:
    await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider())
    board = unique
    async with Agent.connect(f"{unique}-alice", settings=pg_settings) as alice, \
            Agent.connect(f"{unique}-bob", settings=pg_settings) as bob, \
            Agent.connect(f"admin-{unique}", settings=pg_settings) as admin, \
            Agent.connect(f"reader-{unique}", settings=pg_settings) as reader:
        a_low = await alice.remember("the pager rota guess", board=board, confidence=0.1, wait="searchable")
        a_high = await alice.remember("the pager rota is weekly", board=board, confidence=0.9, wait="searchable")
        b_low = await bob.remember("the pager rota maybe daily", board=board, confidence=0.2, wait="searchable")
        a, everyone = alice.search, [a_low, a_high, b_low]

        # a dry run of its own: alice's low-confidence memory only, nothing archived
        dry = await a.prune(board, strategy="low_confidence", threshold=0.5, dry_run=True)
        assert (dry.ids, dry.count, dry.dry_run, dry.scope, dry.board) == ([a_low], 1, True, "own", board)
        assert await archived(a, board, *everyone) == {a_low: False, a_high: False, b_low: False}

        done = await a.prune(board, strategy="low_confidence", threshold=0.5)
        assert (done.ids, done.dry_run) == ([a_low], False)
        assert await archived(a, board, *everyone) == {a_low: True, a_high: False, b_low: False}
        assert await live_ids(a, board, "pager rota") == {a_high, b_low}  # recall leaves it out

        # every author's, or another agent's memory by id: admin only, and nothing is archived
        for dry_run in (True, False):
            with pytest.raises(PermissionDeniedError) as caught:
                await a.prune(board, strategy="low_confidence", threshold=0.5, scope="all", dry_run=dry_run)
            assert board in str(caught.value) and "admin" in str(caught.value)
            assert caught.value.operation == f"prune all on board {board}"
        with pytest.raises(PermissionDeniedError) as caught:
            await a.archive(board, [a_high, b_low])
        assert b_low in str(caught.value) and a_high not in str(caught.value)
        assert caught.value.operation == f"archive another agent's memories on board {board}"
        assert await archived(a, board, a_high, b_low) == {a_high: False, b_low: False}  # all or nothing
        with pytest.raises(PermissionDeniedError):
            await a.restore(board, [b_low])
        # a reader may not prune even its own (it may not write there)
        with pytest.raises(PermissionDeniedError) as caught:
            await reader.search.prune(board, dry_run=True)
        assert caught.value.operation == f"prune on board {board}"

        # archive and restore its own by id
        arch = await a.archive(board, [a_high, f"{unique}-nothing"], reason="stale", dry_run=True)
        assert (arch.archived, arch.missing, arch.dry_run) == ([a_high], [f"{unique}-nothing"], True)
        assert (await archived(a, board, a_high)) == {a_high: False}
        arch = await a.archive(board, [a_high, a_low])
        assert (arch.archived, arch.missing, arch.refused) == ([a_high], [], {a_low: "already archived"})
        detail = await a.memory(board, a_high)
        assert detail.memory.archive_reason == "archived"
        back = await a.restore(board, [a_high, a_low, f"{unique}-nothing"])
        assert (sorted(back.restored), back.refused) == (sorted([a_high, a_low]), {f"{unique}-nothing": "not found"})
        assert await live_ids(a, board, "pager rota") == set(everyone)
        with pytest.raises(InvalidPayloadError):
            await a.archive(board, [a_high], reason="merged")
        with pytest.raises(InvalidPayloadError):
            await a.prune(board, strategy="low_confidence", threshold=2.0)

        # admin on the board: every author's
        adm = await admin.search.prune(board, strategy="low_confidence", threshold=0.5, scope="all")
        assert adm.ids == [a_low, b_low]  # least confident first
        assert await archived(a, board, *everyone) == {a_low: True, a_high: False, b_low: True}
        back = await admin.search.restore(board, [b_low])
        assert back.restored == [b_low]
        arch = await admin.search.archive(board, [a_high], reason="superseded")
        assert arch.archived == [a_high]
        assert (await a.memory(board, a_high)).memory.archive_reason == "superseded"


async def test_knowledge_and_contested_memories_are_never_pruned_and_own_counts_own(pg_settings: Settings, start_worker: StartWorker,
                                                             unique: str) -> None:
    await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider())
    board = unique
    async with Agent.connect(f"{unique}-alice", settings=pg_settings) as alice, \
            Agent.connect(f"{unique}-bob", settings=pg_settings) as bob, \
            Agent.connect(f"admin-{unique}", settings=pg_settings) as admin:
        doc = await alice.remember("the handbook says deploy on tuesdays", kind="knowledge", read_only=True,
                                   board=board, confidence=0.05, source="handbook.md", wait="searchable")
        notes = [await alice.remember(f"note {i} about the deploy", board=board, importance=0.1 * (i + 1),
                                      wait="searchable") for i in range(3)]
        theirs = [await bob.remember(f"bob's note {i} about the deploy", board=board, wait="searchable")
                  for i in range(2)]

        # lru over everything older than a millisecond: every live memory but the knowledge file's
        dry = await admin.search.prune(board, strategy="lru", threshold=0.001, scope="all", dry_run=True)
        assert set(dry.ids) == {*notes, *theirs} and doc not in dry.ids
        mine = await alice.search.prune(board, strategy="lru", threshold=0.001, dry_run=True)
        assert set(mine.ids) == set(notes)
        # max_per_board with scope own: the bound counts alice's own memories (knowledge left out)
        keep_one = await alice.search.prune(board, strategy="max_per_board", threshold=1, dry_run=True)
        assert len(keep_one.ids) == 2 and set(keep_one.ids) < set(notes)
        limited = await alice.search.prune(board, strategy="lru", threshold=0.001, limit=1)
        assert limited.count == 1 and limited.ids[0] in notes
        arch = await alice.search.archive(board, [doc])
        assert (arch.archived, arch.refused) == ([], {doc: "read-only (a knowledge file's)"})
        done = await admin.search.prune(board, strategy="low_confidence", threshold=0.5, scope="all")
        assert done.ids == []  # the knowledge memory is the only one below 0.5
        assert (await alice.search.memory(board, doc)).memory.archived_at is None

        # a memory under an open contradiction vote (as the worker marks one) is left alone too
        contested = await bob.remember("bob says deploy on mondays", board=board, confidence=0.1,
                                       wait="searchable")
        conn = await connect(pg_settings.postgres)
        try:
            await conn.execute("UPDATE bb_memories SET contested_by = %s WHERE id = %s", (f"p-{unique}", contested))
        finally:
            await conn.close()
        assert (await admin.search.prune(board, strategy="low_confidence", threshold=0.5, scope="all")).ids == []
        arch = await admin.search.archive(board, [contested])
        assert (arch.archived, arch.refused) == ([], {contested: "contested (an open contradiction vote)"})
