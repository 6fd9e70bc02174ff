"""The inspector on a board it has not opened yet: the first pages come from the board's key
listing (each entry read and verified as a view reads it) while the live view loads, then from
the view, with the same rows, the revision that tells the page what it missed, and live events;
and memories of a board that holds no entry (not listed) read through the search service's own
rights check."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import pytest

from agents_sdk import Agent
from blackboard.settings import Settings
from tests.apps.inspect.test_api import EventStream, _json, inspecting


async def _all_pages(client: Any, path: str, **params: Any) -> tuple[list[dict[str, Any]], list[str]]:
    rows: list[dict[str, Any]] = []
    sources: list[str] = []
    cursor = None
    while True:
        page = await _json(client, path, **params, **({"cursor": cursor} if cursor else {}))
        rows += page["entries"]
        sources.append(page["source"])
        cursor = page["next"]
        if cursor is None:
            return rows, sources


def _same(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "stored_at": datetime.fromisoformat(row["stored_at"]).replace(microsecond=0)}


@pytest.mark.asyncio
async def test_a_cold_board_is_paged_from_its_key_listing_then_from_its_view(pg_settings: Settings, unique: str,
                                                                            start_worker: Any) -> None:
    await start_worker(pg_settings, name=f"w{unique}", embed=False)  # its system service lists the boards
    async with Agent.connect(f"writer-{unique}", settings=pg_settings) as writer:
        board = writer.board(unique)
        async with board.pipeline() as pipe:
            for i in range(60):
                await pipe.put("tasks" if i % 2 else "facts", f"k{i:03d}", {"i": i}, tags=["t"],
                               metadata={"n": i})
        await board.delete("facts", "k010")
        await board.put("tasks", "k011", {"i": 11, "changed": True})
        last = await board.delete("tasks", "k013")
        expected = sorted((("tasks" if i % 2 else "facts"), f"k{i:03d}") for i in range(60) if i not in (10, 13))
        async with inspecting(pg_settings, f"member-{unique}") as (server, client):
            path = f"/api/boards/{unique}/entries"
            first = await _json(client, path, limit=25)
            assert first["source"] == "listing"  # (its view loads in the background from now on)
            assert first["total"] == 58 and first["sections"] == ["facts", "tasks"] and first["revision"] == last
            assert [(e["section"], e["key"]) for e in first["entries"]] == expected[:25]
            assert all(e["verdict"] == "verified" and e["author"] == f"writer-{unique}" for e in first["entries"])
            listed, _ = await _all_pages(client, path, limit=25)
            assert [(e["section"], e["key"]) for e in listed] == expected
            rows = {e["key"]: e for e in listed}
            assert rows["k011"]["preview"] == '{"i":11,"changed":true}' and rows["k011"]["metadata"] == {}
            assert rows["k012"]["preview"] == '{"i":12}' and rows["k012"]["metadata"] == {"n": 12}
            assert rows["k012"]["tags"] == ["t"]
            # The view loads in the background; then it answers, with the very same rows.
            for _ in range(600):  # at most 30 s
                if server.inspector.feeds.opened(unique) is not None:
                    break
                await asyncio.sleep(0.05)
            viewed, sources = await _all_pages(client, path, limit=25)
            assert set(sources) == {"view"}
            # (stored_at: a direct get and a consumer's delivery round the server's nanoseconds apart)
            assert [_same(e) for e in viewed] == [_same(e) for e in listed]
            section = await _json(client, path, section="tasks", prefix="k01")
            assert [e["key"] for e in section["entries"]] == ["k011", "k015", "k017", "k019"]
            assert section["source"] == "view" and section["revision"] == last

        # A write after the first page: the stream's first event names a later revision (the
        # page reloads), and later writes arrive live.
        async with inspecting(pg_settings, f"member-{unique}") as (server, client):
            page = await _json(client, f"/api/boards/{unique}/entries", limit=5)
            assert page["source"] == "listing" and page["revision"] == last
            moved = await board.put("facts", "late", "after the first page")
            async with EventStream(client, f"/api/boards/{unique}/events") as stream:
                feed = server.inspector.feeds.opened(unique)
                assert feed is not None
                for _ in range(600):
                    if feed.view.revision >= moved:
                        break
                    await asyncio.sleep(0.05)
                again = await _json(client, f"/api/boards/{unique}/entries", prefix="late")
                assert again["source"] == "view" and again["revision"] == moved
                assert [(e["section"], e["key"]) for e in again["entries"]] == [("facts", "late")]
                revision = await board.put("tasks", "live", "now")
                _, event = await stream.next("entry")
                if event["key"] == "late":  # it reached the loading view after the stream's start
                    _, event = await stream.next("entry")
                assert (event["op"], event["key"], event["revision"]) == ("put", "live", revision)


@pytest.mark.asyncio
async def test_an_entry_of_a_cold_board_is_read_without_loading_its_view(pg_settings: Settings, unique: str,
                                                                        start_worker: Any) -> None:
    await start_worker(pg_settings, name=f"w{unique}", embed=False)
    async with Agent.connect(f"writer-{unique}", settings=pg_settings) as writer:
        await writer.board(unique).put("notes", "a", {"x": 1})
    async with inspecting(pg_settings, f"member-{unique}") as (server, client):
        entry = await _json(client, f"/api/boards/{unique}/entry/notes/a")
        assert entry["value"] == {"x": 1} and entry["verdict"] == "verified"
        assert server.inspector.feeds.opened(unique) is None
        assert (await client.get(f"/api/boards/{unique}/entry/notes/missing")).status_code == 404


@pytest.mark.asyncio
async def test_the_memories_of_a_board_without_entries_are_read_with_the_identitys_rights(
        pg_settings: Settings, unique: str, start_worker: Any) -> None:
    from tests._worker_helpers import HashProvider

    worker = await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider())
    board = f"{unique}-mem"
    async with Agent.connect(f"writer-{unique}", settings=pg_settings) as writer:
        memory_id = await writer.remember("the staging cluster runs on spot instances", board=board)
    await worker.wait_caught_up(60, embedded=True)
    async with inspecting(pg_settings, f"member-{unique}") as (_, client):
        detail = await _json(client, f"/api/memory/{board}/{memory_id}")
        assert detail["memory"]["id"] == memory_id and detail["memory"]["board"] == board
        response = await client.post("/api/search", json={"query": "staging spot", "mode": "keyword",
                                                           "board": board})
        assert response.status_code == 200, response.text
        assert [h["id"] for h in response.json()["hits"]] == [memory_id]
        assert (await client.get(f"/api/memory/{board}/m-missing")).status_code in (400, 404)
        assert (await client.get("/api/memory/not.a.board/x")).status_code == 400
    async with inspecting(pg_settings, f"solo-{unique}") as (_, solo):
        refused = await solo.get(f"/api/memory/{board}/{memory_id}")
        assert refused.status_code == 403, refused.text
        assert refused.json()["type"] == "PermissionDeniedError"
        searched = await solo.post("/api/search", json={"query": "staging spot", "board": board})
        assert searched.status_code == 403, searched.text
