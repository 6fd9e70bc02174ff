"""What a principal's search may read (pure): its requests restricted to its rights.

The search service reads the principal from the request's subject
(``bb.search.<principal>.<endpoint>``, which the server lets only that
principal publish on) and its :class:`~blackboard.security.policy.Rights`
from the policy; these functions turn a request into the one it may run:

* entries, memories: only boards it may ``read``; a request naming another
  board is refused (:class:`PermissionDeniedError`), one naming no board is
  restricted to the readable boards;
* history, as-of: the key's board must be readable;
* memory (one memory by id), searchable: the board named must be readable;
* messages (:func:`message_scope`): its own direct messages, by the subject
  they were stored under (never by a sender or recipient field of the
  payload), broadcasts of readable boards, topic messages within its topic
  patterns.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

from blackboard.db.messages_sql import MessageScope
from blackboard.protocol.errors import PermissionDeniedError
from blackboard.protocol.schemas.search import EntrySearchRequest, MemorySearchRequest
from blackboard.protocol.subjects import Subjects, pattern_regex
from blackboard.security.policy import Right, Rights

__all__ = ["RightsLookup", "check_boards", "message_scope", "scoped_search"]

_Search = TypeVar("_Search", MemorySearchRequest, EntrySearchRequest)


class RightsLookup(Protocol):
    """Where the system service finds a principal's rights:
    :class:`~blackboard.security.source.RightsSource` (the policy file, or the open bus) or an
    :class:`~blackboard.security.policy.AccessPolicy`."""

    def rights(self, principal: str) -> Rights | None:
        """The principal's rights; None when it is not declared (refused)."""


def check_boards(rights: Rights, boards: Iterable[str], what: str) -> None:
    """Refuse when ``rights`` may not read one of ``boards``.

    Raises:
        PermissionDeniedError: naming the first board it may not read (``operation``: ``what``
            on that board).
    """
    for board in boards:
        if not rights.can(board, Right.READ):
            raise PermissionDeniedError(f"{rights.principal!r} may not read board {board!r}",
                                        operation=f"{what} on board {board}")


def scoped_search(req: _Search, rights: Rights) -> _Search | None:
    """``req`` as ``rights`` may run it: unchanged when it may read every board it names (or
    every board), else restricted to the boards it may read; None when it may read no board
    (the search finds nothing).

    Raises:
        PermissionDeniedError: the request names a board the principal may not read.
    """
    readable = rights.boards(Right.READ)
    if req.boards:
        check_boards(rights, req.boards, "search memories" if req.target == "memory" else "search entries")
        return req
    if readable is None:
        return req
    if not readable:
        return None
    # A new request (not model_copy: ``filters`` is a cached property, copied with the rest).
    return type(req).model_validate({**req.model_dump(), "boards": sorted(readable)})


def message_scope(rights: Rights) -> MessageScope | None:
    """The stored messages ``rights`` may find (None: every message, for the system)."""
    if rights.kind != "agent":
        return None
    topics = tuple(pattern_regex(Subjects.topic(t)) for t in rights.topics)
    return MessageScope(principal=rights.principal, direct=Subjects.direct(rights.principal), boards=rights.boards(Right.READ),
                        topics=topics)
