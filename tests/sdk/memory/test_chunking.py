"""Pure chunking of knowledge files."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents_sdk.memory.knowledge import chunk_text

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
