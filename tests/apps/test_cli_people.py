"""The commands for people (issue 21): get, put, ls, history, watch, search, recall, send, inbox,
status, run in-process through ``main(argv)`` against the session's servers (with authorization
and TLS), their ``--json`` output parsed, their tables read, and bad input told as one line on
stderr with its exit code (docs/cli.md). A few run as ``python -m blackboard`` processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents_sdk import Agent
from blackboard.apps.cli import main
from blackboard.devstack import EmbeddedNats, EmbeddedPostgres
from blackboard.settings import Settings
from tests._auth import TestAuth
from tests._worker_helpers import StartWorker
from tests.conftest import make_settings

Run = tuple[int, str, str]


@pytest.fixture
def env(nats_server: EmbeddedNats, test_auth: TestAuth, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The CLI's environment: the session's server, the test CA and identity authority (agents
    are issued their credential on first use), no other BLACKBOARD_* setting, no ./.blackboard."""
    for name in list(os.environ):
        if name.startswith("BLACKBOARD_"):
            monkeypatch.delenv(name)
    values = {"BLACKBOARD_NATS__URL": nats_server.url, "BLACKBOARD_NATS__TLS_CA_FILE": str(test_auth.tls.ca),
              "BLACKBOARD_SECURITY__AUTHORITY_DIR": str(test_auth.authority.directory),
              "BLACKBOARD_SECURITY__POLICY_FILE": str(test_auth.authority.policy_file),
              "BLACKBOARD_NATS__WRITE_TIMEOUT": "10", "BLACKBOARD_DEV__DATA_DIR": str(tmp_path / "no-dev")}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    return values


@pytest.fixture
def agent_settings(env: dict[str, str]) -> Settings:
    """Settings of the tests' own SDK agents (not the worker's nats.creds_file)."""
    settings = make_settings(env["BLACKBOARD_NATS__URL"])
    return settings.model_copy(update={"nats": settings.nats.model_copy(update={"creds_file": None})})


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], env: dict[str, str]) -> Iterator[Any]:
    """``cli(*argv) -> (exit code, stdout, stderr)``: ``main(argv)`` in this process."""
    def run(*argv: str) -> Run:
        capsys.readouterr()
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    yield run


async def acli(cli: Any, *argv: str) -> Run:
    """``cli`` from an async test: ``main`` runs its own event loop, in a thread."""
    result: Run = await asyncio.to_thread(cli, *argv)
    return result


def one_error(result: Run, command: str, code: int) -> str:
    """The one line a failed command prints on stderr (no traceback), its exit code checked."""
    status, out, err = result
    assert "Traceback" not in out + err, err
    assert status == code, (status, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"blackboard {command}: error: "), err
    return lines[0]


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


# ------------------------------------------------------------------ put / get
def test_put_then_get_json_and_text(cli: Any, unique: str) -> None:
    code, out, err = cli("put", unique, "tasks", "t1", '{"title": "write docs", "n": 3}', "--as", "alice",
                         "--tags", "docs, urgent", "--metadata", '{"confidence": 0.9}', "--json")
    assert code == 0, err
    written = json.loads(out)
    assert written["board"] == unique and written["key"] == "t1" and written["revision"] > 0

    code, out, err = cli("get", unique, "tasks", "t1", "--as", "bob", "--json")
    assert code == 0, err
    entry = json.loads(out)
    assert entry["value"] == {"title": "write docs", "n": 3}
    assert entry["revision"] == written["revision"] and entry["author"] == "alice"
    assert entry["tags"] == ["docs", "urgent"] and entry["metadata"] == {"confidence": 0.9}
    assert entry["verdict"] == "verified" and entry["operation"] == "put"
    assert entry["stored_at"].endswith("+00:00")

    code, out, _ = cli("get", unique, "tasks", "t1", "--as", "bob")
    assert code == 0
    assert f"{unique}/tasks/t1" in out and "alice" in out and "docs, urgent" in out
    assert '"title": "write docs"' in out  # the value, indented JSON


