"""The server-side processes run with identities: `blackboard setup` as the operator, the
worker as a worker, never either as an agent (docs/security.md, docs/operations.md).

`setup` connects with ``nats.creds_file`` when it is set, else the operator's credential
(``nats.credentials_dir/operator.creds``, ...); a worker with ``nats.creds_file``, else the
credential issued for its ``worker.name``. A credential of the agent kind (its JWT's
``bb-kind:agent`` tag) is refused before anything connects, with an AuthenticationError
that says which identity the process needs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from blackboard.devstack import EmbeddedNats, EmbeddedPostgres
from blackboard.protocol.errors import AuthenticationError
from blackboard.protocol.subjects import (
    KEYS_STREAM,
    MEMORY_STREAM,
    MESSAGE_STREAM,
    VOTE_STREAM,
    Subjects,
)
from blackboard.security.credentials import OPERATOR_PRINCIPAL, find_system_credentials
from blackboard.security.jwt import Credentials
from blackboard.settings import NatsSettings, SecuritySettings, Settings
from tests._auth import TestAuth, raw_connect
from tests._worker_helpers import running_worker
from tests.conftest import auth_nats, make_settings

STREAMS = [Subjects().kv_stream, MEMORY_STREAM, MESSAGE_STREAM, VOTE_STREAM]


@pytest.fixture
def fresh_nats(tmp_path: Path, test_auth: TestAuth) -> Iterator[EmbeddedNats]:
    """A server with the session's authorization and TLS, and no JetStream asset yet."""
    server = auth_nats(tmp_path / "nats", test_auth, port=0)
    server.start()
    yield server
    server.stop()


def _env(url: str, auth: TestAuth, dsn: str | None = None, **settings: str | Path) -> dict[str, str]:
    """The environment of a CLI process: no BLACKBOARD_* of ours but these, the test CA."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")}
    env |= {"BLACKBOARD_NATS__URL": url, "BLACKBOARD_NATS__TLS_CA_FILE": str(auth.tls.ca),
            # No dev directory of this checkout (its authority would issue credentials).
            "BLACKBOARD_DEV__DATA_DIR": str(auth.authority.directory / "no-dev")}
    if dsn is not None:
        env["BLACKBOARD_POSTGRES__DSN"] = dsn
    env |= {f"BLACKBOARD_{name.upper()}": str(value) for name, value in settings.items()}
    return env


def _blackboard(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "blackboard", *args], env=env, capture_output=True, text=True,
                          timeout=120)


async def _streams(url: str, auth: TestAuth) -> list[str]:
    """The names of the blackboard's streams on the server (as the operator sees them)."""
    nc = await raw_connect(url, auth)
    try:
        return sorted(info.config.name for info in await nc.jetstream().streams_info()
                      if info.config.name in STREAMS)
    finally:
        await nc.close()


def _creds_dir(tmp_path: Path, auth: TestAuth, *principals: str) -> Path:
    """A credentials directory holding only these principals' ``.creds`` files."""
    directory = tmp_path / "creds"
    directory.mkdir(exist_ok=True)
    for principal in principals:
        shutil.copy(auth.creds(principal), directory / f"{principal}.creds")
    return directory


@pytest.mark.asyncio
async def test_setup_as_the_operator_creates_the_streams_and_migrates(
        fresh_nats: EmbeddedNats, postgres_server: EmbeddedPostgres, test_auth: TestAuth) -> None:
    # The compose file's way: the operator's .creds file in nats.creds_file, tls:// URLs, the CA.
    done = _blackboard("setup", env=_env(fresh_nats.url, test_auth, postgres_server.dsn,
                                         NATS__CREDS_FILE=test_auth.creds(OPERATOR_PRINCIPAL)))
    assert done.returncode == 0, done.stderr
    assert f"JetStream assets ready on {fresh_nats.url}" in done.stdout
    assert await _streams(fresh_nats.url, test_auth) == sorted(STREAMS)


@pytest.mark.asyncio
async def test_setup_finds_the_operators_credential_by_its_id(
        fresh_nats: EmbeddedNats, test_auth: TestAuth, tmp_path: Path) -> None:
    creds = _creds_dir(tmp_path, test_auth, OPERATOR_PRINCIPAL, "worker")
    done = _blackboard("setup", "--no-migrate", env=_env(fresh_nats.url, test_auth, NATS__CREDENTIALS_DIR=creds))
    assert done.returncode == 0, done.stderr
    assert await _streams(fresh_nats.url, test_auth) == sorted(STREAMS)


@pytest.mark.asyncio
async def test_setup_refuses_an_agents_credential(
        fresh_nats: EmbeddedNats, test_auth: TestAuth, unique: str) -> None:
    agent = f"alice{unique}"
    done = _blackboard("setup", "--no-migrate",
                       env=_env(fresh_nats.url, test_auth, NATS__CREDS_FILE=test_auth.creds(agent)))
    assert done.returncode == 1, done.stderr
    assert f"is the credential of the agent {agent!r}: blackboard setup runs as an operator identity" \
        in done.stderr
    assert "--kind operator" in done.stderr and "Traceback" not in done.stderr
    assert await _streams(fresh_nats.url, test_auth) == []


