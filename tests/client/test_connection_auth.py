"""Connecting with a credential to a nats-server in operator mode (JWT identities, TLS):
the id is bound to its credential, the server's refusals are typed errors, a publish or a
request the identity holds no right for fails fast with PermissionDeniedError, and TLS
verifies the server with the dev CA."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from agents_sdk import Agent
from blackboard.client.connection import connect_nats, permission_violations
from blackboard.client.publisher import Publisher
from blackboard.client.streams import ensure_streams
from blackboard.devstack import EmbeddedNats
from blackboard.protocol.errors import AuthenticationError, NotConnectedError, PermissionDeniedError
from blackboard.protocol.subjects import Grants
from blackboard.security.authority import Authority
from blackboard.security.credentials import FoundCredentials, find_credentials
from blackboard.security.jwt import Credentials
from blackboard.security.tls import ensure_dev_certificates, server_hosts
from blackboard.settings import DevSettings, NatsSettings, Settings

POLICY = """\
version = 1

[agents.alice]
boards = { "granted" = ["read", "write", "vote"] }

[agents.bob]
boards = { "granted" = ["read"] }

[agents.carol]
boards = { "granted" = ["read"] }

[workers.worker]

[operators.operator]
"""

#: A refused operation must fail within this (instead of the 30 s write timeout).
FAST = 2.0


@dataclass
class SecureStack:
    server: EmbeddedNats
    authority: Authority
    creds_dir: Path
    ca: Path
    data_dir: Path

    def settings(self, **nats: Any) -> Settings:
        """Settings that find the credentials in the stack's directory (as `blackboard dev` sets them)."""
        values: dict[str, Any] = {"url": self.server.url, "credentials_dir": self.creds_dir, "write_timeout": 30.0,
                                  "connect_attempts": 2, "reconnect_time_wait": 0.1}
        values.update(nats)
        return Settings().model_copy(update={"nats": NatsSettings(**values),
                                             "dev": DevSettings(data_dir=self.data_dir)})


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureStack]:
    root = tmp_path_factory.mktemp("secure")
    authority = Authority(root / "auth", Grants())
    authority.init(policy=POLICY)
    for principal in ("alice", "bob", "carol", "operator"):
        authority.issue(principal)
    tls = ensure_dev_certificates(root / "auth" / "tls", server_hosts("127.0.0.1"))
    shutil.copy(tls.ca, authority.creds_dir / "ca.pem")
    server = EmbeddedNats(root / "nats", port=0, auth_config=authority.write_server_config(), tls=tls)
    server.start()
    try:
        yield SecureStack(server, authority, authority.creds_dir, tls.ca, root / "dev")
    finally:
        server.stop()


@pytest_asyncio.fixture(scope="module")
async def streams(secure: SecureStack) -> None:
    """The JetStream assets, created by the operator (agents hold no right to)."""
    s = secure.settings()
    nc = await connect_nats(s.nats, name="operator", credentials=find_credentials("operator", s))
    try:
        await ensure_streams(nc.jetstream(timeout=5), s)
    finally:
        await nc.close()


@pytest_asyncio.fixture
async def alice_nc(secure: SecureStack) -> AsyncIterator[NATS]:
    s = secure.settings()
    nc = await connect_nats(s.nats, name="alice", credentials=find_credentials("alice", s))
    yield nc
    await nc.close()


# -- connecting ------------------------------------------------------------------------

@pytest.mark.asyncio
@pytest.mark.usefixtures("streams")
async def test_an_agent_connects_with_its_credential_and_uses_its_granted_board(secure: SecureStack) -> None:
    async with Agent.connect("alice", settings=secure.settings()) as agent:
        assert agent.nc.is_connected
        # TLS, verified with the CA beside the credential; replies under the principal's inbox
        assert agent.nc.connected_url is not None and agent.nc.connected_url.scheme == "tls"
        assert agent.nc.new_inbox().startswith(Grants.reply_prefix("alice") + ".")
        rev = await agent.board("granted").put("notes", "k1", {"v": 1})
        assert rev > 0


