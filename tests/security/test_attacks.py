"""The attacks of issue 19, each made the way an attacker would: with raw nats-py.

Each attack is made twice: by a client with no credential (``anonymous``: the
server refuses the connection itself) and by an authenticated agent that lacks
the right (``unprivileged``: the server refuses the operation, or the data
never reaches a reader or PostgreSQL as authentic). After each attack the
victims' view of the data is checked through the SDK (and PostgreSQL where the
attack aimed at it).

Principals come from the test policy (tests/_auth.py): any agent id is a
member of every board, ``outsider-*`` holds no right, ``reader-*`` may only
read, ``solo-*`` may only use the board ``solo-board``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import nats
import nats.errors
import nats.js.errors
import psycopg
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from agents_sdk import (
    Agent,
    AuthenticationError,
    NotFoundError,
    OutcomeTimeoutError,
    PermissionDeniedError,
)
from blackboard.devstack import EmbeddedNats
from blackboard.protocol import codec
from blackboard.protocol.schemas import MessageSearchRequest
from blackboard.protocol.schemas.search import MemorySearchRequest
from blackboard.protocol.subjects import MESSAGE_STREAM, VOTE_STREAM, Subjects
from blackboard.settings import Settings
from tests._auth import TestAuth, raw_connect
from tests._committer import running_committer

pytestmark = pytest.mark.asyncio

ATTACKERS = ("anonymous", "unprivileged")
#: How long an attacker's refused operation may take to fail (the server answers at once).
REFUSAL = 2.0


class Refusals:
    """The asynchronous errors the server sent one connection (permission violations)."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    async def record(self, exc: Exception) -> None:
        self.errors.append(str(exc).lower())

    def refused(self, verb: str, subject: str) -> bool:
        return any(f"permissions violation for {verb} to \"{subject.lower()}\"" in e for e in self.errors)

    async def wait(self, verb: str, subject: str, timeout: float = REFUSAL) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.refused(verb, subject):
            assert loop.time() < deadline, f"the server did not refuse {verb} to {subject}: {self.errors}"
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def attacker(kind: str, nats_server: EmbeddedNats, test_auth: TestAuth,
                   principal: str) -> AsyncIterator[tuple[NATS, Refusals] | None]:
    """The attacker's raw connection: None for ``anonymous`` after asserting the server refused
    the connection; for ``unprivileged``, ``principal``'s connection and its refusals."""
    if kind == "anonymous":
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await raw_connect(nats_server.url, test_auth, principal=None)
        # Not even with a credential of another authority's making: only the operator's chain counts.
        yield None
        return
    refusals = Refusals()
    nc = await raw_connect(nats_server.url, test_auth, principal=principal, error_cb=refusals.record)
    try:
        yield nc, refusals
    finally:
        await nc.close()


async def refused_request(nc: NATS, subject: str, payload: bytes = b"", **kw: Any) -> None:
    """A request the server must refuse: no answer comes back (the publish was dropped)."""
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError, TimeoutError)):
        await nc.request(subject, payload, timeout=REFUSAL, **kw)


async def refused_js_publish(nc: NATS, subject: str, payload: bytes, headers: dict[str, str] | None = None) -> None:
    """A JetStream publish the server must refuse: no ack."""
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.APIError,
                        TimeoutError)):
        await nc.jetstream().publish(subject, payload, headers=headers, timeout=REFUSAL)


async def operator_get(test_auth: TestAuth, nats_server: EmbeddedNats, stream: str, subject: str) -> bytes | None:
    """The last message of ``subject`` as the operator reads it (None: there is none)."""
    nc = await raw_connect(nats_server.url, test_auth)
    try:
        msg = await nc.request(Subjects.direct_get(stream, subject), b"", timeout=5)
        return None if (msg.headers or {}).get("Status") == "404" else msg.data
    finally:
        await nc.close()


@pytest_asyncio.fixture
async def inbox_admin(settings: Settings) -> AsyncIterator[None]:
    """The system service that administers inboxes (as the worker runs it)."""
    from blackboard.client.connection import connect_nats
    from blackboard.security.source import RightsSource
    from blackboard.worker.inbox_admin import InboxAdmin

    nc = await connect_nats(settings.nats, name="inbox-admin")
    try:
        async with InboxAdmin(nc, settings, rights=RightsSource.from_settings(settings)):
            yield
    finally:
        await nc.close()


