"""Near-duplicate consolidation after embedding (worker/consolidator.py), on real servers.

Each test has a database of its own and a worker consuming its board only, embedding with
the bag-of-words :class:`HashProvider`: texts of the same words in another order or with
other punctuation are near-duplicates (cosine 1) without being exact ones (exact
deduplication at ingest is turned off here, so only consolidation merges).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from nats.js import JetStreamContext

from agents_sdk import Agent, Verdict
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.devstack import EmbeddedPostgres
from blackboard.protocol.subjects import MEMORY_STREAM, Subjects
from blackboard.settings import Settings
from blackboard.worker import Worker
from blackboard.worker.consolidator import Merge
from tests._worker_helpers import (
    HashProvider,
    StartWorker,
    board_memories_handler,
    dead_letters,
    fresh_db,
    remember,
    rows,
    wait_for,
    worker_settings,
)
from tests.conftest import make_settings

_T0 = datetime.now(UTC) - timedelta(minutes=10)


def consolidating(pg_settings: Settings, server: EmbeddedPostgres, unique: str, **memory: Any) -> Settings:
    """Settings of a worker of its own on a fresh database, consolidating every 0.1 s, without
    exact deduplication (``memory`` overrides more)."""
    own = make_settings(pg_settings.nats.url, fresh_db(server, unique))
    mem = own.memory.model_copy(update={"consolidate_interval": 0.1, "dedup": False, **memory})
    return worker_settings(own.model_copy(update={"memory": mem}), name=f"w{unique}", serve_search=False)


async def start(start_worker: StartWorker, s: Settings, board: str) -> Worker:
    return await start_worker(s, provider=HashProvider(64, f"hash-{board}"),
                              handlers=[board_memories_handler(s, board)])


async def settle(worker: Worker) -> None:
    """Caught up: stored, embedded and consolidated (twice: a pass may queue more)."""
    for _ in range(3):
        await worker.wait_caught_up(30, embedded=True, consolidated=True)


@pytest_asyncio.fixture
async def js(pg_settings: Settings) -> AsyncIterator[JetStreamContext]:
    nc = await connect_nats(pg_settings.nats, name="test-consolidation")
    js = nc.jetstream()
    await ensure_streams(js, pg_settings)
    yield js
    await nc.close()


def memory(s: Settings, mid: str) -> dict[str, Any]:
    cols = ("mid", "seq", "text", "archived_at", "archive_reason", "merged_into", "seen_count", "last_seen")
    found = rows(s, f"SELECT {', '.join(cols)} FROM bb_memories WHERE id = %s", mid)
    assert found, f"memory {mid} not stored"
    return dict(zip(cols, found[0], strict=True))


def sources(s: Settings, mid: int) -> list[dict[str, Any]]:
    cols = ("id", "agent", "stream", "seq", "sig_key", "sig", "verdict", "how")
    return [dict(zip(cols, r, strict=True)) for r in rows(
        s, f"SELECT {', '.join(cols)} FROM bb_memory_sources WHERE mid = %s ORDER BY id", mid)]


@pytest.mark.asyncio
async def test_a_near_duplicate_is_merged_into_the_older_memory_with_its_provenance(
        pg_settings: Settings, postgres_server: EmbeddedPostgres, js: JetStreamContext, unique: str,
        start_worker: StartWorker) -> None:
    s = consolidating(pg_settings, postgres_server, unique)
    worker = await start(start_worker, s, unique)
    await remember(js, unique, "alice", f"{unique}-a", "the cat sat on the mat", created_at=_T0)
    seq_b = await remember(js, unique, "bob", f"{unique}-b", "On the mat the cat sat!",
                           created_at=_T0 + timedelta(seconds=5))
    await remember(js, unique, "bob", f"{unique}-c", "dogs bark loudly at night", created_at=_T0)
    await settle(worker)

    a, b, c = (memory(s, f"{unique}-{x}") for x in "abc")
    assert a["archived_at"] is None and a["seen_count"] == 2
    assert a["last_seen"] == _T0 + timedelta(seconds=5)  # the later write of the two
    assert b["archived_at"] is not None and b["archive_reason"] == "merged" and b["merged_into"] == f"{unique}-a"
    assert c["archived_at"] is None and c["seen_count"] == 1
    [src] = sources(s, a["mid"])
    # the merged memory's provenance: its author, the version read, and the signature it carried
    assert src["id"] == f"{unique}-b" and src["agent"] == "bob" and src["how"] == "near"
    assert src["stream"] == MEMORY_STREAM and src["seq"] == seq_b and src["verdict"] == "verified"
    assert src["sig_key"] and src["sig"]
    assert worker.consolidator is not None and worker.consolidator.stats.merged == 1
    assert worker.consolidator.stats.conflicts == 0


@pytest.mark.asyncio
async def test_different_subject_keys_or_agents_in_per_agent_scopes_are_not_merged(
        pg_settings: Settings, postgres_server: EmbeddedPostgres, js: JetStreamContext, unique: str,
        start_worker: StartWorker) -> None:
    s = consolidating(pg_settings, postgres_server, unique, dedup_per_agent=True)
    worker = await start(start_worker, s, unique)
    await remember(js, unique, "alice", f"{unique}-1", "the price is ten euros", created_at=_T0, v=2,
                   key="price:sku-1")
    await remember(js, unique, "alice", f"{unique}-2", "The price is ten euros.", created_at=_T0, v=2,
                   key="price:sku-2")
    await remember(js, unique, "alice", f"{unique}-3", "blue whales sing songs", created_at=_T0)
    await remember(js, unique, "bob", f"{unique}-4", "Blue whales sing songs!", created_at=_T0)
    await remember(js, unique, "bob", f"{unique}-5", "songs blue whales sing", created_at=_T0 + timedelta(seconds=1))
    await settle(worker)
    live = {r[0] for r in rows(s, "SELECT id FROM bb_memories WHERE archived_at IS NULL")}
    # another key is another fact; alice's and bob's memories are separate scopes; bob's two merge
    assert live == {f"{unique}-{i}" for i in (1, 2, 3, 4)}
    assert memory(s, f"{unique}-5")["merged_into"] == f"{unique}-4"


@pytest.mark.asyncio
@pytest.mark.parametrize("changed", ["kept", "merged"])
async def test_a_memory_changed_while_its_merge_is_decided_is_not_overwritten(
        pg_settings: Settings, postgres_server: EmbeddedPostgres, js: JetStreamContext, unique: str,
        start_worker: StartWorker, changed: str) -> None:
    """The race: the consolidation reads two near-duplicates and pauses (``before_write``);
    meanwhile their writer changes one of them; the merge then changes nothing."""
    s = consolidating(pg_settings, postgres_server, unique)
    worker = await start(start_worker, s, unique)
    assert worker.consolidator is not None
    paused, release = asyncio.Event(), asyncio.Event()
    decided: list[Merge] = []

    async def slow(merge: Merge) -> None:
        decided.append(merge)
        if not paused.is_set():
            paused.set()
            await release.wait()

    worker.consolidator.before_write = slow
    ids = {"kept": f"{unique}-a", "merged": f"{unique}-b"}
    await remember(js, unique, "alice", ids["kept"], "the cat sat on the mat", created_at=_T0)
    await remember(js, unique, "alice", ids["merged"], "On the mat the cat sat!", created_at=_T0 + timedelta(seconds=5))
    await asyncio.wait_for(paused.wait(), 30)
    assert (decided[0].kept.id, decided[0].merged.id) == (ids["kept"], ids["merged"])

    # the writer changes one of them while the merge waits (stored before it goes on)
    new_seq = await remember(js, unique, "alice", ids[changed], "birds sing at dawn in spring",
                             created_at=_T0 + timedelta(seconds=30))
    await wait_for(lambda: memory(s, ids[changed])["seq"] == new_seq, 20, "the new version stored")
    release.set()
    await settle(worker)

    stats = worker.consolidator.stats
    assert stats.conflicts == 1 and stats.merged == 0
    for mid in ids.values():
        row = memory(s, mid)
        assert row["archived_at"] is None and row["merged_into"] is None and row["seen_count"] == 1
        assert sources(s, row["mid"]) == []
    assert memory(s, ids[changed])["text"] == "birds sing at dawn in spring"


_GROUPS = [("red", "apples", "grow", "here"), ("blue", "ocean", "waves", "crash"), ("old", "castle", "stone", "walls")]


def _phrases(group: int) -> list[str]:
    """Distinct texts (no two exact duplicates) of the same words: near-duplicates of each other."""
    return [" ".join(p) + end for p in itertools.permutations(_GROUPS[group]) for end in ("", ".", "!", "?")]


@pytest.mark.asyncio
async def test_a_slow_consolidation_racing_concurrent_writers_never_overwrites_a_write(
        pg_settings: Settings, postgres_server: EmbeddedPostgres, js: JetStreamContext, unique: str,
        start_worker: StartWorker) -> None:
    """Three writers keep rewriting six memories among three groups of near-duplicates while
    every merge pauses between its read and its write. At the end: every memory holds its last
    write, no version written after a merge's read is archived by it, every kept memory counts
    exactly its sources, and the board is consolidated (one live memory per group)."""
    s = consolidating(pg_settings, postgres_server, unique)
    worker = await start(start_worker, s, unique)
    assert worker.consolidator is not None

    async def slow(merge: Merge) -> None:
        await asyncio.sleep(0.15)

    worker.consolidator.before_write = slow
    ids = [f"{unique}-{i}" for i in range(6)]
    phrases = [iter(_phrases(g)) for g in range(3)]
    last: dict[str, tuple[int, str]] = {}

    async def writer(w: int) -> None:
        for r in range(8):
            mid, group = ids[(w * 3 + r) % 6], (w + r) % 3
            text = next(phrases[group])
            seq = await remember(js, unique, f"agent{w}", mid, text, created_at=_T0 + timedelta(seconds=w * 10 + r))
            if seq > last.get(mid, (0, ""))[0]:
                last[mid] = (seq, text)
            await asyncio.sleep(0.1)

    await asyncio.gather(*(writer(w) for w in range(3)))
    await settle(worker)

    stored = {r[0]: r[1:] for r in rows(
        s, "SELECT id, mid, seq, text, archived_at, archive_reason, seen_count FROM bb_memories")}
    assert set(stored) == set(ids)
    for mid, (seq, text) in last.items():
        assert stored[mid][1:3] == (seq, text), f"{mid}: its last write is not what is stored"
    merged_at = {r[0]: (r[1], r[2]) for r in rows(s, "SELECT id, seq, mid FROM bb_memory_sources")}
    for mid, (row_mid, seq, _, archived_at, reason, seen) in stored.items():
        if archived_at is not None:
            assert reason == "merged" and merged_at[mid][0] == seq, f"{mid} archived at a version not merged"
        else:
            assert seen == 1 + sum(1 for _, m in merged_at.values() if m == row_mid)
    groups = [frozenset(t.strip(".!?").split()) for _, _, t, archived_at, _, _ in stored.values() if archived_at is None]
    assert len(groups) == len(set(groups)), f"near-duplicates left live: {groups}"


@pytest.mark.asyncio
async def test_a_new_version_of_a_merged_memory_is_live_again(
        pg_settings: Settings, postgres_server: EmbeddedPostgres, js: JetStreamContext, unique: str,
        start_worker: StartWorker) -> None:
    s = consolidating(pg_settings, postgres_server, unique)
    worker = await start(start_worker, s, unique)
    await remember(js, unique, "alice", f"{unique}-a", "the cat sat on the mat", created_at=_T0)
    await remember(js, unique, "alice", f"{unique}-b", "On the mat the cat sat!", created_at=_T0 + timedelta(seconds=5))
    await settle(worker)
    assert memory(s, f"{unique}-b")["merged_into"] == f"{unique}-a"
    await remember(js, unique, "alice", f"{unique}-b", "the dog sleeps by the fire", created_at=_T0 + timedelta(seconds=9))
    await settle(worker)
    a, b = memory(s, f"{unique}-a"), memory(s, f"{unique}-b")
    assert b["archived_at"] is None and b["merged_into"] is None and b["text"] == "the dog sleeps by the fire"
    assert a["seen_count"] == 1 and sources(s, a["mid"]) == []


@pytest.mark.asyncio
async def test_through_the_sdk_a_merged_memory_answers_as_the_kept_one_and_recall_returns_one(
        pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    """End to end: two agents remember near-duplicates; recall finds one memory, the merged id
    answers with the kept memory and its provenance, and the archived one is there on request."""
    mem = pg_settings.memory.model_copy(update={"consolidate_interval": 0.1, "dedup": False})
    s = pg_settings.model_copy(update={"memory": mem})
    model = f"h-{unique}"
    await start_worker(s, name=f"w{unique}", provider=HashProvider(32, model), query_provider=HashProvider(32, model))
    async with Agent.connect(f"{unique}-a", settings=s) as alice, Agent.connect(f"{unique}-b", settings=s) as bob:
        kept = await alice.remember(f"the {unique} cat sat on the mat", board=unique, wait="searchable", timeout=30)
        merged = await bob.remember(f"On the mat, the {unique} cat sat!", board=unique, wait="searchable", timeout=30)
        deadline = asyncio.get_running_loop().time() + 30
        while (detail := await alice.memory(merged, board=unique)).memory.id != kept:
            assert asyncio.get_running_loop().time() < deadline, "not consolidated in time"
            await asyncio.sleep(0.1)
        assert detail.memory.seen_count == 2 and detail.memory.archived_at is None
        [src] = detail.sources
        assert (src.id, src.agent, src.how, src.verdict) == (merged, f"{unique}-b", "near", Verdict.VERIFIED)
        assert src.sig_key and src.sig
        hits = await alice.recall("cat sat on the mat", board=unique, mode="keyword")
        assert [h.id for h in hits] == [kept]
        every = await alice.recall("cat sat on the mat", board=unique, mode="keyword", include_archived=True)
        by_id = {h.id: h for h in every}
        assert set(by_id) == {kept, merged}
        assert by_id[merged].archive_reason == "merged" and by_id[merged].merged_into == kept


@pytest.mark.asyncio
async def test_a_merged_memory_rewritten_as_a_duplicate_is_merged_again_at_its_new_version(
        pg_settings: Settings, postgres_server: EmbeddedPostgres, js: JetStreamContext, unique: str,
        start_worker: StartWorker) -> None:
    """With exact deduplication on too: a memory merged away, then rewritten with the text of the
    memory it was merged into, is live again for a moment (its new version was not merged) and
    then merged again: one source, at the new version, counted once."""
    s = consolidating(pg_settings, postgres_server, unique, dedup=True)
    worker = await start(start_worker, s, unique)
    await remember(js, unique, "alice", f"{unique}-a", "the cat sat on the mat", created_at=_T0)
    await remember(js, unique, "alice", f"{unique}-b", "On the mat the cat sat!", created_at=_T0 + timedelta(seconds=5))
    await settle(worker)
    assert memory(s, f"{unique}-b")["merged_into"] == f"{unique}-a"
    seq = await remember(js, unique, "alice", f"{unique}-b", "The cat sat on the mat",
                         created_at=_T0 + timedelta(seconds=9))
    await settle(worker)
    a, b = memory(s, f"{unique}-a"), memory(s, f"{unique}-b")
    [src] = sources(s, a["mid"])
    assert (src["id"], src["seq"]) == (f"{unique}-b", seq) and src["how"] in ("near", "exact")
    assert a["seen_count"] == 2 and a["archived_at"] is None
    assert b["text"] == "The cat sat on the mat" and b["merged_into"] == f"{unique}-a"
    assert dead_letters(s, Subjects.memory(unique, "alice")) == {}
