"""``blackboard auth``: init, add, list, show, revoke, render, publish (their output and exit
codes), a revocation reaching a running dev nats-server, and the key registry (certificates
and the revocations record) published to it."""

from __future__ import annotations

import asyncio
import os
import re
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgpack
import nats
import pytest

from blackboard.apps.cli import main
from blackboard.devstack import EmbeddedNats, free_port
from blackboard.protocol.schemas import KeyRevocations, validate_wire
from blackboard.protocol.subjects import KEYS_STREAM, Grants
from blackboard.security.authority import Authority
from blackboard.security.certificates import Revocations, read_certificate
from blackboard.security.jwt import Credentials, decode_claims

Run = tuple[int, str, str]


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No BLACKBOARD_* setting from the environment, and no ./.blackboard of the repository."""
    for name in list(os.environ):
        if name.startswith("BLACKBOARD_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def auth_dir(tmp_path: Path) -> Path:
    return tmp_path / "authority"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> Run:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def auth(capsys: pytest.CaptureFixture[str], auth_dir: Path, *argv: str) -> Run:
    return run(capsys, "auth", "--dir", str(auth_dir), *argv)


@pytest.fixture
def initialized(capsys: pytest.CaptureFixture[str], auth_dir: Path) -> Path:
    code, _, _ = auth(capsys, auth_dir, "init")
    assert code == 0
    return auth_dir


def test_init_makes_the_authority_once(capsys: pytest.CaptureFixture[str], auth_dir: Path) -> None:
    code, out, err = auth(capsys, auth_dir, "init")
    assert code == 0 and err == ""
    assert f"identity authority in {auth_dir} (made)" in out
    assert str(auth_dir / "policy.toml") in out and "blackboard auth add" in out
    keys = sorted(p.name for p in (auth_dir / "keys").iterdir())
    assert keys == ["account.nk", "operator.nk", "system.nk"]
    seed = (auth_dir / "keys" / "account.nk").read_text()
    code, out, _ = auth(capsys, auth_dir, "init")
    assert code == 0 and "(already there)" in out
    assert (auth_dir / "keys" / "account.nk").read_text() == seed


def test_the_default_directory_is_under_the_data_dir(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, _ = run(capsys, "auth", "--data-dir", str(tmp_path / "data"), "init")
    assert code == 0 and (tmp_path / "data" / "auth" / "policy.toml").exists()
    code, _, _ = run(capsys, "auth", "init")  # ./.blackboard/auth (the cwd is the test's)
    assert code == 0 and (tmp_path / ".blackboard" / "auth" / "policy.toml").exists()


def test_commands_need_an_initialized_authority(capsys: pytest.CaptureFixture[str], auth_dir: Path) -> None:
    for argv in (["add", "alice"], ["list"], ["show", "planner"], ["revoke", "alice"], ["render"]):
        code, out, err = auth(capsys, auth_dir, *argv)
        assert code == 2, argv
        assert "blackboard auth: error: no identity authority" in err and "blackboard auth init" in err
        assert out == ""


def test_add_declares_and_issues(capsys: pytest.CaptureFixture[str], initialized: Path) -> None:
    code, out, err = auth(capsys, initialized, "add", "alice")
    assert code == 0, err
    creds_file = initialized / "creds" / "alice.creds"
    assert f"declared agent 'alice' in {initialized / 'policy.toml'}" in out
    creds = Credentials.parse(creds_file.read_text())
    assert f"issued 'alice': {creds_file}  (public key {creds.public_key})" in out
    assert creds.principal == "alice"
    assert stat.S_IMODE(creds_file.stat().st_mode) == 0o600
    assert '[agents.alice]\nroles = ["member"]' in (initialized / "policy.toml").read_text()


def test_add_of_a_declared_id_only_issues(capsys: pytest.CaptureFixture[str], initialized: Path) -> None:
    code, out, _ = auth(capsys, initialized, "add", "team-x-planner")  # the default policy's "team-*"
    assert code == 0
    assert "declared agent" not in out and "issued 'team-x-planner'" in out
    assert "team-x-planner" not in (initialized / "policy.toml").read_text()


def test_add_again_revokes_the_earlier_key(capsys: pytest.CaptureFixture[str], initialized: Path) -> None:
    auth(capsys, initialized, "add", "planner")
    first = Credentials.parse((initialized / "creds" / "planner.creds").read_text())
    code, out, _ = auth(capsys, initialized, "add", "planner")
    assert code == 0
    assert "its earlier key is revoked: reload the NATS server's config" in out
    assert "publish the revocation to readers with `blackboard auth publish`" in out
    second = Credentials.parse((initialized / "creds" / "planner.creds").read_text())
    assert second.public_key != first.public_key
    code, out, _ = auth(capsys, initialized, "list")
    assert re.search(rf"planner\s+agent\s+revoked\s+\S+ \S+\s+{first.public_key}", out), out
    assert re.search(rf"planner\s+agent\s+active\s+\S+ \S+\s+{second.public_key}", out), out


def test_add_with_roles_kind_and_out(capsys: pytest.CaptureFixture[str], initialized: Path,
                                     tmp_path: Path) -> None:
    out_file = tmp_path / "given" / "r.creds"
    out_file.parent.mkdir()
    code, out, _ = auth(capsys, initialized, "add", "reader1", "--role", "reader", "--out", str(out_file))
    assert code == 0
    assert f"issued 'reader1': {out_file}" in out
    assert stat.S_IMODE(out_file.stat().st_mode) == 0o600
    assert Credentials.parse(out_file.read_text()).principal == "reader1"
    assert (initialized / "creds" / "reader1.creds").exists()
    code, out, _ = auth(capsys, initialized, "show", "reader1")
    assert "board *: read" in out and "board *: read," not in out
    code, out, _ = auth(capsys, initialized, "add", "w2", "--kind", "worker")
    assert code == 0 and "declared worker 'w2'" in out
    assert "[workers.w2]\n" in (initialized / "policy.toml").read_text()
    code, out, _ = auth(capsys, initialized, "show", "w2")
    assert "w2: worker" in out and "may publish:   >" in out


def test_add_with_an_unknown_role_is_a_usage_error(capsys: pytest.CaptureFixture[str], initialized: Path) -> None:
    before = (initialized / "policy.toml").read_text()
    code, out, err = auth(capsys, initialized, "add", "carol", "--role", "boss")
    assert code == 2
    assert "blackboard auth: error:" in err and "unknown role 'boss'" in err
    assert out == ""
    assert (initialized / "policy.toml").read_text() == before
    assert not (initialized / "creds" / "carol.creds").exists()


@pytest.mark.parametrize("bad", ["a.b", "a b", "*", ">", "x]\n[operators.y"])
def test_a_malformed_id_is_a_usage_error(capsys: pytest.CaptureFixture[str], initialized: Path, bad: str) -> None:
    before = (initialized / "policy.toml").read_text()
    for argv in (["add", bad], ["show", bad], ["revoke", bad]):
        code, _, err = auth(capsys, initialized, *argv)
        assert code == 2, argv
        assert "blackboard auth: error: invalid key" in err and "principal id must be" in err
    assert (initialized / "policy.toml").read_text() == before


def test_list_shows_identities_and_the_declared_rest(capsys: pytest.CaptureFixture[str], initialized: Path) -> None:
    code, out, _ = auth(capsys, initialized, "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["principal", "kind", "status", "issued", "(UTC)", "public", "key"]
    assert "declared in the policy, no active credential: agent:planner, agent:ingest, agent:team-*, worker:worker, " \
           "operator:operator" in out
    auth(capsys, initialized, "add", "worker")
    code, out, _ = auth(capsys, initialized, "list")
    assert re.search(r"^worker\s+worker\s+active\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+U[A-Z0-9]{55}$", out, re.M), out
    assert "worker:worker" not in out


def test_show_prints_rights_and_permissions(capsys: pytest.CaptureFixture[str], initialized: Path) -> None:
    code, out, err = auth(capsys, initialized, "show", "planner")
    assert code == 0, err
    assert out.startswith("planner: agent\n")
    assert "  board *: read, vote, write\n" in out
    assert "  topics: >; objects: write\n" in out
    assert "  may publish:   $JS.API.INFO\n" in out
    assert "                 bb.vote.*.*.ballot.planner\n" in out
    assert "  may subscribe: _INBOX.planner.>\n" in out
    assert "bb.keys.revocations\n" in out
    # no key issued yet: no certificate of its own to publish (reading any through a
    # one-shot consumer, $JS.API.CONSUMER.CREATE.BB_KEYS.*.bb.keys.cert.*, is allowed to all)
    assert not [line for line in out.splitlines() if line.strip().startswith("bb.keys.cert.")]
    assert "$JS.API.CONSUMER.CREATE.BB_KEYS.*.bb.keys.cert.*\n" in out
    auth(capsys, initialized, "add", "planner")
    key = Credentials.parse((initialized / "creds" / "planner.creds").read_text()).public_key
    code, out, _ = auth(capsys, initialized, "show", "planner")
    assert code == 0 and f"                 bb.keys.cert.{key}\n" in out  # its own certificate only


def test_show_of_an_undeclared_id_fails(capsys: pytest.CaptureFixture[str], initialized: Path) -> None:
    code, out, err = auth(capsys, initialized, "show", "stranger")
    assert code == 2 and out == ""
    assert "'stranger' is not declared" in err and "blackboard auth add stranger" in err


def test_revoke(capsys: pytest.CaptureFixture[str], initialized: Path) -> None:
    auth(capsys, initialized, "add", "planner")
    code, out, _ = auth(capsys, initialized, "revoke", "planner", "--no-publish")
    assert code == 0
    assert "revoked 1 key(s) of 'planner': reload the NATS server's config for it to take effect" in out
    assert "the revocations record was not published (--no-publish)" in out and "blackboard auth publish" in out
    assert not (initialized / "creds" / "planner.creds").exists()
    code, out, _ = auth(capsys, initialized, "revoke", "planner", "--no-publish")
    assert code == 1 and "'planner' holds no active credential" in out
    code, out, _ = auth(capsys, initialized, "revoke", "nobody")
    assert code == 1 and "'nobody' holds no active credential" in out


def test_revoke_says_when_the_revocation_could_not_be_published(capsys: pytest.CaptureFixture[str],
                                                                  initialized: Path) -> None:
    auth(capsys, initialized, "add", "planner")
    nowhere = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    code, out, err = auth(capsys, initialized, "revoke", "planner", "--nats-url", nowhere)
    assert code == 1
    assert "revoked 1 key(s) of 'planner'" in out  # done here: the server refuses it after a reload ...
    # ... but the readers were not told, and the operator is told what to run
    assert f"the revocations record was NOT published to {nowhere}" in err
    assert "run `blackboard auth publish`" in err and "Traceback" not in err
    identities = Authority(initialized, Grants()).identities()
    assert [i.active for i in identities if i.principal == "planner"] == [False]


def test_publish_without_a_server_is_a_one_line_error(capsys: pytest.CaptureFixture[str],
                                                       initialized: Path) -> None:
    auth(capsys, initialized, "add", "planner")
    nowhere = f"nats://127.0.0.1:{free_port()}"
    code, _, err = auth(capsys, initialized, "publish", "--nats-url", nowhere)
    assert code == 1
    assert err.startswith("blackboard auth: error: ") and nowhere in err and "Traceback" not in err


def test_help_explains_publish_and_revoke(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, words in ((["auth", "--help"], ["publish", "revoke"]),
                        (["auth", "publish", "--help"], ["certificate", "revocations record", "--nats-url",
                                                         "blackboard setup"]),
                        (["auth", "revoke", "--help"], ["revocations record", "--no-publish", "--nats-url",
                                                        "blackboard auth publish"])):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        for word in words:
            assert word in text, (argv, word)


def test_revoke_refuses_a_malformed_url_before_revoking(capsys: pytest.CaptureFixture[str],
                                                         initialized: Path) -> None:
    auth(capsys, initialized, "add", "planner")
    code, _, err = auth(capsys, initialized, "revoke", "planner", "--nats-url", "htp://x")
    assert code == 2 and "error" in err
    assert all(i.active for i in Authority(initialized, Grants()).identities() if i.principal == "planner")


def test_a_stale_pid_file_is_not_signalled(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The dev server's pid file outlives it; its pid may name another process by now."""
    data = tmp_path / "data"
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (data / "nats").mkdir(parents=True)
        (data / "nats" / "nats.pid").write_text(str(bystander.pid))
        run(capsys, "auth", "--data-dir", str(data), "init")
        run(capsys, "auth", "--data-dir", str(data), "add", "planner")
        code, out, _ = run(capsys, "auth", "--data-dir", str(data), "revoke", "planner", "--no-publish")
        assert code == 0 and "reload the NATS server's config" in out
        assert bystander.poll() is None  # not hung up on
    finally:
        bystander.kill()
        bystander.wait()


