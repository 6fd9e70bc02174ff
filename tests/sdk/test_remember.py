"""agent.remember: memories are durably in JetStream (the worker persists them later)."""

from __future__ import annotations

import pytest

from agents_sdk import Agent
from agents_sdk.memory.longterm import MemoryInput
from blackboard.client.signing import signing_of
from blackboard.protocol import codec
from blackboard.protocol.errors import InvalidKeyError, InvalidPayloadError, PayloadTooLargeError
from blackboard.protocol.records import decode_memory
from blackboard.protocol.schemas import MemoryRecord, validate_wire
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import MEMORY_STREAM, Subjects
from blackboard.security.verifier import Signed
from blackboard.settings import Settings
from tests._auth import operator_nats
from tests.conftest import stored_memories

pytestmark = pytest.mark.asyncio


async def _stored(settings: Settings, board: str) -> list[MemoryRecord]:
    """The board's memory records as the stream holds them (read as the operator: no agent may)."""
    return [validate_wire(MemoryRecord, raw, strict=True) for raw in await stored_memories(settings.nats.url, board)]


async def test_remember_publishes_a_valid_record_once(settings: Settings, unique: str) -> None:
    async with Agent.connect("rememberer", settings=settings) as agent:
        mid = await agent.remember("the build is green", kind="semantic", tags=["ci"],
                                   metadata={"run": 7}, importance=0.9, board=unique)
        again = await agent.remember("the build is green", kind="semantic", tags=["ci"],
                                     metadata={"run": 7}, importance=0.9, board=unique, id=mid)
        records = await _stored(settings, unique)
    assert again == mid
    assert len(records) == 1  # the same memory under the same id: deduplicated by JetStream
    rec = records[0]
    assert (rec.id, rec.agent, rec.board, rec.kind, rec.text) == (mid, "rememberer", unique, "semantic",
                                                                   "the build is green")
    assert rec.tags == ["ci"] and rec.metadata == {"run": 7} and rec.importance == 0.9
    assert Subjects.memory(unique, "rememberer") == f"bb.mem.{unique}.rememberer"


async def test_a_changed_memory_under_the_same_id_is_not_dropped_as_a_repeat(settings: Settings, unique: str) -> None:
    # Within the duplicate window (120 s): a rewrite (a changed knowledge chunk re-ingested)
    # is a new record; the same memory remembered again is still a repeat.
    async with Agent.connect("rewriter", settings=settings) as agent:
        mid = await agent.remember("the freeze is on Friday", board=unique, id=f"{unique}-fact")
        await agent.remember("the freeze is on Friday", board=unique, id=mid)
        await agent.remember("the freeze moved to Monday", board=unique, id=mid)
        await agent.remember_many([MemoryInput("the freeze moved to Tuesday", board=unique, id=mid)])
        records = await _stored(settings, unique)
    assert [(r.id, r.text) for r in records] == [(mid, "the freeze is on Friday"), (mid, "the freeze moved to Monday"),
                                                 (mid, "the freeze moved to Tuesday")]


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


async def test_memories_and_forgets_are_signed_by_their_agent_and_verify_in_another_reader(
        settings: Settings, unique: str) -> None:
    """What remember, remember_many and forget publish is the record's canonical encoding,
    signed by the agent's key: another agent's verifier accepts it as that agent's, and not
    as anyone else's."""
    writer, reader = f"{unique}-w", f"{unique}-r"
    async with Agent.connect(writer, settings=settings) as a, Agent.connect(reader, settings=settings) as b:
        await a.remember("signed memory", board=unique, metadata={"z": 1.0, "a": [2]})
        await a.remember_many([MemoryInput("pipelined", board=unique)])
        await a.forget(["some-id"], board=unique)
        verifier = signing_of(b.nc).verifier
        assert verifier is not None
        nc = await operator_nats(settings.nats.url)  # the stored messages (no agent may pull BB_MEMORY)
        try:
            sub = await nc.jetstream().pull_subscribe(Subjects.memory_board(unique), stream=MEMORY_STREAM)
            msgs = await sub.fetch(3, timeout=5)
        finally:
            await nc.close()
        assert len(msgs) == 3
        for m in msgs:
            record = decode_memory(codec.decode(m.data))
            assert m.data == record.canonical_bytes() and record.agent == writer
            assert m.headers is not None and "Bb-Encoding" not in m.headers
            signed = Signed(m.subject, m.headers, m.data, stored_at=m.metadata.timestamp, author=record.agent)
            assert await verifier.verify(signed) is Verdict.VERIFIED
            assert await verifier.verify(Signed(m.subject, m.headers, m.data, author=reader)) is Verdict.WRONG_AUTHOR
