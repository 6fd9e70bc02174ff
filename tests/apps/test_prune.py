"""``blackboard prune`` and ``blackboard restore`` (docs/memory-lifecycle.md, "Pruning and
archive"), run in-process through ``main(argv)`` against a database of the test's own with a
worker storing one board's memories: each strategy's dry run lists what would go and changes
nothing, the prune archives exactly that (recall leaves it out), restore brings it back
(recall finds it again); a hard delete leaves no row and a replay of the stream does not bring
it back; recalls raise a memory's importance; the worker prunes on its schedule."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from agents_sdk import Agent
from blackboard.apps.cli import main
from blackboard.apps.prune import parse_duration
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.devstack import EmbeddedPostgres
from blackboard.protocol.errors import ConfigurationError
from blackboard.protocol.subjects import MEMORY_STREAM
from blackboard.settings import MemorySettings, Settings
from blackboard.worker import Worker
from blackboard.worker.decode import MemoryRow, RawMessage, decode_memory
from blackboard.worker.memories import write_memories
from tests._worker_helpers import (
    HashProvider,
    board_memories_handler,
    fresh_db,
    remember,
    rows,
    running_worker,
    wait_for,
)
from tests.conftest import make_settings

Run = tuple[int, str, str]
NOW = datetime.now(UTC)


@dataclass
class Stack:
    """The test's database, the worker storing its board, a NATS connection to write with."""

    settings: Settings
    board: str
    worker: Worker
    nc: NATS


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """``cli(*argv) -> (exit code, stdout, stderr)``: ``main(argv)`` with no BLACKBOARD_* setting of
    the environment (the tests give ``--postgres-dsn``)."""
    import os

    for name in list(os.environ):
        if name.startswith("BLACKBOARD_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)

    def run(*argv: str) -> Run:
        capsys.readouterr()
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    yield run


async def acli(cli: Any, stack: Stack, *argv: str) -> Run:
    """``cli`` on the stack's database, from an async test (``main`` runs its own loop: a thread)."""
    dsn = stack.settings.postgres.dsn.get_secret_value()
    args = [*argv, "--postgres-dsn", dsn]
    result: Run = await asyncio.to_thread(cli, *args)
    return result


@contextlib.asynccontextmanager
async def _stack(settings: Settings, board: str) -> AsyncIterator[Stack]:
    """A worker storing ``board``'s memories into ``settings``' database, serving search."""
    nc = await connect_nats(settings.nats, name=f"prune-{board}")
    await ensure_streams(nc.jetstream(), settings)
    try:
        async with running_worker(settings, name=f"w{board}", handlers=[board_memories_handler(settings, board)],
                                  provider=HashProvider(32, f"hash-{board}")) as w:
            yield Stack(settings, board, w, nc)
    finally:
        await nc.close()


@pytest_asyncio.fixture
async def stack(pg_settings: Settings, postgres_server: EmbeddedPostgres, unique: str) -> AsyncIterator[Stack]:
    settings = make_settings(pg_settings.nats.url, fresh_db(postgres_server, unique))
    async with _stack(settings, unique) as s:
        yield s


async def _write(stack: Stack, memories: dict[str, dict[str, Any]]) -> None:
    """Store memories (suffix -> record fields: text and any other) as their agent would, then
    wait until the worker stored them all."""
    for suffix, fields in memories.items():
        fields = dict(fields)
        text = fields.pop("text")
        if {"key", "occurred_at", "confidence"} & set(fields):
            fields["v"] = 2
        await remember(stack.nc.jetstream(), stack.board, "alice", f"{stack.board}-{suffix}", text, **fields)
    await stack.worker.wait_caught_up(60)


async def _recalled(stack: Stack, query: str) -> set[str]:
    """The suffixes of the memories a keyword recall of the board finds."""
    async with Agent.connect(f"{stack.board}-r", settings=stack.settings) as agent:
        hits = await agent.recall(query, mode="keyword", board=stack.board, top_k=50)
    return {h.id.removeprefix(f"{stack.board}-") for h in hits}


def _ids(out: str, stack: Stack) -> list[str]:
    return [json.loads(line)["id"].removeprefix(f"{stack.board}-") for line in out.splitlines() if line.strip()]


def _archived(stack: Stack) -> dict[str, str]:
    return {str(i).removeprefix(f"{stack.board}-"): str(r) for i, r in rows(
        stack.settings, "SELECT id, archive_reason FROM bb_memories WHERE board = %s AND archived_at IS NOT NULL",
        stack.board)}


OLD = NOW - timedelta(days=200)

#: Per strategy: the memories written (all say "falcon"), the threshold, and which go.
CASES: dict[str, tuple[dict[str, dict[str, Any]], str, set[str]]] = {
    "lru": ({"old": {"text": "the falcon nested in spring", "created_at": OLD},
             "new": {"text": "the falcon flew today"}}, "90d", {"old"}),
    "low_confidence": ({"shaky": {"text": "maybe a falcon on the roof", "confidence": 0.1},
                        "sure": {"text": "a falcon on the tower", "confidence": 0.95},
                        "unsaid": {"text": "a falcon somewhere"}}, "0.3", {"shaky"}),
    "old_age": ({"ancient": {"text": "a falcon bred here in 2020", "occurred_at": NOW - timedelta(days=2000)},
                 "recent": {"text": "a falcon bred here this year", "occurred_at": NOW - timedelta(days=10)}},
                "365d", {"ancient"}),
    "importance": ({"dull": {"text": "a falcon, once, long ago", "created_at": OLD, "importance": 0.0,
                             "confidence": 0.1},
                    "vital": {"text": "the falcon guards the nest", "importance": 1.0}}, "0.3", {"dull"}),
    "max_per_board": ({"low": {"text": "falcon low", "importance": 0.1},
                       "mid": {"text": "falcon mid", "importance": 0.5},
                       "high": {"text": "falcon high", "importance": 0.9}}, "2", {"low"}),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("strategy", list(CASES))
async def test_each_strategy_dry_run_then_archive_then_restore(cli: Any, stack: Stack, strategy: str) -> None:
    memories, threshold, going = CASES[strategy]
    await _write(stack, memories)
    everything = set(memories)
    # No recall before the prune: a recall is a use (it would make each memory recently used).
    argv = ("prune", "--strategy", strategy, "--threshold", threshold, "--board", stack.board)

    code, out, err = await acli(cli, stack, *argv, "--dry-run")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["ID", "BOARD", "SCORE"]
    assert len(lines) == 1 + len(going) + 1 and all(f"{stack.board}-{s}" in out for s in going)
    assert lines[-1].startswith(f"{len(going)} memor") and "would be archived" in lines[-1] and strategy in lines[-1]
    code, out, _ = await acli(cli, stack, *argv, "--dry-run", "--json")
    assert code == 0 and set(_ids(out, stack)) == going
    assert _archived(stack) == {}  # a dry run changes nothing

    code, out, err = await acli(cli, stack, *argv)
    assert code == 0, err
    assert out.strip().splitlines()[-1].startswith(f"{len(going)} memor") and " archived (" in out
    assert _archived(stack) == {s: strategy for s in going}
    assert await _recalled(stack, "falcon") == everything - going  # recall leaves archived memories out
    code, out, _ = await acli(cli, stack, *argv, "--dry-run", "--json")
    assert code == 0 and out == ""  # nothing left to prune

    code, out, err = await acli(cli, stack, "restore", *(f"{stack.board}-{s}" for s in going))
    assert code == 0, err
    assert out.splitlines() == [f"restored {stack.board}-{s}" for s in sorted(going)]
    assert _archived(stack) == {}
    assert await _recalled(stack, "falcon") == everything  # found again


@pytest.mark.asyncio
async def test_restore_tells_what_it_did_not_restore(cli: Any, stack: Stack) -> None:
    await _write(stack, {"a": {"text": "an owl", "confidence": 0.1}, "b": {"text": "a heron"}})
    assert (await acli(cli, stack, "prune", "--strategy", "low_confidence", "--board", stack.board))[0] == 0
    b = stack.board
    code, out, _ = await acli(cli, stack, "restore", f"{b}-a", f"{b}-b", f"{b}-nope")
    assert code == 3
    assert out.splitlines() == [f"restored {b}-a", f"not restored {b}-b: not archived",
                                f"not restored {b}-nope: not found"]
    assert (await acli(cli, stack, "prune", "--strategy", "low_confidence", "--board", b))[0] == 0
    code, out, _ = await acli(cli, stack, "restore", f"{b}-a", "--board", "elsewhere")
    assert code == 3 and out.strip() == f"not restored {b}-a: on board {b}, not elsewhere"


@pytest.mark.asyncio
async def test_a_new_version_of_a_pruned_memory_is_live_again(cli: Any, stack: Stack) -> None:
    """Its writer said it anew: the rewrite is recalled; the pruned version itself, published
    again (a redelivery, a replay), does not bring it back."""
    await _write(stack, {"a": {"text": "a shaky kestrel", "confidence": 0.1}, "b": {"text": "a shaky merlin",
                                                                                    "confidence": 0.1}})
    assert (await acli(cli, stack, "prune", "--strategy", "low_confidence", "--board", stack.board))[0] == 0
    assert _archived(stack) == {"a": "low_confidence", "b": "low_confidence"}
    # b's stored version written again by the worker's ingest (as after a redelivery or a replay)
    [(seq,)] = rows(stack.settings, "SELECT seq FROM bb_memories WHERE id = %s", f"{stack.board}-b")
    msg = await stack.nc.jetstream().get_msg(MEMORY_STREAM, int(seq))
    row = decode_memory(RawMessage(MEMORY_STREAM, int(seq), msg.subject, dict(msg.headers or {}), msg.data or b"",
                                   datetime.now(UTC)), max_bytes=10**6, index_chars=10**5)
    dsn = stack.settings.postgres.dsn.get_secret_value()
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        assert isinstance(row, MemoryRow)
        await write_memories(conn, [row])
        await conn.commit()
    await _write(stack, {"a": {"text": "a kestrel, seen clearly", "confidence": 0.9}})
    assert _archived(stack) == {"b": "low_confidence"}
    assert await _recalled(stack, "kestrel merlin") == {"a"}


@pytest.mark.asyncio
async def test_restore_leaves_merged_memories_merged(cli: Any, stack: Stack) -> None:
    b = stack.board
    await _write(stack, {"kept": {"text": "a swift"}, "twin": {"text": "a swift"}, "near": {"text": "a swift!"},
                         "llm": {"text": "swifts, merged"}})
    # "twin" is an exact duplicate (a source of "kept"); "near" as the consolidator archives a
    # near-duplicate, "llm" as it stores a derived merge whose sources changed meanwhile.
    rows(stack.settings, "UPDATE bb_memories SET archived_at = now(), archive_reason = 'merged', merged_into = %s "
                         "WHERE id = %s RETURNING 1", f"{b}-kept", f"{b}-near")
    rows(stack.settings, "UPDATE bb_memories SET archived_at = now(), archive_reason = 'conflict' "
                         "WHERE id = %s RETURNING 1", f"{b}-llm")
    code, out, _ = await acli(cli, stack, "restore", f"{b}-twin", f"{b}-near", f"{b}-llm")
    assert code == 3
    assert out.splitlines() == [
        f"not restored {b}-llm: a merge whose sources changed before it was stored (conflict)",
        f"not restored {b}-near: merged into {b}-kept", f"not restored {b}-twin: merged into {b}-kept"]
    assert set(_archived(stack)) == {"near", "llm"}


@pytest.mark.asyncio
async def test_limit_takes_the_least_worth_keeping_first(cli: Any, stack: Stack) -> None:
    await _write(stack, {f"m{i}": {"text": f"tern {i}", "confidence": c} for i, c in enumerate((0.2, 0.05, 0.1))})
    code, out, _ = await acli(cli, stack, "prune", "--strategy", "low_confidence", "--board", stack.board,
                              "--limit", "2", "--json")
    assert code == 0 and _ids(out, stack) == ["m1", "m2"]
    assert set(_archived(stack)) == {"m1", "m2"}


@pytest.mark.asyncio
async def test_hard_delete_leaves_nothing_and_a_replay_does_not_bring_it_back(
        cli: Any, stack: Stack, unique: str) -> None:
    # "twin" says what "gone" says: deduplicated at ingest, it is a source of "gone", not a row.
    await _write(stack, {"gone": {"text": "a kestrel, unsure", "confidence": 0.1},
                         "twin": {"text": "a kestrel, unsure", "confidence": 0.1},
                         "near": {"text": "a kestrel, not sure", "confidence": 0.8},
                         "kept": {"text": "a kestrel, sure", "confidence": 0.9}})
    await stack.worker.wait_caught_up(60, embedded=True)
    b = stack.board
    assert rows(stack.settings, "SELECT s.id FROM bb_memory_sources s JOIN bb_memories m ON m.mid = s.mid "
                                "WHERE m.id = %s", f"{b}-gone") == [(f"{b}-twin",)]
    # "near" as the consolidator leaves a near-duplicate merged into "gone" (archived, a source of it).
    rows(stack.settings, """
        WITH n AS (UPDATE bb_memories SET archived_at = now(), archive_reason = 'merged', merged_into = %s
                   WHERE id = %s RETURNING id, board, agent, stream, seq, created_at)
        INSERT INTO bb_memory_sources (id, mid, board, agent, stream, seq, created_at, how)
        SELECT n.id, k.mid, n.board, n.agent, n.stream, n.seq, n.created_at, 'near'
        FROM n, bb_memories k WHERE k.id = %s RETURNING 1""", f"{b}-gone", f"{b}-near", f"{b}-gone")
    code, out, err = await acli(cli, stack, "prune", "--strategy", "low_confidence", "--board", b, "--hard")
    assert code == 0, err
    assert out.strip().splitlines()[-1].startswith("1 memory deleted")
    assert rows(stack.settings, "SELECT id FROM bb_memories WHERE board = %s", b) == [(f"{b}-kept",)]
    assert rows(stack.settings, "SELECT count(*) FROM bb_memory_sources WHERE board = %s", b) == [(0,)]
    (space,) = rows(stack.settings, "SELECT id FROM bb_embedding_spaces")
    # The database is the test's: the one vector left is the kept memory's.
    assert rows(stack.settings, f"SELECT count(*) FROM bb_vec_{space[0]}_memories") == [(1,)]
    code, out, _ = await acli(cli, stack, "restore", f"{b}-gone")
    assert code == 3 and "not found" in out
    # Another worker group reads the whole stream again into the same database: none comes back.
    async with running_worker(stack.settings, name=f"replay{unique}",
                              handlers=[board_memories_handler(stack.settings, b)], embed=False,
                              serve_search=False) as again:
        await again.wait_caught_up(60)
    assert rows(stack.settings, "SELECT id FROM bb_memories WHERE board = %s", b) == [(f"{b}-kept",)]
    async with Agent.connect(f"{b}-r", settings=stack.settings) as agent:
        hits = await agent.recall("kestrel", mode="keyword", board=b, include_archived=True,
                                  include_superseded=True)
    assert [h.id for h in hits] == [f"{b}-kept"]


@pytest.mark.asyncio
async def test_recalls_raise_a_memorys_importance(cli: Any, stack: Stack) -> None:
    await _write(stack, {"used": {"text": "the osprey dives", "created_at": NOW - timedelta(days=30)},
                         "idle": {"text": "the sparrow sits", "created_at": NOW - timedelta(days=30)}})

    async def scores() -> dict[str, tuple[float, int]]:
        code, out, _ = await acli(cli, stack, "prune", "--strategy", "importance", "--threshold", "1",
                                  "--board", stack.board, "--dry-run", "--json")
        assert code == 0
        return {json.loads(line)["id"].removeprefix(f"{stack.board}-"):
                (json.loads(line)["importance_score"], json.loads(line)["hits"]) for line in out.splitlines()}

    before = await scores()
    assert before["used"] == pytest.approx(before["idle"]) and before["used"][1] == 0
    for _ in range(3):
        assert await _recalled(stack, "osprey") == {"used"}

    async def flushed() -> bool:
        return (await scores())["used"][1] == 3

    deadline = asyncio.get_running_loop().time() + 30
    while not await flushed():  # the search service writes hits every memory.access_flush_interval
        assert asyncio.get_running_loop().time() < deadline, "recall hits never written"
        await asyncio.sleep(0.2)
    after = await scores()
    assert after["used"][0] > before["used"][0] + 0.1  # used now (recency 1) and recalled 3 times
    assert after["idle"][0] == pytest.approx(before["idle"][0], abs=1e-3)
    # Ranked by importance, the idle one goes first.
    code, out, _ = await acli(cli, stack, "prune", "--strategy", "max_per_board", "--threshold", "1",
                              "--board", stack.board, "--dry-run", "--json")
    assert code == 0 and _ids(out, stack) == ["idle"]


@pytest.mark.asyncio
async def test_the_worker_prunes_on_its_schedule(pg_settings: Settings, postgres_server: EmbeddedPostgres,
                                                 unique: str) -> None:
    base = make_settings(pg_settings.nats.url, fresh_db(postgres_server, unique))
    settings = base.model_copy(update={"memory": MemorySettings(prune_interval=0.2,
                                                                prune_strategies=["low_confidence"])})
    async with _stack(settings, unique) as stack:
        await _write(stack, {"weak": {"text": "a wren, perhaps", "confidence": 0.05},
                             "strong": {"text": "a wren, surely", "confidence": 0.99}})
        await wait_for(lambda: _archived(stack) == {"weak": "low_confidence"}, 30, "the scheduled prune")
        assert await _recalled(stack, "wren") == {"strong"}


def test_bad_input_is_one_line_and_exit_2(cli: Any) -> None:
    for argv, says in [(("--strategy", "lru", "--threshold", "soon"), "not a duration"),
                       (("--strategy", "importance", "--threshold", "2"), "within 0..1"),
                       (("--strategy", "max_per_board", "--threshold", "x"), "whole number"),
                       (("--strategy", "max_per_board"), "no bound"),
                       (("--strategy", "lru", "--dry-run", "--hard"), "--hard"),
                       (("--strategy", "lru", "--limit", "0"), "--limit")]:
        code, out, err = cli("prune", *argv, "--postgres-dsn", "postgresql://127.0.0.1:1/none")
        assert code == 2, (argv, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("blackboard prune: error: ") and says in lines[0], err


def test_durations() -> None:
    assert parse_duration("90d") == 90 * 86400
    assert parse_duration("12h") == 12 * 3600
    assert parse_duration("1.5m") == 90
    assert parse_duration("2w") == 14 * 86400
    assert parse_duration("45") == 45
    with pytest.raises(ConfigurationError):
        parse_duration("-3d")
