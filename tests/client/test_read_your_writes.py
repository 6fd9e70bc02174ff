"""Read-your-writes and monotonic reads of a key's latest value, against a real nats-server.

In an R3 cluster a direct get may be answered by a replica that has not applied this
client's own acknowledged write yet. Here, on one server, the store's direct gets are
answered the way such a replica would, deterministically: :class:`LaggingReplica` stands in
the one place the store sends them (``BoardStore._request``) and answers, for a key, the
real stored message of an older revision (or a real 404) captured when it was the latest.
"""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.msg import Msg

from agents_sdk import Agent, NotFoundError, OperationTimeoutError
from blackboard.client.board_store import BoardStore
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import Header, Subjects
from blackboard.settings import Settings

pytestmark = pytest.mark.asyncio


class LaggingReplica:
    """Answers a store's direct gets like a replica behind: per subject, the stale answers queued
    first (``always``: every time), then the real ones; counts the direct gets."""

    def __init__(self, store: BoardStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.store = store
        self.real = store._request
        self.prefix = Subjects.direct_get(store.subjects.kv_stream) + "."
        self.queued: dict[str, list[Msg]] = {}
        self.always: dict[str, Msg] = {}
        self.direct_gets = 0
        monkeypatch.setattr(store, "_request", self.request)

    async def request(self, subject: str, payload: bytes, what: str) -> Msg:
        if subject.startswith(self.prefix):
            self.direct_gets += 1
            key = subject[len(self.prefix):]
            queued = self.queued.get(key)
            if queued:
                return queued.pop(0)
            if key in self.always:
                return self.always[key]
        return await self.real(subject, payload, what)

    async def now(self, board: str, section: str, key: str) -> Msg:
        """The real answer of a direct get of the key now (its latest message, or a 404)."""
        return await self.real(self.prefix + self.store.subjects.entry(board, section, key), b"", "test")

    def lag(self, board: str, section: str, key: str, answer: Msg, times: int | None = 1) -> None:
        """Answer ``answer`` to the key's next ``times`` direct gets (None: until cleared)."""
        subject = self.store.subjects.entry(board, section, key)
        if times is None:
            self.always[subject] = answer
        else:
            self.queued[subject] = [answer] * times

    def caught_up(self) -> None:
        self.queued.clear()
        self.always.clear()


def revision_of(msg: Msg) -> int | None:
    headers = msg.headers or {}
    return None if headers.get(Header.STATUS.value) else int(headers[Header.SEQUENCE.value])


async def test_a_get_right_after_a_put_reads_the_put_when_a_replica_answers_an_older_revision(
        settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        store, board = agent.store, agent.board(unique)
        replica = LaggingReplica(store, monkeypatch)
        await board.put("s", "k", "old")
        older = await replica.now(unique, "s", "k")
        rev = await board.put("s", "k", "new")
        replica.lag(unique, "s", "k", older)  # one stale answer: a follower a moment behind
        entry = await store.get(unique, "s", "k")
        assert (entry.value, entry.revision) == ("new", rev)
        assert store.stale_reads == 1
        assert replica.direct_gets == 2  # read again after a short pause

        replica.lag(unique, "s", "k", older, times=None)  # a replica that stays behind
        entry = await board.get("s", "k")
        assert (entry.value, entry.revision) == ("new", rev)  # through a consumer from the revision
        assert store.stale_reads == 2
        assert await store.latest_revision(unique, "s", "k") == rev
        assert store.stale_reads == 3


async def test_a_404_after_the_clients_own_write_reads_the_write(
        settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        store, board = agent.store, agent.board(unique)
        replica = LaggingReplica(store, monkeypatch)
        absent = await replica.now(unique, "s", "k")
        assert revision_of(absent) is None  # a real 404
        rev = await board.create("s", "k", {"n": 1})
        replica.lag(unique, "s", "k", absent, times=None)  # a replica that never saw the key yet
        entry = await board.get("s", "k")
        assert (entry.value, entry.revision) == ({"n": 1}, rev)
        assert entry.verdict is Verdict.VERIFIED  # verified like a direct get's answer
        assert await store.latest_revision(unique, "s", "k") == rev
        assert store.stale_reads == 2


async def test_update_after_update_never_acts_on_a_stale_read(
        settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compare-and-set loop (read, update at that revision) whose every read is first answered
    by a replica one write behind: each update is at the revision just written."""
    async with Agent.connect("w", settings=settings) as agent:
        store, board = agent.store, agent.board(unique)
        replica = LaggingReplica(store, monkeypatch)
        rev = await board.put("s", "counter", 0)
        for n in range(1, 6):
            before = await replica.now(unique, "s", "counter")
            entry = await board.get("s", "counter")
            assert (entry.value, entry.revision) == (n - 1, rev)
            rev = await board.update("s", "counter", n, expected_revision=entry.revision)
            replica.lag(unique, "s", "counter", before)
        assert (await board.get("s", "counter")).value == 5
        assert store.stale_reads == 5


async def test_a_delete_and_a_pipelined_write_are_read_back_too(
        settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        store, board = agent.store, agent.board(unique)
        replica = LaggingReplica(store, monkeypatch)
        await board.put("s", "gone", "here")
        live = await replica.now(unique, "s", "gone")
        await board.delete("s", "gone")
        replica.lag(unique, "s", "gone", live, times=None)
        with pytest.raises(NotFoundError, match="deleted"):  # the tombstone, not the older put
            await board.get("s", "gone")
        # create on a deleted key reads its tombstone to compare-and-set on it
        rev = await board.create("s", "gone", "again")
        replica.caught_up()

        older = await replica.now(unique, "s", "gone")
        async with board.pipeline() as pipe:
            ack = await pipe.put("s", "gone", "pipelined")
            piped = await ack
        assert piped > rev
        replica.lag(unique, "s", "gone", older, times=None)
        entry = await board.get("s", "gone")
        assert (entry.value, entry.revision) == ("pipelined", piped)
        assert store.stale_reads == 3


async def test_reads_are_monotonic_after_a_read_of_another_writers_revision(
        settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with Agent.connect("a", settings=settings) as a, Agent.connect("b", settings=settings) as b:
        replica = LaggingReplica(b.store, monkeypatch)
        await a.board(unique).put("s", "k", 1)
        older = await replica.now(unique, "s", "k")
        rev = await a.board(unique).put("s", "k", 2)
        assert (await b.board(unique).get("s", "k")).revision == rev  # b read it once
        replica.lag(unique, "s", "k", older, times=None)
        assert (await b.board(unique).get("s", "k")).revision == rev  # never older after that
        assert b.store.stale_reads == 1


async def test_a_current_answer_costs_one_direct_get(settings: Settings, unique: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    async with Agent.connect("w", settings=settings) as agent:
        store, board = agent.store, agent.board(unique)
        replica = LaggingReplica(store, monkeypatch)
        for n in range(5):
            await board.put("s", f"k{n}", n)
            assert (await board.get("s", f"k{n}")).value == n
            assert (await board.get("s", f"k{n}")).value == n
        with pytest.raises(NotFoundError):
            await board.get("s", "never-written")
        assert replica.direct_gets == 11
        assert store.stale_reads == 0


async def test_replicas_that_never_reach_the_revision_time_out_saying_so(
        settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings.model_copy(update={"nats": settings.nats.model_copy(update={"request_timeout": 0.5})})
    async with Agent.connect("w", settings=s) as agent:
        store, board = agent.store, agent.board(unique)
        rev = await board.put("s", "k", "v")
        store._seen.saw(store.subjects.entry(unique, "s", "k"), rev + 1000)  # as if written there
        with pytest.raises(OperationTimeoutError, match=f"lag behind revision {rev + 1000}"):
            await board.get("s", "k")
        assert (await board.get("s", "k")).revision == rev  # forgotten: the key stays readable


async def test_an_expired_write_is_not_insisted_on(settings: Settings, unique: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """After its TTL the server serves the key's previous revision again (or nothing): that is
    the key's state, not a replica behind (a guard: the store must not wait for the expired one)."""
    async with Agent.connect("w", settings=settings) as agent:
        store, board = agent.store, agent.board(unique)
        replica = LaggingReplica(store, monkeypatch)
        lasting = await board.put("s", "k", "lasting")
        await board.put("s", "k", "brief", ttl=1)
        assert (await board.get("s", "k")).value == "brief"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while revision_of(await replica.now(unique, "s", "k")) != lasting:  # the server expired it
            assert loop.time() < deadline
            await asyncio.sleep(0.05)
        started = loop.time()
        assert (await board.get("s", "k")).value == "lasting"
        assert loop.time() - started < 0.5
