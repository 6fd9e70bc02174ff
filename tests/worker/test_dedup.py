"""Exact deduplication at ingest (docs/memory-lifecycle.md, "Deduplication and consolidation"):
a new memory whose normalised text is that of a live memory of its scope becomes a source of
that memory (provenance), not a row; concurrent batches, redeliveries, new versions and forgets
of merged ids keep it consistent."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from psycopg_pool import AsyncConnectionPool

from agents_sdk import Agent
from blackboard.db import migrate, open_pool
from blackboard.devstack import EmbeddedPostgres
from blackboard.protocol import codec
from blackboard.protocol.subjects import MEMORY_STREAM, Header, Subjects
from blackboard.settings import Settings
from blackboard.worker.decode import ForgetRow, MemoryRow, RawMessage, decode_memory
from blackboard.worker.dedup import (
    LOCK_BOARD,
    LOCK_ID,
    LOCK_TEXT,
    MAX_ITEM_LOCKS,
    id_locks,
    text_locks,
)
from blackboard.worker.memories import write_memories
from tests._worker_helpers import (
    HashProvider,
    board_memories_handler,
    fresh_db,
    running_worker,
    worker_settings,
)
from tests.conftest import make_settings

_T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def _row(seq: int, board: str, agent: str, mid: str, text: str, *, at: datetime | None = None,
         **fields: Any) -> MemoryRow:
    """A memory as the worker decodes it from stream sequence ``seq`` (signature headers set)."""
    rec: dict[str, Any] = {"v": 2 if fields else 1, "id": mid, "board": board, "agent": agent, "text": text,
                           "created_at": at or _T0 + timedelta(seconds=seq)}
    rec.update(fields)
    msg = RawMessage(MEMORY_STREAM, seq, Subjects.memory(board, agent),
                     {Header.SIG_KEY.value: f"key-{agent}", Header.SIG.value: f"sig-{seq}"},
                     codec.encode(rec), datetime.now(UTC))
    row = decode_memory(msg, max_bytes=10**6, index_chars=10**5)
    assert isinstance(row, MemoryRow)
    return row


def _forget(seq: int, board: str, agent: str, *ids: str) -> ForgetRow:
    rec = {"v": 1, "op": "forget", "board": board, "agent": agent, "ids": list(ids), "created_at": _T0}
    row = decode_memory(RawMessage(MEMORY_STREAM, seq, Subjects.memory(board, agent), {}, codec.encode(rec),
                                   datetime.now(UTC)), max_bytes=10**6, index_chars=10**5)
    assert isinstance(row, ForgetRow)
    return row


@pytest_asyncio.fixture
async def pool(pg_settings: Settings, postgres_server: EmbeddedPostgres,
               unique: str) -> AsyncIterator[AsyncConnectionPool]:
    """A pool on a migrated database of the test's own."""
    s = make_settings(pg_settings.nats.url, fresh_db(postgres_server, unique))
    await migrate(s)
    async with open_pool(s.postgres, name="test-dedup", min_size=3, max_size=4) as p:
        yield p


async def _write(pool: AsyncConnectionPool, rows: Sequence[MemoryRow | ForgetRow], **kw: Any) -> None:
    async with pool.connection() as conn, conn.transaction():
        await write_memories(conn, rows, **kw)


async def _q(pool: AsyncConnectionPool, query: str, *params: Any) -> list[tuple[Any, ...]]:
    async with pool.connection() as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall()


async def _memories(pool: AsyncConnectionPool, board: str) -> dict[str, tuple[Any, ...]]:
    """id -> (text, seen_count, last_seen) of the board's rows."""
    return {r[0]: r[1:] for r in await _q(
        pool, "SELECT id, text, seen_count, last_seen FROM bb_memories WHERE board = %s", board)}


async def _sources(pool: AsyncConnectionPool, board: str) -> dict[str, tuple[Any, ...]]:
    """merged id -> (kept id, agent, seq, sig_key, sig, how) of the board's sources."""
    return {r[0]: r[1:] for r in await _q(
        pool, "SELECT x.id, m.id, x.agent, x.seq, x.sig_key, x.sig, x.how FROM bb_memory_sources x "
              "JOIN bb_memories m ON m.mid = x.mid WHERE x.board = %s", board)}


