"""The compose file's PostgreSQL (docker/): no password in the file, and the workers' role made by
the init script. No Docker engine runs here: the file is read as text, and the init script is run
the way the postgres image's entrypoint runs it (psql as the superuser, with the image's
environment: POSTGRES_USER, POSTGRES_DB, PGPASSWORD) against the embedded server."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from blackboard.db import load_migrations, migrate
from blackboard.devstack import EmbeddedNats, EmbeddedPostgres
from tests.conftest import make_settings

DOCKER = Path(__file__).resolve().parents[2] / "docker"
INIT_SCRIPT = DOCKER / "postgres" / "init-app-role.sh"


def _setting(text: str, name: str) -> list[str]:
    """Every value given to ``name:`` in the compose file's text."""
    return [m.strip() for m in re.findall(rf"^\s*{name}:\s*(.+?)\s*$", text, flags=re.MULTILINE)]


def test_the_compose_file_ships_no_postgres_password_and_points_the_workers_at_their_role() -> None:
    text = (DOCKER / "compose.yml").read_text()
    assert _setting(text, "POSTGRES_PASSWORD") == [
        "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD (the PostgreSQL superuser's password)}"]
    assert all(v.startswith("${POSTGRES_APP_PASSWORD:?") for v in _setting(text, "POSTGRES_APP_PASSWORD"))
    assert all(v.startswith("${POSTGRES_APP_PASSWORD:?") for v in _setting(text, "PGPASSWORD"))
    assert _setting(text, "POSTGRES_USER")[0].split()[0] == "postgres"  # not the workers' role
    assert "--auth-local=scram-sha-256 --auth-host=scram-sha-256" in _setting(text, "POSTGRES_INITDB_ARGS")
    [dsn] = _setting(text, "BLACKBOARD_POSTGRES__DSN")
    params = conninfo_to_dict(dsn)
    assert params["user"] == "blackboard" and "password" not in params
    assert "./postgres/init-app-role.sh:/docker-entrypoint-initdb.d/" in text
    assert os.access(INIT_SCRIPT, os.X_OK)  # run, not sourced, by the entrypoint


def _run_init_script(env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(INIT_SCRIPT)], env=env, capture_output=True, timeout=60)


@pytest.mark.asyncio
async def test_the_init_script_makes_a_role_that_is_no_superuser_and_owns_the_database(
        stack_dir: Path, nats_server: EmbeddedNats) -> None:
    # The embedded server's own application role is named otherwise: the script creates "blackboard".
    pg = EmbeddedPostgres(stack_dir / f"compose-{uuid.uuid4().hex[:8]}", port=0, database="embedded",
                          role="embedded_app")
    pg.start()
    try:
        with psycopg.connect(pg.database_dsn("postgres", admin=True), autocommit=True) as conn:
            conn.execute("CREATE DATABASE blackboard")  # POSTGRES_DB, as the image creates it
        superuser_password = pg.password_file(pg.superuser).read_text().strip()
        app_password = "an app password with a ' quote, spaces and $dollars"
        env = {"PATH": f"{EmbeddedPostgres._bin()}{os.pathsep}{os.environ['PATH']}",
               "PGHOST": pg.host, "PGPORT": str(pg.port), "PGPASSWORD": superuser_password,
               "POSTGRES_USER": pg.superuser, "POSTGRES_DB": "blackboard"}
        refused = await asyncio.to_thread(_run_init_script, env)
        assert refused.returncode != 0 and b"set POSTGRES_APP_PASSWORD" in refused.stderr
        done = await asyncio.to_thread(_run_init_script, {**env, "POSTGRES_APP_PASSWORD": app_password})
        assert done.returncode == 0, done.stderr.decode(errors="replace")

        dsn = make_conninfo(host=pg.host, port=pg.port, dbname="blackboard", user="blackboard",
                            password=app_password)
        assert await migrate(make_settings(nats_server.url, dsn)) == [m.version for m in load_migrations()]
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls, "
                "(SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()), "
                "(SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tableowner <> current_user) "
                "FROM pg_roles WHERE rolname = current_user").fetchone()
            assert row == (False, False, False, False, False, "blackboard", 0)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("CREATE ROLE intruder")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("CREATE DATABASE intruder")
        wrong = make_conninfo(dsn, password="blackboard")  # the old compose file's fixed password
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(wrong, connect_timeout=5)
    finally:
        pg.stop()
