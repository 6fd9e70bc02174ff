"""The search service answers each principal from what it may read (issue 19).

The principal comes from the subject (``bb.search.<principal>.<endpoint>``),
its rights from the policy: boards outside them are refused with
``PermissionDeniedError`` (service error 403), a search naming no board runs
over the readable boards only, and message search finds only the principal's
own copies of direct messages (by the subject they were stored under, never a
payload field), broadcasts of readable boards and topics within its patterns.
The server is unauthenticated here: these tests publish on other principals'
subjects freely, as the system service cannot tell (the server's permissions
do that, tests/security).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from agents_sdk.messaging.messenger import Messenger
from agents_sdk.search import SearchClient
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.protocol import codec
from blackboard.protocol.errors import NotFoundError, PermissionDeniedError
from blackboard.protocol.subjects import Header, Subjects
from blackboard.search.service import SearchService
from blackboard.security.policy import AccessPolicy
from blackboard.settings import Settings
from tests._worker_helpers import (
    HashProvider,
    credentials,
    put_entry,
    remember,
    running_worker,
    worker_settings,
)

pytestmark = pytest.mark.asyncio


@dataclass
class World:
    a: str  # a board alice may read
    b: str  # a board only bob may read
    alice: str
    bob: str
    worker: str
    nc: NATS
    settings: Settings
    tag: str

    def client(self, principal: str) -> SearchClient:
        return SearchClient(self.nc, self.settings, principal)

    async def messages(self, principal: str, **filters: object) -> set[str]:
        """The ids of the messages ``principal`` finds among this test's (by their type)."""
        hits = await Messenger(principal, self.nc, self.settings).search(types=[f"t{self.tag}"], top_k=1000,
                                                                         **filters)  # type: ignore[arg-type]
        return {h.body["id"] for h in hits}


def _policy(w: dict[str, str]) -> AccessPolicy:
    return AccessPolicy.parse(f"""
version = 1
[agents.{w['alice']}]
boards = {{ "{w['a']}" = ["read"] }}
topics = ["ops{w['tag']}.>"]
[agents.{w['bob']}]
boards = {{ "{w['b']}" = ["read", "write"] }}
[workers.{w['worker']}]
""")


@pytest_asyncio.fixture(scope="module")
async def world(nats_server: object, postgres_server: object) -> AsyncIterator[World]:
    from tests.conftest import make_settings

    tag = uuid.uuid4().hex[:10]
    names = {"a": f"acca{tag}", "b": f"accb{tag}", "alice": f"alice{tag}", "bob": f"bob{tag}",
             "worker": f"sys{tag}", "tag": tag}
    base = make_settings(nats_server.url, postgres_server.dsn)  # type: ignore[attr-defined]
    base = base.model_copy(update={"nats": base.nats.model_copy(update={"insecure_open_bus": True})})
    s = worker_settings(base, name=f"acc{tag}", batch_wait=0.02, lag_interval=600)
    nc = await connect_nats(s.nats, name="test-search-access")
    js = nc.jetstream()
    await ensure_streams(js, s)
    subj = Subjects(s.board.bucket)
    a, b, alice, bob = names["a"], names["b"], names["alice"], names["bob"]
    for board in (a, b):
        await remember(js, board, alice, f"{board}-m", f"the deploy runbook of {board} says restart twice")
        await put_entry(js, subj, board, "notes", "runbook", {"text": f"deploy runbook {board}"}, author=alice)
    # Each sender on a connection of its own: what it sends is signed with its own key.
    nc_alice = await connect_nats(s, name="test-search-access-alice", credentials=credentials(alice))
    nc_bob = await connect_nats(s, name="test-search-access-bob", credentials=credentials(bob))
    m_alice, m_bob = Messenger(alice, nc_alice, s), Messenger(bob, nc_bob, s)
    t = f"t{tag}"
    await m_bob.send(alice, t, {"id": "to-alice"})
    await m_alice.send(bob, t, {"id": "alice-to-bob"})  # sent by alice, but only bob's inbox holds it
    await m_bob.send([alice, bob], t, {"id": "to-both"})
    await m_alice.send(f"carol{tag}", t, {"id": "to-carol"})
    await m_alice.broadcast(a, t, {"id": "broadcast-a"})
    await m_bob.broadcast(b, t, {"id": "broadcast-b"})
    await m_bob.publish(f"ops{tag}.deploy", t, {"id": "topic-ops"})
    await m_bob.publish(f"secret{tag}.plans", t, {"id": "topic-secret"})
    await nc_alice.close()
    await nc_bob.close()
    async with running_worker(s, provider=HashProvider(), serve_search=False) as w:
        await w.wait_caught_up(60, embedded=True)
        async with SearchService(nc, s, provider=HashProvider(), rights=_policy(names)):
            yield World(a, b, alice, bob, names["worker"], nc, s, tag)
    await nc.close()


async def test_a_board_outside_the_rights_is_refused(world: World) -> None:
    alice = world.client(world.alice)
    with pytest.raises(PermissionDeniedError, match=world.b) as caught:
        await alice.recall("deploy runbook", board=world.b, mode="keyword")
    assert caught.value.operation is not None and world.b in caught.value.operation
    with pytest.raises(PermissionDeniedError, match=world.b):  # one readable board does not let the other in
        await alice.search_entries("deploy runbook", boards=[world.a, world.b], mode="keyword")


