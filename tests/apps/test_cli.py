"""The command line: `blackboard dev` end to end, restarts on the same data, clear start-up errors.

The dev stack runs with authorization and TLS, and these tests use it the way a
user does: with the identities it issues itself into ``<data dir>/auth/creds``
(found by the SDK from the project directory, or through the printed
``BLACKBOARD_NATS__CREDENTIALS_DIR``), never with the test suite's authority.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import psycopg
import pytest

from agents_sdk import Agent, ConflictError
from blackboard.apps.cli import _dev_identities
from blackboard.protocol.errors import AuthenticationError
from blackboard.security.tls import client_context
from blackboard.settings import DevSettings, NatsSettings, SecuritySettings, Settings

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
_READY = "worker        running"
_UP = "Press Ctrl-C to stop."  # the last line when no worker runs (--no-postgres)


def _env() -> dict[str, str]:
    """A user's shell: no BLACKBOARD_* setting of the test run (the offline embedding model)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")}
    return env | {"BLACKBOARD_EMBEDDING__PROVIDER": "local"}


def _start_dev(data_dir: Path, *extra: str, ready: str = _READY) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "blackboard", "dev", "--data-dir", str(data_dir), "--nats-port", "0",
         "--pg-port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
    )
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip())
        if ready in line or "error" in line.lower():
            break
    return proc, lines


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    return out


def _printed(lines: list[str], variable: str) -> str:
    """The value of an ``export VARIABLE=...`` line of the start-up text."""
    text = "\n".join(lines)
    found = re.search(rf"export {variable}=(\S+)", text)
    assert found, f"no {variable} in:\n{text}"
    return found.group(1)


_PROJECTS: list[Path] = []


@pytest.fixture(autouse=True)
def _remove_projects() -> Iterator[None]:
    """Each test's project directories (a PostgreSQL cluster each) are removed after it."""
    yield
    while _PROJECTS:
        shutil.rmtree(_PROJECTS.pop(), ignore_errors=True)


def _project() -> Path:
    """A fresh project directory (mode 755: the embedded PostgreSQL may run as another user);
    ``blackboard dev`` keeps its data in ``<project>/.blackboard``, the default."""
    path = Path(tempfile.mkdtemp(prefix="bb-cli-"))
    os.chmod(path, 0o755)
    _PROJECTS.append(path)
    return path


def _data_dir() -> Path:
    return _project() / ".blackboard"


def _user(url: str, *, data_dir: Path | None = None, credentials_dir: Path | None = None,
          open_bus: bool = False) -> Settings:
    """A user's settings: the printed URL and where the dev stack's credentials are (its data
    dir, or the credentials directory it printed); nothing of the test suite's authority."""
    nowhere = Path(tempfile.gettempdir()) / "bb-cli-no-data-dir"
    return Settings().model_copy(update={
        "nats": NatsSettings(url=url, credentials_dir=credentials_dir, insecure_open_bus=open_bus),
        "dev": DevSettings(data_dir=data_dir or nowhere),
        "security": SecuritySettings(),
    })


