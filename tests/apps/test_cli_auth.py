"""``blackboard auth``: init, add, list, show, revoke, render (their output and exit codes),
and a revocation reaching a running dev nats-server."""

from __future__ import annotations

import asyncio
import os
import re
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import nats
import pytest

from blackboard.apps.cli import main
from blackboard.devstack import EmbeddedNats
from blackboard.protocol.subjects import Grants
from blackboard.security.authority import Authority
from blackboard.security.jwt import Credentials

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


def test_show_of_an_undeclared_id_fails(capsys: pytest.CaptureFixture[str], initialized: Path) -> None:
    code, out, err = auth(capsys, initialized, "show", "stranger")
    assert code == 2 and out == ""
    assert "'stranger' is not declared" in err and "blackboard auth add stranger" in err


def test_revoke(capsys: pytest.CaptureFixture[str], initialized: Path) -> None:
    auth(capsys, initialized, "add", "planner")
    code, out, _ = auth(capsys, initialized, "revoke", "planner")
    assert code == 0
    assert "revoked 1 key(s) of 'planner': reload the NATS server's config for it to take effect" in out
    assert not (initialized / "creds" / "planner.creds").exists()
    code, out, _ = auth(capsys, initialized, "revoke", "planner")
    assert code == 1 and "'planner' holds no active credential" in out
    code, out, _ = auth(capsys, initialized, "revoke", "nobody")
    assert code == 1 and "'nobody' holds no active credential" in out


def test_a_stale_pid_file_is_not_signalled(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The dev server's pid file outlives it; its pid may name another process by now."""
    data = tmp_path / "data"
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (data / "nats").mkdir(parents=True)
        (data / "nats" / "nats.pid").write_text(str(bystander.pid))
        run(capsys, "auth", "--data-dir", str(data), "init")
        run(capsys, "auth", "--data-dir", str(data), "add", "planner")
        code, out, _ = run(capsys, "auth", "--data-dir", str(data), "revoke", "planner")
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
            code = await asyncio.to_thread(main, ["auth", "--data-dir", str(data), "revoke", "planner"])
            out = capsys.readouterr().out
            assert code == 0
            assert re.search(r"the dev nats-server \(pid \d+\) reloaded its config", out), out
            await asyncio.wait_for(gone.wait(), 10)
        finally:
            await nc.close()
    finally:
        server.stop()
