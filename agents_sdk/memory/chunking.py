"""Chunking of text and markdown documents: the pure part of knowledge ingest.

:func:`chunk_text` splits a document into overlapping chunks that fit a
character size and, given the embedding model's window and a token counter,
its tokens; :func:`text_blocks` yields its paragraphs with their markdown
heading path. ``blackboard ingest`` (:mod:`agents_sdk.memory.knowledge`) and the
``file`` memory store (:mod:`agents_sdk.memory.stores.file`) both chunk with it.
This module imports no agent, so the stores can use it without a cycle.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from agents_sdk.memory.prompt import TokenCounter

__all__ = ["TEXT_SUFFIXES", "Chunk", "chunk_text", "estimate_tokens", "text_blocks"]

#: The suffixes of the text files that are ingested or indexed by default.
TEXT_SUFFIXES = frozenset({".txt", ".md", ".markdown", ".rst", ".text"})
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


def text_blocks(text: str) -> Iterator[tuple[int, int, str]]:
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
    for s, e, heading in text_blocks(text):
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
