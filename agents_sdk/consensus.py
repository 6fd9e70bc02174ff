"""Consensus voting for agents: propose, vote, wait for the outcome, watch.

::

    p = await board.propose("facts", "capital", candidates=["Paris", "Lyon"],
                            voters=["a", "b", "c"], deadline=timedelta(minutes=5))
    await other_agents_board.vote(p.id, "Paris", reason="the atlas says so")
    outcome = await p.outcome()          # committed exactly once, board entry written

A voter learns its ballot's fate synchronously: ``vote`` publishes the ballot
(on its own subject, ``bb.vote.<board>.<proposal>.ballot.<agent id>``), then
follows the proposal's stream up to the ballot's own sequence and runs the
pure tally, so a rejected ballot raises its typed error (and stays recorded as
rejected).

The outcome is committed by the worker's committer
(:class:`blackboard.worker.committer.VoteCommitter`): an agent publishes
proposals and its own ballots only, and waits for the committed outcome
(``OutcomeTimeoutError`` when none arrives in time). Only on an insecure open
bus (``settings.nats.insecure_open_bus``, where no worker may run) does an
agent also record outcomes, ask for deadline closes and apply accepted
values itself; the protocol in :mod:`blackboard.client.consensus` keeps that
exactly once whoever races. Rules: ``docs/voting.md``.

Every proposal and ballot is signed by the agent's key, and every vote message
read is verified (:meth:`blackboard.client.consensus.VoteStore.verified`): a
proposal or ballot that does not verify is not counted (an agent's own ballot
that does not verify raises ``UnverifiedRecordError``), an outcome must be
signed by a worker identity, and a watch hides what does not verify (or, with
``security.unverified = "flag"``, passes it with its ``verdict``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from agents_sdk._args import name_list, sequence_arg
from blackboard.client.consensus import ProposalFollower, VoteFollower, VoteStore
from blackboard.consensus.log import (
    ProposalLog,
    VoteKind,
    VoteMessage,
    decode_ballot,
    decode_outcome,
    decode_proposal,
)
from blackboard.consensus.tally import choice_for, rejection_error
from blackboard.observability import tracing
from blackboard.protocol.errors import (
    InvalidBallotError,
    InvalidPayloadError,
    NotConnectedError,
    OperationTimeoutError,
    OutcomeTimeoutError,
    ProposalNotFoundError,
    UnverifiedRecordError,
)
from blackboard.protocol.schemas import (
    Ballot,
    Choice,
    Outcome,
    Policy,
    PolicyKind,
    Proposal,
    TallyCounts,
)
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import Subjects, validate_name

if TYPE_CHECKING:
    from agents_sdk.context import AgentContext

__all__ = ["NO_VALUE", "BallotReceipt", "ProposalHandle", "VoteEvent", "VoteWatch", "Voting"]

#: Followed proposals kept per agent (each holds a consumer on ``BB_VOTE``);
#: beyond it, unused ones are stopped, committed ones first.
_MAX_FOLLOWED = 32
#: Seconds ``outcome()`` leaves a decision to its committer (the deciding voter,
#: the closing worker) before committing it itself (on an open bus only).
COMMIT_GRACE = 0.25


class _NoValue:
    def __repr__(self) -> str:
        return "NO_VALUE"


#: Default of ``propose(value=...)``: no single value given (``None`` is a value).
NO_VALUE: Any = _NoValue()

DeadlineSpec = datetime | timedelta | float | int | None


@dataclass(frozen=True, slots=True)
class BallotReceipt:
    """A counted ballot. ``outcome`` is set when this ballot decided the
    proposal (it is then committed)."""

    proposal_id: str
    ballot_id: str
    sequence: int
    outcome: Outcome | None = None

    @property
    def decided(self) -> bool:
        return self.outcome is not None


@dataclass(frozen=True, slots=True)
class VoteEvent:
    """A message seen by :meth:`Board.watch_votes`: a proposal, a ballot, a
    close request, a recorded or an applied outcome. ``message`` is the decoded
    model (``None`` for a close request or a message that does not decode).
    ``verdict`` is the verdict on its signature (``unsigned`` when the
    connection does not verify; anything but ``verified`` only with
    ``security.unverified = "flag"``: such events are hidden by default)."""

    kind: VoteKind
    board: str
    proposal_id: str
    sequence: int
    timestamp: datetime
    message: Proposal | Ballot | Outcome | None
    verdict: Verdict = Verdict.UNSIGNED


def _deadline(value: DeadlineSpec) -> datetime | None:
    if value is None:
        return None
    now = datetime.now(UTC)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidPayloadError("the deadline must be timezone-aware")
        deadline = value.astimezone(UTC)
    elif isinstance(value, timedelta | int | float) and not isinstance(value, bool):
        try:
            deadline = now + (value if isinstance(value, timedelta) else timedelta(seconds=float(value)))
        except (OverflowError, ValueError) as exc:  # 1e30 seconds, NaN
            raise InvalidPayloadError("the deadline is out of range") from exc
    else:
        raise InvalidPayloadError(f"a deadline is a datetime, a timedelta or seconds, not {type(value).__name__}")
    if deadline <= now:
        raise InvalidPayloadError(f"the deadline {deadline.isoformat()} is not in the future")
    return deadline


def _wire_choice(proposal: Proposal | None, choice: Any, index: bool) -> Choice:
    """The wire choice of ``choice``; an unknown proposal's ballot keeps what it can."""
    if index or proposal is None:
        if choice in ("reject", "abstain"):
            return "reject" if choice == "reject" else "abstain"
        if isinstance(choice, int) and not isinstance(choice, bool) and choice >= 0:
            return choice
        if proposal is None:
            return "abstain"  # not countable anyway: recorded for the audit trail
        raise InvalidBallotError(proposal.id, f"{choice!r} is not a candidate index, 'reject' or 'abstain'")
    return choice_for(proposal, choice)


