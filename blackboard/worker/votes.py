"""The worker's persistence of consensus voting.

:func:`vote_handler` persists ``BB_VOTE`` into ``bb_proposals``,
``bb_ballots`` and ``bb_outcomes``. Each ballot's fate (counted, superseded,
rejected and why) is recomputed with the pure tally over the proposal's
stored ballots whenever its rows change, so PostgreSQL says what the stream
says. A ballot is stored only as the voter its subject names
(``bb.vote.<board>.<proposal>.ballot.<voter>``): one whose payload names
another voter is a dead letter.

Committing outcomes and closing proposals at their deadline is the
committer's (:mod:`blackboard.worker.committer`), which needs no PostgreSQL.
An outcome of a contradiction between memories settles the memories in the
transaction that stores it (:func:`blackboard.worker.contradictions.settle_outcomes`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from psycopg.types.json import Jsonb
from pydantic import ValidationError

from blackboard.consensus.log import (
    classify_ballots,
    decode_ballot,
    decode_outcome,
    decode_proposal,
)
from blackboard.consensus.tally import StampedBallot
from blackboard.db import vote_sql as q
from blackboard.protocol.errors import InvalidKeyError, InvalidPayloadError
from blackboard.protocol.schemas import Ballot, Outcome, Proposal
from blackboard.protocol.subjects import VOTE_STREAM, Header, Subjects
from blackboard.security.verifier import Signed
from blackboard.settings import Settings
from blackboard.worker.contradictions import settle_outcomes
from blackboard.worker.decode import RawMessage
from blackboard.worker.stream_handler import Conn, StreamHandler

__all__ = ["VoteRow", "decode_vote", "vote_handler", "vote_signed", "write_votes"]

log = logging.getLogger("blackboard.worker.votes")

M = TypeVar("M", Proposal, Ballot)


@dataclass(slots=True)  # not frozen: the ingest loop sets the verdict
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
    #: The signature's verdict (``blackboard.protocol.signing.Verdict``), set by the ingest loop.
    verdict: str = "unsigned"


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
            proposal/ballot/outcome for its subject, e.g. a ballot whose voter
            is not its subject's (a dead letter; the tally ignores such
            messages too).
    """
    try:
        board, pid, kind, voter = Subjects.parse_vote(msg.subject)
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
        if model.voter != voter:
            raise InvalidPayloadError(f"ballot of voter {model.voter!r} on {msg.subject} (voter {voter!r})")
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
            None if o.value is None else Jsonb(_pg_safe(o.value)), o.closed_by, o.deciding_sequence, row.verdict)


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
                 p.created_at, p.deadline, r.stored_at, p.section, _pg_safe(p.key), _pg_safe(p.question),
                 r.verdict)
                for r, p in proposals])
        ballots = [(r, r.model) for r in rows if isinstance(r.model, Ballot)]
        if ballots:
            await cur.executemany(q.INSERT_BALLOT, [
                (r.stream, r.seq, r.board, r.proposal_id, b.voter, Jsonb(_body(r, b)),
                 b.created_at, r.stored_at, _pg_safe(b.id), str(b.choice), r.verdict)
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
    # A contradiction between memories put to a vote is settled with its outcome's row.
    await settle_outcomes(conn, [r.model for r in rows if isinstance(r.model, Outcome)])


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


def vote_signed(msg: RawMessage, row: VoteRow) -> Signed:
    """What the signature of a vote record must prove: a proposal written by its
    ``proposer``, a ballot by its ``voter``; a close request, a recorded outcome and its
    application by a worker identity (the committer's)."""
    model = row.model
    canonical = model.canonical_bytes if model is not None else None
    if isinstance(model, Proposal):
        return Signed(msg.subject, msg.headers, msg.data, msg.timestamp, model.proposer, canonical)
    if isinstance(model, Ballot):
        return Signed(msg.subject, msg.headers, msg.data, msg.timestamp, model.voter, canonical)
    return Signed(msg.subject, msg.headers, msg.data, msg.timestamp, None, canonical, kind="worker")


def vote_handler(settings: Settings) -> StreamHandler:
    """The persistence handler of ``BB_VOTE`` (for the worker's handler table)."""
    max_bytes = settings.worker.max_message_bytes or settings.board.max_value_size

    def decode(msg: RawMessage) -> VoteRow:
        return decode_vote(msg, max_bytes=max_bytes)

    return StreamHandler("votes", VOTE_STREAM, Subjects.votes_all(), decode, write_votes, signed=vote_signed)
