"""reindex re-embeds everything into a new model's space; search then uses it."""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg
import pytest

from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.db import load_migrations, migrate
from blackboard.devstack import EmbeddedPostgres
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings
from blackboard.worker.reindex import reindex
from tests._worker_helpers import (
    GlitchyProvider,
    HashProvider,
    fresh_db,
    put_entry,
    remember,
    running_worker,
    worker_settings,
)
from tests.conftest import make_settings

pytestmark = pytest.mark.asyncio


async def test_reindex_fills_new_space_and_swaps_tables(pg_settings: Settings, postgres_server: EmbeddedPostgres,
                                                        unique: str) -> None:
    # A database of its own (the whole queue is waited on; see tests/worker/test_ingest.py's own_db).
    own = make_settings(pg_settings.nats.url, fresh_db(postgres_server, unique))
    s = worker_settings(own, name=f"w{unique}", serve_search=False)
    nc = await connect_nats(s.nats, name="reindex")
    js = nc.jetstream()
    await ensure_streams(js, s)
    for i in range(20):
        await remember(js, unique, "alice", f"{unique}-{i}", f"memory number {i} about reindexing")
    await put_entry(js, Subjects(s.board.bucket), unique, "notes", "k", "an entry to embed")
    await nc.close()
    async with running_worker(s, provider=HashProvider(32, "hash-a")) as w:
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


#: Session options under which every parallel index build fails as in a container with a small
#: /dev/shm: any table gets parallel workers, and their shared memory (maintenance_work_mem) cannot
#: be had ("could not resize shared memory segment ... No space left on device").
_NO_SHM = "options=-c%20min_parallel_table_scan_size%3D0%20-c%20maintenance_work_mem%3D1000GB"


async def test_reindex_builds_its_indexes_serially_when_a_parallel_build_gets_no_shared_memory(
        postgres_server: EmbeddedPostgres, pg_settings: Settings, unique: str,
        caplog: pytest.LogCaptureFixture) -> None:
    dsn = fresh_db(postgres_server, unique)
    base = make_settings(pg_settings.nats.url, f"{dsn}?{_NO_SHM}")
    s = worker_settings(base, name=f"w{unique}", serve_search=False, index_build_memory="1000GB")
    await migrate(s)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO bb_memories (id, board, agent, kind, text, created_at, updated_at, stream, seq) "
                     "SELECT 'm' || i, 'b', 'a', 'episodic', 'memory ' || i, now(), now(), 'S', i "
                     "FROM generate_series(1, 300) i")
    with caplog.at_level(logging.WARNING, logger="blackboard.db.spaces"):
        stats = await reindex(s, progress=False, provider=HashProvider(16, "hash-shm"))
    table = f"bb_vec_{stats['space']}_memories"
    with psycopg.connect(dsn) as conn:
        n = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        idx = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s", (table,))}
    assert n == (300,) and idx == {f"{table}_pkey", f"{table}_hnsw", f"{table}_board"}
    assert any("building it serially" in r.getMessage() for r in caplog.records), caplog.text


async def test_migration_0012_builds_the_index_serially_when_a_parallel_build_gets_no_shared_memory(
        postgres_server: EmbeddedPostgres, pg_settings: Settings, unique: str, tmp_path: Path) -> None:
    dsn = fresh_db(postgres_server, unique)
    for mig in load_migrations():
        if mig.version < 12:
            (tmp_path / f"{mig.version:04d}_{mig.name}.sql").write_text(mig.sql, encoding="utf-8")
    await migrate(make_settings(pg_settings.nats.url, dsn), directory=tmp_path)
    with psycopg.connect(dsn, autocommit=True) as conn:
        sid = conn.execute("INSERT INTO bb_embedding_spaces (model, dims) VALUES ('old', 3) RETURNING id").fetchone()
        assert sid is not None
        table = f"bb_vec_{sid[0]}_memories"
        conn.execute(f"CREATE TABLE {table} (item bigint PRIMARY KEY, revision bigint NOT NULL, board text NOT NULL, "
                     "embedding vector(3) NOT NULL)")
        conn.execute(f"CREATE INDEX {table}_hnsw ON {table} USING hnsw (embedding vector_cosine_ops)")
        conn.execute(f"INSERT INTO {table} SELECT i, 1, 'b', ARRAY[random(), random(), random()]::vector "
                     "FROM generate_series(1, 2000) i")
    # Under these options a parallel build fails; without the fallback the migration would raise.
    assert (await migrate(make_settings(pg_settings.nats.url, f"{dsn}?{_NO_SHM}")))[:1] == [12]
    with psycopg.connect(dsn) as conn:
        definition = conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", (f"{table}_hnsw",)).fetchone()
    assert definition is not None and "halfvec_cosine_ops" in definition[0]


async def test_reindex_leaves_out_vectors_holding_nan_and_stores_the_rest_at_unit_length(
        postgres_server: EmbeddedPostgres, pg_settings: Settings, unique: str) -> None:
    dsn = fresh_db(postgres_server, unique)
    s = make_settings(pg_settings.nats.url, dsn)
    await migrate(s)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO bb_memories (id, board, agent, kind, text, created_at, updated_at, stream, seq) "
                     "SELECT id, 'b', 'a', 'episodic', text, now(), now(), 'S', n FROM (VALUES "
                     "('ok', 'a plain memory', 1), ('poison', 'a poison memory', 2), ('loud', 'a loud memory', 3)) "
                     "AS v(id, text, n)")
    stats = await reindex(s, progress=False, provider=GlitchyProvider(16, "hash-glitch"))
    table = f"bb_vec_{stats['space']}_memories"
    with psycopg.connect(dsn) as conn:
        rows = dict(conn.execute(f"SELECT m.id, vector_norm(v.embedding) FROM {table} v "
                                 "JOIN bb_memories m ON m.mid = v.item").fetchall())
    assert set(rows) == {"ok", "loud"} and all(n == pytest.approx(1.0, abs=1e-5) for n in rows.values())
