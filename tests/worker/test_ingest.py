"""The worker persists board entries and memories: every revision once, current state, dead letters."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime
from typing import Any, cast

import msgpack
import psycopg
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from blackboard.db import migrate, open_pool
from blackboard.devstack import EmbeddedPostgres
from blackboard.protocol import codec
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings
from blackboard.worker.decode import EntryRow
from blackboard.worker.entries import write_entries
from tests._lost_cancel import lose_a_cancel
from tests._worker_helpers import (
    GlitchyProvider,
    HashProvider,
    board_memories_handler,
    delete_entry,
    entry_payload,
    fresh_db,
    memory_payload,
    publish_signed,
    put_entry,
    remember,
    running_worker,
    worker_settings,
)

pytestmark = pytest.mark.asyncio


def _dsn(settings: Settings) -> str:
    return settings.postgres.dsn.get_secret_value()


def _rows(settings: Settings, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(_dsn(settings)) as conn:
        return conn.execute(query, params).fetchall()


@pytest.fixture
def own_db(pg_settings: Settings, postgres_server: EmbeddedPostgres, unique: str) -> Settings:
    """The session's NATS server with a database of the test's own: a worker waiting until
    everything is embedded waits on the database's whole embedding queue, which in the shared
    database holds whatever earlier tests' workers left there."""
    from tests.conftest import make_settings

    return make_settings(pg_settings.nats.url, fresh_db(postgres_server, unique))


def _worker_settings(settings: Settings, unique: str, **kw: Any) -> Settings:
    return worker_settings(settings, name=f"w{unique}", batch_wait=0.02, lag_interval=60.0, **kw)


async def test_entries_every_revision_once_and_current_state(own_db: Settings, nc: NATS,
                                                            unique: str) -> None:
    s = _worker_settings(own_db, unique)
    js: JetStreamContext = nc.jetstream()
    subj = Subjects(s.board.bucket)
    seqs = [await put_entry(js, subj, unique, "notes", "plan", {"step": i}, tags=["t"]) for i in range(3)]
    key_seq = await put_entry(js, subj, unique, "notes", "a key/with spaces", "free text value")
    del_seq = await put_entry(js, subj, unique, "facts", "gone", "soon deleted")
    del2 = await delete_entry(js, subj, unique, "facts", "gone")
    bin_seq = await put_entry(js, subj, unique, "files", "blob", b"\x00\x01binary", content_type="image/png")
    async with running_worker(s, provider=HashProvider(), serve_search=False) as w:
        await w.wait_caught_up(30, embedded=True)
    revs = _rows(s, "SELECT seq, section, key, op, value FROM bb_entry_revisions WHERE board = %s ORDER BY seq",
                 unique)
    assert [r[0] for r in revs] == [*seqs, key_seq, del_seq, del2, bin_seq]
    assert revs[0][4] == {"step": 0} and revs[5][3] == "DEL"
    cur = {(r[0], r[1]): r[2:] for r in _rows(
        s, "SELECT section, key, revision, deleted, value, value_raw FROM bb_entries WHERE board = %s", unique)}
    assert cur[("notes", "plan")][:3] == (seqs[-1], False, {"step": 2})
    assert cur[("notes", "a key/with spaces")][2] == "free text value"
    assert cur[("facts", "gone")][:2] == (del2, True)
    assert cur[("files", "blob")][2] is None and codec.decode(bytes(cur[("files", "blob")][3])) == b"\x00\x01binary"


async def test_memories_stored_and_embedded(own_db: Settings, nc: NATS, unique: str) -> None:
    s = _worker_settings(own_db, unique)
    js = nc.jetstream()
    await remember(js, unique, "alice", f"{unique}-1", "the deploy failed on friday", tags=["ops"],
                   metadata={"service": "api"}, kind="episodic", importance=0.9)
    await remember(js, unique, "bob", f"{unique}-2", "use blue-green deploys", kind="procedural")
    provider = HashProvider()
    async with running_worker(s, provider=provider, serve_search=False) as w:
        await w.wait_caught_up(30, embedded=True)
        assert w.embedder is not None and w.embedder.space is not None
        table = w.embedder.space.table_name("memory")
    rows = _rows(s, "SELECT id, agent, kind, tags, metadata, importance FROM bb_memories WHERE board = %s "
                    "ORDER BY id", unique)
    assert rows == [(f"{unique}-1", "alice", "episodic", ["ops"], {"service": "api"}, pytest.approx(0.9)),
                    (f"{unique}-2", "bob", "procedural", [], {}, pytest.approx(0.5))]
    vecs = _rows(s, f"SELECT m.id FROM {table} v JOIN bb_memories m ON m.mid = v.item WHERE m.board = %s",
                 unique)
    assert len(vecs) == 2