# -- 1. writing a board entry ---------------------------------------------------------------
@pytest.mark.parametrize("kind", ATTACKERS)
async def test_writing_a_board_without_the_right(kind: str, nats_server: EmbeddedNats, test_auth: TestAuth,
                                                 settings: Settings, unique: str) -> None:
    board = f"b{unique}"
    subject = Subjects().entry(board, "notes", "plan")
    async with attacker(kind, nats_server, test_auth, f"reader-{unique}") as conn:
        if conn is not None:
            nc, refusals = conn
            forged = codec.encode({"value": "forged", "author": "alice", "tags": []})
            await refused_js_publish(nc, subject, forged)
            await refusals.wait("publish", subject)
    async with Agent.connect(f"alice{unique}", settings=settings) as alice:
        with pytest.raises(NotFoundError):
            await alice.board(board).get("notes", "plan")


# -- 2. ballots cast as other agents --------------------------------------------------------
@pytest.mark.parametrize("kind", ATTACKERS)
async def test_casting_ballots_as_other_agents(kind: str, nats_server: EmbeddedNats, test_auth: TestAuth,
                                               settings: Settings, unique: str) -> None:
    board = f"v{unique}"
    alice, bob, carol = f"alice{unique}", f"bob{unique}", f"carol{unique}"
    async with running_committer(settings, board=board), \
            Agent.connect(alice, settings=settings) as proposer:
        handle = await proposer.board(board).propose("config", "mode", ["safe", "forged"],
                                                     voters=[alice, bob, carol])
        pid = handle.proposal.id
        # A member with vote rights, voting as Bob and Carol.
        async with attacker(kind, nats_server, test_auth, f"mallory{unique}") as conn:
            if conn is not None:
                nc, refusals = conn
                for victim in (bob, carol):
                    subject = Subjects.vote(board, pid, "ballot", voter=victim)
                    ballot = {"proposal_id": pid, "voter": victim, "choice": 1, "id": uuid.uuid4().hex,
                              "cast_at": "2026-01-01T00:00:00+00:00"}
                    await refused_js_publish(nc, subject, codec.encode(ballot))
                    await refusals.wait("publish", subject)
                    assert await operator_get(test_auth, nats_server, VOTE_STREAM, subject) is None
        # Nothing decided: the forged ballots never counted.
        with pytest.raises(OutcomeTimeoutError):
            await handle.outcome(timeout=1.5)
        with pytest.raises(NotFoundError):
            await proposer.board(board).get("config", "mode")


# -- 3. an outcome published before any ballot ----------------------------------------------
@pytest.mark.parametrize("kind", ATTACKERS)
async def test_publishing_an_outcome(kind: str, nats_server: EmbeddedNats, test_auth: TestAuth,
                                     settings: Settings, unique: str) -> None:
    board = f"o{unique}"
    alice, bob = f"alice{unique}", f"bob{unique}"
    async with running_committer(settings, board=board), \
            Agent.connect(alice, settings=settings) as proposer, Agent.connect(bob, settings=settings) as voter:
        handle = await proposer.board(board).propose("config", "mode", ["safe", "forged"], voters=[alice, bob])
        pid = handle.proposal.id
        async with attacker(kind, nats_server, test_auth, f"mallory{unique}") as conn:
            if conn is not None:
                nc, refusals = conn
                for what in ("outcome", "close", "applied"):
                    subject = Subjects.vote(board, pid, what)
                    forged = {"proposal_id": pid, "board": board, "status": "accepted", "value": "forged",
                              "decided_at": "2026-01-01T00:00:00+00:00"}
                    await refused_js_publish(nc, subject, codec.encode(forged))
                    await refusals.wait("publish", subject)
                    assert await operator_get(test_auth, nats_server, VOTE_STREAM, subject) is None
        # The real vote decides, and the board holds the real value.
        await handle.vote("safe")
        await voter.board(board).vote(pid, "safe")
        outcome = await handle.outcome(timeout=10)
        assert outcome.status == "accepted" and outcome.value == "safe"
        assert (await proposer.board(board).get("config", "mode")).value == "safe"


