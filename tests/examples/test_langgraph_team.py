"""The LangGraph example (examples/langgraph_team) runs to completion on a real nats-server,
under authorization: in process, as a command, and as three processes taking turns.

As for examples/team (tests/apps/test_example_team.py), a command runs with the test
authority, which issues the members (``team-*``) their credentials on first use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from blackboard.devstack import EmbeddedNats
from blackboard.settings import Settings
from examples.langgraph_team import TeamConfig, run_team
from examples.langgraph_team.team import TeamResult, member_id, team_problems
from tests._auth import TestAuth

ROOT = Path(__file__).resolve().parents[2]


def _env(auth: TestAuth) -> dict[str, str]:
    """A shell with no BLACKBOARD_* setting of the test run but the test authority and CA."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")}
    return env | {"BLACKBOARD_SECURITY__AUTHORITY_DIR": str(auth.authority.directory),
                  "BLACKBOARD_NATS__TLS_CA_FILE": str(auth.tls.ca),
                  "BLACKBOARD_DEV__DATA_DIR": str(auth.authority.directory / "no-dev")}


def _cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "examples.langgraph_team", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _assert_history(history: list[Any], team: str) -> None:
    researcher, writer = member_id(team, "researcher"), member_id(team, "writer")
    assert [tuple(h) for h in history] == [(3, "review", researcher), (2, "write", writer),
                                           (1, "research", researcher), (0, "__start__", researcher),
                                           (-1, "input", researcher)]


@pytest.mark.asyncio
async def test_the_team_shares_one_thread_and_one_store(settings: Settings, unique: str) -> None:
    lines: list[str] = []
    team = f"team-{unique}"
    result = await run_team(settings, TeamConfig(team=team, checkpoint_board=f"{unique}-cp", store_board=unique),
                            echo=lines.append)
    assert result.problems == [] and result.ok
    assert result.approved and result.draft.startswith("Release notes: the blackboard keeps")
    _assert_history(result.history, team)
    assert sorted(f["text"] for f in result.facts) == sorted([
        "the blackboard keeps every shared fact on one board", "the blackboard signs each write with the writer's key",
        "the blackboard lets another process resume a graph thread"])
    assert result.notes == {"text": result.draft, "approved_by": member_id(team, "researcher")}
    assert [line.split(maxsplit=2)[1] for line in lines] == ["team"] + ["researcher"] * 2 + ["writer"] * 2 + \
        ["researcher"] * 2
    assert "result: OK" in result.summary()


def test_team_problems_notices_a_step_written_by_the_wrong_member() -> None:
    result = TeamResult(team="team-x", topic="t", draft="d", approved=True,
                        history=[(3, "review", "team-x-writer"), (2, "write", "team-x-writer"),
                                 (1, "research", "team-x-researcher")],
                        facts=[{"text": str(i), "by": "team-x-researcher"} for i in range(3)],
                        notes={"text": "d", "approved_by": "team-x-writer"})
    assert team_problems(result, "team-x") == ["step 3 (review) was written by team-x-writer, not team-x-researcher"]


def test_the_command_runs_the_team_and_exits_zero(nats_server: EmbeddedNats, test_auth: TestAuth,
                                                  unique: str) -> None:
    team = f"team-{unique}"
    proc = _cli("--nats-url", nats_server.url, "--team", team, "--store-board", unique, "--json",
                env=_env(test_auth))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "result: OK" in proc.stdout
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["ok"] and summary["approved"] and summary["facts"] == 3
    _assert_history(summary["history"], team)


def test_each_member_takes_its_turn_in_a_process_of_its_own(nats_server: EmbeddedNats, test_auth: TestAuth,
                                                             unique: str) -> None:
    team, env = f"team-{unique}", _env(test_auth)
    common = ["--nats-url", nats_server.url, "--team", team, "--store-board", unique, "--json"]

    def turn(member: str) -> dict[str, Any]:
        proc = _cli(*common, "--member", member, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return result

    assert turn("writer") == {"member": "writer", "ran": [], "next": "research"}  # not its turn yet
    assert turn("researcher") == {"member": "researcher", "ran": ["__start__", "research"], "next": "write"}
    assert turn("researcher") == {"member": "researcher", "ran": [], "next": "write"}
    assert turn("writer") == {"member": "writer", "ran": ["write"], "next": "review"}
    assert turn("researcher") == {"member": "researcher", "ran": ["review"], "next": None}
    assert turn("writer") == {"member": "writer", "ran": [], "next": None}


def test_the_command_fails_cleanly_without_a_server(test_auth: TestAuth) -> None:
    proc = _cli("--nats-url", "nats://127.0.0.1:1", "--connect-timeout", "1", env=_env(test_auth), timeout=60)
    assert proc.returncode == 1
    assert "error: cannot connect to NATS at nats://127.0.0.1:1" in proc.stderr
    assert "Traceback" not in proc.stderr
