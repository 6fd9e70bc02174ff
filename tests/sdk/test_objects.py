"""Large binaries through the JetStream object store, referenced from board entries."""

from __future__ import annotations

import os

import pytest

from agents_sdk import Agent
from agents_sdk.objects import ObjectRef
from blackboard.protocol.errors import NotFoundError
from blackboard.settings import Settings

pytestmark = pytest.mark.asyncio


async def test_attach_and_fetch_a_large_binary(settings: Settings, unique: str) -> None:
    blob = os.urandom(3 * 1024 * 1024 + 17)  # larger than max_value_size
    async with Agent.connect("shooter", settings=settings) as a, Agent.connect("viewer", settings=settings) as b:
        rev = await a.board(unique).attach("screens", "home.png", blob, content_type="image/png",
                                           tags=["screenshot"])
        entry = await b.board(unique).get("screens", "home.png")
        ref = ObjectRef.from_value(entry.value)
        assert entry.revision == rev and entry.content_type == "image/png"
        assert ref is not None and ref.size == len(blob)
        assert await b.board(unique).fetch("screens", "home.png") == blob


async def test_an_identity_with_object_read_rights_only_fetches_an_attachment(settings: Settings,
                                                                               unique: str) -> None:
    """Reading an object needs only the objects read grant (stream info, gets, chunk consumers):
    the chunks' stream is named, never looked up ($JS.API.STREAM.NAMES, no agent's right)."""
    blob = os.urandom(300 * 1024 + 5)  # several chunks
    async with Agent.connect(f"{unique}-w", settings=settings) as w, \
            Agent.connect(f"reader-{unique}", settings=settings) as r:
        await w.board(unique).attach("files", "report.bin", blob, content_type="application/octet-stream")
        assert await r.board(unique).fetch("files", "report.bin") == blob
        with pytest.raises(NotFoundError):
            await r.objects.get(f"{unique}/nothing/here")


async def test_small_bytes_value_fetches_directly_and_missing_object(settings: Settings, unique: str) -> None:
    async with Agent.connect("a", settings=settings) as agent:
        board = agent.board(unique)
        await board.put("s", "small", b"\x00\x01")
        assert await board.fetch("s", "small") == b"\x00\x01"
        with pytest.raises(NotFoundError):
            await agent.objects.get(f"{unique}/nothing/here")
