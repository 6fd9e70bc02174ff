"""The vote committer: the worker identity's part of consensus voting (NATS only).

Agents publish proposals and their own ballots; outcomes, deadline close
requests and "applied" records are published by the worker identity only
(the server's permissions forbid them to agents). :class:`VoteCommitter`
does that for every board:

* it follows ``BB_VOTE`` (``bb.vote.>``, one ordered consumer) and feeds each
  proposal's messages to the pure log (:mod:`blackboard.consensus.log`), which
  runs the tally;
* it commits an outcome as soon as the tally decides it (record, apply an
  accepted value to the board entry, mark applied: the idempotent protocol of
  :class:`blackboard.client.consensus.VoteStore`); on an insecure open bus,
  where agents commit themselves, it leaves a decision to them for
  ``worker.vote_commit_grace`` first;
* it asks for the close of a proposal at its deadline (a ``close`` request
  whose server timestamp is "now"; again every ``worker.deadline_interval``
  while the server's clock is behind) and commits the deadline's outcome;
* it finishes commits another committer left half done (a recorded outcome
  not applied after ``worker.vote_commit_grace``).

Everything it publishes (close requests, outcomes, applied records, and the
board entries that apply accepted outcomes, whose marker names the outcome
record as their ``provenance``) is signed by the worker identity; every
outcome records its sources (the proposal and the counted ballots, with
their signatures: ``Outcome.sources``); and what it reads is verified, so a
proposal or ballot that does not verify is not counted
(:class:`blackboard.client.consensus.VoteStore`).

Its state is the stream itself, replayed from the beginning on start, so it
survives restarts and starts late. Several committers (worker replicas) may
run at once: the first recorded outcome wins (expected last sequence 0),
racing appliers are one write (``apply_msg_id`` and compare-and-set), so each
proposal has one outcome whoever races. It needs no PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import TracebackType

from nats.aio.client import Client as NATS

from blackboard.client.consensus import VoteFollower, VoteStore
from blackboard.consensus.log import ProposalLog, VoteMessage
from blackboard.protocol.errors import BlackboardError
from blackboard.protocol.schemas import Outcome
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings
from blackboard.worker._tasks import first_of

__all__ = ["CommitterStats", "VoteCommitter", "retry_wait"]

log = logging.getLogger("blackboard.worker.committer")
#: The longest wait between two tries of a proposal that keeps failing to commit (seconds).
_MAX_RETRY_WAIT = 60.0
#: How long after its deadline a proposal's close is asked for (the server must stamp
#: the request strictly after the deadline).
_PAST_DEADLINE = 0.001

Key = tuple[str, str]


@dataclass
class CommitterStats:
    """Counters of a :class:`VoteCommitter` since it started."""

    messages: int = 0
    close_requests: int = 0
    commits: int = 0
    errors: int = 0
    last_error: str | None = None


def retry_wait(failures: int, base: float) -> float:
    """Seconds before the next try of a proposal that failed ``failures`` times in a row:
    ``base`` after the first failure, doubling after each one, at most a minute."""
    return min(_MAX_RETRY_WAIT, base * 2.0 ** max(0, failures - 1))


class VoteCommitter:
    """Commits every proposal's outcome and closes proposals at their deadline.

    Use ``await c.start()`` / ``await c.stop()`` (or ``async with``), or, in
    the worker, ``await c.setup()`` then ``await c.run(stop)`` under its
    supervisor (a crashed run is started again and replays the stream).

    Args:
        nc: a connected NATS client (the worker identity's).
        settings: the deployment's settings (``worker.deadline_interval``,
            ``worker.vote_commit_grace``, ``nats.insecure_open_bus``).
        name: the author of the board writes that apply outcomes (default:
            ``settings.worker.name``; a connection that signs writes as its
            credential's principal instead).
        board: follow this board only (default: every board, ``bb.vote.>``).
    """

    def __init__(self, nc: NATS, settings: Settings, *, name: str | None = None, board: str | None = None) -> None:
        self.settings = settings
        self.store = VoteStore(nc, settings, name=name or settings.worker.name)
        self.filter_subject = Subjects.vote_filter(board)
        self.stats = CommitterStats()
        self._logs: dict[Key, ProposalLog] = {}
        self._done: set[Key] = set()
        #: Commits in flight, one per proposal (children of run()'s task group).
        self._commits: dict[Key, asyncio.Task[None]] = {}
        self._group: asyncio.TaskGroup | None = None
        self._retry_at: dict[Key, float] = {}
        #: Failures in a row per proposal: each doubles the wait before the next try (up to
        #: _MAX_RETRY_WAIT), so a proposal that cannot commit (e.g. a garbage outcome occupies
        #: its subject) costs a try a minute, not one a second for ever.
        self._failures: dict[Key, int] = {}
        self._asked: dict[Key, float] = {}
        self._wake = asyncio.Event()
        self._follower: VoteFollower | None = None
        self._not_started = asyncio.Event()
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    # -- state -------------------------------------------------------------
    @property
    def ready(self) -> asyncio.Event:
        """Set once the vote stream has been replayed (state rebuilt) since the last start."""
        return self._not_started if self._follower is None else self._follower.ready

    @property
    def open_proposals(self) -> int:
        """Proposals followed that have no committed outcome yet."""
        return len(self._logs)

    def log_of(self, board: str, proposal_id: str) -> ProposalLog | None:
        """The log of a proposal not committed yet (``None`` once committed or unknown)."""
        return self._logs.get((board, proposal_id))

    # -- lifecycle -----------------------------------------------------------
    async def setup(self) -> None:
        """Start following the vote stream from its beginning (idempotent while started).

        Raises:
            NotConnectedError, ConfigurationError, TransportError: the consumer cannot be created.
        """
        if self._follower is not None:
            return
        # A fresh state, rebuilt from the stream (a restart after a crash replays it too).
        self._logs.clear()
        self._done.clear()
        self._asked.clear()
        self._retry_at.clear()
        self._failures.clear()
        follower = VoteFollower(self.store, self.filter_subject, self._feed, start="all")
        await follower.start()
        self._follower = follower

    async def start(self) -> None:
        """Run in a task of its own; returns once the stream has been replayed.

        Raises:
            NotConnectedError, ConfigurationError, TransportError: the consumer cannot be created.
        """
        if self._task is not None and not self._task.done():
            return
        await self.setup()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self.run(self._stop), name="blackboard vote committer")
        ready = asyncio.ensure_future(self.ready.wait())
        try:
            await asyncio.wait([ready, self._task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if self._task.done():
            self._task.result()  # raises what ended the run

    async def stop(self) -> None:
        """Stop the task started by :meth:`start` (commits in flight are cancelled;
        the next committer finishes them)."""
        if self._stop is not None:
            self._stop.set()
        task, self._task = self._task, None
        if task is None:
            return
        await asyncio.wait([task], timeout=self.settings.nats.request_timeout)
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def __aenter__(self) -> VoteCommitter:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    async def run(self, stop: asyncio.Event) -> None:
        """Commit and close until ``stop`` is set: on every decision, at every deadline,
        and at least every ``deadline_interval``.

        Commits run in a task group: stopping cancels and awaits them, and an
        unexpected error in one ends the run (the worker's supervisor restarts it).
        """
        await self.setup()
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                try:
                    # Decide only on the whole history: a commit found later in the
                    # stream must not be redone during the replay.
                    await first_of(stop, self.ready)
                    while not stop.is_set():
                        self._wake.clear()
                        wait = await self._check()
                        await first_of(stop, self._wake, timeout=wait)
                finally:
                    self._group = None
                    for task in self._commits.values():
                        task.cancel()
        finally:
            self._commits.clear()
            follower, self._follower = self._follower, None
            if follower is not None:
                await follower.stop()
            await self.store.close()

    # -- following -------------------------------------------------------------
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
        elif plog.proposal is None:
            del self._logs[key]  # a "proposal" message that is not one
        elif plog.decided is not None or plog.recorded is not None or msg.kind == "proposal":
            self._wake.set()  # commit now, or schedule the new proposal's deadline

    # -- deciding what to do -------------------------------------------------------
    async def _check(self) -> float:
        """Commit what is due and ask for due closes; returns the seconds until the next
        thing falls due (at most ``deadline_interval``)."""
        now = datetime.now(UTC)
        mono = time.monotonic()
        s = self.settings
        grace = timedelta(seconds=s.worker.vote_commit_grace)
        interval = s.worker.deadline_interval
        wait = interval
        for key, plog in list(self._logs.items()):
            if key in self._commits or plog.proposal is None:
                continue
            retry_at = self._retry_at.get(key, 0.0)
            if retry_at > mono:
                wait = min(wait, retry_at - mono)
                continue
            recorded, decided = plog.recorded, plog.decided
            if recorded is not None:
                # Recorded but not applied: the recorder (another committer, or an
                # agent on an open bus) is applying it; finish it if it does not.
                due = recorded.timestamp + grace
                if now >= due:
                    self._spawn_commit(key, plog, recorded.outcome)
                else:
                    wait = min(wait, (due - now).total_seconds())
            elif decided is not None:
                # On an open bus the deciding voter commits; elsewhere nobody else will.
                due = decided.decided_at + (grace if s.nats.insecure_open_bus else timedelta(0))
                if decided.closed_by == "deadline" or now >= due:
                    self._spawn_commit(key, plog, decided)
                else:
                    wait = min(wait, (due - now).total_seconds())
            elif (deadline := plog.proposal.deadline) is not None:
                if now > deadline:
                    asked = self._asked.get(key)
                    if asked is None or mono - asked >= interval:
                        self._asked[key] = mono
                        await self._ask_close(key, plog)
                else:
                    wait = min(wait, (deadline - now).total_seconds() + _PAST_DEADLINE)
        return max(0.0, wait)

    async def _ask_close(self, key: Key, plog: ProposalLog) -> None:
        try:
            await self.store.publish_close(plog.board, plog.proposal_id)
            self.stats.close_requests += 1
        except BlackboardError as exc:
            self._failed(key, exc)

    def _spawn_commit(self, key: Key, plog: ProposalLog, outcome: Outcome) -> None:
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

    def _failed(self, key: Key, exc: BaseException) -> None:
        self.stats.errors += 1
        self.stats.last_error = repr(exc)
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        wait = retry_wait(failures, max(1.0, self.settings.worker.deadline_interval))
        self._retry_at[key] = time.monotonic() + wait
        log.warning("proposal %s.%s: %r (failure %d in a row; next try in %.0fs)", key[0], key[1], exc,
                    failures, wait)
