"""AccessRecorder (blackboard/search/usage.py): recall hits noted without IO and written in one
statement per flush; a failed flush keeps them; last_accessed never moves back."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from blackboard.db import migrate, open_pool
from blackboard.search.usage import AccessRecorder
from blackboard.settings import Settings
from tests._lost_cancel import LostCancel
from tests._worker_helpers import rows

pytestmark = pytest.mark.asyncio

LATER = datetime.now(UTC) + timedelta(days=365)


def _insert(settings: Settings, board: str, ids: list[str], last_accessed: datetime | None = None) -> None:
    with psycopg.connect(settings.postgres.dsn.get_secret_value()) as conn:
        for i, mid in enumerate(ids):
            conn.execute("INSERT INTO bb_memories (id, board, agent, kind, text, created_at, updated_at, stream, seq,"
                         " last_accessed) VALUES (%s, %s, 'a', 'semantic', 'x', now(), now(), %s, %s, %s)",
                         (mid, board, f"TEST_{board}", i + 1, last_accessed))


def _usage(settings: Settings, board: str) -> dict[str, tuple[int, datetime | None]]:
    return {str(i): (int(h), a) for i, h, a in rows(
        settings, "SELECT id, hits, last_accessed FROM bb_memories WHERE board = %s", board)}


async def test_hits_are_counted_and_written_in_one_flush(pg_settings: Settings, unique: str) -> None:
    await migrate(pg_settings)
    a, b, c, future = (f"{unique}-{s}" for s in "abcf")
    _insert(pg_settings, unique, [a, b, c])
    _insert(pg_settings, f"{unique}x", [future], last_accessed=LATER)
    async with open_pool(pg_settings.postgres, name="test-usage", min_size=1) as pool:
        recorder = AccessRecorder(pool, interval=60)
        assert await recorder.flush() == 0
        recorder.record([a, b])
        recorder.record([a, f"{unique}-gone", future])
        recorder.record([])
        assert recorder.pending == 5
        assert _usage(pg_settings, unique)[a] == (0, None)  # noted only: nothing written yet
        before = datetime.now(UTC)
        assert await recorder.flush() == 5
        assert recorder.pending == 0
        got = _usage(pg_settings, unique)
        assert {k: v[0] for k, v in got.items()} == {a: 2, b: 1, c: 0}
        accessed = got[a][1]
        assert accessed is not None and accessed >= before - timedelta(seconds=5)
        assert got[c][1] is None
        # last_accessed never moves back (a later time written by another service stays).
        assert _usage(pg_settings, f"{unique}x")[future] == (1, LATER)


async def test_a_failed_flush_keeps_the_hits_for_the_next(pg_settings: Settings, unique: str) -> None:
    await migrate(pg_settings)
    a = f"{unique}-a"
    _insert(pg_settings, unique, [a])
    # Two connections: the test holds one, the flush gets the other.
    async with open_pool(pg_settings.postgres, name="test-usage", min_size=2, max_size=2) as pool:
        recorder = AccessRecorder(pool, interval=60)
        recorder.record([a, a])
        async with pool.connection() as conn:
            # Hold the row: the flush waits for it and gives up (lock_timeout) ...
            await conn.execute("SELECT 1 FROM bb_memories WHERE id = %s FOR UPDATE", (a,))
            async with pool.connection() as other:
                await other.execute("SET lock_timeout = '100ms'")
                await other.commit()
            with pytest.raises(psycopg.errors.LockNotAvailable):
                await recorder.flush()
            await conn.rollback()
        recorder.record([a])
        assert recorder.pending == 3  # ... and keeps them: the next flush writes all three
        assert await recorder.flush() == 3
    assert _usage(pg_settings, unique)[a][0] == 3


async def test_the_search_service_stops_when_a_flush_loses_its_cancel(
        pg_settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.11's ``asyncio.wait_for`` (under psycopg's waits) returns a result that is
    ready instead of raising a cancel that arrives with it: the recorder's loop must still
    end, and the service's stop() return."""
    from blackboard.client.connection import connect_nats
    from blackboard.search.service import SearchService
    from tests._worker_helpers import HashProvider, worker_settings

    class _Nobody:
        def rights(self, principal: str) -> None:
            return None

    flush = LostCancel(result=0)  # PostgreSQL "answers" while stop() cancels
    real_flush = AccessRecorder.flush
    service: SearchService | None = None

    async def this_services_flush(recorder: AccessRecorder) -> int:
        # Search services of other tests (a whole run shares the process) flush as ever.
        if service is None or recorder is not service.access:
            return await real_flush(recorder)
        result: int = await flush()
        return result

    monkeypatch.setattr(AccessRecorder, "flush", this_services_flush)
    s = worker_settings(pg_settings, name=f"w{unique}")
    s = s.model_copy(update={"memory": s.memory.model_copy(update={"access_flush_interval": 0.05})})
    nc = await connect_nats(s.nats, name="test-usage")
    try:
        service = SearchService(nc, s, provider=HashProvider(), rights=_Nobody())
        await service.start()
        await asyncio.wait_for(flush.entered.wait(), 5)
        await asyncio.wait_for(service.stop(), 5)
        flushed = flush.calls
        await asyncio.sleep(0.3)
        assert flush.calls == flushed  # nothing flushes on after stop()
    finally:
        await nc.close()
