"""memory_remember's lifecycle arguments (subject key, event time, confidence) reach the stored
record, over both transports; bad ones are tool errors and write nothing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from mcp import ClientSession

from blackboard.protocol.schemas import MemoryRecord, validate_wire
from blackboard.settings import Settings
from tests.apps.mcp.conftest import call
from tests.conftest import stored_memories

pytestmark = pytest.mark.asyncio


async def test_memory_remember_takes_key_event_time_and_confidence(mcp_session: ClientSession, settings: Settings,
                                                                   unique: str) -> None:
    tools = {t.name: t for t in (await mcp_session.list_tools()).tools}
    props = tools["memory_remember"].input_schema["properties"]
    assert {"key", "occurred_at", "confidence"} <= set(props)
    fact = await call(mcp_session, "memory_remember", text="SKU-1 costs 12 EUR", kind="semantic", board=unique,
                      key="price:sku-1", occurred_at="2026-01-31T12:00:00+01:00", confidence=0.9)
    plain = await call(mcp_session, "memory_remember", text="the deploy went fine", board=unique)
    for bad in ({"key": ""}, {"key": "a\nb"}, {"confidence": 2}, {"occurred_at": "2026-01-31T12:00:00"}):
        result = await mcp_session.call_tool("memory_remember", {"text": "x", "board": unique, **bad})
        assert result.is_error, bad
    stored = {r["id"]: validate_wire(MemoryRecord, r, strict=True)
              for r in await stored_memories(settings.nats.url, unique)}
    assert set(stored) == {fact["id"], plain["id"]}
    rec = stored[fact["id"]]
    assert (rec.v, rec.key, rec.confidence) == (2, "price:sku-1", 0.9)
    assert rec.occurred_at == datetime(2026, 1, 31, 11, 0, tzinfo=UTC)
    assert stored[plain["id"]].v == 1 and stored[plain["id"]].key is None