def test_locks_are_sorted_and_scoped_and_coarse_beyond_the_bound() -> None:
    rows = [_row(1, "b1", "alice", "m1", "Same text"), _row(2, "b1", "bob", "m2", "same   TEXT"),
            _row(3, "b2", "alice", "m3", "same text")]
    ids = id_locks(rows)
    pairs = list(zip(ids.spaces, ids.keys, strict=True))
    assert pairs == sorted(pairs) and len(set(pairs)) == len(pairs) and not ids.coarse
    assert ids.spaces == [LOCK_BOARD] * 2 + [LOCK_ID] * 3  # the boards first, shared
    assert ids.shared == [True, True, False, False, False]
    texts = text_locks(rows, per_agent=False)
    assert texts.spaces == [LOCK_TEXT] * 2 and texts.keys == sorted(texts.keys)  # one text, two boards
    assert not any(texts.shared)
    assert len(text_locks(rows, per_agent=True)) == 3  # alice's and bob's on b1 are two scopes
    keyed = [rows[0], _row(4, "b1", "alice", "m4", "same text", key="k1")]
    assert len(text_locks(keyed, per_agent=False)) == 2  # a subject key is a scope of its own
    coarse = id_locks(rows, max_item_locks=2)
    assert coarse.coarse and coarse.spaces == [LOCK_BOARD] * 2 and coarse.shared == [False, False]
    assert len(id_locks([])) == 0


@pytest.mark.asyncio
async def test_a_duplicate_becomes_a_source_of_the_live_memory(pool: AsyncConnectionPool, unique: str) -> None:
    b = unique
    await _write(pool, [_row(1, b, "alice", "k", "The deploy is on Friday.")])
    await _write(pool, [_row(2, b, "bob", "x", "  the DEPLOY is on\tfriday. "),
                        _row(3, b, "alice", "other", "The deploy is on Monday."),
                        _row(4, b, "alice", "y", "The deploy is on Friday.")])
    mems = await _memories(pool, b)
    assert set(mems) == {"k", "other"}
    assert mems["k"][1:] == (3, _T0 + timedelta(seconds=4))  # seen three times, last at y's write
    assert mems["other"][1] == 1
    assert await _sources(pool, b) == {"x": ("k", "bob", 2, "key-bob", "sig-2", "exact"),
                                       "y": ("k", "alice", 4, "key-alice", "sig-4", "exact")}
    # Only the stored memories were handed to the embedder.
    queued = await _q(pool, "SELECT count(*) FROM bb_embed_inbox i CROSS JOIN LATERAL unnest(i.items) AS t(mid)")
    assert queued == [(2,)]


@pytest.mark.asyncio
async def test_duplicates_within_one_batch_keep_the_first(pool: AsyncConnectionPool, unique: str) -> None:
    b = unique
    await _write(pool, [_row(12, b, "alice", "x2", "Tea at four"), _row(10, b, "bob", "x1", "tea at four"),
                        _row(11, b, "carol", "z", "coffee at five"), _row(13, b, "bob", "x3", "TEA AT FOUR")])
    mems = await _memories(pool, b)
    assert set(mems) == {"x1", "z"}
    assert mems["x1"][1:] == (3, _T0 + timedelta(seconds=13))
    assert {i: s[0] for i, s in (await _sources(pool, b)).items()} == {"x2": "x1", "x3": "x1"}


@pytest.mark.asyncio
async def test_a_redelivered_batch_changes_nothing(pool: AsyncConnectionPool, unique: str) -> None:
    b = unique
    batch = [_row(1, b, "alice", "a", "one fact"), _row(2, b, "bob", "b", "one fact"),
             _row(3, b, "bob", "c", "One fact")]
    await _write(pool, batch)
    before = (await _memories(pool, b), await _sources(pool, b))
    await _write(pool, batch)
    await _write(pool, batch[1:])
    assert (await _memories(pool, b), await _sources(pool, b)) == before
    assert before[0]["a"][1] == 3


