"""Migrations apply on an empty database, re-apply as no-ops, and are safe concurrently."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import psycopg
import pytest
import pytest_asyncio

from blackboard.db import load_migrations, migrate, pending
from blackboard.db.migrate import MIGRATIONS_DIR, MIN_PGVECTOR, Migration, pgvector_version
from blackboard.devstack import EmbeddedNats, EmbeddedPostgres
from blackboard.protocol.errors import MigrationError
from tests._worker_helpers import fresh_db
from tests.conftest import make_settings

EXPECTED_TABLES = {
    "bb_schema_migrations", "bb_entry_revisions", "bb_entries", "bb_memories",
    "bb_embed_queue", "bb_embed_inbox", "bb_embedding_spaces", "bb_dead_letters", "bb_messages",
    "bb_proposals", "bb_ballots", "bb_outcomes",
}


@pytest_asyncio.fixture(scope="module")
async def migrated(nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres) -> str:
    """The DSN of a fresh database with every migration applied (read by the catalog checks)."""
    dsn = fresh_db(postgres_server, "m" + uuid.uuid4().hex[:12])
    await migrate(make_settings(nats_server.url, dsn))
    return dsn


def _tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {r[0] for r in rows}


def test_migration_files_are_numbered_and_shipped_in_the_package() -> None:
    migs = load_migrations()
    assert [m.version for m in migs] == list(range(1, len(migs) + 1))
    import blackboard.db

    shipped = Path(blackboard.db.__file__).parent.parent / "migrations"
    assert MIGRATIONS_DIR.resolve() == shipped.resolve()
    assert len(list(shipped.glob("*.sql"))) == len(migs) >= 1


def test_pending_skips_applied_and_refuses_changed_files() -> None:
    a, b = Migration(1, "a", "SELECT 1"), Migration(2, "b", "SELECT 2")
    assert pending([a, b], {}) == [a, b]
    assert pending([a, b], {1: a.checksum}) == [b]
    with pytest.raises(MigrationError) as err:
        pending([a, b], {1: "0" * 64})
    assert err.value.version == 1
    with pytest.raises(MigrationError):
        pending([a], {1: a.checksum, 2: b.checksum})


def test_load_migrations_refuses_bad_names(tmp_path: Path) -> None:
    (tmp_path / "1_bad.sql").write_text("SELECT 1")
    with pytest.raises(MigrationError):
        load_migrations(tmp_path)


@pytest.mark.asyncio
async def test_migrations_apply_on_empty_database_then_reapply_as_noop(
        nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres, unique: str) -> None:
    dsn = fresh_db(postgres_server, unique)
    settings = make_settings(nats_server.url, dsn)
    applied = await migrate(settings)
    assert applied == [m.version for m in load_migrations()]
    assert EXPECTED_TABLES <= _tables(dsn)
    assert await migrate(settings) == []
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT version FROM bb_schema_migrations").fetchall()
        ext = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    assert [r[0] for r in rows] == applied
    assert ext is not None


def test_keyword_search_indexes_board_and_words_together(migrated: str) -> None:
    """Migration 0010: one GIN index on (board, tsv) per searchable table, and no tsv-only one left."""
    with psycopg.connect(migrated) as conn:
        defs = {(r[0], r[1]): r[2] for r in conn.execute(
            "SELECT tablename, indexname, indexdef FROM pg_indexes "
            "WHERE tablename IN ('bb_memories', 'bb_entries') AND indexdef LIKE '%USING gin%'").fetchall()}
        gin_text_ops = conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'btree_gin'").fetchone()
    assert gin_text_ops is not None
    for table in ("bb_memories", "bb_entries"):
        assert "USING gin (board, tsv)" in defs[(table, f"{table}_board_tsv")]
        assert not [d for d in defs.values() if f" ON public.{table} " in d and "USING gin (tsv)" in d]


def test_every_gin_index_keeps_a_short_pending_list(migrated: str) -> None:
    """Migration 0011: a search scans a GIN index's whole pending list; none may grow to the 4 MB default."""
    with psycopg.connect(migrated) as conn:
        options = dict(conn.execute(
            "SELECT c.relname, c.reloptions FROM pg_class c JOIN pg_am a ON a.oid = c.relam "
            "WHERE a.amname = 'gin' AND c.relkind = 'i' AND c.relname LIKE 'bb\\_%'").fetchall())
    assert len(options) >= 8, options
    assert all(opts is not None and "gin_pending_list_limit=128" in opts for opts in options.values()), options


@pytest.mark.asyncio
async def test_concurrent_migrate_applies_each_file_once(
        nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres, unique: str) -> None:
    dsn = fresh_db(postgres_server, unique)
    settings = make_settings(nats_server.url, dsn)
    results = await asyncio.gather(*(migrate(settings) for _ in range(4)))
    flat = sorted(v for r in results for v in r)
    assert flat == [m.version for m in load_migrations()]


