"""The host configurations of ``examples/mcp`` work: the stdio one's command, with its environment
(placeholders replaced by this run's paths), starts the server as its identity; the HTTP ones'
URL and headers (the token put in) reach a running server. Each lists the tools and writes once."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters

from agents_sdk import Agent
from blackboard.apps.mcp.http import HttpServer
from blackboard.settings import Settings
from tests._auth import TestAuth
from tests.apps.mcp.conftest import REPO, call, held, http_session, stdio_process_session

EXAMPLES = REPO / "examples" / "mcp"


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((EXAMPLES / name).read_text(encoding="utf-8"))
    return data


async def _exercise(session: ClientSession, board: str) -> None:
    tools = {t.name for t in (await session.list_tools()).tools}
    assert {"board_get", "board_put", "memory_recall", "message_send", "vote_propose"} <= tools
    await call(session, "board_put", board=board, section="tasks", key="t1", value={"title": "write the docs"})


@pytest.mark.asyncio
async def test_the_stdio_host_configuration_starts_the_server(settings: Settings, test_auth: TestAuth,
                                                              tmp_path: Path, unique: str) -> None:
    entry = _load("claude_desktop_config.json")["mcpServers"]["blackboard"]
    assert entry["command"].endswith("/bin/blackboard")
    args: list[str] = entry["args"]
    assert args[:3] == ["mcp", "--stdio", "--as"]
    agent_id = args[3]
    assert set(entry["env"]) == {"BLACKBOARD_NATS__URL", "BLACKBOARD_NATS__CREDENTIALS_DIR"}
    # What `blackboard dev --agent claude` leaves in .blackboard/auth/creds: the credential and the CA.
    creds = tmp_path / "creds"
    creds.mkdir()
    shutil.copy(test_auth.creds(agent_id), creds / f"{agent_id}.creds")
    shutil.copy(test_auth.tls.ca, creds / "ca.pem")
    env = {"BLACKBOARD_NATS__URL": settings.nats.url, "BLACKBOARD_NATS__CREDENTIALS_DIR": str(creds)}
    command = str(Path(sys.executable).with_name("blackboard"))
    params = StdioServerParameters(command=command, args=args, env=env, cwd=str(tmp_path))
    async with held(lambda: stdio_process_session(params, tmp_path / "stderr.log")) as session:
        await _exercise(session, unique)
    async with Agent.connect(f"reader-{unique}", settings=settings) as reader:
        assert (await reader.board(unique).get("tasks", "t1")).author == agent_id


def _substitute(text: str, values: dict[str, str]) -> str:
    """``${NAME}`` and ``${input:NAME}`` replaced as the hosts do."""
    def one(match: re.Match[str]) -> str:
        return values[match.group(1)]
    return re.sub(r"\$\{(?:input:)?([A-Za-z0-9_-]+)\}", one, text)


@pytest.mark.asyncio
@pytest.mark.parametrize(("name", "servers", "variable"), [
    ("claude_code.mcp.json", "mcpServers", "BLACKBOARD_MCP_TOKEN"),
    ("vscode.mcp.json", "servers", "blackboard-token"),
])
async def test_the_http_host_configurations_reach_the_server(name: str, servers: str, variable: str,
                                                             mcp_http: HttpServer, unique: str) -> None:
    entry = _load(name)[servers]["blackboard"]
    assert entry["type"] == "http"
    assert entry["url"] == "http://127.0.0.1:8765/mcp"  # the default address of `blackboard mcp --http`
    token, _ = mcp_http.tokens.add(f"agent-{unique}")
    headers = {k: _substitute(v, {variable: token}) for k, v in entry["headers"].items()}
    assert headers == {"Authorization": f"Bearer {token}"}
    if name == "vscode.mcp.json":
        assert [i["id"] for i in _load(name)["inputs"]] == [variable]
    async with held(lambda: http_session(mcp_http.url, None, headers=headers)) as session:
        await _exercise(session, unique)
