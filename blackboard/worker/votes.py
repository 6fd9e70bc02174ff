"""The worker's part of consensus voting.

* :func:`vote_handler`: persists ``BB_VOTE`` into ``bb_proposals``,
  ``bb_ballots`` and ``bb_outcomes``. Each ballot's fate (counted, superseded,
  rejected and why) is recomputed with the pure tally over the proposal's
  stored ballots whenever its rows change, so PostgreSQL says what the stream
  says.
* :class:`VoteCloser`: follows every proposal, closes the ones whose deadline
  has passed (by publishing a close request whose server timestamp is "now")
  and commits outcomes nobody committed (a committer crashed, or nobody was
  waiting). Its state is rebuilt from the stream on start, so it survives
  restarts; several workers may run it at once, the commit protocol keeps each
  outcome exactly once (see :mod:`blackboard.client.consensus`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from nats.aio.client import Client as NATS
from psycopg.types.json import Jsonb
from pydantic import ValidationError

from blackboard.client.consensus import VoteStore
from blackboard.consensus.log import (
    ProposalLog,
    VoteMessage,
    classify_ballots,
    decode_ballot,
    decode_outcome,
    decode_proposal,
)
from blackboard.consensus.tally import StampedBallot
from blackboard.db import vote_sql as q
from blackboard.protocol.errors import BlackboardError, InvalidKeyError, InvalidPayloadError
from blackboard.protocol.schemas import Ballot, Outcome, Proposal
from blackboard.protocol.subjects import VOTE_STREAM, Header, Subjects
from blackboard.settings import Settings
from blackboard.worker.decode import RawMessage
from blackboard.worker.stream_handler import Conn, StreamHandler

__all__ = ["CloserStats", "VoteCloser", "VoteRow", "decode_vote", "retry_wait", "vote_handler", "write_votes"]

log = logging.getLogger("blackboard.worker.votes")
#: The longest wait between two tries of a proposal that keeps failing to commit (seconds).
_MAX_RETRY_WAIT = 60.0

M = TypeVar("M", Proposal, Ballot)


@dataclass(frozen=True, slots=True)
class VoteRow:
    """One decoded ``BB_VOTE`` message (``model`` is ``None`` for a close request)."""

    kind: str
    stream: str
    seq: int
    board: str
    proposal_id: str
    stored_at: datetime
    model: Proposal | Ballot | Outcome | None
    base_revision: int = 0
    #: The record as stored (jsonb): built by the decoder, so that a record
    #: the writer could not serialize is a dead letter, not a failed batch.
    body: Any = None


def _pg_safe(value: Any) -> Any:
    """A JSON value PostgreSQL can store: NUL characters and lone surrogates replaced."""
    if isinstance(value, str):
        if "\x00" in value:
            value = value.replace("\x00", "\ufffd")
        if not value.isascii():
            value = value.encode("utf-8", "replace").decode("utf-8")
        return value
    if isinstance(value, list):
        return [_pg_safe(v) for v in value]
    if isinstance(value, dict):
        return {_pg_safe(k): _pg_safe(v) for k, v in value.items()}
    return value


def decode_vote(msg: RawMessage, *, max_bytes: int) -> VoteRow:
    """Decode one ``BB_VOTE`` message (pure).

    Raises:
        InvalidPayloadError: not a vote subject, too large, or not a valid
            proposal/ballot/outcome for its subject (a dead letter; the tally
            ignores such messages too).
    """
    try:
        board, pid, kind = Subjects.parse_vote(msg.subject)
    except InvalidKeyError as exc:
        raise InvalidPayloadError(f"bad vote subject: {exc.reason}") from exc
    if len(msg.data) > max_bytes:
        raise InvalidPayloadError(f"oversized: {len(msg.data)} bytes > limit {max_bytes}")
    model: Proposal | Ballot | Outcome | None = None
    base = 0
    if kind == "proposal":
        model = decode_proposal(msg.data, msg.headers)
        if model.board != board or model.id != pid:
            raise InvalidPayloadError(f"proposal {model.board}.{model.id} does not match {msg.subject}")
    elif kind == "ballot":
        model = decode_ballot(msg.data, msg.headers)
    elif kind in ("outcome", "applied"):
        model = decode_outcome(msg.data, msg.headers)
        if model.board != board or model.proposal_id != pid:
            raise InvalidPayloadError(f"outcome {model.board}.{model.proposal_id} does not match {msg.subject}")
        if kind == "applied" and (model.revision is None or model.status != "accepted"):
            raise InvalidPayloadError("an applied outcome must be accepted and have a revision")
        try:
            base = max(0, int(msg.headers.get(Header.BASE_REVISION.value, "0")))
        except ValueError:
            base = 0
    body = None
    if model is not None:
        try:
            body = _pg_safe(model.model_dump(mode="json"))
        except ValueError as exc:  # pydantic's serialization errors are ValueErrors
            raise InvalidPayloadError(f"{kind} cannot be stored: {exc}") from exc
    return VoteRow(kind, msg.stream, msg.seq, board, pid, msg.timestamp, model, base, body)


def _outcome_params(row: VoteRow, o: Outcome) -> tuple[Any, ...]:
    return (row.stream, row.seq, row.board, row.proposal_id, Jsonb(_body(row, o)),
            o.decided_at, row.stored_at, _pg_safe(o.section), _pg_safe(o.key), o.status, o.candidate,
            None if o.value is None else Jsonb(_pg_safe(o.value)), o.closed_by, o.deciding_sequence)


def _body(row: VoteRow, model: Proposal | Ballot | Outcome) -> Any:
    """The stored body of a row: the decoder's, else (a row built by hand) the model's."""
    return row.body if row.body is not None else _pg_safe(model.model_dump(mode="json"))


async def write_votes(conn: Conn, rows: Sequence[VoteRow]) -> None:
    """Store proposals, ballots and outcomes, then reclassify the touched proposals' ballots."""
    async with conn.cursor() as cur:
        proposals = [(r, r.model) for r in rows if isinstance(r.model, Proposal)]
        if proposals:
            await cur.executemany(q.INSERT_PROPOSAL, [
                (r.stream, r.seq, r.board, r.proposal_id, p.proposer, Jsonb(_body(r, p)),
                 p.created_at, p.deadline, r.stored_at, p.section, _pg_safe(p.key), _pg_safe(p.question))
                for r, p in proposals])
        ballots = [(r, r.model) for r in rows if isinstance(r.model, Ballot)]
        if ballots:
            await cur.executemany(q.INSERT_BALLOT, [
                (r.stream, r.seq, r.board, r.proposal_id, b.voter, Jsonb(_body(r, b)),
                 b.created_at, r.stored_at, _pg_safe(b.id), str(b.choice))
                for r, b in ballots])
        for r in rows:
            if isinstance(r.model, Outcome):
                if r.kind == "outcome":
                    await cur.execute(q.INSERT_OUTCOME, (*_outcome_params(r, r.model), r.base_revision))
                else:
                    await cur.execute(q.INSERT_APPLIED, (*_outcome_params(r, r.model), r.model.revision,
                                                         r.seq, r.stored_at))
    touched = sorted({(r.board, r.proposal_id) for r in rows if r.model is not None})
    for board, pid in touched:
        await reclassify(conn, board, pid)


