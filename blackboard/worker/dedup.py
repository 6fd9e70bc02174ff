"""Exact deduplication of long-term memories: the normalised content hash (pure).

Two memories say the same thing, exactly, when their texts are equal after
normalisation: Unicode NFKC (compatibility forms folded: full-width letters,
ligatures, non-breaking spaces), case folded, runs of whitespace collapsed to one
space, and the ends stripped. :func:`content_hash` is the SHA-256 of that text;
the worker stores it with each memory (``bb_memories.content_hash``) and merges
a new memory into the live one of its scope with the same hash
(docs/memory-lifecycle.md, "Deduplication and consolidation").

:func:`id_locks` and :func:`text_locks` name the advisory locks a batch takes
to merge, so that concurrent batches writing the same id, or the same new text,
commit one after the other (the statements are :mod:`blackboard.db.memory_sql`;
the worker's writer :mod:`blackboard.worker.memories`).
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
    "id_locks",
    "normalize_text",
    "text_locks",
]

#: The advisory lock spaces of exact deduplication: the first of
#: ``pg_advisory_xact_lock``'s two ``int4`` keys ("bb" and a number), for a board, a
#: text in its scope, a memory id. (The worker's other advisory locks use the
#: one-``bigint`` form, a key space of its own.)
LOCK_BOARD = 0x6262_0001
LOCK_TEXT = 0x6262_0002
LOCK_ID = 0x6262_0003
#: A batch with more ids than this locks its boards instead: cheaper under load than one lock
#: per id and per new text (docs/memory-lifecycle.md, "Concurrent writers"; each lock is an entry
#: of PostgreSQL's shared lock table, sized for ``max_locks_per_transaction`` (64)
#: per connection on average).
MAX_ITEM_LOCKS = 64


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
    """Advisory locks a batch takes to merge duplicates, in the order to take them (the
    parameters of ``memory_sql.LOCK_DEDUP_KEYS``)."""

    spaces: list[int]
    keys: list[int]
    #: Taken shared (a board, while its ids and texts are locked one by one).
    shared: list[bool]
    #: The boards are locked exclusively (a batch over ``MAX_ITEM_LOCKS``): no text
    #: lock is needed, no other batch writes them meanwhile.
    coarse: bool = False

    def __len__(self) -> int:
        return len(self.keys)


def _int4(value: int) -> int:
    return value - (1 << 32) if value & 0x8000_0000 else value


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def id_locks(rows: Iterable[Dedupable], *, max_item_locks: int = MAX_ITEM_LOCKS) -> DedupLocks:
    """The locks a batch takes before it merges: its boards shared and the ids of its
    memories (those with a content hash) exclusively, so that two batches writing the
    same id (two versions of it) commit one after the other; a batch with more than
    ``max_item_locks`` ids takes its boards exclusively instead (``coarse``).

    The keys are CRC-32s (a collision only makes two batches wait for each other),
    sorted by (space, key), boards first: every batch takes its locks in one order,
    its ids before its texts (:func:`text_locks`), so none deadlocks another.
    """
    boards: set[int] = set()
    ids: set[int] = set()
    for r in rows:
        if r.content_hash is not None:
            boards.add(_int4(zlib.crc32(_utf8(r.board))))
            ids.add(_int4(zlib.crc32(_utf8(r.id))))
    coarse = len(ids) > max_item_locks
    order = [(LOCK_BOARD, b) for b in sorted(boards)] + ([] if coarse else [(LOCK_ID, i) for i in sorted(ids)])
    return DedupLocks([s for s, _ in order], [k for _, k in order], [not coarse and s == LOCK_BOARD for s, _ in order],
                      coarse)


def text_locks(rows: Iterable[Dedupable], *, per_agent: bool) -> DedupLocks:
    """The locks a batch takes on the texts it is about to store as new memories (each
    text in its scope: board, agent when ``per_agent``, subject key), exclusively: two
    batches storing the same new text commit one after the other, and the later one,
    checking again under the lock, merges its copy into the earlier one's memory."""
    keys: set[int] = set()
    for r in rows:
        digest = r.content_hash
        if digest is not None:
            scope = b"\x1f".join((_utf8(r.board), _utf8(r.agent) if per_agent else b"", _utf8(r.key or "")))
            keys.add(_int4(zlib.crc32(digest, zlib.crc32(scope))))
    ordered = sorted(keys)
    return DedupLocks([LOCK_TEXT] * len(ordered), ordered, [False] * len(ordered))
