"""The text the worker embeds for a memory (pure).

A memory's vector is made of its short scalar metadata as ``key: value``
lines, in the writer's key order, then its text (docs/search.md, "What is
embedded"). Metadata often holds what a question names but the text leaves
implicit (who said it, when, about which project); identifier-like values
(opaque ids, hashes, UUIDs, long hex or base64 tokens) name nothing a
question would say and only pull the vector towards noise, so they stay out
(:func:`is_identifier_like`). They stay in the keyword index
(``decode.memory_search_text``), where an exact id is a useful match.

The worker computes the lines at ingest, from the record as the writer
encoded it (PostgreSQL's ``jsonb`` keeps keys in its own order, not the
writer's), and stores them beside the memory (``bb_memories.embed_meta``,
migration 0014); rows stored before that migration fall back to the stored
metadata's order. A change of these rules reaches vectors already stored
only through ``blackboard reindex``.

Contextual indexing: a memory whose metadata names a thread
(:data:`CONTEXT_KEY`, ``metadata.thread``: a conversation, a document, a
ticket) is embedded with the text of the memory just before it on the same
board and thread (by creation time), after its own text: a turn in a
conversation ("Yes, twice last summer!") says little without the turn it
answers, and a question names what the pair says together. The thread's
value links the memories and is left out of the lines (the previous
memory's text is what the vector gets from it); it stays in the keyword
index. The context is read when the memory is embedded (a later change of
the previous memory reaches the vector through ``blackboard reindex``).
On LoCoMo (bench/locomo_recall.py), the previous turn in the embedded text
raised semantic recall@10 from 0.47 to 0.54 on the two tuning conversations.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["CONTEXT_KEY", "MAX_CONTEXT_CHARS", "MAX_EMBED_CHARS", "MAX_EMBED_META_VALUE", "is_identifier_like",
           "memory_embed_lines", "memory_embed_text"]

#: Characters of an item's text sent to the model (MiniLM reads 256 tokens).
MAX_EMBED_CHARS = 2000
#: Metadata values (and keys) longer than this are left out of the embedded text.
MAX_EMBED_META_VALUE = 200
#: The metadata key naming a memory's thread (contextual indexing, see the module docstring).
CONTEXT_KEY = "thread"
#: Characters of the previous memory's text a threaded memory is embedded with (MiniLM
#: reads 256 tokens: the memory's own text and lines come first and are never cut for it).
MAX_CONTEXT_CHARS = 600

_UUID = re.compile(r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}")
_HEX = re.compile(r"(?:0x)?[0-9a-fA-F]{12,}")
_TOKEN = re.compile(r"[A-Za-z0-9_\-+/=.:]{16,}")
_PREFIXED = re.compile(r"[A-Za-z]{1,12}[_\-:][A-Za-z0-9]{8,}")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?")


def is_identifier_like(value: str) -> bool:
    """Whether a metadata value looks like an opaque identifier rather than words.

    The heuristic, on the value stripped of surrounding white space (a value
    holding white space is never an identifier):

    - a UUID (with or without hyphens);
    - 12 or more hexadecimal digits (optionally ``0x``-prefixed): hashes,
      object ids, commit ids;
    - a 16+ character token of letters, digits and ``_-+/=.:`` that mixes
      digits with letters (base64, JWT parts, ULIDs, ``msg_01H...``);
    - a short alphabetic prefix, a ``_``/``-``/``:`` and 8+ letters and
      digits including at least 4 digits (``usr_8f3a92b1``, ``run-20240611``).

    Numbers, ISO dates and times, words, names and ordinary phrases are not identifiers:
    ``"2024-06-11"``, ``"Caroline"``, ``"project-phoenix"`` and ``"42"`` stay.
    """
    v = value.strip()
    if not v or any(c.isspace() for c in v) or _TIME.fullmatch(v):
        return False
    if _UUID.fullmatch(v) or _HEX.fullmatch(v):
        return True
    digits = sum(c.isdigit() for c in v)
    letters = sum(c.isalpha() for c in v)
    if _TOKEN.fullmatch(v) and digits and letters:
        return True
    return bool(_PREFIXED.fullmatch(v)) and digits >= 4


def memory_embed_lines(metadata: Mapping[str, Any] | None) -> str:
    """The ``key: value`` lines of a memory's metadata that its vector sees, in the mapping's order.

    Only short scalar values (strings and numbers, not booleans, at most
    :data:`MAX_EMBED_META_VALUE` characters, key included) that are not
    identifier-like (:func:`is_identifier_like`), nor the thread (:data:`CONTEXT_KEY`), which
    links the memory to its context.
    """
    lines = []
    for key, value in (metadata or {}).items():
        if key == CONTEXT_KEY or isinstance(value, bool) or not isinstance(value, str | int | float):
            continue
        shown = str(value).strip()
        if (shown and len(shown) <= MAX_EMBED_META_VALUE and len(str(key)) <= MAX_EMBED_META_VALUE
                and not (isinstance(value, str) and is_identifier_like(shown))):
            lines.append(f"{key}: {shown}")
    return "\n".join(lines)


def memory_embed_text(text: str, metadata: Mapping[str, Any] | None = None, *,
                      lines: str | None = None, context: str | None = None) -> str:
    """The text embedded for a memory: its metadata lines, then its text, then the text of the
    previous memory of its thread (at most :data:`MAX_CONTEXT_CHARS` of it), cut to
    :data:`MAX_EMBED_CHARS`.

    Args:
        text: the memory's text.
        metadata: its metadata, used when ``lines`` is None (rows stored
            before the worker kept the lines: the stored metadata's order).
        lines: the lines the worker computed at ingest
            (:func:`memory_embed_lines` of the record as written).
        context: the text of the memory before it on its board and thread (None: not
            threaded, or the first of its thread).
    """
    if lines is None:
        lines = memory_embed_lines(metadata)
    own = (f"{lines}\n{text}" if lines else text)[:MAX_EMBED_CHARS]
    if context and context.strip() and len(own) < MAX_EMBED_CHARS:
        own = f"{own}\n{context.strip()[:MAX_CONTEXT_CHARS]}"[:MAX_EMBED_CHARS]
    return own