@pytest.mark.asyncio
async def test_an_explicit_credential_path_or_object_is_used(secure: SecureStack) -> None:
    s = secure.settings(credentials_dir=None, tls_ca_file=secure.ca)
    path = secure.creds_dir / "alice.creds"
    for given in (path, str(path), Credentials.parse(path.read_text())):
        nc = await connect_nats(s.nats, name="t", credentials=find_credentials("alice", s, given))
        await nc.close()


@pytest.mark.asyncio
@pytest.mark.usefixtures("no_connect")
async def test_connecting_as_another_id_than_the_credentials_fails_before_connecting(secure: SecureStack) -> None:
    with pytest.raises(AuthenticationError) as err:
        await Agent.connect("mallory", settings=secure.settings(), credentials=secure.creds_dir / "alice.creds")
    assert "'alice'" in str(err.value) and "'mallory'" in str(err.value)
    assert err.value.principal == "mallory"


@pytest.mark.asyncio
@pytest.mark.usefixtures("no_connect")
async def test_no_credential_fails_before_connecting_naming_where_it_looked(secure: SecureStack) -> None:
    with pytest.raises(AuthenticationError) as err:
        await Agent.connect("dave", settings=secure.settings())
    assert str(secure.creds_dir / "dave.creds") in str(err.value)
    assert "blackboard auth add dave" in str(err.value)


@pytest.mark.asyncio
async def test_an_unknown_credential_is_refused_by_the_server(secure: SecureStack, tmp_path: Path) -> None:
    other = Authority(tmp_path / "other", Grants())  # another operator and account: keys the server never saw
    other.init(policy=POLICY)
    creds, _ = other.issue("alice")
    started = time.monotonic()
    with pytest.raises(AuthenticationError) as err:
        await Agent.connect("alice", settings=secure.settings(tls_ca_file=secure.ca), credentials=creds)
    assert "refused the credential of 'alice'" in str(err.value)
    assert "authorization violation" in str(err.value)
    assert time.monotonic() - started < FAST


