"""Logs (docs/observability.md, "Logs"): one line per lifecycle event at the default level,
INFO; ``json`` writes one JSON object a line; progress bars only on a terminal."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from blackboard.devstack import EmbeddedNats, EmbeddedPostgres
from blackboard.observability import JsonFormatter, configure_logging, progress_enabled
from blackboard.protocol.subjects import Subjects
from blackboard.settings import ObservabilitySettings, Settings
from tests._worker_helpers import (
    StartWorker,
    drop_db,
    fresh_db,
    publish_signed,
    read_until,
    remember,
    worker_settings,
)
from tests.conftest import make_settings
from tests.observability._probe import bus, gated_memories, until


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Put the root logger's handlers and level back after a test that configures logging."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)


def test_the_default_level_is_info_and_text_is_one_line_an_event(root_logging: None) -> None:
    out = io.StringIO()
    assert ObservabilitySettings().log_level == "INFO" and ObservabilitySettings().log_format == "text"
    configure_logging(ObservabilitySettings(), stream=out)
    logging.getLogger("blackboard.test").debug("not shown")
    logging.getLogger("blackboard.test").info("worker %s ready", "w1")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].endswith(" INFO blackboard.test: worker w1 ready"), lines


def test_json_lines_carry_the_fields_extras_and_tracebacks(root_logging: None) -> None:
    out = io.StringIO()
    configure_logging(ObservabilitySettings(log_format="json", log_level="WARNING"), stream=out)
    log = logging.getLogger("blackboard.test")
    log.info("below the level")
    log.warning("dead letter: %s", "not valid msgpack", extra={"stream": "BB_MEMORY", "seq": 7})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("crashed")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["level"] == "WARNING" and first["logger"] == "blackboard.test"
    assert first["message"] == "dead letter: not valid msgpack"
    assert first["stream"] == "BB_MEMORY" and first["seq"] == 7 and first["ts"].endswith("+00:00")
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exc"]


def test_an_embedding_applications_logging_is_left_alone(root_logging: None) -> None:
    root = logging.getLogger()
    mine = logging.StreamHandler(io.StringIO())
    root.addHandler(mine)
    assert configure_logging(ObservabilitySettings(), force=False) is None
    assert mine in root.handlers
    assert configure_logging(ObservabilitySettings(), force=True) is not None
    assert mine not in root.handlers


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bars_only_on_a_terminal() -> None:
    assert progress_enabled("auto", _Terminal()) is True
    assert progress_enabled("auto", io.StringIO()) is False  # a log file, a pipe
    assert progress_enabled("always", io.StringIO()) is True
    assert progress_enabled("never", _Terminal()) is False


@pytest.mark.asyncio
async def test_the_worker_logs_its_lifecycle_at_the_default_level(
        pg_settings: Settings, start_worker: StartWorker, unique: str, root_logging: None) -> None:
    out = io.StringIO()
    configure_logging(ObservabilitySettings(log_format="json"), stream=out)
    gate = asyncio.Event()
    s = worker_settings(pg_settings, name=f"w{unique}", embed=False, serve_search=False, lag_interval=0.1)
    worker = await start_worker(s, handlers=[gated_memories(s, unique, gate)])
    assert worker.http is not None

    def messages() -> list[str]:
        return [json.loads(line)["message"] for line in out.getvalue().splitlines()]

    nc = await bus(s)
    try:
        for i in range(3):
            await remember(nc.jetstream(), unique, "alice", f"{unique}-{i}", f"memory {i}")
        await publish_signed(nc.jetstream(), "alice", Subjects.memory(unique, "alice"), b"\xc1 poison")

        async def behind() -> bool:
            return any(m.startswith("lag: BB_MEMORY: ") for m in messages())

        await until(behind, 20, "a lag line while behind")
        gate.set()

        async def caught_up() -> bool:
            return any(m.startswith("lag caught up: BB_MEMORY: 0 pending, 0 in flight") for m in messages())

        await until(caught_up, 30, "the 'lag caught up' line")
    finally:
        gate.set()
        await nc.close()
    lines = messages()
    name = f"w{unique}"
    assert any(m.startswith(f"worker {name}: connected to NATS at 127.0.0.1:") for m in lines), lines
    assert f"worker {name}: connected to PostgreSQL" in lines
    ready = next(m for m in lines if m.startswith(f"worker {name} ready (group {name}): consumers "))
    assert ready.endswith(f"; metrics and health on {worker.http.url}")
    assert any(m.startswith(f"{name}-memories: 1 message(s) dead-lettered, e.g. seq ") for m in lines), lines


def test_blackboard_worker_writes_json_lines_when_asked(nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres,
                                                         unique: str) -> None:
    db = fresh_db(postgres_server, f"obs{unique}")
    settings = make_settings(nats_server.url, db)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")}
    env |= {"BLACKBOARD_OBSERVABILITY__LOG_FORMAT": "json", "BLACKBOARD_OBSERVABILITY__HTTP_PORT": "0",
            "BLACKBOARD_WORKER__EMBED": "false", "BLACKBOARD_WORKER__SERVE_SEARCH": "false",
            "BLACKBOARD_NATS__CREDS_FILE": str(settings.nats.creds_file),
            "BLACKBOARD_NATS__TLS_CA_FILE": str(settings.nats.tls_ca_file)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "blackboard", "worker", "--nats-url", settings.nats.url,
         "--postgres-dsn", settings.postgres.dsn.get_secret_value(), "--name", f"w{unique}",
         "--group", f"w{unique}"],  # consumers of its own
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = read_until(proc, " ready (group ", 60)
    finally:
        proc.terminate()
        proc.wait(30)
        assert proc.stderr is not None
        proc.stderr.close()
        drop_db(postgres_server, f"obs{unique}")
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert records and all({"ts", "level", "logger", "message"} <= set(r) for r in records)
    ready = records[-1]
    assert ready["level"] == "INFO" and ready["logger"] == "blackboard.worker"
    assert ready["message"].startswith(f"worker w{unique} ready (group w{unique})")
    assert "; metrics and health on http://127.0.0.1:" in ready["message"]


def test_json_formatter_is_public() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello %s", ("you",), None)
    assert json.loads(JsonFormatter().format(record))["message"] == "hello you"
