"""blackboard ingest chunks knowledge files by the local model's tokens: no chunk (with the
metadata lines the worker embeds before it) is longer than MiniLM's 256-token window, so none
has a tail the model never sees; re-ingesting stays idempotent."""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from agents_sdk import Agent
from agents_sdk.memory.knowledge import chunk_text, estimate_tokens, ingest_files
from blackboard.apps.cli import _knowledge_token_limits
from blackboard.embeddings.local import LOCAL_MAX_TOKENS, count_tokens
from blackboard.settings import EmbeddingSettings, Settings
from blackboard.worker.embed_text import memory_embed_text
from tests.conftest import stored_memories

LONG_WORD = "pneumonoultramicroscopicsilicovolcanoconiosis" * 12  # 540 characters, no space
DIGITS = "".join(str(i % 10) for i in range(900))  # one "word" of 900 digits


def long_markdown() -> str:
    """Long paragraphs, long words, CJK, code and punctuation: text on which 1,200-character
    chunks run far past 256 tokens."""
    parts = ["# Handbook", "Intro. " + " ".join(f"sentence{i} about the deploy." for i in range(60))]
    for section in range(4):
        parts.append(f"## Section {section} with a rather long heading about running the worker")
        parts.append(" ".join(f"Paragraph {section} word{i}, x={i / 7:.5f}; (id-{i:04x})." for i in range(120)))
        parts.append(f"{LONG_WORD} {DIGITS} tail{section}")
        parts.append("東京の天気は晴れです。" * 40)
        parts.append("`a.b(c)[d]` {e: f} <g/> " * 50)
    parts.append("## End\n\nShort closing note.")
    return "\n\n".join(parts)


def test_chunks_fit_the_local_model_window_and_cover_the_text() -> None:
    text = long_markdown()
    plain = chunk_text(text)
    assert max(count_tokens(c.text) for c in plain) > 2 * LOCAL_MAX_TOKENS  # the problem: tails never embedded
    chunks = chunk_text(text, max_tokens=LOCAL_MAX_TOKENS, count_tokens=count_tokens)
    assert len(chunks) > len(plain)
    for c in chunks:
        assert count_tokens(c.text) <= LOCAL_MAX_TOKENS
        assert len(c.text) <= 1200 + 200 + 1 and c.text == c.text.strip() and c.text
    assert set(text.split()) <= set(" ".join(c.text for c in chunks).split()) | {
        w for w in text.split() if len(w) > 100}  # words longer than a chunk are cut
    joined = "".join(c.text for c in chunks)
    assert LONG_WORD[:200] in joined and "tail3" in joined and "Short closing note." in chunks[-1].text
    # the overlap still repeats the end of the previous chunk where the window leaves room for it
    overlapping = sum(prev.text.split()[-1] in cur.text for prev, cur in itertools.pairwise(chunks))
    assert overlapping >= len(chunks) // 2
    assert chunk_text(text, max_tokens=LOCAL_MAX_TOKENS, count_tokens=count_tokens) == chunks  # deterministic


def test_the_fallback_estimate_is_cautious_and_bounds_chunks() -> None:
    text = long_markdown()
    chunks = chunk_text(text, max_tokens=LOCAL_MAX_TOKENS)  # no counter: estimate_tokens
    for c in chunks:
        assert estimate_tokens(c.text) <= LOCAL_MAX_TOKENS
        assert count_tokens(c.text) <= LOCAL_MAX_TOKENS  # and so for the real tokenizer on this text
    for sample in ("The ferry left at dawn.", "東京の天気は晴れです。", LONG_WORD, DIGITS, "a, b; c!"):
        assert estimate_tokens(sample) >= count_tokens(sample)
    with pytest.raises(ValueError, match="max_tokens"):
        chunk_text(text, max_tokens=7)


def test_the_cli_limits_follow_the_provider() -> None:
    local = _knowledge_token_limits(Settings())
    assert local["max_tokens"] == LOCAL_MAX_TOKENS and local["count_tokens"] is count_tokens
    assert local["metadata_tokens"]({"path": "/docs/a.md", "chunk": 1}) == count_tokens("path: /docs/a.md\nchunk: 1") - 2
    assert local["metadata_tokens"]({"sha256": "ab" * 32}) == 0  # identifiers are not embedded
    assert _knowledge_token_limits(Settings(embedding=EmbeddingSettings(provider="openai", dimensions=64))) == {}


async def _records(settings: Settings, board: str) -> list[dict[str, Any]]:
    return [r for r in await stored_memories(settings.nats.url, board) if r.get("op") != "forget"]


@pytest.mark.asyncio
async def test_ingest_by_tokens_fits_the_window_with_metadata_and_is_idempotent(settings: Settings,
                                                                                unique: str) -> None:
    root = Path(tempfile.mkdtemp())
    os.chmod(root, 0o755)
    (root / "handbook.md").write_text(long_markdown())
    limits = _knowledge_token_limits(settings)
    async with Agent.connect("ingester", settings=settings) as agent:
        first = await ingest_files(agent, [root], board=unique, **limits)
        assert (first.files_ingested, first.files_unchanged) == (1, 0)
        records = await _records(settings, unique)
        assert len(records) == first.chunks_written > len(chunk_text(long_markdown()))
        for r in records:  # what the worker embeds: metadata lines, then the chunk
            assert count_tokens(memory_embed_text(r["text"], r["metadata"])) <= LOCAL_MAX_TOKENS
        second = await ingest_files(agent, [root], board=unique, **limits)
        assert (second.files_ingested, second.files_unchanged, second.chunks_written) == (0, 1, 0)
        assert len(await _records(settings, unique)) == first.chunks_written
        # the manifest keeps the token limit: a run without it re-chunks the file by characters
        third = await ingest_files(agent, [root], board=unique)
        assert (third.files_ingested, third.chunks_written) == (1, len(chunk_text(long_markdown())))
        assert third.chunks_forgotten == first.chunks_written - third.chunks_written
