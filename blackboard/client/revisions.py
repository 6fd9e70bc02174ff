"""The revisions a board store has seen of each key: what its latest-value reads must not go below.

In a replicated (R3) stream with ``allow_direct``, any replica answers a
direct get and the client's own server is preferred, so a follower that has
not applied a write yet (or a node restarted and catching up) may answer with
an older revision, or with 404, right after this very client's acknowledged
write. :class:`SeenRevisions` keeps, per key subject, the highest revision the
store wrote (an acknowledged put, update, delete, pipelined write) or returned
from a latest-value read; the store reads again when a direct get answers
older (:meth:`blackboard.client.board_store.BoardStore.get`). The vote store
keeps one too, of stream sequences per proposal (keyed by the proposal's filter
subject, :class:`blackboard.client.consensus.VoteStore`). Pure: no IO.

An expiring write (``Nats-TTL``) is held only until its TTL has run out on
this host's clock, counted from its acknowledgement (so never before the
server removed it): the server then serves the key's previous revision again,
or nothing, and that is the key's state. A read of an expiring revision (or
of a server expiry marker) is not held at all.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["SEEN_SUBJECTS", "SeenRevisions"]

#: Subjects whose highest revision a store remembers; past that the oldest remembered go first.
SEEN_SUBJECTS = 65_536


class SeenRevisions:
    """The highest revision seen per key subject, bounded (the oldest inserted go first).

    The hot path reads :attr:`revisions` directly (one dict lookup); the rest is here.

    Args:
        limit: how many subjects are remembered at most.
    """

    __slots__ = ("_expiring", "limit", "revisions")

    def __init__(self, limit: int = SEEN_SUBJECTS) -> None:
        self.limit = limit
        #: subject -> the highest revision written or read (a plain mapping to look up).
        self.revisions: OrderedDict[str, int] = OrderedDict()
        #: subject -> the monotonic time after which its remembered (expiring) revision may be gone.
        self._expiring: dict[str, float] = {}

    def saw(self, subject: str, revision: int) -> bool:
        """Remember ``revision`` of ``subject`` if it is newer than the one remembered; True if so."""
        revisions = self.revisions
        if revisions.get(subject, 0) >= revision:
            return False
        revisions[subject] = revision
        if len(revisions) > self.limit:
            old, _ = revisions.popitem(last=False)
            self._expiring.pop(old, None)
        if self._expiring:
            self._expiring.pop(subject, None)
        return True

    def wrote(self, subject: str, revision: int, expires_at: float | None = None) -> None:
        """Remember this store's acknowledged write; ``expires_at`` (monotonic seconds: the ack's
        time plus its TTL) for an expiring one, which is no longer insisted on after then."""
        if self.saw(subject, revision) and expires_at is not None:
            self._expiring[subject] = expires_at
            if len(self._expiring) > self.limit:
                del self._expiring[next(iter(self._expiring))]

    def expired(self, subject: str, now: float) -> bool:
        """Whether ``subject``'s remembered revision was an expiring write whose TTL has run out."""
        deadline = self._expiring.get(subject) if self._expiring else None
        return deadline is not None and now >= deadline

    def forget(self, subject: str) -> None:
        """Stop insisting on any revision of ``subject``."""
        self.revisions.pop(subject, None)
        self._expiring.pop(subject, None)

    def __len__(self) -> int:
        return len(self.revisions)
