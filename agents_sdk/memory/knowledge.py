"""Knowledge files: chunk text and markdown files into read-only knowledge memories.

``blackboard ingest PATH...`` (or :func:`ingest_paths`) splits each file into
overlapping chunks (:func:`chunk_text`: by characters and, given the embedding
model's window and token counter, by its tokens), stores them as
``kind="knowledge"``, ``read_only=True`` memories with their source, and records a manifest per file on the board
(section ``_ingest``) so that a second run re-ingests only files whose content
changed. Chunk ids are derived from (source, chunk index): re-ingesting a
changed file overwrites its chunks in place, and chunks past the new end are
forgotten.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents_sdk.agent import Agent
from agents_sdk.memory.longterm import MemoryInput
from agents_sdk.memory.prompt import TokenCounter
from blackboard.protocol.errors import NotFoundError
from blackboard.settings import Settings

__all__ = ["TEXT_SUFFIXES", "Chunk", "IngestReport", "chunk_text", "estimate_tokens", "ingest_files", "ingest_paths",
           "iter_files"]

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
    for i, para in enumerate(re.split(r"(\n[ \t]*\n)", text)):
        start, pos = pos, pos + len(para)
        if i % 2 or not para.strip():  # (odd items are the separators)
            continue
        first = para.strip().splitlines()[0]
        m = _HEADING_RE.match(first)
        if m:
            level = len(m.group(1))
            headings = [*headings[: level - 1], m.group(2)]
        yield start, pos, " > ".join(headings)


_WORD_RE = re.compile(r"[^\W_]+|\S")


def estimate_tokens(text: str) -> int:
    """A cautious estimate of a BERT WordPiece token count, special tokens included: the
    fallback counter of :func:`chunk_text` when it gets a token limit and no counter.

    Two tokens for ``[CLS]`` and ``[SEP]``, one per punctuation character
    (``_`` included: BERT splits each off), and per run of letters and digits
    one token for every three ASCII letters (English words are one or two
    WordPiece tokens), one per character if it has digits (numbers, hashes
    and ids are cut into short pieces) or is in another script (BERT's
    uncased vocabulary cuts CJK into single characters, and accented or rare
    words into short pieces); plus a tenth. Over 3,976 paragraphs of
    documentation, READMEs and Python source of 60 tokens or more it counted
    at least 1.03x and on average 1.45x what all-MiniLM-L6-v2's tokenizer counts, so chunks
    come out smaller than they could be rather than cut off by the model.
    """
    total = 2
    for match in _WORD_RE.finditer(text):
        word = match.group()
        if len(word) == 1:  # a punctuation character, or a one-letter word
            total += 1
        elif not word.isascii() or any(c.isdigit() for c in word):
            total += len(word)
        else:
            total += (len(word) + 2) // 3
    return total + total // 10


_Fits = Callable[[int, int], bool]


def _last_fitting(lo: int, candidates: Sequence[int], fits: Callable[[int], bool]) -> int:
    """The largest of ascending ``candidates`` for which ``fits`` holds (``fits`` holds for a
    prefix of them), or ``lo`` if none does."""
    best, left, right = lo, 0, len(candidates) - 1
    while left <= right:
        mid = (left + right) // 2
        if fits(candidates[mid]):
            best, left = candidates[mid], mid + 1
        else:
            right = mid - 1
    return best


def _split_long(text: str, start: int, end: int, fits: _Fits) -> Iterator[tuple[int, int]]:
    """Split an oversized block ``text[start:end]`` at sentence, then word, then character
    boundaries, into spans that fit."""
    block = text[start:end]
    pieces: list[tuple[int, int]] = []
    offset = 0
    for sentence in _SENTENCE_RE.split(block):
        idx = block.find(sentence, offset)
        pieces.append((start + idx, start + idx + len(sentence)))
        offset = idx + len(sentence)
    cur_s: int | None = None
    cur_e = 0
    for s, e in pieces:
        while not fits(s, e):  # a single huge sentence: cut at the last space that fits
            def fits_from_s(c: int, s: int = s) -> bool:
                return fits(s, c)

            spaces = [i for i in range(s + 1, e) if text[i].isspace()]
            cut = _last_fitting(s, spaces, fits_from_s)
            if cut == s:  # not even the first word fits: cut the word itself
                cut = _last_fitting(s + 1, range(s + 1, e), fits_from_s)
            if cur_s is not None:
                yield cur_s, cur_e
                cur_s = None
            yield s, cut
            s = cut
        if cur_s is None:
            cur_s, cur_e = s, e
        elif fits(cur_s, e):
            cur_e = e
        else:
            yield cur_s, cur_e
            cur_s, cur_e = s, e
    if cur_s is not None:
        yield cur_s, cur_e


def chunk_text(text: str, chunk_size: int = 1200, overlap: int = 200, *, max_tokens: int | None = None,
               count_tokens: TokenCounter | None = None) -> list[Chunk]:
    """Split a document into chunks of at most ``chunk_size`` characters (+ overlap) and, with
    ``max_tokens``, at most that many tokens of the embedding model (overlap included).

    Paragraphs are packed together up to the limits; longer paragraphs are
    split at sentences, then words (a word longer than the limits, at
    characters). Each chunk after the first starts with the last ``overlap``
    characters of the previous one (cut at a word boundary), so a sentence
    spanning a boundary is found from either side. Pure function.

    With ``max_tokens`` (the model's window, e.g. 256 for all-MiniLM-L6-v2,
    whose tokenizer counts ``[CLS]`` and ``[SEP]`` too), no chunk has more
    tokens than that as ``count_tokens`` counts them (text to token count,
    special tokens included: the swap point for the embedding model's
    tokenizer, e.g. ``blackboard.embeddings.local.count_tokens``) (default: the cautious
    :func:`estimate_tokens`), so the model embeds every chunk whole: the text
    of a chunk is packed to at most ``max_tokens - max_tokens * overlap //
    chunk_size`` tokens (the overlap's share of the characters, of the
    tokens), and the overlap in front of it is shortened, from its start at
    word boundaries, where the whole would not fit.

    Raises:
        ValueError: ``chunk_size`` < 1, ``overlap`` not in ``[0, chunk_size)``,
            or ``max_tokens`` leaves fewer than 8 tokens besides the overlap's share.
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be positive")
    if not 0 <= overlap < chunk_size:
        raise ValueError("overlap must be >= 0 and smaller than chunk_size")
    if max_tokens is not None and max_tokens - max_tokens * overlap // chunk_size < 8:
        raise ValueError("max_tokens must leave at least 8 tokens besides the overlap's share")
    counter: TokenCounter | None = None
    budget = 0
    if max_tokens is not None:
        counter = count_tokens or estimate_tokens
        budget = max_tokens - max_tokens * overlap // chunk_size

    def fits(s: int, e: int) -> bool:
        return e - s <= chunk_size and (counter is None or counter(text[s:e].strip()) <= budget)

    spans: list[tuple[int, int, str]] = []
    cur: tuple[int, int, str] | None = None
    for s, e, heading in _blocks(text):
        if not fits(s, e):
            if cur is not None:
                spans.append(cur)
                cur = None
            spans.extend((ps, pe, heading) for ps, pe in _split_long(text, s, e, fits))
            continue
        if cur is None:
            cur = (s, e, heading)
        elif fits(cur[0], e):
            cur = (cur[0], e, cur[2])
        else:
            spans.append(cur)
            cur = (s, e, heading)
    if cur is not None:
        spans.append(cur)
    chunks: list[Chunk] = []
    prev_end = None
    for s, e, heading in spans:
        begin = s
        if overlap and prev_end is not None:
            want = max(0, prev_end - overlap)
            space = text.find(" ", want, prev_end)
            begin = min(s, space + 1 if space != -1 else want)
            if counter is not None and max_tokens is not None and begin < s:
                begin = _trim_overlap(text, begin, s, e, counter, max_tokens)
        body = text[begin:e].strip()
        if body:
            chunks.append(Chunk(len(chunks), body, begin, e, heading))
        prev_end = e
    return chunks


def _trim_overlap(text: str, begin: int, s: int, e: int, counter: TokenCounter, max_tokens: int) -> int:
    """Where the chunk ``text[s:e]`` with the overlap ``text[begin:s]`` in front starts: the
    overlap loses words from its start until the whole fits ``max_tokens`` (``s`` at worst)."""
    starts = [begin, *(i + 1 for i in range(begin, s) if text[i] == " "), s]
    left, right = 0, len(starts) - 1  # the whole fits from starts[right]; find the first that does
    while left < right:
        mid = (left + right) // 2
        if counter(text[starts[mid]:e].strip()) <= max_tokens:
            right = mid
        else:
            left = mid + 1
    return starts[left]


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
                       for heading in {"", *(h for _, _, h in _blocks(text))})
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
