"""``blackboard remember``: a long-term memory written from the command line, with its subject
key, event time and confidence; bad input is one line and exit 2, nothing written."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from blackboard.protocol.schemas import MemoryRecord, validate_wire
from blackboard.settings import Settings
from tests._worker_helpers import HashProvider, StartWorker
from tests.apps import test_cli_people as _people
from tests.apps.test_cli_people import acli, json_lines, one_error
from tests.conftest import stored_memories

# the command line's fixtures (its environment, main() in this process)
env = _people.env
cli = _people.cli


async def _stored(env: dict[str, str], board: str) -> dict[str, MemoryRecord]:
    return {r["id"]: validate_wire(MemoryRecord, r, strict=True)
            for r in await stored_memories(env["BLACKBOARD_NATS__URL"], board)}


@pytest.mark.asyncio
async def test_remember_writes_a_memory_with_its_lifecycle_fields(cli: Any, env: dict[str, str], unique: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = await acli(cli, "remember", "SKU-1 costs 12 EUR", "--board", unique, "--kind", "semantic",
                                "--tag", "price", "--metadata", '{"shop": "example"}', "--importance", "0.8",
                                "--key", "price:sku-1", "--occurred-at", "2026-01-31T12:00:00+01:00",
                                "--confidence", "0.9", "--as", "alice", "--json")
    assert code == 0, err
    written = json.loads(out)
    assert written["board"] == unique
    code, out, err = await acli(cli, "remember", "a plain note", "--board", unique, "--id", f"{unique}-n",
                                "--as", "alice")
    assert code == 0, err
    assert out.strip() == f"remembered {unique}-n on board {unique}"
    monkeypatch.setattr("sys.stdin", io.StringIO("read from stdin\n"))
    code, out, err = await acli(cli, "remember", "-", "--board", unique, "--as", "alice", "--json")
    assert code == 0, err
    piped = json.loads(out)["id"]

    stored = await _stored(env, unique)
    rec = stored[written["id"]]
    assert (rec.v, rec.agent, rec.kind, rec.text, rec.tags, rec.metadata, rec.importance) == (
        2, "alice", "semantic", "SKU-1 costs 12 EUR", ["price"], {"shop": "example"}, 0.8)
    assert (rec.key, rec.occurred_at, rec.confidence) == ("price:sku-1", datetime(2026, 1, 31, 11, tzinfo=UTC), 0.9)
    plain = stored[f"{unique}-n"]
    assert (plain.v, plain.key, plain.occurred_at, plain.confidence, plain.kind) == (1, None, None, None, "episodic")
    assert stored[piped].text == "read from stdin"


@pytest.mark.asyncio
async def test_remember_refuses_bad_input_with_exit_2(cli: Any, env: dict[str, str], unique: str) -> None:
    for flags, told in ((["--occurred-at", "2026-01-31T12:00:00"], "offset"), (["--occurred-at", "soon"], "ISO"),
                        (["--confidence", "1.5"], "confidence"), (["--key", "a\tb"], "key"),
                        (["--metadata", "[1]"], "--metadata"), (["--importance", "2"], "importance")):
        line = one_error(await acli(cli, "remember", "x", "--board", unique, "--as", "alice", *flags), "remember", 2)
        assert told in line, line
    assert await _stored(env, unique) == {}


@pytest.mark.asyncio
async def test_remember_wait_returns_once_recall_finds_it(cli: Any, unique: str, pg_settings: Settings,
                                                           start_worker: StartWorker) -> None:
    await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider(32, f"h-{unique}"),
                       query_provider=HashProvider(32, f"h-{unique}"))
    code, out, err = await acli(cli, "remember", f"the {unique} heron waits by the river", "--board", unique,
                                "--wait", "--timeout", "30", "--as", "alice", "--json")
    assert code == 0, err
    mid = json.loads(out)["id"]
    code, out, err = await acli(cli, "recall", "heron waits river", "--board", unique, "--mode", "semantic",
                                "--as", "bob", "--json")
    assert code == 0, err
    assert mid in [h["id"] for h in json_lines(out)]