def _quick_start(port: str) -> str:
    """The README quick start's Python snippet, for the dev stack on ``port``."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"## Quick start.*?```python\n(.*?)```", readme, re.DOTALL)
    assert found, "README.md has no Quick start snippet"
    snippet = found.group(1)
    assert 'nats_url="nats://127.0.0.1:4222"' in snippet and 'Agent.connect("planner"' in snippet
    return snippet.replace("127.0.0.1:4222", f"127.0.0.1:{port}")


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


async def _raw_connect_without_credential(url: str, ca: Path) -> None:
    nc = await nats.connect(url, tls=client_context(ca), allow_reconnect=False, connect_timeout=2,
                            max_reconnect_attempts=0)
    await nc.close()


@pytest.mark.asyncio
async def test_dev_runs_the_stack_with_authorization_persists_and_restarts_on_the_same_data() -> None:
    data_dir = _data_dir()
    project = data_dir.parent
    creds = data_dir / "auth" / "creds"
    proc, lines = _start_dev(data_dir, "--agent", "cli-test")
    try:
        text = "\n".join(lines)
        assert any(_READY in line for line in lines), text
        nats_url = _printed(lines, "BLACKBOARD_NATS__URL")
        dsn = _printed(lines, "BLACKBOARD_POSTGRES__DSN")
        # What it says: authorization and TLS, the identities it issued and where.
        assert nats_url.startswith("tls://"), text
        assert "authorization on, TLS" in text and "NO AUTHORIZATION" not in text
        identities = next(line for line in lines if line.lstrip().startswith("identities"))
        for principal in ("planner", "cli-test", "worker", "operator"):
            assert principal in identities
        # ... and published their certificates to the key registry (the operator's own connection did its)
        registry = next(line for line in lines if line.lstrip().startswith("key registry"))
        for principal in ("planner", "cli-test", "worker", "operator"):
            assert principal in registry, registry
        assert Path(_printed(lines, "BLACKBOARD_NATS__CREDENTIALS_DIR")) == creds.resolve()
        assert {"planner.creds", "cli-test.creds", "worker.creds", "operator.creds", "ca.pem"} <= set(_files(creds))
        assert re.fullmatch(r"postgresql://blackboard:[^@\s]+@[^/\s]+/blackboard", dsn), dsn  # the app role's password
        port = nats_url.rsplit(":", 1)[1]

        # The README quick start, as written (nats:// URL, no setting), from the project directory.
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-c", _quick_start(port)], cwd=project, env=_env(),
            capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        # (the value comes back in canonical map order: its keys sorted, docs/protocol.md §13)
        assert "put t1 {'state': 'taken', 'title': 'write docs'}" in done.stdout, done.stdout + done.stderr
        assert "retry from revision" not in done.stdout

        # planner, found in the data dir; a compare-and-set on a stale revision is refused.
        async with Agent.connect("planner", settings=_user(nats_url, data_dir=data_dir)) as agent:
            board = agent.board("cli")
            first = await board.put("s", "k", "draft")
            rev = await board.update("s", "k", "persist me", expected_revision=first)
            with pytest.raises(ConflictError) as conflict:
                await board.update("s", "k", "stale", expected_revision=first)
            assert conflict.value.current_revision == rev
        # The --agent one, through the printed credentials directory (no authority on its host).
        async with Agent.connect("cli-test", settings=_user(nats_url, credentials_dir=creds)) as agent:
            assert (await agent.board("cli").get("s", "k")).value == "persist me"
        # An id it issued nothing for has no credential there.
        with pytest.raises(AuthenticationError, match="no credential for 'stranger'"):
            async with Agent.connect("stranger", settings=_user(nats_url, credentials_dir=creds)):
                pass
        # Whoever reaches the port without a credential is refused by the server.
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await _raw_connect_without_credential(nats_url, creds / "ca.pem")

        for _ in range(100):
            with psycopg.connect(dsn) as conn:
                row = conn.execute("SELECT count(*) FROM bb_entry_revisions WHERE board = 'cli'").fetchone()
            if row and row[0] == 2:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the dev worker did not persist the entry")
        keys, issued = _files(data_dir / "auth" / "keys"), _files(creds)
    finally:
        out = _stop(proc)
    assert proc.returncode == 0, out
    assert "stopped" in out

    proc, lines = _start_dev(data_dir)  # second start reuses the data, the keys and the credentials
    try:
        assert any(_READY in line for line in lines), "\n".join(lines)
        nats_url = _printed(lines, "BLACKBOARD_NATS__URL")
        assert "cli-test" in next(line for line in lines if line.lstrip().startswith("identities"))
        assert "certificates published: none" in next(line for line in lines
                                                      if line.lstrip().startswith("key registry"))
        assert _files(data_dir / "auth" / "keys") == keys
        assert _files(creds) == issued
        async with Agent.connect("cli-test", settings=_user(nats_url, credentials_dir=creds)) as agent:
            entry = await agent.board("cli").get("s", "k")
        assert (entry.value, entry.revision) == ("persist me", rev)
        async with Agent.connect("planner", settings=_user(nats_url, data_dir=data_dir)) as agent:
            assert (await agent.board("cli").get("s", "k")).revision == rev
    finally:
        out = _stop(proc)
    assert proc.returncode == 0, "\n".join(lines) + "\n" + out


@pytest.mark.asyncio
async def test_dev_insecure_open_bus_says_so_loudly_and_needs_no_credential() -> None:
    data_dir = _data_dir()
    proc, lines = _start_dev(data_dir, "--insecure-open-bus", "--no-postgres", ready=_UP)
    try:
        text = "\n".join(lines)
        assert any(_UP in line for line in lines), text
        assert "INSECURE OPEN BUS" in text and "NO AUTHORIZATION, NO TLS" in text
        nats_url = _printed(lines, "BLACKBOARD_NATS__URL")
        assert nats_url.startswith("nats://")
        assert _printed(lines, "BLACKBOARD_NATS__INSECURE_OPEN_BUS") == "true"
        assert "BLACKBOARD_NATS__CREDENTIALS_DIR" not in text
        assert not (data_dir / "auth").exists()  # no identities made
        # Without the opt-in the SDK refuses to go without a credential...
        with pytest.raises(AuthenticationError, match="no credential for 'planner'"):
            async with Agent.connect("planner", settings=_user(nats_url)):
                pass
        # ...with it, any id connects, no credential needed.
        async with Agent.connect("anyone", settings=_user(nats_url, open_bus=True)) as agent:
            rev = await agent.board("open").put("s", "k", "v")
            assert (await agent.board("open").get("s", "k")).revision == rev
    finally:
        out = _stop(proc)
    assert proc.returncode == 0, "\n".join(lines) + "\n" + out


def test_dev_issues_every_agent_named_with_agent_even_one_a_glob_declares() -> None:
    # team-* (the example team) declares team-x-planner already: not appended, issued all the same.
    data_dir = _data_dir()
    made = _dev_identities(Settings(), data_dir, "127.0.0.1", ["team-x-planner", "cli-a", "cli-a"])
    assert sorted(made.issued) == ["cli-a", "ingest", "operator", "planner", "team-x-planner", "worker"]
    for principal in made.issued:
        assert (made.creds_dir / f"{principal}.creds").is_file()
    assert (made.creds_dir / "ca.pem").read_bytes() == made.tls.ca.read_bytes()
    policy = made.policy.read_text(encoding="utf-8")
    assert "[agents.cli-a]" in policy and policy.count("cli-a") == 1 and "team-x-planner" not in policy


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
            capture_output=True, text=True, timeout=60, env=_env())
    assert result.returncode == 1
    assert f"port {port}" in result.stderr and "taken" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_help_explains_the_commands() -> None:
    result = subprocess.run([sys.executable, "-m", "blackboard", "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    for command in ("dev", "worker", "migrate", "setup", "reindex", "ingest", "auth", "prune", "restore"):
        assert command in result.stdout
