"""Any-language interop: a Node.js client (official ``nats`` npm package) and the Python SDK.

The Node program (``interop.mjs``) is written from ``docs/protocol.md`` and
``docs/security.md`` only. It connects as an agent, the way any other
language's client does: the agent's ``.creds`` file (issued by the test
authority), the test CA, the reply-inbox prefix ``_INBOX.<agent id>``, and only
the subjects an agent may use. It reads an entry the SDK wrote (msgpack
envelope, URL key; again at its revision with a one-shot consumer), updates it
with compare-and-set, creates a second key as JSON (``Bb-Encoding: json``), and
tries a stale compare-and-set. The SDK then reads the Node writes back. A
second run checks what the server refuses it: a connection without a
credential, and a write to a board its identity holds no right on.

Signatures (docs/protocol.md §14, ``signing.mjs``): the Node client publishes
its certificate (its user JWT) to the key registry and signs its writes, which
the SDK reads as ``verified``; it verifies the SDK's signature itself (the
certificate fetched and checked against the account key, the signature over
the signing input); and a payload it changes after signing, or an entry it
signs with another agent as author, is refused by the SDK's strict reads
(``UnverifiedRecordError``) and by its own verifier. Batch signatures
(§14.10): the Node client verifies entries the SDK wrote through
``board.pipeline()`` (signed as one batch: one signature check for all), and
refuses one given another record's path; it signs a batch of three writes of
its own, which the SDK reads as ``verified``. The worked examples of §14.9 and
§14.10 are recomputed by the Node code from the document's inputs.

Needs ``node`` on PATH (skipped with a reason otherwise); the npm packages
pinned in ``package-lock.json`` are installed by the test (``npm ci``) when
``node_modules`` is missing or older than the lock file.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from agents_sdk import Agent, ConflictError, NotFoundError, UnverifiedRecordError, Verdict
from blackboard.protocol.subjects import encode_key
from blackboard.settings import Settings

if TYPE_CHECKING:  # (imported at run time, pytest would try to collect the class TestAuth)
    from tests._auth import TestAuth

HERE = Path(__file__).resolve().parent
PROGRAM = HERE / "interop.mjs"
PROTOCOL_DOC = HERE.parents[1] / "docs" / "protocol.md"
NODE_TIMEOUT = 60.0
NPM_TIMEOUT = 300.0

URL_KEY = "https://example.com/docs/page?q=a b&lang=fr#section-2"
PATH_KEY = "/home/zoë/notes/plan v2.md"


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH: the Node.js interop test needs Node.js 18+")
    return node


def _ensure_node_modules() -> None:
    """Install the pinned npm packages (``npm ci``) unless they are already there."""
    lock = HERE / "package-lock.json"
    marker = HERE / "node_modules" / ".package-lock.json"  # written by npm on install
    if marker.exists() and marker.stat().st_mtime >= lock.stat().st_mtime:
        return
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("node is installed but npm is not on PATH: cannot install the interop test's "
                    "npm packages (tests/interop/package.json)")
    proc = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=HERE, capture_output=True, text=True, timeout=NPM_TIMEOUT, check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"npm ci failed in {HERE} (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def _connection(settings: Settings, test_auth: TestAuth, agent: str) -> dict[str, Any]:
    """What the Node program needs to connect as ``agent``: the URL, its ``.creds`` file and
    the CA that signed the server's certificate."""
    return {"url": settings.nats.url, "creds": str(test_auth.creds(agent)), "ca": str(test_auth.tls.ca),
            "agent": agent}


