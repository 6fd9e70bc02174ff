"""Exact deduplication of long-term memories: the normalised content hash (pure).

Two memories say the same thing, exactly, when their texts are equal after
normalisation: Unicode NFKC (compatibility forms folded: full-width letters,
ligatures, non-breaking spaces), case folded, runs of whitespace collapsed to one
space, and the ends stripped. :func:`content_hash` is the SHA-256 of that text;
the worker stores it with each memory (``bb_memories.content_hash``) and merges
a new memory into the live one of its scope with the same hash
(docs/memory-lifecycle.md, "Deduplication and consolidation").

:func:`lock_keys` names the advisory locks a batch takes before it merges, so
that concurrent batches writing the same text or the same id commit one after
the other (the statements are :mod:`blackboard.db.memory_sql`; the worker's
writer :mod:`blackboard.worker.memories`).
"""

from __future__ import annotations

import hashlib
import unicodedata
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "LOCK_BOARD",
    "LOCK_ID",
    "LOCK_TEXT",
    "MAX_ITEM_LOCKS",
    "DedupLocks",
    "Dedupable",
    "content_hash",
    "lock_keys",
    "normalize_text",
]

#: The advisory lock spaces of exact deduplication: the first of
#: ``pg_advisory_xact_lock``'s two ``int4`` keys ("bb" and a number), for a board, a
#: text in its scope, a memory id. (The worker's other advisory locks use the
#: one-``bigint`` form, a key space of its own.)
LOCK_BOARD = 0x6262_0001
LOCK_TEXT = 0x6262_0002
LOCK_ID = 0x6262_0003
#: A batch needing more text and id locks than this locks its boards instead (each
#: lock is an entry of PostgreSQL's shared lock table, sized for
#: ``max_locks_per_transaction`` (64) per connection on average).
MAX_ITEM_LOCKS = 2048


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


class Dedupable(Protocol):
    """What exact deduplication reads of a memory (:class:`~blackboard.worker.decode.MemoryRow` has it)."""

    @property
    def id(self) -> str: ...
    @property
    def board(self) -> str: ...
    @property
    def agent(self) -> str: ...
    @property
    def key(self) -> str | None: ...
    @property
    def content_hash(self) -> bytes | None: ...


@dataclass(frozen=True, slots=True)
class DedupLocks:
    """The advisory locks a batch takes before it merges duplicates, in the order to take
    them (the parameters of ``memory_sql.LOCK_DEDUP_KEYS``)."""

    spaces: list[int]
    keys: list[int]
    #: Taken shared (a board, while its texts and ids are locked one by one).
    shared: list[bool]

    def __len__(self) -> int:
        return len(self.keys)


def _int4(value: int) -> int:
    return value - (1 << 32) if value & 0x8000_0000 else value


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def lock_keys(rows: Iterable[Dedupable], *, per_agent: bool,
              max_item_locks: int = MAX_ITEM_LOCKS) -> DedupLocks:
    """The locks that make a batch's deduplication safe beside concurrent batches.

    Each text in its scope (board, agent when ``per_agent``, subject key) and each id of
    a memory with a content hash is locked exclusively, its board shared; a batch over
    ``max_item_locks`` text and id locks takes its boards exclusively instead. Two
    batches holding the same text or the same id thus commit one after the other, and
    the later one sees what the earlier stored. The keys are CRC-32s (a collision only
    makes two batches wait for each other). Sorted by (space, key), boards first: every
    batch takes its locks in one order, so none deadlocks another.
    """
    boards: set[int] = set()
    items: set[tuple[int, int]] = set()
    for r in rows:
        digest = r.content_hash
        if digest is None:
            continue
        board = _utf8(r.board)
        scope = b"\x1f".join((board, _utf8(r.agent) if per_agent else b"", _utf8(r.key or "")))
        boards.add(_int4(zlib.crc32(board)))
        items.add((LOCK_TEXT, _int4(zlib.crc32(digest, zlib.crc32(scope)))))
        items.add((LOCK_ID, _int4(zlib.crc32(_utf8(r.id)))))
    coarse = len(items) > max_item_locks
    order = [(LOCK_BOARD, b) for b in sorted(boards)] + ([] if coarse else sorted(items))
    return DedupLocks([s for s, _ in order], [k for _, k in order], [not coarse and s == LOCK_BOARD for s, _ in order])
