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

pytestmark = pytest.mark.asyncio


@contextlib.asynccontextmanager
async def inspecting(settings: Settings, agent_id: str) -> AsyncIterator[tuple[InspectorServer, httpx2.AsyncClient]]:
    async with running_inspector(settings, agent_id, port=0) as server, \
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
        name, _ = await self.next("ready")
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
    async with inspecting(pg_settings, f"member-{unique}") as (_, member):
        assert unique in (await _json(member, "/api/boards"))["boards"]
        entry = await _json(member, f"/api/boards/{unique}/entry/notes/a")
        assert entry["value"] == {"x": 1} and entry["value_kind"] == "json" and entry["author"] == f"writer-{unique}"
