"""The command line: `blackboard dev` end to end, restarts on the same data, clear start-up errors."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from agents_sdk import Agent
from tests.conftest import make_settings

pytestmark = pytest.mark.slow

_READY = "worker        running"


def _start_dev(data_dir: Path, *extra: str) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "blackboard", "dev", "--data-dir", str(data_dir), "--nats-port", "0",
         "--pg-port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "BLACKBOARD_EMBEDDING__PROVIDER": "local"},
    )
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip())
        if _READY in line or "error" in line.lower():
            break
    return proc, lines


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    return out


def _urls(lines: list[str]) -> tuple[str, str]:
    text = "\n".join(lines)
    nats_url = re.search(r"BLACKBOARD_NATS__URL=(\S+)", text)
    dsn = re.search(r"BLACKBOARD_POSTGRES__DSN=(\S+)", text)
    assert nats_url and dsn, text
    return nats_url.group(1), dsn.group(1)


def _data_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="bb-cli-"))
    os.chmod(path, 0o755)
    return path


@pytest.mark.asyncio
async def test_dev_runs_the_stack_persists_and_restarts_on_the_same_data() -> None:
    data_dir = _data_dir()
    proc, lines = _start_dev(data_dir)
    try:
        assert any(_READY in line for line in lines), "\n".join(lines)
        nats_url, dsn = _urls(lines)
        async with Agent.connect("cli-test", settings=make_settings(nats_url)) as agent:
            rev = await agent.board("cli").put("s", "k", "persist me")
        for _ in range(100):
            with psycopg.connect(dsn) as conn:
                row = conn.execute("SELECT count(*) FROM bb_entry_revisions WHERE board = 'cli'").fetchone()
            if row and row[0] == 1:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the dev worker did not persist the entry")
    finally:
        out = _stop(proc)
    assert proc.returncode == 0, out
    assert "stopped" in out

    proc, lines = _start_dev(data_dir)  # second start reuses the data
    try:
        assert any(_READY in line for line in lines), "\n".join(lines)
        nats_url, _ = _urls(lines)
        async with Agent.connect("cli-test", settings=make_settings(nats_url)) as agent:
            entry = await agent.board("cli").get("s", "k")
        assert (entry.value, entry.revision) == ("persist me", rev)
    finally:
        out = _stop(proc)
    assert proc.returncode == 0, "\n".join(lines) + "\n" + out


def test_dev_stops_cleanly_on_ctrl_c_right_after_the_ready_line() -> None:
    # The handler is in place before the line is printed: a Ctrl-C the moment a script
    # sees it shuts down in order (exit 0), not through Python's KeyboardInterrupt (130).
    proc, lines = _start_dev(_data_dir())
    out = _stop(proc)
    assert any(_READY in line for line in lines), "\n".join(lines) + "\n" + out
    assert proc.returncode == 0, "\n".join(lines) + "\n" + out
    assert "shutting down" in out and "stopped" in out


def test_taken_port_is_a_one_line_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "blackboard", "dev", "--data-dir", str(_data_dir()), "--nats-port", str(port)],
            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert f"port {port}" in result.stderr and "taken" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_help_explains_the_commands() -> None:
    result = subprocess.run([sys.executable, "-m", "blackboard", "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    for command in ("dev", "worker", "migrate", "setup", "reindex", "ingest"):
        assert command in result.stdout
