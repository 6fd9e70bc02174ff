"""agent.remember: memories are durably in JetStream (the worker persists them later)."""

from __future__ import annotations

import pytest

from agents_sdk import Agent
from agents_sdk.memory.longterm import MemoryInput
from blackboard.protocol.errors import InvalidKeyError, InvalidPayloadError, PayloadTooLargeError
from blackboard.protocol.schemas import MemoryRecord, validate_wire
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings
from tests.conftest import stored_memories

pytestmark = pytest.mark.asyncio


async def _stored(settings: Settings, board: str) -> list[MemoryRecord]:
    """The board's memory records as the stream holds them (read as the operator: no agent may)."""
    return [validate_wire(MemoryRecord, raw, strict=True) for raw in await stored_memories(settings.nats.url, board)]


async def test_remember_publishes_a_valid_record_once(settings: Settings, unique: str) -> None:
    async with Agent.connect("rememberer", settings=settings) as agent:
        mid = await agent.remember("the build is green", kind="semantic", tags=["ci"],
                                   metadata={"run": 7}, importance=0.9, board=unique)
        again = await agent.remember("the build is green", kind="semantic", board=unique, id=mid)
        records = await _stored(settings, unique)
    assert again == mid
    assert len(records) == 1  # same id: deduplicated by JetStream
    rec = records[0]
    assert (rec.id, rec.agent, rec.board, rec.kind, rec.text) == (mid, "rememberer", unique, "semantic",
                                                                   "the build is green")
    assert rec.tags == ["ci"] and rec.metadata == {"run": 7} and rec.importance == 0.9
    assert Subjects.memory(unique, "rememberer") == f"bb.mem.{unique}.rememberer"


async def test_remember_many_pipelined(settings: Settings, unique: str) -> None:
    async with Agent.connect("bulk", settings=settings) as agent:
        ids = await agent.remember_many(MemoryInput(f"turn {i}", board=unique, metadata={"i": i})
                                        for i in range(300))
        records = await _stored(settings, unique)
    assert len(ids) == len(set(ids)) == 300
    assert [r.metadata["i"] for r in records] == list(range(300))


async def test_remember_rejects_bad_input(settings: Settings, unique: str) -> None:
    async with Agent.connect("bad", settings=settings) as agent:
        with pytest.raises(InvalidPayloadError):
            await agent.remember("   ", board=unique)
        with pytest.raises(InvalidPayloadError):
            await agent.remember("x", kind="gossip", board=unique)  # type: ignore[arg-type]
        with pytest.raises(InvalidPayloadError):
            await agent.remember("x", importance=2.0, board=unique)
        with pytest.raises(InvalidKeyError):
            await agent.remember("x", board="not a board")
        with pytest.raises(PayloadTooLargeError):
            await agent.remember("x" * (settings.board.max_value_size + 1), board=unique)
