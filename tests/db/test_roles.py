"""PostgreSQL authentication and the worker's role (issue 19): the embedded server trusts no
connection, the application role is no superuser and holds only what the worker needs, and the
worker migrates, ingests, embeds and searches under it."""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.db import migrate, open_pool
from blackboard.devstack import EmbeddedNats, EmbeddedPostgres
from blackboard.protocol.schemas.search import MemorySearchRequest
from blackboard.protocol.subjects import Subjects
from blackboard.search.engine import SearchEngine
from tests._worker_helpers import (
    HashProvider,
    drop_db,
    fresh_db,
    put_entry,
    remember,
    running_worker,
)
from tests.conftest import make_settings

#: What a role owning nothing else should not be able to do, each refused with "permission denied".
_REFUSED = [
    "CREATE ROLE intruder LOGIN SUPERUSER",
    "CREATE DATABASE intruder",
    "ALTER ROLE CURRENT_USER SUPERUSER",
    "ALTER ROLE CURRENT_USER CREATEROLE",
    "ALTER SYSTEM SET log_statement = 'none'",
    "DROP EXTENSION vector",
    "SELECT rolpassword FROM pg_authid",
    "COPY (SELECT 1) TO PROGRAM 'true'",
    "SELECT pg_read_file('postgresql.conf')",
]


def _without_password(dsn: str, **params: str) -> str:
    """``dsn`` with no password (nor password file: libpq would read ~/.pgpass), plus ``params``."""
    values = conninfo_to_dict(dsn)
    values.pop("password", None)
    return make_conninfo(**{**values, "passfile": "/nonexistent/pgpass", **params})  # type: ignore[arg-type]


