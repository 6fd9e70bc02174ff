"""blackboard ingest: knowledge files become read-only knowledge memories; re-runs skip unchanged files."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from agents_sdk import Agent
from agents_sdk.memory.knowledge import ingest_files
from blackboard.settings import Settings
from tests.conftest import stored_memories

pytestmark = pytest.mark.asyncio


async def _records(settings: Settings, board: str) -> list[dict[str, Any]]:
    """The board's memory-stream messages (read as the operator: no agent may)."""
    return await stored_memories(settings.nats.url, board)


async def test_ingest_then_reingest_only_changed_files(settings: Settings, unique: str) -> None:
    root = Path(tempfile.mkdtemp())
    os.chmod(root, 0o755)
    (root / "guide.md").write_text("# Guide\n\n" + "\n\n".join(f"Paragraph {i} " + "text " * 40
                                                              for i in range(12)))
    (root / "notes.txt").write_text("short note about the deploy")
    (root / "image.png").write_bytes(b"\x89PNG not text")  # not a text suffix: ignored in dirs
    async with Agent.connect("ingester", settings=settings) as agent:
        first = await ingest_files(agent, [root], board=unique, chunk_size=500, overlap=50)
        assert (first.files_seen, first.files_ingested, first.files_unchanged) == (2, 2, 0)
        records = await _records(settings, unique)
        assert len(records) == first.chunks_written > 2
        assert all(r["kind"] == "knowledge" and r["read_only"] is True for r in records)
        assert {r["source"] for r in records} == {str((root / "guide.md").resolve()),
                                                  str((root / "notes.txt").resolve())}

        second = await ingest_files(agent, [root], board=unique, chunk_size=500, overlap=50)
        assert (second.files_ingested, second.files_unchanged, second.chunks_written) == (0, 2, 0)
        assert len(await _records(settings, unique)) == len(records)

        (root / "guide.md").write_text("# Guide\n\nNow much shorter.")
        third = await ingest_files(agent, [root], board=unique, chunk_size=500, overlap=50)
        assert (third.files_ingested, third.files_unchanged, third.chunks_written) == (1, 1, 1)
        assert third.chunks_forgotten == first.chunks_written - 1 - 1  # guide had n chunks, notes 1
        after = await _records(settings, unique)
        forgets = [r for r in after if r.get("op") == "forget"]
        assert len(forgets) == 1 and len(forgets[0]["ids"]) == third.chunks_forgotten  # type: ignore[arg-type]