async def reclassify(conn: Conn, board: str, proposal_id: str) -> None:
    """Recompute the fate of every stored ballot of a proposal (and its status)."""
    async with conn.cursor() as cur:
        await cur.execute(q.LOCK_PROPOSAL, (f"{board}.{proposal_id}",))
        await cur.execute(q.SELECT_PROPOSAL, (board, proposal_id))
        prow = await cur.fetchone()
        await cur.execute(q.SELECT_BALLOTS, (board, proposal_id))
        brows = await cur.fetchall()
        proposal: Proposal | None = None
        pseq = 0
        if prow is not None:
            pseq = int(prow[0])
            proposal = _model(Proposal, prow[1])
        stamped = [StampedBallot(int(seq), stored_at, ballot) for seq, stored_at, body in brows
                   if (ballot := _model(Ballot, body)) is not None]
        fates = classify_ballots(proposal, pseq, stamped)
        if fates:
            seqs = list(fates)
            await cur.execute(q.UPDATE_FATES, (seqs, [fates[s].status for s in seqs],
                                               [fates[s].reason for s in seqs], VOTE_STREAM))
        await cur.execute(q.UPDATE_PROPOSAL_STATUS, (board, proposal_id))


def _model(model: type[M], body: Any) -> M | None:
    """A stored body read back (strict, as decoded); ``None`` if it no longer validates."""
    try:
        return model.model_validate(body, strict=True)
    except ValidationError:
        log.error("a stored %s does not validate: %.200r", model.__name__, body)
        return None


def vote_handler(settings: Settings) -> StreamHandler:
    """The persistence handler of ``BB_VOTE`` (for the worker's handler table)."""
    max_bytes = settings.worker.max_message_bytes or settings.board.max_value_size

    def decode(msg: RawMessage) -> VoteRow:
        return decode_vote(msg, max_bytes=max_bytes)

    return StreamHandler("votes", VOTE_STREAM, Subjects.votes_all(), decode, write_votes)


@dataclass
class CloserStats:
    """Counters of a :class:`VoteCloser` since start."""

    messages: int = 0
    close_requests: int = 0
    commits: int = 0
    errors: int = 0
    last_error: str | None = None


