"""The command line's paper cuts (issue 18): a wrong setting is one clear line and exit 2, never a
traceback; ``blackboard worker`` says when it is ready at the default level; ``--name`` is a label and
``--group`` decides the consumers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import pytest

from blackboard.devstack import EmbeddedNats, EmbeddedPostgres
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings, WorkerSettings
from tests._worker_helpers import fresh_db, read_until
from tests.conftest import make_settings


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")}
    # Workers started at once each serve their metrics and health endpoints on a free port.
    env["BLACKBOARD_OBSERVABILITY__HTTP_PORT"] = "0"
    env.update({f"BLACKBOARD_{k}": v for k, v in extra.items()})
    return env


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "blackboard", *args], capture_output=True, text=True,
                          timeout=60, env=env or _env())


def _one_clear_line(result: subprocess.CompletedProcess[str], command: str) -> str:
    out = result.stdout + result.stderr
    assert "Traceback" not in out, out
    assert result.returncode == 2, out
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"blackboard {command}: error: "), out
    return lines[0]


def _data_dir() -> str:
    return tempfile.mkdtemp(prefix="bb-cli-err-")


@pytest.mark.parametrize("command", [("migrate",), ("reindex",), ("worker", "--nats-url", "nats://127.0.0.1:1")])
def test_a_malformed_postgres_dsn_is_one_line_naming_the_dsn(command: tuple[str, ...]) -> None:
    line = _one_clear_line(_run(*command, "--postgres-dsn", "garbage"), command[0])
    assert "PostgreSQL DSN" in line and "garbage" in line


def test_a_malformed_dsn_from_the_environment_too() -> None:
    line = _one_clear_line(_run("migrate", env=_env(POSTGRES__DSN="garbage")), "migrate")
    assert "PostgreSQL DSN" in line


def test_dev_on_an_address_of_another_machine_is_one_line_naming_it() -> None:
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: binding to it fails here, nothing is sent.
    result = _run("dev", "--data-dir", _data_dir(), "--host", "192.0.2.1", "--nats-port", "0", "--pg-port", "0")
    line = _one_clear_line(result, "dev")
    assert "'192.0.2.1'" in line and "--host" in line
    assert "nats-server" not in result.stdout  # refused before any server started


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_bad_sync_interval_is_refused_at_start_up_by_the_settings(how: str) -> None:
    args = ["dev", "--data-dir", _data_dir(), "--nats-port", "0", "--no-postgres"]
    if how == "flag":
        result = _run(*args, "--sync-interval", "soon")
    else:
        result = _run(*args, env=_env(NATS__SYNC_INTERVAL="soon"))
    line = _one_clear_line(result, "dev")
    assert "sync_interval" in line and "'soon'" in line and "BLACKBOARD_NATS__SYNC_INTERVAL" in line
    assert "nats-server" not in result.stdout  # not found in the server's log: before it starts


def test_a_bad_nats_url_scheme_is_one_line_naming_the_url() -> None:
    line = _one_clear_line(_run("setup", "--no-migrate", "--nats-url", "htp://127.0.0.1:4222"), "setup")
    assert "'htp://127.0.0.1:4222'" in line and "nats://" in line


def test_the_worker_module_refuses_invalid_settings_in_one_line() -> None:
    result = subprocess.run([sys.executable, "-m", "blackboard.worker"], capture_output=True, text=True,
                            timeout=60, env=_env(WORKER__GROUP="a.b"))
    line = _one_clear_line(result, "worker")
    assert "worker.group" in line


def test_the_worker_group_decides_the_consumers_and_the_name_is_a_label() -> None:
    assert WorkerSettings().group == WorkerSettings().name == "worker"
    settings = Settings(worker=WorkerSettings(name="alpha", group="ingest"))
    assert Subjects.worker_consumer(settings.worker.group, "entries") == "ingest-entries"


def test_blackboard_worker_logs_ready_at_the_default_level_and_workers_of_a_group_share_consumers(
        nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres, unique: str) -> None:
    names = ("alpha", "beta")
    # Its own database: these workers ingest every stream of the session's server from the
    # start, and the shared database's embedding queue is what other tests wait on.
    settings = make_settings(nats_server.url, fresh_db(postgres_server, f"cli{unique}"))
    # The worker's identity and the test CA, as a deployment gives them (docs/operations.md).
    env = _env(WORKER__EMBED="false", WORKER__SERVE_SEARCH="false", NATS__CREDS_FILE=str(settings.nats.creds_file),
               NATS__TLS_CA_FILE=str(settings.nats.tls_ca_file))
    procs: list[subprocess.Popen[str]] = []
    try:
        readies: list[str] = []
        for name in names:  # two names, one group: the same consumers
            proc = subprocess.Popen(
                [sys.executable, "-m", "blackboard", "worker", "--nats-url", settings.nats.url,
                 "--postgres-dsn", settings.postgres.dsn.get_secret_value(), "--name", name,
                 "--group", f"g{unique}"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            procs.append(proc)
            lines = read_until(proc, " ready", 60)
            assert lines and " ready" in lines[-1], "\n".join(lines)
            readies.append(lines[-1])
        for name, line in zip(names, readies, strict=True):
            assert f"worker {name} ready (group g{unique})" in line, line
            assert f"g{unique}-entries" in line and f"g{unique}-memories" in line, line
        procs[0].send_signal(signal.SIGTERM)
        lines = read_until(procs[0], "stopped", 30)
        assert procs[0].wait(30) == 0
        assert any(f"worker {names[0]} stopped" in line for line in lines), "\n".join(lines)
        assert not any("Traceback" in line for line in lines), "\n".join(lines)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


def test_help_tells_name_from_group() -> None:
    result = _run("worker", "--help")
    assert result.returncode == 0
    assert "--group" in result.stdout and "share the work" in result.stdout
