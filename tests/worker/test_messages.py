"""The worker stores agent messages in PostgreSQL exactly once; the search service finds them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agents_sdk import Agent
from blackboard.protocol import codec
from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.schemas.message_search import MessageSearchRequest
from blackboard.protocol.subjects import MESSAGE_STREAM, Subjects
from blackboard.settings import Settings
from blackboard.worker.decode import RawMessage
from blackboard.worker.messages import decode_message
from tests._worker_helpers import rows, running_worker, worker_settings


def _worker_settings(settings: Settings, name: str) -> Settings:
    # Messages are not embedded: no embedder, so nothing is left half-embedded for other tests.
    return worker_settings(settings, name=name, batch_wait=0.02, lag_interval=60.0, embed=False)


@pytest.mark.asyncio
async def test_messages_land_in_postgres_exactly_once_and_are_searchable(pg_settings: Settings,
                                                                         unique: str) -> None:
    a, b, c = (f"{unique}-{n}" for n in "abc")
    board = f"{unique}-board"
    async with Agent.connect(a, settings=pg_settings) as agent:
        to_two = await agent.send([b, c], "task.handoff", {"text": "rotate the signing keys"}, board=board,
                                  correlation_id=f"{unique}-conv", metadata={"prio": "high"})
        to_b = await agent.send(b, "note", {"text": "lunch is at noon"}, encoding="json")
        blob = await agent.send(c, "file", b"\x00binary")
        cast = await agent.board(board).broadcast("discovery", {"text": "the signing keys expire friday"})
        topic = await agent.publish(f"{unique}.build.failed", "ci", {"log": "tests failed on main"})
    seqs = [*to_two.sequences, to_b.seq, blob.seq, cast.seq, topic.seq]

    first = _worker_settings(pg_settings, f"w{unique}")
    async with running_worker(first) as w:
        await w.wait_caught_up(30)
        stored = rows(first, "SELECT seq, id, sender, recipients, kind, board, topic, type, body, body_raw, "
                              "correlation_id, metadata, subject FROM bb_messages WHERE stream = %s AND "
                              "seq = ANY(%s) ORDER BY seq", MESSAGE_STREAM, seqs)
        assert [r[0] for r in stored] == seqs  # one row per stream message
        by_seq = {r[0]: r for r in stored}
        two = by_seq[to_two.sequences[0]]
        assert two[1:8] == (to_two.id, a, [b, c], "direct", board, None, "task.handoff")
        assert two[8] == {"text": "rotate the signing keys"} and two[10] == f"{unique}-conv"
        assert two[11] == {"prio": "high"} and two[12] == Subjects.direct(b)
        assert by_seq[to_two.sequences[1]][12] == Subjects.direct(c)
        assert by_seq[blob.seq][8] is None and codec.decode(bytes(by_seq[blob.seq][9])) == b"\x00binary"
        assert by_seq[topic.seq][6] == f"{unique}.build.failed"

        # Each agent finds only what it may read: c its own direct copies, b the note to b (issue 19).
        async with Agent.connect(c, settings=pg_settings) as reader, \
                Agent.connect(b, settings=pg_settings) as b_reader:
            hits = await reader.search_messages("signing keys", boards=[board])
            assert {h.id for h in hits} == {to_two.id, cast.id}  # the two copies are one hit
            assert all(h.score > 0 for h in hits)
            assert [h.id for h in await reader.search_messages(recipients=[c], senders=[a])] == [
                blob.id, to_two.id]  # newest first
            assert [h.id for h in await reader.search_messages(recipients=[c], senders=[a], order="oldest")] == [
                to_two.id, blob.id]
            assert [h.id for h in await b_reader.search_messages(types=["note"], senders=[a])] == [to_b.id]
            assert await reader.search_messages(types=["note"], senders=[a]) == []  # b's, not c's
            found = await reader.search_messages(kinds=["topic"], topics=[f"{unique}.build.failed"])
            assert [h.body for h in found] == [{"log": "tests failed on main"}]
            assert [h.id for h in await reader.search_messages(correlation_id=f"{unique}-conv")] == [to_two.id]
            assert (await reader.search_messages(types=["file"], senders=[a]))[0].body == b"\x00binary"
            now = datetime.now(UTC)
            assert await reader.search_messages(senders=[a], since=now + timedelta(minutes=1)) == []
            assert len(await reader.search_messages(senders=[a], until=now + timedelta(minutes=1))) == 4
            with pytest.raises(InvalidPayloadError):
                await reader.search_messages(senders=["not valid!"])

    # A second worker (new durable, replays the whole stream) stores nothing twice.
    async with running_worker(_worker_settings(pg_settings, f"x{unique}"), serve_search=False) as w2:
        await w2.wait_caught_up(60)
    again = rows(first, "SELECT count(*) FROM bb_messages WHERE stream = %s AND seq = ANY(%s)",
                  MESSAGE_STREAM, seqs)
    assert again == [(len(seqs),)]


def _raw(subject: str, doc: dict[str, Any], seq: int = 1) -> RawMessage:
    return RawMessage(MESSAGE_STREAM, seq, subject, {}, codec.encode(doc), datetime.now(UTC))


def test_decoder_binds_the_envelope_to_its_subject() -> None:
    base = {"v": 1, "id": "m1", "sender": "a", "type": "t", "created_at": "2025-01-02T03:04:05Z"}
    ok = decode_message(_raw("bb.msg.agent.b", {**base, "kind": "direct", "recipients": ["b", "c"]}),
                        max_bytes=10_000, index_chars=1000)
    assert ok.recipients == ["b", "c"] and ok.search_text == "t"
    bad = [
        ("bb.msg.agent.x", {**base, "kind": "direct", "recipients": ["b"]}),  # not a recipient
        ("bb.msg.board.other", {**base, "kind": "broadcast", "board": "b1"}),
        ("bb.msg.topic.a.b", {**base, "kind": "topic", "topic": "a.c"}),
        ("bb.msg.agent.b", {**base, "kind": "direct", "recipients": ["b"], "type": "nul\x00"}),
        ("bb.msg.agent.b", {"not": "an envelope"}),
    ]
    for subject, doc in bad:
        with pytest.raises(InvalidPayloadError):
            decode_message(_raw(subject, doc), max_bytes=10_000, index_chars=1000)
    with pytest.raises(InvalidPayloadError):
        decode_message(_raw("bb.msg.agent.b", {**base, "kind": "direct", "recipients": ["b"], "body": "x" * 500}),
                       max_bytes=100, index_chars=1000)


def test_message_search_query_is_parameterised() -> None:
    from blackboard.db.messages_sql import message_search

    query, params = message_search(MessageSearchRequest(query="drop table; --", senders=["a"], top_k=5))
    text = query.as_string(None)
    assert "drop table" not in text and "websearch_to_tsquery" in text and "DISTINCT ON" in text
    assert params[-1] == 5 and ["a"] in params