def test_put_takes_json_or_a_plain_string_or_stdin(cli: Any, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    cases = {"n": ("42", 42), "s": ("hello world", "hello world"), "q": ('"42"', "42"), "b": ("true", True),
             "l": ("[1, 2]", [1, 2]), "nan": ("NaN", "NaN")}
    for key, (given, expected) in cases.items():
        assert cli("put", unique, "v", key, given, "--as", "alice")[0] == 0
        assert json.loads(cli("get", unique, "v", key, "--as", "alice", "--json")[1])["value"] == expected
    assert cli("put", unique, "v", "forced", "42", "--string", "--as", "alice")[0] == 0
    assert json.loads(cli("get", unique, "v", "forced", "--as", "alice", "--json")[1])["value"] == "42"
    monkeypatch.setattr("sys.stdin", io.StringIO('{"from": "stdin"}\n'))
    code, out, _ = cli("put", unique, "v", "in", "-", "--as", "alice")
    assert code == 0 and out.startswith(f"{unique}/v/in: revision ")
    assert json.loads(cli("get", unique, "v", "in", "--as", "alice", "--json")[1])["value"] == {"from": "stdin"}


def test_put_with_expect_revision_is_a_compare_and_set(cli: Any, unique: str) -> None:
    code, out, _ = cli("put", unique, "locks", "l", '"mine"', "--expect-revision", "0", "--as", "alice", "--json")
    assert code == 0
    first = json.loads(out)["revision"]
    line = one_error(cli("put", unique, "locks", "l", '"yours"', "--expect-revision", "0", "--as", "bob"), "put", 4)
    assert "conflict" in line and str(first) in line
    code, out, _ = cli("put", unique, "locks", "l", '"next"', "--expect-revision", str(first), "--as", "bob",
                       "--json")
    assert code == 0
    second = json.loads(out)["revision"]
    line = one_error(cli("put", unique, "locks", "l", '"late"', "--expect-revision", str(first), "--as", "carol"),
                     "put", 4)
    assert f"current revision is {second}" in line
    assert json.loads(cli("get", unique, "locks", "l", "--as", "alice", "--json")[1])["value"] == "next"


def test_delete_unconditionally_or_at_a_revision(cli: Any, unique: str) -> None:
    first = json.loads(cli("put", unique, "s", "k", "1", "--as", "alice", "--json")[1])["revision"]
    second = json.loads(cli("put", unique, "s", "k", "2", "--as", "alice", "--json")[1])["revision"]
    line = one_error(cli("delete", unique, "s", "k", "--expect-revision", str(first), "--as", "bob"), "delete", 4)
    assert f"current revision is {second}" in line
    code, out, _ = cli("delete", unique, "s", "k", "--expect-revision", str(second), "--as", "bob", "--json")
    assert code == 0
    done = json.loads(out)
    assert done["operation"] == "delete" and done["revision"] > second
    one_error(cli("get", unique, "s", "k", "--as", "alice"), "get", 3)
    gone = one_error(cli("delete", unique, "s", "k", "--as", "alice"), "delete", 3)  # nothing left to delete
    assert f"was deleted at revision {done['revision']}" in gone
    cli("put", unique, "s", "k2", "3", "--as", "alice")
    code, out, _ = cli("delete", unique, "s", "k2", "--as", "alice")
    assert code == 0 and out.startswith(f"{unique}/s/k2: deleted at revision ")
    assert cli("ls", unique, "s", "--as", "alice")[0] == 3  # no live key left
    one_error(cli("delete", unique, "s", "k2", "--expect-revision", "0", "--as", "alice"), "delete", 2)


def test_get_of_an_old_revision_and_of_what_is_not_there(cli: Any, unique: str) -> None:
    first = json.loads(cli("put", unique, "s", "k", "1", "--as", "alice", "--json")[1])["revision"]
    cli("put", unique, "s", "k", "2", "--as", "alice")
    old = json.loads(cli("get", unique, "s", "k", "--revision", str(first), "--as", "alice", "--json")[1])
    assert old["value"] == 1 and old["revision"] == first
    one_error(cli("get", unique, "s", "missing", "--as", "alice"), "get", 3)
    one_error(cli("get", f"{unique}-none", "s", "k", "--as", "alice"), "get", 3)


def test_bad_input_is_one_line_and_exit_2(cli: Any, unique: str) -> None:
    line = one_error(cli("put", unique, "s", "k", "1", "--metadata", "{not json", "--as", "alice"), "put", 2)
    assert "--metadata" in line
    line = one_error(cli("put", unique, "s", "k", "1", "--metadata", "[1]", "--as", "alice"), "put", 2)
    assert "JSON object" in line
    one_error(cli("put", unique, "bad section!", "k", "1", "--as", "alice"), "put", 2)
    one_error(cli("get", unique, "s", "k", "--as", "not a name"), "get", 2)
    one_error(cli("put", unique, "s", "k", "1", "--expect-revision", "-1", "--as", "alice"), "put", 2)
    one_error(cli("put", unique, "s", "k", "1", "--ttl", "0.1", "--as", "alice"), "put", 2)
    line = one_error(cli("ls", unique, "--where", '{"metadata.x": {"$near": 1}}', "--as", "alice"), "ls", 2)
    assert "$near" in line


def test_no_identity_and_no_credential_are_told(cli: Any, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    line = one_error(cli("get", unique, "s", "k"), "get", 2)
    assert "--as" in line and "BLACKBOARD_CLI__AGENT" in line
    monkeypatch.setenv("BLACKBOARD_CLI__AGENT", "alice")  # the documented default identity
    one_error(cli("get", unique, "s", "k"), "get", 3)  # connected as alice: not found
    monkeypatch.delenv("BLACKBOARD_SECURITY__AUTHORITY_DIR")  # no authority to issue a credential
    line = one_error(cli("get", unique, "s", "k", "--as", "nobody-here"), "get", 6)
    assert "nobody-here" in line


def test_permission_refused_is_exit_5(cli: Any, unique: str) -> None:
    cli("put", unique, "s", "k", "1", "--as", "alice")
    line = one_error(cli("put", unique, "s", "k", "2", "--as", f"reader-{unique}"), "put", 5)
    assert "permission denied" in line and f"reader-{unique}" in line
    assert cli("ls", unique, "s", "--as", f"reader-{unique}")[1].split() == ["k"]  # a reader reads
    outsider = f"outsider-{unique}"  # no right on any board
    for argv in (("get", unique, "s", "k"), ("ls", unique), ("ls", unique, "s", "-l"), ("history", unique, "s", "k"),
                 ("watch", unique, "--current", "--count", "1")):
        one_error(cli(*argv, "--as", outsider), argv[0], 5)


# ------------------------------------------------------------------------ ls
def test_ls_sections_keys_and_entries(cli: Any, unique: str) -> None:
    for section, key, value in [("tasks", "t1", '{"status": "open", "p": 1}'),
                                ("tasks", "t2", '{"status": "done", "p": 2}'),
                                ("notes", "n1", "a note")]:
        assert cli("put", unique, section, key, value, "--as", "alice")[0] == 0
    code, out, _ = cli("ls", unique, "--as", "alice", "--json")
    assert code == 0 and json.loads(out) == {"board": unique, "sections": ["notes", "tasks"]}
    assert cli("ls", unique, "--as", "alice")[1].split() == ["notes", "tasks"]
    code, out, _ = cli("ls", unique, "tasks", "--as", "alice", "--json")
    assert json.loads(out) == {"board": unique, "section": "tasks", "keys": ["t1", "t2"]}
    code, out, _ = cli("ls", unique, "-l", "--as", "alice", "--json")
    entries = json_lines(out)
    assert [(e["section"], e["key"]) for e in entries] == [("notes", "n1"), ("tasks", "t1"), ("tasks", "t2")]
    code, out, _ = cli("ls", unique, "tasks", "-l", "--as", "alice")
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["SECTION", "KEY", "REV", "AUTHOR"] and len(lines) == 3
    assert "alice" in lines[1] and '"status":"open"' in lines[1].replace(" ", "")
    code, out, _ = cli("ls", unique, "--where", '{"value.status": {"$in": ["open", "blocked"]}}', "--as", "alice",
                       "--json")
    assert code == 0 and [e["key"] for e in json_lines(out)] == ["t1"]
    code, out, _ = cli("ls", unique, "--where", '{"value.p": {"$gt": 5}}', "--as", "alice")
    assert code == 0 and "no entry" in out


def test_ls_of_an_unknown_board_or_section_is_not_found(cli: Any, unique: str) -> None:
    line = one_error(cli("ls", f"{unique}-none", "--as", "alice"), "ls", 3)
    assert f"{unique}-none" in line
    cli("put", unique, "s", "k", "1", "--as", "alice")
    one_error(cli("ls", unique, "nosuch", "--as", "alice"), "ls", 3)
    one_error(cli("ls", f"{unique}-none", "-l", "--where", '{"value.x": 1}', "--as", "alice"), "ls", 3)


# ------------------------------------------------------------------- history
def test_history_lists_the_kept_revisions(cli: Any, unique: str) -> None:
    revs = [json.loads(cli("put", unique, "s", "k", str(i), "--as", "alice", "--json")[1])["revision"]
            for i in range(3)]
    code, out, _ = cli("history", unique, "s", "k", "--as", "bob", "--json")
    assert code == 0
    assert [(e["revision"], e["value"]) for e in json_lines(out)] == list(zip(revs, [0, 1, 2], strict=True))
    code, out, _ = cli("history", unique, "s", "k", "--as", "bob")
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["REV", "OP", "AUTHOR"] and len(lines) == 4
    assert lines[1].split()[:3] == [str(revs[0]), "put", "alice"]
    one_error(cli("history", unique, "s", "none", "--as", "bob"), "history", 3)


# --------------------------------------------------------------------- watch
@pytest.mark.asyncio
async def test_watch_prints_changes_as_they_happen(cli: Any, unique: str, agent_settings: Settings) -> None:
    task = asyncio.create_task(acli(cli, "watch", unique, "tasks", "--as", "bob", "--json", "--count", "3"))
    async with Agent.connect("alice", settings=agent_settings) as alice:
        board = alice.board(unique)
        for _ in range(100):  # until the watch is up: a change it saw comes out of it
            await board.put("tasks", "t0", {"ping": True})
            await asyncio.sleep(0.05)
            if task.done():
                break
            # The watch starts "new": writes before it are not shown. Write until it has seen 3.
        code, out, err = await asyncio.wait_for(task, 30)
    assert code == 0, err
    changes = json_lines(out)
    assert len(changes) == 3 and all(c["key"] == "t0" and c["operation"] == "put" for c in changes)


def test_watch_from_start_replays_then_counts(cli: Any, unique: str) -> None:
    cli("put", unique, "s", "a", '"x"', "--as", "alice")
    cli("put", unique, "s", "a", '"y"', "--as", "alice")
    code, out, err = cli("watch", unique, "--from-start", "--count", "2", "--as", "bob")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 2 and all(f"{unique}/s/a" in line and "by alice" in line for line in lines)
    assert lines[0].endswith(': x') and lines[1].endswith(': y')
    code, out, _ = cli("watch", unique, "s", "a", "--current", "--count", "1", "--as", "bob", "--json")
    assert code == 0 and json_lines(out)[0]["value"] == "y"


# ------------------------------------------------------------- send / inbox
def test_send_then_inbox_peek_and_ack(cli: Any, unique: str) -> None:
    me, peer = f"a-{unique}", f"b-{unique}"
    code, out, err = cli("send", peer, "task.assign", '{"task": "t1"}', "--as", me, "--json", "--board", unique)
    assert code == 0, err
    sent = json.loads(out)
    assert sent["to"] == [peer] and sent["type"] == "task.assign" and len(sent["sequences"]) == 1
    code, out, _ = cli("send", peer, "note", "just text", "--as", me)
    assert code == 0 and out.startswith("sent ") and peer in out

    code, out, err = cli("inbox", "--as", peer, "--json", "--wait", "0.5")
    assert code == 0, err
    first = json_lines(out)
    assert [(m["type"], m["body"], m["sender"]) for m in first] == [("task.assign", {"task": "t1"}, me),
                                                                     ("note", "just text", me)]
    assert first[0]["id"] == sent["id"] and first[0]["board"] == unique and first[0]["verdict"] == "verified"
    code, out, _ = cli("inbox", "--as", peer, "--max", "1")  # not acknowledged: they are still there
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:3] == ["SEQ", "FROM", "TYPE"] and "task.assign" in lines[1]
    assert len(lines) == 3 and "left in the inbox" in lines[2]
    code, out, _ = cli("inbox", "--as", peer, "--ack", "--json", "--wait", "0.5")
    assert code == 0 and [m["type"] for m in json_lines(out)] == ["task.assign", "note"]
    code, out, _ = cli("inbox", "--as", peer, "--wait", "0.2")
    assert code == 0 and "inbox empty" in out
    assert cli("inbox", "--as", peer, "--wait", "0.2", "--json")[1] == ""


def test_send_and_inbox_bad_input(cli: Any, unique: str) -> None:
    one_error(cli("send", "not a name!", "t", "--as", f"a-{unique}"), "send", 2)
    one_error(cli("send", ",", "t", "--as", f"a-{unique}"), "send", 2)
    one_error(cli("inbox", "--max", "0", "--as", f"a-{unique}"), "inbox", 2)
    one_error(cli("inbox", "--wait", "-1", "--as", f"a-{unique}"), "inbox", 2)


# ------------------------------------------------- with a worker: search, status
@pytest.mark.asyncio
async def test_search_recall_boards_and_stored_history(cli: Any, unique: str, pg_settings: Settings,
                                                       agent_settings: Settings, start_worker: StartWorker) -> None:
    from tests._worker_helpers import HashProvider

    worker = await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider())
    async with Agent.connect("alice", settings=agent_settings) as alice:
        board = alice.board(unique)
        await board.put("notes", "db", {"text": "postgres eighteen with pgvector", "status": "open"},
                        metadata={"confidence": 0.9})
        await board.put("notes", "lunch", "pizza friday", metadata={"confidence": 0.2})
        await alice.remember("the deploy failed because of a schema migration", board=unique,
                             metadata={"confidence": 0.95}, kind="episodic")
        await alice.remember("pizza is served on fridays", board=unique, metadata={"confidence": 0.3})
    await worker.wait_caught_up(60, embedded=True)

    code, out, err = await acli(cli, "search", "pizza", "--board", unique, "--mode", "keyword", "--as", "bob",
                                "--json")
    assert code == 0, err
    assert [(h["board"], h["section"], h["key"], h["value"]) for h in json_lines(out)] == \
        [(unique, "notes", "lunch", "pizza friday")]
    code, out, err = await acli(cli, "search", "postgres pizza", "--board", unique, "--where",
                                '{"metadata.confidence": {"$gt": 0.8}}', "--as", "bob", "--json")
    assert code == 0, err
    assert [h["key"] for h in json_lines(out)] == ["db"]
    code, out, _ = await acli(cli, "search", "pizza", "--board", unique, "--as", "bob")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["SCORE", "BOARD", "SECTION", "KEY", "REV", "VALUE"]
    assert "lunch" in lines[1] and "pizza friday" in lines[1]
    code, out, _ = await acli(cli, "search", "nothing-like-this-anywhere", "--board", unique, "--mode", "keyword",
                              "--as", "bob")
    assert code == 0 and "nothing found" in out

    code, out, err = await acli(cli, "recall", "deploy schema", "--board", unique, "--as", "bob", "--json",
                                "--where", '{"metadata.confidence": {"$gte": 0.9}}')
    assert code == 0, err
    hits = json_lines(out)
    assert [h["text"] for h in hits] == ["the deploy failed because of a schema migration"]
    assert hits[0]["agent"] == "alice" and hits[0]["kind"] == "episodic" and hits[0]["score"] > 0
    code, out, _ = await acli(cli, "recall", "pizza", "--board", unique, "--kind", "episodic", "--as", "bob")
    assert code == 0 and out.splitlines()[0].split() == ["SCORE", "BOARD", "KIND", "AGENT", "TEXT"]
    line = one_error(await acli(cli, "recall", "x", "--where", '{"value.status": "open"}', "--as", "bob"),
                     "recall", 2)
    assert "value" in line
    one_error(await acli(cli, "search", "x", "--top-k", "0", "--as", "bob"), "search", 2)
    one_error(await acli(cli, "search", "x", "--board", unique, "--as", f"outsider-{unique}"), "search", 5)

    code, out, err = await acli(cli, "ls", "--as", "bob", "--json")
    assert code == 0, err
    assert unique in json.loads(out)["boards"]
    code, out, err = await acli(cli, "history", unique, "notes", "db", "--stored", "--as", "bob", "--json")
    assert code == 0, err
    assert [(r["op"], r["value"]["status"]) for r in json_lines(out)] == [("PUT", "open")]


