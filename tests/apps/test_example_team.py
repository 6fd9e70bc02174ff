"""The example team (examples/team) runs to completion on a real nats-server, under authorization.

The suite's server runs with authorization and TLS: the team's agents are
issued their credentials by the test authority on first use, a system service
(tests/conftest.py) creates their inboxes, and a vote committer (the worker's
part that alone may commit outcomes on a secured bus) runs for the team's
board. One test runs the team against a real ``blackboard dev`` with nothing
but its data directory, as the README promises.

With no LLM configured it uses the scripted policy; the LLM policy is run
against the local OpenAI-compatible fake. The pure parts (scripted rules,
answer parsing, the task-history check) have unit tests here too.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from blackboard.devstack import EmbeddedNats
from blackboard.settings import LLMSettings, Settings
from examples.team import TeamConfig, run_team
from examples.team.policy import (
    OpenTask,
    llm_configured,
    parse_json_answer,
    scripted_choice,
    scripted_draft,
    scripted_plan,
    scripted_vote,
)
from examples.team.team import task_problems
from tests._auth import TestAuth
from tests._committer import running_committer
from tests.fakes.openai_server import OpenAIFake

ROOT = Path(__file__).resolve().parents[2]


def _env(**settings: str | Path) -> dict[str, str]:
    """A shell with no BLACKBOARD_* setting of the test run but these (no LLM: scripted)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")}
    return env | {f"BLACKBOARD_{name}": str(value) for name, value in settings.items()}


def _test_authority_env(auth: TestAuth) -> dict[str, str]:
    """A team process that holds the test authority (it issues the team's ids their
    credentials on first use) and trusts the test CA; no dev data dir of this checkout."""
    return _env(SECURITY__AUTHORITY_DIR=auth.authority.directory, NATS__TLS_CA_FILE=auth.tls.ca,
                DEV__DATA_DIR=auth.authority.directory / "no-dev")


def _team_cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "examples.team", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _assert_cli_succeeded(proc: subprocess.CompletedProcess[str], n_tasks: int) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "result: OK" in proc.stdout
    summary: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["ok"] is True
    assert summary["policy"] == "scripted"
    assert summary["outcome"] == "accepted"
    assert sorted(t for ids in summary["done_by"].values() for t in ids) == [f"t{i + 1}" for i in range(n_tasks)]
    return summary


def _no_llm(settings: Settings) -> Settings:
    return settings.model_copy(update={"llm": LLMSettings()})


def _assert_team_succeeded(result: Any, n_tasks: int) -> None:
    assert result.problems == []
    assert result.ok
    # every task done exactly once: one open -> claimed -> done history each, one completion each
    assert sorted(result.tasks) == [f"t{i + 1}" for i in range(n_tasks)]
    assert all(t["state"] == "done" and t["result"] for t in result.tasks.values())
    completions = [t for ids in result.done_by.values() for t in ids]
    assert sorted(completions) == sorted(result.tasks)
    assert len(set(completions)) == len(completions)
    for actor, ids in result.done_by.items():
        for task_id in ids:
            assert result.tasks[task_id]["assignee"].endswith(actor)
    # the vote committed the accepted draft
    assert result.outcome_status == "accepted"
    assert result.proposal_id
    assert isinstance(result.accepted, str) and result.accepted
    assert result.committed == result.accepted
    # every member recorded steps and built prompts
    assert set(result.memory_steps) == {"planner", "actor-1", "actor-2"}
    assert all(n >= 4 for n in result.memory_steps.values())
    assert all(n >= 1 and biggest > 0 for n, biggest in result.prompts.values())


def _assert_transcript_sane(lines: list[str], n_tasks: int) -> None:
    text = "\n".join(lines)
    assert "plan-ready" in text
    assert len(re.findall(r"planner\s+t\d+ reported done by actor-\d", text)) == n_tasks
    claims = re.findall(r"actor-\d\s+claimed (t\d+)", text)
    assert sorted(claims) == sorted(f"t{i + 1}" for i in range(n_tasks))
    assert re.search(r"planner\s+proposal \S+ accepted", text)
    assert any(re.search(r"planner\s+team-done", line) for line in lines)
    times = [float(line.split("s", 1)[0]) for line in lines]
    assert times == sorted(times)


# ------------------------------------------------------------------ end to end
@pytest.mark.asyncio
async def test_team_completes_with_scripted_policy(settings: Settings, unique: str) -> None:
    lines: list[str] = []
    async with running_committer(settings, board=unique):
        result = await run_team(_no_llm(settings), TeamConfig(team=unique, tasks=5, timeout=90, step_timeout=30),
                                echo=lines.append)
    assert result.policy == "scripted"
    _assert_team_succeeded(result, 5)
    _assert_transcript_sane(lines, 5)
    assert result.transcript == lines