# -- 4. pulling and acking another agent's inbox --------------------------------------------
@pytest.mark.parametrize("kind", ATTACKERS)
async def test_reading_another_agents_inbox(kind: str, nats_server: EmbeddedNats, test_auth: TestAuth,
                                            settings: Settings, unique: str, inbox_admin: None) -> None:
    alice, bob = f"alice{unique}", f"bob{unique}"
    async with Agent.connect(alice, settings=settings) as sender, Agent.connect(bob, settings=settings) as receiver:
        assert [m async for m in receiver.inbox(limit=1, timeout=0.3)] == []  # bob's inbox exists
        await sender.send(bob, "secret", {"pin": 1234})
        victim_consumer = Subjects.inbox_consumer(bob)
        async with attacker(kind, nats_server, test_auth, f"mallory{unique}") as conn:
            if conn is not None:
                nc, refusals = conn
                pull = Subjects.consumer_next_api(MESSAGE_STREAM, victim_consumer)
                await refused_request(nc, pull, json.dumps({"batch": 10, "expires": 500_000_000}).encode())
                await refusals.wait("publish", pull)
                # Nor by a consumer of its own on Bob's subject: neither directly ...
                create = f"$JS.API.CONSUMER.CREATE.{MESSAGE_STREAM}.inbox-mallory{unique}"
                config = {"stream_name": MESSAGE_STREAM, "config": {
                    "durable_name": f"inbox-mallory{unique}", "filter_subjects": [Subjects.direct(bob)],
                    "ack_policy": "explicit", "deliver_policy": "all"}}
                await refused_request(nc, create, json.dumps(config).encode())
                # ... nor through the inbox administration, which checks the filters.
                request = {"v": 1, "grants": {Subjects.direct(bob): 0}}
                reply = await nc.request(Subjects.inbox_admin(f"mallory{unique}"), codec.encode(request), timeout=5)
                assert (reply.headers or {}).get("Nats-Service-Error-Code") in ("403", "400")
        got = [m async for m in receiver.inbox(limit=1, timeout=5)]
        assert [m.body for m in got] == [{"pin": 1234}]


# -- 5. search over other boards' memories and other agents' messages -----------------------
@pytest.mark.slow
@pytest.mark.parametrize("kind", ATTACKERS)
async def test_searching_beyond_ones_rights(kind: str, nats_server: EmbeddedNats, test_auth: TestAuth,
                                            pg_settings: Settings, unique: str, start_worker: Any) -> None:
    await start_worker(pg_settings, name=f"w{unique}", embed=False)
    secret_board = f"s{unique}"
    alice, bob = f"alice{unique}", f"bob{unique}"
    word = f"zebra{unique}"
    async with Agent.connect(alice, settings=pg_settings) as a, Agent.connect(bob, settings=pg_settings) as b:
        await a.remember(f"the {word} launch code is 0000", board=secret_board)
        await a.send(bob, "note", {"text": f"{word} private to bob"})
        # Wait until the worker has both (as Bob and Alice see them).
        for _ in range(100):
            mem = await a.recall(word, mode="keyword")
            msgs = await b.search_messages(word)
            if mem and msgs:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the worker never stored the memory and the message")
    attacker_id = f"solo-{unique}"
    async with attacker(kind, nats_server, test_auth, attacker_id) as conn:
        if conn is not None:
            nc, refusals = conn
            from agents_sdk.search import search_request
            from blackboard.protocol.schemas.message_search import MessageSearchResponse
            from blackboard.protocol.schemas.search import MemorySearchResponse

            # As itself, on the secret board: refused by the service.
            with pytest.raises(PermissionDeniedError):
                await search_request(nc, "memories", MemorySearchRequest(query=word, boards=[secret_board], mode="keyword"),
                                     MemorySearchResponse, principal=attacker_id, timeout=5)
            # As itself, on no board: nothing of the secret board.
            found = await search_request(nc, "memories", MemorySearchRequest(query=word, mode="keyword"), MemorySearchResponse,
                                         principal=attacker_id, timeout=5)
            assert found.hits == []
            messages = await search_request(nc, "messages", MessageSearchRequest(query=word),
                                            MessageSearchResponse, principal=attacker_id, timeout=5)
            assert messages.hits == []
            # As Alice or Bob: the server refuses the subject.
            for victim in (alice, bob):
                subject = Subjects.search(victim, "memories")
                await refused_request(nc, subject, codec.encode({"query": word}))
                await refusals.wait("publish", subject)


