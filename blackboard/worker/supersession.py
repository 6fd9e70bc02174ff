"""Supersession: the memories of a subject key as versions in valid time.

A memory written with a subject key (wire field ``key``) is a version of what
that key says. The versions of one ``(board, subject_key)`` are ordered by
``(valid_from, seq)``: valid time (the event time ``occurred_at``, else the
write time), then stream order. Each version is closed by the next one
(``valid_to`` = the next's ``valid_from``, ``superseded_by`` = the next's id);
the newest is open (``valid_to`` NULL): the current version. The chain is a
pure function of the stored versions, so it comes out the same whatever order
the batches that wrote them committed in (:func:`plan_key`).

Which memories are in the chain: those neither merged into another memory
(``merged_into``) nor contested (``contested_by``: a challenger waiting for a
vote, or one a vote rejected; :mod:`blackboard.worker.contradictions`).
Archived (pruned) versions stay in it: pruning the current version leaves the
key without a current one rather than bringing an older value back.

Contradictions: when ``memory.contradictions`` is ``vote`` on a board (one
matching ``memory.vote_boards``), a new version that would become the current
one, written by another agent than the current version's and saying something
else (another content hash), does not supersede it: it is stored contested by
a proposal and the incumbent stays current until the vote's outcome
(:mod:`blackboard.worker.contradictions` publishes the proposal and settles
the outcome). An agent's new version of its own fact, an older version arriving
late (backfill) and a repeat of the current text are not contradictions.

Each new version is settled in the transaction that stores it, under its
key's advisory lock. Where contradictions go to a vote, whether it contests is
decided once (``checked_seq`` = its ``seq``): a redelivered batch settles
nothing twice, a new version of the same id is settled afresh. Elsewhere
nothing needs remembering (a redelivered batch links the same chain), so a
new version that becomes the current one costs no write of its row.
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from psycopg.rows import dict_row

from blackboard.db import supersession_sql as q
from blackboard.settings import MemorySettings
from blackboard.worker.stream_handler import Conn

__all__ = [
    "CONTEST_PREFIX",
    "Contest",
    "ContradictionPolicy",
    "KeyChanges",
    "KeyPlan",
    "Position",
    "Version",
    "VersionUpdate",
    "contest_id",
    "keys_before_write",
    "lock_keys",
    "plan_key",
    "settle_keys",
    "settle_written",
]

#: A position in a key's versions: (valid_from, seq).
Position = tuple[datetime, int]
#: The key of a subject's versions: (board, subject_key).
KeyRef = tuple[str, str]
#: Proposal ids of contradictions start with this.
CONTEST_PREFIX = "contradiction-"


@dataclass(frozen=True, slots=True)
class ContradictionPolicy:
    """What a contradiction does on a board: supersede (the default) or go to a vote.

    Built from ``memory.contradictions`` and ``memory.vote_boards`` (board name globs,
    matched case-sensitively like the boards themselves; none: every board).
    """

    mode: Literal["supersede", "vote"] = "supersede"
    boards: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, memory: MemorySettings) -> ContradictionPolicy:
        """The policy of ``settings.memory``."""
        return cls(memory.contradictions, tuple(memory.vote_boards))

    def votes_on(self, board: str) -> bool:
        """Whether a contradiction on ``board`` goes to a vote."""
        if self.mode != "vote":
            return False
        return not self.boards or any(fnmatch.fnmatchcase(board, glob) for glob in self.boards)


@dataclass(frozen=True, slots=True)
class Version:
    """A stored memory of a subject key, as read for settling its key."""

    mid: int
    id: str
    seq: int
    agent: str
    valid_from: datetime
    content_hash: bytes | None = None
    valid_to: datetime | None = None
    superseded_by: str | None = None
    contested_by: str | None = None
    checked_seq: int | None = None
    merged: bool = False
    archived: bool = False

    @property
    def position(self) -> Position:
        """Its place among its key's versions."""
        return (self.valid_from, self.seq)


@dataclass(frozen=True, slots=True)
class VersionUpdate:
    """The version columns a memory is to have."""

    mid: int
    valid_to: datetime | None
    superseded_by: str | None
    contested_by: str | None
    checked_seq: int | None


@dataclass(frozen=True, slots=True)
class Contest:
    """A contradiction put to a vote: the challenger against the current version."""

    board: str
    subject_key: str
    proposal_id: str
    challenger: Version
    incumbent: Version


