"""The versioned board on JetStream KV, through the SDK, against a real nats-server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from agents_sdk import (
    Agent,
    Board,
    Change,
    ConflictError,
    InvalidKeyError,
    NotConnectedError,
    NotFoundError,
    Operation,
    OperationTimeoutError,
    PayloadTooLargeError,
    UnverifiedRecordError,
)
from blackboard.client.board_store import BoardStore
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.devstack import EmbeddedNats
from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings
from tests._auth import operator_nats
from tests.conftest import make_settings

pytestmark = pytest.mark.asyncio


async def test_put_get_roundtrip_carries_author_tags_metadata(settings: Settings, unique: str) -> None:
    async with Agent.connect("writer", settings=settings) as agent:
        board = agent.board(unique)
        rev = await board.put("notes", "n1", {"text": "hello", "n": [1, 2]}, tags=["a", "b"],
                              metadata={"source": "test"})
        entry = await board.get("notes", "n1")
    assert entry.revision == rev
    assert entry.value == {"text": "hello", "n": [1, 2]}
    assert entry.author == "writer"
    assert entry.tags == ("a", "b")
    assert entry.metadata == {"source": "test"}
    assert entry.content_type == "application/json"
    assert entry.created_at is not None and entry.stored_at is not None
    assert (entry.board, entry.section, entry.key) == (unique, "notes", "n1")


async def test_value_types_and_content_types(settings: Settings, unique: str) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        await board.put("s", "text", "plain words")
        await board.put("s", "blob", b"\x00\x01\xff")
        await board.put("s", "img", b"\x89PNG", content_type="image/png")
        await board.put("s", "json", {"a": 1}, encoding="json")
        assert (await board.get("s", "text")).content_type == "text/plain"
        blob = await board.get("s", "blob")
        assert blob.value == b"\x00\x01\xff" and blob.content_type == "application/octet-stream"
        assert (await board.get("s", "img")).content_type == "image/png"
        assert (await board.get("s", "json")).value == {"a": 1}
        with pytest.raises(InvalidPayloadError):
            await board.put("s", "bad", b"bytes", encoding="json")
        with pytest.raises(InvalidPayloadError):
            await board.put("s", "bad", object())


async def test_create_only_if_absent_and_after_delete(settings: Settings, unique: str) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        rev = await board.create("s", "k", 1)
        with pytest.raises(ConflictError) as info:
            await board.create("s", "k", 2)
        assert info.value.current_revision == rev
        await board.delete("s", "k")
        rev2 = await board.create("s", "k", 3)
        assert rev2 > rev
        assert (await board.get("s", "k")).value == 3


async def test_update_is_compare_and_set(settings: Settings, unique: str) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        r1 = await board.put("s", "k", "v1")
        r2 = await board.update("s", "k", "v2", expected_revision=r1)
        with pytest.raises(ConflictError) as info:
            await board.update("s", "k", "stale", expected_revision=r1)
        assert info.value.expected_revision == r1
        assert info.value.current_revision == r2
        assert (await board.get("s", "k")).value == "v2"
        with pytest.raises(ConflictError):
            await board.delete("s", "k", expected_revision=r1)
        await board.delete("s", "k", expected_revision=r2)
        with pytest.raises(NotFoundError):
            await board.get("s", "k")


async def test_twenty_agents_incrementing_one_counter_lose_no_update(settings: Settings, unique: str) -> None:
    agents = [await Agent.connect(f"agent-{i}", settings=settings) for i in range(20)]
    per_agent = 10
    conflicts = 0

    async def worker(agent: Agent) -> None:
        nonlocal conflicts
        board = agent.board(unique)
        for _ in range(per_agent):
            while True:
                try:
                    entry = await board.get("counters", "c")
                    value, rev = entry.value, entry.revision
                except NotFoundError:
                    value, rev = 0, 0
                try:
                    if rev == 0:
                        await board.create("counters", "c", value + 1)
                    else:
                        await board.update("counters", "c", value + 1, expected_revision=rev)
                    break
                except ConflictError:
                    conflicts += 1

    try:
        await asyncio.gather(*(worker(a) for a in agents))
        final = await agents[0].board(unique).get("counters", "c")
    finally:
        for a in agents:
            await a.close()
    assert final.value == 20 * per_agent
    assert conflicts > 0  # the test really raced


async def test_modify_helper_retries_conflicts(settings: Settings, unique: str) -> None:
    agents = [await Agent.connect(f"m{i}", settings=settings) for i in range(5)]
    try:
        await asyncio.gather(*(a.board(unique).modify("c", "n", lambda v: (v or 0) + 1)
                               for a in agents for _ in range(4)))
        assert (await agents[0].board(unique).get("c", "n")).value == 20
    finally:
        for a in agents:
            await a.close()


async def test_history_is_in_write_order_with_deletes(settings: Settings, unique: str) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        revs = [await board.put("s", "k", i) for i in range(5)]
        await board.put("s", "other", "x")  # other keys don't show up
        drev = await board.delete("s", "k")
        history = await board.history("s", "k")
        assert [e.revision for e in history] == [*revs, drev]
        assert [e.value for e in history[:5]] == [0, 1, 2, 3, 4]
        assert history[-1].operation is Operation.DELETE
        assert (await board.get("s", "k", revision=revs[2])).value == 2
        with pytest.raises(NotFoundError):
            await board.get("s", "k", revision=drev + 1000)


async def test_get_revision_of_another_key_is_not_found(settings: Settings, unique: str) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        other = await board.put("s", "a", 1)
        await board.put("s", "b", 2)
        with pytest.raises(NotFoundError):
            await board.get("s", "b", revision=other)


async def test_watch_receives_every_change_in_order_including_deletes(settings: Settings, unique: str) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        async with board.watch() as watch:
            expected = []
            for i in range(30):
                expected.append((Operation.PUT, await board.put("s", f"k{i % 3}", i)))
                if i % 7 == 0:
                    expected.append((Operation.DELETE, await board.delete("s", f"k{i % 3}")))
            expected.append((Operation.PURGE, (await board.purge("s", "k1")) and 0))
            got = [await watch.next(5) for _ in expected]
    assert [(c.operation, c.revision) for c in got[:-1]] == expected[:-1]
    assert got[-1].operation is Operation.PURGE and got[-1].entry.key == "k1"
    assert [c.revision for c in got] == sorted(c.revision for c in got)


async def test_watch_scopes_section_and_key(settings: Settings, unique: str) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        async with board.watch("a") as sec, board.watch("a", "k/1") as one:
            await board.put("b", "k/1", "other section")
            await board.put("a", "k/2", "same section")
            await board.put("a", "k/1", "the key")
            c1 = await sec.next(5)
            c2 = await sec.next(5)
            c3 = await one.next(5)
    assert [c1.entry.key, c2.entry.key] == ["k/2", "k/1"]
    assert c3.entry.value == "the key"


async def test_watch_from_past_revision_replays(settings: Settings, unique: str) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        revs = [await board.put("s", f"k{i}", i) for i in range(10)]
        async with board.watch(from_revision=revs[4]) as watch:
            got = [await watch.next(5) for _ in range(6)]
            await watch.ready.wait()
            live = await board.put("s", "k-live", "now")
            nxt = await watch.next(5)
    assert [c.revision for c in got] == revs[4:]
    assert [c.entry.value for c in got] == list(range(4, 10))
    assert nxt.revision == live


async def test_watch_current_values_then_live(settings: Settings, unique: str) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        await board.put("s", "a", 1)
        await board.put("s", "a", 2)
        await board.put("s", "b", 3)
        async with board.watch(start="current") as watch:
            initial = [await watch.next(5) for _ in range(2)]
            await asyncio.wait_for(watch.ready.wait(), 5)
            await board.put("s", "c", 4)
            live = await watch.next(5)
    assert {(c.entry.key, c.entry.value) for c in initial} == {("a", 2), ("b", 3)}
    assert (live.entry.key, live.entry.value) == ("c", 4)


async def test_watch_on_empty_scope_is_ready_at_once(settings: Settings, unique: str) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        async with agent.board(unique).watch(start="current") as watch:
            await asyncio.wait_for(watch.ready.wait(), 5)


@pytest.mark.parametrize("key", [
    "https://example.com/path?q=1&x=y#frag",
    "/usr/local/lib/python3.11/site.py",
    "C:\\Users\\me\\file.txt",
    "white space and ünïcödé 🚀",
    "dots.in.the.key",
    "=looks-encoded",
    "*", ">", "a" * 300,
])
async def test_arbitrary_user_keys_round_trip(settings: Settings, unique: str, key: str) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        await board.put("files", key, "v")
        assert (await board.get("files", key)).key == key
        assert key in await board.keys("files")
        history = await board.history("files", key)
        assert [e.key for e in history] == [key]


@pytest.mark.parametrize(("section", "key"), [
    ("", "k"), ("has.dot", "k"), ("has space", "k"), ("*", "k"), (">", "k"), ("s", ""), ("s", "x" * 2000),
])
async def test_invalid_keys_are_rejected_with_typed_error(settings: Settings, unique: str,
                                                          section: str, key: str) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        with pytest.raises(InvalidKeyError):
            await board.put(section, key, 1)


async def test_invalid_board_and_agent_names(settings: Settings) -> None:
    with pytest.raises(InvalidKeyError):
        Agent.connect("bad agent", settings=settings)
    async with Agent.connect("w", settings=settings) as agent:
        with pytest.raises(InvalidKeyError):
            agent.board("a.b")


async def test_oversized_value_is_rejected(settings: Settings, unique: str) -> None:
    limit = settings.board.max_value_size
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        with pytest.raises(PayloadTooLargeError) as info:
            await board.put("s", "big", b"x" * (limit + 1))
        assert info.value.limit == limit and info.value.size > limit
        await board.put("s", "fits", b"x" * (limit - 1024))
        with pytest.raises(NotFoundError):
            await board.get("s", "big")


async def test_listings_of_keys_sections_boards(settings: Settings, unique: str) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        await board.put("alpha", "k1", 1)
        await board.put("alpha", "k2", 2)
        await board.put("beta", "k3", 3)
        await board.delete("alpha", "k2")
        assert await board.keys("alpha") == ["k1"]
        assert await board.sections() == ["alpha", "beta"]
        # Listing every board reads across boards: the system identity's (agent.boards() asks
        # the worker, tests/sdk/test_boards.py).
        nc = await connect_nats(settings.nats, name="system")
        try:
            system = BoardStore(nc, settings)
            assert unique in await system.boards()
            assert await board.purge() == 2
            assert await board.sections() == []
            assert unique not in await system.boards()
        finally:
            await nc.close()
        with pytest.raises(NotFoundError):
            await board.get("beta", "k3")


async def test_purge_is_a_marker_without_rollup_the_history_stays(settings: Settings, unique: str) -> None:
    """The board stream refuses rollups (issue 19): a purge writes ``KV-Operation: PURGE``
    without ``Nats-Rollup``. The key reads as absent, the marker is its latest revision, and
    the earlier revisions stay until the history depth pushes them out."""
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        revs = [await board.put("s", "k", i) for i in range(3)]
        async with board.view("s") as view, board.watch("s") as watch:
            assert ("s", "k") in view
            await board.purge("s", "k")
            change = await watch.next(5)
            await view.wait_for(lambda v: ("s", "k") not in v, timeout=5)
        assert change.operation is Operation.PURGE and change.revision > revs[-1]
        with pytest.raises(NotFoundError):
            await board.get("s", "k")
        assert await board.keys("s") == []
        history = await board.history("s", "k")
        assert [e.revision for e in history] == [*revs, change.revision]
        assert [e.operation for e in history] == [Operation.PUT] * 3 + [Operation.PURGE]
        assert (await board.get("s", "k", revision=revs[0])).value == 0  # still kept
        stored = await agent.nc.request(Subjects.direct_get(agent.store.subjects.kv_stream,
                                                            agent.store.subjects.entry(unique, "s", "k")), b"")
        assert stored.headers is not None and stored.headers.get("KV-Operation") == "PURGE"
        assert "Nats-Rollup" not in stored.headers
        assert await board.create("s", "k", "again") > change.revision  # a purged key may be re-created


async def _until_gone(board: Board, section: str, key: str, within: float, failure: str) -> None:
    """Wait until the key reads as absent (polled every 0.1 s); fail with ``failure`` after ``within`` s."""
    for _ in range(round(within / 0.1)):
        try:
            await board.get(section, key)
        except NotFoundError:
            return
        await asyncio.sleep(0.1)
    pytest.fail(failure)


async def test_entry_ttl_expires(settings: Settings, unique: str) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        await board.put("s", "ephemeral", "soon gone", ttl=1)
        await board.put("s", "durable", "stays")
        assert (await board.get("s", "ephemeral")).value == "soon gone"
        await _until_gone(board, "s", "ephemeral", 6.0, "entry with ttl=1 still there after 6s")
        assert (await board.get("s", "durable")).value == "stays"


async def test_ttl_expiry_reaches_watches_and_views(settings: Settings, unique: str) -> None:
    """No expiry markers (the default, board.expiry_marker_ttl = 0): the server removes the
    entry and tells nobody; the watch delivers the removal itself at the entry's stored time
    plus its TTL, as a PURGE change carrying the expired revision, and the view drops the key."""
    assert settings.board.expiry_marker_ttl == 0
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        watch = board.watch("s")
        async with watch, board.view("s") as view:
            await watch.ready.wait()
            rev = await board.put("s", "ephemeral", "soon gone", ttl=1)
            await board.put("s", "durable", "stays")
            await view.wait_for(lambda v: ("s", "ephemeral") in v and ("s", "durable") in v, timeout=5)
            await view.wait_for(lambda v: ("s", "ephemeral") not in v, timeout=10)
            assert view.value("s", "durable") == "stays"
            seen = [await watch.next(timeout=5) for _ in range(3)]
            expired_at = seen[0].entry.stored_at
        # the server removes it too (on its own expiry timer, around the same moment)
        await _until_gone(board, "s", "ephemeral", 5.0, "the server still serves the expired entry 5 s later")
    ops = [(c.entry.key, c.entry.operation) for c in seen]
    assert ops == [("ephemeral", Operation.PUT), ("durable", Operation.PUT), ("ephemeral", Operation.PURGE)]
    assert seen[2].entry.revision == rev  # no new revision: the server wrote nothing
    assert expired_at is not None and seen[2].entry.stored_at is not None
    assert abs((seen[2].entry.stored_at - expired_at).total_seconds() - 1) < 0.01


async def test_ttl_expiry_with_markers_is_delivered_once(nats_factory: Callable[[], EmbeddedNats],
                                                          unique: str) -> None:
    """A stream with expiry markers (board.expiry_marker_ttl > 0, on a private server): the
    watch's own expiry and the server's marker make one removal, not two."""
    server = await asyncio.to_thread(nats_factory)
    s = make_settings(server.url)
    s = s.model_copy(update={"board": s.board.model_copy(update={"expiry_marker_ttl": 1.0})})
    nc = await connect_nats(s.nats, name="setup")  # the worker's identity: it may manage streams
    try:
        kv = Subjects(s.board.bucket).kv_stream
        await nc.jetstream().delete_stream(kv)  # markers cannot be added to a stream that denies purges
        await ensure_streams(nc.jetstream(), s)
        info = await nc.jetstream().stream_info(kv)
        assert info.config.subject_delete_marker_ttl
    finally:
        await nc.close()
    async with Agent.connect("w", settings=s) as agent:
        board = agent.board(unique)
        async with board.watch("s") as watch, board.view("s") as view:
            await watch.ready.wait()
            rev = await board.put("s", "ephemeral", "soon gone", ttl=1)
            removals: list[Change] = []
            view.on_change(lambda c: removals.append(c) if c.operation is not Operation.PUT else None)
            await view.wait_for(lambda v: ("s", "ephemeral") not in v, timeout=10)
            first = [await watch.next(timeout=5) for _ in range(2)]
            with pytest.raises(OperationTimeoutError):  # the marker came (or comes) and is not delivered again
                await watch.next(timeout=2.5)
            assert len(removals) == 1
    assert [(c.entry.key, c.operation) for c in first] == [("ephemeral", Operation.PUT),
                                                           ("ephemeral", Operation.PURGE)]
    assert first[1].revision >= rev


async def test_pipelined_writes_are_all_acknowledged(settings: Settings, unique: str) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        async with board.pipeline() as pipe:
            for i in range(2000):
                await pipe.put("bulk", f"k{i}", i)
            revisions = await pipe.flush()
        assert len(revisions) == 2000 and revisions == sorted(revisions)
        assert len(await board.keys("bulk")) == 2000
        assert (await board.get("bulk", "k1999")).value == 1999


async def test_pipelined_cas_conflict_is_reported(settings: Settings, unique: str) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        board = agent.board(unique)
        rev = await board.put("s", "k", 0)
        pipe = board.pipeline()
        await pipe.put("s", "k", 1, expected_revision=rev)
        await pipe.put("s", "k", 2, expected_revision=rev)
        with pytest.raises(ConflictError):
            await pipe.flush()
        assert (await board.get("s", "k")).value == 1


async def test_cas_retry_after_lost_ack_returns_own_revision(settings: Settings, unique: str) -> None:
    """nats-server checks the expected sequence before deduplicating: a re-sent
    CAS write whose first copy was applied must still report success."""
    async with Agent.connect("a1", settings=settings) as agent:
        store = agent.store
        rev = await agent.board(unique).put("s", "counter", 1)
        prep = store._prepare(unique, "s", "counter", 2, author="a1", content_type=None, tags=(),
                              metadata=None, expected_revision=rev, ttl=None, encoding="msgpack")
        first = await store._publish(prep)  # applied; pretend its ack was lost
        again = await store._publish_prepared(prep, resend=True)  # same Msg-Id
        assert again == first
        # a genuinely stale CAS is still a conflict
        other = store._prepare(unique, "s", "counter", 3, author="a1", content_type=None, tags=(),
                               metadata=None, expected_revision=rev, ttl=None, encoding="msgpack")
        with pytest.raises(ConflictError):
            await store._publish_prepared(other, resend=True)
        assert len(await agent.board(unique).history("s", "counter")) == 2


async def test_json_written_without_header_is_read(settings: Settings, unique: str) -> None:
    """`nats kv put` cannot set headers: a JSON envelope is recognised by its first byte.
    Nor can it sign: a strict read refuses the entry (unsigned), a reader that flags takes it."""
    import dataclasses
    import json

    async with Agent.connect("reader", settings=settings) as agent:
        # The shell's `nats kv put` (as an operator: it asks for the stream's info first).
        shell = await operator_nats(settings.nats.url)
        try:
            kv = await shell.jetstream().key_value(settings.board.bucket)
            envelope = {"v": 1, "value": {"n": 1}, "content_type": "application/json", "tags": ["cli"],
                        "metadata": {}, "author": "shell", "created_at": "2026-01-01T00:00:00+00:00"}
            await kv.put(f"{unique}.s.k", json.dumps(envelope).encode())
        finally:
            await shell.close()
        with pytest.raises(UnverifiedRecordError) as caught:
            await agent.board(unique).get("s", "k")
        assert caught.value.verdict == "unsigned"
        flagging = BoardStore(agent.nc, settings, signing=dataclasses.replace(agent.store.signing, unverified="flag"))
        entry = await flagging.get(unique, "s", "k")
        assert (entry.value, entry.author, entry.tags, entry.verdict) == ({"n": 1}, "shell", ("cli",), "unsigned")


async def test_connect_without_a_server_fails_fast_with_typed_error(settings: Settings) -> None:
    from blackboard.devstack import free_port

    with pytest.raises(NotConnectedError):  # with a credential, so that connecting is what fails
        await asyncio.wait_for(Agent.connect("lonely", nats_url=f"nats://127.0.0.1:{free_port()}",
                                             settings=settings), 30)
