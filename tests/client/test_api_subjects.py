"""The JetStream API requests of board reads and views are the forms an agent may send (issue 19).

An agent's permissions allow, on the board stream ``KV_<bucket>`` and a board
``b`` it may read, only

* ``$JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<b>.>`` (last by subject, no body), and
* ``$JS.API.CONSUMER.CREATE.KV_<bucket>.*.$KV.<bucket>.<b>.>`` (a named consumer with
  its one filter in the subject, the body's filter the same),

plus ``$JS.API.INFO``. A recorder subscribed to ``$JS.API.>`` on a private server (so
every request it sees is the code's under test) checks every request made while views,
watches, reads, history, listings and the outcome check of a re-sent compare-and-set
write run. The checker is shown to flag what nats-py's own ordered consumer and a
body-based direct get send.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from blackboard.client.board_store import BoardStore
from blackboard.client.streams import ensure_streams
from blackboard.devstack import EmbeddedNats
from blackboard.protocol.subjects import Subjects, subject_matches
from blackboard.settings import Settings
from tests._auth import operator_nats
from tests.conftest import make_settings

pytestmark = pytest.mark.asyncio

BOARD = "granted"


@dataclass
class Recorder:
    """Every JetStream API request seen on the server: (subject, body)."""

    requests: list[tuple[str, bytes]] = field(default_factory=list)

    async def record(self, msg: Msg) -> None:
        self.requests.append((msg.subject, msg.data))

    def clear(self) -> None:
        self.requests.clear()

    def subjects(self, prefix: str = "") -> list[str]:
        return [s for s, _ in self.requests if s.startswith(prefix)]


def violations(requests: list[tuple[str, bytes]], bucket: str, board: str) -> list[str]:
    """The requests an agent holding only ``board`` could not send (empty: all allowed)."""
    stream = f"KV_{bucket}"
    entries = f"$KV.{bucket}.{board}.>"
    direct = f"$JS.API.DIRECT.GET.{stream}.{entries}"
    create = f"$JS.API.CONSUMER.CREATE.{stream}.*.{entries}"
    create_prefix = f"$JS.API.CONSUMER.CREATE.{stream}."
    bad: list[str] = []
    for subject, body in requests:
        if subject == "$JS.API.INFO":
            continue
        if subject_matches(subject, direct):
            if body:
                bad.append(f"{subject} with a body {body[:80]!r}")
            continue
        if subject_matches(subject, create):
            filter_subject = subject[len(create_prefix):].split(".", 1)[1]
            config = json.loads(body)["config"]
            if config.get("filter_subject") != filter_subject or config.get("filter_subjects"):
                bad.append(f"{subject} creating a consumer with the filter(s) "
                           f"{config.get('filter_subject') or config.get('filter_subjects')}")
            continue
        bad.append(subject)
    return bad


@pytest_asyncio.fixture
async def server(nats_factory: Callable[[], EmbeddedNats]) -> EmbeddedNats:
    return nats_factory()


@pytest_asyncio.fixture
async def settings_(server: EmbeddedNats) -> Settings:
    return make_settings(server.url)


@pytest_asyncio.fixture
async def recorder(server: EmbeddedNats, settings_: Settings) -> AsyncIterator[Recorder]:
    admin = await operator_nats(server.url, name="admin")
    await ensure_streams(admin.jetstream(), settings_)
    rec = Recorder()
    await admin.subscribe("$JS.API.>", cb=rec.record)
    await admin.flush()
    try:
        yield rec
    finally:
        await admin.close()


@pytest_asyncio.fixture
async def agent_nc(server: EmbeddedNats) -> AsyncIterator[NATS]:
    conn = await operator_nats(server.url, principal="agent-apisubjects", name="agent")
    try:
        yield conn
    finally:
        await conn.close()


async def _settled(nc: NATS) -> None:
    """Let the recorder receive what was sent (its connection is another one)."""
    await nc.flush()
    await asyncio.sleep(0.1)


# ---------------------------------------------------------------- the checker can fail
async def test_the_checker_flags_nats_py_ordered_consumers_and_body_direct_gets(
        recorder: Recorder, server: EmbeddedNats, settings_: Settings) -> None:
    """nats-py's own forms are sent by the operator: the server refuses them to an agent (it
    drops the request, so the recorder would never see it), and the checker must flag them."""
    subjects = Subjects(settings_.board.bucket)
    nc = await operator_nats(server.url, name="nats-py forms")
    try:
        await _send_nats_py_forms(nc, subjects)
    finally:
        await nc.close()
    bad = violations(recorder.requests, settings_.board.bucket, BOARD)
    assert f"$JS.API.CONSUMER.CREATE.{subjects.kv_stream}" in bad  # the bare create, no filter
    assert any(s.startswith(f"$JS.API.CONSUMER.INFO.{subjects.kv_stream}.") for s in bad)
    assert Subjects.direct_get(subjects.kv_stream) in bad  # a get by sequence, in the body
    assert Subjects.direct_get(subjects.kv_stream, subjects.entry("other", "s", "k")) in bad  # another board


async def _send_nats_py_forms(nc: NATS, subjects: Subjects) -> None:
    js = nc.jetstream()
    await js.publish(subjects.entry(BOARD, "s", "k"), b"v")

    async def ignore(_: Msg) -> None:
        return None

    sub = await js.subscribe(subjects.entry_filter(BOARD), stream=subjects.kv_stream, cb=ignore,
                             ordered_consumer=True)
    await sub.consumer_info()
    await sub.unsubscribe()
    await nc.request(Subjects.direct_get(subjects.kv_stream), b'{"seq": 1}')
    await nc.request(Subjects.direct_get(subjects.kv_stream, subjects.entry("other", "s", "k")), b"")
    await _settled(nc)


# ---------------------------------------------------------------- our requests
async def test_views_watches_reads_and_listings_use_only_the_agent_forms(
        recorder: Recorder, agent_nc: NATS, settings_: Settings) -> None:
    store = BoardStore(agent_nc, settings_)
    try:
        revs = [await store.put(BOARD, "s", "k", i, author="a") for i in range(3)]
        await store.put(BOARD, "t", "other key/with.dots", "x", author="a")
        await store.delete(BOARD, "t", "gone", purge=True)
        recorder.clear()

        for start in ("new", "current", "all"):
            async with store.watch(BOARD, start=start) as watch:  # type: ignore[arg-type]
                await asyncio.wait_for(watch.ready.wait(), 5)
        async with store.watch(BOARD, "s", "k", from_revision=revs[1]) as watch:
            assert (await watch.next(5)).revision == revs[1]
        async with store.watch(BOARD, key="k") as watch:  # every section's key "k"
            await asyncio.wait_for(watch.ready.wait(), 5)
        assert (await store.get(BOARD, "s", "k")).value == 2
        assert (await store.get(BOARD, "s", "k", revision=revs[0])).value == 0
        assert await store.next_revision(BOARD, "s", "k", revs[0]) is not None
        assert await store.latest_revision(BOARD, "s", "k") == revs[-1]
        assert [e.revision for e in await store.history(BOARD, "s", "k")] == revs
        assert await store.keys(BOARD, "s") == ["k"]
        assert await store.sections(BOARD) == ["s", "t"]
        await _settled(agent_nc)
    finally:
        await store.close()
    assert recorder.subjects("$JS.API.CONSUMER.CREATE.") and recorder.subjects("$JS.API.DIRECT.GET.")
    assert violations(recorder.requests, settings_.board.bucket, BOARD) == []


async def test_the_outcome_check_of_a_resent_cas_write_uses_only_the_agent_forms(
        recorder: Recorder, agent_nc: NATS, settings_: Settings) -> None:
    """A re-sent compare-and-set write answered "wrong last sequence" is checked with a
    last-by-subject direct get, and, when later writes followed it, a one-shot named
    consumer filtered on the key's subject."""
    store = BoardStore(agent_nc, settings_)
    bucket = settings_.board.bucket
    try:
        for later_writes, expect_consumer in ((0, False), (1, True)):
            key = f"k{later_writes}"
            rev = await store.put(BOARD, "s", key, 1, author="a")
            prep = store._prepare(BOARD, "s", key, 2, author="a", content_type=None, tags=(), metadata=None,
                                  expected_revision=rev, ttl=None, encoding="msgpack")
            first = await store._publish(prep)  # applied: its ack "lost"
            for i in range(later_writes):
                await store.put(BOARD, "s", key, 10 + i, author="other")
            recorder.clear()
            assert await store._publish_prepared(prep, resend=True) == first
            await _settled(agent_nc)
            subject = store.subjects.entry(BOARD, "s", key)
            assert Subjects.direct_get(store.subjects.kv_stream, subject) in recorder.subjects()
            creates = recorder.subjects("$JS.API.CONSUMER.CREATE.")
            assert bool(creates) is expect_consumer
            assert all(s.endswith("." + subject) for s in creates)  # filtered on the exact key
            assert violations(recorder.requests, bucket, BOARD) == []
    finally:
        await store.close()
