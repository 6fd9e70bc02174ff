"""Exact deduplication of long-term memories: the normalised content hash (pure).

Two memories say the same thing, exactly, when their texts are equal after
normalisation: Unicode NFKC (compatibility forms folded: full-width letters,
ligatures, non-breaking spaces), case folded, runs of whitespace collapsed to one
space, and the ends stripped. :func:`content_hash` is the SHA-256 of that text;
the worker stores it with each memory (``bb_memories.content_hash``) and merges
a new memory into the live one of its scope with the same hash
(docs/memory-lifecycle.md, "Deduplication and consolidation").
"""

from __future__ import annotations

import hashlib
import unicodedata

__all__ = ["content_hash", "normalize_text"]


def normalize_text(text: str) -> str:
    """``text`` as exact deduplication compares it: NFKC, case folded, whitespace collapsed, stripped.

    Whitespace is what ``str.isspace`` says (``str.split()`` and the regular
    expression ``\\s`` agree on it). ASCII text skips NFKC (which leaves it
    unchanged) and folds case as ``lower`` does (the same for ASCII).
    """
    folded = text.lower() if text.isascii() else unicodedata.normalize("NFKC", text).casefold()
    return " ".join(folded.split())


def content_hash(text: str) -> bytes:
    """The SHA-256 (32 bytes) of :func:`normalize_text` of ``text``, UTF-8 encoded.

    Lone surrogates (which no stored text holds) are hashed as they are
    (``surrogatepass``) rather than raising.
    """
    return hashlib.sha256(normalize_text(text).encode("utf-8", "surrogatepass")).digest()
