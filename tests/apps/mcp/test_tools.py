"""The MCP server's tools, through the ``mcp`` package's own client over stdio and HTTP
(``mcp_connect`` / ``mcp_session``, parametrized over both transports): every tool, a conflict
as a tool error carrying the current revision, bad arguments and refused permissions as clear
tool errors. Each test shares one session across many calls (a stdio session is a process)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from mcp import ClientSession
from mcp.types import CallToolResult, TextContent

from agents_sdk import Agent
from agents_sdk.messaging.inbox import Message
from blackboard.devstack import EmbeddedPostgres
from blackboard.settings import Settings
from tests._worker_helpers import HashProvider, StartWorker, fresh_db, worker_settings
from tests.apps.mcp.conftest import McpConnect, call
from tests.conftest import make_settings

pytestmark = pytest.mark.asyncio

TOOLS = {
    "board_get", "board_put", "board_create", "board_update", "board_delete", "board_history", "board_list",
    "board_sections", "board_keys", "board_entries", "board_search", "memory_recall", "memory_remember",
    "message_send", "inbox_read", "inbox_ack", "message_reply", "message_request", "vote_propose", "vote_cast",
    "vote_outcome", "task_claim", "task_release",
    # the agent's memory actions (test_memory_actions.py)
    "memory_write", "memory_read", "memory_search", "memory_summarize", "memory_prune",
}


async def fails(session: ClientSession, tool: str, **arguments: Any) -> tuple[str, dict[str, Any]]:
    """Call ``tool`` expecting a tool error; its text and structured details."""
    result: CallToolResult = await session.call_tool(tool, arguments)
    assert result.is_error, f"{tool}{arguments} did not fail: {result.structured_content}"
    (content,) = result.content
    assert isinstance(content, TextContent)
    assert "Traceback" not in content.text
    return content.text, dict(result.structured_content or {})


async def test_tools_are_listed_with_schemas_for_a_model(mcp_session: ClientSession) -> None:
    tools = {t.name: t for t in (await mcp_session.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.description and "\n        " not in tool.description, tool.name
        assert tool.input_schema["type"] == "object"
        assert tool.output_schema is not None and tool.output_schema["type"] == "object", tool.name
        assert tool.annotations is not None
        for name, prop in tool.input_schema.get("properties", {}).items():
            assert prop.get("description"), f"{tool.name}.{name} has no description"
    update = tools["board_update"]
    assert set(update.input_schema["required"]) == {"board", "section", "key", "value", "expected_revision"}
    assert "expected_revision" in (update.description or "")
    assert tools["board_get"].annotations is not None and tools["board_get"].annotations.read_only_hint
    assert tools["board_delete"].annotations is not None and tools["board_delete"].annotations.destructive_hint


async def test_board_tools_and_a_conflict_as_a_tool_error(mcp_session: ClientSession, mcp_agent_id: str,
                                                          unique: str) -> None:
    b = {"board": unique}
    put = await call(mcp_session, "board_put", **b, section="tasks", key="t1",
                     value={"title": "write docs", "status": "open"}, tags=["docs"], metadata={"confidence": 0.9})
    r1 = put["revision"]
    got = await call(mcp_session, "board_get", **b, section="tasks", key="t1")
    assert (got["value"], got["revision"], got["author"], got["tags"], got["metadata"]) == (
        {"title": "write docs", "status": "open"}, r1, mcp_agent_id, ["docs"], {"confidence": 0.9})
    assert got["verdict"] == "verified" and got["deleted"] is False

    # create: only when absent
    text, details = await fails(mcp_session, "board_create", **b, section="tasks", key="t1", value={})
    assert details["error"] == "ConflictError" and details["current_revision"] == r1
    created = await call(mcp_session, "board_create", **b, section="tasks", key="t2",
                         value={"title": "review", "status": "blocked"}, metadata={"confidence": 0.4})

    # update at the revision read; a stale revision is a conflict carrying the current one
    r2 = (await call(mcp_session, "board_update", **b, section="tasks", key="t1",
                     value={"title": "write docs", "status": "done"}, expected_revision=r1))["revision"]
    assert r2 > r1
    text, details = await fails(mcp_session, "board_update", **b, section="tasks", key="t1",
                                value={"status": "lost"}, expected_revision=r1)
    assert details == {"error": "ConflictError", "message": details["message"], "key": f"{unique}.tasks.t1",
                       "expected_revision": r1, "current_revision": r2}
    assert f"expected_revision={r2}" in text
    assert (await call(mcp_session, "board_get", **b, section="tasks", key="t1"))["value"]["status"] == "done"
    older = await call(mcp_session, "board_get", **b, section="tasks", key="t1", revision=r1)
    assert older["value"]["status"] == "open"

    # listings
    await call(mcp_session, "board_put", **b, section="notes", key="n1", value="hello")
    assert (await call(mcp_session, "board_sections", **b))["sections"] == ["notes", "tasks"]
    assert (await call(mcp_session, "board_keys", **b, section="tasks"))["keys"] == ["t1", "t2"]
    everything = await call(mcp_session, "board_entries", **b)
    assert [(e["section"], e["key"]) for e in everything["entries"]] == [("notes", "n1"), ("tasks", "t1"),
                                                                          ("tasks", "t2")]
    open_ones = await call(mcp_session, "board_entries", **b, section="tasks",
                           where={"value.status": {"$in": ["open", "blocked"]}})
    assert [e["key"] for e in open_ones["entries"]] == ["t2"]
    confident = await call(mcp_session, "board_entries", **b, where={"metadata.confidence": {"$gt": 0.8}})
    assert [e["key"] for e in confident["entries"]] == []  # t1's update carried no metadata
    limited = await call(mcp_session, "board_entries", **b, limit=1)
    assert len(limited["entries"]) == 1

    # delete (conditional), history
    text, details = await fails(mcp_session, "board_delete", **b, section="tasks", key="t2",
                                expected_revision=created["revision"] + 1000)
    assert details["error"] == "ConflictError" and details["current_revision"] == created["revision"]
    deleted = await call(mcp_session, "board_delete", **b, section="tasks", key="t2",
                         expected_revision=created["revision"])
    assert deleted["deleted"] is True and deleted["revision"] > created["revision"]
    text, details = await fails(mcp_session, "board_get", **b, section="tasks", key="t2")
    assert details["error"] == "NotFoundError"
    history = (await call(mcp_session, "board_history", **b, section="tasks", key="t2"))["entries"]
    assert [(h["revision"], h["deleted"]) for h in history] == [(created["revision"], False),
                                                                (deleted["revision"], True)]
    text, details = await fails(mcp_session, "board_history", **b, section="tasks", key="never")
    assert details["error"] == "NotFoundError"

    # a put with a time-to-live
    await call(mcp_session, "board_put", **b, section="tmp", key="k", value=1, ttl=1)
    await asyncio.sleep(2.5)
    assert (await fails(mcp_session, "board_get", **b, section="tmp", key="k"))[1]["error"] == "NotFoundError"


async def test_bad_arguments_are_clear_tool_errors(mcp_session: ClientSession, unique: str) -> None:
    text, details = await fails(mcp_session, "board_get", board=unique, section="tasks")
    assert text == "invalid arguments for board_get: key: Field required"
    assert details["error"] == "InvalidArguments"
    text, _ = await fails(mcp_session, "board_update", board=unique, section="s", key="k", value=1,
                          expected_revision="latest")
    assert text.startswith("invalid arguments for board_update: expected_revision:")
    text, _ = await fails(mcp_session, "board_put", board=unique, section="s", key="k", value=1, ttl=0)
    assert "ttl" in text and "greater than or equal to 1" in text
    text, details = await fails(mcp_session, "board_put", board="no spaces", section="s", key="k", value=1)
    assert details["error"] == "InvalidKeyError" and "board must be 1-128 characters" in text
    text, details = await fails(mcp_session, "board_entries", board=unique, where={"metadata.x": {"$near": 1}})
    assert details["error"] == "InvalidPayloadError" and "$near" in text and "metadata.x" in text
    text, details = await fails(mcp_session, "board_entries", board=unique, where={"owner": "ana"})
    assert details["error"] == "InvalidPayloadError" and "owner" in text
    text, _ = await fails(mcp_session, "vote_outcome", board=unique, proposal_id="p", wait=3600)
    assert "wait" in text
    text, _ = await fails(mcp_session, "vote_propose", board=unique, section="d", key="k", candidates=[1, 2],
                          voters=["a"], policy="threshold")
    assert "a threshold policy needs a threshold" in text
    text, details = await fails(mcp_session, "vote_propose", board=unique, section="d", key="k", candidates=[1, 1],
                                voters=["a"])
    assert details["error"] == "InvalidPayloadError", text
    text, details = await fails(mcp_session, "inbox_ack", ids=["never-read"])
    assert "never-read" in text and details["error"] == "ToolFailure"
    text, details = await fails(mcp_session, "message_reply", message_id="never-read", body=1)
    assert "never-read" in text
    text, _ = await fails(mcp_session, "no_such_tool")
    assert "no_such_tool" in text
    # the session still works
    assert (await call(mcp_session, "board_put", board=unique, section="s", key="k", value=1))["revision"] >= 1


async def test_refused_permissions_are_tool_errors(mcp_connect: McpConnect, settings: Settings,
                                                   unique: str) -> None:
    async with Agent.connect(f"agent-{unique}", settings=settings) as writer:
        await writer.board(unique).put("tasks", "t1", {"title": "x"})
    async with mcp_connect(f"reader-{unique}") as reader:
        assert (await call(reader, "board_get", board=unique, section="tasks", key="t1"))["value"] == {"title": "x"}
        text, details = await fails(reader, "board_put", board=unique, section="tasks", key="t1", value=2)
        assert details["error"] == "PermissionDeniedError", text
        text, details = await fails(reader, "task_claim", board=unique, section="claims", key="t1")
        assert details["error"] == "PermissionDeniedError", text
    async with mcp_connect(f"outsider-{unique}") as outsider:
        text, details = await fails(outsider, "board_get", board=unique, section="tasks", key="t1")
        assert details["error"] == "PermissionDeniedError", text
        text, details = await fails(outsider, "board_put", board=unique, section="tasks", key="t9", value=1)
        assert details["error"] == "PermissionDeniedError", text


async def test_task_claims(mcp_session: ClientSession, mcp_agent_id: str, settings: Settings, unique: str) -> None:
    b = {"board": unique, "section": "claims"}
    claim = await call(mcp_session, "task_claim", **b, key="t1", ttl=60, note="writing the docs")
    assert (claim["owner"], claim["ttl"]) == (mcp_agent_id, 60)
    async with Agent.connect(f"other-{unique}", settings=settings) as other:
        held = await other.board(unique).get("claims", "t1")
        assert held.author == mcp_agent_id and held.value["note"] == "writing the docs"
        # a second claim of the same task, by anyone, is refused
        text, _ = await fails(mcp_session, "task_claim", **b, key="t1")
        assert f"already claimed by {mcp_agent_id}" in text
        await other.board(unique).create("claims", "t2", {"owner": other.id})
        text, _ = await fails(mcp_session, "task_claim", **b, key="t2")
        assert f"already claimed by {other.id}" in text
        text, _ = await fails(mcp_session, "task_release", **b, key="t2")
        assert f"claimed by {other.id}, not by you" in text
        # releasing at a stale revision is a conflict; at the claim's revision it frees the task
        text, details = await fails(mcp_session, "task_release", **b, key="t1", revision=claim["revision"] + 1000)
        assert details["error"] == "ConflictError" and details["current_revision"] == claim["revision"]
        assert (await call(mcp_session, "task_release", **b, key="t1", revision=claim["revision"]))["released"]
        again = await other.board(unique).create("claims", "t1", {"owner": other.id})
        assert again > claim["revision"]
    # a claim lapses by itself after its time-to-live
    short = await call(mcp_session, "task_claim", **b, key="t3", ttl=1)
    await asyncio.sleep(2.5)
    assert (await call(mcp_session, "task_claim", **b, key="t3", ttl=60))["revision"] > short["revision"]


async def _read_one(agent: Agent, timeout: float = 10) -> Message:
    async with agent.inbox(limit=1, timeout=timeout) as inbox:
        async for msg in inbox:
            await msg.ack(wait=True)
            return msg
    raise AssertionError(f"{agent.id} received nothing in {timeout} s")


async def test_messages_inbox_and_requests(mcp_session: ClientSession, mcp_agent_id: str, settings: Settings,
                                           unique: str) -> None:
    async with Agent.connect(f"peer-{unique}", settings=settings) as peer:
        # the MCP agent sends; the peer reads it
        sent = await call(mcp_session, "message_send", to=peer.id, type="review.request",
                          body={"entry": f"{unique}/tasks/t1"}, board=unique)
        got = await _read_one(peer)
        assert (got.id, got.sender, got.type, got.body, got.board) == (
            sent["id"], mcp_agent_id, "review.request", {"entry": f"{unique}/tasks/t1"}, unique)

        # the peer sends two; the MCP agent reads both, acknowledges one: the other comes back
        first = await peer.send(mcp_agent_id, "question", {"n": 1})
        second = await peer.send(mcp_agent_id, "question", {"n": 2})
        read = await call(mcp_session, "inbox_read", max=10, wait=2)
        assert [(m["id"], m["sender"], m["body"]) for m in read["messages"]] == [
            (first.id, peer.id, {"n": 1}), (second.id, peer.id, {"n": 2})]
        assert read["unacknowledged"] == 2
        assert (await call(mcp_session, "inbox_ack", ids=[first.id]))["acknowledged"] == [first.id]
        again = await call(mcp_session, "inbox_read", max=10, wait=1)
        assert [m["id"] for m in again["messages"]] == [second.id]

        # reply to it: a direct message to its sender, correlated
        reply = await call(mcp_session, "message_reply", message_id=second.id, body={"answer": 2})
        answer = await _read_one(peer)
        assert (answer.id, answer.correlation_id, answer.type, answer.body) == (
            reply["id"], second.id, "reply", {"answer": 2})
        await call(mcp_session, "inbox_ack", ids=[second.id])
        assert (await call(mcp_session, "inbox_read", max=10, wait=0.5))["messages"] == []
        text, _ = await fails(mcp_session, "inbox_ack", ids=[second.id])
        assert "already acknowledged" in text

        # request / reply with an agent that answers requests
        async def add(request: Message) -> Any:
            return request.body["a"] + request.body["b"]

        await peer.handle("add", add)
        assert (await call(mcp_session, "message_request", to=peer.id, type="add",
                           body={"a": 1, "b": 2}, timeout=10))["reply"] == 3
        text, details = await fails(mcp_session, "message_request", to=peer.id, type="unknown", body=None,
                                    timeout=5)
        assert details["error"] == "NoHandlerError", text
        text, details = await fails(mcp_session, "message_request", to=f"nobody-{unique}", type="add", timeout=2)
        assert details["error"] in {"NoResponderError", "RequestTimeoutError"}, text


async def test_search_memory_votes_and_boards_with_a_worker(mcp_connect: McpConnect, settings: Settings,
                                                            postgres_server: EmbeddedPostgres,
                                                            start_worker: StartWorker, unique: str) -> None:
    own = make_settings(settings.nats.url, fresh_db(postgres_server, unique))
    worker = await start_worker(worker_settings(own, batch_wait=0.02), name=f"w{unique}", provider=HashProvider())
    me = f"agent-{unique}"
    async with mcp_connect(me) as session, Agent.connect(f"peer-{unique}", settings=settings) as peer:
        b = {"board": unique}
        await call(session, "board_put", **b, section="facts", key="db", value="postgres with pgvector",
                   metadata={"confidence": 0.9})
        await call(session, "board_put", **b, section="facts", key="cache", value="redis for sessions",
                   metadata={"confidence": 0.3})
        memory = await call(session, "memory_remember", text="the deploy failed: the migration locked users",
                            kind="episodic", board=unique, tags=["deploy"], metadata={"confidence": 0.95})
        await call(session, "memory_remember", text="the deploy of friday went fine", board=unique,
                   metadata={"confidence": 0.5})
        await worker.wait_caught_up(60, embedded=True)

        hits = (await call(session, "board_search", query="pgvector postgres", board=unique, mode="keyword"))["hits"]
        assert [(h["section"], h["key"]) for h in hits][:1] == [("facts", "db")]
        confident = await call(session, "board_search", query="postgres redis", board=unique,
                               where={"metadata.confidence": {"$gte": 0.5}})
        assert [h["key"] for h in confident["hits"]] == ["db"]
        recalled = await call(session, "memory_recall", query="deploy migration", board=unique, mode="keyword")
        assert recalled["hits"] and recalled["hits"][0]["id"] == memory["id"]
        assert recalled["hits"][0]["agent"] == me
        sure = await call(session, "memory_recall", query="deploy", board=unique,
                          where={"metadata.confidence": {"$gt": 0.8}})
        assert [h["id"] for h in sure["hits"]] == [memory["id"]]
        assert (await call(session, "memory_recall", query="deploy", board=unique, kind="procedural"))["hits"] == []
        text, details = await fails(session, "memory_recall", query="deploy", where={"value.x": 1})
        assert details["error"] == "InvalidPayloadError" and "value" in text
        assert unique in (await call(session, "board_list"))["boards"]

        # a vote: proposed and cast through MCP, decided by the peer's ballot
        proposal = await call(session, "vote_propose", **b, section="decisions", key="db",
                              candidates=["postgres", "sqlite"], voters=[me, peer.id], question="Which database?")
        pid = proposal["proposal_id"]
        still_open = await call(session, "vote_outcome", **b, proposal_id=pid)
        assert still_open["status"] == "open" and still_open["counts"]["ballots"] == 0
        ballot = await call(session, "vote_cast", **b, proposal_id=pid, choice="postgres", reason="concurrency")
        assert ballot["decided"] is False
        text, details = await fails(session, "vote_cast", **b, proposal_id=pid, choice="mysql")
        assert details["error"] == "InvalidBallotError", text
        await peer.board(unique).vote(pid, "postgres")
        outcome = await call(session, "vote_outcome", **b, proposal_id=pid, wait=30)
        assert outcome["status"] == "accepted" and outcome["outcome"]["value"] == "postgres"
        got = await call(session, "board_get", **b, section="decisions", key="db")
        assert got["value"] == "postgres"
        text, details = await fails(session, "vote_outcome", **b, proposal_id=f"none-{unique}")
        assert details["error"] == "ProposalNotFoundError", text


async def test_tools_over_the_2026_protocol(settings: Settings, unique: str) -> None:
    """The SDK client's default (2026-07-28, in process): the same results and tool errors."""
    from mcp import Client

    from blackboard.apps.mcp import SingleAgent, create_server

    async with (Agent.connect(f"agent-{unique}", settings=settings) as agent,
                Client(create_server(SingleAgent(agent), settings)) as client):
        assert client.protocol_version == "2026-07-28"
        put = await client.call_tool("board_put", {"board": unique, "section": "s", "key": "k", "value": [1]})
        assert not put.is_error and put.structured_content is not None
        rev = put.structured_content["revision"]
        stale = await client.call_tool("board_update", {"board": unique, "section": "s", "key": "k", "value": [2],
                                                        "expected_revision": rev + 1})
        assert stale.is_error and stale.structured_content is not None
        assert stale.structured_content["current_revision"] == rev
        bad = await client.call_tool("board_get", {"board": unique})
        assert bad.is_error and "section: Field required" in str(bad.content)