@pytest.mark.asyncio
async def test_a_revoked_credential_is_refused(secure: SecureStack, caplog: pytest.LogCaptureFixture) -> None:
    s = secure.settings()
    carol = find_credentials("carol", s)
    assert carol is not None
    live = await connect_nats(s.nats, name="carol", credentials=carol)  # accepted before the revocation
    assert secure.authority.revoke("carol")
    secure.server.reload()
    deadline = time.monotonic() + 10
    while not live.is_closed:  # the server ends the live connection (no reconnect)
        assert time.monotonic() < deadline, "the revoked credential's connection is still open"
        await asyncio.sleep(0.05)
    assert any("no longer accepted" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
    while True:  # the server applies the reload in the background
        try:
            nc = await connect_nats(s.nats, name="carol", credentials=carol)
        except AuthenticationError as exc:
            assert "refused the credential of 'carol'" in str(exc)
            assert exc.principal == "carol"
            break
        await nc.close()
        assert time.monotonic() < deadline, "the revoked credential is still accepted"
        await asyncio.sleep(0.1)


@pytest.mark.asyncio
async def test_no_credential_at_a_server_that_requires_one_is_an_authentication_error(secure: SecureStack) -> None:
    s = secure.settings(credentials_dir=None, insecure_open_bus=True, tls_ca_file=secure.ca)
    with pytest.raises(AuthenticationError, match="requires a credential"):
        await Agent.connect("alice", settings=s)


@pytest.mark.asyncio
async def test_the_insecure_open_bus_connects_to_an_open_server_without_a_credential(
        open_nats_server: EmbeddedNats, tmp_path: Path) -> None:
    s = Settings().model_copy(update={
        "nats": NatsSettings(url=open_nats_server.url, insecure_open_bus=True),
        "dev": DevSettings(data_dir=tmp_path)})
    async with Agent.connect("anyone", settings=s) as agent:
        assert agent.nc.is_connected
        assert agent.nc.new_inbox().startswith("_INBOX.") and not agent.nc.new_inbox().startswith("_INBOX.anyone")
        assert await agent.board("open").put("s", "k", {"v": 1}) > 0


# -- permission violations ---------------------------------------------------------------

@pytest.mark.asyncio
@pytest.mark.usefixtures("streams")
async def test_a_put_on_a_board_without_the_right_fails_fast(secure: SecureStack) -> None:
    async with Agent.connect("bob", settings=secure.settings()) as agent:  # bob only reads "granted"
        for board in ("granted", "elsewhere"):
            started = time.monotonic()
            with pytest.raises(PermissionDeniedError) as err:
                await agent.board(board).put("notes", "k", {"v": 1})
            assert time.monotonic() - started < FAST
            assert f"$KV.blackboard.{board}.notes.k" in str(err.value) and "'bob'" in str(err.value)
            assert err.value.operation == f"publish to $KV.blackboard.{board}.notes.k"


@pytest.mark.asyncio
@pytest.mark.usefixtures("streams")
async def test_pipelined_writes_without_the_right_fail_fast(secure: SecureStack) -> None:
    async with Agent.connect("bob", settings=secure.settings()) as agent:
        started = time.monotonic()
        with pytest.raises(PermissionDeniedError):
            async with agent.board("elsewhere").pipeline() as pipe:
                for i in range(20):
                    await pipe.put("s", f"k{i}", {"i": i})
        assert time.monotonic() - started < FAST


@pytest.mark.asyncio
@pytest.mark.usefixtures("streams")
async def test_a_publish_to_a_forbidden_subject_fails_fast_and_others_are_not_disturbed(
        secure: SecureStack, alice_nc: NATS) -> None:
    s = secure.settings()
    publisher = Publisher(alice_nc, alice_nc.jetstream(), s.nats)
    forbidden = "bb.vote.granted.p1.outcome"  # outcomes come from the worker only
    allowed = "$KV.blackboard.granted.s.k2"
    started = time.monotonic()
    results = await asyncio.gather(
        publisher.publish(forbidden, b"{}", {"Nats-Msg-Id": publisher.msg_id()}, what="an outcome"),
        publisher.publish(allowed, b"{}", {"Nats-Msg-Id": publisher.msg_id()}, what="a put"),
        return_exceptions=True)
    assert time.monotonic() - started < FAST
    assert isinstance(results[0], PermissionDeniedError) and forbidden in str(results[0])
    assert not isinstance(results[1], BaseException) and results[1].seq > 0
    violations = permission_violations(alice_nc)
    assert violations is not None and violations.refused("publish", forbidden)
    await publisher.close()


@pytest.mark.asyncio
@pytest.mark.usefixtures("streams")
async def test_subjects_told_apart_only_by_case_fail_after_one_attempt(secure: SecureStack) -> None:
    # The client gets the server's error text lower-cased: a refusal of "GRANTED" could be of
    # "granted" too, so neither is failed at once; the refused one fails when its attempt times out.
    s = secure.settings(write_attempt_timeout=0.3)
    nc = await connect_nats(s.nats, name="alice", credentials=find_credentials("alice", s))
    publisher = Publisher(nc, nc.jetstream(), s.nats)
    try:
        started = time.monotonic()
        denied, allowed = await asyncio.gather(
            publisher.publish("$KV.blackboard.GRANTED.s.k", b"{}", {"Nats-Msg-Id": publisher.msg_id()}, what="a"),
            publisher.publish("$KV.blackboard.granted.s.k", b"{}", {"Nats-Msg-Id": publisher.msg_id()}, what="b"),
            return_exceptions=True)
        assert time.monotonic() - started < FAST
        assert isinstance(denied, PermissionDeniedError) and "$KV.blackboard.GRANTED.s.k" in str(denied)
        assert not isinstance(allowed, BaseException) and allowed.seq > 0
    finally:
        await publisher.close()
        await nc.close()


@pytest.mark.asyncio
@pytest.mark.usefixtures("streams")
async def test_a_request_to_a_forbidden_subject_fails_fast(secure: SecureStack, alice_nc: NATS) -> None:
    publisher = Publisher(alice_nc, alice_nc.jetstream(), secure.settings().nats)
    started = time.monotonic()
    with pytest.raises(PermissionDeniedError) as err:  # stream administration: never an agent's right
        await publisher.request("$JS.API.STREAM.DELETE.BB_VOTE", b"", what="a stream deletion")
    assert time.monotonic() - started < FAST
    assert "$JS.API.STREAM.DELETE.BB_VOTE" in str(err.value) and "(a stream deletion)" in str(err.value)
    # the connection is still good for what alice may do
    reply = await publisher.request("$JS.API.INFO", b"", what="the account info")
    assert "memory" in json.loads(reply.data)


@pytest.mark.asyncio
@pytest.mark.usefixtures("streams")
async def test_a_jetstream_api_call_without_the_right_fails_fast(alice_nc: NATS) -> None:
    # nats-py's own JetStream calls go through the connection's request too
    started = time.monotonic()
    with pytest.raises(PermissionDeniedError, match=r"\$JS.API.STREAM.DELETE.BB_VOTE"):
        await alice_nc.jetstream(timeout=5).delete_stream("BB_VOTE")
    assert time.monotonic() - started < FAST


@pytest.mark.asyncio
@pytest.mark.usefixtures("streams")
async def test_request_handlers_start_fast_and_answer_with_a_credential(secure: SecureStack) -> None:
    # handle() waits until the server has its subscription: with a credential by the refusal
    # of a publish to the agent's own inbox, as fast as the "no responders" of an open bus
    async with Agent.connect("alice", settings=secure.settings()) as alice, \
            Agent.connect("bob", settings=secure.settings()) as bob:
        started = time.monotonic()
        await bob.handle("ping", lambda req: {"pong": True})
        assert time.monotonic() - started < FAST
        assert await alice.request("bob", "ping", {}) == {"pong": True}


@pytest.mark.asyncio
async def test_a_request_cancelled_by_its_caller_stays_cancelled(secure: SecureStack, alice_nc: NATS) -> None:
    publisher = Publisher(alice_nc, alice_nc.jetstream(), secure.settings().nats)
    task = asyncio.ensure_future(publisher.request("bb.rpc.nobody-listens", b"", what="x"))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    violations = permission_violations(alice_nc)
    assert violations is not None and not violations.guards


# -- TLS ---------------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_tls_verifies_the_server_with_the_configured_ca(secure: SecureStack, tmp_path: Path) -> None:
    creds = secure.creds_dir / "alice.creds"
    elsewhere = tmp_path / "alice.creds"  # a directory without ca.pem
    shutil.copy(creds, elsewhere)
    s = secure.settings(credentials_dir=None, tls_ca_file=secure.ca)
    found = find_credentials("alice", s, elsewhere)
    assert isinstance(found, FoundCredentials) and found.ca_file is None
    nc = await connect_nats(s.nats, name="t", credentials=found)
    assert nc.connected_url is not None and nc.connected_url.scheme == "tls"
    await nc.close()


@pytest.mark.asyncio
async def test_tls_without_the_ca_fails_clearly(secure: SecureStack, tmp_path: Path) -> None:
    elsewhere = tmp_path / "alice.creds"
    shutil.copy(secure.creds_dir / "alice.creds", elsewhere)
    s = secure.settings(credentials_dir=None)
    started = time.monotonic()
    with pytest.raises(NotConnectedError) as err:
        await Agent.connect("alice", settings=s, credentials=elsewhere)
    assert "TLS certificate does not verify" in str(err.value) and "tls_ca_file" in str(err.value)
    assert time.monotonic() - started < FAST
