"""remember(key=, occurred_at=, confidence=): a version-2 record, stored with its subject key,
event and valid time, confidence and content hash; a memory without them stays version 1."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from agents_sdk import Agent, MemoryInput
from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.schemas import MemoryRecord, validate_wire
from blackboard.settings import Settings
from blackboard.worker.dedup import content_hash
from tests._worker_helpers import StartWorker, board_memories_handler
from tests.conftest import stored_memories

pytestmark = pytest.mark.asyncio

_COLUMNS = "subject_key, occurred_at, valid_from, confidence, content_hash, last_seen, created_at, updated_at, seq, text"


async def _rows(settings: Settings, board: str, count: int, timeout: float = 30) -> dict[str, dict[str, Any]]:
    """The board's memory rows by id, once the worker has stored ``count`` of them."""
    deadline = time.monotonic() + timeout
    dsn = settings.postgres.dsn.get_secret_value()
    while True:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            cur = await conn.execute(f"SELECT id, {_COLUMNS} FROM bb_memories WHERE board = %s", (board,))
            names = [d.name for d in cur.description or ()]
            rows = {r[0]: dict(zip(names, r, strict=True)) for r in await cur.fetchall()}
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.05)


async def test_remember_with_key_event_time_and_confidence_is_stored_with_them(
        pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    await start_worker(pg_settings, name=f"w{unique}", embed=False, serve_search=False,
                       handlers=[board_memories_handler(pg_settings, unique)])
    when = datetime(2025, 6, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    async with Agent.connect(f"{unique}-a", settings=pg_settings) as agent:
        v2 = await agent.remember("The price of SKU-1 is  12 EUR", board=unique, key="price:shop:sku-1",
                                  occurred_at=when, confidence=0.8)
        plain = await agent.remember("a plain memory", board=unique)
        [many] = await agent.remember_many([MemoryInput("from a batch", board=unique, key="k2", confidence=1)])
        other = await agent.board(unique).remember("through the board", occurred_at=when)
        stored = {r["id"]: r for r in await stored_memories(pg_settings.nats.url, unique)}
        rows = await _rows(pg_settings, unique, 4)
    # on the wire: version 2 only with a version-2 field, and only the fields set
    assert stored[v2]["v"] == 2 and stored[v2]["key"] == "price:shop:sku-1" and stored[v2]["confidence"] == 0.8
    assert validate_wire(MemoryRecord, stored[v2], strict=True).occurred_at == when
    assert stored[plain]["v"] == 1 and not {"key", "occurred_at", "confidence", "provenance"} & set(stored[plain])
    assert stored[other]["v"] == 2 and "key" not in stored[other] and "confidence" not in stored[other]
    # in PostgreSQL: the key, event time, valid time (event time, else write time), confidence, hash
    r = rows[v2]
    assert (r["subject_key"], r["occurred_at"], r["valid_from"]) == ("price:shop:sku-1", when, when)
    assert r["confidence"] == pytest.approx(0.8)
    assert bytes(r["content_hash"]) == content_hash("the price of sku-1 is 12 eur")
    assert r["last_seen"] == r["created_at"]
    p = rows[plain]
    assert (p["subject_key"], p["occurred_at"], p["confidence"]) == (None, None, None)
    assert p["valid_from"] == p["created_at"] and bytes(p["content_hash"]) == content_hash("A plain memory")
    assert (rows[many]["subject_key"], rows[many]["confidence"]) == ("k2", 1.0)
    assert rows[other]["valid_from"] == when and rows[other]["subject_key"] is None


async def test_a_new_version_under_the_same_id_updates_the_lifecycle_columns(
        pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    await start_worker(pg_settings, name=f"w{unique}", embed=False, serve_search=False,
                       handlers=[board_memories_handler(pg_settings, unique)])
    when = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    async with Agent.connect(f"{unique}-a", settings=pg_settings) as agent:
        mid = await agent.remember("first", board=unique, key="k", occurred_at=when, confidence=0.2)
        first = (await _rows(pg_settings, unique, 1))[mid]
        await agent.remember("second", board=unique, id=mid)
        deadline = time.monotonic() + 30
        row = first
        while row["seq"] == first["seq"] and time.monotonic() < deadline:
            row = (await _rows(pg_settings, unique, 1))[mid]
    assert (first["subject_key"], first["valid_from"], first["confidence"]) == ("k", when, pytest.approx(0.2))
    assert row["seq"] > first["seq"] and row["text"] == "second"
    assert (row["subject_key"], row["occurred_at"], row["confidence"]) == (None, None, None)
    # the new version is valid from its own write time (created_at stays the first version's)
    assert row["valid_from"] == row["updated_at"] == row["last_seen"] > first["valid_from"]
    assert bytes(row["content_hash"]) == content_hash("second")


async def test_remember_refuses_bad_lifecycle_fields(pg_settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=pg_settings) as agent:
        for bad in ({"key": ""}, {"key": "x" * 257}, {"key": "two\nlines"}, {"confidence": 1.5},
                    {"confidence": -0.1}, {"occurred_at": datetime(2025, 1, 1)}):  # naive: no offset
            with pytest.raises(InvalidPayloadError):
                await agent.remember("x", board=unique, **bad)
        assert await stored_memories(pg_settings.nats.url, unique) == []
