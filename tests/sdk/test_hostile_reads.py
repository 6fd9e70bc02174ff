"""The SDK's readers meet a poison pill (issue 18, finding 1): a JSON payload nested
5,000 deep, published raw. ``board.get`` raises the typed error; an inbox skips the
message (with a warning) and yields the next one. Before, both raised RecursionError."""

from __future__ import annotations

import logging

import pytest

from agents_sdk import Agent, InvalidPayloadError
from blackboard.client.connection import connect_nats
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings

pytestmark = pytest.mark.asyncio

NOW = "2026-01-01T00:00:00+00:00"


def _deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


async def test_board_get_of_a_deep_entry_raises_the_typed_error(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as agent:  # the streams exist from here
        nc = await connect_nats(settings.nats, name="mallory")
        try:
            subject = Subjects(settings.board.bucket).entry(unique, "s", "poison")
            data = b'{"v":1,"author":"mallory","created_at":"' + NOW.encode() + b'","value":' + _deep(5_000) + b"}"
            await nc.jetstream().publish(subject, data, headers={"Bb-Encoding": "json"})
        finally:
            await nc.close()
        board = agent.board(unique)
        with pytest.raises(InvalidPayloadError, match="nested deeper than"):
            await board.get("s", "poison")
        await board.put("s", "poison", "fine")  # the key is not stuck: a later revision reads
        assert (await board.get("s", "poison")).value == "fine"


async def test_an_inbox_skips_a_deep_message_and_yields_the_next(settings: Settings, unique: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    a_id, b_id = f"{unique}-a", f"{unique}-b"
    async with Agent.connect(a_id, settings=settings) as a, Agent.connect(b_id, settings=settings) as b:
        nc = await connect_nats(settings.nats, name="mallory")
        try:
            data = (b'{"v":1,"id":"x","sender":"mallory","kind":"direct","recipients":["' + b_id.encode()
                    + b'"],"type":"t","created_at":"' + NOW.encode() + b'","body":' + _deep(5_000) + b"}")
            await nc.jetstream().publish(Subjects.direct(b_id), data, headers={"Bb-Encoding": "json"})
        finally:
            await nc.close()
        sent = await a.send(b_id, "after", {"ok": 1})
        caplog.set_level(logging.WARNING)
        received = []
        async for msg in b.inbox(limit=1, timeout=5):
            received.append(msg)
            await msg.ack()
        assert [m.id for m in received] == [sent.id]
        assert any("nested deeper than" in r.getMessage() for r in caplog.records)
