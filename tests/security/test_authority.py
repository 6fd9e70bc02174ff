"""The identity authority: keys, the policy, issued and revoked identities, and a real
nats-server in operator mode enforcing what it renders."""

from __future__ import annotations

import asyncio
import json
import stat
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from blackboard.client.streams import ensure_streams
from blackboard.devstack import EmbeddedNats
from blackboard.protocol.errors import ConfigurationError
from blackboard.protocol.subjects import Grants
from blackboard.security.authority import Authority, Identity
from blackboard.security.jwt import Credentials, decode_claims, public_key, verify
from blackboard.security.policy import Right
from tests.conftest import make_settings

POLICY = """\
# the team's policy (this comment must survive `declare`)
version = 1

[roles.member]
boards = { "*" = ["read", "write", "vote"] }
objects = "write"

[agents.alice]
boards = { b1 = ["read", "write", "vote"] }

[agents.bob]
roles = ["member"]

[agents."ci-*"]
roles = ["member"]

[workers.worker]
[operators.operator]
"""


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def base(stack_dir: Path) -> Path:
    path = stack_dir / f"auth-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    return path


@pytest.fixture
def authority(base: Path) -> Authority:
    authority = Authority(base / "auth", Grants())
    authority.init(policy=POLICY)
    return authority


@pytest.fixture
def server(base: Path, authority: Authority) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(base / "nats", port=0, auth_config=authority.write_server_config())
    server.start()
    yield server
    server.stop()


