"""Consensus voting over NATS: publishing, reading, following and committing.

The IO layer around :mod:`blackboard.consensus.log` (pure) and
:mod:`blackboard.consensus.tally` (pure), shared by the SDK (``agents_sdk.consensus``) and
the worker (``blackboard.worker.votes``). The commit protocol, in short
(``docs/voting.md`` has the whole of it):

1. **record**: the outcome is published on ``bb.vote.<board>.<proposal>.outcome``
   with ``Nats-Expected-Last-Subject-Sequence: 0``: the first committer wins,
   the others get a conflict and read the winner. The message carries the
   target entry's revision at that moment (``Bb-Base-Revision``).
2. **apply** (accepted outcomes): the first write to the target entry after
   the base revision that carries the proposal's marker is *the* application.
   The applier writes the value through the board store
   (:class:`~blackboard.client.board_store.BoardStore`, the one writer of
   board entries) with compare-and-set on the base revision (and a
   ``Nats-Msg-Id`` derived from the proposal); on a conflict it scans
   the entry's later revisions for the marker, and writes again on the last
   one if there is none. So it is applied once, whoever races.
3. **mark applied**: the outcome with its ``revision`` is published on
   ``.applied``, again with expected sequence 0.

Every step is idempotent, so anyone (the deciding voter, the proposer, any
worker) can run :meth:`VoteStore.commit` at any time, and a committer that
crashes half-way is finished by the next one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from blackboard.client.board_store import BoardStore
from blackboard.client.follower import OrderedFollower
from blackboard.client.publisher import RETRYABLE, Ack, Publisher
from blackboard.consensus.log import (
    ProposalLog,
    RecordedOutcome,
    VoteKind,
    VoteMessage,
    decode_proposal,
    jetstream_time,
    same_outcome,
)
from blackboard.protocol import codec
from blackboard.protocol.entries import Entry, Operation, parse_server_time
from blackboard.protocol.errors import (
    BlackboardError,
    ConflictError,
    InvalidKeyError,
    InvalidPayloadError,
    NotConnectedError,
    OperationTimeoutError,
    TransportError,
)
from blackboard.protocol.schemas import Ballot, Outcome, Proposal
from blackboard.protocol.subjects import VOTE_STREAM, Header, Subjects
from blackboard.settings import Settings

__all__ = ["CONSENSUS_METADATA", "ProposalFollower", "VoteFollower", "VoteStore", "vote_message"]

log = logging.getLogger("blackboard.client.consensus")

#: Metadata key marking a board entry written by a vote commit:
#: ``{"consensus": {"proposal_id": ..., "outcome_sequence": ...}}``.
CONSENSUS_METADATA = "consensus"

_WRONG_LAST_SEQ = 10071
_SEQ_RE = re.compile(r"(\d+)\s*$")
#: Rounds of scan-then-write before giving up on applying (each lost round
#: means another writer changed the target entry in between).
_MAX_APPLY_ROUNDS = 50


def vote_message(msg: Msg) -> VoteMessage:
    """A JetStream message of ``BB_VOTE`` (consumer delivery) as a :class:`VoteMessage`.

    Raises:
        InvalidKeyError: not a vote subject.
    """
    board, pid, kind = Subjects.parse_vote(msg.subject)
    md = msg.metadata
    ts = jetstream_time(msg.reply) or md.timestamp
    return VoteMessage(_kind(kind), board, pid, md.sequence.stream, ts, msg.data, dict(msg.headers or {}))


def _kind(kind: str) -> VoteKind:
    if kind == "proposal":
        return "proposal"
    if kind == "ballot":
        return "ballot"
    if kind == "close":
        return "close"
    if kind == "outcome":
        return "outcome"
    return "applied"


class VoteStore:
    """Voting operations over one NATS connection. No IO in ``__init__``.

    Args:
        nc: a connected NATS client.
        settings: the deployment's settings.
        name: who acts (an agent id or a worker name): the author of the
            board writes this store commits.
        board: the board store that applies accepted outcomes to board
            entries (an agent passes its own); by default one of its own.
    """

    def __init__(self, nc: NATS, settings: Settings, *, name: str, board: BoardStore | None = None) -> None:
        self.nc = nc
        self.settings = settings
        self.name = name
        self.js = nc.jetstream(timeout=settings.nats.request_timeout)
        self.subjects = Subjects(settings.board.bucket)
        self._owns_board = board is None
        #: the one writer of board entries: outcomes are applied through it
        self.board = board if board is not None else BoardStore(nc, settings)
        self._publisher = Publisher(nc, self.js, settings.nats)
        self._inbox: str | None = None
        self._inbox_sub: Any = None
        self._tokens = itertools.count(1)
        self._replies: dict[str, tuple[asyncio.Future[list[Msg]], list[Msg]]] = {}

    # ------------------------------------------------------------- publishing
    async def _publish(self, subject: str, payload: bytes, headers: dict[str, str], what: str,
                       key: str, expected: int | None) -> Ack:
        def conflict(exc: nats.js.errors.APIError) -> BlackboardError:
            if exc.err_code == _WRONG_LAST_SEQ:
                match = _SEQ_RE.search(exc.description or "")
                return ConflictError(key, expected, int(match.group(1)) if match else -1)
            return TransportError(f"JetStream refused {what}: {exc.description} (code {exc.err_code})")

        headers.setdefault(Header.MSG_ID.value, self._publisher.msg_id())
        if expected is not None:
            headers[Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value] = str(expected)
        return await self._publisher.publish(subject, payload, headers, what=what, map_api_error=conflict,
                                             stream=VOTE_STREAM)

    async def close(self) -> None:
        """Release the reply and ack subscriptions (and the board store's, if it is this store's own)."""
        await self._publisher.close()
        if self._owns_board:
            await self.board.close()
        if self._inbox_sub is not None:
            sub, self._inbox_sub, self._inbox = self._inbox_sub, None, None
            try:
                await sub.unsubscribe()
            except nats.errors.Error:
                pass

    async def publish_proposal(self, proposal: Proposal) -> int:
        """Store a proposal; its id must be new on its board.

        Returns:
            The proposal message's stream sequence.

        Raises:
            ConflictError: a proposal with this id exists on the board.
            NotConnectedError, OperationTimeoutError: not acknowledged in time.
        """
        subject = Subjects.vote(proposal.board, proposal.id, "proposal")
        ack = await self._publish(subject, codec.encode(proposal.model_dump(mode="json")), {},
                                  f"proposal {proposal.id!r}", f"{proposal.board}.{proposal.id}", 0)
        return int(ack.seq)

    async def publish_ballot(self, board: str, ballot: Ballot) -> int:
        """Store a ballot (whatever its fate); returns its stream sequence."""
        subject = Subjects.vote(board, ballot.proposal_id, "ballot")
        ack = await self._publish(subject, codec.encode(ballot.model_dump(mode="json")), {},
                                  f"ballot {ballot.id!r}", subject, None)
        return int(ack.seq)

    async def publish_close(self, board: str, proposal_id: str) -> int:
        """Ask for a deadline close: an empty message whose server timestamp is "now".

        Closers that ask within the same second are deduplicated.
        """
        subject = Subjects.vote(board, proposal_id, "close")
        second = int(datetime.now(UTC).timestamp())
        headers = {Header.MSG_ID.value: Subjects.close_msg_id(board, proposal_id, second)}
        ack = await self._publish(subject, b"", headers, f"close of {proposal_id!r}", subject, None)
        return int(ack.seq)

    # --------------------------------------------------------------- reading
    async def _request(self, subject: str, payload: bytes, what: str) -> Msg:
        return await self._publisher.request(subject, payload, what=what)

    async def _direct(self, subject: str) -> Msg | None:
        """The last message on a vote subject (direct get), or ``None``."""
        msg = await self._request(Subjects.direct_get(VOTE_STREAM, subject), b"", subject)
        status = (msg.headers or {}).get(Header.STATUS.value)
        if status == "404":
            return None
        if status:
            raise TransportError(f"direct get of {subject} failed: {status} "
                                 f"{(msg.headers or {}).get('Description', '')}")
        return msg

    async def read(self, board: str, proposal_id: str, kind: VoteKind) -> VoteMessage | None:
        """The last message of one kind of a proposal (direct get), or ``None``."""
        subject = Subjects.vote(board, proposal_id, kind)
        msg = await self._direct(subject)
        if msg is None:
            return None
        headers = dict(msg.headers or {})
        ts = parse_server_time(headers.get(Header.TIMESTAMP.value)) or datetime.now(UTC)
        return VoteMessage(kind, board, proposal_id, int(headers[Header.SEQUENCE.value]), ts, msg.data, headers)

    async def read_proposal(self, board: str, proposal_id: str) -> tuple[Proposal, int] | None:
        """The proposal and its stream sequence, or ``None`` if there is none (valid)."""
        msg = await self.read(board, proposal_id, "proposal")
        if msg is None:
            return None
        try:
            proposal = decode_proposal(msg.data, msg.headers)
        except InvalidPayloadError:
            return None
        if proposal.board != board or proposal.id != proposal_id:
            return None
        return proposal, msg.sequence

    async def read_recorded(self, board: str, proposal_id: str) -> RecordedOutcome | None:
        """The recorded outcome (the decision), or ``None`` if not recorded yet."""
        return (await self._probe(board, proposal_id, "outcome")).recorded

    async def read_applied(self, board: str, proposal_id: str) -> Outcome | None:
        """The applied outcome (with its revision), or ``None``."""
        return (await self._probe(board, proposal_id, "applied")).applied

    async def _probe(self, board: str, proposal_id: str, kind: VoteKind) -> ProposalLog:
        """A log of the proposal fed with only its last message of ``kind`` (if any), which validates it."""
        probe = ProposalLog(board, proposal_id)
        msg = await self.read(board, proposal_id, kind)
        if msg is not None:
            probe.feed(msg)
        return probe

    # -------------------------------------------------------------- commit
    async def commit(self, outcome: Outcome, *, known: ProposalLog | None = None) -> Outcome:
        """Commit an outcome exactly once (record, apply, mark applied); idempotent.

        ``known`` (the caller's log of the proposal) saves reads of what it
        already shows. Returns the committed outcome: for an accepted one, with
        the ``revision`` of the board write that applied it. If another
        committer recorded a different outcome first, that one stands.

        Raises:
            NotConnectedError, OperationTimeoutError: the server did not answer in time.
            PayloadTooLargeError: the accepted value does not fit the bucket.
            ConflictError: the target entry kept changing under the applier.
        """
        if known is not None and known.committed is not None:
            return known.committed
        recorded = known.recorded if known is not None else None
        if recorded is None:
            recorded = await self.record(outcome)
        if recorded.outcome.status != "accepted":
            return recorded.outcome
        revision = await self.apply(recorded)
        return await self.mark_applied(recorded.outcome.model_copy(update={"revision": revision}))

    async def record(self, outcome: Outcome) -> RecordedOutcome:
        """Step 1: publish the outcome with expected sequence 0, or read the winner's."""
        subject = Subjects.vote(outcome.board, outcome.proposal_id, "outcome")
        base = await self.board.latest_revision(outcome.board, outcome.section, outcome.key)
        body = outcome.model_copy(update={"revision": None})
        headers = {Header.BASE_REVISION.value: str(base)}
        try:
            ack = await self._publish(subject, codec.encode(body.model_dump(mode="json")), headers,
                                      f"outcome of {outcome.proposal_id!r}", subject, 0)
        except ConflictError:
            ack = None
        if ack is not None and not ack.duplicate:
            return RecordedOutcome(body, int(ack.seq), datetime.now(UTC), base)
        recorded = await self.read_recorded(outcome.board, outcome.proposal_id)
        if recorded is None:
            raise TransportError(f"the outcome of {outcome.proposal_id!r} exists but cannot be read")
        if not same_outcome(recorded.outcome, body):
            log.warning("proposal %s.%s: the recorded outcome differs from the one computed by %s",
                        outcome.board, outcome.proposal_id, self.name)
        return recorded

    @staticmethod
    def _is_application(entry: Entry | None, outcome: Outcome) -> bool:
        if entry is None or entry.operation is not Operation.PUT:
            return False
        marker = entry.metadata.get(CONSENSUS_METADATA)
        return isinstance(marker, dict) and marker.get("proposal_id") == outcome.proposal_id

    async def apply(self, recorded: RecordedOutcome) -> int:
        """Step 2: the revision that applies an accepted outcome (writing it if
        nobody has, through the board store). Idempotent; see the module docstring.

        Raises:
            ConflictError: the entry changed under every one of many attempts.
            PayloadTooLargeError: the value does not fit the bucket.
        """
        o = recorded.outcome
        last_seen = recorded.base_revision
        marker = {CONSENSUS_METADATA: {"proposal_id": o.proposal_id, "outcome_sequence": recorded.sequence}}
        conflict: ConflictError | None = None
        for _ in range(_MAX_APPLY_ROUNDS):
            # Writing at the last revision seen is safe: no application can
            # precede the record (so none is at or before the base), and the
            # scan below found none after it. The Msg-Id turns racing appliers
            # into one write within the duplicate window; the CAS is exact
            # beyond it. So the common case is one write, no scan.
            try:
                return await self.board.put(o.board, o.section, o.key, o.value, author=self.name, metadata=marker,
                                            expected_revision=last_seen,
                                            msg_id=Subjects.apply_msg_id(o.board, o.proposal_id))
            except ConflictError as exc:
                conflict = exc
                if 0 <= exc.current_revision < last_seen:  # later messages expired or were purged
                    last_seen = exc.current_revision
                    continue
            while (found := await self.board.next_revision(o.board, o.section, o.key, last_seen)) is not None:
                revision, entry = found
                if self._is_application(entry, o):
                    return revision
                last_seen = revision
        assert conflict is not None
        raise conflict

    async def mark_applied(self, outcome: Outcome) -> Outcome:
        """Step 3: publish the applied outcome (with its revision), or read the winner's."""
        subject = Subjects.vote(outcome.board, outcome.proposal_id, "applied")
        try:
            ack = await self._publish(subject, codec.encode(outcome.model_dump(mode="json")), {},
                                      f"application of {outcome.proposal_id!r}", subject, 0)
            if not ack.duplicate:
                return outcome
        except ConflictError:
            pass
        applied = await self.read_applied(outcome.board, outcome.proposal_id)
        if applied is None:
            raise TransportError(f"the application of {outcome.proposal_id!r} exists but cannot be read")
        return applied

    async def _ensure_inbox(self) -> str:
        if self._inbox is None:
            prefix = self.nc.new_inbox()
            self._inbox_sub = await self.nc.subscribe(Subjects.reply_inbox(prefix, "*"), cb=self._on_reply)
            self._inbox = prefix + "."
        return self._inbox

    async def _on_reply(self, msg: Msg) -> None:
        assert self._inbox is not None
        pending = self._replies.get(msg.subject[len(self._inbox):])
        if pending is None or pending[0].done():
            return
        pending[1].append(msg)
        if (msg.headers or {}).get(Header.STATUS.value):  # EOB (204), 404, or an error
            pending[0].set_result(pending[1])

    async def _batch(self, payload: bytes, what: str) -> list[Msg]:
        """A batched direct get: every reply up to the closing status message."""
        loop = asyncio.get_running_loop()
        ns = self.settings.nats
        deadline = loop.time() + ns.write_timeout
        delay = 0.05
        while True:
            inbox = await self._ensure_inbox()
            token = f"{next(self._tokens):x}"
            fut: asyncio.Future[list[Msg]] = loop.create_future()
            self._replies[token] = (fut, [])
            try:
                await self.nc.publish(Subjects.direct_get(VOTE_STREAM), payload, reply=inbox + token)
                return await asyncio.wait_for(fut, ns.request_timeout)
            except nats.errors.ConnectionClosedError as exc:
                raise NotConnectedError("the NATS connection is closed") from exc
            except RETRYABLE as exc:
                if loop.time() + delay >= deadline:
                    raise self._publisher.timeout_error(f"reading {what}") from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            finally:
                self._replies.pop(token, None)

    async def fetch(self, filter_subject: str, start: int, *, up_to: int | None = None,
                    batch: int = 256) -> tuple[list[VoteMessage], bool, int]:
        """Stored vote messages matching ``filter_subject`` from sequence ``start``
        on (to ``up_to``), in order: one batched direct get.

        Returns:
            The messages, whether more may follow, and the last sequence read
            (``start - 1`` if none; messages on subjects that are not vote
            subjects are skipped but counted as read).
        """
        request: dict[str, Any] = {"seq": max(1, start), "next_by_subj": filter_subject, "batch": batch}
        if up_to is not None:
            request["up_to_seq"] = up_to
        replies = await self._batch(codec.encode(request, "json"), filter_subject)
        msgs: list[VoteMessage] = []
        last, count = start - 1, 0
        for reply in replies:
            headers = dict(reply.headers or {})
            status = headers.get(Header.STATUS.value)
            if status in ("204", "404"):
                break
            if status:
                raise TransportError(f"direct get of {filter_subject} failed: {status} "
                                     f"{headers.get('Description', '')}")
            count += 1
            seq = int(headers[Header.SEQUENCE.value])
            last = max(last, seq)
            try:
                board, pid, kind = Subjects.parse_vote(headers[Header.SUBJECT.value])
            except (KeyError, InvalidKeyError):
                continue
            ts = parse_server_time(headers.get(Header.TIMESTAMP.value)) or datetime.now(UTC)
            msgs.append(VoteMessage(_kind(kind), board, pid, seq, ts, reply.data, headers))
        return msgs, count >= batch, last

    # ------------------------------------------------------------- following
    def follow(self, filter_subject: str, on_message: Callable[[VoteMessage], None], *,
               start: Literal["all", "new"] = "all") -> VoteFollower:
        """An ordered consumer over vote subjects calling ``on_message`` in stream order."""
        return VoteFollower(self, filter_subject, on_message, start=start)


class VoteFollower(OrderedFollower):
    """Feeds every message of a vote subject filter, in stream order, to a callback.

    An :class:`~blackboard.client.follower.OrderedFollower` of ``BB_VOTE``
    handing each message on as a :class:`VoteMessage`: after a disconnect or a
    server restart it resumes after the last delivered message, without gaps
    or repeats. ``ready`` is set once the messages stored before it started
    have been delivered; ``error`` keeps the last callback error (that message
    is skipped, the follower goes on).
    """

    def __init__(self, store: VoteStore, filter_subject: str, on_message: Callable[[VoteMessage], None],
                 *, start: Literal["all", "new"] = "all") -> None:
        super().__init__(store.js, VOTE_STREAM, filter_subject, lambda msg: on_message(vote_message(msg)),
                         start=start)


class ProposalFollower:
    """One proposal's log, kept current without a JetStream consumer.

    A plain subscription to the proposal's subjects only says "something
    was stored"; the messages themselves (with their stream sequences and
    server timestamps) are read in order with batched direct gets from the
    last one seen, so nothing is missed or repeated, and a server holds no
    state per follower (a stream allows a limited number of consumers).
    Reading is lazy: a notice triggers a read only while someone waits
    (:meth:`wait_for`); otherwise :meth:`catch_up` reads on demand. A notice
    lost in a reconnect costs a waiter at most ``poll`` seconds.

    ::

        async with ProposalFollower(store, board, pid) as f:
            await f.wait_for(lambda log: log.decided is not None, timeout=5)
    """

    def __init__(self, store: VoteStore, board: str, proposal_id: str, *, poll: float = 1.0) -> None:
        self.log = ProposalLog(board, proposal_id)
        self.ready = asyncio.Event()
        self._store = store
        self._filter = Subjects.vote_filter(board, proposal_id)
        self._poll = poll
        self._next = 1  # the next stream sequence to read
        self._sub: Any = None
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._poked = False
        self._poker: asyncio.Task[None] | None = None
        self._waiters = 0
        self._stopped = False

    async def __aenter__(self) -> ProposalFollower:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Subscribe, then read what is stored (``ready`` is set after).

        Raises:
            NotConnectedError, OperationTimeoutError: NATS did not answer.
        """
        if self._sub is not None:
            return
        try:
            self._sub = await self._store.nc.subscribe(self._filter, cb=self._on_notice)
        except nats.errors.ConnectionClosedError as exc:
            raise NotConnectedError("the NATS connection is closed") from exc
        await self.catch_up()
        self.ready.set()

    async def stop(self) -> None:
        """Unsubscribe; waiters get ``NotConnectedError``."""
        self._stopped = True
        if self._poker is not None:
            self._poker.cancel()
        if self._sub is not None:
            sub, self._sub = self._sub, None
            try:
                await sub.unsubscribe()
            except (TimeoutError, nats.errors.Error):
                pass
        self._changed.set()

    async def _on_notice(self, msg: Msg) -> None:
        self._poked = True
        if self._waiters and (self._poker is None or self._poker.done()):
            self._poker = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        while self._poked and not self._stopped:
            self._poked = False
            try:
                await self.catch_up()
            except BlackboardError as exc:  # the waiters' poll retries
                log.debug("%s: catching up failed: %r", self._filter, exc)
                return

    async def catch_up(self, up_to: int | None = None) -> None:
        """Read and apply every stored message after the last one seen
        (only up to sequence ``up_to`` when given)."""
        async with self._lock:
            while up_to is None or self._next <= up_to:
                msgs, more, last = await self._store.fetch(self._filter, self._next, up_to=up_to)
                for msg in msgs:
                    self.log.feed(msg)
                self._next = max(self._next, last + 1)
                if msgs:
                    self._changed.set()
                    self._changed = asyncio.Event()
                if not more:
                    break

    async def wait_for(self, predicate: Callable[[ProposalLog], bool], timeout: float | None = None) -> None:
        """Wait until ``predicate(log)`` holds.

        Raises:
            OperationTimeoutError: it did not within ``timeout`` seconds.
            NotConnectedError: the follower was stopped.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        self._waiters += 1
        try:
            if self._poked:
                self._poked = False
                await self.catch_up()
            while not predicate(self.log):
                if self._stopped:
                    raise NotConnectedError(f"stopped following {self.log.board}.{self.log.proposal_id}")
                changed = self._changed
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    raise OperationTimeoutError(f"{self.log.board}.{self.log.proposal_id}: condition not met "
                                                f"within {timeout:g}s")
                wait = self._poll if remaining is None else min(self._poll, remaining)
                try:
                    await asyncio.wait_for(changed.wait(), wait)
                except TimeoutError:
                    if not self._stopped:
                        await self.catch_up()
        finally:
            self._waiters -= 1
