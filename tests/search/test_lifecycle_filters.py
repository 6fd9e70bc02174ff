"""The lifecycle filters of memory search (docs/memory-lifecycle.md, "Retrieval") and the
``memory`` endpoint: versions by valid time and by what the board knew, event time, confidence,
the include flags and the default (current memories only), on real servers.

The memories are written as agents write them and stored by a worker; their lifecycle columns
(subject key, valid time, supersession, archive, provenance) are then set with SQL, as the
worker's lifecycle stages would set them, so that each case is exact.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
import pytest_asyncio

from agents_sdk import Agent
from agents_sdk.search import SearchClient
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.db import search_sql as q
from blackboard.devstack import EmbeddedPostgres
from blackboard.protocol.errors import InvalidPayloadError, NotFoundError
from blackboard.protocol.schemas.search import MemoryHit, MemorySearchRequest, SearchFilters
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import Subjects
from blackboard.search.planning import DropRate, probe_depth
from blackboard.settings import Settings
from tests._worker_helpers import (
    HashProvider,
    board_memories_handler,
    drop_db,
    fresh_db,
    remember,
    running_worker,
    worker_settings,
)
from tests.conftest import make_settings

MODES = ("keyword", "semantic", "hybrid")


def t(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


#: id suffix -> (text, subject key, valid_from (None: its write time), valid_to, superseded_by,
#: written at (None: now), confidence). The price versions: p0 arrived late (written after p3)
#: but is the oldest by valid time.
MEMORIES: dict[str, tuple[str, str | None, str | None, str | None, str | None, str | None, float | None]] = {
    "p0": ("price note: sku one costs eight euros", "price:sku-1", "2025-01-01", "2025-02-01", "p1", "2025-04-10", None),
    "p1": ("price note: sku one costs ten euros", "price:sku-1", "2025-02-01", "2025-03-01", "p2", "2025-02-02", None),
    "p2": ("price note: sku one costs twelve euros", "price:sku-1", "2025-03-01", "2025-04-01", "p3", "2025-03-02",
           None),
    "p3": ("price note: sku one costs fifteen euros", "price:sku-1", "2025-04-01", None, None, "2025-04-02", 0.8),
    "o1": ("price note: the shop owner is ana", "owner:shop", "2024-01-01", None, None, "2024-01-02", None),
    "c1": ("price note: the shop owner is bo", "owner:shop", "2025-05-01", None, None, "2025-05-02", None),
    "e1": ("price note: the first sale happened at the fair", None, "2020-01-01", None, None, "2025-01-05", 0.9),
    "e2": ("price note: a discount week ran in june", None, "2025-06-01", None, None, "2025-06-02", 0.2),
    "n1": ("price note: prices are listed without tax", None, None, None, None, None, None),
    "a1": ("price note: an old price list was pruned", None, None, None, None, None, None),
    "mg": ("price note: sku one costs fifteen euros now", "price:sku-1", None, None, None, None, None),
}


@dataclass
class Lifecycle:
    board: str
    other: str
    agent: Agent
    dsn: str

    def id(self, name: str) -> str:
        return f"{self.board}-{name}"

    def names(self, hits: list[MemoryHit]) -> set[str]:
        return {h.id.removeprefix(f"{self.board}-") for h in hits}

    async def find(self, mode: str = "keyword", **filters: Any) -> set[str]:
        hits = await self.agent.recall("price note", board=self.board, mode=mode, top_k=50,  # type: ignore[arg-type]
                                       **filters)
        return self.names(hits)


def _seed(dsn: str, board: str) -> None:
    """Set the lifecycle columns of the stored memories (what the worker's stages would)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name, (_, key, valid_from, valid_to, by, written, confidence) in MEMORIES.items():
            mid = f"{board}-{name}"
            conn.execute(
                "UPDATE bb_memories SET subject_key = %s, valid_from = coalesce(%s, created_at), valid_to = %s, "
                "occurred_at = %s, superseded_by = %s, created_at = coalesce(%s, created_at), confidence = %s "
                "WHERE id = %s",
                (key, t(valid_from) if valid_from else None, t(valid_to) if valid_to else None,
                 t(valid_from) if valid_from else None, f"{board}-{by}" if by else None,
                 t(written) if written else None, confidence, mid))
        conn.execute("UPDATE bb_memories SET contested_by = 'proposal-1' WHERE id = %s", (f"{board}-c1",))
        conn.execute("UPDATE bb_memories SET archived_at = now(), archive_reason = 'lru' WHERE id = %s",
                     (f"{board}-a1",))
        # mg, a near-duplicate of p3 merged into it after embedding: archived, and a source of p3.
        conn.execute("UPDATE bb_memories SET archived_at = now(), archive_reason = 'merged', merged_into = %s "
                     "WHERE id = %s", (f"{board}-p3", f"{board}-mg"))
        conn.execute(
            "INSERT INTO bb_memory_sources (id, mid, board, agent, stream, seq, created_at, how) "
            "SELECT m.id, k.mid, m.board, m.agent, m.stream, m.seq, m.created_at, 'near' "
            "FROM bb_memories m, bb_memories k WHERE m.id = %s AND k.id = %s", (f"{board}-mg", f"{board}-p3"))
        # A memory merged into p3 at ingest (exact duplicate): only its provenance row is left.
        conn.execute(
            "INSERT INTO bb_memory_sources (id, mid, board, agent, stream, seq, created_at, sig_key, sig, verdict, how) "
            "SELECT %s, mid, board, 'dora', stream, seq + 1000, created_at, NULL, NULL, 'unsigned', 'exact' "
            "FROM bb_memories WHERE id = %s", (f"{board}-dup", f"{board}-p3"))
        conn.execute("UPDATE bb_memories SET seen_count = 3 WHERE id = %s", (f"{board}-p3",))


@pytest_asyncio.fixture(scope="module")
async def life(nats_server: Any, postgres_server: EmbeddedPostgres) -> AsyncIterator[Lifecycle]:
    import uuid
    tag = uuid.uuid4().hex[:10]
    board, other, db = f"lc{tag}", f"lo{tag}", f"lifecycle_{tag}"
    base: Settings = make_settings(nats_server.url, fresh_db(postgres_server, db))
    # Deduplication and consolidation off: the rows stay as written and seeded.
    s = base.model_copy(update={"memory": base.memory.model_copy(update={"dedup": False, "near_duplicates": False})})
    nc = await connect_nats(s.nats, name="test-lifecycle")
    js = nc.jetstream()
    await ensure_streams(js, s)
    for name, (text, *_) in MEMORIES.items():
        await remember(js, board, "alice", f"{board}-{name}", text, kind="semantic")
    handlers = [board_memories_handler(s, board)]
    try:
        async with running_worker(worker_settings(s, name=f"lc{tag}", batch_wait=0.02), handlers=handlers,
                                  provider=HashProvider()) as w:
            await w.wait_caught_up(60, embedded=True)
            dsn = s.postgres.dsn.get_secret_value()
            _seed(dsn, board)
            async with Agent.connect(f"reader{tag}", settings=s) as agent:
                yield Lifecycle(board, other, agent, dsn)
    finally:
        await nc.close()
        drop_db(postgres_server, db)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.asyncio
async def test_default_recall_returns_current_memories_only(life: Lifecycle, mode: str) -> None:
    # Not the closed price versions, not the contested challenger, not the archived memory.
    assert await life.find(mode) == {"p3", "o1", "e1", "e2", "n1"}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.asyncio
async def test_include_flags_widen_recall(life: Lifecycle, mode: str) -> None:
    assert await life.find(mode, include_superseded=True) == {"p0", "p1", "p2", "p3", "o1", "c1", "e1", "e2", "n1"}
    assert await life.find(mode, include_archived=True) == {"p3", "o1", "e1", "e2", "n1", "a1", "mg"}
    assert await life.find(mode, include_superseded=True, include_archived=True) == set(MEMORIES)


@pytest.mark.asyncio
async def test_semantic_recall_fills_top_k_when_the_nearest_are_not_current(life: Lifecycle) -> None:
    # The query is a closed version's own text: the nearest vectors are old versions, which the
    # probe of the nearest rows drops; the search still returns top_k current memories.
    for k in (3, 5):
        hits = await life.agent.recall(MEMORIES["p1"][0], board=life.board, mode="semantic", top_k=k)
        assert len(hits) == k
        assert life.names(hits) <= {"p3", "o1", "e1", "e2", "n1"}
    hits = await life.agent.recall(MEMORIES["p1"][0], board=life.board, mode="semantic", top_k=20)
    assert life.names(hits) == {"p3", "o1", "e1", "e2", "n1"}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.asyncio
async def test_as_of_reads_the_versions_valid_then(life: Lifecycle, mode: str) -> None:
    # Mid-February 2025: p1 was the price; o1 the owner; e1 had happened, e2 and the memories
    # valid from their write (2026) had not.
    assert await life.find(mode, as_of=t("2025-02-15")) == {"p1", "o1", "e1"}
    # On the boundary the newer version is valid (valid_from <= as_of < valid_to).
    assert await life.find(mode, as_of=t("2025-03-01")) == {"p2", "o1", "e1"}
    # Before any price: the late-arriving oldest version p0 (valid from 2025-01-01).
    assert await life.find(mode, as_of=t("2025-01-15")) == {"p0", "o1", "e1"}
    # The contested challenger only on request.
    assert await life.find(mode, as_of=t("2025-05-15")) == {"p3", "o1", "e1"}
    assert await life.find(mode, as_of=t("2025-05-15"), include_superseded=True) == {"p3", "o1", "c1", "e1"}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.asyncio
async def test_known_at_reads_what_the_board_knew_then(life: Lifecycle, mode: str) -> None:
    # Mid-March 2025 the board had p1 and p2 (p2 the newest), o1 and e1.
    assert await life.find(mode, known_at=t("2025-03-15")) == {"p2", "o1", "e1"}
    # Mid-April p0 had arrived too (late, and older by valid time: p3 stays the newest).
    assert await life.find(mode, known_at=t("2025-04-15")) == {"p3", "o1", "e1"}
    # Mid-May the challenger c1 was known but contested: o1 stays.
    assert await life.find(mode, known_at=t("2025-05-15")) == {"p3", "o1", "e1"}
    # Now: mg, merged into p3, is no version of its own (p3 stands for it).
    assert await life.find(mode, known_at=datetime.now(UTC)) == {"p3", "o1", "e1", "e2", "n1"}
    # Everything known by then, every version.
    assert await life.find(mode, known_at=t("2025-03-15"), include_superseded=True) == {"p1", "p2", "o1", "e1"}
    # Known then and valid at an earlier instant: the version of that instant among those known.
    assert await life.find(mode, known_at=t("2025-03-15"), as_of=t("2025-02-15")) == {"p1", "o1", "e1"}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.asyncio
async def test_event_time_and_confidence_filters(life: Lifecycle, mode: str) -> None:
    # Event time is occurred_at (valid_from), else the write time (n1: now).
    assert await life.find(mode, occurred_after=t("2025-01-01")) == {"p3", "e2", "n1"}
    assert await life.find(mode, occurred_before=t("2025-01-01")) == {"o1", "e1"}
    assert await life.find(mode, occurred_after=t("2025-01-01"), occurred_before=t("2025-05-01")) == {"p3"}
    assert await life.find(mode, occurred_after=t("2025-01-01"), include_superseded=True) == {
        "p0", "p1", "p2", "p3", "c1", "e2", "n1"}
    # A memory without a confidence fails min_confidence.
    assert await life.find(mode, min_confidence=0.5) == {"p3", "e1"}
    assert await life.find(mode, min_confidence=0.0) == {"p3", "e1", "e2"}
    assert await life.find(mode, min_confidence=0.9) == {"e1"}  # as stored (a real): 0.9 is at least 0.9


@pytest.mark.asyncio
async def test_hits_carry_the_lifecycle(life: Lifecycle) -> None:
    hits = await life.agent.recall("price note", board=life.board, mode="keyword", top_k=50,
                                   include_superseded=True, include_archived=True)
    by = {h.id.removeprefix(f"{life.board}-"): h for h in hits}
    p1, p3, a1, e1, n1, c1 = by["p1"], by["p3"], by["a1"], by["e1"], by["n1"], by["c1"]
    assert (p1.key, p1.valid_from, p1.valid_to, p1.superseded_by) == (
        "price:sku-1", t("2025-02-01"), t("2025-03-01"), life.id("p2"))
    assert p3.valid_to is None and p3.superseded_by is None and p3.confidence == pytest.approx(0.8)
    assert p3.seen_count == 3 and p3.hits >= 0
    assert (by["mg"].archive_reason, by["mg"].merged_into) == ("merged", life.id("p3"))
    assert a1.archived_at is not None and a1.archive_reason == "lru" and a1.merged_into is None
    assert e1.occurred_at == t("2020-01-01") and e1.key is None and e1.confidence == 0.9  # as written
    assert n1.occurred_at is None and n1.valid_from == n1.created_at  # valid from its write
    assert c1.contested_by == "proposal-1"


@pytest.mark.asyncio
async def test_memory_reads_one_memory_with_its_versions_and_sources(life: Lifecycle) -> None:
    detail = await life.agent.memory(life.id("p1"), board=life.board)
    assert detail.memory.id == life.id("p1") and detail.memory.score == 0
    assert detail.memory.superseded_by == life.id("p2")
    assert [v.id for v in detail.versions] == [life.id(n) for n in ("p0", "p1", "p2", "p3", "mg")]
    assert detail.sources == []
    same = await life.agent.board(life.board).memory(life.id("p1"))  # the board's shortcut
    # (hits may have grown in between: recall's accesses are flushed in the background)
    assert (same.memory.id, [v.id for v in same.versions], same.sources) == (
        detail.memory.id, [v.id for v in detail.versions], detail.sources)
    # The kept memory lists what was merged into it; a merged id answers with the kept memory.
    kept = await life.agent.memory(life.id("p3"), board=life.board)
    assert sorted((s.id, s.agent, s.how) for s in kept.sources) == [
        (life.id("dup"), "dora", "exact"), (life.id("mg"), "alice", "near")]
    assert {s.verdict for s in kept.sources} == {Verdict.UNSIGNED}  # as stored with each source
    merged = await life.agent.memory(life.id("dup"), board=life.board)
    assert merged.memory.id == life.id("p3") and merged.memory.seen_count == 3
    assert {s.id for s in merged.sources} == {life.id("dup"), life.id("mg")}
    # A near-duplicate merged away keeps its archived row, but its id answers with the kept memory.
    near = await life.agent.memory(life.id("mg"), board=life.board)
    assert near.memory.id == life.id("p3")
    # The versions of the key: mg too (archived), in valid-time order.
    assert [v.id for v in near.versions] == [life.id(n) for n in ("p0", "p1", "p2", "p3", "mg")]
    # An archived memory is read as it is; a memory without a key has no versions.
    archived = await life.agent.memory(life.id("a1"), board=life.board)
    assert archived.memory.archive_reason == "lru" and archived.versions == []


@pytest.mark.asyncio
async def test_memory_not_found(life: Lifecycle) -> None:
    with pytest.raises(NotFoundError):
        await life.agent.memory(life.id("nothing"), board=life.board)
    with pytest.raises(NotFoundError):  # a memory of another board
        await life.agent.memory(life.id("p3"), board=life.other)
    with pytest.raises(NotFoundError):  # the default board
        await life.agent.memory(life.id("p3"))


@pytest.mark.asyncio
async def test_lifecycle_filters_are_refused_for_entries(life: Lifecycle) -> None:
    client: SearchClient = life.agent.search
    with pytest.raises(TypeError):
        await client.search_entries("price", include_superseded=True)  # type: ignore[call-arg]
    with pytest.raises(InvalidPayloadError):
        await client.search_entries("price", filters=SearchFilters(as_of=t("2025-01-01")))


def test_requests_set_version_3_only_with_lifecycle_filters() -> None:
    plain = MemorySearchRequest.of("price", SearchFilters()).model_dump()
    assert plain["v"] == 1 and not {"include_superseded", "as_of", "min_confidence"} & set(plain)
    asked = MemorySearchRequest.of("price", SearchFilters(min_confidence=0.0, include_archived=True)).model_dump()
    assert asked["v"] == 3 and asked["min_confidence"] == 0.0 and asked["include_archived"] is True
    assert "include_superseded" not in asked


def test_default_conditions_are_checked_in_the_probe() -> None:
    # The common query (board filter at most) keeps its nearest-first form; every other filter,
    # and the include flags with a parameterised filter, apply in the scan.
    assert q.probes("memory", SearchFilters(boards=["b"]))
    assert q.probes("memory", SearchFilters(include_superseded=True, include_archived=True))
    assert not q.probes("memory", SearchFilters(as_of=t("2025-01-01")))
    assert not q.probes("memory", SearchFilters(min_confidence=0.5))
    assert not q.probes("entry", SearchFilters())
    conds, params = q.filters("memory", SearchFilters())
    assert conds == [q.LIVE_MEMORY, q.CURRENT_MEMORY] and params == []
    assert Subjects.search("a", "memory") == "bb.search.a.memory"


def test_event_time_bounds_are_half_open() -> None:
    # The event-time bounds are half-open: [occurred_after, occurred_before).
    conds, params = q.filters("memory", SearchFilters(occurred_after=t("2025-01-01"), occurred_before=t("2025-02-01")))
    assert params == [t("2025-01-01"), t("2025-02-01")]
    assert any(">= %s" in c for c in conds) and any("< %s" in c for c in conds)



def test_the_probe_takes_more_of_the_nearest_only_after_drops() -> None:
    # Nothing dropped lately: the probe takes top_k (the common query unchanged).
    assert probe_depth(10, 0.0) == 10
    # A tenth dropped: enough for the expected losses with a quarter to spare; bounded.
    assert probe_depth(10, 0.1) == 14
    assert probe_depth(10, 0.9) == probe_depth(10, 1.0) == 40
    rate = DropRate()
    for _ in range(50):
        rate.note(10, 1)
    assert rate.value == pytest.approx(0.1, abs=0.01)
    for _ in range(80):  # the board's superseded memories are gone: back to top_k
        rate.note(10, 0)
    assert rate.value == 0.0 and probe_depth(10, rate.value) == 10
    rate.note(0, 0)  # an empty probe says nothing
    assert rate.value == 0.0
