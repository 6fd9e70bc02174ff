"""Pure chunking of knowledge files."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents_sdk.memory.knowledge import Chunk, chunk_text, estimate_tokens

DOC = """# Guide

Intro paragraph about the system. It has two sentences.

## Install

Run the installer. Then run the tests. """ + " ".join(f"word{i}" for i in range(400)) + """

## Use

Short usage note.
"""


def test_chunks_respect_size_plus_overlap_and_cover_the_text() -> None:
    chunks = chunk_text(DOC, chunk_size=300, overlap=50)
    assert len(chunks) > 3
    for c in chunks:
        assert len(c.text) <= 300 + 50 + 1
    # every word of the document is in some chunk
    words = set(DOC.split())
    covered = set(" ".join(c.text for c in chunks).split())
    assert words <= covered
    assert [c.index for c in chunks] == list(range(len(chunks)))


def test_overlap_repeats_the_tail_of_the_previous_chunk() -> None:
    chunks = chunk_text(DOC, chunk_size=300, overlap=60)
    for prev, cur in itertools.pairwise(chunks):
        tail_words = prev.text.split()[-3:]
        assert " ".join(tail_words) in " ".join(cur.text.split())


def test_markdown_heading_path_is_recorded() -> None:
    chunks = chunk_text(DOC, chunk_size=300, overlap=0)
    assert chunks[0].heading.startswith("Guide")
    assert any(c.heading == "Guide > Install" for c in chunks)
    assert chunks[-1].heading == "Guide > Use"


def test_small_document_is_one_chunk_and_empty_is_none() -> None:
    assert [c.text for c in chunk_text("hello world", 100, 10)] == ["hello world"]
    assert chunk_text("   \n\n  ", 100, 10) == []


def test_bad_parameters() -> None:
    with pytest.raises(ValueError):
        chunk_text("x", 0, 0)
    with pytest.raises(ValueError):
        chunk_text("x", 10, 10)


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab \n.#"), min_size=0, max_size=2000),
       st.integers(min_value=20, max_value=400))
def test_chunking_is_deterministic_and_bounded(text: str, size: int) -> None:
    overlap = size // 4
    a = chunk_text(text, size, overlap)
    assert a == chunk_text(text, size, overlap)
    for c in a:
        assert len(c.text) <= size + overlap + 1
        assert c.text.strip() == c.text and c.text


def _words(text: str) -> int:
    return 2 + len(text.split())  # a toy counter: a token a word, plus two special tokens


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab \n.#"), min_size=0, max_size=2000),
       st.integers(min_value=40, max_value=400), st.integers(min_value=10, max_value=40))
def test_token_limited_chunks_fit_the_window_and_keep_every_word(text: str, size: int, window: int) -> None:
    overlap = size // 4
    chunks = chunk_text(text, size, overlap, max_tokens=window, count_tokens=_words)
    for c in chunks:
        assert _words(c.text) <= window and len(c.text) <= size + overlap + 1
        assert c.text.strip() == c.text and c.text
    # words longer than the window's character share may be cut, none is lost
    assert "".join(text.split()) == "".join("".join(text[c.start:c.end].split()) for c in _without_overlap(chunks))


def _without_overlap(chunks: list[Chunk]) -> list[Chunk]:
    """The chunks with each one's overlap (the part before the previous chunk's end) left out."""
    out, prev_end = [], 0
    for c in chunks:
        out.append(Chunk(c.index, c.text, max(c.start, prev_end), c.end, c.heading))
        prev_end = c.end
    return out


def test_without_a_counter_the_estimate_bounds_the_tokens() -> None:
    chunks = chunk_text(DOC, chunk_size=1200, overlap=200, max_tokens=64)
    assert len(chunks) > len(chunk_text(DOC, chunk_size=1200, overlap=200))
    assert all(estimate_tokens(c.text) <= 64 for c in chunks)
    assert estimate_tokens("") == 2
    assert estimate_tokens("the ferry, at 9.") == 2 + 1 + 2 + 1 + 1 + 1 + 1  # the, fer-ry, ",", at, 9, "."
    assert estimate_tokens("東京 " * 10) == 22 + 2  # a token a character, plus a tenth


def test_a_document_starting_with_a_newline_keeps_its_first_paragraph() -> None:
    assert [c.text for c in chunk_text("\nfirst\n\nsecond", 100, 10)] == ["first\n\nsecond"]
