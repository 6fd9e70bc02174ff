"""The MCP server's HTTP transport: every request authenticated by a bearer token of the token
file, each token acting as its own identity (never a fallback one), loopback by default,
DNS-rebinding protection; the ``blackboard mcp`` command and its bad input; the token file."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from agents_sdk import Agent
from blackboard.apps.mcp.http import HttpServer, running_http
from blackboard.apps.mcp.tokens import TOKEN_PREFIX, TokenFile
from blackboard.protocol.errors import ConfigurationError
from blackboard.settings import Settings
from tests._auth import TestAuth
from tests.apps.mcp.conftest import REPO, McpConnect, blackboard_env, call, held, http_session

_INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "test", "version": "0"}}}
_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def _post(url: str, token: str | None, *, body: Any = None, **headers: str) -> httpx2.Response:
    """One raw POST of an MCP message (an initialize by default)."""
    sent = dict(_HEADERS, **headers)
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    async with httpx2.AsyncClient(timeout=30) as client:
        return await client.post(url, content=json.dumps(body or _INIT), headers=sent)


# ------------------------------------------------------------------- 401, never a fallback identity
@pytest.mark.asyncio
async def test_a_request_without_a_valid_token_is_refused_401(mcp_http: HttpServer, unique: str) -> None:
    token, _ = mcp_http.tokens.add(f"agent-{unique}")
    unknown = TOKEN_PREFIX + "A" * 43  # well formed, never issued
    for presented in (None, unknown, "not-a-token", token[:-1], token + "x", token.upper()):
        response = await _post(mcp_http.url, presented)
        assert response.status_code == 401, (presented, response.status_code, response.text)
        assert response.headers["www-authenticate"].startswith("Bearer")
    # Another scheme than Bearer is no credential either.
    response = await _post(mcp_http.url, None, Authorization=f"Basic {token}")
    assert response.status_code == 401
    assert (await _post(mcp_http.url, token)).status_code == 200
    assert mcp_http.agents.connected == []  # nothing connected for the refused requests (nor yet for tools)


@pytest.mark.asyncio
async def test_a_revoked_token_is_refused_from_the_next_request(mcp_http: HttpServer, unique: str) -> None:
    agent_id = f"agent-{unique}"
    token, record = mcp_http.tokens.add(agent_id)
    kept, _ = mcp_http.tokens.add(agent_id)
    async with held(lambda: http_session(mcp_http.url, token)) as session:
        await call(session, "board_put", board=unique, section="s", key="k", value=1)
        assert mcp_http.tokens.revoke(token_id=record.id[:6]) == [record]
        response = await _post(mcp_http.url, token)
        assert response.status_code == 401
        # The open session of the revoked token is refused too: each request is authenticated.
        with pytest.raises(MCPError):  # the client's error for the 401
            await asyncio.wait_for(session.call_tool("board_get", {"board": unique, "section": "s", "key": "k"}), 30)
    assert (await _post(mcp_http.url, kept)).status_code == 200  # the identity's other token still serves


@pytest.mark.asyncio
async def test_two_tokens_act_as_two_identities(mcp_http_connect: McpConnect, mcp_http: HttpServer,
                                                settings: Settings, unique: str) -> None:
    alice, bob = f"alice-{unique}", f"bob-{unique}"
    async with mcp_http_connect(alice) as a, mcp_http_connect(bob) as b:
        await call(a, "board_put", board=unique, section="notes", key="from-a", value={"by": "a"})
        await call(b, "board_put", board=unique, section="notes", key="from-b", value={"by": "b"})
        seen_by_b = await call(b, "board_get", board=unique, section="notes", key="from-a")
        assert seen_by_b["author"] == alice
    assert mcp_http.agents.connected == sorted([alice, bob])
    # Signed as their own by each identity's credential: a third agent verifies the signatures.
    async with Agent.connect(f"reader-{unique}", settings=settings) as reader:
        board = reader.board(unique)
        for key, author in (("from-a", alice), ("from-b", bob)):
            entry = await board.get("notes", key)
            assert (entry.author, entry.verdict.value) == (author, "verified")


@pytest.mark.asyncio
async def test_an_identitys_refusal_is_not_bypassed(mcp_http_connect: McpConnect, unique: str) -> None:
    """A reader's token reads but cannot write: the server refuses that identity's publish, not
    the MCP layer, and no other identity of the server (a member) writes in its place."""
    async with mcp_http_connect(f"agent-{unique}") as member, mcp_http_connect(f"reader-{unique}") as reader:
        await call(member, "board_put", board=unique, section="s", key="k", value="member's")
        result = await reader.call_tool("board_put", {"board": unique, "section": "s", "key": "k", "value": "reader's"})
        assert result.is_error
        assert result.structured_content is not None
        assert result.structured_content["error"] == "PermissionDeniedError", result.structured_content
        got = await call(reader, "board_get", board=unique, section="s", key="k")
        assert (got["value"], got["author"]) == ("member's", f"agent-{unique}")
    async with mcp_http_connect(f"outsider-{unique}") as outsider:
        result = await outsider.call_tool("board_get", {"board": unique, "section": "s", "key": "k"})
        assert result.is_error


@pytest.mark.asyncio
async def test_a_request_without_an_identity_gets_no_agent(settings: Settings) -> None:
    """The HTTP source answers a request its bearer token did not authenticate with an error,
    never with some agent (over HTTP every request is authenticated first; this is the second lock)."""
    from types import SimpleNamespace

    from starlette.requests import Request

    from blackboard.apps.mcp.http import TokenAgents
    from blackboard.protocol.errors import AuthenticationError

    agents = TokenAgents(settings)
    anonymous = Request({"type": "http", "method": "POST", "path": "/mcp", "headers": []})
    for request in (None, anonymous):
        with pytest.raises(AuthenticationError, match="no authenticated identity"):
            await agents.agent_for(SimpleNamespace(request=request))  # type: ignore[arg-type]
    assert agents.connected == []
    await agents.aclose()


@pytest.mark.asyncio
async def test_a_session_serves_only_the_identity_that_opened_it(mcp_http: HttpServer, unique: str) -> None:
    token_a, _ = mcp_http.tokens.add(f"alice-{unique}")
    token_b, _ = mcp_http.tokens.add(f"bob-{unique}")
    opened = await _post(mcp_http.url, token_a)
    assert opened.status_code == 200
    session_id = opened.headers["mcp-session-id"]
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    hijack = await _post(mcp_http.url, token_b, body=listing, **{"Mcp-Session-Id": session_id,
                                                                 "Mcp-Protocol-Version": "2025-06-18"})
    assert hijack.status_code == 404
    anonymous = await _post(mcp_http.url, None, body=listing, **{"Mcp-Session-Id": session_id})
    assert anonymous.status_code == 401


# ------------------------------------------------------------------- where it listens
@pytest.mark.asyncio
async def test_it_listens_on_loopback_by_default(settings: Settings, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    TokenFile(tokens).ensure()
    async with running_http(settings, tokens=tokens, port=0) as server:
        assert server.host == "127.0.0.1"
        assert server.url == f"http://127.0.0.1:{server.port}/mcp"


@pytest.mark.asyncio
async def test_dns_rebinding_is_refused(mcp_http: HttpServer, unique: str) -> None:
    token, _ = mcp_http.tokens.add(f"agent-{unique}")
    assert (await _post(mcp_http.url, token, Host="evil.example")).status_code == 421
    assert (await _post(mcp_http.url, token, Origin="http://evil.example")).status_code == 403
    assert (await _post(mcp_http.url, token, Host=f"localhost:{mcp_http.port}",
                        Origin=f"http://localhost:{mcp_http.port}")).status_code == 200


@pytest.mark.asyncio
async def test_another_address_needs_tls(settings: Settings, tmp_path: Path, test_auth: TestAuth) -> None:
    tokens = tmp_path / "tokens.json"
    TokenFile(tokens).ensure()
    with pytest.raises(ConfigurationError, match="without TLS"):
        async with running_http(settings, tokens=tokens, host="0.0.0.0", port=0):
            pass
    with pytest.raises(ConfigurationError, match="--allowed-host"):
        async with running_http(settings, tokens=tokens, host="0.0.0.0", port=0,
                                tls_cert=test_auth.tls.cert, tls_key=test_auth.tls.key):
            pass
    with pytest.raises(ConfigurationError, match="both"):
        async with running_http(settings, tokens=tokens, port=0, tls_cert=test_auth.tls.cert):
            pass


@pytest.mark.asyncio
async def test_it_serves_tls(settings: Settings, tmp_path: Path, test_auth: TestAuth, unique: str) -> None:
    tokens = tmp_path / "tokens.json"
    token, _ = TokenFile(tokens).add(f"agent-{unique}")
    async with running_http(settings, tokens=tokens, port=0, tls_cert=test_auth.tls.cert,
                            tls_key=test_auth.tls.key) as server:
        assert server.url.startswith("https://127.0.0.1:")
        trust = ssl.create_default_context(cafile=str(test_auth.tls.ca))
        async with httpx2.AsyncClient(verify=trust, timeout=30) as client:
            sent = dict(_HEADERS, Authorization=f"Bearer {token}")
            response = await client.post(server.url, content=json.dumps(_INIT), headers=sent)
            assert response.status_code == 200
            assert (await client.post(server.url, content=json.dumps(_INIT), headers=_HEADERS)).status_code == 401


@pytest.mark.asyncio
async def test_a_missing_token_file_is_told(settings: Settings, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"no MCP token file at .*token add"):
        async with running_http(settings, tokens=tmp_path / "none.json", port=0):
            pass


# ------------------------------------------------------------------- the token file
def test_the_token_file_keeps_only_hashes(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "tokens.json"
    tokens = TokenFile(path)
    token, record = tokens.add("planner")
    assert token.startswith(TOKEN_PREFIX) and len(token) == len(TOKEN_PREFIX) + 43
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert token not in path.read_text()
    assert tokens.identify(token) == "planner"
    other, _ = tokens.add("coder")
    assert TokenFile(path).identify(other) == "coder"  # read again from the file
    assert tokens.identify(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    assert tokens.identify("") is None
    assert [r.agent_id for r in tokens.records()] == ["planner", "coder"]
    assert tokens.revoke(agent_id="planner") == [record]
    assert tokens.identify(token) is None and tokens.identify(other) == "coder"
    assert tokens.revoke(agent_id="planner") == []


def test_a_token_file_others_may_write_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    token, _ = TokenFile(path).add("planner")
    os.chmod(path, 0o620)
    with pytest.raises(ConfigurationError, match="may be written by others"):
        TokenFile(path).identify(token)


def test_a_token_file_that_is_not_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    for text in ("not json", '{"version": 2, "tokens": []}',
                 '{"version": 1, "tokens": [{"id": "x", "agent": "a b", "sha256": "' + "0" * 64 + '"}]}'):
        path.write_text(text)
        os.chmod(path, 0o600)
        with pytest.raises(ConfigurationError, match=str(path)):
            TokenFile(path).records()


# ------------------------------------------------------------------- the command
def _blackboard(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "blackboard", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _user_env() -> dict[str, str]:
    """A user's shell: no BLACKBOARD_* setting, so no credential is found for anyone."""
    return {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")}


@pytest.mark.parametrize(("args", "message"), [
    ([], "give --stdio --as AGENT, --http, or a token command"),
    (["--stdio"], "--stdio needs --as AGENT"),
    (["--stdio", "--http"], "not allowed with argument"),
    (["--stdio", "--as", "bad id!"], "agent id (--as) must be"),
    (["--stdio", "--as", "a", "--port", "1"], "--port is an option of --http"),
    (["--http", "--as", "a"], "--as is for --stdio"),
    (["--http", "--tokens", "missing.json"], "no MCP token file at missing.json"),
    (["token", "revoke"], "revoke takes AGENT (all its tokens) or --id"),
    (["token", "add", "bad id!"], "agent id must be"),
    (["token", "list", "--tokens", "missing.json"], "no MCP token file at missing.json"),
])
def test_the_command_refuses_bad_input(args: list[str], message: str, tmp_path: Path) -> None:
    done = _blackboard(["mcp", *args], _user_env(), tmp_path)
    assert done.returncode == 2, done
    assert message in done.stderr, done.stderr
    assert done.stdout == ""


def test_the_command_refuses_a_public_address_without_tls(tmp_path: Path) -> None:
    env = _user_env()
    assert _blackboard(["mcp", "token", "add", "planner", "--no-check", "--tokens", "t.json"], env, tmp_path).returncode == 0
    done = _blackboard(["mcp", "--http", "--host", "0.0.0.0", "--tokens", "t.json"], env, tmp_path)
    assert done.returncode == 2
    assert "refusing to serve MCP on '0.0.0.0' without TLS" in done.stderr


def test_an_unknown_identity_is_told(tmp_path: Path) -> None:
    env = _user_env()
    done = _blackboard(["mcp", "--stdio", "--as", "nobody"], env, tmp_path)
    assert done.returncode == 1
    assert "no credential for 'nobody'" in done.stderr
    assert done.stdout == ""  # stdout is the MCP channel: nothing else is ever written there
    done = _blackboard(["mcp", "token", "add", "nobody"], env, tmp_path)
    assert done.returncode == 1 and "no credential for 'nobody'" in done.stderr
    assert not (tmp_path / ".blackboard" / "mcp-tokens.json").exists()


def test_the_help_explains(tmp_path: Path) -> None:
    done = _blackboard(["mcp", "--help"], _user_env(), tmp_path)
    assert done.returncode == 0
    for words in ("--stdio --as AGENT", "Authorization: Bearer <token>", "token add", "401", "--tls-cert"):
        assert words in done.stdout
    listed = _blackboard(["--help"], _user_env(), tmp_path)
    assert "mcp" in listed.stdout


def test_token_commands(settings: Settings, tmp_path: Path, unique: str) -> None:
    env = blackboard_env(settings)
    agent = f"agent-{unique}"
    added = _blackboard(["mcp", "token", "add", agent], env, tmp_path)
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip()
    assert token.startswith(TOKEN_PREFIX) and "shown once" in added.stderr
    path = tmp_path / ".blackboard" / "mcp-tokens.json"
    assert TokenFile(path).identify(token) == agent
    listed = _blackboard(["mcp", "token", "list"], env, tmp_path)
    assert agent in listed.stdout and token not in listed.stdout
    token_id = TokenFile(path).records()[0].id
    revoked = _blackboard(["mcp", "token", "revoke", "--id", token_id], env, tmp_path)
    assert revoked.returncode == 0 and f"revoked token {token_id}" in revoked.stdout
    again = _blackboard(["mcp", "token", "revoke", agent], env, tmp_path)
    assert again.returncode == 1 and "no token of agent" in again.stdout


@pytest.mark.asyncio
async def test_the_http_command_serves_until_sigterm(settings: Settings, tmp_path: Path, unique: str) -> None:
    tokens = tmp_path / "tokens.json"
    token, _ = TokenFile(tokens).add(f"agent-{unique}")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "blackboard", "mcp", "--http", "--port", "0", "--tokens", str(tokens),
        env=blackboard_env(settings), cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        if not line.startswith("blackboard mcp: serving MCP on http://127.0.0.1:"):
            pytest.fail(f"no start line: {line!r}\n{(await proc.stderr.read()).decode()}")
        url = line.split()[-1]
        async with held(lambda: http_session(url, token)) as session:
            names = {t.name for t in (await session.list_tools()).tools}
            assert {"board_get", "board_put"} <= names
            await call(session, "board_put", board=unique, section="s", key="k", value=[1, 2])
        assert (await _post(url, None)).status_code == 401
    finally:
        if proc.returncode is None:
            proc.terminate()
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert "blackboard mcp: stopped" in out.decode()


@pytest.mark.asyncio
async def test_writes_are_signed_as_the_sessions_identity(mcp_session: ClientSession, mcp_agent_id: str,
                                                          settings: Settings, unique: str) -> None:
    """Over either transport, a tool's write is the session identity's, signed with its key."""
    put = await call(mcp_session, "board_put", board=unique, section="s", key="k", value={"n": 1})
    async with Agent.connect(f"reader-{unique}", settings=settings) as reader:
        entry = await reader.board(unique).get("s", "k")
    assert (entry.revision, entry.author, entry.verdict.value) == (put["revision"], mcp_agent_id, "verified")