@pytest.mark.asyncio
async def test_scopes_boards_agents_and_subject_keys(pool: AsyncConnectionPool, unique: str) -> None:
    b, other = unique, f"{unique}-2"
    await _write(pool, [_row(1, b, "alice", "a1", "the sky is blue"), _row(2, other, "alice", "o1", "the sky is blue")])
    assert set(await _memories(pool, other)) == {"o1"}  # another board is another scope
    # per agent: bob's copy is his own memory, alice's second is merged
    await _write(pool, [_row(3, b, "bob", "b1", "the sky is blue"), _row(4, b, "alice", "a2", "The sky is blue")],
                 dedup_per_agent=True)
    assert set(await _memories(pool, b)) == {"a1", "b1"}
    assert {i: s[0] for i, s in (await _sources(pool, b)).items()} == {"a2": "a1"}
    # subject keys: the same text on another key (or on none) is another memory; on the same
    # key, a copy of the current version is merged into it ...
    await _write(pool, [_row(5, b, "alice", "p1", "price is 10", key="price:sku-1"),
                        _row(6, b, "alice", "q1", "price is 10", key="price:sku-2"),
                        _row(7, b, "alice", "n1", "price is 10")])
    await _write(pool, [_row(8, b, "bob", "p2", "Price is 10", key="price:sku-1")])
    mems = await _memories(pool, b)
    assert {"p1", "q1", "n1"} <= set(mems) and "p2" not in mems and mems["p1"][1] == 2
    # ... but one that happened before it (an older event time) is a version of its own
    await _write(pool, [_row(9, b, "bob", "p0", "price is 10", key="price:sku-1", occurred_at=_T0 - timedelta(days=1))])
    assert "p0" in await _memories(pool, b)


@pytest.mark.asyncio
async def test_with_dedup_off_every_memory_is_a_row(pool: AsyncConnectionPool, unique: str) -> None:
    b = unique
    await _write(pool, [_row(1, b, "alice", "a", "same"), _row(2, b, "bob", "b", "same")], dedup=False)
    await _write(pool, [_row(3, b, "carol", "c", "same")], dedup=False)
    assert {i: m[1] for i, m in (await _memories(pool, b)).items()} == {"a": 1, "b": 1, "c": 1}
    assert await _sources(pool, b) == {}


@pytest.mark.asyncio
async def test_a_new_version_of_a_merged_id_is_ingested_afresh(pool: AsyncConnectionPool, unique: str) -> None:
    b = unique
    await _write(pool, [_row(1, b, "alice", "k", "lunch at noon"), _row(2, b, "bob", "x", "lunch at noon")])
    assert (await _memories(pool, b))["k"][1] == 2
    await _write(pool, [_row(3, b, "bob", "x", "lunch at one")])  # x now says something else
    mems = await _memories(pool, b)
    assert mems["k"][1] == 1 and mems["x"][0] == "lunch at one" and await _sources(pool, b) == {}
    # an older copy of x arriving late changes nothing (forward only)
    await _write(pool, [_row(2, b, "bob", "x", "lunch at noon")])
    assert (await _memories(pool, b))["x"][0] == "lunch at one"
    # y is merged, then written again with the same text: still merged, at its new version
    await _write(pool, [_row(4, b, "carol", "y", "lunch at noon")])
    await _write(pool, [_row(5, b, "carol", "y", "Lunch at noon")])
    assert (await _memories(pool, b))["k"][1] == 2
    assert (await _sources(pool, b))["y"][:3] == ("k", "carol", 5)