class ProposalHandle:
    """A proposal as seen by one agent. Get one from ``board.propose`` or ``board.proposal``."""

    def __init__(self, voting: Voting, proposal: Proposal, sequence: int) -> None:
        self._voting = voting
        self.proposal = proposal
        #: Stream sequence of the proposal message.
        self.sequence = sequence

    def __repr__(self) -> str:
        return f"ProposalHandle({self.proposal.board!r}, {self.proposal.id!r})"

    @property
    def id(self) -> str:
        return self.proposal.id

    @property
    def board(self) -> str:
        return self.proposal.board

    async def vote(self, choice: Any, *, reason: str | None = None, index: bool = False,
                   ballot_id: str | None = None) -> BallotReceipt:
        """This agent's ballot; see :meth:`Voting.vote`."""
        return await self._voting.vote(self.board, self.id, choice, reason=reason, index=index,
                                       ballot_id=ballot_id)

    async def outcome(self, timeout: float | None = None) -> Outcome:
        """Wait for the committed outcome (the worker commits it; on an open bus, this
        agent commits it if it sees the decision first).

        Raises:
            OutcomeTimeoutError: no outcome within ``timeout`` seconds.
        """
        return await self._voting.outcome(self.board, self.id, timeout=timeout)

    async def counts(self) -> TallyCounts:
        """The current tally (counted ballots per choice), from the stream."""
        return await self._voting.counts(self.board, self.id)

    async def commit(self) -> Outcome | None:
        """The committed outcome if the proposal is decided (waiting for the worker to
        commit it; on an open bus, committing it: idempotent, safe to race);
        ``None`` while it is open.

        Raises:
            OutcomeTimeoutError: decided, but not committed within the write timeout.
        """
        return await self._voting.commit(self.board, self.id)

    async def close(self, timeout: float | None = None) -> Outcome | None:
        """The outcome of a proposal whose deadline has passed (on this machine's
        clock), once closed and committed: the worker closes it at the deadline
        (on an open bus, this agent asks for the close and commits it).
        ``None`` if the deadline has not passed.

        Raises:
            OutcomeTimeoutError: not closed and committed within ``timeout`` seconds.
        """
        return await self._voting.close_expired(self.board, self.id, timeout=timeout)