@pytest.mark.asyncio
async def test_status_as_the_operator_and_as_an_agent(cli: Any, unique: str, pg_settings: Settings,
                                                      postgres_server: EmbeddedPostgres, env: dict[str, str],
                                                      start_worker: StartWorker) -> None:
    from tests._auth import operator_nats
    from tests._worker_helpers import HashProvider

    worker = await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider())
    # An unsigned record: the worker dead-letters it (workers require signatures).
    nc = await operator_nats(env["BLACKBOARD_NATS__URL"])
    try:
        await nc.jetstream().publish(f"$KV.blackboard.{unique}.s.k", b"\x93garbage")
    finally:
        await nc.close()
    await worker.wait_caught_up(60)

    code, out, err = await acli(cli, "status", "--json", "--db", "--postgres-dsn", postgres_server.dsn)
    assert code == 0, err
    report = json.loads(out)
    assert report["identity"] == {"principal": "operator", "view": "operator"}
    assert report["server"]["url"].startswith("tls://") and report["server"]["version"]
    assert report["jetstream"]["streams"] >= 4
    names = {s["name"] for s in report["streams"]}
    assert {"KV_blackboard", "BB_MEMORY", "BB_MSG", "BB_VOTE"} <= names
    durable = {c["name"] for c in report["consumers"]["durable"]}
    assert {f"w{unique}-entries", f"w{unique}-memories"} <= durable  # (a test worker's group is its name)
    assert len(report["search_services"]) >= 1
    assert report["worker"]["worker"] == f"w{unique}" and report["lag"] == 0
    assert report["dead_letters"] >= 1 and isinstance(report["embedding_backlog"], int)
    db = report["database"]
    assert db["dead_letters"] >= 1 and any(r["stream"] == "KV_blackboard" for r in db["dead_letters_by_stream"])
    assert isinstance(db["embedding_queue"], int) and db["dead_letter_reasons"]

    code, out, err = await acli(cli, "status")
    assert code == 0, err
    for heading in ("server", "jetstream", "lag", "embedding", "dead", "STREAMS", "CONSUMERS (durable)",
                    "SEARCH SERVICES", "WORKER"):
        assert heading in out
    assert "KV_blackboard" in out and f"w{unique}-entries" in out

    code, out, err = await acli(cli, "status", "--as", "alice", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["identity"] == {"principal": "alice", "view": "agent"}
    assert "streams" not in report and "consumers" not in report
    assert report["worker"]["worker"] == f"w{unique}" and report["lag"] == 0
    assert report["inbox"]["name"] == "inbox-alice" and isinstance(report["inbox"]["exists"], bool)
    code, out, _ = await acli(cli, "status", "--as", "alice")
    assert code == 0 and "agent view" in out and "STREAMS" not in out


def test_status_without_a_server_or_a_worker(cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = cli("status", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert "error" in report["worker"] and report["lag"] is not None  # from the consumers
    one_error(cli("status", "--nats-url", "htp://127.0.0.1:1"), "status", 2)
    monkeypatch.setenv("BLACKBOARD_NATS__CONNECT_ATTEMPTS", "1")
    line = one_error(cli("status", "--nats-url", "tls://127.0.0.1:1"), "status", 1)
    assert "127.0.0.1:1" in line


# ------------------------------------------------------------ the real entry point
def test_the_blackboard_command_runs_them(env: dict[str, str], unique: str) -> None:
    proc_env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")} | env
    proc_env["BLACKBOARD_CLI__AGENT"] = "alice"

    def run(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "blackboard", *argv], env=proc_env, input=stdin,
                              capture_output=True, text=True, timeout=60)

    done = run("put", unique, "s", "k", "-", "--json", stdin='{"a": 1}')
    assert done.returncode == 0, done.stderr
    revision = json.loads(done.stdout)["revision"]
    done = run("get", unique, "s", "k", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["value"] == {"a": 1}
    done = run("get", unique, "s", "nope")
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert done.stderr.strip().startswith("blackboard get: error: ")
    done = run("put", unique, "s", "k", "2", "--expect-revision", str(revision + 1))
    assert done.returncode == 4 and "conflict" in done.stderr
    done = run("get", "--help")
    assert done.returncode == 0 and "Exit codes" in done.stdout and "--as NAME" in done.stdout
    # A reader that goes away (| head) ends the command quietly.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "blackboard", "get", unique, "s", "k"], env=proc_env,
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    # watch runs until Ctrl-C: then exit 130, quietly. Its SIGINT is made the default one: a
    # suite run in the background of a non-interactive shell (`.ci/run &`) inherits SIGINT
    # ignored, and Python then leaves Ctrl-C ignored, as a background job's should be.
    proc = subprocess.Popen([sys.executable, "-m", "blackboard", "watch", unique], env=proc_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith(f"watching {unique}")  # the watch is up
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
