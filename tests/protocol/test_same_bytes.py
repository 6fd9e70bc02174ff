"""The SDK and the worker produce and accept the same bytes, for every record type.

For each record the SDK writes (board entry, long-term memory, forget,
message, proposal, ballot, outcome): the bytes of the SDK's own encoder are
accepted by the decoder the worker uses, which yields the same field values,
and the canonical encoding (docs/protocol.md §13) computed from the SDK's
record and from what the worker decoded is the same byte string. The pure
tests call the SDK's encoders directly; the integration tests publish through
the real SDK and decode the stored message with the worker's decoder.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from agents_sdk import Agent
from agents_sdk.messaging import decode_envelope, encode_envelope, new_envelope
from blackboard.consensus.log import decode_ballot, decode_outcome, decode_proposal
from blackboard.protocol import codec
from blackboard.protocol import entries as sdk_entries
from blackboard.protocol.records import metadata_order_of
from blackboard.protocol.schemas import (
    Ballot,
    EntryEnvelope,
    MemoryForget,
    MemoryRecord,
    MessageEnvelope,
    validate_wire,
)
from blackboard.protocol.subjects import MEMORY_STREAM, MESSAGE_STREAM, VOTE_STREAM, Subjects
from blackboard.settings import Settings
from blackboard.worker.decode import (
    EntryRow,
    ForgetRow,
    MemoryRow,
    RawMessage,
    decode_entry,
    decode_memory,
)
from blackboard.worker.messages import MessageRow, decode_message
from tests._auth import operator_nats
from tests._committer import committer_settings, running_committer

MAX_BYTES = 1 << 20
CHARS = 100_000
SUBJECTS = Subjects("blackboard")
T0 = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def _raw(stream: str, seq: int, subject: str, data: bytes, headers: Mapping[str, str] | None) -> RawMessage:
    return RawMessage(stream, seq, subject, dict(headers or {}), data, datetime.now(UTC))


# ------------------------------------------------- the worker's rows, as records again
def _entry_of(row: EntryRow) -> EntryEnvelope:
    value = row.value if row.value_raw is None else codec.decode(row.value_raw)
    return EntryEnvelope(value=value, content_type=row.content_type, tags=row.tags, metadata=row.metadata,
                         author=row.author, created_at=row.created_at)


def _memory_of(row: MemoryRow) -> MemoryRecord:
    order = metadata_order_of(row.metadata)  # the row's metadata is in the writer's order
    v2 = (row.key is not None or row.occurred_at is not None or row.confidence is not None or bool(row.provenance)
          or order is not None)
    return MemoryRecord(v=2 if v2 else 1, id=row.id, board=row.board, agent=row.agent, kind=row.kind,
                        text=row.text, tags=row.tags, metadata=row.metadata, importance=row.importance,
                        source=row.source, read_only=row.read_only, created_at=row.created_at, key=row.key,
                        occurred_at=row.occurred_at, confidence=row.confidence, provenance=row.provenance or None,
                        metadata_order=order)


def _message_of(row: MessageRow) -> MessageEnvelope:
    body = row.body if row.body_raw is None else codec.decode(row.body_raw)
    return MessageEnvelope(id=row.id, sender=row.sender, kind=row.kind,
                           recipients=row.recipients, board=row.board, topic=row.topic, type=row.type,
                           body=body, correlation_id=row.correlation_id, reply_to=row.reply_to,
                           created_at=row.created_at, metadata=row.metadata)


# --------------------------------------------------------------------- pure: entries
ENTRY_VALUES: list[tuple[str, Any, Mapping[str, Any]]] = [
    ("text", "hello", {}),
    ("map", {"z": 1, "a": {"y": [1, 2.5, None], "b": True}, "mid": "x"}, {"run": 7, "by": "ci"}),
    ("integral-float", [1.0, 2, -0.0, 1e300], {"w": 2.0}),
    ("null", None, {"nested": {"k": [{"b": 1, "a": 2}]}}),
    ("bytes", b"\x00\xffbinary", {}),
    ("odd-for-jsonb", {"n": float("nan"), "s": "nul\x00byte"}, {}),
]


#: Every (encoding, value) pair a writer can send: JSON cannot carry bytes (the
#: writer refuses them, which test_board covers), so that pair is not generated.
ENTRY_CASES = [
    pytest.param(encoding, value, metadata, id=f"{encoding}-{name}")
    for encoding in ("msgpack", "json")
    for name, value, metadata in ENTRY_VALUES
    if not (encoding == "json" and isinstance(value, bytes))
]


@pytest.mark.parametrize(("encoding", "value", "metadata"), ENTRY_CASES)
def test_entry_bytes_of_the_sdk_decode_in_the_worker_to_the_same_record(
        encoding: codec.Encoding, value: Any, metadata: Mapping[str, Any]) -> None:
    created = T0.astimezone(timezone(timedelta(hours=2)))  # a writer in another zone
    data = sdk_entries.encode_entry(value, author="writer", tags=["t1", "t0"], metadata=metadata,
                                    created_at=created, encoding=encoding)
    headers = codec.headers_for(encoding)
    intended = EntryEnvelope(value=value, content_type=sdk_entries.default_content_type(value),
                             tags=["t1", "t0"], metadata=dict(metadata), author="writer", created_at=created)
    sdk_record = validate_wire(EntryEnvelope, codec.decode(data, encoding), strict=True)

    subject = SUBJECTS.entry("b1", "s1", "a key/with.dots")
    row = decode_entry(_raw(SUBJECTS.kv_stream, 7, subject, data, headers), SUBJECTS,
                       max_bytes=MAX_BYTES, index_chars=CHARS)
    assert (row.board, row.section, row.key, row.op) == ("b1", "s1", "a key/with.dots", "PUT")
    assert (row.author, row.tags, row.created_at) == ("writer", ["t1", "t0"], T0)
    assert row.metadata == metadata and row.content_type == intended.content_type
    worker_record = _entry_of(row)

    canonical = intended.canonical_bytes()
    assert sdk_record.canonical_bytes() == canonical
    assert worker_record.canonical_bytes() == canonical
    # the SDK's own reader agrees too
    entry = sdk_entries.decode_entry(SUBJECTS.parse_entry(subject), 7, data, headers)
    assert entry.created_at == T0 and entry.author == "writer" and entry.metadata == metadata
    # and the canonical bytes are themselves a payload the worker takes, to the same record
    again = decode_entry(_raw(SUBJECTS.kv_stream, 8, subject, canonical, None), SUBJECTS,
                         max_bytes=MAX_BYTES, index_chars=CHARS)
    assert _entry_of(again).canonical_bytes() == canonical


def test_sdk_entry_bytes_are_canonical() -> None:
    # docs/protocol.md §13.4: the SDK writes (and signs) an entry's canonical encoding
    data = sdk_entries.encode_entry({"b": 1, "aa": [0.5]}, author="w", metadata={"k": "v"})
    record = validate_wire(EntryEnvelope, codec.decode(data), strict=True)
    assert record.canonical_bytes() == data
    unsorted = sdk_entries.encode_entry({"aa": 1.0, "b": 2}, author="w", created_at=record.created_at)
    assert validate_wire(EntryEnvelope, codec.decode(unsorted)).canonical_bytes() == unsorted


# -------------------------------------------------------------------- pure: messages
MESSAGES: list[dict[str, Any]] = [
    {"kind": "direct", "recipients": ["bob", "carol"], "body": {"task": 3, "args": [1.0, "x"]},
     "correlation_id": "c-1", "metadata": {"z": 1, "a": 2}},
    {"kind": "broadcast", "board": "proj", "body": None},
    {"kind": "topic", "topic": "build.failed", "board": "proj", "body": ["x", {"b": 1, "a": None}],
     "reply_to": "_INBOX.x"},
]


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
@pytest.mark.parametrize("fields", MESSAGES, ids=[m["kind"] for m in MESSAGES])
def test_message_bytes_of_the_sdk_decode_in_the_worker_to_the_same_record(
        encoding: codec.Encoding, fields: dict[str, Any]) -> None:
    env = new_envelope(id="m-1", sender="alice", type="task.handoff", created_at=T0, **fields)
    data = encode_envelope(env, encoding)
    headers = codec.headers_for(encoding)
    if env.kind == "direct":
        subject = Subjects.direct(env.recipients[1])
    elif env.kind == "broadcast":
        subject = Subjects.broadcast("proj")
    else:
        subject = Subjects.topic("build.failed", pattern=False)
    row = decode_message(_raw(MESSAGE_STREAM, 3, subject, data, headers), max_bytes=MAX_BYTES, index_chars=CHARS)
    worker_record = _message_of(row)
    assert worker_record == env
    canonical = env.canonical_bytes()
    assert worker_record.canonical_bytes() == canonical
    assert decode_envelope(data, headers).canonical_bytes() == canonical  # the SDK inbox's decoder
    # §13.4: the SDK sends (and signs) the canonical encoding; JSON is the JSON text of the same record
    assert (data == canonical) == (encoding == "msgpack")
    again = decode_message(_raw(MESSAGE_STREAM, 4, subject, canonical, None), max_bytes=MAX_BYTES,
                           index_chars=CHARS)
    assert _message_of(again).canonical_bytes() == canonical


# ---------------------------------------------------------- integration: the real SDK
async def _stored(agent: Agent, stream: str, *, seq: int | None = None, subject: str | None = None) -> Any:
    """What the stream holds, read the way the worker may (STREAM.MSG.GET is no agent's right)."""
    nc = await operator_nats(agent.nc.connected_url.geturl() if agent.nc.connected_url else "")
    try:
        if subject is not None:
            return await nc.jetstream().get_last_msg(stream, subject)
        return await nc.jetstream().get_msg(stream, seq)
    finally:
        await nc.close()


async def _last(agent: Agent, stream: str, subject: str) -> RawMessage:
    raw = await _stored(agent, stream, subject=subject)
    assert raw.data is not None and raw.seq is not None
    return _raw(stream, raw.seq, subject, raw.data, raw.headers)


async def _at(agent: Agent, stream: str, seq: int) -> RawMessage:
    raw = await _stored(agent, stream, seq=seq)
    assert raw.data is not None and raw.subject is not None
    return _raw(stream, seq, raw.subject, raw.data, raw.headers)


@pytest.mark.asyncio
@pytest.mark.parametrize("encoding", ["msgpack", "json"])
async def test_board_put_is_decoded_by_the_worker_as_written(settings: Settings, unique: str,
                                                             encoding: codec.Encoding) -> None:
    subjects = Subjects(settings.board.bucket)
    value = {"title": "write docs", "est": 2.0, "steps": [{"b": 1, "a": 2}]}
    async with Agent.connect("putter", settings=settings) as agent:
        board = agent.board(unique)
        rev = await board.put("tasks", "t/1", value, tags=["docs"], metadata={"z": 0, "a": 1}, encoding=encoding)
        msg = await _at(agent, subjects.kv_stream, rev)
        sdk_view = await board.get("tasks", "t/1")
    row = decode_entry(msg, subjects, max_bytes=MAX_BYTES, index_chars=CHARS)
    assert (row.board, row.section, row.key, row.seq, row.value) == (unique, "tasks", "t/1", rev, value)
    assert (row.author, row.tags, row.metadata) == ("putter", ["docs"], {"z": 0, "a": 1})
    assert row.created_at == sdk_view.created_at
    intended = EntryEnvelope(value=value, content_type="application/json", tags=["docs"],
                             metadata={"a": 1, "z": 0}, author="putter", created_at=sdk_view.created_at)
    stored = validate_wire(EntryEnvelope, codec.decode(msg.data, codec.encoding_of(msg.headers)), strict=True)
    assert stored.canonical_bytes() == _entry_of(row).canonical_bytes() == intended.canonical_bytes()


@pytest.mark.asyncio
async def test_remember_and_forget_are_decoded_by_the_worker_as_written(settings: Settings, unique: str) -> None:
    subject = Subjects.memory(unique, "rememberer")
    async with Agent.connect("rememberer", settings=settings) as agent:
        mid = await agent.remember("the API freeze is on Friday", kind="semantic", tags=["schedule"],
                                   metadata={"source_line": 12, "by": "planner"}, importance=1.0,
                                   board=unique, source="notes.md")
        remembered = await _last(agent, MEMORY_STREAM, subject)
        await agent.forget([mid, "other"], board=unique)
        forgotten = await _last(agent, MEMORY_STREAM, subject)

    row = decode_memory(remembered, max_bytes=MAX_BYTES, index_chars=CHARS)
    assert isinstance(row, MemoryRow)
    assert (row.id, row.board, row.agent, row.kind, row.text, row.tags, row.importance, row.source,
            row.read_only) == (mid, unique, "rememberer", "semantic", "the API freeze is on Friday",
                               ["schedule"], 1.0, "notes.md", False)
    assert list(row.metadata.items()) == [("source_line", 12), ("by", "planner")]  # the writer's order
    intended = MemoryRecord(v=2, id=mid, board=unique, agent="rememberer", kind="semantic",
                            text="the API freeze is on Friday", tags=["schedule"],
                            metadata={"by": "planner", "source_line": 12}, importance=1.0, source="notes.md",
                            created_at=row.created_at, metadata_order=["source_line", "by"])
    stored = validate_wire(MemoryRecord, codec.decode(remembered.data), strict=True)
    assert stored.canonical_bytes() == _memory_of(row).canonical_bytes() == intended.canonical_bytes()

    forget = decode_memory(forgotten, max_bytes=MAX_BYTES, index_chars=CHARS)
    assert isinstance(forget, ForgetRow) and (forget.board, forget.ids) == (unique, [mid, "other"])
    stored_forget = validate_wire(MemoryForget, codec.decode(forgotten.data), strict=True)
    intended_forget = MemoryForget(board=unique, agent="rememberer", ids=[mid, "other"],
                                   created_at=stored_forget.created_at)
    assert stored_forget.canonical_bytes() == intended_forget.canonical_bytes()
    assert abs(stored_forget.created_at - datetime.now(UTC)) < timedelta(minutes=5)


@pytest.mark.asyncio
async def test_a_version_2_memory_is_decoded_by_the_worker_as_written(settings: Settings, unique: str) -> None:
    subject = Subjects.memory(unique, "rememberer")
    when = datetime(2025, 6, 1, 12, 30, tzinfo=UTC)
    async with Agent.connect("rememberer", settings=settings) as agent:
        mid = await agent.remember("SKU-1 costs 12 EUR", kind="semantic", board=unique, key="price:sku-1",
                                   occurred_at=when, confidence=0.75)
        remembered = await _last(agent, MEMORY_STREAM, subject)
    row = decode_memory(remembered, max_bytes=MAX_BYTES, index_chars=CHARS)
    assert isinstance(row, MemoryRow)
    assert (row.key, row.occurred_at, row.confidence, row.valid_from) == ("price:sku-1", when, 0.75, when)
    intended = MemoryRecord(v=2, id=mid, board=unique, agent="rememberer", kind="semantic", text="SKU-1 costs 12 EUR",
                            created_at=row.created_at, key="price:sku-1", occurred_at=when, confidence=0.75)
    stored = validate_wire(MemoryRecord, codec.decode(remembered.data), strict=True)
    # the payload is the canonical encoding: the version-2 fields set, provenance (null) left out
    assert remembered.data == stored.canonical_bytes() == _memory_of(row).canonical_bytes() == \
        intended.canonical_bytes()
    assert list(codec.decode(remembered.data))[-3:] == ["key", "occurred_at", "confidence"]


@pytest.mark.asyncio
@pytest.mark.parametrize("encoding", ["msgpack", "json"])
async def test_sent_messages_are_decoded_by_the_worker_as_written(settings: Settings, unique: str,
                                                                  encoding: codec.Encoding) -> None:
    sender = f"s{unique}"
    async with Agent.connect(sender, settings=settings) as agent:
        direct = await agent.send([f"r1{unique}", f"r2{unique}"], "task.handoff", {"n": 1, "f": [0.5, 3.0]},
                                  board=unique, correlation_id="c-9", metadata={"z": 1, "a": 2},
                                  encoding=encoding)
        broadcast = await agent.messaging.broadcast(unique, "note", "hello all")
        topic = await agent.publish(f"{unique}.built", "build.done", None)
        stored = [await _at(agent, MESSAGE_STREAM, seq)
                  for seq in (*direct.sequences, broadcast.seq, topic.seq)]

    rows = [decode_message(m, max_bytes=MAX_BYTES, index_chars=CHARS) for m in stored]
    d1, d2, b, t = rows
    assert [r.subject for r in rows] == [Subjects.direct(f"r1{unique}"), Subjects.direct(f"r2{unique}"),
                                         Subjects.broadcast(unique), Subjects.topic(f"{unique}.built", pattern=False)]
    assert (d1.id, d1.sender, d1.kind, d1.recipients, d1.board, d1.type, d1.body, d1.correlation_id,
            d1.metadata) == (direct.id, sender, "direct", [f"r1{unique}", f"r2{unique}"], unique, "task.handoff",
                             {"n": 1, "f": [0.5, 3.0]}, "c-9", {"z": 1, "a": 2})
    assert (b.id, b.kind, b.board, b.body) == (broadcast.id, "broadcast", unique, "hello all")
    assert (t.id, t.kind, t.topic, t.body) == (topic.id, "topic", f"{unique}.built", None)
    # the two copies of a direct message are one record
    assert _message_of(d1).canonical_bytes() == _message_of(d2).canonical_bytes()
    intended = new_envelope(id=direct.id, sender=sender, kind="direct", type="task.handoff",
                            recipients=[f"r1{unique}", f"r2{unique}"], board=unique, correlation_id="c-9",
                            body={"f": [0.5, 3], "n": 1}, metadata={"a": 2, "z": 1}, created_at=d1.created_at)
    assert _message_of(d1).canonical_bytes() == intended.canonical_bytes()
    for msg, row in zip(stored, rows, strict=True):
        sdk_record = decode_envelope(msg.data, msg.headers)  # what the SDK's inbox reads
        assert sdk_record.canonical_bytes() == _message_of(row).canonical_bytes()


@pytest.mark.asyncio
async def test_proposal_ballot_and_outcome_are_decoded_as_written(settings: Settings, unique: str) -> None:
    voter = f"v{unique}"
    # The worker's committer records and applies the outcome (agents do, too, on an open bus).
    async with running_committer(committer_settings(settings), board=unique), \
            Agent.connect(voter, settings=settings) as agent:
        board = agent.board(unique)
        handle = await board.propose("plans", "release", value={"date": "2025-02-01", "rc": 2.0},
                                     voters=[voter], question="ship it?",
                                     deadline=timedelta(minutes=10), proposal_id=f"p{uuid.uuid4().hex[:8]}")
        receipt = await handle.vote("accept", reason="looks good")
        proposal_msg = await _at(agent, VOTE_STREAM, handle.sequence)
        ballot_msg = await _at(agent, VOTE_STREAM, receipt.sequence)
        recorded_msg = await _last(agent, VOTE_STREAM, Subjects.vote(unique, handle.id, "outcome"))
        applied_msg = await _last(agent, VOTE_STREAM, Subjects.vote(unique, handle.id, "applied"))
        entry = await board.get("plans", "release")

    proposal = decode_proposal(proposal_msg.data, proposal_msg.headers)
    assert proposal == handle.proposal
    assert proposal.canonical_bytes() == handle.proposal.canonical_bytes()

    ballot = decode_ballot(ballot_msg.data, ballot_msg.headers)
    assert (ballot.id, ballot.proposal_id, ballot.voter, ballot.choice, ballot.reason) == (
        receipt.ballot_id, handle.id, voter, 0, "looks good")
    intended = Ballot(id=receipt.ballot_id, proposal_id=handle.id, voter=voter, choice=0, reason="looks good",
                      created_at=ballot.created_at)
    assert ballot.canonical_bytes() == intended.canonical_bytes()

    assert receipt.outcome is not None and receipt.outcome.status == "accepted"
    applied = decode_outcome(applied_msg.data, applied_msg.headers)
    recorded = decode_outcome(recorded_msg.data, recorded_msg.headers)
    assert applied.canonical_bytes() == receipt.outcome.canonical_bytes()
    assert recorded.canonical_bytes() == receipt.outcome.model_copy(update={"revision": None}).canonical_bytes()
    assert applied.revision == entry.revision and entry.value == {"date": "2025-02-01", "rc": 2.0}
