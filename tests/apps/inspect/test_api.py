"""The inspector's API against the real servers, through a real uvicorn on a free port: what an
identity may not read is neither listed nor served (403); entries are paged; an SDK write
arrives on the event stream; history and as-of values; a vote's tally moves; search hits."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from agents_sdk import Agent
from blackboard.apps.inspect import InspectorServer, running_inspector
from blackboard.settings import Settings


@contextlib.asynccontextmanager
async def inspecting(settings: Settings, agent_id: str) -> AsyncIterator[tuple[InspectorServer, httpx2.AsyncClient]]:
    # Not warmed up: the session's servers hold every test's boards (one test warms up).
    async with running_inspector(settings, agent_id, port=0, warm=False) as server, \
            httpx2.AsyncClient(base_url=server.url.rstrip("/"), timeout=30) as client:
        yield server, client


async def _json(client: httpx2.AsyncClient, path: str, status: int = 200, **params: Any) -> Any:
    response = await client.get(path, params=params or None)
    assert response.status_code == status, (path, response.status_code, response.text)
    return response.json()


class EventStream:
    """The server-sent events of one board, read in the background."""

    def __init__(self, client: httpx2.AsyncClient, path: str) -> None:
        self.client = client
        self.path = path
        self.events: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        async with self.client.stream("GET", self.path) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            name = None
            async for line in response.aiter_lines():
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: ") and name is not None:
                    self.events.put_nowait((name, json.loads(line[6:])))
                    name = None

    async def __aenter__(self) -> EventStream:
        self.task = asyncio.create_task(self._read())
        await self.next("ready")
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def next(self, kind: str, timeout: float = 15.0) -> tuple[str, dict[str, Any]]:
        """The next event named ``kind`` (others before it are dropped)."""
        async with asyncio.timeout(timeout):
            while True:
                name, data = await self.events.get()
                if name == kind:
                    return name, data


@pytest.mark.asyncio
async def test_an_identity_sees_only_the_boards_it_may_read(pg_settings: Settings, unique: str,
                                                            start_worker: Any) -> None:
    await start_worker(pg_settings, name=f"w{unique}", embed=False)
    async with Agent.connect(f"writer-{unique}", settings=pg_settings) as writer:
        await writer.board(unique).put("notes", "a", {"x": 1})
        await writer.board("solo-board").put("notes", f"k-{unique}", "solo")
    async with inspecting(pg_settings, f"solo-{unique}") as (_, solo):
        assert (await _json(solo, "/api/whoami")) == {"agent": f"solo-{unique}", "read_only": True}
        listed = (await _json(solo, "/api/boards"))["boards"]
        assert listed == ["solo-board"]
        for path in (f"/api/boards/{unique}/entries", f"/api/boards/{unique}/entry/notes/a",
                     f"/api/boards/{unique}/history/notes/a", f"/api/boards/{unique}/votes",
                     f"/api/boards/{unique}/events", f"/api/boards/{unique}/asof?revision=1"):
            refused = await solo.get(path)
            assert refused.status_code == 403, (path, refused.text)
            assert refused.json()["type"] == "PermissionDeniedError"
        page = await _json(solo, "/api/boards/solo-board/entries", prefix=f"k-{unique}")
        assert [(e["key"], e["preview"]) for e in page["entries"]] == [(f"k-{unique}", "solo")]
    # Warming up opens the live state of the boards it may read, and only those.
    async with running_inspector(pg_settings, f"solo-{unique}", port=0) as server:
        assert await server.inspector.warm() == ["solo-board"]
    async with inspecting(pg_settings, f"member-{unique}") as (_, member):
        assert unique in (await _json(member, "/api/boards"))["boards"]
        entry = await _json(member, f"/api/boards/{unique}/entry/notes/a")
        assert entry["value"] == {"x": 1} and entry["value_kind"] == "json" and entry["author"] == f"writer-{unique}"


@pytest.mark.asyncio
async def test_entries_are_paged_and_filtered(pg_settings: Settings, unique: str, start_worker: Any) -> None:
    await start_worker(pg_settings, name=f"w{unique}", embed=False)
    async with Agent.connect(f"writer-{unique}", settings=pg_settings) as writer:
        board = writer.board(unique)
        async with board.pipeline() as pipe:
            for i in range(450):
                await pipe.put("tasks" if i % 3 else "facts", f"k{i:04d}", {"i": i}, tags=["t"])
    async with inspecting(pg_settings, f"member-{unique}") as (_, client):
        seen: list[tuple[str, str]] = []
        cursor = None
        pages = 0
        while True:
            page = await _json(client, f"/api/boards/{unique}/entries", limit=200,
                               **({"cursor": cursor} if cursor else {}))
            assert page["total"] == 450 and page["sections"] == ["facts", "tasks"]
            seen += [(e["section"], e["key"]) for e in page["entries"]]
            pages += 1
            cursor = page["next"]
            if cursor is None:
                break
        assert pages == 3 and seen == sorted(seen) and len(set(seen)) == 450
        first = (await _json(client, f"/api/boards/{unique}/entries", limit=1))["entries"][0]
        assert set(first) >= {"section", "key", "revision", "author", "created_at", "tags", "metadata",
                              "content_type", "size", "preview"}
        assert first["author"] == f"writer-{unique}" and first["tags"] == ["t"] and first["preview"] == '{"i":0}'
        facts = await _json(client, f"/api/boards/{unique}/entries", section="facts", limit=500)
        assert facts["total"] == 150 and {e["section"] for e in facts["entries"]} == {"facts"}
        prefixed = await _json(client, f"/api/boards/{unique}/entries", section="tasks", prefix="k00")
        assert [e["key"] for e in prefixed["entries"]] == [f"k{i:04d}" for i in range(100) if i % 3]
        for bad in ({"limit": 0}, {"limit": "x"}, {"cursor": "!!"}):
            response = await client.get(f"/api/boards/{unique}/entries", params=bad)
            assert response.status_code == 400 and response.json()["type"] == "InvalidPayloadError", bad
        missing = await client.get(f"/api/boards/{unique}/entry/tasks/nope")
        assert missing.status_code == 404 and missing.json()["type"] == "NotFoundError"
        assert (await client.get("/api/nothing")).status_code == 404


@pytest.mark.asyncio
async def test_a_write_arrives_on_the_event_stream(pg_settings: Settings, unique: str, start_worker: Any) -> None:
    await start_worker(pg_settings, name=f"w{unique}", embed=False)
    async with Agent.connect(f"writer-{unique}", settings=pg_settings) as writer:
        board = writer.board(unique)
        await board.put("notes", "first", 1)
        async with inspecting(pg_settings, f"member-{unique}") as (server, client):
            async with EventStream(client, f"/api/boards/{unique}/events") as stream:
                revision = await board.put("notes", "live", {"state": "new"})
                _, event = await stream.next("entry")
                assert event == {**event, "op": "put", "section": "notes", "key": "live", "revision": revision,
                                 "author": f"writer-{unique}", "preview": '{"state":"new"}'}
                await board.put("notes", "live", {"state": "changed"})
                _, event = await stream.next("entry")
                assert (event["op"], event["preview"]) == ("put", '{"state":"changed"}')
                await board.delete("notes", "live")
                _, event = await stream.next("entry")
                assert (event["op"], event["key"]) == ("delete", "live")
                page = await _json(client, f"/api/boards/{unique}/entries")
                assert [e["key"] for e in page["entries"]] == ["first"]
                feed = await server.inspector.feeds.feed(unique)
                assert feed.listening == 1
            # The stream's listener goes with its client (the server sees the connection close).
            for _ in range(300):  # at most 15 s
                if not feed.listening:
                    break
                await asyncio.sleep(0.05)
            assert feed.listening == 0


@pytest.mark.asyncio
async def test_history_and_as_of_show_the_values_of_their_revisions(pg_settings: Settings, unique: str,
                                                                     start_worker: Any) -> None:
    worker = await start_worker(pg_settings, name=f"w{unique}", embed=False)
    async with Agent.connect(f"writer-{unique}", settings=pg_settings) as writer:
        board = writer.board(unique)
        r1 = await board.put("plan", "goal", {"v": 1})
        r2 = await board.put("plan", "goal", {"v": 2})
        other = await board.put("plan", "other", "text value")
        r3 = await board.put("plan", "goal", {"v": 3})
        await board.delete("plan", "other")
    await worker.wait_caught_up(60)
    async with inspecting(pg_settings, f"member-{unique}") as (_, client):
        history = await _json(client, f"/api/boards/{unique}/history/plan/goal")
        assert [(r["revision"], r["op"], r["value"]) for r in history["revisions"]] == \
            [(r1, "put", {"v": 1}), (r2, "put", {"v": 2}), (r3, "put", {"v": 3})]
        assert history["revisions"][0]["author"] == f"writer-{unique}"
        gone = await _json(client, f"/api/boards/{unique}/history/plan/other")
        assert [(r["op"], r["value"]) for r in gone["revisions"]] == [("put", "text value"), ("delete", None)]
        assert gone["revisions"][0]["value_kind"] == "text"

        def values(state: dict[str, Any]) -> dict[str, Any]:
            return {e["key"]: e["value"] for e in state["entries"]}

        assert values(await _json(client, f"/api/boards/{unique}/asof", revision=r1)) == {"goal": {"v": 1}}
        at_other = await _json(client, f"/api/boards/{unique}/asof", revision=other)
        assert values(at_other) == {"goal": {"v": 2}, "other": "text value"} and at_other["revision"] == other
        assert values(await _json(client, f"/api/boards/{unique}/asof", revision=r3 + 1)) == {"goal": {"v": 3}}
        latest = await _json(client, f"/api/boards/{unique}/entry/plan/goal")
        assert (latest["revision"], latest["value"]) == (r3, {"v": 3})
        older = await _json(client, f"/api/boards/{unique}/entry/plan/goal", revision=r2)
        assert older["value"] == {"v": 2}
        # Past the live state's revision: the live state (the board is open now), not a replay.
        replayed = await _json(client, f"/api/boards/{unique}/asof", revision=r3 + 1)
        live = await _json(client, f"/api/boards/{unique}/asof", revision=10**12)
        assert values(live) == values(replayed) == {"goal": {"v": 3}} and live["revision"] >= r3
        stored_at = history["revisions"][1]["stored_at"]
        assert values(await _json(client, f"/api/boards/{unique}/asof", at=stored_at))["goal"] == {"v": 2}
        for bad in ({}, {"revision": 1, "at": stored_at}, {"at": "yesterday"}):
            response = await client.get(f"/api/boards/{unique}/asof", params=bad)
            assert response.status_code == 400, bad


@pytest.mark.asyncio
async def test_a_vote_tally_moves_and_shows_the_outcome(pg_settings: Settings, unique: str,
                                                        start_worker: Any) -> None:
    await start_worker(pg_settings, name=f"w{unique}", embed=False)
    voters = [f"v1-{unique}", f"v2-{unique}", f"v3-{unique}"]
    async with contextlib.AsyncExitStack() as stack:
        agents = [await stack.enter_async_context(Agent.connect(v, settings=pg_settings)) for v in voters]
        board = agents[0].board(unique)
        await board.put("plan", "db", "undecided")
        handle = await board.propose("plan", "db", ["postgres", "sqlite"], policy="majority", voters=voters,
                                     question="which database?")
        client_cm = inspecting(pg_settings, f"member-{unique}")
        _, client = await stack.enter_async_context(client_cm)
        listed = (await _json(client, f"/api/boards/{unique}/votes"))["proposals"]
        assert [(p["id"], p["question"], p["options"], p["open"]) for p in listed] == \
            [(handle.id, "which database?", ["postgres", "sqlite"], True)]
        assert listed[0]["tally"]["votes"] == [0, 0] and listed[0]["policy"]["kind"] == "majority"
        stream = await stack.enter_async_context(EventStream(client, f"/api/boards/{unique}/events"))
        await asyncio.sleep(0)  # the stream's vote follower starts with it
        await agents[0].board(unique).vote(handle.id, "postgres", reason="it scales")
        _, event = await stream.next("vote")
        assert event["id"] == handle.id and event["tally"]["votes"] == [1, 0]
        assert [(b["voter"], b["choice"], b["reason"]) for b in event["ballots"]] == [(voters[0], 0, "it scales")]
        tally = (await _json(client, f"/api/boards/{unique}/votes"))["proposals"][0]["tally"]
        assert tally["votes"] == [1, 0]
        await agents[1].board(unique).vote(handle.id, "postgres", reason="we know it")
        outcome = await handle.outcome(timeout=30)
        assert outcome.status == "accepted"

        async def committed() -> dict[str, Any]:
            while True:
                _, event = await stream.next("vote")
                if event["committed_entry"] is not None:
                    return event

        event = await asyncio.wait_for(committed(), 30)
        assert event["open"] is False and event["outcome"]["status"] == "accepted"
        assert event["committed_entry"]["key"] == "db" and event["tally"]["votes"] == [2, 0]
        shown = (await _json(client, f"/api/boards/{unique}/votes"))["proposals"][0]
        assert shown["outcome"]["status"] == "accepted" and shown["committed_entry"] == event["committed_entry"]
        entry = await _json(client, f"/api/boards/{unique}/entry/plan/db")
        assert entry["value"] == "postgres" and entry["revision"] == event["committed_entry"]["revision"]


@pytest.mark.asyncio
async def test_search_messages_memory_and_system(pg_settings: Settings, unique: str, start_worker: Any) -> None:
    from tests._worker_helpers import HashProvider

    worker = await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider())
    me = f"member-{unique}"
    async with Agent.connect(f"writer-{unique}", settings=pg_settings) as writer:
        memory_id = await writer.remember("the deploy failed because of a schema migration", board=unique,
                                          kind="episodic")
        await writer.remember("pizza is served on fridays", board=unique)
        await writer.board(unique).put("notes", "lunch", "pizza friday")
        await writer.send(me, "status", {"text": "deploy is red"})
        await writer.send(f"other-{unique}", "chat", {"text": "not for the member"})
    await worker.wait_caught_up(60, embedded=True)
    async with inspecting(pg_settings, me) as (_, client):
        response = await client.post("/api/search", json={"query": "deploy schema", "mode": "hybrid", "top_k": 5,
                                                           "board": unique})
        assert response.status_code == 200, response.text
        hits = {h["id"]: h for h in response.json()["hits"]}
        hit = hits[memory_id]
        assert hit["agent"] == f"writer-{unique}" and hit["kind"] == "episodic" and hit["target"] == "memory"
        assert hit["score"] > 0 and hit["scores"]["keyword"] > 0 and "semantic" in hit["scores"]
        assert hit["valid_to"] is None and hit["archived_at"] is None  # its lifecycle
        keyword = (await client.post("/api/search", json={"query": "pizza", "mode": "keyword", "board": unique,
                                                          "filters": {"kinds": ["episodic"]}})).json()["hits"]
        assert [h["text"] for h in keyword] == ["pizza is served on fridays"]
        entries = (await client.post("/api/search", json={"query": "pizza", "mode": "keyword", "board": unique,
                                                          "target": "entries"})).json()["hits"]
        assert [(h["section"], h["key"], h["value"]) for h in entries] == [("notes", "lunch", "pizza friday")]
        for bad in ({"query": ""}, {"query": "x", "filters": {"nope": 1}}, {"query": "x", "top_k": 0},
                    {"query": "x", "mode": "fuzzy"}, {"query": "x", "target": "votes"}):
            refused = await client.post("/api/search", json=bad)
            assert refused.status_code == 400, (bad, refused.text)
        detail = await _json(client, f"/api/memory/{unique}/{memory_id}")
        assert detail["memory"]["id"] == memory_id and "versions" in detail and "sources" in detail
        assert (await client.get(f"/api/memory/{unique}/m-missing")).status_code in (400, 404)

        listed = (await _json(client, "/api/messages", agent=f"writer-{unique}"))["messages"]
        assert [(m["from"], m["to"], m["type"], m["kind"]) for m in listed] == \
            [(f"writer-{unique}", [me], "status", "direct")]
        assert "deploy is red" in listed[0]["preview"]
        assert (await _json(client, "/api/messages", type="chat"))["messages"] == []

        system = await _json(client, "/api/system")
        assert set(system) >= {"servers", "streams", "consumers", "worker_lag", "embedding_backlog", "dead_letters"}
        assert system["servers"]["connected"] and system["worker_lag"] == 0
        assert system["embedding_backlog"] == 0 and system["dead_letters"] == []


_PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                     "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")


@pytest.mark.asyncio
async def test_values_are_rendered_by_content_type(pg_settings: Settings, unique: str, start_worker: Any) -> None:
    await start_worker(pg_settings, name=f"w{unique}", embed=False)
    async with Agent.connect(f"writer-{unique}", settings=pg_settings) as writer:
        board = writer.board(unique)
        await board.attach("media", "logo", _PNG, content_type="image/png")
        await board.put("media", "raw", b"\x00\x01\x02", content_type="application/octet-stream")
        await board.put("media", "note", "# title", content_type="text/markdown")
        await board.put("media", "doc", {"a": [1, 2]})
        await board.put("media", "dir/file name?.txt#1", "any key")
    async with inspecting(pg_settings, f"member-{unique}") as (_, client):
        kinds = {}
        for key in ("logo", "raw", "note", "doc"):
            shown = await _json(client, f"/api/boards/{unique}/entry/media/{key}")
            kinds[key] = (shown["value_kind"], shown["object_url"] is not None)
            if key in ("logo", "raw"):
                data = await client.get(shown["object_url"])
                assert data.status_code == 200
                assert data.content == (_PNG if key == "logo" else b"\x00\x01\x02")
                assert data.headers["content-type"] == ("image/png" if key == "logo" else "application/octet-stream")
        assert kinds == {"logo": ("image", True), "raw": ("binary", True), "note": ("text", False),
                         "doc": ("json", False)}
        from urllib.parse import quote

        odd = "dir/file name?.txt#1"
        assert (await _json(client, f"/api/boards/{unique}/entry/media/{quote(odd, safe='')}"))["value"] == "any key"
        history = await _json(client, f"/api/boards/{unique}/history/media/{quote(odd, safe='')}")
        assert [r["value"] for r in history["revisions"]] == ["any key"]
        row = {e["key"]: e for e in (await _json(client, f"/api/boards/{unique}/entries"))["entries"]}
        assert row["logo"]["size"] == len(_PNG) and row["raw"]["size"] == 3


@pytest.mark.asyncio
async def test_only_the_names_of_this_address_are_answered(pg_settings: Settings, unique: str) -> None:
    async with inspecting(pg_settings, f"member-{unique}") as (server, client):
        assert server.host == "127.0.0.1" and server.port > 0
        assert (await client.get("/api/whoami", headers={"Host": f"localhost:{server.port}"})).status_code == 200
        # DNS rebinding: a page of another site that resolves its name to 127.0.0.1 is refused.
        assert (await client.get("/api/whoami", headers={"Host": "evil.example:80"})).status_code == 400
        for method in ("PUT", "DELETE", "PATCH"):
            assert (await client.request(method, "/api/boards")).status_code == 405


def test_the_public_names_are_pinned() -> None:
    import blackboard.apps.inspect as inspect

    assert set(inspect.__all__) == {
        "BOARDS_TTL", "DEFAULT_HOST", "DEFAULT_LIMIT", "DEFAULT_PORT", "MAX_LIMIT", "BoardAccess", "BoardFeed",
        "Feeds", "Inspector", "InspectorServer", "create_app", "entry_json", "error_response", "is_loopback",
        "preview_of", "proposal_json", "routes", "running_inspector", "sse", "static_dir", "value_json"}
    for name in inspect.__all__:
        assert hasattr(inspect, name), name


@pytest.mark.asyncio
async def test_the_operator_sees_the_streams_an_agent_may_not(pg_settings: Settings, unique: str,
                                                              start_worker: Any) -> None:
    from tests import _auth

    await start_worker(pg_settings, name=f"w{unique}", embed=False)
    async with Agent.connect(f"writer-{unique}", settings=pg_settings) as writer:
        await writer.board(unique).put("s", "k", 1)
    assert _auth.SESSION is not None
    async with running_inspector(pg_settings, "operator", credentials=_auth.SESSION.creds("operator"), port=0,
                                 warm=False, db=True) as server, \
            httpx2.AsyncClient(base_url=server.url.rstrip("/"), timeout=30) as client:
        assert (await _json(client, "/api/whoami"))["agent"] == "operator"
        assert unique in (await _json(client, "/api/boards"))["boards"]
        assert (await _json(client, f"/api/boards/{unique}/entries"))["total"] == 1
        system = await _json(client, "/api/system")
        assert {"BB_VOTE", "BB_MSG", "BB_MEMORY"} <= {s["name"] for s in system["streams"]}
        assert isinstance(system["consumers"], list) and system["worker_lag"] is not None
        assert set(system["database"]) == {"dead_letters_by_stream", "dead_letter_reasons", "embedding_queue"}
    async with inspecting(pg_settings, f"member-{unique}") as (_, client):
        system = await _json(client, "/api/system")
        assert "error" in system["streams"] and system["servers"]["version"]


@pytest.mark.asyncio
async def test_the_least_recently_used_board_is_closed_beyond_the_limit(pg_settings: Settings, unique: str,
                                                                       start_worker: Any) -> None:
    from blackboard.apps.inspect import Feeds

    async with Agent.connect(f"member-{unique}", settings=pg_settings) as agent:
        for name in ("a", "b", "c"):
            await agent.board(f"{unique}-{name}").put("s", "k", name)
        feeds = Feeds(agent, limit=2)
        try:
            first = await feeds.feed(f"{unique}-a")
            async with first.listen():  # a board with a listener stays open
                await feeds.feed(f"{unique}-b")
                await feeds.feed(f"{unique}-c")
                assert await feeds.feed(f"{unique}-a") is first
            third = await feeds.feed(f"{unique}-c")
            await feeds.feed(f"{unique}-b")
            assert await feeds.feed(f"{unique}-c") is third  # used more recently than a
            again = await feeds.feed(f"{unique}-a")
            assert again is not first and again.view.value("s", "k") == "a"
        finally:
            await feeds.aclose()