@pytest.mark.asyncio
async def test_forgets_of_merged_and_kept_ids(pool: AsyncConnectionPool, unique: str) -> None:
    b = unique
    await _write(pool, [_row(1, b, "alice", "k", "the cat is grey"), _row(2, b, "bob", "x", "the cat is grey"),
                        _row(3, b, "carol", "y", "the cat is grey")])
    # forgetting a merged id removes that source only
    await _write(pool, [_forget(4, b, "bob", "x")])
    assert (await _memories(pool, b))["k"][1] == 2 and set(await _sources(pool, b)) == {"y"}
    await _write(pool, [_row(2, b, "bob", "x", "the cat is grey")])  # a late copy stays forgotten
    assert (await _memories(pool, b))["k"][1] == 2 and set(await _sources(pool, b)) == {"y"}
    # a near-duplicate merged into k by the consolidator (archived, its source row 'near')
    await _write(pool, [_row(5, b, "dave", "n", "the cat is gray")])
    await _q(pool, "WITH n AS (UPDATE bb_memories SET archived_at = now(), archive_reason = 'merged', "
                   "merged_into = 'k' WHERE id = 'n' RETURNING id, board, agent, stream, seq, created_at) "
                   "INSERT INTO bb_memory_sources (id, mid, board, agent, stream, seq, created_at, how) "
                   "SELECT n.id, m.mid, n.board, n.agent, n.stream, n.seq, n.created_at, 'near' "
                   "FROM n, bb_memories m WHERE m.id = 'k' RETURNING 1")
    # forgetting the kept memory (in a batch with other memories: the table is locked first)
    # deletes it, its sources and the near-duplicate archived into it, and a late copy of a
    # source stays gone
    await _write(pool, [_forget(6, b, "alice", "k"), _row(7, b, "erin", "w", "dogs bark"),
                        _row(8, b, "erin", "w2", "Dogs  bark")])
    assert set(await _memories(pool, b)) == {"w"} and set(await _sources(pool, b)) == {"w2"}
    await _write(pool, [_row(3, b, "carol", "y", "the cat is grey"), _row(5, b, "dave", "n", "the cat is gray")])
    assert set(await _memories(pool, b)) == {"w"}
    # a new memory written after the forget is stored as usual
    await _write(pool, [_row(9, b, "carol", "z", "the cat is grey")])
    assert set(await _memories(pool, b)) == {"w", "z"}


@pytest.mark.asyncio
async def test_the_workers_derived_merges_are_not_merged(pool: AsyncConnectionPool, unique: str) -> None:
    b = unique
    await _write(pool, [_row(1, b, "alice", "k", "the bridge is closed")])
    await _write(pool, [_row(2, b, "w", "d", "The bridge is closed", source="bb:merge")])
    assert set(await _memories(pool, b)) == {"k", "d"} and await _sources(pool, b) == {}