@dataclass
class KeyPlan:
    """What settling one key changes: rows to update, contests to open."""

    updates: list[VersionUpdate] = field(default_factory=list)
    contests: list[Contest] = field(default_factory=list)


def contest_id(board: str, memory_id: str, seq: int) -> str:
    """The proposal id of the contest a version of a memory opens (pure, the same for
    every worker and every replay): ``contradiction-`` and 40 hex digits."""
    digest = hashlib.sha256(f"{board}\n{memory_id}\n{seq}".encode()).hexdigest()
    return CONTEST_PREFIX + digest[:40]


def _same_text(a: Version, b: Version) -> bool:
    return a.content_hash is not None and a.content_hash == b.content_hash


def plan_key(board: str, key: str, versions: Sequence[Version], *, vote: bool,
             fresh: Collection[tuple[str, int]] = ()) -> KeyPlan:
    """Settle one key's versions (pure).

    ``versions``: the key's memories from the chain version before the first one
    that changed (or from the first) on, in any order. ``fresh``: ``(id, seq)`` of
    the versions the caller just wrote. Those not settled yet (with ``vote``,
    ``checked_seq`` is not their ``seq``) are settled in stream order, each seeing
    the versions settled before it: what an earlier version of the id was (contested,
    closed) is void; with ``vote``, one that would become the current version against
    a current version of another agent saying something else opens a
    :class:`Contest` (it is stored contested), and is marked checked; any other joins
    the chain. Then the chain (versions neither merged nor contested) is linked in
    ``(valid_from, seq)`` order. Returns the rows whose columns change.
    """
    state: dict[int, list[Any]] = {
        v.mid: [v.valid_to, v.superseded_by, v.contested_by, v.checked_seq] for v in versions}
    new = [v for v in versions
           if (v.id, v.seq) in fresh and not v.merged and not (vote and v.checked_seq == v.seq)]
    settled = {v.mid for v in versions} - {v.mid for v in new}
    plan = KeyPlan()

    def in_chain(v: Version) -> bool:
        return not v.merged and v.mid in settled and state[v.mid][2] is None

    for v in sorted(new, key=lambda v: v.seq):
        st = state[v.mid]
        st[0] = st[1] = st[2] = None  # what an earlier version of this id was is void
        if vote:
            st[3] = v.seq
            chain = [w for w in versions if w.mid != v.mid and in_chain(w)]
            if not any(w.position > v.position for w in chain):
                before = [w for w in chain if w.position < v.position]
                incumbent = max(before, key=lambda w: w.position) if before else None
                if (incumbent is not None and not incumbent.archived and incumbent.agent != v.agent
                        and not _same_text(incumbent, v)):
                    contest = Contest(board, key, contest_id(board, v.id, v.seq), v, incumbent)
                    st[2] = contest.proposal_id
                    plan.contests.append(contest)
        settled.add(v.mid)

    chain = sorted((v for v in versions if in_chain(v)), key=lambda v: v.position)
    for i, v in enumerate(chain):
        nxt = chain[i + 1] if i + 1 < len(chain) else None
        state[v.mid][0] = None if nxt is None else nxt.valid_from
        state[v.mid][1] = None if nxt is None else nxt.id
    for v in versions:
        st = state[v.mid]
        if st != [v.valid_to, v.superseded_by, v.contested_by, v.checked_seq]:
            plan.updates.append(VersionUpdate(v.mid, st[0], st[1], st[2], st[3]))
    return plan


# -- IO ------------------------------------------------------------------------

async def lock_keys(conn: Conn, keys: Iterable[KeyRef]) -> None:
    """Take the keys' advisory locks for the transaction (in hash order)."""
    refs = sorted(set(keys))
    if refs:
        await conn.execute(q.LOCK_KEYS, {"boards": [b for b, _ in refs], "keys": [k for _, k in refs]})


@dataclass
class KeyChanges:
    """The keys a batch changes, found before it is written (:func:`keys_before_write`)."""

    #: Each key changed, with the first position in it that changes.
    starts: dict[KeyRef, Position] = field(default_factory=dict)
    #: The batch's ids that were stored with a subject key.
    keyed_before: set[str] = field(default_factory=set)


