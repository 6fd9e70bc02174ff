"""Migrations apply on an empty database, re-apply as no-ops, and are safe concurrently."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest

from blackboard.db import load_migrations, migrate, pending
from blackboard.db.migrate import MIGRATIONS_DIR, Migration
from blackboard.embedded import EmbeddedNats, EmbeddedPostgres
from blackboard.errors import MigrationError
from tests.conftest import make_settings

EXPECTED_TABLES = {
    "bb_schema_migrations", "bb_entry_revisions", "bb_entries", "bb_memories",
    "bb_embed_queue", "bb_embed_inbox", "bb_embedding_spaces", "bb_dead_letters", "bb_messages",
    "bb_proposals", "bb_ballots", "bb_outcomes",
}


def _fresh_db(server: EmbeddedPostgres, name: str) -> str:
    admin = f"postgresql://postgres@{server.host}:{server.port}/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql://postgres@{server.host}:{server.port}/{name}"


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


@pytest.mark.asyncio(loop_scope="session")
async def test_migrations_apply_on_empty_database_then_reapply_as_noop(
        nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres, unique: str) -> None:
    dsn = _fresh_db(postgres_server, unique)
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


@pytest.mark.asyncio(loop_scope="session")
async def test_concurrent_migrate_applies_each_file_once(
        nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres, unique: str) -> None:
    dsn = _fresh_db(postgres_server, unique)
    settings = make_settings(nats_server.url, dsn)
    results = await asyncio.gather(*(migrate(settings) for _ in range(4)))
    flat = sorted(v for r in results for v in r)
    assert flat == [m.version for m in load_migrations()]


@pytest.mark.asyncio(loop_scope="session")
async def test_failed_migration_is_rolled_back_and_reported(
        nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres, unique: str,
        tmp_path: Path) -> None:
    dsn = _fresh_db(postgres_server, unique)
    (tmp_path / "0001_ok.sql").write_text("CREATE TABLE t_ok (x int);")
    (tmp_path / "0002_bad.sql").write_text("CREATE TABLE t_bad (x int); SELECT nope_nope();")
    settings = make_settings(nats_server.url, dsn)
    with pytest.raises(MigrationError) as err:
        await migrate(settings, directory=tmp_path)
    assert err.value.version == 2
    tables = _tables(dsn)
    assert "t_ok" in tables and "t_bad" not in tables