def test_render_writes_the_server_config(capsys: pytest.CaptureFixture[str], initialized: Path,
                                         tmp_path: Path) -> None:
    code, out, _ = auth(capsys, initialized, "render")
    assert code == 0
    conf = initialized / "nats-auth.conf"
    assert f"wrote {conf}: include it in the nats-server config" in out
    assert "resolver: MEMORY" in conf.read_text()
    code, out, _ = auth(capsys, initialized, "render", "--out", str(tmp_path / "elsewhere.conf"))
    assert code == 0 and (tmp_path / "elsewhere.conf").read_text().startswith("# Rendered by")


@pytest.mark.asyncio
async def test_revoke_reaches_the_running_dev_server(capsys: pytest.CaptureFixture[str], stack_dir: Path) -> None:
    """With the dev layout (<data-dir>/auth, <data-dir>/nats), revoke reloads the server itself."""
    data = stack_dir / f"cli-auth-{uuid.uuid4().hex[:8]}"
    assert await asyncio.to_thread(main, ["auth", "--data-dir", str(data), "init"]) == 0
    assert await asyncio.to_thread(main, ["auth", "--data-dir", str(data), "add", "planner"]) == 0
    authority = Authority(data / "auth", Grants())
    server = EmbeddedNats(data / "nats", port=0, auth_config=authority.write_server_config())
    server.start()
    try:
        gone = asyncio.Event()

        async def disconnected() -> None:
            gone.set()

        async def quiet(exc: Exception) -> None:
            pass

        nc = await nats.connect(server.url, user_credentials=str(data / "auth" / "creds" / "planner.creds"),
                                inbox_prefix="_INBOX.planner", allow_reconnect=False, error_cb=quiet,
                                disconnected_cb=disconnected)
        try:
            capsys.readouterr()
            code = await asyncio.to_thread(main, ["auth", "--data-dir", str(data), "revoke", "planner",
                                                  "--no-publish"])
            out = capsys.readouterr().out
            assert code == 0
            assert re.search(r"the dev nats-server \(pid \d+\) reloaded its config", out), out
            await asyncio.wait_for(gone.wait(), 10)
        finally:
            await nc.close()
    finally:
        server.stop()


