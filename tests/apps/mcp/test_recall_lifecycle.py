"""memory_recall's lifecycle arguments (include_superseded, include_archived, as_of, known_at,
event time, min_confidence) reach the search, and its hits carry the lifecycle (over HTTP; the
tools are the same over stdio)."""

from __future__ import annotations

import psycopg
import pytest

from blackboard.devstack import EmbeddedPostgres
from blackboard.settings import Settings
from tests._worker_helpers import HashProvider, StartWorker, fresh_db, worker_settings
from tests.apps.mcp.conftest import McpConnect, call
from tests.conftest import make_settings


@pytest.mark.asyncio
async def test_memory_recall_takes_the_lifecycle_filters(mcp_http_connect: McpConnect, settings: Settings,
                                                         postgres_server: EmbeddedPostgres,
                                                         start_worker: StartWorker, unique: str) -> None:
    base = make_settings(settings.nats.url, fresh_db(postgres_server, unique))
    # Consolidation off: the rows stay as written and closed below.
    own = base.model_copy(update={"memory": base.memory.model_copy(update={"near_duplicates": False})})
    worker = await start_worker(worker_settings(own, batch_wait=0.02), name=f"w{unique}", provider=HashProvider())
    async with mcp_http_connect(f"agent-{unique}") as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        props = tools["memory_recall"].input_schema["properties"]
        assert {"include_superseded", "include_archived", "as_of", "known_at", "occurred_after",
                "occurred_before", "min_confidence"} <= set(props)
        b = {"board": unique}
        old = await call(session, "memory_remember", text="sku one costs ten euros", kind="semantic", **b,
                         key="price:sku-1", occurred_at="2026-01-01T00:00:00Z", confidence=0.9)
        new = await call(session, "memory_remember", text="sku one now costs twelve euros", kind="semantic", **b,
                         key="price:sku-1", occurred_at="2026-02-01T00:00:00Z", confidence=0.4)
        await worker.wait_caught_up(60, embedded=True)
        # Close the older version as supersession does (so the test does not depend on its timing).
        with psycopg.connect(own.postgres.dsn.get_secret_value(), autocommit=True) as conn:
            conn.execute("UPDATE bb_memories SET valid_to = '2026-02-01T00:00:00Z', superseded_by = %s "
                         "WHERE id = %s", (new["id"], old["id"]))

        async def ids(**args: object) -> list[str]:
            hits = (await call(session, "memory_recall", query="sku costs euros", mode="keyword", **b,
                               **args))["hits"]
            return sorted(h["id"] for h in hits)

        assert await ids() == [new["id"]]
        assert await ids(include_superseded=True) == sorted([old["id"], new["id"]])
        assert await ids(as_of="2026-01-15T00:00:00Z") == [old["id"]]
        assert await ids(occurred_before="2026-01-15T00:00:00Z", include_superseded=True) == [old["id"]]
        assert await ids(min_confidence=0.5, include_superseded=True) == [old["id"]]
        assert await ids(include_archived=True) == [new["id"]]
        hit = (await call(session, "memory_recall", query="sku", mode="keyword", include_superseded=True,
                          as_of="2026-01-15T00:00:00Z", **b))["hits"][0]
        assert (hit["key"], hit["superseded_by"], hit["confidence"]) == ("price:sku-1", new["id"], 0.9)
        # An instant without an offset is refused, as a tool error.
        result = await session.call_tool("memory_recall", {"query": "sku", **b, "as_of": "2026-01-15T00:00:00"})
        assert result.is_error
