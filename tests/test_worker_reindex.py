"""reindex re-embeds everything into a new model's space; search then uses it."""

from __future__ import annotations

import psycopg
import pytest

from blackboard.connection import connect_nats
from blackboard.settings import Settings, WorkerSettings
from blackboard.streams import ensure_streams
from blackboard.subjects import Subjects
from blackboard.worker import Worker
from blackboard.worker.reindex import reindex
from tests._worker_helpers import HashProvider, put_entry, remember

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_reindex_fills_new_space_and_swaps_tables(pg_settings: Settings, unique: str) -> None:
    s = pg_settings.model_copy(update={"worker": WorkerSettings(name=f"w{unique}", serve_search=False)})
    nc = await connect_nats(s.nats, name="reindex")
    js = nc.jetstream()
    await ensure_streams(js, s)
    for i in range(20):
        await remember(js, unique, "alice", f"{unique}-{i}", f"memory number {i} about reindexing")
    await put_entry(js, Subjects(s.board.bucket), unique, "notes", "k", "an entry to embed")
    await nc.close()
    async with Worker(s, provider=HashProvider(32, "hash-a")) as w:
        await w.wait_caught_up(30, embedded=True)
    new = HashProvider(48, f"hash-b-{unique}")
    stats = await reindex(s, progress=False, provider=new)
    assert stats["dims"] == 48 and stats["memories"] >= 20 and stats["entries"] >= 1
    table = f"bb_vec_{stats['space']}_memories"
    with psycopg.connect(s.postgres.dsn.get_secret_value()) as conn:
        n = conn.execute(f"SELECT count(*) FROM {table} v JOIN bb_memories m ON m.mid = v.item "
                         "WHERE m.board = %s AND v.board = m.board", (unique,)).fetchone()
        dims = conn.execute(f"SELECT vector_dims(embedding) FROM {table} LIMIT 1").fetchone()
        idx = conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s", (table,)).fetchall()
    assert n == (20,) and dims == (48,)
    assert {r[0] for r in idx} == {f"{table}_pkey", f"{table}_hnsw", f"{table}_board"}
    # running it again replaces the space's tables (idempotent)
    again = await reindex(s, progress=False, provider=new)
    assert again["space"] == stats["space"] and again["memories"] == stats["memories"]