async def _registry_get(url: str, creds: Path, principal: str, subject: str) -> bytes | None:
    """The last message of a key registry subject, read as an agent reads it (direct get)."""
    nc = await nats.connect(url, user_credentials=str(creds), inbox_prefix=f"_INBOX.{principal}",
                            allow_reconnect=False)
    try:
        msg = await nc.request(f"$JS.API.DIRECT.GET.{KEYS_STREAM}.{subject}", b"", timeout=5)
        return None if (msg.headers or {}).get("Status") == "404" else msg.data
    finally:
        await nc.close()


@pytest.mark.asyncio
async def test_publish_and_revoke_keep_the_key_registry(capsys: pytest.CaptureFixture[str], stack_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`auth publish` puts every active identity's certificate (its user JWT) and the revocations
    record on the bus as the operator; `auth revoke` publishes the new revocations record."""
    data = stack_dir / f"cli-keys-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("BLACKBOARD_DEV__DATA_DIR", str(data))  # where setup finds the operator
    for argv in (["init"], ["add", "planner"], ["add", "alice"]):
        assert await asyncio.to_thread(main, ["auth", "--data-dir", str(data), *argv]) == 0
    authority = Authority(data / "auth", Grants())
    server = EmbeddedNats(data / "nats", port=0, auth_config=authority.write_server_config())
    server.start()
    try:
        assert await asyncio.to_thread(main, ["setup", "--no-migrate", "--nats-url", server.url]) == 0
        planner = Credentials.parse((data / "auth" / "creds" / "planner.creds").read_text())
        alice = Credentials.parse((data / "auth" / "creds" / "alice.creds").read_text())
        account = decode_claims(planner.jwt)["iss"]

        capsys.readouterr()
        code = await asyncio.to_thread(main, ["auth", "--data-dir", str(data), "publish", "--nats-url", server.url])
        out = capsys.readouterr().out
        assert code == 0, out
        assert f"key registry on {server.url}: certificates published: " in out
        for who, creds in (("planner", planner), ("alice", alice)):
            assert who in out.split("already there")[0]
            cert = await _registry_get(server.url, data / "auth" / "creds" / "planner.creds", "planner",
                                       f"bb.keys.cert.{creds.public_key}")
            assert cert is not None and cert.decode() == creds.jwt  # the JWT of its .creds, as is
            info = read_certificate(creds.public_key, cert.decode(), {account})
            assert info is not None and (info.principal, info.kind) == (who, "agent")

        # again: nothing new
        code = await asyncio.to_thread(main, ["auth", "--data-dir", str(data), "publish", "--nats-url", server.url])
        out = capsys.readouterr().out
        assert code == 0 and "certificates published: none" in out and "revocations record unchanged" in out

        before = int(time.time())
        code = await asyncio.to_thread(main, ["auth", "--data-dir", str(data), "revoke", "alice",
                                              "--nats-url", server.url])
        out = capsys.readouterr().out
        assert code == 0, out
        assert re.search(r"the dev nats-server \(pid \d+\) reloaded its config", out), out
        assert f"published the revocations record on {server.url}" in out
        raw = await _registry_get(server.url, data / "auth" / "creds" / "planner.creds", "planner",
                                  "bb.keys.revocations")
        assert raw is not None
        record = validate_wire(KeyRevocations, msgpack.unpackb(raw))
        assert set(record.revoked) == {alice.public_key}
        assert before <= record.revoked[alice.public_key] <= int(time.time())
        assert Revocations.from_record(record).revoked_at(planner.public_key) is None
    finally:
        server.stop()