async def test_a_search_naming_no_board_runs_over_the_readable_boards(world: World) -> None:
    alice, bob = world.client(world.alice), world.client(world.bob)
    mine = {h.board for h in await alice.recall("deploy runbook", mode="keyword", top_k=1000)}
    assert world.a in mine and world.b not in mine
    entries = {h.board for h in await alice.search_entries("deploy runbook", mode="keyword", top_k=1000)}
    assert world.a in entries and world.b not in entries
    assert {h.board for h in await bob.recall("deploy runbook", board=world.b, mode="keyword")} == {world.b}
    theirs = {h.board for h in await bob.recall("deploy runbook", mode="keyword", top_k=1000)}
    assert world.b in theirs and world.a not in theirs


async def test_history_and_as_of_need_the_board(world: World) -> None:
    alice = world.client(world.alice)
    assert [r.board for r in await alice.history(world.a, "notes", "runbook")] == [world.a]
    with pytest.raises(PermissionDeniedError, match=world.b):
        await alice.history(world.b, "notes", "runbook")
    with pytest.raises(PermissionDeniedError, match=world.b):
        await alice.as_of(world.b, "notes", "runbook", revision=1)


async def test_a_principal_the_policy_does_not_declare_is_refused(world: World) -> None:
    stranger = world.client(f"mallory{world.tag}")
    with pytest.raises(PermissionDeniedError, match="not declared"):
        await stranger.recall("deploy", board=world.a, mode="keyword")
    with pytest.raises(PermissionDeniedError, match="not declared"):
        await stranger.status()


async def test_the_refusal_is_a_403_service_error(world: World) -> None:
    msg = await world.nc.request(Subjects.search(world.alice, "memories"),
                                 codec.encode({"v": 1, "query": "deploy", "boards": [world.b]}), timeout=5)
    assert msg.headers is not None
    assert msg.headers[Header.ERROR.value] == "PermissionDeniedError"
    assert msg.headers[Header.SERVICE_ERROR_CODE.value] == "403"


async def test_message_search_never_returns_another_agents_direct_messages(world: World) -> None:
    # alice: her own direct messages (not the ones she sent: only the recipient's copy is stored
    # under a subject the server binds), broadcasts of her board, topics within "ops<tag>.>".
    assert await world.messages(world.alice) == {"to-alice", "to-both", "broadcast-a", "topic-ops"}
    # A filter naming another recipient narrows what she may see, never widens it.
    assert await world.messages(world.alice, recipients=[world.bob]) == {"to-both"}
    assert await world.messages(world.alice, senders=[world.alice]) == {"broadcast-a"}
    assert await world.messages(world.alice, kinds=["direct"]) == {"to-alice", "to-both"}
    # bob: his board, every topic (no topic patterns: all of them).
    assert await world.messages(world.bob) == {"alice-to-bob", "to-both", "broadcast-b", "topic-ops",
                                               "topic-secret"}


async def test_message_search_by_keyword_is_scoped_too(world: World) -> None:
    hits = await Messenger(world.alice, world.nc, world.settings).search(f"t{world.tag}", top_k=1000)
    assert {h.body["id"] for h in hits} <= {"to-alice", "to-both", "broadcast-a", "topic-ops"}


async def test_the_system_principal_finds_every_message(world: World) -> None:
    assert await world.messages(world.worker) == {
        "to-alice", "alice-to-bob", "to-both", "to-carol", "broadcast-a", "broadcast-b", "topic-ops", "topic-secret"}
    assert {h.board for h in await world.client(world.worker).recall("deploy runbook", mode="keyword",
                                                                         boards=[world.a, world.b])} \
        == {world.a, world.b}


async def test_searchable_answers_only_about_readable_boards(world: World) -> None:
    """An agent cannot probe memories of a board it may not read: naming the board is refused,
    and the same id asked on a readable board counts as not stored there."""
    alice = world.client(world.alice)
    mine, theirs = f"{world.a}-m", f"{world.b}-m"
    ok = await alice.searchable(world.a, [(mine, 0)])
    assert (ok.unstored, ok.unembedded) == ([], [])  # stored and embedded (the fixture waited)
    with pytest.raises(PermissionDeniedError, match=world.b) as caught:
        await alice.searchable(world.b, [(theirs, 0)])
    assert caught.value.operation == f"searchable on board {world.b}"
    probe = await alice.searchable(world.a, [(theirs, 0), (mine, 0)])
    assert (probe.unstored, probe.unembedded) == ([theirs], [])
    # a version later than the stored one is not stored yet
    later = await alice.searchable(world.a, [(mine, 10**12)])
    assert later.unstored == [mine]
    bob = world.client(world.bob)
    assert (await bob.searchable(world.b, [(theirs, 0)])).unstored == []


async def test_memory_read_answers_only_about_readable_boards(world: World) -> None:
    """One memory by id: the board named must be readable; an id of another board is not found
    on a readable one (an agent cannot probe a board it may not read)."""
    alice = world.client(world.alice)
    mine, theirs = f"{world.a}-m", f"{world.b}-m"
    detail = await alice.memory(world.a, mine)
    assert (detail.memory.id, detail.memory.board, detail.sources, detail.versions) == (mine, world.a, [], [])
    with pytest.raises(PermissionDeniedError, match=world.b) as caught:
        await alice.memory(world.b, theirs)
    assert caught.value.operation == f"memory read on board {world.b}"
    with pytest.raises(NotFoundError):
        await alice.memory(world.a, theirs)
    assert (await world.client(world.bob).memory(world.b, theirs)).memory.id == theirs