# -- 6. subscribing to everything -----------------------------------------------------------
@pytest.mark.parametrize("kind", ATTACKERS)
async def test_subscribing_to_all_traffic(kind: str, nats_server: EmbeddedNats, test_auth: TestAuth,
                                          settings: Settings, unique: str) -> None:
    async with attacker(kind, nats_server, test_auth, f"mallory{unique}") as conn:
        seen: list[str] = []
        if conn is not None:
            nc, refusals = conn

            async def record(msg: Any) -> None:
                seen.append(msg.subject)

            for pattern in (">", "_INBOX.>", f"_INBOX.alice{unique}.>", "$JS.>", "bb.>", "$KV.>"):
                await nc.subscribe(pattern, cb=record)
                await refusals.wait("subscription", pattern)
        async with Agent.connect(f"alice{unique}", settings=settings) as alice:
            await alice.board(f"b{unique}").put("notes", "n", "private")
            await alice.send(f"bob{unique}", "hello", {"x": 1})
            await asyncio.sleep(0.3)
        assert seen == []


# -- 7. deleting a stream -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ATTACKERS)
async def test_deleting_or_purging_streams(kind: str, nats_server: EmbeddedNats, test_auth: TestAuth,
                                           settings: Settings, unique: str) -> None:
    async with attacker(kind, nats_server, test_auth, f"mallory{unique}") as conn:
        if conn is not None:
            nc, refusals = conn
            for api in (f"$JS.API.STREAM.DELETE.{VOTE_STREAM}", f"$JS.API.STREAM.PURGE.{VOTE_STREAM}",
                        "$JS.API.STREAM.DELETE.KV_blackboard", f"$JS.API.STREAM.UPDATE.{VOTE_STREAM}",
                        f"$JS.API.CONSUMER.DELETE.{MESSAGE_STREAM}.inbox-alice{unique}"):
                await refused_request(nc, api, b"{}")
                await refusals.wait("publish", api)
    admin = await raw_connect(nats_server.url, test_auth)
    try:
        info = await admin.jetstream().stream_info(VOTE_STREAM)
        assert info.config.name == VOTE_STREAM
    finally:
        await admin.close()


# -- 8. erasing every board with one rollup -------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("kind", ATTACKERS)
async def test_rollup_cannot_erase_other_boards(kind: str, nats_server: EmbeddedNats, test_auth: TestAuth,
                                                pg_settings: Settings, unique: str, start_worker: Any) -> None:
    boards = [f"r{unique}-{i}" for i in range(3)]
    async with Agent.connect(f"alice{unique}", settings=pg_settings) as alice:
        for b in boards:
            await alice.board(b).put("notes", "keep", f"value of {b}")
    # The attacker may write the first board (a member), and tries to roll the stream up from it.
    async with attacker(kind, nats_server, test_auth, f"mallory{unique}") as conn:
        if conn is not None:
            nc, _ = conn
            subject = Subjects().entry(boards[0], "notes", "x")
            for rollup in ("all", "sub"):
                with pytest.raises(nats.js.errors.APIError, match="rollup"):
                    await nc.jetstream().publish(subject, b"", headers={"Nats-Rollup": rollup}, timeout=REFUSAL)
            await refused_request(nc, "$JS.API.STREAM.PURGE.KV_blackboard", b"{}")
    await start_worker(pg_settings, name=f"w{unique}", embed=False)
    async with Agent.connect(f"alice{unique}", settings=pg_settings) as alice:
        for b in boards:
            assert (await alice.board(b).get("notes", "keep")).value == f"value of {b}"
    # PostgreSQL agrees: every board's entry is there (the worker caught up).
    dsn = pg_settings.postgres.dsn.get_secret_value()
    for _ in range(100):
        async with await psycopg.AsyncConnection.connect(dsn) as conn_pg:
            rows = await (await conn_pg.execute(
                "SELECT board FROM bb_entries WHERE board = ANY(%s) AND key = 'keep' AND NOT deleted", (boards,))).fetchall()
        if len(rows) == 3:
            break
        await asyncio.sleep(0.1)
    assert sorted(r[0] for r in rows) == boards


