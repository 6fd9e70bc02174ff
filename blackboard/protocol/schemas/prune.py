"""Requests and replies of the search service's memory lifecycle endpoints: ``prune``,
``archive`` and ``restore`` (``bb.search.<principal>.<endpoint>``; docs/protocol.md §11,
docs/memory-lifecycle.md "Pruning and archive").

They archive long-term memories (or bring archived ones back) with the principal's rights:
its own memories where it may ``write`` on the board, anyone's where it holds ``admin`` on
the board (docs/security.md, "Who may prune"). A refusal is ``PermissionDeniedError`` (403),
and nothing is changed.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from blackboard.protocol.schemas._base import Id, Name, WireModel

__all__ = [
    "MAX_ARCHIVE_IDS",
    "MAX_PRUNE_LIMIT",
    "PRUNE_STRATEGIES",
    "RESERVED_ARCHIVE_REASONS",
    "MemoryArchiveRequest",
    "MemoryArchiveResponse",
    "MemoryPruneRequest",
    "MemoryPruneResponse",
    "MemoryRestoreRequest",
    "MemoryRestoreResponse",
    "PruneScope",
    "PruneStrategy",
]

#: A prune's strategy (the same as ``blackboard.db.prune_sql.STRATEGIES``; a test holds them equal).
PruneStrategy = Literal["lru", "low_confidence", "old_age", "importance", "max_per_board"]
PRUNE_STRATEGIES: tuple[PruneStrategy, ...] = ("lru", "low_confidence", "old_age", "importance", "max_per_board")
#: Whose memories a prune selects: the principal's own, or every author's (``admin`` on the board).
PruneScope = Literal["own", "all"]

#: The most memories one ``prune`` request archives (its ``limit``, and the default): repeat
#: while a reply's ``count`` reaches it.
MAX_PRUNE_LIMIT = 10_000
#: The most ids one ``archive`` or ``restore`` request names.
MAX_ARCHIVE_IDS = 1000
#: Archive reasons the lifecycle itself gives (merged into another memory, a merge whose
#: sources changed): an ``archive`` request may not give them.
RESERVED_ARCHIVE_REASONS = frozenset({"merged", "conflict"})


def _reason(value: str) -> str:
    if value in RESERVED_ARCHIVE_REASONS:
        raise ValueError(f"the archive reason {value!r} is reserved (not {', '.join(sorted(RESERVED_ARCHIVE_REASONS))})")
    return value


class MemoryPruneRequest(WireModel):
    """``bb.search.<principal>.prune``: archive the memories of ``board`` a strategy selects,
    least worth keeping first (as ``blackboard prune``, never hard). ``scope`` ``"own"``: only
    the principal's own memories (it must hold ``write`` on the board); ``"all"``: every
    author's (``admin`` on the board). A knowledge file's memories (read-only) and those under
    an open contradiction vote are never pruned."""

    v: Literal[1] = 1
    board: Name
    strategy: PruneStrategy = "low_confidence"
    threshold: float | None = Field(None, ge=0, description=(
        "Replaces the strategy's setting: seconds for lru (not used for) and old_age (event time older "
        "than), 0..1 for low_confidence (confidence below) and importance (score below), a count for "
        "max_per_board (all but the N most important; with scope own: of the principal's own memories)."))
    scope: PruneScope = "own"
    dry_run: bool = Field(False, description="Only tell which memories would be archived (the rights are checked alike).")
    limit: int | None = Field(None, ge=1, le=MAX_PRUNE_LIMIT, description=(
        f"At most this many memories (default and most: {MAX_PRUNE_LIMIT})."))


class MemoryPruneResponse(WireModel):
    """The reply to :class:`MemoryPruneRequest`: the ids archived (``dry_run``: that would be),
    least worth keeping first."""

    v: Literal[1] = 1
    board: str
    strategy: str
    scope: str = "own"
    ids: list[str] = Field(default_factory=list)
    count: int = 0
    dry_run: bool = False


class MemoryArchiveRequest(WireModel):
    """``bb.search.<principal>.archive``: archive the memories of ``board`` with these ids
    (``archive_reason`` = ``reason``). Another agent's memory among them needs ``admin`` on the
    board (else the whole request is refused, nothing archived); the principal's own need
    ``write``."""

    v: Literal[1] = 1
    board: Name
    ids: list[Id] = Field(min_length=1, max_length=MAX_ARCHIVE_IDS)
    reason: Annotated[Name, AfterValidator(_reason)] = Field("archived", description=(
        "The archive reason recorded (a name; not merged nor conflict)."))
    dry_run: bool = False


class MemoryArchiveResponse(WireModel):
    """The reply to :class:`MemoryArchiveRequest`."""

    v: Literal[1] = 1
    board: str
    archived: list[str] = Field(default_factory=list, description="Archived now (dry_run: would be), in the order asked.")
    missing: list[str] = Field(default_factory=list, description="No memory of the board has that id.")
    refused: dict[str, str] = Field(default_factory=dict, description=(
        "id -> why it was left: already archived, read-only (a knowledge file's), contested."))
    dry_run: bool = False


class MemoryRestoreRequest(WireModel):
    """``bb.search.<principal>.restore``: bring archived memories of ``board`` back into recall
    (as ``blackboard restore``). Rights as for :class:`MemoryArchiveRequest`."""

    v: Literal[1] = 1
    board: Name
    ids: list[Id] = Field(min_length=1, max_length=MAX_ARCHIVE_IDS)


class MemoryRestoreResponse(WireModel):
    """The reply to :class:`MemoryRestoreRequest`."""

    v: Literal[1] = 1
    board: str
    restored: list[str] = Field(default_factory=list)
    refused: dict[str, str] = Field(default_factory=dict, description=(
        "id -> why not: not found, not archived, merged into <id>, a merge whose sources changed (conflict)."))