async def test_memory_with_same_id_is_replaced_forward_only(own_db: Settings, nc: NATS, unique: str) -> None:
    s = _worker_settings(own_db, unique)
    js = nc.jetstream()
    await remember(js, unique, "alice", f"{unique}-m", "first version")
    await remember(js, unique, "alice", f"{unique}-m", "second version")
    async with running_worker(s, provider=HashProvider(), serve_search=False) as w:
        await w.wait_caught_up(30)
    assert _rows(s, "SELECT text FROM bb_memories WHERE id = %s", f"{unique}-m") == [("second version",)]


async def test_forget_deletes_memories_and_keeps_them_deleted(own_db: Settings, nc: NATS,
                                                              unique: str) -> None:
    s = _worker_settings(own_db, unique)
    js = nc.jetstream()
    old = memory_payload(f"{unique}-a", unique, "alice", "an old copy")
    await remember(js, unique, "alice", f"{unique}-a", "forget me")
    await remember(js, unique, "alice", f"{unique}-b", "keep me")
    forget = codec.encode({"v": 1, "op": "forget", "board": unique, "agent": "alice", "ids": [f"{unique}-a"],
                           "created_at": datetime.now(UTC)})
    await publish_signed(js, "alice", Subjects.memory(unique, "alice"), forget)
    async with running_worker(s, provider=HashProvider(), serve_search=False) as w:
        await w.wait_caught_up(30, embedded=True)
        assert w.embedder is not None and w.embedder.space is not None
        table = w.embedder.space.table_name("memory")
        assert _rows(s, "SELECT id FROM bb_memories WHERE board = %s", unique) == [(f"{unique}-b",)]
        # An older copy delivered late (a smaller stream sequence) stays forgotten.
        from blackboard.worker.decode import RawMessage, decode_memory
        from blackboard.worker.memories import write_memories
        late = decode_memory(RawMessage("BB_MEMORY", 1, Subjects.memory(unique, "alice"), {}, old,
                                        datetime.now(UTC)), max_bytes=10**6, index_chars=10**5)
        assert w.pool is not None
        async with w.pool.connection() as conn, conn.transaction():
            await write_memories(conn, [late])
    assert _rows(s, "SELECT id FROM bb_memories WHERE board = %s", unique) == [(f"{unique}-b",)]
    assert len(_rows(s, f"SELECT 1 FROM {table} v JOIN bb_memories m ON m.mid = v.item WHERE m.board = %s",
                     unique)) == 1


async def test_garbage_goes_to_dead_letters_and_worker_keeps_going(own_db: Settings, nc: NATS,
                                                                   unique: str) -> None:
    s = _worker_settings(own_db, unique, max_message_bytes=4096)
    js = nc.jetstream()
    subj = Subjects(s.board.bucket)
    mem = Subjects.memory(unique, "eve")
    entry = subj.entry(unique, "junk", "k")
    bad_utf8 = b"\x81\xa5value\xa3\xff\xfe\xfd"  # msgpack map whose string is not UTF-8
    cases = {
        "random": (entry, bytes(range(7, 250, 3)), None),
        "schema": (entry, codec.encode({"v": 1, "nothing": "here"}), None),
        "oversized": (entry, entry_payload("x" * 10_000), None),
        "utf8": (entry, bad_utf8, None),
        "json": (entry, b"{not json", {"Bb-Encoding": "json"}),
        "nul": (entry, entry_payload("v", metadata={"a": "b\x00c"}), None),
        "mem_schema": (mem, msgpack.packb({"v": 1, "id": "x"}), None),
        "mem_subject": (mem, codec.encode({"v": 1, "id": f"{unique}-x", "board": "other", "agent": "eve",
                                           "text": "hi", "created_at": datetime.now(UTC)}), None),
    }
    # (subject, sequence): the entries and the memories are in two streams, whose sequences may meet
    seqs: dict[str, tuple[str, int]] = {}
    for name, (subject, data, headers) in cases.items():
        ack = await js.publish(subject, data, headers=headers)
        seqs[name] = (subject, ack.seq)
    good = await put_entry(js, subj, unique, "junk", "ok", "fine")
    good_mem = await remember(js, unique, "eve", f"{unique}-ok", "a good memory")
    async with running_worker(s, provider=HashProvider(), serve_search=False) as w:
        await w.wait_caught_up(30)
        dead = {(r[2], int(r[0])): r[1] for r in _rows(
            s, "SELECT seq, reason, subject FROM bb_dead_letters WHERE subject IN (%s, %s)", entry, mem)}
        for name, where in seqs.items():
            assert where in dead, f"{name} was not dead-lettered"
        assert "oversized" in dead[seqs["oversized"]]
        assert "not valid" in dead[seqs["utf8"]]
        assert "do not match subject" in dead[seqs["mem_subject"]]
        # still running: a later message is stored
        later = await put_entry(js, subj, unique, "junk", "after", "still alive")
        await w.wait_caught_up(30)
        assert w.tasks and all(t.done() is False for t in w.tasks)
    assert {r[0] for r in _rows(s, "SELECT seq FROM bb_entry_revisions WHERE board = %s", unique)} == {good, later}
    assert _rows(s, "SELECT seq FROM bb_memories WHERE board = %s", unique) == [(good_mem,)]
    raw = _rows(s, "SELECT data FROM bb_dead_letters WHERE seq = %s AND subject = %s", seqs["random"][1], entry)
    assert bytes(raw[0][0]) == bytes(range(7, 250, 3))