@pytest.mark.asyncio
async def test_team_cli_runs_and_exits_zero(nats_server: EmbeddedNats, settings: Settings, test_auth: TestAuth,
                                            unique: str) -> None:
    # The team's board is its name (--team): the worker's committer commits its vote.
    async with running_committer(settings, board=unique):
        proc = await asyncio.to_thread(
            _team_cli, "--nats-url", nats_server.url, "--team", unique, "--tasks", "3", "--json", "--timeout", "90",
            env=_test_authority_env(test_auth))
    _assert_cli_succeeded(proc, 3)


def test_team_cli_fails_cleanly_without_server(test_auth: TestAuth) -> None:
    proc = _team_cli("--nats-url", "nats://127.0.0.1:1", "--connect-timeout", "1",
                     env=_test_authority_env(test_auth), timeout=60)
    assert proc.returncode == 1
    assert "error: cannot connect to NATS at nats://127.0.0.1:1" in proc.stderr


def test_team_cli_without_any_credential_says_where_it_looked(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    # Not run where `blackboard dev` keeps its data, no credential anywhere: one clear error.
    proc = _team_cli("--nats-url", nats_server.url, "--team", "team-lost", "--connect-timeout", "2",
                     env=_env(DEV__DATA_DIR=tmp_path / ".blackboard"), timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no credential for 'team-lost-planner'" in proc.stderr
    assert "hint:" in proc.stderr and "BLACKBOARD_DEV__DATA_DIR" in proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------ against `blackboard dev`
_DEV_READY = "worker        running"


@pytest.mark.slow
def test_team_runs_against_blackboard_dev_with_no_manual_step() -> None:
    # The README's promise: with `scripts/dev` running, `python -m examples.team` from the
    # project directory just works, under authorization. The only setting is where the dev
    # stack keeps its data (the default is ./.blackboard of the directory it runs in): its
    # authority issues the team-* ids their credentials on first use, the dev worker creates
    # their inboxes and commits the vote.
    project = Path(tempfile.mkdtemp(prefix="bb-team-dev-"))
    os.chmod(project, 0o755)  # the embedded PostgreSQL may run as another user
    data_dir = project / ".blackboard"
    dev = subprocess.Popen(
        [sys.executable, "-m", "blackboard", "dev", "--data-dir", str(data_dir), "--nats-port", "0", "--pg-port",
         "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=_env(EMBEDDING__PROVIDER="local"))
    lines: list[str] = []
    try:
        assert dev.stdout is not None
        for line in dev.stdout:
            lines.append(line.rstrip())
            if _DEV_READY in line or "error" in line.lower():
                break
        text = "\n".join(lines)
        assert _DEV_READY in text and "authorization on, TLS" in text, text
        url = re.search(r"export BLACKBOARD_NATS__URL=(\S+)", text)
        assert url, text
        proc = _team_cli("--nats-url", url.group(1), "--tasks", "3", "--json", "--timeout", "90",
                         env=_env(DEV__DATA_DIR=data_dir))
        summary = _assert_cli_succeeded(proc, 3)
        assert summary["team"].startswith("team-")
        # Issued on first use by the dev authority, into the dev credentials directory.
        for member in ("planner", "actor-1", "actor-2"):
            assert (data_dir / "auth" / "creds" / f"{summary['team']}-{member}.creds").is_file()
    finally:
        dev.send_signal(signal.SIGINT)
        out, _ = dev.communicate(timeout=60)
        shutil.rmtree(project, ignore_errors=True)
    assert dev.returncode == 0, "\n".join(lines) + "\n" + out


def _model(messages: list[dict[str, Any]]) -> str:
    """A stand-in chat model: answers each decision in JSON, differently from the scripted rules."""
    task = next(str(m["content"]) for m in reversed(messages[:-1]) if m["role"] == "user")
    answer_format = str(messages[-1]["content"])
    decision = task.split("\n", 1)[0].removeprefix("DECISION:").strip()
    if decision == "plan":
        n = int(re.search(r"exactly (\d+) titles", answer_format).group(1))  # type: ignore[union-attr]
        return json.dumps({"tasks": [f"Model task number {i + 1}" for i in range(n)]})
    if decision == "choose_task":
        open_ids = re.findall(r"^(t\d+): ", task, re.MULTILINE)
        return "```json\n" + json.dumps({"task": max(open_ids, key=lambda t: int(t[1:]))}) + "\n```"
    if decision == "work":
        task_id = re.search(r"Do task (t\d+)", task).group(1)  # type: ignore[union-attr]
        return json.dumps({"result": f"model result for {task_id}"})
    if decision == "draft":
        return "I cannot do that."  # unusable: the policy falls back to the rules
    if decision == "vote":
        return json.dumps({"choice": 0, "reason": "the first draft reads best"})
    return "?"


@pytest.mark.asyncio
async def test_team_completes_with_llm_policy(settings: Settings, unique: str, openai_fake: OpenAIFake) -> None:
    openai_fake.chat = _model
    llm = LLMSettings(base_url=openai_fake.base_url, api_key="test-key", model="fake-model")
    cfg = settings.model_copy(update={"llm": llm})
    assert llm_configured(cfg.llm)
    async with running_committer(settings, board=unique):
        result = await run_team(cfg, TeamConfig(team=unique, tasks=3, timeout=90, policy="auto"), echo=None)
    assert result.policy == "llm"
    _assert_team_succeeded(result, 3)
    assert [t["title"] for _, t in sorted(result.tasks.items())] == [f"Model task number {i}" for i in (1, 2, 3)]
    assert {t["result"] for t in result.tasks.values()} == {"model result for t1", "model result for t2",
                                                            "model result for t3"}
    chats = openai_fake.requests_to("/v1/chat/completions")
    # 1 plan + (choose + work) per task (+ a choose per lost race and a final choose per actor
    # only when tasks are open) + 2 drafts + 3 votes
    assert len(chats) >= 1 + 2 * 3 + 2 + 2
    assert all(r.body["model"] == "fake-model" for r in chats)
    # the model picks the highest open id, so the first claim is the last task
    first_claim = next(line for line in result.transcript if " claimed " in line)
    assert "claimed t3" in first_claim


def test_llm_configured_needs_a_key_or_a_base_url() -> None:
    assert not llm_configured(LLMSettings())
    assert llm_configured(LLMSettings(base_url="http://127.0.0.1:9/v1"))
    assert llm_configured(LLMSettings(api_key="k"))


# ------------------------------------------------------------------ pure parts
def test_scripted_plan_is_deterministic_and_numbered() -> None:
    plan = scripted_plan("notes", 7)
    assert [t.id for t in plan] == [f"t{i}" for i in range(1, 8)]
    assert plan == scripted_plan("notes", 7)
    assert all("notes" in t.title for t in plan)
    with pytest.raises(ValueError):
        scripted_plan("notes", 0)


def test_scripted_choice_takes_the_lowest_open_id() -> None:
    tasks = [OpenTask("t10", "x", 5), OpenTask("t2", "y", 3), OpenTask("t9", "z", 4)]
    assert scripted_choice(tasks) == "t2"
    assert scripted_choice([]) is None


def test_scripted_vote_prefers_the_shortest_covering_candidate_and_lowest_index_on_ties() -> None:
    ids = ["t1", "t2"]
    assert scripted_vote(ids, ["t1 t2 long text", "t1 only", "t1 t2"]).index == 2
    assert scripted_vote(ids, ["t1 t2", "t2 t1"]).index == 0
    assert scripted_vote(ids, ["none", "no"]).index == 1  # nobody covers: the shortest of all


def test_scripted_drafts_differ_by_style_and_mention_every_task() -> None:
    results = {"t2": "B.", "t1": "A.", "t10": "J."}
    bullets, paragraph = scripted_draft("bullets", results), scripted_draft("paragraph", results)
    assert bullets != paragraph
    for text in (bullets, paragraph):
        assert "t1, t2, t10" in text
    assert bullets.index("A.") < bullets.index("B.") < bullets.index("J.")


def test_parse_json_answer_finds_the_object() -> None:
    assert parse_json_answer('```json\n{"task": "t1"}\n```') == {"task": "t1"}
    assert parse_json_answer('Sure! {"choice": 1, "reason": "ok"} Hope it helps.') == {"choice": 1, "reason": "ok"}
    assert parse_json_answer("no json here") is None
    assert parse_json_answer("{not json}") is None
    assert parse_json_answer(None) is None


def test_task_problems_accepts_one_clean_history_and_flags_double_work() -> None:
    good = [{"state": "open"}, {"state": "claimed", "assignee": "a"}, {"state": "done", "assignee": "a", "result": "r"}]
    assert task_problems({"t1": good}) == []
    twice = [*good[:2], {"state": "claimed", "assignee": "b"}, good[2]]
    assert task_problems({"t1": twice})
    swapped = [good[0], good[1], {"state": "done", "assignee": "b", "result": "r"}]
    assert task_problems({"t1": swapped})
    assert task_problems({"t1": [good[0], None]})
