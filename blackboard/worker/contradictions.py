"""Contradictions settled by a vote (``memory.contradictions = "vote"``).

When a new version of a subject key contradicts the current one (another
agent, another text; :mod:`blackboard.worker.supersession` decides), the
ingest transaction stores it contested (``contested_by`` = a proposal id) and
records the contest in ``bb_memory_contests``; the incumbent stays current.
Then:

1. **Proposal.** :class:`ContradictionPublisher` (a task of every worker)
   publishes the contest's proposal on ``BB_VOTE`` as the worker identity,
   signed by its key (the proposer is the worker's principal): candidates are
   the two memory ids, the incumbent first (the status quo wins a tie), the
   question carries both texts, any agent may vote (``voters`` null), the
   deadline is ``memory.vote_deadline`` away, and the target entry is
   ``contradictions/<subject key>`` of the board (the committer writes the
   winning memory id there; :func:`entry_key`). The contest table is an outbox: published
   contests are marked, so a crash between the ingest transaction and the
   publish loses nothing; the publish is idempotent (the proposal id is
   derived from the challenger's id and version, and a proposal subject takes
   one message). A proposal id taken first by someone else's proposal (not a
   worker's, or with other candidates) is not adopted: the contest moves to
   the next free id.
2. **Outcome.** The committer records the outcome like any vote's. When the
   worker stores it (:func:`settle_outcomes`, called by the votes handler in
   the transaction that stores the outcome row, so a replay settles the same
   way), the winner is the accepted candidate, or the incumbent when nothing
   was accepted (rejected, no quorum): a winning challenger joins the key's
   versions (current unless a newer version was written meanwhile; the
   incumbent is closed at the challenger's valid_from), a losing one is closed
   at its own valid_from (it was never valid), superseded by the incumbent, and
   keeps ``contested_by`` (the vote that rejected it). A contest whose incumbent
   was forgotten meanwhile goes to the challenger.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from nats.aio.client import Client as NATS
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from blackboard.client.consensus import WORKER_KIND, VoteStore
from blackboard.consensus.log import decode_proposal
from blackboard.db import supersession_sql as q
from blackboard.protocol.errors import (
    BlackboardError,
    ConflictError,
    InvalidKeyError,
    InvalidPayloadError,
)
from blackboard.protocol.schemas import Outcome, Policy, Proposal
from blackboard.protocol.subjects import Header, encode_key
from blackboard.settings import Settings
from blackboard.worker._tasks import first_of
from blackboard.worker.ingest import RETRYABLE, backoff_delays, error_line
from blackboard.worker.stream_handler import Conn
from blackboard.worker.supersession import CONTEST_PREFIX, lock_keys, settle_keys

__all__ = [
    "CONTRADICTION_SECTION",
    "ContestRow",
    "ContradictionPublisher",
    "contest_proposal",
    "entry_key",
    "settle_outcomes",
    "winner_of",
]

log = logging.getLogger("blackboard.worker.contradictions")

#: The board section of the entries a contradiction's accepted outcome is applied to
#: (``contradictions/<subject key>``: the winning memory's id).
CONTRADICTION_SECTION = "contradictions"
#: Characters of each memory's text quoted in a proposal's question.
_QUOTE_CHARS = 1000
#: Other ids a contest tries when its own was taken by someone else's proposal.
_MAX_RENAMES = 8
#: Contests published per pass.
_BATCH = 64
#: Seconds between passes when nothing wakes the publisher.
_POLL = 1.0


@dataclass(frozen=True, slots=True)
class ContestRow:
    """An unpublished contest with its two memories as stored (``None`` texts: gone)."""

    board: str
    proposal_id: str
    subject_key: str
    challenger: str
    challenger_seq: int
    incumbent: str
    incumbent_seq: int
    challenger_text: str | None = None
    challenger_agent: str | None = None
    challenger_from: datetime | None = None
    incumbent_text: str | None = None
    incumbent_agent: str | None = None
    incumbent_from: datetime | None = None


def _quote(text: str) -> str:
    return text if len(text) <= _QUOTE_CHARS else text[:_QUOTE_CHARS] + "…"


def contest_proposal(c: ContestRow, *, proposer: str, now: datetime, deadline: float,
                     proposal_id: str | None = None) -> Proposal:
    """The proposal of a contest (pure): candidates ``[incumbent id, challenger id]``, open to
    any agent until ``now + deadline`` seconds, majority of the cast ballots.

    Raises:
        ValueError: a memory of the contest is gone (no text).
    """
    if c.incumbent_text is None or c.challenger_text is None:
        raise ValueError("a memory of the contest is gone")
    question = (
        f"Two memories contradict each other about {c.subject_key!r}. Which one is right?\n"
        f"[0] {c.incumbent} (current; by {c.incumbent_agent}, valid from {_iso(c.incumbent_from)}): "
        f"{_quote(c.incumbent_text)}\n"
        f"[1] {c.challenger} (new; by {c.challenger_agent}, valid from {_iso(c.challenger_from)}): "
        f"{_quote(c.challenger_text)}")
    return Proposal(id=proposal_id or c.proposal_id, board=c.board, section=CONTRADICTION_SECTION,
                    key=entry_key(c.subject_key), question=question, candidates=[c.incumbent, c.challenger],
                    policy=Policy(), voters=None, proposer=proposer, created_at=now,
                    deadline=now + timedelta(seconds=deadline))


def entry_key(subject_key: str) -> str:
    """The key of a contest's target entry (``contradictions/<key>``): the subject key, or
    ``sha256-`` and its digest when the subject key is too long for a board key once encoded."""
    try:
        encode_key(subject_key)
    except InvalidKeyError:
        return "sha256-" + hashlib.sha256(subject_key.encode()).hexdigest()
    return subject_key


def _iso(t: datetime | None) -> str:
    return "?" if t is None else t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def winner_of(status: str, value: Any, incumbent: str, challenger: str) -> str:
    """The memory id a contest's outcome makes the winner (pure): the accepted candidate;
    the incumbent (the status quo) when none was accepted."""
    if status == "accepted" and value == challenger:
        return challenger
    return incumbent


# -- settling an outcome (the votes handler's transaction) -------------------------

async def settle_outcomes(conn: Conn, outcomes: Sequence[Outcome]) -> int:
    """Settle the contests the stored ``outcomes`` decide (others are ignored). Returns
    how many contests were settled. Idempotent."""
    decided: dict[tuple[str, str], Outcome] = {}
    for o in outcomes:
        if o.proposal_id.startswith(CONTEST_PREFIX):
            decided.setdefault((o.board, o.proposal_id), o)
    if not decided:
        return 0
    refs = sorted(decided)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(q.SELECT_CONTESTS_OF, {"boards": [b for b, _ in refs], "pids": [p for _, p in refs]})
        contests = await cur.fetchall()
    # All their keys at once, in the one order every writer of versions takes them in.
    await lock_keys(conn, [(c["board"], c["subject_key"]) for c in contests])
    for c in contests:
        o = decided[(c["board"], c["proposal_id"])]
        await _settle(conn, c, o.status, o.value, o.decided_at)
    return len(contests)


async def _settle(conn: Conn, c: Mapping[str, Any], status: str, value: Any, decided_at: datetime) -> None:
    winner = winner_of(status, value, c["incumbent"], c["challenger"])
    won = winner == c["challenger"] or not c["incumbent_exists"]
    if won:
        winner = c["challenger"]
    board, key, pid = c["board"], c["subject_key"], c["proposal_id"]
    if c["challenger_contested_by"] == pid and c["challenger_from"] is not None:
        await lock_keys(conn, [(board, key)])
        await conn.execute(q.SETTLE_CHALLENGER, {"won": won, "winner": winner, "board": board,
                                                 "challenger": c["challenger"], "seq": c["challenger_seq"],
                                                 "pid": pid})
        await settle_keys(conn, {(board, key): (c["challenger_from"], int(c["challenger_seq"]))})
    await conn.execute(q.MARK_DECIDED, {"board": board, "pid": pid, "decided_at": decided_at, "winner": winner})


# -- publishing proposals (the worker's task) -----------------------------------------

class ContradictionPublisher:
    """Publishes the proposals of contests opened at ingest (the outbox ``bb_memory_contests``).

    Runs in every worker that has contradictions go to a vote (racing replicas publish
    each proposal once: a proposal subject takes one message). Use ``await p.run(stop)``
    under the worker's supervisor; :meth:`wake` after a memory batch was written.

    Args:
        pool: the worker's PostgreSQL pool.
        nc: the worker identity's NATS connection (proposals are signed by its key).
        settings: ``memory.vote_deadline``, ``worker.name``.
    """

    def __init__(self, pool: AsyncConnectionPool, nc: NATS, settings: Settings) -> None:
        self._pool = pool
        self._settings = settings
        self.store = VoteStore(nc, settings, name=settings.worker.name)
        self._wake = asyncio.Event()
        #: Proposals published (or found published) since start.
        self.published = 0

    def wake(self) -> None:
        """Memories were written: look for new contests soon."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Publish pending contests whenever woken (at least every second) until ``stop``."""
        delay = backoff_delays(0.05, self._settings.worker.max_backoff)
        try:
            while not stop.is_set():
                self._wake.clear()
                try:
                    while not stop.is_set() and await self.publish_once() == _BATCH:
                        pass
                except (*RETRYABLE, BlackboardError) as exc:
                    wait = delay()
                    log.warning("contradictions: %s; retrying in %.2fs", error_line(exc), wait)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), wait)
                    continue
                delay = backoff_delays(0.05, self._settings.worker.max_backoff)
                await first_of(stop, self._wake, timeout=_POLL)
        finally:
            await self.store.close()

    async def publish_once(self) -> int:
        """One pass: publish up to a batch of pending contests. Returns how many were pending."""
        async with self._pool.connection() as conn:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(q.SELECT_UNPROPOSED, {"n": _BATCH})
                rows = [ContestRow(**r) for r in await cur.fetchall()]
        for row in rows:
            await self._publish(row)
        return len(rows)

    async def _publish(self, c: ContestRow) -> None:
        if c.challenger_text is None:
            # The challenger is gone or is another version now: nothing to decide.
            async with self._pool.connection() as conn:
                await conn.execute(q.DROP_CONTEST, {"board": c.board, "pid": c.proposal_id})
            return
        if c.incumbent_text is None:
            # The incumbent was forgotten meanwhile: the challenger takes its place unopposed.
            await self._adopt(c, c.proposal_id, decided=("accepted", c.challenger, datetime.now(UTC)))
            return
        pid = c.proposal_id
        for attempt in range(_MAX_RENAMES + 1):
            pid = c.proposal_id if attempt == 0 else f"{c.proposal_id}-{attempt}"
            try:
                proposal = contest_proposal(c, proposer=self.store.name, now=datetime.now(UTC),
                                            deadline=self._settings.memory.vote_deadline, proposal_id=pid)
            except ValueError as exc:
                # Not a valid proposal (not expected): no vote can settle it, so it is settled as
                # the default policy would have, rather than block the outbox.
                log.error("contradictions: contest %s.%s cannot be proposed (%s); the challenger supersedes",
                          c.board, c.proposal_id, exc)
                await self._adopt(c, c.proposal_id, decided=("accepted", c.challenger, datetime.now(UTC)))
                return
            try:
                await self.store.publish_proposal(proposal)
                break
            except ConflictError:
                if await self._ours(c, pid):
                    break
                log.warning("contradictions: proposal id %s.%s is taken by a proposal the worker did not "
                            "make; trying another", c.board, pid)
        else:
            log.error("contradictions: no free proposal id for %s.%s", c.board, c.proposal_id)
            return
        await self._adopt(c, pid)
        self.published += 1

    async def _ours(self, c: ContestRow, pid: str) -> bool:
        """Whether the proposal stored under ``pid`` is this contest's, made by a worker."""
        msg = await self.store.read(c.board, pid, "proposal")
        if msg is None or not msg.trusted:
            return False
        try:
            proposal = decode_proposal(msg.data, msg.headers)
        except InvalidPayloadError:
            return False
        if (proposal.board, proposal.id) != (c.board, pid) or proposal.key != entry_key(c.subject_key) \
                or proposal.candidates != [c.incumbent, c.challenger]:
            return False
        verifier = self.store.signing.verifier
        if verifier is None:
            return True  # an open bus: nothing is signed, nothing to check
        info = verifier.keys.lookup(msg.headers.get(Header.SIG_KEY.value, ""))
        return proposal.proposer == self.store.name or (info is not None and info.kind == WORKER_KIND)

    async def _adopt(self, c: ContestRow, pid: str,
                     decided: tuple[str, Any, datetime] | None = None) -> None:
        """Mark the contest published under ``pid`` and settle it if its outcome is stored already."""
        async with self._pool.connection() as conn, conn.transaction():
            # The key first, like every writer of its versions (then the challenger's row).
            await lock_keys(conn, [(c.board, c.subject_key)])
            await conn.execute(q.ADOPT_CONTEST, {"board": c.board, "old": c.proposal_id, "pid": pid})
            if decided is None:
                cur = await conn.execute(q.SELECT_OUTCOME, (c.board, pid))
                row = await cur.fetchone()
                if row is not None:
                    decided = (str(row[0]), row[1], row[2])
            if decided is None:
                return
            async with conn.cursor(row_factory=dict_row) as cur2:
                await cur2.execute(q.SELECT_CONTESTS_OF, {"boards": [c.board], "pids": [pid]})
                contests = await cur2.fetchall()
            for contest in contests:
                await _settle(conn, contest, *decided)