async def test_current_state_converges_when_batches_commit_out_of_order(pg_settings: Settings,
                                                                         unique: str) -> None:
    await migrate(pg_settings)
    now = datetime.now(UTC)

    def row(seq: int, op: str = "PUT") -> EntryRow:
        return EntryRow("KV_test", seq, unique, "s", "k", op, {"rev": seq} if op == "PUT" else None, None,
                        "application/json", [], {}, "a", now, now, f"rev {seq}")

    async with open_pool(pg_settings.postgres) as pool:
        for batch in ([row(30_000_005)], [row(30_000_003), row(30_000_004)], [row(30_000_005)]):
            async with pool.connection() as conn, conn.transaction():
                await write_entries(conn, batch)
    rows = _rows(pg_settings, "SELECT revision, value FROM bb_entries WHERE board = %s", unique)
    assert rows == [(30_000_005, {"rev": 30_000_005})]
    assert len(_rows(pg_settings, "SELECT 1 FROM bb_entry_revisions WHERE board = %s", unique)) == 3


class _CountingProvider(HashProvider):
    """HashProvider that takes ``delay`` seconds a call and records how many calls overlap."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay, self.active, self.most, self.texts = delay, 0, 0, 0

    async def embed(self, texts: Any) -> Any:
        self.active += 1
        self.most = max(self.most, self.active)
        try:
            await asyncio.sleep(self.delay)
            self.texts += len(texts)
            return await super().embed(texts)
        finally:
            self.active -= 1


async def test_the_model_stage_embeds_two_batches_at_a_time_and_each_item_once(
        own_db: Settings, nc: NATS, unique: str) -> None:
    """Two batches in the model at once (the provider bounds its own calls); every memory gets
    exactly one vector, of its revision; the model's busy time is counted once, not per batch."""
    s = _worker_settings(own_db, unique, embed_batch_size=4)
    js = nc.jetstream()
    seqs = {f"{unique}-{i}": await remember(js, unique, "a", f"{unique}-{i}", f"memory number {i} about deploys")
            for i in range(40)}
    provider = _CountingProvider(0.05)
    memories = board_memories_handler(s, unique)
    t0 = time.perf_counter()
    async with running_worker(s, provider=provider, handlers=[memories], serve_search=False) as w:
        await w.wait_caught_up(30, embedded=True, poll=0.02)
        elapsed = time.perf_counter() - t0
        assert w.embedder is not None and w.embedder.space is not None
        stats, table = w.embedder.stats, w.embedder.space.table_name("memory")
    rows = _rows(s, f"SELECT m.id, v.revision, m.seq FROM {table} v JOIN bb_memories m ON m.mid = v.item")
    assert sorted(r[0] for r in rows) == sorted(seqs) and all(r[1] == r[2] == seqs[r[0]] for r in rows)
    assert provider.texts == 40 and stats.embedded == 40 and stats.batches == 10
    assert provider.most == 2
    # Ten calls of 50 ms, two at a time: ~0.25 s of busy model, not the 0.5 s a per-batch sum gives.
    assert 0.2 <= stats.model_seconds < 0.45 and stats.model_seconds < elapsed