def _run_node(node: str, scenario: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(
        [node, str(PROGRAM), json.dumps(scenario)],
        cwd=HERE, capture_output=True, text=True, timeout=NODE_TIMEOUT, check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the Node program printed no result (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    result: dict[str, Any] = json.loads(lines[-1])
    assert proc.returncode == 0 and result.get("ok"), f"the Node program failed: {result}\n{proc.stderr}"
    return result


@pytest.mark.asyncio
async def test_node_client_reads_sdk_entry_and_writes_with_cas(settings: Settings, test_auth: TestAuth,
                                                               unique: str) -> None:
    node = _node()
    _ensure_node_modules()
    board_name, section = unique, "docs"
    node_agent = f"node-{unique}"  # the test policy makes any id a member of every board
    value = {"title": "héllo ✓", "n": 42, "pi": 3.5, "ok": True, "none": None, "list": [1, "two", 3.0],
             "bytes": b"\x00\x01\xff"}

    async with Agent.connect("py-agent", settings=settings) as agent:
        board = agent.board(board_name)
        before = datetime.now(UTC)
        rev_py = await board.put(section, URL_KEY, value, tags=["from-python", "interop"],
                                 metadata={"lang": "python", "nested": {"k": [1, 2]}})
        # pipelined writes, which the SDK signs in batches (docs/protocol.md §14.10): five in one
        batch_keys = [f"py-{i}" for i in range(5)]
        async with board.pipeline() as pipe:
            for i, key in enumerate(batch_keys):
                await pipe.put("batch", key, {"i": i})
        node_batch_keys = [f"node-{i}" for i in range(3)]

        result = _run_node(node, {
            **_connection(settings, test_auth, node_agent),
            "bucket": settings.board.bucket,
            "board": board_name,
            "section": section,
            "read_key": URL_KEY,
            "create_key": PATH_KEY,
            "missing_key": "no such key ✗",
            "author": node_agent,
            "update_value": {"status": "updated by node", "count": 7, "ratio": 0.25},
            "create_value": ["créé", "par", "node", 1],
            "attack_section": "attacks",
            "tamper_key": "tampered",
            "forged_key": "forged",
            "forged_author": "py-agent",
            "batch_section": "batch",
            "batch_keys": batch_keys,
            "node_batch_keys": node_batch_keys,
        })

        # the Node client published its certificate, under its own key
        assert result["certificate"]["subject"] == f"bb.keys.cert.{result['public_key']}"

        # (a) Node decoded the SDK's msgpack envelope and the URL key
        read = result["read"]
        assert read["key"] == URL_KEY
        assert read["token"] == encode_key(URL_KEY) and read["token"].startswith("=")
        assert (read["board"], read["section"], read["revision"]) == (board_name, section, rev_py)
        assert read["value"] == {**value, "bytes": None}
        assert read["bytes_hex"] == "0001ff"
        assert read["content_type"] == "application/json"
        assert read["tags"] == ["from-python", "interop"]
        assert read["metadata"] == {"lang": "python", "nested": {"k": [1, 2]}}
        assert read["author"] == "py-agent"
        created_at = datetime.fromisoformat(read["created_at"])
        assert before - timedelta(seconds=5) <= created_at <= datetime.now(UTC)
        assert read["stored_at"]

        # ... and verified the SDK's signature itself: the certificate (checked against the account key
        # of its own credential) names py-agent, the author; a copy changed after signing does not verify
        assert (read["verdict"], read["at_revision_verdict"]) == ("verified", "verified")
        assert (read["signer"], read["signer_kind"]) == ("py-agent", "agent")
        assert read["tampered_verdict"] == "bad_signature"
        assert read["canonical_payload"] is True  # its canonical encoding of the SDK's record: the same bytes

        assert result["missing"]["status"] == "404"

        # (b) the Node CAS update (msgpack) as the SDK sees it
        rev_upd = result["update"]["revision"]
        assert rev_upd > rev_py
        assert result["update"]["subject"] == agent.store.subjects.entry(board_name, section, URL_KEY)
        entry = await board.get(section, URL_KEY)
        assert entry.revision == rev_upd
        assert entry.verdict == Verdict.VERIFIED  # signed by the Node client's key, whose principal is the author
        assert entry.value == {"status": "updated by node", "count": 7, "ratio": 0.25}
        assert entry.author == node_agent
        assert entry.tags == ("from-node", "cas")
        assert entry.metadata == {"lang": "js", "step": 1}
        assert entry.content_type == "application/json"
        assert entry.created_at is not None and entry.created_at.tzinfo is not None
        history = await board.history(section, URL_KEY)
        assert [(e.revision, e.author, e.verdict) for e in history] == [
            (rev_py, "py-agent", Verdict.VERIFIED), (rev_upd, node_agent, Verdict.VERIFIED)]
        old = await board.get(section, URL_KEY, revision=rev_py)
        assert old.value == value and old.author == "py-agent"

        # ... and the JSON-encoded create under a file-path key
        rev_new = result["create"]["revision"]
        assert result["create"]["subject"] == agent.store.subjects.entry(board_name, section, PATH_KEY)
        created = await board.get(section, PATH_KEY)
        assert created.revision == rev_new
        # a JSON payload, signed over the record's canonical encoding: verified by the second check
        assert created.verdict == Verdict.VERIFIED and result["create"]["verdict"] == "verified"
        assert created.value == ["créé", "par", "node", 1]
        assert created.author == node_agent
        assert created.tags == ("from-node", "json")
        assert created.metadata == {"lang": "js", "encoding": "json"}
        assert sorted(await board.keys(section)) == sorted([URL_KEY, PATH_KEY])

        # a second create of the same key (CAS on revision 0) was refused
        again = result["create_again"]
        assert again["ok"] is False and again["err_code"] == 10071
        assert again["current_revision"] == rev_new

        # (c) the stale CAS was rejected with the current revision; nothing was written
        stale = result["stale"]
        assert stale["ok"] is False
        assert stale["err_code"] == 10071
        assert stale["current_revision"] == rev_upd
        assert (await board.get(section, URL_KEY)).revision == rev_upd
        assert result["history_check"] == {"old_revision": rev_py, "old_author": "py-agent",
                                           "latest_revision": rev_upd, "latest_author": node_agent,
                                           "old_verdict": "verified", "latest_verdict": "verified"}

        # (d) a payload changed after signing, and an entry signed by node with py-agent as author:
        # the SDK's strict read refuses both, and so did the Node client's own verifier
        assert result["tamper"]["verdict"] == "bad_signature"
        with pytest.raises(UnverifiedRecordError) as refused:
            await board.get("attacks", "tampered")
        assert refused.value.verdict == Verdict.BAD_SIGNATURE
        assert refused.value.revision == result["tamper"]["revision"]
        assert result["forged"]["verdict"] == "wrong_author"
        with pytest.raises(UnverifiedRecordError) as refused:
            await board.get("attacks", "forged")
        assert refused.value.verdict == Verdict.WRONG_AUTHOR
        assert refused.value.signer == node_agent

        # (e) the SDK's pipelined writes: one signature for the five, each with its own path (three steps
        # for the first four, one for the fifth, the last of an odd level); Node verified all five with one
        # signature check, and not the first with the second's path, without one, or with a broken one
        batch = result["batch"]
        assert batch["values"] == [{"i": i} for i in range(5)]
        assert batch["signatures"] == 1
        assert [len(p.split(".")) for p in batch["paths"]] == [3, 3, 3, 3, 1]
        assert len(set(batch["paths"])) == 5
        assert batch["verdicts"] == ["verified"] * 5
        assert batch["signature_checks"] == 1
        assert batch["swapped_path_verdict"] == "bad_signature"
        assert batch["no_path_verdict"] == "bad_signature"
        assert batch["bad_path_verdict"] == "malformed"

        # (f) Node signed three writes as one batch: the SDK reads each as verified (and Node did)
        written = result["node_batch"]["written"]
        assert [w["ok"] for w in written] == [True] * 3
        assert len({w["signature"] for w in written}) == 1
        assert [len(w["path"].split(".")) for w in written] == [2, 2, 1]
        assert result["node_batch"]["verdicts"] == ["verified"] * 3
        for n, (key, w) in enumerate(zip(node_batch_keys, written, strict=True)):
            entry = await board.get("batch", key)
            assert (entry.revision, entry.author, entry.value) == (w["revision"], node_agent,
                                                                  {"n": n, "from": "node batch"})
            assert entry.verdict == Verdict.VERIFIED
        assert sorted(await board.keys("batch")) == sorted(batch_keys + node_batch_keys)

        # the SDK sees the same conflict for the same stale revision
        with pytest.raises(ConflictError) as info:
            await board.update(section, URL_KEY, "stale from python", expected_revision=rev_py)
        assert info.value.current_revision == rev_upd


@pytest.mark.asyncio
async def test_node_client_is_refused_without_credential_and_outside_its_rights(
        settings: Settings, test_auth: TestAuth, unique: str) -> None:
    node = _node()
    _ensure_node_modules()
    solo = f"solo-node-{unique}"  # the test policy: read, write and vote on solo-board only
    foreign, own, section, key = unique, "solo-board", "docs", f"k-{unique}"

    result = _run_node(node, {**_connection(settings, test_auth, solo), "mode": "refusals",
                              "bucket": settings.board.bucket, "board": foreign, "own_board": own,
                              "section": section, "key": key})

    # without a credential the server refuses the connection
    assert result["no_credential"]["connected"] is False
    assert result["no_credential"]["code"] == "AUTHORIZATION_VIOLATION", result["no_credential"]

    # with its credential: no ack for a board it holds no right on, and no read of it ...
    assert result["agent"] == solo
    foreign_write = result["foreign_write"]
    assert foreign_write["ok"] is False and "revision" not in foreign_write
    assert foreign_write["code"] == "PERMISSIONS_VIOLATION", foreign_write
    foreign_subject = f"$KV.{settings.board.bucket}.{foreign}.{section}.{key}"
    assert foreign_subject in foreign_write["error"]
    assert result["foreign_read"]["ok"] is False
    assert result["foreign_read"]["code"] == "PERMISSIONS_VIOLATION", result["foreign_read"]
    assert result["bare_direct_get"]["code"] == "PERMISSIONS_VIOLATION", result["bare_direct_get"]
    # ... while the board it may write took the same write
    own_write = result["own_write"]
    assert own_write["ok"] is True, own_write

    async with Agent.connect("py-agent", settings=settings) as agent:
        with pytest.raises(NotFoundError):
            await agent.board(foreign).get(section, key)
        entry = await agent.board(own).get(section, key)
        assert (entry.revision, entry.author, entry.value) == (own_write["revision"], solo, "written from node")
        assert entry.verdict == Verdict.VERIFIED


def test_node_signing_reproduces_the_worked_example_of_the_protocol_doc() -> None:
    """docs/protocol.md §14.9 from its inputs, in JavaScript: canonical record, signing input, signature."""
    node = _node()
    _ensure_node_modules()
    doc = PROTOCOL_DOC.read_text(encoding="utf-8")
    example = doc[doc.index("### 14.9 Worked example"):doc.index("### 14.10")]
    rows = dict(re.findall(r"^\| `?([^|`]+?)`? \| `([^`]+)`", example, re.MULTILINE))
    record_hex, _lines, input_hex, signature = re.findall(r"```\n(.*?)```", example, re.DOTALL)

    result = _run_node(node, {"mode": "example", "seed": rows["seed"], "subject": rows["subject"],
                              "msg_id": rows["Nats-Msg-Id"], "signed_at_us": rows["Bb-Sig-Time"],
                              "expected": rows["Nats-Expected-Last-Subject-Sequence"], "record": rows["record"]})

    assert result["public_key"] == rows["Bb-Sig-Key"]
    assert result["record_hex"] == record_hex.replace(" ", "").replace("\n", "")
    assert result["signing_input_hex"] == input_hex.replace(" ", "").replace("\n", "")
    assert result["signature"] == signature.strip()


def test_node_batch_signing_reproduces_the_batch_example_of_the_protocol_doc() -> None:
    """docs/protocol.md §14.10 from its inputs, in JavaScript: leaves, root, batch message, signature, paths."""
    node = _node()
    _ensure_node_modules()
    doc = PROTOCOL_DOC.read_text(encoding="utf-8")
    section = doc[doc.index("### 14.10 Batch signatures"):doc.index("## 15.")]
    example = section[section.index("#### Worked example"):]
    shared = dict(re.findall(r"^\| `?([^|`]+?)`? \| `([^`]+)`", example, re.MULTILINE))
    records = re.findall(r"^\| \d \| `([^`]+)` \| `([^`]+)` \| `([^`]+)` \|$", example, re.MULTILINE)
    paths = re.findall(r"^\| \d \| `([^`]+)` \|$", example, re.MULTILINE)
    _lines, leaves, nodes, message_hex, signature = re.findall(r"```\n(.*?)```", example, re.DOTALL)
    named = dict(re.findall(r"^(\w+) += ([0-9a-f]{64})$", leaves + nodes, re.MULTILINE))

    result = _run_node(node, {"mode": "example_batch", "seed": shared["seed"], "signed_at_us": shared["Bb-Sig-Time"],
                              "records": [{"subject": s, "msg_id": m, "record": r} for s, m, r in records]})

    assert result["public_key"] == shared["Bb-Sig-Key"]
    assert result["leaves"] == [named["L0"], named["L1"], named["L2"]]
    assert result["root"] == named["root"]
    assert result["batch_message_hex"] == message_hex.replace(" ", "").replace("\n", "")
    assert result["signatures"] == [signature.strip()] * 3
    assert result["times"] == [shared["Bb-Sig-Time"]] * 3
    assert result["paths"] == paths
