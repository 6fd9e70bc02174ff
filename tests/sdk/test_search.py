"""End to end through the SDK: remember -> JetStream -> worker -> Postgres -> recall; board search,
stored history and as-of reads."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agents_sdk import Agent, Board, SearchClient, SearchFilters
from blackboard.devstack import EmbeddedPostgres
from blackboard.protocol import codec
from blackboard.protocol.errors import InvalidPayloadError, NotFoundError
from blackboard.protocol.schemas.search import EntrySearchRequest, MemorySearchRequest
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings
from tests._worker_helpers import HashProvider, fresh_db, running_worker, worker_settings
from tests.conftest import make_settings

pytestmark = pytest.mark.asyncio


async def test_remember_then_recall_and_board_search(pg_settings: Settings, postgres_server: EmbeddedPostgres,
                                                     unique: str) -> None:
    # A database of its own: waiting until everything is embedded waits on the database's whole
    # queue, which in the shared one may hold rows an earlier test's killed worker still leases.
    own = make_settings(pg_settings.nats.url, fresh_db(postgres_server, unique))
    settings = worker_settings(own, name=f"w{unique}", batch_wait=0.02)
    async with Agent.connect("alice", settings=settings) as alice, Agent.connect("bob", settings=settings) as bob:
        board = alice.board(unique)
        await alice.remember("the staging cluster runs out of disk every friday", board=unique,
                             tags=["ops"], kind="episodic")
        await bob.remember("lunch is pizza on fridays", board=unique, tags=["food"], kind="semantic")
        await bob.remember("disk alerts on staging must page the on-call", board=unique, kind="procedural",
                           metadata={"team": "sre"})
        r1 = await board.put("facts", "db", "postgres with pgvector")
        r2 = await board.put("facts", "db", "postgres 18 with pgvector 0.8")
        await board.put("notes", "lunch", "pizza friday")
        async with running_worker(settings, provider=HashProvider()) as worker:
            await worker.wait_caught_up(60, embedded=True)

            hits = await alice.recall("staging disk", board=unique)
            assert hits and "disk" in hits[0].text
            assert {h.agent for h in hits[:2]} == {"alice", "bob"}
            only_bob = await alice.recall("staging disk", board=unique, author="bob")
            assert [h.text for h in only_bob][:1] == ["disk alerts on staging must page the on-call"]
            by_meta = await alice.recall("disk", board=unique, metadata={"team": "sre"})
            assert [h.agent for h in by_meta] == ["bob"]
            assert await alice.recall("disk", board=unique, kind="semantic", mode="keyword") == []
            assert await board.recall("pizza", mode="keyword")

            # exact ranks are the search tests' business; here: the SDK path returns current entries
            entry_hits = await board.search("pgvector", mode="keyword")
            assert entry_hits and entry_hits[0].key == "db" and entry_hits[0].revision == r2
            assert "db" in [h.key for h in await board.search("pgvector")]
            assert [h.key for h in await board.search("pizza", section="notes", mode="keyword")] == ["lunch"]

            history = await board.stored_history("facts", "db")
            assert [h.revision for h in history] == [r1, r2]
            assert (await board.as_of("facts", "db", revision=r1)).value == "postgres with pgvector"
            with pytest.raises(NotFoundError):
                await board.stored_history("facts", "nothing-here")


class _RecordingNats:
    """Answers every search request with no hits, keeping what was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def request(self, subject: str, data: bytes, timeout: float) -> SimpleNamespace:
        self.sent.append((subject, data))
        return SimpleNamespace(headers=None, data=codec.encode({"v": 1, "hits": []}))


def _wire(req: MemorySearchRequest | EntrySearchRequest) -> bytes:
    return codec.encode(req.model_dump(exclude_none=True))


async def test_filters_travel_as_keywords_or_one_value_and_encode_alike() -> None:
    """The keyword filters and a SearchFilters value build the same request bytes, through the
    client and a board handle alike; a board's own name goes first."""
    nc = _RecordingNats()
    client = SearchClient(nc, Settings(), "tester")  # type: ignore[arg-type]
    await client.recall("disk", board="ops", kinds=["episodic"], top_k=3)
    await client.recall("disk", filters=SearchFilters(boards=["ops"], kinds=["episodic"]), top_k=3)
    assert nc.sent[0] == nc.sent[1] == (Subjects.search("tester", "memories"), _wire(MemorySearchRequest(
        query="disk", boards=["ops"], kinds=["episodic"], top_k=3)))
    await client.search_entries("x", filters=SearchFilters(sections=["notes"], author="ann"), section="facts",
                                mode="keyword")
    assert nc.sent[-1] == (Subjects.search("tester", "entries"), _wire(EntrySearchRequest(
        query="x", sections=["facts", "notes"], author="ann", mode="keyword",
        top_k=Settings().search.default_top_k)))

    owner = SimpleNamespace(id="alice", context=SimpleNamespace(store=None), search=client)
    board = Board(owner, "b1")
    await board.search("x", section="notes", boards=["b2"])
    assert nc.sent[-1][1] == _wire(EntrySearchRequest(query="x", boards=["b1", "b2"], sections=["notes"],
                                                      top_k=Settings().search.default_top_k))
    await board.recall("x", filters=SearchFilters(tags_all=["t"]), top_k=2)
    assert nc.sent[-1][1] == _wire(MemorySearchRequest(query="x", boards=["b1"], tags_all=["t"], top_k=2))

    sent = len(nc.sent)
    with pytest.raises(TypeError, match="kind"):
        await client.search_entries("x", kind="episodic")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="board"):
        await board.search("x", board="b3")
    with pytest.raises(InvalidPayloadError, match="kinds"):
        await client.search_entries("x", filters=SearchFilters(kinds=["episodic"]))
    with pytest.raises(InvalidPayloadError):
        await client.recall("x", board="not a token!")
    assert len(nc.sent) == sent  # refused before anything was sent


class _RefusingNats:
    """Answers every request with the service's 403 error reply, keeping the subjects asked."""

    def __init__(self) -> None:
        self.subjects: list[str] = []

    async def request(self, subject: str, data: bytes, timeout: float) -> SimpleNamespace:
        from blackboard.protocol.errors import PermissionDeniedError
        from blackboard.search.service import error_reply

        self.subjects.append(subject)
        body, headers = error_reply(PermissionDeniedError("'alice' may not read board 'secret'",
                                                          operation="search memories on board secret"), "msgpack")
        return SimpleNamespace(headers=headers, data=body)


async def test_a_403_reply_raises_permission_denied_with_the_operation() -> None:
    from blackboard.protocol.errors import PermissionDeniedError

    nc = _RefusingNats()
    client = SearchClient(nc, Settings(), "alice")  # type: ignore[arg-type]
    with pytest.raises(PermissionDeniedError, match="may not read board 'secret'") as caught:
        await client.recall("plans", board="secret")
    assert caught.value.operation == "search memories on board secret"
    with pytest.raises(PermissionDeniedError):
        await client.history("secret", "s", "k")
    assert nc.subjects == [Subjects.search("alice", "memories"), Subjects.search("alice", "history")]


async def test_the_principal_must_be_a_valid_id() -> None:
    from blackboard.protocol.errors import InvalidKeyError

    with pytest.raises(InvalidKeyError):
        SearchClient(_RecordingNats(), Settings(), "a.b")  # type: ignore[arg-type]
