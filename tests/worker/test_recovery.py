"""Crash safety: kill -9 mid-batch, two workers sharing the load, PostgreSQL restarts."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.devstack import EmbeddedNats, EmbeddedPostgres
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings
from tests._worker_helpers import (
    certify,
    count_rows,
    entry_payload,
    memory_payload,
    running_worker,
    signed_headers,
    spawn_worker,
    stop_worker,
    wait_for,
    worker_settings,
)
from tests.conftest import make_settings

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


def _spawn_worker(settings: Settings, name: str) -> subprocess.Popen[bytes]:
    return spawn_worker(settings, name, WORKER__BATCH_SIZE="200", WORKER__LAG_INTERVAL="1")


async def _publish_load(settings: Settings, board: str, n_entries: int, n_memories: int) -> tuple[set[int], set[int]]:
    """Publish entries and memories, return the acknowledged stream sequences."""
    nc = await connect_nats(settings.nats, name="load")
    js = nc.jetstream()
    await ensure_streams(js, settings)
    subj = Subjects(settings.board.bucket)
    await certify(js, "tester", "a0", "a1", "a2")  # signed, as their authors would write them

    def signed(principal: str, subject: str, payload: bytes) -> dict[str, Any]:
        return {"subject": subject, "payload": payload, "headers": signed_headers(principal, subject, payload)}

    futs_e = [await js.publish_async(**signed("tester", subj.entry(board, f"s{i % 7}", f"k{i % 500}"),
                                             entry_payload({"i": i, "text": f"value number {i}"})))
              for i in range(n_entries)]
    futs_m = [await js.publish_async(**signed(f"a{i % 3}", Subjects.memory(board, f"a{i % 3}"),
                                             memory_payload(f"{board}-{i}", board, f"a{i % 3}", f"memory {i}")))
              for i in range(n_memories)]
    entries = {int((await f).seq) for f in futs_e}
    memories = {int((await f).seq) for f in futs_m}
    await nc.close()
    return entries, memories


def _assert_exactly_once(dsn: str, board: str, entries: set[int], memories: set[int]) -> None:
    with psycopg.connect(dsn) as conn:
        revs = [r[0] for r in conn.execute("SELECT seq FROM bb_entry_revisions WHERE board = %s", (board,))]
        mems = [r[0] for r in conn.execute("SELECT seq FROM bb_memories WHERE board = %s", (board,))]
        dead = conn.execute("SELECT count(*) FROM bb_dead_letters").fetchone()
    assert len(revs) == len(set(revs)) and set(revs) == entries
    assert len(mems) == len(set(mems)) and set(mems) == memories
    assert dead == (0,)


async def test_kill_9_mid_batch_then_restart_loses_and_duplicates_nothing(
        nats_factory: Callable[[], EmbeddedNats], postgres_factory: Callable[[], EmbeddedPostgres],
        unique: str) -> None:
    ns, pg = nats_factory(), postgres_factory()
    settings = make_settings(ns.url, pg.dsn)
    proc = _spawn_worker(settings, "w")
    load = asyncio.create_task(_publish_load(settings, unique, 12000, 4000))
    try:
        q = "SELECT count(*) FROM bb_entry_revisions WHERE board = %s"
        await wait_for(lambda: count_rows(pg.dsn, q, unique) > 1500, 60, "a first part to be written")
        proc.kill()  # SIGKILL mid-stream: the batches in flight are never acknowledged
        proc.wait()
        killed_while_publishing = not load.done()
        entries, memories = await load
        proc = _spawn_worker(settings, "w")
        await wait_for(lambda: count_rows(pg.dsn, q, unique) >= len(entries) and
                       count_rows(pg.dsn, "SELECT count(*) FROM bb_memories WHERE board = %s", unique)
                       >= len(memories), 90, "everything to be written")
        nc = await connect_nats(settings.nats, name="check")
        info = await nc.jetstream().consumer_info(Subjects(settings.board.bucket).kv_stream, "w-entries")
        await nc.close()
    finally:
        stop_worker(proc)
    assert killed_while_publishing
    # The killed worker's batches came back: more deliveries than messages.
    assert info.delivered.consumer_seq > info.delivered.stream_seq
    _assert_exactly_once(pg.dsn, unique, entries, memories)


async def test_two_workers_share_the_load_without_duplicates(
        nats_factory: Callable[[], EmbeddedNats], postgres_factory: Callable[[], EmbeddedPostgres],
        unique: str) -> None:
    ns, pg = nats_factory(), postgres_factory()
    settings = make_settings(ns.url, pg.dsn)
    procs = [_spawn_worker(settings, "shared"), _spawn_worker(settings, "shared")]
    try:
        entries, memories = await _publish_load(settings, unique, 6000, 2000)
        q = "SELECT count(*) FROM bb_entry_revisions WHERE board = %s"
        await wait_for(lambda: count_rows(pg.dsn, q, unique) >= len(entries) and
                       count_rows(pg.dsn, "SELECT count(*) FROM bb_memories WHERE board = %s", unique)
                       >= len(memories), 90, "everything to be written")
        # Both processes pull from the one durable consumer: once idle, each
        # keeps a pull request waiting on it (re-issued when one expires, so
        # look a few times rather than once).
        nc = await connect_nats(settings.nats, name="check")
        waiting: list[int] = []
        for _ in range(50):
            info = await nc.jetstream().consumer_info(Subjects(settings.board.bucket).kv_stream, "shared-entries")
            waiting.append(info.num_waiting or 0)
            if waiting[-1] >= 2:
                break
            await asyncio.sleep(0.1)
        await nc.close()
        assert max(waiting) >= 2, waiting
    finally:
        for p in procs:
            p.terminate()  # both stop at once
        for p in procs:
            stop_worker(p)
    _assert_exactly_once(pg.dsn, unique, entries, memories)


async def test_postgres_restart_during_ingest_loses_nothing(
        nats_factory: Callable[[], EmbeddedNats], postgres_factory: Callable[[], EmbeddedPostgres],
        unique: str) -> None:
    ns, pg = nats_factory(), postgres_factory()
    settings = make_settings(ns.url, pg.dsn)
    settings = worker_settings(settings, name="w", embed=False, serve_search=False, max_backoff=0.5, batch_size=200,
                               batch_wait=0.02)
    async with running_worker(settings) as worker:
        first = asyncio.create_task(_publish_load(settings, unique, 3000, 500))
        q = "SELECT count(*) FROM bb_entry_revisions WHERE board = %s"
        await wait_for(lambda: count_rows(pg.dsn, q, unique) > 300, 60, "ingest to start")
        await asyncio.to_thread(pg.kill)  # crash, not a clean shutdown
        entries, memories = await first
        more_e, more_m = await _publish_load(settings, unique + "b", 500, 100)
        await asyncio.sleep(1.0)  # the worker is now backing off against a dead server
        assert any(lp.stats.retries > 0 for lp in worker.loops)
        await asyncio.to_thread(pg.start)
        await worker.wait_caught_up(90)
    _assert_exactly_once(pg.dsn, unique, entries, memories)
    _assert_exactly_once(pg.dsn, unique + "b", more_e, more_m)
