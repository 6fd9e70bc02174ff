"""Knowledge files: chunk text and markdown files into read-only knowledge memories.

``blackboard ingest PATH...`` (or :func:`ingest_paths`) splits each file into
overlapping chunks, stores them as ``kind="knowledge"``, ``read_only=True``
memories with their source, and records a manifest per file on the board
(section ``_ingest``) so that a second run re-ingests only files whose content
changed. Chunk ids are derived from (source, chunk index): re-ingesting a
changed file overwrites its chunks in place, and chunks past the new end are
forgotten.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents_sdk.agent import Agent
from agents_sdk.memory.longterm import MemoryInput
from blackboard.protocol.errors import NotFoundError
from blackboard.settings import Settings

__all__ = ["TEXT_SUFFIXES", "Chunk", "IngestReport", "chunk_text", "ingest_paths", "iter_files"]

TEXT_SUFFIXES = frozenset({".txt", ".md", ".markdown", ".rst", ".text"})
MANIFEST_SECTION = "_ingest"
_HEADING_RE = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_SENTENCE_RE = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of a document: its text, character span and enclosing markdown headings."""

    index: int
    text: str
    start: int
    end: int
    heading: str = ""


def _blocks(text: str) -> Iterator[tuple[int, int, str]]:
    """Paragraph-ish blocks (separated by blank lines) with their spans and heading path."""
    headings: list[str] = []
    pos = 0
    for para in re.split(r"(\n[ \t]*\n)", text):
        start, pos = pos, pos + len(para)
        if not para.strip() or para.startswith("\n"):
            continue
        first = para.strip().splitlines()[0]
        m = _HEADING_RE.match(first)
        if m:
            level = len(m.group(1))
            headings = [*headings[: level - 1], m.group(2)]
        yield start, pos, " > ".join(headings)


def _split_long(text: str, start: int, size: int) -> Iterator[tuple[int, int]]:
    """Split an oversized block at sentence, then word, boundaries."""
    pieces: list[tuple[int, int]] = []
    offset = 0
    for sentence in _SENTENCE_RE.split(text):
        idx = text.find(sentence, offset)
        pieces.append((idx, idx + len(sentence)))
        offset = idx + len(sentence)
    cur_s: int | None = None
    cur_e = 0
    for s, e in pieces:
        while e - s > size:  # a single huge sentence: cut at the last space
            cut = text.rfind(" ", s, s + size)
            cut = cut if cut > s else s + size
            if cur_s is not None:
                yield start + cur_s, start + cur_e
                cur_s = None
            yield start + s, start + cut
            s = cut
        if cur_s is None:
            cur_s, cur_e = s, e
        elif e - cur_s <= size:
            cur_e = e
        else:
            yield start + cur_s, start + cur_e
            cur_s, cur_e = s, e
    if cur_s is not None:
        yield start + cur_s, start + cur_e


def chunk_text(text: str, chunk_size: int = 1200, overlap: int = 200) -> list[Chunk]:
    """Split a document into chunks of at most ``chunk_size`` characters (+ overlap).

    Paragraphs are packed together up to ``chunk_size``; longer paragraphs are
    split at sentences, then words. Each chunk after the first starts with the
    last ``overlap`` characters of the previous one (cut at a word boundary),
    so a sentence spanning a boundary is found from either side. Pure function.

    Raises:
        ValueError: ``chunk_size`` < 1 or ``overlap`` not in ``[0, chunk_size)``.
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be positive")
    if not 0 <= overlap < chunk_size:
        raise ValueError("overlap must be >= 0 and smaller than chunk_size")
    spans: list[tuple[int, int, str]] = []
    cur: tuple[int, int, str] | None = None
    for s, e, heading in _blocks(text):
        if e - s > chunk_size:
            if cur is not None:
                spans.append(cur)
                cur = None
            spans.extend((ps, pe, heading) for ps, pe in _split_long(text[s:e], s, chunk_size))
            continue
        if cur is None:
            cur = (s, e, heading)
        elif e - cur[0] <= chunk_size:
            cur = (cur[0], e, cur[2])
        else:
            spans.append(cur)
            cur = (s, e, heading)
    if cur is not None:
        spans.append(cur)
    chunks: list[Chunk] = []
    prev_end = None
    for i, (s, e, heading) in enumerate(spans):
        begin = s
        if overlap and prev_end is not None:
            want = max(0, prev_end - overlap)
            space = text.find(" ", want, prev_end)
            begin = min(s, space + 1 if space != -1 else want)
        body = text[begin:e].strip()
        if body:
            chunks.append(Chunk(len(chunks), body, begin, e, heading))
        prev_end = e
        del i
    return chunks


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
                       chunk_size: int = 1200, overlap: int = 200, progress: bool = False) -> IngestReport:
    """Ingest files as knowledge memories through a connected agent. See the module doc."""
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
                and previous.get("overlap") == overlap:
            report.files_unchanged += 1
            bar.step(path.name)
            continue
        chunks = chunk_text(text, chunk_size, overlap)
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
                                                     "chunk_size": chunk_size, "overlap": overlap})
        report.files_ingested += 1
        report.chunks_written += len(chunks)
        report.chunks_forgotten += len(stale)
        bar.step(path.name)
    return report


async def ingest_paths(settings: Settings, paths: Sequence[Path], *, board: str = "knowledge",
                       agent_id: str = "ingest", chunk_size: int = 1200, overlap: int = 200,
                       progress: bool = True) -> IngestReport:
    """Connect as ``agent_id`` and :func:`ingest_files` (the ``blackboard ingest`` command)."""
    async with Agent.connect(agent_id, settings=settings) as agent:
        return await ingest_files(agent, paths, board=board, chunk_size=chunk_size, overlap=overlap,
                                  progress=progress)