@pytest.mark.asyncio
async def test_failed_migration_is_rolled_back_and_reported(
        nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres, unique: str,
        tmp_path: Path) -> None:
    dsn = fresh_db(postgres_server, unique)
    (tmp_path / "0001_ok.sql").write_text("CREATE TABLE t_ok (x int);")
    (tmp_path / "0002_bad.sql").write_text("CREATE TABLE t_bad (x int); SELECT nope_nope();")
    settings = make_settings(nats_server.url, dsn)
    with pytest.raises(MigrationError) as err:
        await migrate(settings, directory=tmp_path)
    assert err.value.version == 2
    tables = _tables(dsn)
    assert "t_ok" in tables and "t_bad" not in tables


@pytest.mark.asyncio
async def test_vector_tables_of_existing_spaces_get_the_board(
        nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres, unique: str, tmp_path: Path) -> None:
    """0008 rebuilds a space's vector tables from before it with each item's board (orphans left out);
    0012 rebuilds their HNSW indexes on halfvec."""
    dsn = fresh_db(postgres_server, unique)
    settings = make_settings(nats_server.url, dsn)
    for mig in load_migrations():
        if mig.version < 8:
            (tmp_path / f"{mig.version:04d}_{mig.name}.sql").write_text(mig.sql, encoding="utf-8")
    await migrate(settings, directory=tmp_path)
    with psycopg.connect(dsn, autocommit=True) as conn:
        sid = conn.execute("INSERT INTO bb_embedding_spaces (model, dims) VALUES ('old', 3) RETURNING id").fetchone()
        assert sid is not None
        mem, ent = f"bb_vec_{sid[0]}_memories", f"bb_vec_{sid[0]}_entries"
        for table in (mem, ent):  # the tables as spaces.py created them before 0008
            conn.execute(f"CREATE TABLE {table} (item bigint PRIMARY KEY, revision bigint NOT NULL, "
                         "embedding vector(3) NOT NULL)")
            conn.execute(f"CREATE INDEX {table}_hnsw ON {table} USING hnsw (embedding vector_cosine_ops)")
        mids = [r[0] for r in conn.execute(
            "INSERT INTO bb_memories (id, board, agent, kind, text, created_at, updated_at, stream, seq) "
            "SELECT 'm' || i, 'board' || (i % 2), 'a', 'episodic', 't', now(), now(), 'S', i "
            "FROM generate_series(1, 3) i RETURNING mid").fetchall()]
        eid = conn.execute(
            "INSERT INTO bb_entries (board, section, key, stream, revision, updated_at) "
            "VALUES ('eboard', 's', 'k', 'KV', 1, now()) RETURNING eid").fetchone()
        assert eid is not None
        conn.execute(f"INSERT INTO {mem} SELECT item, 1, '[1,0,0]' FROM unnest(%s::bigint[]) item",
                     ([*mids, 10**9],))  # the last one's memory is gone
        conn.execute(f"INSERT INTO {ent} VALUES (%s, 1, '[0,1,0]')", (eid[0],))
    assert await migrate(settings) == [m.version for m in load_migrations() if m.version >= 8]
    with psycopg.connect(dsn) as conn:
        got = conn.execute(f"SELECT v.item, v.board, m.board FROM {mem} v JOIN bb_memories m ON m.mid = v.item "
                           "ORDER BY v.item").fetchall()
        count = conn.execute(f"SELECT count(*) FROM {mem}").fetchone()
        entry = conn.execute(f"SELECT item, board, embedding::text FROM {ent}").fetchall()
        indexes = {r[0] for r in conn.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename IN (%s, %s)", (mem, ent)).fetchall()}
        hnsw = [r[0] for r in conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname IN (%s, %s)", (f"{mem}_hnsw", f"{ent}_hnsw")).fetchall()]
        notnull = conn.execute("SELECT attnotnull FROM pg_attribute WHERE attrelid = %s::regclass "
                               "AND attname = 'board'", (mem,)).fetchone()
    assert [(i, b) for i, b, _ in got] == [(i, b) for i, _, b in got] and len(got) == 3 and count == (3,)
    assert entry == [(eid[0], "eboard", "[0,1,0]")]
    assert indexes == {f"{t}_{i}" for t in (mem, ent) for i in ("pkey", "hnsw", "board")}
    # 0012: the HNSW indexes are on the vectors cast to halfvec (the searches' order expression).
    assert len(hnsw) == 2 and all("((embedding)::halfvec(3)) halfvec_cosine_ops" in d for d in hnsw), hnsw
    assert notnull == (True,)


#: The tables whose rows carry a signature verdict (migration 0013).
VERDICT_TABLES = ("bb_entry_revisions", "bb_entries", "bb_memories", "bb_memory_forgets", "bb_messages",
                  "bb_proposals", "bb_ballots", "bb_outcomes",
                  "bb_memory_sources")  # 0015: a merged memory's sources keep the verdict they were stored with


@pytest.mark.asyncio
async def test_rows_stored_before_signatures_are_unsigned(
        nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres, unique: str, tmp_path: Path) -> None:
    """0013 gives every row table a ``verdict`` (NOT NULL); the rows already there were never
    checked: ``unsigned``."""
    dsn = fresh_db(postgres_server, unique)
    settings = make_settings(nats_server.url, dsn)
    for mig in load_migrations():
        if mig.version < 13:
            (tmp_path / f"{mig.version:04d}_{mig.name}.sql").write_text(mig.sql, encoding="utf-8")
    await migrate(settings, directory=tmp_path)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO bb_entry_revisions (stream, seq, board, section, key, op, stored_at) "
                     "VALUES ('KV', 1, 'b', 's', 'k', 'PUT', now())")
        conn.execute("INSERT INTO bb_memories (id, board, agent, kind, text, created_at, updated_at, stream, seq) "
                     "VALUES ('m', 'b', 'a', 'episodic', 't', now(), now(), 'S', 1)")
    assert 13 in await migrate(settings)
    with psycopg.connect(dsn) as conn:
        old = [conn.execute(f"SELECT verdict FROM {t}").fetchall() for t in ("bb_entry_revisions", "bb_memories")]
        columns = conn.execute(
            "SELECT table_name, is_nullable, column_default FROM information_schema.columns "
            "WHERE column_name = 'verdict' AND table_schema = current_schema()").fetchall()
    assert old == [[("unsigned",)], [("unsigned",)]]
    assert sorted(columns) == sorted((t, "NO", "'unsigned'::text") for t in VERDICT_TABLES)


@pytest.mark.asyncio
async def test_a_space_of_3072_dimensions_gets_its_hnsw_index_and_answers_through_it(
        nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres, unique: str) -> None:
    """OpenAI's text-embedding-3-large (3,072 dimensions) is past vector's HNSW limit (2,000); the
    halfvec index takes it, and the searches' order expression is answered by that index."""
    from blackboard.db.spaces import ann_order, ensure_space

    dsn = fresh_db(postgres_server, unique)
    await migrate(make_settings(nats_server.url, dsn))
    dims = 3072
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        space = await ensure_space(conn, "text-embedding-3-large", dims)
        table = space.table_name("memory")

        def unit(i: int) -> str:
            return "[" + ",".join("1" if j == i else "0" for j in range(dims)) + "]"

        async with conn.cursor() as cur:
            await cur.executemany(f"INSERT INTO {table} (item, revision, board, embedding) VALUES (%s, 1, 'b', %s)",
                                  [(i + 1, unit(i)) for i in range(50)])
        await conn.execute("SET enable_seqscan = off")
        await conn.execute("SET enable_sort = off")
        query = f"SELECT item FROM {table} ORDER BY {ann_order(dims)} LIMIT 3"
        plan = "\n".join(str(r[0]) for r in await (await conn.execute("EXPLAIN " + query, (unit(7),))).fetchall())
        nearest = await (await conn.execute(query, (unit(7),))).fetchall()
    assert f"Index Scan using {table}_hnsw" in plan, plan
    assert nearest[0] == (8,)


def test_pgvector_versions_compare_by_their_numbers() -> None:
    assert pgvector_version("0.8.1") == (0, 8, 1) > MIN_PGVECTOR
    assert pgvector_version("0.10.0") > pgvector_version("0.9.9")
    assert pgvector_version("0.6.2") < MIN_PGVECTOR
    assert pgvector_version("0.8.0-dev") == (0, 8, 0)


@pytest.mark.asyncio
async def test_migrate_refuses_a_pgvector_older_than_it_needs_and_says_what_to_do(
        nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres, unique: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's pgvector (0.8.x here) against a minimum raised past it: migrate applies
    nothing and names the version found and the fix, on a fresh database and on a migrated one."""
    import importlib

    migrate_module = importlib.import_module("blackboard.db.migrate")  # (blackboard.db.migrate is the function)
    dsn = fresh_db(postgres_server, unique)
    settings = make_settings(nats_server.url, dsn)
    admin = postgres_server.database_dsn(unique, admin=True)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("DROP EXTENSION vector")  # a database pgvector was never created in
    monkeypatch.setattr(migrate_module, "MIN_PGVECTOR", (99, 0, 0))
    with pytest.raises(MigrationError, match=r"pgvector 0\.\d+\.\d+ is on the server; blackboard needs 99\.0\.0"):
        await migrate(settings)
    assert "bb_memories" not in _tables(dsn)
    monkeypatch.undo()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION vector")  # the application role may not (tests/db/test_roles.py)
    await migrate(settings)
    monkeypatch.setattr(migrate_module, "MIN_PGVECTOR", (99, 0, 0))
    with pytest.raises(MigrationError, match=r"is in this database; blackboard needs 99\.0\.0 or later: install"):
        await migrate(settings)