def test_setup_without_any_credential_names_the_operator(
        fresh_nats: EmbeddedNats, test_auth: TestAuth, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _blackboard("setup", "--no-migrate", env=_env(fresh_nats.url, test_auth, NATS__CREDENTIALS_DIR=empty))
    assert done.returncode == 1, done.stderr
    assert "no credential for 'operator'" in done.stderr


def test_the_worker_refuses_an_agents_credential(
        nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres, test_auth: TestAuth, unique: str) -> None:
    # Refused before anything connects to NATS (after the migrations, which tell a bad DSN first).
    agent = f"bob{unique}"
    done = _blackboard("worker", "--no-embed", env=_env(
        nats_server.url, test_auth, postgres_server.dsn, NATS__CREDS_FILE=test_auth.creds(agent)))
    assert done.returncode == 1, done.stderr
    assert f"is the credential of the agent {agent!r}: the worker 'worker' runs as a worker identity" in done.stderr
    assert "--kind worker" in done.stderr and "Traceback" not in done.stderr


def _no_process_credential(settings: Settings, tmp_path: Path, creds: Path) -> Settings:
    """``settings`` without nats.creds_file nor an authority: credentials only from ``creds``."""
    return settings.model_copy(update={
        "nats": settings.nats.model_copy(update={"creds_file": None, "credentials_dir": creds}),
        "security": SecuritySettings(policy_file=settings.security.policy_file),
        "dev": settings.dev.model_copy(update={"data_dir": tmp_path / "no-dev"})})


@pytest.mark.asyncio
async def test_the_worker_finds_the_credential_issued_for_its_name(
        pg_settings: Settings, test_auth: TestAuth, tmp_path: Path, unique: str) -> None:
    settings = _no_process_credential(pg_settings, tmp_path, _creds_dir(tmp_path, test_auth, "worker"))
    async with running_worker(settings, name="worker", group=f"g{unique}", embed=False, serve_search=False) as w:
        assert w.committer is not None  # fully up: it connected as 'worker'


@pytest.mark.asyncio
async def test_a_worker_named_like_an_agent_is_refused(
        pg_settings: Settings, test_auth: TestAuth, tmp_path: Path, unique: str) -> None:
    # The test policy declares every other id an agent (agents."*"): the credential found for
    # this worker's name is an agent's.
    name = f"w{unique}"
    settings = _no_process_credential(pg_settings, tmp_path, _creds_dir(tmp_path, test_auth, name))
    with pytest.raises(AuthenticationError, match=f"the credential of the agent '{name}'"):
        async with running_worker(settings, name=name, embed=False, serve_search=False):
            pass


def test_system_credentials_prefer_the_creds_file_of_any_worker_or_operator(test_auth: TestAuth) -> None:
    # Replicas named worker-1, worker-2 share one file; an operator may run a worker.
    for principal in ("worker", OPERATOR_PRINCIPAL):
        settings = make_settings("tls://127.0.0.1:1").model_copy(update={"nats": NatsSettings(
            url="tls://127.0.0.1:1", creds_file=test_auth.creds(principal))})
        found = find_system_credentials("worker-2", settings, process="the worker 'worker-2'")
        assert found is not None and found.principal == principal


@pytest.mark.asyncio
async def test_auth_publish_runs_as_the_operator_once_the_streams_exist(
        fresh_nats: EmbeddedNats, test_auth: TestAuth, unique: str) -> None:
    """`blackboard auth publish` connects as an operator, never as an agent, and says what to run
    when the key registry's stream is not there yet."""
    authority = str(test_auth.authority.directory)
    agent = f"carol{unique}"
    as_agent = _env(fresh_nats.url, test_auth, NATS__CREDS_FILE=test_auth.creds(agent))
    done = _blackboard("auth", "--dir", authority, "publish", env=as_agent)
    assert done.returncode == 1, done.stderr
    assert f"is the credential of the agent {agent!r}: blackboard auth publish runs as an operator identity" \
        in done.stderr

    as_operator = _env(fresh_nats.url, test_auth, NATS__CREDS_FILE=test_auth.creds(OPERATOR_PRINCIPAL))
    done = _blackboard("auth", "--dir", authority, "publish", env=as_operator)
    assert done.returncode == 2, done.stderr
    assert "no key registry stream (BB_KEYS)" in done.stderr and "blackboard setup" in done.stderr
    assert "Traceback" not in done.stderr

    assert _blackboard("setup", "--no-migrate", env=as_operator).returncode == 0
    done = _blackboard("auth", "--dir", authority, "publish", env=as_operator)
    assert done.returncode == 0, done.stderr
    assert f"key registry on {fresh_nats.url}: certificates published: " in done.stdout
    assert agent in done.stdout.split("already there")[0]  # the agent's certificate, put there by the operator
    nc = await raw_connect(fresh_nats.url, test_auth)
    try:
        msg = await nc.request(Subjects.direct_get(KEYS_STREAM, Subjects.key_certificate(
            Credentials.parse(test_auth.creds(agent).read_text()).public_key)), b"", timeout=5)
        assert msg.data.decode() == Credentials.parse(test_auth.creds(agent).read_text()).jwt
    finally:
        await nc.close()