async def _waiting_on_advisory_lock(pool: AsyncConnectionPool, pid: int) -> bool:
    rows = await _q(pool, "SELECT wait_event FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                    pid)
    return rows == [("advisory",)]


@pytest.mark.asyncio
async def test_concurrent_batches_with_the_same_text_store_one_memory(pool: AsyncConnectionPool,
                                                                      unique: str) -> None:
    b = unique
    async with pool.connection() as first, pool.connection() as second:
        pid = second.info.backend_pid

        async def later() -> None:
            async with second.transaction():
                await write_memories(second, [_row(2, b, "bob", "x2", "Water the plants")])

        async with first.transaction():
            await write_memories(first, [_row(1, b, "alice", "x1", "water the plants")])
            task = asyncio.create_task(later())
            for _ in range(200):  # the second batch waits for the first to commit
                if await _waiting_on_advisory_lock(pool, pid) or task.done():
                    break
                await asyncio.sleep(0.02)
            assert not task.done() and await _waiting_on_advisory_lock(pool, pid)
        await task
    mems = await _memories(pool, b)
    assert set(mems) == {"x1"} and mems["x1"][1] == 2
    assert {i: s[0] for i, s in (await _sources(pool, b)).items()} == {"x2": "x1"}


@pytest.mark.asyncio
async def test_concurrent_writers_converge(pool: AsyncConnectionPool, unique: str) -> None:
    """Two writers commit interleaved batches of memories that repeat a few texts (new ids, and
    new versions of ids already written): every text ends up in one live memory, and every id
    is stored or merged exactly once."""
    b = unique
    rng = random.Random(7)
    texts = [f"fact number {i}" for i in range(12)]
    seq = 0
    batches: list[list[MemoryRow]] = []
    ids: set[str] = set()
    for _ in range(40):
        batch = []
        for _ in range(rng.randint(1, 12)):
            seq += 1
            n = rng.randint(0, 150)
            ids.add(f"m{n}")
            text = texts[n % len(texts)]  # an id keeps its text (a rewrite under an id is an update)
            batch.append(_row(seq, b, rng.choice(["alice", "bob"]), f"m{n}", text.upper() if seq % 2 else text))
        batches.append(batch)

    async def writer(mine: list[list[MemoryRow]]) -> None:
        for batch in mine:
            await _write(pool, batch)

    await asyncio.gather(writer(batches[0::2]), writer(batches[1::2]))
    mems = await _memories(pool, b)
    srcs = await _sources(pool, b)
    by_text: dict[str, list[str]] = {}
    for mid, (text, _, _) in mems.items():
        by_text.setdefault(text.lower(), []).append(mid)
    assert all(len(ids) == 1 for ids in by_text.values()), by_text
    assert not set(mems) & set(srcs)
    assert set(mems) | set(srcs) == ids
    assert sum(m[1] for m in mems.values()) == len(ids)  # seen counts: one per id
    for mid, (kept, *_rest) in srcs.items():
        assert mems[kept][0].lower() == texts[int(mid[1:]) % len(texts)]


@pytest.mark.asyncio
async def test_remember_twice_is_one_memory_and_a_wait_on_the_copy_returns(
        pg_settings: Settings, postgres_server: EmbeddedPostgres, unique: str) -> None:
    own = make_settings(pg_settings.nats.url, fresh_db(postgres_server, unique))
    model = f"hash-dd-{unique}"
    s = worker_settings(own, name=f"w{unique}", batch_wait=0.02)
    async with running_worker(s, handlers=[board_memories_handler(s, unique)], provider=HashProvider(32, model),
                              query_provider=HashProvider(32, model)) as w, \
            Agent.connect(f"{unique}-a", settings=own) as alice, Agent.connect(f"{unique}-b", settings=own) as bob:
        kept = await alice.remember(f"the {unique} ferry leaves at seven", board=unique, wait="searchable")
        copy = await bob.remember(f"The {unique} ferry  leaves at SEVEN", board=unique, wait="searchable",
                                  timeout=30)  # answered as the kept memory: no timeout
        hits = await bob.recall("ferry leaves at seven", mode="keyword", board=unique, top_k=10)
        assert [h.id for h in hits] == [kept]
        await w.wait_caught_up(30)
        assert w.pool is not None
        async with w.pool.connection() as conn:
            cur = await conn.execute("SELECT m.seen_count, x.id, x.agent, x.verdict FROM bb_memories m "
                                     "JOIN bb_memory_sources x ON x.mid = m.mid WHERE m.id = %s", (kept,))
            assert await cur.fetchall() == [(2, copy, f"{unique}-b", "verified")]
        await bob.forget([copy], board=unique)
        await w.wait_caught_up(30)
        async with w.pool.connection() as conn:
            cur = await conn.execute("SELECT seen_count FROM bb_memories WHERE id = %s", (kept,))
            assert await cur.fetchall() == [(1,)]
        assert [h.id for h in await alice.recall("ferry leaves", mode="keyword", board=unique)] == [kept]


@pytest.mark.asyncio
async def test_a_batch_over_the_lock_bound_locks_its_board(pool: AsyncConnectionPool, unique: str) -> None:
    b = unique
    rows = [_row(i + 1, b, "alice", f"m{i}", f"fact {i % 10}") for i in range(MAX_ITEM_LOCKS + 100)]
    assert id_locks(rows).coarse
    await _write(pool, rows)
    mems = await _memories(pool, b)
    assert sorted(mems) == [f"m{i}" for i in range(10)]
    assert sum(m[1] for m in mems.values()) == len(rows)
