"""Containment (issue 18, findings 1 and 2): a hostile payload on a consumed subject is
dead-lettered with its reason, and the writes behind it are ingested.

Each test publishes the payload the way an attacker would (raw nats-py, no SDK),
then valid writes, and asserts that the worker stored the valid ones and
dead-lettered the hostile one without a crash (no restart of an ingest task, no
exception the guard had to catch).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import msgpack
import pytest
from nats.aio.client import Client as NATS

from agents_sdk import Agent
from agents_sdk.messaging.envelope import encode_envelope, new_envelope
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings
from blackboard.worker.decode import RawMessage
from blackboard.worker.handlers import default_handlers
from tests._worker_helpers import (
    HashProvider,
    dead_letters,
    publish_signed,
    put_entry,
    remember,
    rows,
    running_worker,
    worker_settings,
)

pytestmark = pytest.mark.asyncio

#: How long a healthy worker needs, at most, to catch up here (a stalled one never does).
CATCH_UP = 20.0


def deep_json_envelope(depth: int, **fields: Any) -> bytes:
    """A JSON map whose ``value`` is ``depth`` arrays deep (``[[[...]]]``), other fields as given."""
    head = b"".join(f'"{k}":{_json(v)},'.encode() for k, v in fields.items())
    return b"{" + head + b'"value":' + b"[" * depth + b"]" * depth + b"}"


def _json(value: Any) -> str:
    return json.dumps(value)


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


async def test_a_json_envelope_nested_5000_deep_is_dead_lettered_on_every_consumed_subject(
        pg_settings: Settings, nc: NATS, unique: str) -> None:
    """Finding 1: before, ``codec.decode`` raised RecursionError, the message was never
    acknowledged and every write behind it waited forever."""
    s = worker_settings(pg_settings, name=f"w{unique}", batch_wait=0.02, lag_interval=60.0)
    js = nc.jetstream()
    subjects = Subjects(s.board.bucket)
    now = datetime.now(UTC).isoformat()
    json_headers = {"Bb-Encoding": "json"}
    entry_subject = subjects.entry(unique, "s", "poison")
    memory_subject = Subjects.memory(unique, "eve")
    message_subject = Subjects.direct(f"{unique}-bob")
    poison = {
        entry_subject: deep_json_envelope(5000, v=1, author="mallory", created_at=now),
        memory_subject: deep_json_envelope(5000, v=1, id="m", board=unique, agent="eve", text="t",
                                           created_at=now),
        message_subject: deep_json_envelope(5000, v=1, id="x", sender="eve", kind="direct",
                                            recipients=[f"{unique}-bob"], type="t", created_at=now),
    }
    poison_seqs = {subject: (await js.publish(subject, data, headers=json_headers)).seq
                   for subject, data in poison.items()}
    # Valid writes behind the poison pills, on the same subjects.
    good_entry = await put_entry(js, subjects, unique, "s", "poison", "fine")
    good_memory = await remember(js, unique, "eve", f"{unique}-ok", "a good memory")
    env = new_envelope(id=f"{unique}-msg", sender="eve", kind="direct", type="t", body={"ok": 1},
                       recipients=[f"{unique}-bob"])
    good_message = await publish_signed(js, "eve", message_subject, encode_envelope(env))

    async with running_worker(s, provider=HashProvider(), serve_search=False) as w:
        await w.wait_caught_up(CATCH_UP)
        for subject, seq in poison_seqs.items():
            reasons = dead_letters(s, subject)
            assert seq in reasons, f"the poison pill on {subject} was not dead-lettered"
            assert "nested deeper than" in reasons[seq]
        assert rows(s, "SELECT seq FROM bb_entry_revisions WHERE board = %s", unique) == [(good_entry,)]
        assert rows(s, "SELECT seq FROM bb_memories WHERE board = %s", unique) == [(good_memory,)]
        assert rows(s, "SELECT seq FROM bb_messages WHERE subject = %s", message_subject) == [(good_message,)]
        assert all(not t.done() for t in w.tasks)
        assert all(loop.stats.unexpected == 0 for loop in w.loops), "a limit was met by the guard, not the codec"


async def test_a_proposal_with_a_candidate_nested_600_deep_leaves_vote_ingest_running(
        pg_settings: Settings, nc: NATS, unique: str) -> None:
    """Finding 2: before, the vote writer's pydantic serialization failed on the candidate,
    the batch was never written, and "ingest votes crashed; restarting" repeated forever."""
    s = worker_settings(pg_settings, name=f"w{unique}", embed=False, serve_search=False, deadline_interval=0.1,
                        batch_wait=0.02, lag_interval=60.0)
    js = nc.jetstream()
    proposal = {"v": 1, "id": "deep", "board": unique, "section": "s", "key": "k", "candidates": [_nested(600)],
                "voters": ["eve"], "proposer": "eve", "created_at": datetime.now(UTC).isoformat(),
                "deadline": (datetime.now(UTC) + timedelta(hours=1)).isoformat()}
    subject = Subjects.vote(unique, "deep", "proposal")
    poison = (await js.publish(subject, msgpack.packb(proposal, use_bin_type=True))).seq

    async with running_worker(s) as w:
        async with await Agent.connect(f"{unique}-a", settings=s) as agent:
            board = agent.board(unique)
            handle = await board.propose("s", "k", ["x", "y"], voters=[agent.id])
            receipt = await board.vote(handle.id, "x")
            assert receipt.outcome is not None and receipt.outcome.status == "accepted"
        await w.wait_caught_up(CATCH_UP)
        assert poison in dead_letters(s, subject)
        assert "nested deeper than" in dead_letters(s, subject)[poison]
        stored = rows(s, "SELECT p.status, count(b.seq) FROM bb_proposals p JOIN bb_ballots b "
                          "USING (board, proposal_id) WHERE p.board = %s AND p.proposal_id = %s GROUP BY p.status",
                       unique, handle.id)
        assert stored == [("accepted", 1)]
        assert all(not t.done() for t in w.tasks)
        assert all(loop.stats.unexpected == 0 for loop in w.loops)


async def test_an_exception_no_decoder_names_dead_letters_its_message_alone(
        pg_settings: Settings, nc: NATS, unique: str) -> None:
    """The per-message guard: whatever a decoder or a writer raises for one message
    (here a RecursionError from the decoder, a serialization error from the writer),
    that message is dead-lettered with the exception's name and the others are stored."""
    s = worker_settings(pg_settings, name=f"w{unique}", batch_wait=0.02, lag_interval=60.0)
    js = nc.jetstream()
    subjects = Subjects(s.board.bucket)
    base = default_handlers(s)[0]

    def decode(msg: RawMessage) -> Any:
        row = base.decode(msg)
        if msg.subject.endswith(".decode-bug"):
            raise RecursionError("maximum recursion depth exceeded")
        return row

    async def write(conn: Any, rows: Sequence[Any]) -> None:
        if any(r.key == "write-bug" for r in rows):
            raise ValueError("Maximum serialization depth exceeded")
        await base.write(conn, rows)

    handler = dataclasses.replace(base, name="guard", filter_subject=subjects.entry_filter(unique),
                                  decode=decode, write=write)
    seqs = {key: await put_entry(js, subjects, unique, "s", key, key)
            for key in ("before", "decode-bug", "write-bug", "after")}
    async with running_worker(s, handlers=[handler], provider=HashProvider(), serve_search=False) as w:
        await w.wait_caught_up(CATCH_UP)
        stored = {int(r[0]) for r in rows(s, "SELECT seq FROM bb_entry_revisions WHERE board = %s", unique)}
        assert stored == {seqs["before"], seqs["after"]}
        decode_dead = dead_letters(s, subjects.entry(unique, "s", "decode-bug"))
        write_dead = dead_letters(s, subjects.entry(unique, "s", "write-bug"))
        assert decode_dead[seqs["decode-bug"]].startswith("unexpected RecursionError while decoding")
        assert write_dead[seqs["write-bug"]].startswith("unexpected ValueError while writing")
        assert w.loops[0].stats.unexpected == 2
        assert all(not t.done() for t in w.tasks)