def test_connecting_without_the_password_is_refused(postgres_server: EmbeddedPostgres,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.delenv("PGPASSFILE", raising=False)
    for dsn in (postgres_server.dsn, postgres_server.admin_dsn):
        with pytest.raises(psycopg.OperationalError, match="no password supplied"):
            psycopg.connect(_without_password(dsn), connect_timeout=5)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(_without_password(dsn, password="postgres"), connect_timeout=5)
    with psycopg.connect(postgres_server.dsn, connect_timeout=5) as conn:
        assert conn.info.password  # the DSN carries it


def test_every_rule_of_pg_hba_asks_for_a_password(postgres_server: EmbeddedPostgres) -> None:
    """No trust (nor peer) rule, the local socket's included (the socket is off besides)."""
    with psycopg.connect(postgres_server.admin_dsn) as conn:
        rules = conn.execute("SELECT type, auth_method, error FROM pg_hba_file_rules").fetchall()
        socket_dirs = conn.execute("SHOW unix_socket_directories").fetchone()
    assert {(kind, method) for kind, method, _ in rules} == {("local", "scram-sha-256"), ("host", "scram-sha-256")}
    assert all(error is None for *_, error in rules)
    assert socket_dirs == ("",)


def test_passwords_are_kept_by_their_owner_alone_and_never_logged(postgres_server: EmbeddedPostgres) -> None:
    passwords = []
    for role in (postgres_server.superuser, postgres_server.role):
        path = postgres_server.password_file(role)
        info = path.stat()
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid(), path
        passwords.append(path.read_text().strip())
    assert len(set(passwords)) == 2 and all(len(p) >= 32 for p in passwords)
    log = (postgres_server.data_dir / "postgres.log").read_text(errors="replace")
    assert not any(p in log for p in passwords)
    assert not list(postgres_server.data_dir.glob(".*pwfile*"))  # initdb's copy is gone


def test_the_application_role_is_no_superuser_and_creates_no_role_nor_database(
        postgres_server: EmbeddedPostgres) -> None:
    with psycopg.connect(postgres_server.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_user, rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls, "
            "(SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()), "
            "(SELECT array_agg(b.rolname) FROM pg_auth_members m JOIN pg_roles b ON b.oid = m.roleid "
            " WHERE m.member = r.oid) "
            "FROM pg_roles r WHERE rolname = current_user").fetchone()
        assert row == (postgres_server.role, False, False, False, False, False, postgres_server.role, None)
        for statement in _REFUSED:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    with psycopg.connect(postgres_server.admin_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = 'intruder'").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_database WHERE datname = 'intruder'").fetchone() == (0,)


def test_other_roles_may_not_connect_to_the_database(postgres_server: EmbeddedPostgres, unique: str) -> None:
    """CONNECT is revoked from PUBLIC: a login role made later (a dashboard's, say) is let in
    only where it is granted."""
    with psycopg.connect(postgres_server.admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {unique} LOGIN PASSWORD 'some-password'")
    try:
        other = _without_password(postgres_server.dsn, user=unique, password="some-password")
        with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
            psycopg.connect(other, connect_timeout=5)
    finally:
        with psycopg.connect(postgres_server.admin_dsn, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {unique}")


@pytest.mark.asyncio
async def test_the_worker_migrates_ingests_embeds_and_searches_as_the_application_role(
        nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres, unique: str) -> None:
    """Everything the worker creates (the schema, a model's vector tables at run time) is the
    role's, and it reads, writes, ANALYZEs and searches there without another privilege."""
    dsn = fresh_db(postgres_server, unique)
    s = make_settings(nats_server.url, dsn)
    assert await migrate(s)
    nc = await connect_nats(s.nats, name="test-roles")
    try:
        js = nc.jetstream()
        await ensure_streams(js, s)
        await put_entry(js, Subjects(s.board.bucket), unique, "notes", "plan", "ship the harbour ferry")
        await remember(js, unique, "alice", f"{unique}-1", "the harbour ferry leaves at dawn")
        async with running_worker(s, name=f"w{unique}", provider=HashProvider(), serve_search=False,
                                  batch_wait=0.02, lag_interval=60.0) as w:
            await w.wait_caught_up(30, embedded=True)
            with psycopg.connect(dsn) as conn:
                users = conn.execute("SELECT DISTINCT usename FROM pg_stat_activity WHERE datname = %s "
                                     "AND application_name LIKE 'blackboard%%'", (unique,)).fetchall()
            assert users == [(postgres_server.role,)]
    finally:
        await nc.close()
    with psycopg.connect(dsn) as conn:
        owners: dict[str, str] = dict(conn.execute("SELECT tablename, tableowner FROM pg_tables WHERE schemaname = 'public'").fetchall())
        counts = conn.execute("SELECT (SELECT count(*) FROM bb_entries WHERE board = %s), "
                              "(SELECT count(*) FROM bb_memories WHERE board = %s)", (unique, unique)).fetchone()
    assert counts == (1, 1)
    assert any(t.startswith("bb_vec_") for t in owners)  # a space's tables, made at run time
    assert set(owners.values()) == {postgres_server.role}, owners
    async with open_pool(s.postgres, min_size=1, max_size=2) as pool:
        engine = SearchEngine(pool, None, s.search)
        hits = (await engine.search_memories(MemorySearchRequest(query="harbour ferry", mode="keyword",
                                                                 top_k=3, boards=[unique]))).hits
        await engine.analyze_missing()
    assert [h.id for h in hits] == [f"{unique}-1"]
    drop_db(postgres_server, unique)


@pytest.mark.asyncio
async def test_migrate_says_a_superuser_must_create_pgvector_when_the_role_may_not(
        nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres, unique: str) -> None:
    from blackboard.protocol.errors import MigrationError

    dsn = fresh_db(postgres_server, unique)
    with psycopg.connect(postgres_server.database_dsn(unique, admin=True), autocommit=True) as conn:
        conn.execute("DROP EXTENSION vector")
    with pytest.raises(MigrationError, match=rf"pgvector is not created in database '{unique}' and role "
                                             rf"'{postgres_server.role}' may not create it .* CREATE EXTENSION vector"):
        await migrate(make_settings(nats_server.url, dsn))
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regclass('bb_memories')").fetchone() == (None,)
    drop_db(postgres_server, unique)


def test_passwords_are_kept_across_restarts(postgres_factory: Callable[[], EmbeddedPostgres]) -> None:
    pg = postgres_factory()
    dsn, admin = pg.dsn, pg.admin_dsn
    pg.stop()
    again = EmbeddedPostgres(pg.data_dir, port=pg.port)  # another process starting the same data
    again.start()
    try:
        assert (again.dsn, again.admin_dsn) == (dsn, admin)
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (pg.role,)
    finally:
        again.stop()


@pytest.mark.asyncio
async def test_a_data_directory_from_before_passwords_is_secured_at_its_next_start(
        stack_dir: Path, nats_server: EmbeddedNats, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``blackboard dev`` directory made with ``initdb --auth=trust``, its schema migrated by the
    superuser and no application role: the next start gives the superuser a password, trusts
    nothing, creates the role and hands it the database and everything in it."""
    from blackboard.db.spaces import ensure_space

    monkeypatch.delenv("PGPASSWORD", raising=False)
    old = EmbeddedPostgres(stack_dir / f"legacy-{uuid.uuid4().hex[:8]}", port=0)
    old.start()
    try:
        assert await migrate(make_settings(nats_server.url, old.admin_dsn))  # the schema, the superuser's
        with psycopg.connect(old.database_dsn("postgres", admin=True), autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE {old.database} OWNER TO postgres")
            conn.execute(f"DROP ROLE {old.role}")
            conn.execute("ALTER ROLE postgres PASSWORD NULL")
    finally:
        old.stop()
    (old.pgdata / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")
    for role in (old.superuser, old.role):
        old.password_file(role).unlink()

    pg = EmbeddedPostgres(old.data_dir, port=0)
    pg.start()
    try:
        for dsn in (pg.dsn, pg.admin_dsn):
            with pytest.raises(psycopg.OperationalError, match="no password supplied"):
                psycopg.connect(_without_password(dsn), connect_timeout=5)
        assert stat.S_IMODE(pg.password_file(pg.superuser).stat().st_mode) == 0o600
        with psycopg.connect(pg.admin_dsn) as conn:
            methods = conn.execute("SELECT DISTINCT auth_method FROM pg_hba_file_rules").fetchall()
        assert methods == [("scram-sha-256",)]
        s = make_settings(nats_server.url, pg.dsn)
        assert await migrate(s) == []  # the role reads the superuser's bb_schema_migrations
        async with await psycopg.AsyncConnection.connect(pg.dsn, autocommit=True) as conn:
            await ensure_space(conn, "legacy-model", 3)
            await conn.execute("INSERT INTO bb_entries (board, section, key, stream, revision, updated_at) "
                               "VALUES ('b', 's', 'k', 'KV', 1, now())")
            cur = await conn.execute(
                "SELECT count(*) FILTER (WHERE tableowner <> current_user), "
                "(SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()) "
                "FROM pg_tables WHERE schemaname = 'public'")
            assert await cur.fetchone() == (0, pg.role)
    finally:
        pg.stop()


def test_before_its_first_start_the_dsns_carry_no_password(tmp_path: Path) -> None:
    """``blackboard dev --no-postgres`` builds its settings from the DSN of a server it never starts."""
    pg = EmbeddedPostgres(tmp_path / "never-started", port=5999)
    assert pg.dsn == "postgresql://blackboard@127.0.0.1:5999/blackboard"
    assert pg.admin_dsn == "postgresql://postgres@127.0.0.1:5999/blackboard"
    assert not (tmp_path / "never-started").exists()  # no IO before start()
    with pytest.raises(ValueError, match="cannot be the superuser"):
        EmbeddedPostgres(tmp_path / "x", port=5999, role="postgres")