class Voting:
    """The voting side of one agent (``agent.voting``); ``Board`` methods delegate here."""

    @property
    def hidden(self) -> int:
        """Vote messages read that did not verify (not counted, not shown by watches)."""
        return self.store.hidden

    def __init__(self, context: AgentContext) -> None:
        #: The agent's shared state (its id is the proposer and voter).
        self.context = context
        self.store = VoteStore(context.nc, context.settings, name=context.agent_id, board=context.store)
        #: Record outcomes, ask for deadline closes and apply accepted values
        #: ourselves: only on an insecure open bus (elsewhere the worker does,
        #: and the server's permissions forbid it to agents).
        self.self_commit = context.settings.nats.insecure_open_bus
        self._followers: collections.OrderedDict[tuple[str, str], ProposalFollower] = collections.OrderedDict()
        #: Callers currently using each follower (an unused one may be stopped).
        self._users: collections.Counter[tuple[str, str]] = collections.Counter()
        #: One lock per proposal whose follower is being started (callers wait for one start).
        self._starting: dict[tuple[str, str], asyncio.Lock] = {}
        self._closed = False
        self._proposals: dict[tuple[str, str], tuple[Proposal, int]] = {}
        self._watches: set[VoteWatch] = set()
        #: Seconds ``outcome()`` waits for another committer before committing itself.
        self.commit_grace = COMMIT_GRACE

    # ------------------------------------------------------------- proposing
    @tracing.traced("propose", attributes=lambda self, board, section, key, *_, **__: {
        "messaging.system": "nats", "messaging.operation.type": "send", "blackboard.board": board,
        "blackboard.section": section, "blackboard.key": key})
    async def propose(self, board: str, section: str, key: str, candidates: Sequence[Any] | None = None, *,
                      value: Any = NO_VALUE, policy: Policy | PolicyKind = "majority",
                      voters: Sequence[str] | None = None, deadline: DeadlineSpec = None,
                      question: str = "", proposal_id: str | None = None) -> ProposalHandle:
        """Open a proposal about the entry ``(section, key)`` of ``board``.

        Args:
            candidates: the values to choose from (distinct JSON values), or
            value: a single value to accept or reject.
            policy: a :class:`Policy`, or just its kind (``"majority"``, ``"unanimous"``).
            voters: eligible agent ids; ``None`` lets any agent vote (needs a deadline).
            deadline: a timezone-aware datetime, a timedelta or seconds from now.
            proposal_id: defaults to a random id.

        Raises:
            InvalidPayloadError: invalid proposal (no candidates, duplicates, an
                open electorate without deadline, a deadline in the past, ...).
            InvalidKeyError: invalid section, key or proposal id.
            ConflictError: a proposal with this id exists on the board.
            NotConnectedError, OperationTimeoutError: not acknowledged in time.
        """
        if (candidates is None) == (value is NO_VALUE):
            raise InvalidPayloadError("give either candidates=[...] or value=...")
        self.store.subjects.entry(board, section, key)  # validates the target's address
        try:
            proposal = Proposal(
                id=proposal_id or uuid.uuid4().hex, board=board, section=section, key=key, question=question,
                candidates=[value] if candidates is None else sequence_arg(candidates, "candidates"),
                policy=policy if isinstance(policy, Policy) else Policy(kind=policy),
                voters=None if voters is None else name_list(voters, "voters"), proposer=self.context.agent_id,
                created_at=datetime.now(UTC), deadline=_deadline(deadline))
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InvalidPayloadError(f"invalid proposal: {'.'.join(map(str, first['loc']))}: "
                                      f"{first['msg']}") from exc
        # As every reader will have it: decoded from the canonical bytes that are published.
        proposal = decode_proposal(proposal.canonical_bytes())
        sequence = await self.store.publish_proposal(proposal)
        self._proposals[(board, proposal.id)] = (proposal, sequence)
        return ProposalHandle(self, proposal, sequence)

    async def _proposal(self, board: str, proposal_id: str) -> tuple[Proposal, int] | None:
        validate_name(proposal_id, "proposal id")  # before the lookup: a dict or list is unhashable
        found = self._proposals.get((board, proposal_id))
        if found is None:
            found = await self.store.read_proposal(board, proposal_id)
            if found is not None:
                self._proposals[(board, proposal_id)] = found
        return found

    async def proposal(self, board: str, proposal_id: str) -> ProposalHandle:
        """A handle on an existing proposal.

        Raises:
            ProposalNotFoundError: there is no such proposal on the board.
        """
        found = await self._proposal(board, proposal_id)
        if found is None:
            raise ProposalNotFoundError(proposal_id)
        return ProposalHandle(self, *found)

    # ---------------------------------------------------------------- voting
    @tracing.traced("vote", attributes=lambda self, board, proposal_id, *_, **__: {
        "messaging.system": "nats", "messaging.operation.type": "send", "blackboard.board": board,
        "blackboard.proposal": proposal_id})
    async def vote(self, board: str, proposal_id: str, choice: Any, *, reason: str | None = None,
                   index: bool = False, ballot_id: str | None = None) -> BallotReceipt:
        """Cast this agent's ballot and learn its fate.

        ``choice`` is a candidate's value (or ``"accept"`` for a one-value
        proposal), ``"reject"`` or ``"abstain"``; with ``index=True``, a
        candidate's index. A later ballot of the same agent replaces its
        earlier one while the proposal is open. Every ballot is stored, so a
        rejected one stays on record with its reason. When this ballot decides
        the proposal, ``vote`` returns once the outcome is committed (by the
        worker; on an open bus, by this agent).

        Returns:
            The receipt of a counted ballot (with the committed outcome if this
            ballot decided the proposal).

        Raises:
            ProposalNotFoundError: no such proposal (when the ballot was stored).
            IneligibleVoterError: this agent is not among the proposal's voters.
            ProposalClosedError: the proposal was already decided.
            DeadlinePassedError: the server stored the ballot after the deadline.
            InvalidBallotError: not a candidate, or a ballot id already counted.
            UnverifiedRecordError: the stored ballot does not verify (its certificate is not
                in the key registry, this machine's clock is off...): it is not counted.
            OutcomeTimeoutError: this ballot decided, but no outcome was committed
                within the write timeout (no worker runs?); the ballot counted.
            NotConnectedError, OperationTimeoutError: no answer in time.
        """
        found = await self._proposal(board, proposal_id)
        wire = _wire_choice(found[0] if found else None, choice, index)
        try:
            ballot = Ballot(id=ballot_id or uuid.uuid4().hex, proposal_id=proposal_id, voter=self.context.agent_id,
                            choice=wire, reason=reason, created_at=datetime.now(UTC))
        except ValidationError as exc:
            raise InvalidBallotError(proposal_id, str(exc.errors()[0]["msg"])) from exc
        async with contextlib.AsyncExitStack() as stack:
            follower = await stack.enter_async_context(self._following(board, proposal_id)) if found else None
            sequence = await self.store.publish_ballot(board, ballot)
            if follower is None:
                # Unknown when we looked; it counts only if a proposal was stored before the ballot.
                again = await self.store.read_proposal(board, proposal_id)
                if again is None or again[1] > sequence:
                    raise ProposalNotFoundError(proposal_id)
                follower = await stack.enter_async_context(self._following(board, proposal_id))
            await follower.catch_up(up_to=sequence)
            plog = follower.log
            if sequence not in plog.fates:
                raise InvalidBallotError(proposal_id, "the stored ballot does not decode")
            rejection = plog.fates[sequence]
            if rejection is not None and rejection.reason == "unverified":
                verdict = plog.unverified.get(sequence, Verdict.MALFORMED)
                raise UnverifiedRecordError(verdict.value, Subjects.vote(board, proposal_id, "ballot", ballot.voter),
                                            sequence=sequence, signer=self.store.name, record=ballot)
            if rejection is not None:
                raise rejection_error(proposal_id, rejection)
            decided = plog.decided
            outcome = None
            if decided is not None and decided.deciding_sequence == sequence:
                outcome = await self._committed(follower, decided, self._write_timeout)
        return BallotReceipt(proposal_id, ballot.id, sequence, outcome)

    @property
    def _write_timeout(self) -> float:
        return self.context.settings.nats.write_timeout

    async def _committed(self, follower: ProposalFollower, decided: Outcome | None,
                         timeout: float | None) -> Outcome:
        """The committed outcome of a decided proposal: committed here on an open bus,
        else waited for (the worker commits it).

        Raises:
            OutcomeTimeoutError: not committed within ``timeout`` seconds.
        """
        plog = follower.log
        pid = plog.proposal_id
        if plog.committed is not None:
            return plog.committed
        if self.self_commit and decided is not None:
            loop = asyncio.get_running_loop()
            end = None if timeout is None else loop.time() + timeout
            try:
                return await asyncio.wait_for(self.store.commit(decided, known=plog),
                                              None if end is None else max(0.0, end - loop.time()))
            except OperationTimeoutError:
                raise
            except TimeoutError as exc:
                raise OutcomeTimeoutError(pid, timeout or 0.0) from exc
        try:
            await follower.wait_for(lambda log: log.committed is not None, timeout)
        except OperationTimeoutError as exc:
            raise OutcomeTimeoutError(pid, timeout or 0.0) from exc
        assert plog.committed is not None
        return plog.committed

    # -------------------------------------------------------------- outcomes
    async def follower(self, board: str, proposal_id: str) -> ProposalFollower:
        """The (shared, started) follower of one proposal's stream.

        It may be stopped later to free its consumer, once unused: hold it with
        ``async with voting.following(board, pid)`` while waiting on it.
        """
        key = (board, proposal_id)
        follower = self._followers.get(key)
        if follower is not None:
            self._followers.move_to_end(key)
            return follower
        lock = self._starting.setdefault(key, asyncio.Lock())
        async with lock:  # concurrent callers share one start; a failed start is tried again by the next
            follower = self._followers.get(key)
            if follower is None:
                follower = await self._start_follower(key)
        if self._starting.get(key) is lock and not lock.locked():
            del self._starting[key]
        return follower

    @contextlib.asynccontextmanager
    async def _following(self, board: str, proposal_id: str) -> AsyncIterator[ProposalFollower]:
        """The follower of a proposal, kept started while the block runs."""
        key = (board, proposal_id)
        self._users[key] += 1
        try:
            follower = await self.follower(board, proposal_id)
            yield follower
        finally:
            self._users[key] -= 1
            if self._users[key] <= 0:
                del self._users[key]

    async def _start_follower(self, key: tuple[str, str]) -> ProposalFollower:
        if self._closed:
            raise NotConnectedError("the agent is closed")
        follower = ProposalFollower(self.store, *key)
        await follower.start()
        if self._closed:  # closed while starting: close() did not see this follower
            await follower.stop()
            raise NotConnectedError("the agent is closed")
        self._followers[key] = follower
        await self._evict(key)
        return follower

    async def _evict(self, keep: tuple[str, str]) -> None:
        """Stop unused followers beyond :data:`_MAX_FOLLOWED` (committed ones first, then the
        least recently used), freeing their consumers."""
        while len(self._followers) > _MAX_FOLLOWED:
            idle = [k for k in self._followers if k != keep and not self._users.get(k)]
            if not idle:
                return
            done = [k for k in idle if self._followers[k].log.committed is not None]
            victim = (done or idle)[0]
            await self._followers.pop(victim).stop()

    async def outcome(self, board: str, proposal_id: str, *, timeout: float | None = None) -> Outcome:
        """Wait for a proposal's committed outcome (on an open bus, committing it on the way if decided).

        Raises:
            ProposalNotFoundError: no such proposal.
            OutcomeTimeoutError: not committed within ``timeout`` seconds.
        """
        if await self._proposal(board, proposal_id) is None:
            raise ProposalNotFoundError(proposal_id)
        async with self._following(board, proposal_id) as follower:
            plog = follower.log
            if not self.self_commit:
                return await self._committed(follower, None, timeout)
            loop = asyncio.get_running_loop()
            end = None if timeout is None else loop.time() + timeout

            def settled(log: ProposalLog) -> bool:
                return log.committed is not None or log.decided is not None or log.recorded is not None

            try:
                await follower.wait_for(settled, timeout)
            except OperationTimeoutError as exc:
                raise OutcomeTimeoutError(proposal_id, timeout or 0.0) from exc
            if plog.committed is None:
                # The deciding voter (or a closer) is committing; racing it only
                # adds work. Commit ourselves if it does not show up.
                grace = self.commit_grace if end is None else min(self.commit_grace, max(0.0, end - loop.time()))
                with contextlib.suppress(OperationTimeoutError):
                    await follower.wait_for(lambda log: log.committed is not None, grace)
            decided = plog.recorded.outcome if plog.recorded is not None else plog.decided
            remaining = None if end is None else max(0.0, end - loop.time())
            return await self._committed(follower, decided, remaining)

    async def counts(self, board: str, proposal_id: str) -> TallyCounts:
        """The current tally of a proposal (counted ballots per choice), from the stream.

        Raises:
            ProposalNotFoundError: no such proposal (when read).
        """
        async with self._following(board, proposal_id) as follower:
            await follower.catch_up()
            if follower.log.tally is None:
                raise ProposalNotFoundError(proposal_id)
            return follower.log.tally.counts()

    async def commit(self, board: str, proposal_id: str) -> Outcome | None:
        """The committed outcome of a decided proposal (on an open bus, committed here:
        idempotent); ``None`` while open.

        Raises:
            OutcomeTimeoutError: decided, but not committed within the write timeout.
        """
        async with self._following(board, proposal_id) as follower:
            await follower.catch_up()
            plog = follower.log
            decided = plog.recorded.outcome if plog.recorded is not None else plog.decided
            if decided is None:
                return None
            return await self._committed(follower, decided, self._write_timeout)

    async def close_expired(self, board: str, proposal_id: str, *, timeout: float | None = None) -> Outcome | None:
        """Wait for the close of a proposal whose deadline passed (on this clock) and return
        its committed outcome; ``None`` if the deadline has not passed.

        The worker closes it at the deadline; on an open bus this agent asks
        for the close itself (a ``close`` request, again every second while the
        server's clock is behind) and commits the outcome.

        Raises:
            ProposalNotFoundError: no such proposal.
            OutcomeTimeoutError: not closed and committed within ``timeout`` seconds.
        """
        found = await self._proposal(board, proposal_id)
        if found is None:
            raise ProposalNotFoundError(proposal_id)
        deadline = found[0].deadline
        if deadline is None or datetime.now(UTC) <= deadline:
            return None
        async with self._following(board, proposal_id) as follower:
            if not self.self_commit:
                return await self._committed(follower, None, timeout)
            await follower.catch_up()
            loop = asyncio.get_running_loop()
            end = None if timeout is None else loop.time() + timeout
            while follower.log.is_open:
                # Closed by the first stored message stamped after the deadline; if
                # the server's clock is behind ours, ask again a little later.
                await self.store.publish_close(board, proposal_id)
                step = 1.0 if end is None else min(1.0, end - loop.time())
                try:
                    await follower.wait_for(lambda log: not log.is_open, max(0.0, step))
                except OperationTimeoutError as exc:
                    if end is not None and loop.time() >= end:
                        raise OutcomeTimeoutError(proposal_id, timeout or 0.0) from exc
            plog = follower.log
            decided = plog.recorded.outcome if plog.recorded is not None else plog.decided
            remaining = None if end is None else max(0.0, end - loop.time())
            return await self._committed(follower, decided, remaining)

    # -------------------------------------------------------------- watching
    def watch(self, board: str, proposal_id: str | None = None, *,
              start: Literal["new", "all"] = "new") -> VoteWatch:
        """Watch proposals, ballots and outcomes of a board (or of one proposal)."""
        return VoteWatch(self, Subjects.vote_filter(board, proposal_id), start)

    async def close(self) -> None:
        """Stop following proposals and end the watches."""
        self._closed = True
        followers, self._followers = list(self._followers.values()), collections.OrderedDict()
        for follower in followers:
            await follower.stop()
        for watch in list(self._watches):
            await watch.stop()
        await self.store.close()


