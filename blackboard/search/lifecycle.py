"""The search service's memory lifecycle endpoints: ``prune``, ``archive`` and ``restore``,
with the principal's rights (docs/security.md, "Who may prune").

The principal is the one the request's subject names (``bb.search.<principal>.<endpoint>``),
its rights the policy's. The rule, on the board the request names:

* its **own** memories (whose ``agent`` is the principal): ``write`` on the board;
* **every author's** (a prune with ``scope="all"``) or **another agent's** memory by id
  (archive, restore): ``admin`` on the board (a worker or an operator holds every right).

A refusal is :class:`~blackboard.protocol.errors.PermissionDeniedError` naming the board and
why, raised before anything is changed: an archive or restore naming one memory of another
author without ``admin`` archives (restores) none of them. A dry run is checked alike. The
work is :mod:`blackboard.search.archive`'s (as ``blackboard prune``'s), never a hard delete.
"""

from __future__ import annotations

from collections.abc import Mapping

from psycopg_pool import AsyncConnectionPool

from blackboard.protocol.errors import (
    ConfigurationError,
    InvalidPayloadError,
    PermissionDeniedError,
)
from blackboard.protocol.schemas.prune import (
    MAX_PRUNE_LIMIT,
    MemoryArchiveRequest,
    MemoryArchiveResponse,
    MemoryPruneRequest,
    MemoryPruneResponse,
    MemoryRestoreRequest,
    MemoryRestoreResponse,
    PruneScope,
)
from blackboard.search.archive import AuthorCheck, archive, prune, restore
from blackboard.security.policy import Right, Rights
from blackboard.settings import MemorySettings

__all__ = ["archive_memories", "check_authors", "check_prune", "prune_memories", "restore_memories"]

#: How many ids of other agents' memories a refusal names.
_NAMED = 5


def check_prune(rights: Rights, board: str, scope: PruneScope, what: str = "prune") -> None:
    """Refuse when ``rights`` may not ``what`` (prune, archive, restore) memories of ``board``
    with ``scope``: ``"own"`` needs ``write`` on the board, ``"all"`` needs ``admin``.

    Raises:
        PermissionDeniedError: naming the board and why (``operation``: ``"<what> on board
            <board>"``, or ``"<what> all on board <board>"``).
    """
    if scope == "all":
        if not rights.can(board, Right.ADMIN):
            raise PermissionDeniedError(
                f"{rights.principal!r} may not {what} every author's memories of board {board!r}: "
                f"scope 'all' needs admin on the board (scope 'own' touches only its own)",
                operation=f"{what} all on board {board}")
    elif not rights.can(board, Right.WRITE):
        raise PermissionDeniedError(
            f"{rights.principal!r} may not {what} its memories of board {board!r}: it may not write there",
            operation=f"{what} on board {board}")


def check_authors(rights: Rights, board: str, what: str) -> AuthorCheck:
    """The check an archive or restore by id runs on the authors of the memories it found:
    another agent's memory needs ``admin`` on ``board``.

    The check raises :class:`PermissionDeniedError` naming the board, up to five of the others'
    ids and why (``operation``: ``"<what> another agent's memories on board <board>"``).
    """
    def check(authors: Mapping[str, str]) -> None:
        others = sorted(mid for mid, agent in authors.items() if agent != rights.principal)
        if others and not rights.can(board, Right.ADMIN):
            named = ", ".join(others[:_NAMED]) + (f" and {len(others) - _NAMED} more" if len(others) > _NAMED else "")
            raise PermissionDeniedError(
                f"{rights.principal!r} may not {what} other agents' memories of board {board!r} ({named}): "
                f"that needs admin on the board; nothing was changed",
                operation=f"{what} another agent's memories on board {board}")

    return check


async def prune_memories(pool: AsyncConnectionPool, memory: MemorySettings, req: MemoryPruneRequest,
                         rights: Rights) -> MemoryPruneResponse:
    """Run :class:`MemoryPruneRequest` as ``rights`` allow: ``scope="own"`` over the principal's
    own memories of the board, ``"all"`` over every author's.

    Raises:
        PermissionDeniedError: see :func:`check_prune`.
        InvalidPayloadError: the threshold is out of the strategy's range (or max_per_board has
            none, and no ``memory.max_per_board`` is set).
        StorageError: PostgreSQL failed.
    """
    check_prune(rights, req.board, req.scope)
    try:
        async with pool.connection() as conn:
            report = await prune(conn, memory, req.strategy, threshold=req.threshold, board=req.board,
                                 agent=rights.principal if req.scope == "own" else None, dry_run=req.dry_run,
                                 limit=req.limit or MAX_PRUNE_LIMIT)
    except ConfigurationError as exc:
        raise InvalidPayloadError(f"invalid prune: {exc}") from exc
    ids = [p.id for p in report.memories]
    return MemoryPruneResponse(board=req.board, strategy=req.strategy, scope=req.scope, ids=ids, count=len(ids),
                               dry_run=req.dry_run)


async def archive_memories(pool: AsyncConnectionPool, req: MemoryArchiveRequest,
                           rights: Rights) -> MemoryArchiveResponse:
    """Run :class:`MemoryArchiveRequest` as ``rights`` allow (own memories: ``write``; another
    agent's: ``admin``; all or nothing).

    Raises:
        PermissionDeniedError: see :func:`check_prune` and :func:`check_authors`.
        StorageError: PostgreSQL failed.
    """
    check_prune(rights, req.board, "own", "archive")
    async with pool.connection() as conn:
        report = await archive(conn, req.ids, board=req.board, reason=req.reason, dry_run=req.dry_run,
                               check=check_authors(rights, req.board, "archive"))
    return MemoryArchiveResponse(board=req.board, archived=report.archived, missing=report.missing,
                                 refused=report.refused, dry_run=req.dry_run)


async def restore_memories(pool: AsyncConnectionPool, req: MemoryRestoreRequest,
                           rights: Rights) -> MemoryRestoreResponse:
    """Run :class:`MemoryRestoreRequest` as ``rights`` allow (as :func:`archive_memories`).

    Raises:
        PermissionDeniedError: see :func:`check_prune` and :func:`check_authors`.
        StorageError: PostgreSQL failed.
    """
    check_prune(rights, req.board, "own", "restore")
    async with pool.connection() as conn:
        report = await restore(conn, req.ids, board=req.board, check=check_authors(rights, req.board, "restore"))
    # A memory of another board is not found on this one (its board is not told: it may not be readable).
    refused = {mid: "not found" if why.startswith("on board ") else why for mid, why in report.refused.items()}
    return MemoryRestoreResponse(board=req.board, restored=report.restored, refused=refused)
