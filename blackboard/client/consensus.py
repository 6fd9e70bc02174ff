"""Consensus voting over NATS: publishing, reading, following and committing.

The IO layer around :mod:`blackboard.consensus.log` (pure) and
:mod:`blackboard.consensus.tally` (pure), shared by the SDK (``agents_sdk.consensus``) and
the worker's committer (``blackboard.worker.committer``).

**Who publishes what.** An agent publishes proposals and its own ballots
(``bb.vote.<board>.<proposal>.ballot.<voter>``) only. Outcomes, deadline close
requests and "applied" records are published by the worker identity (its
:class:`~blackboard.worker.committer.VoteCommitter`), or by agents themselves
on an insecure open bus (``settings.nats.insecure_open_bus``), where no
worker may run. The server's permissions enforce this under credentials.

**How an agent reads.** Only with a direct get of the last message of one
subject (``$JS.API.DIRECT.GET.BB_VOTE.<subject>``, no body; a subject with a
trailing ``>`` gives the last message of a proposal) and with ordered
consumers whose one filter is inside one board
(:class:`~blackboard.client.follower.OrderedFollower`, created through the
named API subject with the filter). :class:`ProposalFollower` follows one
proposal that way.

**A replica behind.** Any replica of ``BB_VOTE`` answers a direct get. When a
commit step's write is refused because the record is there already (or its ack
is a duplicate), the record exists at a known sequence: a 404 then comes from a
replica that has not applied it yet (a node restarted and catching up), so the
read is asked again after :data:`~blackboard.client.consumers.STALE_PAUSES`,
then made with a one-shot consumer from that sequence
(:func:`~blackboard.client.consumers.read_first`), counted in
:attr:`VoteStore.stale_reads`. An older outcome cannot be answered: each
proposal's outcome and applied subjects hold one message (written with
expected last sequence 0).

**Read-your-writes of a proposal.** The store remembers per proposal (bounded,
:class:`~blackboard.client.revisions.SeenRevisions` keyed by the proposal's
filter subject) the highest sequence it wrote or read on the proposal's
subjects (proposal, ballots, close requests, outcome, applied).
:meth:`VoteStore.last_sequence` never answers below it (so
:meth:`ProposalFollower.catch_up` waits for this client's own ballots), and
:meth:`VoteStore.read_proposal` does not take a 404 for a proposal it knows a
later sequence of at face value: the 404 stands only once a direct get of the
proposal's filter answers at least that sequence (that replica has applied
everything up to it); else it is asked again after ``STALE_PAUSES``, then read
with a one-shot consumer. Both are counted in :attr:`VoteStore.stale_reads`;
a current answer costs the one direct get.

The commit protocol, in short (``docs/voting.md`` has the whole of it):

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

Every step is idempotent, so any committer (every worker replica, and agents
on an open bus) can run :meth:`VoteStore.commit` at any time, and a committer
that crashes half-way is finished by the next one.

**Signatures** (docs/security.md, "Signatures"). Every message is published as
its record's canonical encoding and signed by the connection's key (afresh
before each send): proposals by their proposer, ballots by their voter, and
close requests, outcomes and applied records by the worker identity (the
board entry that applies an outcome too, its author being the worker's
principal, its marker naming the outcome record as its ``provenance``). Every
message read is verified (:meth:`VoteStore.verified`) before the log sees it:
a proposal or ballot must be signed by its proposer or voter, an outcome,
applied record or close request by a worker identity; what does not verify is
not taken (``VoteMessage.verdict``; the log ignores it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal

import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from blackboard.client.board_store import BoardStore
from blackboard.client.consumers import STALE_PAUSES, ask_again, read_first
from blackboard.client.follower import OrderedFollower
from blackboard.client.publisher import Ack, Publisher
from blackboard.client.revisions import SeenRevisions
from blackboard.client.signing import signing_of
from blackboard.consensus.log import (
    ProposalLog,
    RecordedOutcome,
    VoteKind,
    VoteMessage,
    decode_ballot,
    decode_outcome,
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
from blackboard.protocol.schemas.provenance import source_ref
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import VOTE_STREAM, Header, Subjects
from blackboard.security.verifier import Signed
from blackboard.settings import Settings

__all__ = ["CONSENSUS_METADATA", "ProposalFollower", "VoteFollower", "VoteStore", "vote_message"]

log = logging.getLogger("blackboard.client.consensus")

#: Metadata key marking a board entry written by a vote commit:
#: ``{"consensus": {"proposal_id": ..., "outcome_sequence": ..., "provenance": [<SourceRef of
#: the outcome record>]}}``.
CONSENSUS_METADATA = "consensus"
#: The kind of identity that signs outcomes, applied records and close requests.
WORKER_KIND = "worker"
#: The author field of each kind of vote record (the others are the worker's: no author field).
_AUTHOR_FIELD: dict[str, str] = {"proposal": "proposer", "ballot": "voter"}

_WRONG_LAST_SEQ = 10071
_SEQ_RE = re.compile(r"(\d+)\s*$")
#: Rounds of scan-then-write before giving up on applying (each lost round
#: means another writer changed the target entry in between).
_MAX_APPLY_ROUNDS = 50


def vote_message(msg: Msg) -> VoteMessage:
    """A JetStream message of ``BB_VOTE`` (consumer delivery) as a :class:`VoteMessage`
    (a ballot's with the voter its subject names).

    Raises:
        InvalidKeyError: not a vote subject.
    """
    board, pid, kind, voter = Subjects.parse_vote(msg.subject)
    md = msg.metadata
    ts = jetstream_time(msg.reply) or md.timestamp
    return VoteMessage(_kind(kind), board, pid, md.sequence.stream, ts, msg.data, dict(msg.headers or {}), voter)


def _author(kind: VoteKind, data: bytes, headers: Mapping[str, str]) -> str | None:
    """The author field of a proposal or ballot payload, read without the schema (the log
    decodes it again: one that does not decode is not taken anyway); None for other kinds."""
    name = _AUTHOR_FIELD.get(kind)
    if name is None:
        return None
    try:
        obj: Any = codec.decode(data, codec.encoding_of(headers))
    except InvalidPayloadError:
        return ""
    author = obj.get(name) if isinstance(obj, dict) else None
    return author if isinstance(author, str) else ""


def _canonical(kind: VoteKind, data: bytes, headers: Mapping[str, str]) -> Callable[[], bytes] | None:
    """The record's canonical bytes, for a payload that is not them (a JSON writer's)."""
    if kind == "close":
        return None

    def canonical() -> bytes:
        if kind == "proposal":
            return decode_proposal(data, headers).canonical_bytes()
        if kind == "ballot":
            return decode_ballot(data, headers).canonical_bytes()
        return decode_outcome(data, headers).canonical_bytes()

    return canonical


def _signed(msg: VoteMessage) -> Signed:
    """What the verifier checks of a vote message: signed by its proposer or voter, or else by
    a worker identity (outcomes, applied records, close requests)."""
    author = _author(msg.kind, msg.data, msg.headers)
    return Signed(Subjects.vote(msg.board, msg.proposal_id, msg.kind, msg.voter), msg.headers, msg.data,
                  stored_at=msg.timestamp, author=author,
                  canonical=_canonical(msg.kind, msg.data, msg.headers),
                  cache_key=(VOTE_STREAM, msg.sequence), kind=None if author is not None else WORKER_KIND)


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
            board writes this store commits. A connection that signs writes
            as its credential's principal, whatever ``name`` says.
        board: the board store that applies accepted outcomes to board
            entries (an agent passes its own); by default one of its own.
    """

    def __init__(self, nc: NATS, settings: Settings, *, name: str, board: BoardStore | None = None) -> None:
        self.nc = nc
        self.settings = settings
        signing = self.signing = signing_of(nc)
        self._signer = signing.signer
        self._verifier = signing.verifier
        self.name = name if self._signer is None else self._signer.principal
        self.js = nc.jetstream(timeout=settings.nats.request_timeout)
        self.subjects = Subjects(settings.board.bucket)
        self._owns_board = board is None
        #: the one writer of board entries: outcomes are applied through it
        self.board = board if board is not None else BoardStore(nc, settings)
        self._publisher = Publisher(nc, self.js, settings.nats)
        #: Vote messages read that did not verify (the log ignores them).
        self.hidden = 0
        #: Records known to exist that a direct get answered 404 for (a replica behind), read again.
        self.stale_reads = 0
        #: Per proposal filter subject, the highest sequence written or read on its subjects.
        self._seen = SeenRevisions()

    # ------------------------------------------------------------- publishing
    async def _publish(self, subject: str, payload: bytes, headers: dict[str, str], what: str,
                       key: str, expected: int | None) -> Ack:
        """Publish ``payload`` (a record's canonical bytes, or empty), signed before each send."""
        def conflict(exc: nats.js.errors.APIError) -> BlackboardError:
            if exc.err_code == _WRONG_LAST_SEQ:
                match = _SEQ_RE.search(exc.description or "")
                return ConflictError(key, expected, int(match.group(1)) if match else -1)
            return TransportError(f"JetStream refused {what}: {exc.description} (code {exc.err_code})")

        headers.setdefault(Header.MSG_ID.value, self._publisher.msg_id())
        if expected is not None:
            headers[Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value] = str(expected)
        return await self._publisher.publish(subject, payload, headers, what=what, map_api_error=conflict,
                                             stream=VOTE_STREAM,
                                             sign=self.signing.sign_before_send(subject, headers, payload))

    async def close(self) -> None:
        """Release the ack subscription (and the board store's, if it is this store's own)."""
        await self._publisher.close()
        if self._owns_board:
            await self.board.close()

    async def publish_proposal(self, proposal: Proposal) -> int:
        """Store a proposal; its id must be new on its board.

        Returns:
            The proposal message's stream sequence.

        Raises:
            ConflictError: a proposal with this id exists on the board.
            NotConnectedError, OperationTimeoutError: not acknowledged in time.
        """
        subject = Subjects.vote(proposal.board, proposal.id, "proposal")
        ack = await self._publish(subject, proposal.canonical_bytes(), {},
                                  f"proposal {proposal.id!r}", f"{proposal.board}.{proposal.id}", 0)
        return self._saw(proposal.board, proposal.id, int(ack.seq))

    async def publish_ballot(self, board: str, ballot: Ballot) -> int:
        """Store a ballot (whatever its fate) on its voter's subject
        (``bb.vote.<board>.<proposal>.ballot.<voter>``); returns its stream sequence.

        Under credentials only the voter itself may publish there.
        """
        subject = Subjects.vote(board, ballot.proposal_id, "ballot", ballot.voter)
        ack = await self._publish(subject, ballot.canonical_bytes(), {}, f"ballot {ballot.id!r}", subject, None)
        return self._saw(board, ballot.proposal_id, int(ack.seq))

    async def publish_close(self, board: str, proposal_id: str) -> int:
        """Ask for a deadline close: an empty message whose server timestamp is "now".

        Closers that ask within the same second are deduplicated. Published by
        the worker identity (or anyone on an open bus).
        """
        subject = Subjects.vote(board, proposal_id, "close")
        second = int(datetime.now(UTC).timestamp())
        headers = {Header.MSG_ID.value: Subjects.close_msg_id(board, proposal_id, second)}
        ack = await self._publish(subject, b"", headers, f"close of {proposal_id!r}", subject, None)
        return self._saw(board, proposal_id, int(ack.seq))

    # --------------------------------------------------------------- reading
    def _saw(self, board: str, proposal_id: str, sequence: int) -> int:
        """Remember ``sequence`` (written or read on the proposal's subjects); returns it."""
        self._seen.saw(Subjects.vote_filter(board, proposal_id), sequence)
        return sequence

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
        """The last message of one kind of a proposal (direct get, last by subject), with
        its verdict (:meth:`verified`), or ``None``. Not for ballots (their subjects name voters)."""
        subject = Subjects.vote(board, proposal_id, kind)
        msg = await self._direct(subject)
        if msg is None:
            return None
        headers = dict(msg.headers or {})
        ts = parse_server_time(headers.get(Header.TIMESTAMP.value)) or datetime.now(UTC)
        sequence = self._saw(board, proposal_id, int(headers[Header.SEQUENCE.value]))
        return await self.verified(VoteMessage(kind, board, proposal_id, sequence, ts, msg.data, headers))

    # ------------------------------------------------------------- verifying
    async def verified(self, msg: VoteMessage) -> VoteMessage:
        """``msg`` with this connection's verdict on its signature (unchanged when it does not
        verify: an open bus). A proposal must be signed by its proposer, a ballot by its voter,
        any other kind by a worker identity. What does not verify is counted in :attr:`hidden`."""
        verifier = self._verifier
        if verifier is None:
            return msg
        verdict = await verifier.verify(_signed(msg))
        if verdict is not Verdict.VERIFIED:
            self.hidden += 1
            log.info("vote message %d on %s.%s (%s) does not verify: %s", msg.sequence, msg.board,
                     msg.proposal_id, msg.kind, verdict.value)
        return dataclasses.replace(msg, verdict=verdict)

    async def _last_answer(self, filter_subject: str) -> int:
        """The sequence a direct get of a proposal's filter answers (0: 404)."""
        msg = await self._direct(filter_subject)
        return 0 if msg is None else int((msg.headers or {})[Header.SEQUENCE.value])

    async def last_sequence(self, board: str, proposal_id: str) -> int:
        """The stream sequence of the last message stored on a proposal's subjects (0: none).

        One direct get, last by the subject ``bb.vote.<board>.<proposal>.>``
        (the server answers with the last message matching it). Never below
        the sequence this store wrote or read there: a replica behind may answer older than what this
        store wrote or read (counted in :attr:`stale_reads`), and the store's own
        ballots are there all the same.
        """
        subject = Subjects.vote_filter(board, proposal_id)
        answered = await self._last_answer(subject)
        known = self._seen.revisions.get(subject, 0)
        if answered >= known:
            self._seen.saw(subject, answered)
            return answered
        self.stale_reads += 1
        log.debug("direct get of the last of %s answered %d, but this store saw %d", subject, answered, known)
        return known

    async def _read_proposal_message(self, board: str, proposal_id: str) -> VoteMessage | None:
        """The proposal's message; a 404 when this store knows a later sequence on the proposal's
        subjects (its own ballot) stands only once a direct get of the filter answers at least
        that (the answering replica has applied it all); else the proposal is asked again after
        :data:`STALE_PAUSES`, then read with a one-shot consumer (authoritative).

        Raises:
            OperationTimeoutError: the consumer did not deliver it within the request timeout.
        """
        msg = await self.read(board, proposal_id, "proposal")
        subject = Subjects.vote_filter(board, proposal_id)
        known = self._seen.revisions.get(subject, 0)
        if msg is not None or known == 0:
            return msg
        pauses = iter(STALE_PAUSES)
        while True:
            if await self._last_answer(subject) >= known:
                return None  # a replica that has applied everything this store saw: not there
            pause = next(pauses, None)
            if pause is None:
                break
            if pause == STALE_PAUSES[0]:
                self.stale_reads += 1
                log.debug("direct get of proposal %s.%s answered 404 from a replica behind %d: reading again",
                          board, proposal_id, known)
            await asyncio.sleep(pause)
            msg = await self.read(board, proposal_id, "proposal")
            if msg is not None:
                return msg
        return await self._read_from(Subjects.vote(board, proposal_id, "proposal"), 1)

    async def read_proposal(self, board: str, proposal_id: str) -> tuple[Proposal, int] | None:
        """The proposal and its stream sequence, or ``None`` if there is none (valid, and
        signed by its proposer when this connection verifies).

        A 404 after this store wrote or read on the proposal's subjects (its own
        ballot on a proposal it did not know) is checked as the module docstring says.
        """
        msg = await self._read_proposal_message(board, proposal_id)
        if msg is None or not msg.trusted:
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

    async def _probe(self, board: str, proposal_id: str, kind: VoteKind, stored_at: int | None = None) -> ProposalLog:
        """A log of the proposal fed with only its last message of ``kind`` (if any), which validates it.

        ``stored_at``: the sequence the message is known to be stored at (:meth:`_read_stored`)."""
        probe = ProposalLog(board, proposal_id)
        if stored_at is None:
            msg = await self.read(board, proposal_id, kind)
        else:
            msg = await self._read_stored(board, proposal_id, kind, stored_at)
        if msg is not None:
            probe.feed(msg)
        return probe

    async def _read_stored(self, board: str, proposal_id: str, kind: VoteKind, stored_at: int) -> VoteMessage | None:
        """The message of ``kind`` known to be stored at sequence ``stored_at`` (a write was refused
        because it is there, or acked as a duplicate of it): a direct get answering 404 is a
        replica behind, so it is asked again after :data:`STALE_PAUSES`, then the subject is read
        from ``stored_at`` with a one-shot consumer (None: not there after all).

        Raises:
            OperationTimeoutError: the consumer did not deliver it within the request timeout.
            NotConnectedError, TransportError: the read failed.
        """
        msg = await self.read(board, proposal_id, kind)
        if msg is not None:
            return msg
        self.stale_reads += 1
        log.debug("direct get of the %s of %s.%s answered 404, but it is stored at %d: reading again",
                  kind, board, proposal_id, stored_at)
        msg = await ask_again(lambda: self.read(board, proposal_id, kind))
        if msg is not None:
            return msg
        return await self._read_from(Subjects.vote(board, proposal_id, kind), stored_at)

    async def _read_from(self, subject: str, start: int) -> VoteMessage | None:
        """The first message on ``subject`` from sequence ``start`` on, verified, through a one-shot
        consumer (:func:`read_first`: authoritative where a direct get may be answered by a replica
        behind), or None.

        Raises:
            OperationTimeoutError: the consumer did not deliver it within the request timeout.
        """
        first = await read_first(self.nc, self.js, VOTE_STREAM, subject, max(1, start),
                                 timeout=self.settings.nats.request_timeout, what=f"read {subject}")
        return None if first is None else await self.verified(vote_message(first))

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
            ack: Ack | None = await self._publish(subject, body.canonical_bytes(), headers,
                                                  f"outcome of {outcome.proposal_id!r}", subject, 0)
            stored_at = self._saw(outcome.board, outcome.proposal_id, int(ack.seq)) if ack is not None else 0
        except ConflictError as exc:
            ack, stored_at = None, exc.current_revision
        if ack is not None and not ack.duplicate:
            # Stored by this very send (a resend of a stored one is a duplicate): its signature
            # is the one the headers hold now.
            return RecordedOutcome(body, int(ack.seq), datetime.now(UTC), base,
                                   source_ref(VOTE_STREAM, int(ack.seq), headers))
        recorded = (await self._probe(outcome.board, outcome.proposal_id, "outcome", stored_at)).recorded
        if recorded is None:
            raise TransportError(f"the outcome of {outcome.proposal_id!r} exists but cannot be read")
        if not same_outcome(recorded.outcome, body):
            log.warning("proposal %s.%s: the recorded outcome differs from the one computed by %s",
                        outcome.board, outcome.proposal_id, self.name)
        return recorded

    def _appliers(self, recorded: RecordedOutcome) -> frozenset[str] | None:
        """Who may have written an application of ``recorded`` (None: anyone, this connection
        does not verify): this committer, and the worker that signed the outcome record."""
        if self._verifier is None:
            return None
        names = {self.name}
        key = recorded.source.key if recorded.source is not None else None
        info = None if key is None else self._verifier.keys.lookup(key)
        if info is not None and info.kind == WORKER_KIND:
            names.add(info.principal)
        return frozenset(names)

    @staticmethod
    def _is_application(entry: Entry | None, outcome: Outcome, appliers: frozenset[str] | None = None) -> bool:
        """Whether ``entry`` applies ``outcome``: a put carrying its proposal's marker and, when
        signatures are verified (``appliers``), signed by a worker that commits (an agent that
        may write the board cannot fake an application)."""
        if entry is None or entry.operation is not Operation.PUT:
            return False
        if appliers is not None and (entry.verdict is not Verdict.VERIFIED or entry.author not in appliers):
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
        provenance = [] if recorded.source is None else [recorded.source.model_dump()]
        marker = {CONSENSUS_METADATA: {"proposal_id": o.proposal_id, "outcome_sequence": recorded.sequence,
                                       "provenance": provenance}}
        appliers = self._appliers(recorded)
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
                if self._is_application(entry, o, appliers):
                    return revision
                last_seen = revision
        assert conflict is not None
        raise conflict

    async def mark_applied(self, outcome: Outcome) -> Outcome:
        """Step 3: publish the applied outcome (with its revision), or read the winner's."""
        subject = Subjects.vote(outcome.board, outcome.proposal_id, "applied")
        try:
            ack = await self._publish(subject, outcome.canonical_bytes(), {},
                                      f"application of {outcome.proposal_id!r}", subject, 0)
            self._saw(outcome.board, outcome.proposal_id, int(ack.seq))
            if not ack.duplicate:
                return outcome
            stored_at = int(ack.seq)
        except ConflictError as exc:
            stored_at = exc.current_revision
        applied = (await self._probe(outcome.board, outcome.proposal_id, "applied", stored_at)).applied
        if applied is None:
            raise TransportError(f"the application of {outcome.proposal_id!r} exists but cannot be read")
        return applied

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
    is skipped, the follower goes on). An agent's filter stays inside one
    board (``bb.vote.<board>.>`` or one proposal's ``bb.vote.<board>.<proposal>.>``);
    the worker follows ``bb.vote.>``.
    """

    def __init__(self, store: VoteStore, filter_subject: str, on_message: Callable[[VoteMessage], None],
                 *, start: Literal["all", "new"] = "all") -> None:
        async def deliver(msg: Msg) -> None:
            on_message(await store.verified(vote_message(msg)))

        super().__init__(store.js, VOTE_STREAM, filter_subject, deliver, start=start, nc=store.nc)


class ProposalFollower:
    """One proposal's log, kept current by an ordered consumer on its subjects.

    The consumer (one filter, ``bb.vote.<board>.<proposal>.>``, replayed from
    the stream's first message of the proposal) feeds every message, with its
    stream sequence and exact server timestamp, to :attr:`log` in stream order.
    :meth:`catch_up` waits until what was stored before it was called (or up
    to a given sequence) has been fed; :meth:`wait_for` waits for a condition
    on the log. Each follower holds one consumer on ``BB_VOTE`` while started
    (a stream allows a limited number): stop followers that are no longer needed.

    ::

        async with ProposalFollower(store, board, pid) as f:
            await f.wait_for(lambda log: log.committed is not None, timeout=5)
    """

    def __init__(self, store: VoteStore, board: str, proposal_id: str) -> None:
        self.log = ProposalLog(board, proposal_id)
        self._store = store
        self._filter = Subjects.vote_filter(board, proposal_id)
        #: The stream sequence of the last message handled (vote subject or not).
        self.read_sequence = 0
        self._changed = asyncio.Event()
        self._stopped = False
        self._follower = OrderedFollower(store.js, VOTE_STREAM, self._filter, self._on_message, start="all",
                                         nc=store.nc, what=f"follow proposal {board}.{proposal_id}")

    @property
    def ready(self) -> asyncio.Event:
        """Set once the messages stored before the follower started have been fed."""
        return self._follower.ready

    async def __aenter__(self) -> ProposalFollower:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Create the consumer; the stored messages are fed from then on (``ready`` says when).

        Raises:
            NotConnectedError: NATS is closed or did not answer.
            ConsumerLimitError, TransportError: the server refused the consumer.
        """
        self._stopped = False
        await self._follower.start()

    async def stop(self) -> None:
        """Drop the consumer; waiters get ``NotConnectedError``."""
        self._stopped = True
        await self._follower.stop()
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _on_message(self, msg: Msg) -> None:
        try:
            sequence = msg.metadata.sequence.stream
        except (AttributeError, IndexError, ValueError):  # not a JetStream delivery
            return
        try:
            self.log.feed(await self._store.verified(vote_message(msg)))
        except InvalidKeyError:
            pass  # not a vote subject (a raw publish): nothing to feed, but read
        self.read_sequence = max(self.read_sequence, sequence)
        self._notify()

    async def catch_up(self, up_to: int | None = None, *, timeout: float | None = None) -> None:
        """Wait until every message stored on the proposal's subjects when this was
        called (or up to sequence ``up_to``) has been fed to the log.

        Without ``up_to``, one direct get (the last message of the proposal's
        subjects) says how far that is, or what the store wrote or read there
        if more (:meth:`VoteStore.last_sequence`: a replica behind answers
        older, this client's own ballots are waited for all the same).
        ``timeout`` defaults to the write timeout.

        Raises:
            OperationTimeoutError: not read that far in time (a replica serving
                reads lags far behind, or the consumer cannot be created).
            NotConnectedError: the follower was stopped.
        """
        if up_to is None:
            up_to = await self._store.last_sequence(self.log.board, self.log.proposal_id)
        if self.read_sequence >= up_to:
            return
        wait = self._store.settings.nats.write_timeout if timeout is None else timeout
        try:
            await self._wait(lambda: self.read_sequence >= up_to, wait)
        except OperationTimeoutError as exc:
            raise OperationTimeoutError(f"message {up_to} of proposal {self.log.proposal_id!r} is not "
                                        f"readable after {wait:g}s (read up to {self.read_sequence})") from exc

    async def wait_for(self, predicate: Callable[[ProposalLog], bool], timeout: float | None = None) -> None:
        """Wait until ``predicate(log)`` holds (checked after every message fed).

        Raises:
            OperationTimeoutError: it did not within ``timeout`` seconds.
            NotConnectedError: the follower was stopped.
        """
        await self._wait(lambda: predicate(self.log), timeout)

    async def _wait(self, done: Callable[[], bool], timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not done():
            if self._stopped:
                raise NotConnectedError(f"stopped following {self.log.board}.{self.log.proposal_id}")
            changed = self._changed
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise OperationTimeoutError(f"{self.log.board}.{self.log.proposal_id}: condition not met "
                                            f"within {timeout:g}s")
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                pass