class VoteWatch:
    """An async iterator of :class:`VoteEvent` (``async with board.watch_votes() as w``)."""

    def __init__(self, voting: Voting, filter_subject: str, start: Literal["new", "all"]) -> None:
        self._voting = voting
        self._queue: asyncio.Queue[VoteEvent | None] = asyncio.Queue()
        self._follower = VoteFollower(voting.store, filter_subject, self._on, start=start)
        self._closed = False

    @property
    def ready(self) -> asyncio.Event:
        """Set once the messages stored before the watch started have arrived (``start="all"``)."""
        return self._follower.ready

    def _on(self, msg: VoteMessage) -> None:
        verdict = Verdict.UNSIGNED if msg.verdict is None else msg.verdict
        if not msg.trusted and self._voting.context.settings.security.unverified != "flag":
            return  # hidden (counted by the store)
        model: Proposal | Ballot | Outcome | None = None
        try:
            if msg.kind == "proposal":
                model = decode_proposal(msg.data, msg.headers)
            elif msg.kind == "ballot":
                model = decode_ballot(msg.data, msg.headers)
            elif msg.kind in ("outcome", "applied"):
                model = decode_outcome(msg.data, msg.headers)
        except InvalidPayloadError:
            model = None
        self._queue.put_nowait(VoteEvent(msg.kind, msg.board, msg.proposal_id, msg.sequence, msg.timestamp, model,
                                         verdict))

    async def __aenter__(self) -> VoteWatch:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        await self._follower.start()
        self._voting._watches.add(self)

    async def stop(self) -> None:
        self._voting._watches.discard(self)
        await self._follower.stop()
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(None)

    def __aiter__(self) -> AsyncIterator[VoteEvent]:
        return self

    async def __anext__(self) -> VoteEvent:
        item = await self._queue.get()
        if item is None:
            self._queue.put_nowait(None)
            raise StopAsyncIteration
        return item

    async def next(self, timeout: float | None = None) -> VoteEvent:
        """The next event within ``timeout`` seconds.

        Raises:
            OperationTimeoutError: nothing arrived in time.
            StopAsyncIteration: the watch was stopped.
        """
        try:
            return await asyncio.wait_for(self.__anext__(), timeout)
        except TimeoutError as exc:
            raise OperationTimeoutError(f"no vote event within {timeout}s") from exc
