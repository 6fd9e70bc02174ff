"""Knowledge files: chunk text and markdown files into read-only knowledge memories.

``blackboard ingest PATH...`` (or :func:`ingest_paths`) splits each file into
overlapping chunks (:func:`~agents_sdk.memory.chunking.chunk_text`: by characters and, given the embedding
model's window and token counter, by its tokens), stores them as
``kind="knowledge"``, ``read_only=True`` memories with their source, and records a manifest per file on the board
(section ``_ingest``) so that a second run re-ingests only files whose content
changed. Chunk ids are derived from (source, chunk index): re-ingesting a
changed file overwrites its chunks in place, and chunks past the new end are
forgotten.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents_sdk.agent import Agent
from agents_sdk.memory.chunking import (
    TEXT_SUFFIXES,
    Chunk,
    chunk_text,
    estimate_tokens,
    text_blocks,
)
from agents_sdk.memory.longterm import MemoryInput
from agents_sdk.memory.prompt import TokenCounter
from blackboard.protocol.errors import NotFoundError
from blackboard.settings import Settings

__all__ = ["TEXT_SUFFIXES", "Chunk", "IngestReport", "chunk_text", "estimate_tokens", "ingest_files", "ingest_paths",
           "iter_files"]

MANIFEST_SECTION = "_ingest"


def iter_files(paths: Sequence[Path]) -> Iterator[Path]:
    """Text and markdown files under ``paths`` (directories recursively), sorted."""
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
        elif path.is_file():
            yield path
        else:
            raise NotFoundError(str(path), f"no such file or directory: {path}")


@dataclass
class IngestReport:
    files_seen: int = 0
    files_ingested: int = 0
    files_unchanged: int = 0
    files_skipped: list[str] = field(default_factory=list)
    chunks_written: int = 0
    chunks_forgotten: int = 0

    def __str__(self) -> str:
        text = (f"{self.files_seen} files: {self.files_ingested} ingested, {self.files_unchanged} unchanged, "
                f"{len(self.files_skipped)} skipped; {self.chunks_written} chunks written, "
                f"{self.chunks_forgotten} forgotten")
        if self.files_skipped:
            text += "\nskipped (not UTF-8 text): " + ", ".join(self.files_skipped)
        return text


def _chunk_id(source: str, index: int) -> str:
    return f"kn-{hashlib.sha1(source.encode()).hexdigest()[:16]}-{index}"


class _Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.done = total, enabled and total > 0, 0

    def step(self, label: str) -> None:
        self.done += 1
        if self.enabled:
            width = 30
            filled = int(width * self.done / self.total)
            sys.stderr.write(f"\ringest [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                             f"{label[-40:]:<40}")
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


async def ingest_files(agent: Agent, paths: Sequence[Path], *, board: str = "knowledge",
                       chunk_size: int = 1200, overlap: int = 200, max_tokens: int | None = None,
                       count_tokens: TokenCounter | None = None,
                       metadata_tokens: Callable[[Mapping[str, Any]], int] | None = None,
                       progress: bool = False) -> IngestReport:
    """Ingest files as knowledge memories through a connected agent. See the module doc.

    ``chunk_size``, ``overlap``, ``max_tokens`` (the embedding model's window)
    and ``count_tokens`` are :func:`chunk_text`'s. ``metadata_tokens`` counts
    the tokens that what the embedder puts of a chunk's metadata before its
    text takes (the worker embeds short metadata values as ``key: value``
    lines); each file's chunks get ``max_tokens`` less the most that the
    file's chunk metadata can take (its longest heading, numbers as long as
    the file), but at least half the window. A file is re-chunked when its content or ``chunk_size``,
    ``overlap`` or ``max_tokens`` changed since it was last ingested (the
    manifest keeps them).
    """
    files = list(iter_files(paths))
    report = IngestReport(files_seen=len(files))
    bar = _Progress(len(files), progress)
    handle = agent.board(board)
    for path in files:
        source = str(path.resolve())
        raw = path.read_bytes()
        digest = hashlib.sha256(raw).hexdigest()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            report.files_skipped.append(str(path))
            bar.step(path.name)
            continue
        previous: dict[str, Any] | None = None
        try:
            previous = (await handle.get(MANIFEST_SECTION, source)).value
        except NotFoundError:
            previous = None
        if previous and previous.get("sha256") == digest and previous.get("chunk_size") == chunk_size \
                and previous.get("overlap") == overlap and previous.get("max_tokens") == max_tokens:
            report.files_unchanged += 1
            bar.step(path.name)
            continue
        window = max_tokens
        if max_tokens is not None and metadata_tokens is not None:
            big = len(text)
            meta = max(metadata_tokens({"path": source, "chunk": big, "chunks": big, "start": big, "end": big,
                                        "heading": heading, "sha256": digest})
                       for heading in {"", *(h for _, _, h in text_blocks(text))})
            window = max(max_tokens - meta, max_tokens // 2)  # (absurdly long metadata: chunks still made)
        chunks = chunk_text(text, chunk_size, overlap, max_tokens=window, count_tokens=count_tokens)
        memories = [
            MemoryInput(text=c.text, kind="knowledge", read_only=True, board=board, source=source,
                        tags=("knowledge", path.suffix.lstrip(".").lower() or "text"),
                        metadata={"path": source, "chunk": c.index, "chunks": len(chunks), "start": c.start,
                                  "end": c.end, "heading": c.heading, "sha256": digest},
                        id=_chunk_id(source, c.index))
            for c in chunks
        ]
        await agent.remember_many(memories)
        old_count = int(previous.get("chunks", 0)) if previous else 0
        stale = [_chunk_id(source, i) for i in range(len(chunks), old_count)]
        if stale:
            await agent.forget(stale, board=board)
        await handle.put(MANIFEST_SECTION, source, {"sha256": digest, "chunks": len(chunks),
                                                     "chunk_size": chunk_size, "overlap": overlap,
                                                     "max_tokens": max_tokens})
        report.files_ingested += 1
        report.chunks_written += len(chunks)
        report.chunks_forgotten += len(stale)
        bar.step(path.name)
    return report


async def ingest_paths(settings: Settings, paths: Sequence[Path], *, board: str = "knowledge",
                       agent_id: str = "ingest", chunk_size: int = 1200, overlap: int = 200,
                       max_tokens: int | None = None, count_tokens: TokenCounter | None = None,
                       metadata_tokens: Callable[[Mapping[str, Any]], int] | None = None,
                       progress: bool = True) -> IngestReport:
    """Connect as ``agent_id`` and :func:`ingest_files` (the ``blackboard ingest`` command)."""
    async with Agent.connect(agent_id, settings=settings) as agent:
        return await ingest_files(agent, paths, board=board, chunk_size=chunk_size, overlap=overlap,
                                  max_tokens=max_tokens, count_tokens=count_tokens,
                                  metadata_tokens=metadata_tokens, progress=progress)