async def test_a_memory_stamped_beyond_the_timestamp_range_is_dead_lettered_not_stored(
        pg_settings: Settings, nc: NATS, unique: str) -> None:
    """Finding 3, the write side: ``9999-12-31T23:59:59-23:59`` (year 10000 in UTC) was
    stored, and every search whose candidates included it failed from then on."""
    s = worker_settings(pg_settings, name=f"w{unique}", batch_wait=0.02, lag_interval=60.0)
    js = nc.jetstream()
    subject = Subjects.memory(unique, "eve")
    stamps = ("9999-12-31T23:59:59-23:59", "9999-12-31T23:59:59-00:01", "1969-12-31T23:59:59Z")
    seqs = {}
    for i, stamp in enumerate(stamps):
        record = {"v": 1, "id": f"m{i}", "board": unique, "agent": "eve", "text": "far", "created_at": stamp}
        seqs[stamp] = (await js.publish(subject, msgpack.packb(record))).seq
    good = await remember(js, unique, "eve", f"{unique}-ok", "a good memory")
    async with running_worker(s, provider=HashProvider(), serve_search=False) as w:
        await w.wait_caught_up(CATCH_UP)
        dead = dead_letters(s, subject)
        for stamp, seq in seqs.items():
            assert "timestamp" in dead[seq], stamp
        assert rows(s, "SELECT seq FROM bb_memories WHERE board = %s", unique) == [(good,)]