# -- 9. acting as an agent one holds no credential for --------------------------------------
@pytest.mark.parametrize("kind", ATTACKERS)
async def test_connecting_as_someone_else(kind: str, nats_server: EmbeddedNats, test_auth: TestAuth,
                                          settings: Settings, unique: str, tmp_path: Any) -> None:
    alice = f"alice{unique}"
    # A host without the authority: only the credentials it was given.
    bare = settings.model_copy(update={
        "security": settings.security.model_copy(update={"authority_dir": None, "policy_file": None}),
        "nats": settings.nats.model_copy(update={"creds_file": None, "credentials_dir": tmp_path}),
        "dev": settings.dev.model_copy(update={"data_dir": tmp_path}),
    })
    if kind == "anonymous":
        with pytest.raises(AuthenticationError, match=alice):
            await Agent.connect(alice, settings=bare)
    else:
        mallory_creds = test_auth.creds(f"mallory{unique}")
        with pytest.raises(AuthenticationError):
            await Agent.connect(alice, settings=bare, credentials=mallory_creds)
        # Renaming the file changes nothing: the credential names its principal.
        (tmp_path / f"{alice}.creds").write_text(mallory_creds.read_text())
        with pytest.raises(AuthenticationError):
            await Agent.connect(alice, settings=bare)


# -- revoked credentials --------------------------------------------------------------------
async def test_a_revoked_credential_is_refused_and_disconnected(nats_server: EmbeddedNats, test_auth: TestAuth,
                                                                unique: str) -> None:
    victim = f"revoked{unique}"
    creds = test_auth.creds(victim)
    kept = creds.with_name("kept-" + creds.name)
    kept.write_text(creds.read_text())  # what the revoked host still holds
    live = await raw_connect(nats_server.url, test_auth, principal=victim)
    closed = asyncio.Event()
    try:
        test_auth.authority.revoke(victim)
        nats_server.reload()
        for _ in range(100):
            if not live.is_connected:
                closed.set()
                break
            await asyncio.sleep(0.05)
        assert closed.is_set(), "the revoked identity's live connection was not closed"
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(nats_server.url, user_credentials=str(kept), allow_reconnect=False,
                               connect_timeout=2, tls=live.options["tls"])
    finally:
        await live.close()


# -- reading other boards through the JetStream API -----------------------------------------
@pytest.mark.parametrize("kind", ATTACKERS)
async def test_reading_other_boards_through_the_api(kind: str, nats_server: EmbeddedNats, test_auth: TestAuth,
                                                    settings: Settings, unique: str) -> None:
    board = f"p{unique}"
    async with Agent.connect(f"alice{unique}", settings=settings) as alice:
        await alice.board(board).put("notes", "k", "private")
    subject = Subjects().entry(board, "notes", "k")
    async with attacker(kind, nats_server, test_auth, f"solo-{unique}") as conn:
        if conn is not None:
            nc, refusals = conn
            # The last message of another board's key ...
            direct = Subjects.direct_get("KV_blackboard", subject)
            await refused_request(nc, direct)
            # ... or any message through the bare direct get (its subject in the body) ...
            await refused_request(nc, Subjects.direct_get("KV_blackboard"),
                                  json.dumps({"last_by_subj": subject}).encode())
            # ... or a consumer created without its filter in the API subject ...
            bare = "$JS.API.CONSUMER.CREATE.KV_blackboard"
            await refused_request(nc, bare, json.dumps({"stream_name": "KV_blackboard", "config": {
                "filter_subject": subject, "deliver_subject": f"_INBOX.solo-{unique}.x",
                "ack_policy": "none"}}).encode())
            # ... or with its own board's filter in the subject and another in the body.
            own = Subjects().entry_filter("solo-board")
            named = f"$JS.API.CONSUMER.CREATE.KV_blackboard.c{unique}.{own}"
            reply = await nc.request(named, json.dumps({"stream_name": "KV_blackboard", "config": {
                "name": f"c{unique}", "filter_subject": subject, "deliver_subject": f"_INBOX.solo-{unique}.x",
                "ack_policy": "none"}}).encode(), timeout=5)
            assert b"did not match" in reply.data or b"error" in reply.data
            for api in (direct, Subjects.direct_get("KV_blackboard"), bare):
                await refusals.wait("publish", api)