@dataclass
class Watch:
    """What the server told one connection: errors (permission violations) and its disconnection."""

    errors: list[str] = field(default_factory=list)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    _more: asyncio.Event = field(default_factory=asyncio.Event)

    async def error(self, exc: Exception) -> None:
        self.errors.append(str(exc))
        self._more.set()

    async def gone(self) -> None:
        self.disconnected.set()

    async def violation(self, text: str, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            # (the server writes a subscription's subject in lower case)
            while not any("permissions violation" in e and text.lower() in e.lower() for e in self.errors):
                self._more.clear()
                await self._more.wait()


@asynccontextmanager
async def client(server: EmbeddedNats, creds: Path | None, principal: str | None = None
                 ) -> AsyncIterator[tuple[NATS, Watch]]:
    watch = Watch()
    options: dict[str, object] = {}
    if creds is not None:
        options["user_credentials"] = str(creds)
    if principal is not None:
        options["inbox_prefix"] = f"_INBOX.{principal}"
    nc = await nats.connect(server.url, allow_reconnect=False, connect_timeout=5, error_cb=watch.error,
                            disconnected_cb=watch.gone, closed_cb=watch.gone, **options)
    try:
        yield nc, watch
    finally:
        await nc.close()


async def refused(server: EmbeddedNats, creds: Path | None) -> str:
    """The server's refusal of a connection with ``creds`` (the test fails if it connects)."""
    watch = Watch()
    options: dict[str, object] = {} if creds is None else {"user_credentials": str(creds)}
    with pytest.raises(nats.errors.Error) as info:
        nc = await nats.connect(server.url, allow_reconnect=False, connect_timeout=5, error_cb=watch.error,
                                **options)
        await nc.close()
    return str(info.value)


# ------------------------------------------------------------------- keys and files
def test_init_makes_keys_once_and_keeps_them(base: Path) -> None:
    authority = Authority(base / "fresh", Grants())
    assert not authority.initialized
    assert authority.init() is True
    assert authority.initialized
    keys = {name: (base / "fresh" / "keys" / f"{name}.nk").read_text() for name in ("operator", "account", "system")}
    for name, seed in keys.items():
        assert _mode(base / "fresh" / "keys" / f"{name}.nk") == 0o600
        assert seed.startswith("SO" if name == "operator" else "SA")
    assert _mode(authority.creds_dir) == 0o700
    assert "[workers.worker]" in authority.policy_file.read_text()
    authority.policy_file.write_text(POLICY)
    assert authority.init() is False
    assert authority.init(policy="[agents.other]\n") is False
    assert {name: (base / "fresh" / "keys" / f"{name}.nk").read_text() for name in keys} == keys
    assert authority.policy_file.read_text() == POLICY  # an existing policy is kept


def test_without_init_nothing_is_issued(base: Path) -> None:
    authority = Authority(base / "none", Grants())
    with pytest.raises(ConfigurationError, match="cannot read the access policy"):
        authority.issue("alice")
    (base / "none").mkdir()
    (base / "none" / "policy.toml").write_text(POLICY)
    with pytest.raises(ConfigurationError, match="blackboard auth init"):
        authority.issue("alice")
    with pytest.raises(ConfigurationError, match="blackboard auth init"):
        authority.server_config()


def test_issue_writes_a_private_creds_file_and_records_it(authority: Authority) -> None:
    creds, changed = authority.issue("alice")
    assert changed is False
    path = authority.credentials_path("alice")
    assert path == authority.creds_dir / "alice.creds"
    assert _mode(path) == 0o600
    assert Credentials.parse(path.read_text()) == creds
    assert creds.principal == "alice"
    claims = verify(creds.jwt)
    assert claims["iss"] == public_key((authority.directory / "keys" / "account.nk").read_text().strip())
    assert claims["nats"]["tags"] == ["bb-kind:agent"]
    assert "bb.msg.board.b1" in claims["nats"]["pub"]["allow"]
    assert "bb.msg.board.b2" not in claims["nats"]["pub"]["allow"]
    (ident,) = authority.identities()
    assert ident == Identity("alice", "agent", creds.public_key, ident.issued_at)
    assert ident.active
    registry = authority.directory / "registry.json"
    assert _mode(registry) == 0o600
    assert json.loads(registry.read_text())["identities"][0]["principal"] == "alice"


def test_issue_without_writing_the_file(authority: Authority) -> None:
    creds, _ = authority.issue("bob", write=False)
    assert not authority.credentials_path("bob").exists()
    assert [i.public_key for i in authority.identities()] == [creds.public_key]


def test_the_kind_is_recorded_and_in_the_jwt(authority: Authority) -> None:
    worker, _ = authority.issue("worker")
    operator, _ = authority.issue("operator")
    ci, _ = authority.issue("ci-7")  # declared by a glob
    assert [(i.principal, i.kind) for i in authority.identities()] == \
        [("worker", "worker"), ("operator", "operator"), ("ci-7", "agent")]
    for creds in (worker, operator):
        nats_claims = decode_claims(creds.jwt)["nats"]
        assert nats_claims["pub"]["allow"] == [">"] and nats_claims["sub"]["allow"] == [">"]
    assert decode_claims(ci.jwt)["nats"]["tags"] == ["bb-kind:agent"]
    assert authority.rights("ci-7").can("x", Right.WRITE)


def test_an_undeclared_principal_is_not_issued(authority: Authority) -> None:
    with pytest.raises(ConfigurationError, match=r"'stranger' is not declared.*blackboard auth add stranger"):
        authority.issue("stranger")
    with pytest.raises(ConfigurationError, match="not declared"):
        authority.credentials_for("stranger")
    assert authority.identities() == []
    assert not authority.credentials_path("stranger").exists()


def test_reissuing_revokes_the_earlier_key(authority: Authority) -> None:
    first, _ = authority.issue("alice")
    second, changed = authority.issue("alice")
    assert changed is True and second.public_key != first.public_key
    old, new = authority.identities()
    assert old.public_key == first.public_key and not old.active and old.revoked_at is not None
    assert new.public_key == second.public_key and new.active
    # The new key was issued after the revocation (the server refuses JWTs issued at or before it).
    assert new.issued_at >= old.revoked_at  # revocations name keys: no wait for a later second
    assert decode_claims(second.jwt)["iat"] == new.issued_at
    assert authority.revocations() == {first.public_key: old.revoked_at}
    assert Credentials.parse(authority.credentials_path("alice").read_text()) == second
    assert _account_revocations(authority) == {first.public_key: old.revoked_at}


def _account_revocations(authority: Authority) -> dict[str, int]:
    """The revocations in the account JWT of the rendered server config."""
    account = public_key((authority.directory / "keys" / "account.nk").read_text().strip())
    for line in authority.config_file.read_text().splitlines():
        if line.strip().startswith(account + ":"):
            claims = verify(line.split(":", 1)[1].strip().strip('"'))
            revocations: dict[str, int] = claims["nats"].get("revocations", {})
            return revocations
    raise AssertionError("the account is not in the server config")


def test_revoke_records_removes_the_file_and_renders_the_config(authority: Authority) -> None:
    creds, _ = authority.issue("alice")
    authority.write_server_config()
    assert _account_revocations(authority) == {}
    (revoked,) = authority.revoke("alice")
    assert revoked.public_key == creds.public_key and revoked.revoked_at is not None
    assert not authority.credentials_path("alice").exists()
    assert _account_revocations(authority) == {creds.public_key: revoked.revoked_at}
    assert authority.revoke("alice") == []
    assert authority.revoke("nobody") == []


def test_credentials_for_reuses_the_active_file(authority: Authority) -> None:
    first = authority.credentials_for("bob")
    assert authority.credentials_for("bob") == first
    assert len(authority.identities()) == 1
    stale = authority.credentials_path("bob").read_text()
    authority.revoke("bob")
    second = authority.credentials_for("bob")
    assert second.public_key != first.public_key
    # A file holding a revoked key is not used: a new key is issued.
    authority.credentials_path("bob").write_text(stale)
    third = authority.credentials_for("bob")
    assert third.public_key not in (first.public_key, second.public_key)
    assert [i.active for i in authority.identities()] == [False, False, True]


def test_declare_appends_to_the_policy(authority: Authority) -> None:
    assert authority.declare("carol", roles=["member"]) is True
    text = authority.policy_file.read_text()
    assert text.startswith(POLICY)  # appended: comments and layout kept
    assert text.endswith('\n[agents.carol]\nroles = ["member"]\n')
    assert authority.rights("carol").can("any", Right.VOTE)
    assert authority.declare("carol", roles=["member"]) is False
    assert authority.declare("ci-9") is False  # a glob declares it already
    assert authority.declare("alice", kind="worker") is False
    assert authority.declare("w2", kind="worker") is True
    assert authority.policy().kind_of("w2") == "worker"
    assert authority.declare("dave") is True
    assert authority.rights("dave").boards(Right.READ) == frozenset()  # no roles: no boards
    assert authority.policy_file.read_text().startswith(text)


def test_declare_refuses_unknown_roles_and_bad_ids(authority: Authority) -> None:
    before = authority.policy_file.read_text()
    with pytest.raises(ConfigurationError, match="unknown role 'boss'"):
        authority.declare("eve", roles=["boss"])
    with pytest.raises(ValueError, match="agent id must be"):
        authority.declare("eve.x")
    with pytest.raises(ValueError, match="agent id must be"):
        authority.declare("eve]\n[operators.x")
    assert authority.policy_file.read_text() == before


def test_the_server_config_names_the_operator_and_accounts(authority: Authority) -> None:
    text = authority.server_config()
    seeds = {n: (authority.directory / "keys" / f"{n}.nk").read_text().strip() for n in ("operator", "account",
                                                                                        "system")}
    assert "resolver: MEMORY" in text
    assert f'system_account: "{public_key(seeds["system"])}"' in text
    assert public_key(seeds["account"]) in text
    path = authority.write_server_config(authority.directory / "elsewhere.conf")
    assert path.read_text().startswith("# Rendered by `blackboard auth render`")
    assert _mode(path) == 0o600


def test_the_operator_jwt_is_signed_once(authority: Authority, monkeypatch: pytest.MonkeyPatch) -> None:
    """nats-server refuses to reload a config whose operator changed: every render names the
    same operator JWT, whenever it is made (the account JWT, with the revocations, changes)."""

    def operator_line(text: str) -> str:
        (line,) = [ln for ln in text.splitlines() if ln.startswith("operator:")]
        return line

    first = authority.server_config()
    later = time.time() + 3600
    monkeypatch.setattr(time, "time", lambda: later)
    second = authority.server_config()
    assert operator_line(second) == operator_line(first)
    assert second != first  # the accounts are signed again
    assert _mode(authority.directory / "keys" / "operator.jwt") == 0o600
    # A new operator key (the keys made again) gets a new operator JWT.
    (authority.directory / "keys" / "operator.nk").unlink()
    authority.init()
    assert operator_line(authority.server_config()) != operator_line(first)


def test_from_settings_uses_the_settings_directories(tmp_path: Path) -> None:
    from blackboard.settings import DevSettings, SecuritySettings, Settings

    settings = Settings().model_copy(update={"dev": DevSettings(data_dir=tmp_path / "data")})
    authority = Authority.from_settings(settings)
    assert authority.directory == tmp_path / "data" / "auth"
    assert authority.policy_file == tmp_path / "data" / "auth" / "policy.toml"
    settings = settings.model_copy(update={"security": SecuritySettings(
        authority_dir=tmp_path / "a", policy_file=tmp_path / "p.toml")})
    authority = Authority.from_settings(settings)
    assert authority.directory == tmp_path / "a" and authority.policy_file == tmp_path / "p.toml"
    assert authority.grants.bucket == settings.board.bucket


# ------------------------------------------------------------------ a real server
@pytest.mark.asyncio
async def test_an_issued_identity_connects_and_uses_its_board(server: EmbeddedNats, authority: Authority) -> None:
    authority.issue("alice")
    async with client(server, authority.credentials_path("alice"), "alice") as (nc, watch):
        got: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_msg(msg: Msg) -> None:
            await got.put(msg.data)

        await nc.subscribe("bb.msg.board.b1", cb=on_msg)
        await nc.publish("bb.msg.board.b1", b"hello")
        assert await asyncio.wait_for(got.get(), 5) == b"hello"
        # Requests are answered on its own inbox: the JetStream account info.
        reply = await nc.request("$JS.API.INFO", b"", timeout=5)
        assert b"memory" in reply.data
        await nc.publish("bb.msg.board.b2", b"not mine")
        await watch.violation('publish to "bb.msg.board.b2"')
        await nc.publish("bb.mem.b1.bob", b"as bob")
        await watch.violation('publish to "bb.mem.b1.bob"')
        await nc.subscribe("_INBOX.bob.>")
        await watch.violation('subscription to "_INBOX.bob.>"')
        await nc.subscribe(">")
        await watch.violation('subscription to ">"')
        assert nc.is_connected


@pytest.mark.asyncio
async def test_the_server_enforces_the_board_rights_on_jetstream(server: EmbeddedNats,
                                                                 authority: Authority) -> None:
    authority.issue("operator")
    authority.issue("alice")
    async with client(server, authority.credentials_path("operator"), "operator") as (admin, _):
        await ensure_streams(admin.jetstream(), make_settings(server.url))
    async with client(server, authority.credentials_path("alice"), "alice") as (nc, watch):
        js = nc.jetstream()
        ack = await js.publish("$KV.blackboard.b1.s.k", b"v1", timeout=5)
        assert ack.stream == "KV_blackboard"
        got = await nc.request("$JS.API.DIRECT.GET.KV_blackboard.$KV.blackboard.b1.s.k", b"", timeout=5)
        assert got.data == b"v1"
        with pytest.raises(nats.errors.TimeoutError):
            await js.publish("$KV.blackboard.b2.s.k", b"v1", timeout=1)
        await watch.violation('publish to "$KV.blackboard.b2.s.k"')
        with pytest.raises(nats.errors.TimeoutError):
            await nc.request("$JS.API.STREAM.NAMES", b"", timeout=1)
        await watch.violation('"$JS.API.STREAM.NAMES"')
        with pytest.raises(nats.errors.TimeoutError):
            await nc.request("$JS.API.STREAM.PURGE.KV_blackboard", b"", timeout=1)


@pytest.mark.asyncio
async def test_anonymous_and_foreign_clients_are_refused(server: EmbeddedNats, authority: Authority,
                                                         base: Path) -> None:
    assert "Authorization Violation" in await refused(server, None)
    other = Authority(base / "other", Grants())
    other.init(policy=POLICY)
    other.issue("alice")
    assert "Authorization Violation" in await refused(server, other.credentials_path("alice"))


@pytest.mark.asyncio
async def test_the_system_identities_may_use_everything(server: EmbeddedNats, authority: Authority) -> None:
    authority.issue("worker")
    async with client(server, authority.credentials_path("worker"), "worker") as (nc, watch):
        sub = await nc.subscribe(">")
        await nc.publish("anything.at.all", b"x")
        msg = await sub.next_msg(timeout=5)
        assert msg.subject == "anything.at.all"
        await nc.request("$JS.API.STREAM.NAMES", b"", timeout=5)
        assert not any("permissions violation" in e for e in watch.errors)


@pytest.mark.asyncio
async def test_a_revoked_identity_is_disconnected_and_refused(server: EmbeddedNats, authority: Authority) -> None:
    authority.issue("alice")
    path = authority.credentials_path("alice")
    kept = path.with_name("alice-kept.creds")
    kept.write_text(path.read_text())
    async with client(server, path, "alice") as (nc, watch):
        assert authority.revoke("alice")
        server.reload()
        await asyncio.wait_for(watch.disconnected.wait(), 10)
        assert not nc.is_connected
    assert "Authorization Violation" in await refused(server, kept)


@pytest.mark.asyncio
async def test_reissuing_disconnects_the_earlier_key(server: EmbeddedNats, authority: Authority) -> None:
    authority.issue("bob")
    path = authority.credentials_path("bob")
    old = path.with_name("bob-old.creds")
    old.write_text(path.read_text())
    async with client(server, old, "bob") as (nc, watch):
        _, changed = authority.issue("bob")
        assert changed
        server.reload()
        await asyncio.wait_for(watch.disconnected.wait(), 10)
    assert "Authorization Violation" in await refused(server, old)
    async with client(server, path, "bob") as (nc, _):
        await nc.publish("bb.msg.board.anything", b"x")
        await nc.flush()
        assert nc.is_connected


@pytest.mark.asyncio
async def test_a_new_identity_needs_no_server_change(server: EmbeddedNats, authority: Authority) -> None:
    authority.declare("late", roles=["member"])
    authority.issue("late")
    async with client(server, authority.credentials_path("late"), "late") as (nc, _):
        await nc.flush()
        assert nc.is_connected