class VoteCloser:
    """Closes expired proposals and finishes commits (one per worker process).

    Args:
        nc: a connected NATS client.
        settings: the deployment's settings (``worker.deadline_interval``,
            ``worker.vote_commit_grace``).
    """

    def __init__(self, nc: NATS, settings: Settings) -> None:
        self.settings = settings
        self.store = VoteStore(nc, settings, name=settings.worker.name)
        self.stats = CloserStats()
        self._logs: dict[tuple[str, str], ProposalLog] = {}
        self._done: set[tuple[str, str]] = set()
        #: Commits in flight, one per proposal (children of run()'s task group).
        self._commits: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._group: asyncio.TaskGroup | None = None
        self._retry_at: dict[tuple[str, str], float] = {}
        #: Failures in a row per proposal: each doubles the wait before the next try (up to
        #: _MAX_RETRY_WAIT), so a proposal that cannot commit (e.g. a garbage outcome occupies
        #: its subject) costs a try a minute, not one a second for ever.
        self._failures: dict[tuple[str, str], int] = {}
        self._asked: dict[tuple[str, str], float] = {}
        self._wake = asyncio.Event()
        self._follower = self.store.follow(Subjects.votes_all(), self._feed)

    @property
    def ready(self) -> asyncio.Event:
        """Set once the vote stream has been replayed (state rebuilt)."""
        return self._follower.ready

    @property
    def open_proposals(self) -> int:
        """Proposals followed that have no committed outcome yet."""
        return len(self._logs)

    async def setup(self) -> None:
        """Start following the vote stream from its beginning (idempotent)."""
        await self._follower.start()

    def _feed(self, msg: VoteMessage) -> None:
        self.stats.messages += 1
        key = (msg.board, msg.proposal_id)
        if key in self._done:
            return
        plog = self._logs.get(key)
        if plog is None:
            if msg.kind != "proposal":
                return  # messages stored before any proposal do not count for it
            plog = self._logs[key] = ProposalLog(msg.board, msg.proposal_id)
        plog.feed(msg)
        if plog.committed is not None:
            self._done.add(key)
            del self._logs[key]
            self._asked.pop(key, None)
            self._retry_at.pop(key, None)
            self._failures.pop(key, None)
        elif plog.decided is not None or plog.recorded is not None:
            self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Check every ``deadline_interval`` (and on every decision) until ``stop`` is set.

        Commits run in a task group: stopping cancels and awaits them, and an
        unexpected error in one ends the run (the worker's supervisor restarts it).
        """
        await self.setup()
        interval = self.settings.worker.deadline_interval
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                try:
                    while not stop.is_set():
                        self._wake.clear()
                        await self._check()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(_first(stop, self._wake), interval)
                finally:
                    self._group = None
                    for task in self._commits.values():
                        task.cancel()
        finally:
            self._commits.clear()
            await self._follower.stop()
            await self.store.close()

    async def _check(self) -> None:
        now = datetime.now(UTC)
        mono = time.monotonic()
        grace = timedelta(seconds=self.settings.worker.vote_commit_grace)
        interval = self.settings.worker.deadline_interval
        for key, plog in list(self._logs.items()):
            if key in self._commits or self._retry_at.get(key, 0.0) > mono or plog.proposal is None:
                continue
            recorded, decided = plog.recorded, plog.decided
            if recorded is not None:
                # Recorded but not applied: finish it once the recorder had its chance.
                stamp = recorded.timestamp or now
                if now - stamp >= grace:
                    self._spawn_commit(key, plog, recorded.outcome)
            elif decided is not None:
                if decided.closed_by == "deadline" or now - decided.decided_at >= grace:
                    self._spawn_commit(key, plog, decided)
            elif plog.proposal.deadline is not None and now > plog.proposal.deadline:
                if mono - self._asked.get(key, -1e9) >= interval:
                    self._asked[key] = mono
                    await self._ask_close(key, plog)

    async def _ask_close(self, key: tuple[str, str], plog: ProposalLog) -> None:
        try:
            await self.store.publish_close(plog.board, plog.proposal_id)
            self.stats.close_requests += 1
        except BlackboardError as exc:
            self._failed(key, exc)

    def _spawn_commit(self, key: tuple[str, str], plog: ProposalLog, outcome: Outcome) -> None:
        async def commit() -> None:
            try:
                await self.store.commit(outcome, known=plog)
                self.stats.commits += 1
                self._failures.pop(key, None)
                # Leave the stream time to show the commit before looking again.
                self._retry_at[key] = time.monotonic() + max(1.0, self.settings.worker.vote_commit_grace)
            except BlackboardError as exc:
                self._failed(key, exc)
            finally:
                self._commits.pop(key, None)
                self._wake.set()

        assert self._group is not None, "commits are spawned by run()"
        self._commits[key] = self._group.create_task(commit(), name=f"commit {key[0]}.{key[1]}")

    def _failed(self, key: tuple[str, str], exc: BaseException) -> None:
        self.stats.errors += 1
        self.stats.last_error = repr(exc)
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        wait = retry_wait(failures, max(1.0, self.settings.worker.deadline_interval))
        self._retry_at[key] = time.monotonic() + wait
        log.warning("proposal %s.%s: %r (failure %d in a row; next try in %.0fs)", key[0], key[1], exc,
                    failures, wait)


def retry_wait(failures: int, base: float) -> float:
    """Seconds before the next try of a proposal that failed ``failures`` times in a row:
    ``base`` after the first failure, doubling after each one, at most a minute."""
    return min(_MAX_RETRY_WAIT, base * 2.0 ** max(0, failures - 1))


async def _first(*events: asyncio.Event) -> None:
    """Return when any of the events is set."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