async def keys_before_write(conn: Conn, ids: Sequence[str], new: Iterable[tuple[str, str, Position]],
                            *, lock: bool = True) -> KeyChanges:
    """The keys a batch changes and, for each, the first position that changes: the new
    versions' (``new``: board, key, position) and where the batch's ids were before (a new
    version of an id may move it in valid time, or take it off its key). With ``lock``,
    takes the keys' locks (before the rows are written, so that two batches changing one
    key, e.g. one writing a version and the other moving an older one, never wait for each
    other's rows while holding their keys).
    """
    changes = KeyChanges()
    starts = changes.starts

    def at(key: KeyRef, pos: Position) -> None:
        if key not in starts or pos < starts[key]:
            starts[key] = pos

    for board, key, pos in new:
        at((board, key), pos)
    if ids:
        cur = await conn.execute(q.OLD_KEYS, (list(ids),))
        for mid_id, board, key, valid_from, seq in await cur.fetchall():
            at((board, key), (valid_from, int(seq)))
            changes.keyed_before.add(mid_id)
    if lock:
        await lock_keys(conn, starts)
    return changes


async def settle_written(conn: Conn, changes: KeyChanges, written: Sequence[tuple[str, int, str | None]],
                         policy: ContradictionPolicy | None = None) -> list[Contest]:
    """Settle what a batch wrote (``written``: id, seq and subject key of each memory), the
    keys' locks held: a version now without a key is no longer closed nor contested, and the
    keys changed are settled (:func:`settle_keys`)."""
    unkeyed = [(i, seq) for i, seq, key in written if key is None and i in changes.keyed_before]
    if unkeyed:
        await conn.execute(q.CLEAR_VERSIONS, {"ids": [i for i, _ in unkeyed], "seqs": [n for _, n in unkeyed]})
    fresh = {(i, seq) for i, seq, key in written if key is not None}
    return await settle_keys(conn, changes.starts, policy, fresh)


def _version(r: Mapping[str, Any]) -> Version:
    return Version(mid=int(r["mid"]), id=r["id"], seq=int(r["seq"]), agent=r["agent"], valid_from=r["valid_from"],
                   content_hash=None if r["content_hash"] is None else bytes(r["content_hash"]),
                   valid_to=r["valid_to"], superseded_by=r["superseded_by"], contested_by=r["contested_by"],
                   checked_seq=None if r["checked_seq"] is None else int(r["checked_seq"]),
                   merged=bool(r["merged"]), archived=bool(r["archived"]))


async def settle_keys(conn: Conn, starts: Mapping[KeyRef, Position],
                      policy: ContradictionPolicy | None = None,
                      fresh: Collection[tuple[str, int]] = ()) -> list[Contest]:
    """Settle the keys from the given positions on (their locks held): the versions just
    written (``fresh``: ``(id, seq)``) settled, contests opened (``bb_memory_contests``,
    for the worker to publish), the chains relinked. Returns the contests opened.
    """
    if not starts:
        return []
    policy = policy or ContradictionPolicy()
    fresh = frozenset(fresh)
    refs = sorted(starts)
    params = {"boards": [b for b, _ in refs], "keys": [k for _, k in refs],
              "froms": [starts[r][0] for r in refs], "seqs": [starts[r][1] for r in refs]}
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(q.LOAD_VERSIONS, params)
        rows = await cur.fetchall()
    by_key: dict[KeyRef, list[Version]] = {}
    for r in rows:
        by_key.setdefault((r["board"], r["subject_key"]), []).append(_version(r))
    updates: list[VersionUpdate] = []
    contests: list[Contest] = []
    for (board, key), versions in by_key.items():
        plan = plan_key(board, key, versions, vote=policy.votes_on(board), fresh=fresh)
        updates += plan.updates
        contests += plan.contests
    if updates:
        await conn.execute(q.UPDATE_VERSIONS, {
            "mids": [u.mid for u in updates], "valid_to": [u.valid_to for u in updates],
            "superseded_by": [u.superseded_by for u in updates], "contested_by": [u.contested_by for u in updates],
            "checked_seq": [u.checked_seq for u in updates]})
    if contests:
        await conn.execute(q.INSERT_CONTESTS, {
            "boards": [c.board for c in contests], "pids": [c.proposal_id for c in contests],
            "keys": [c.subject_key for c in contests], "challengers": [c.challenger.id for c in contests],
            "challenger_seqs": [c.challenger.seq for c in contests],
            "incumbents": [c.incumbent.id for c in contests],
            "incumbent_seqs": [c.incumbent.seq for c in contests]})
    return contests
