"""``blackboard recall``'s lifecycle flags (--include-superseded, --as-of, --min-confidence, ...)
reach the search; a time without an offset is exit 2 (docs/cli.md)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agents_sdk import Agent
from blackboard.settings import Settings
from tests._worker_helpers import HashProvider, StartWorker, board_memories_handler
from tests.apps import test_cli_people as people
from tests.apps.test_cli_people import acli, json_lines, one_error

# The fixtures of the people commands' tests, for this module.
agent_settings, cli, env = people.agent_settings, people.cli, people.env


@pytest.mark.asyncio
async def test_recall_takes_the_lifecycle_flags(cli: object, unique: str, pg_settings: Settings,
                                                agent_settings: Settings, start_worker: StartWorker) -> None:
    worker = await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider(),
                                handlers=[board_memories_handler(pg_settings, unique)])
    key = "price:sku-1"
    async with Agent.connect("alice", settings=agent_settings) as alice:
        ten = await alice.remember("sku one costs ten euros", kind="semantic", board=unique, key=key,
                                   occurred_at=datetime(2025, 2, 1, tzinfo=UTC), confidence=0.9)
        twelve = await alice.remember("sku one costs twelve euros", kind="semantic", board=unique, key=key,
                                      occurred_at=datetime(2025, 3, 1, tzinfo=UTC), confidence=0.4)
        await alice.wait_searchable([ten, twelve], board=unique)
    await worker.wait_caught_up(60, embedded=True)

    async def ids(*flags: str) -> list[str]:
        code, out, err = await acli(cli, "recall", "sku costs euros", "--board", unique, "--mode", "keyword",
                                    "--as", "bob", "--json", *flags)
        assert code == 0, err
        return sorted(h["id"] for h in json_lines(out))

    assert await ids() == [twelve]
    assert await ids("--include-superseded") == sorted([ten, twelve])
    assert await ids("--as-of", "2025-02-15T00:00:00Z") == [ten]
    assert await ids("--occurred-before", "2025-02-15T00:00:00+00:00", "--include-superseded") == [ten]
    assert await ids("--min-confidence", "0.5", "--include-superseded") == [ten]
    assert await ids("--known-at", "2000-01-01T00:00:00Z") == []
    line = one_error(await acli(cli, "recall", "x", "--as-of", "2025-02-15T00:00:00", "--as", "bob"), "recall", 2)
    assert "--as-of" in line