async def test_a_vector_holding_nan_leaves_its_item_unembedded_and_the_embedder_going(
        own_db: Settings, nc: NATS, unique: str) -> None:
    """PostgreSQL refuses NaN in a vector, and the halfvec index refuses components past 65,504: neither
    may fail the batch again and again (the embedding stage would stall behind it)."""
    s = _worker_settings(own_db, unique)
    js = nc.jetstream()
    texts = {f"{unique}-ok": "a plain memory about deploys", f"{unique}-poison": "a poison memory",
             f"{unique}-loud": "a loud memory about deploys"}
    for mid, text in texts.items():
        await remember(js, unique, "a", mid, text)
    memories = board_memories_handler(s, unique)
    async with running_worker(s, provider=GlitchyProvider(), handlers=[memories], serve_search=False) as w:
        await w.wait_caught_up(30, embedded=True, poll=0.02)
        assert w.embedder is not None and w.embedder.space is not None
        first = (w.embedder.stats.failures, w.embedder.stats.embedded)
        await remember(js, unique, "a", f"{unique}-later", "a later memory")  # the stage still runs
        await w.wait_caught_up(30, embedded=True, poll=0.02)
        table = w.embedder.space.table_name("memory")
    rows = dict(_rows(s, f"SELECT m.id, vector_norm(v.embedding) FROM {table} v JOIN bb_memories m ON m.mid = v.item"))
    assert set(rows) == {f"{unique}-ok", f"{unique}-loud", f"{unique}-later"}
    assert all(n == pytest.approx(1.0, abs=1e-5) for n in rows.values())  # stored at unit length
    assert first == (1, 2)
    assert _rows(s, "SELECT count(*) FROM bb_embed_queue") == [(0,)]  # the poisoned item is not retried


class _LosingFetcher:
    """A fetcher whose every call fetches a batch; call ``at`` loses a cancel (the batch "arrives"
    while its caller is cancelled); the calls after it wait ``wait`` and fetch nothing."""

    last_error = None

    def __init__(self, at: int) -> None:
        self.at = at
        self.calls = 0
        self.entered = asyncio.Event()

    async def fetch(self, batch: int, wait: float) -> list[object]:
        self.calls += 1
        if self.calls == self.at:
            self.entered.set()
            await lose_a_cancel()
        elif self.calls > self.at:
            await asyncio.sleep(wait)
            return []
        return [object()]


async def test_a_stop_whose_cancel_is_lost_in_a_fetch_ends_the_loop_when_its_queue_is_full(
        settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.11's ``asyncio.wait_for`` (under the fetch) returns the batch that is ready
    instead of raising a cancel that arrives at the same time. With every writer busy and a
    batch waiting in the queue, the fetch loop must see ``stop`` rather than wait for ever
    to hand its batch to writers that were cancelled."""
    from blackboard.worker.entries import entry_handler
    from blackboard.worker.ingest import IngestLoop

    s = _worker_settings(settings, unique)
    loop = IngestLoop(entry_handler(s), cast(Any, None), cast(Any, None), s)
    swallow_at = loop.writers + 2  # a batch for each writer, one waiting in the queue, then this one
    fetcher = _LosingFetcher(swallow_at)  # the batch "arrives" while stop() cancels

    async def writing(msgs: object, stop: object = None, slot: object = None) -> bool:
        await asyncio.Event().wait()  # each writer is busy with its batch when stop() comes
        return True

    loop._fetcher = cast(Any, fetcher)
    monkeypatch.setattr(loop, "process", writing)
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    try:
        await asyncio.wait_for(fetcher.entered.wait(), 5)
        stop.set()  # as Worker.stop: the flag, then the cancel
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=5)
        assert done, "the ingest loop did not end after stop"
        assert task.cancelled() and fetcher.calls == swallow_at
    finally:
        for t in asyncio.all_tasks():  # (only when it failed) the fetch loop stuck on the queue
            if t.get_name() == f"{loop.durable} fetch":
                t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_writer_failing_while_the_fetch_loses_its_cancel_ends_the_loop(
        settings: Settings, unique: str) -> None:
    """A writer's failure cancels the fetch loop without ``stop``: a cancel lost in its fetch
    (Python 3.11's ``asyncio.wait_for``) must still end it, and ``run`` raise the failure."""
    from blackboard.worker.entries import entry_handler
    from blackboard.worker.ingest import IngestLoop

    s = _worker_settings(settings, unique)
    loop = IngestLoop(entry_handler(s), cast(Any, None), cast(Any, None), s)
    fetcher = _LosingFetcher(2)  # the batch "arrives" while the group cancels

    async def failing(msgs: object, stop: object = None, slot: object = None) -> bool:
        await fetcher.entered.wait()
        raise RuntimeError("a bug in a writer")

    loop._fetcher = cast(Any, fetcher)
    loop.process = failing  # type: ignore[method-assign]
    task = asyncio.create_task(loop.run(asyncio.Event()))
    try:
        done, _ = await asyncio.wait([task], timeout=5)
        assert done, "the ingest loop did not end after its writer failed"
        assert isinstance(task.exception(), RuntimeError) and fetcher.calls == 2
    finally:
        for t in asyncio.all_tasks():  # (only when it failed) the fetch loop fetching on
            if t.get_name() == f"{loop.durable} fetch":
                t.cancel()
        with contextlib.suppress(asyncio.CancelledError, RuntimeError):
            await task
