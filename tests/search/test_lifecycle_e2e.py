"""Recall of versions written through remember, end to end (docs/memory-lifecycle.md,
"Retrieval"): the worker settles a key's versions, the search service filters them.

(A module of its own: the module-scoped worker of test_lifecycle_filters.py, on another
database, would answer some of its searches.)"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from agents_sdk import Agent
from blackboard.devstack import EmbeddedPostgres
from tests._worker_helpers import (
    HashProvider,
    board_memories_handler,
    drop_db,
    fresh_db,
    running_worker,
    worker_settings,
)
from tests.conftest import make_settings


def t(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.asyncio
async def test_recall_of_versions_written_through_remember(nats_server: Any, postgres_server: EmbeddedPostgres,
                                                           unique: str) -> None:
    """End to end: versions of a key written with remember (one of them a late report of an older
    price) are settled by the worker; recall finds the current one by default, every one on
    request, the one valid at an instant with as_of, and agent.memory lists them in valid-time order."""
    s = make_settings(nats_server.url, fresh_db(postgres_server, f"lce{unique}"))
    board, key = unique, "price:shop.example.com:sku-1"
    try:
        async with running_worker(worker_settings(s, name=f"lce{unique}", batch_wait=0.02),
                                  handlers=[board_memories_handler(s, board)], provider=HashProvider()), \
                Agent.connect(f"{unique}-w", settings=s) as agent:
            ten = await agent.remember("sku one costs ten euros", kind="semantic", board=board, key=key,
                                       occurred_at=t("2025-02-01"), wait="searchable")
            twelve = await agent.remember("sku one costs twelve euros", kind="semantic", board=board, key=key,
                                          occurred_at=t("2025-03-01"), confidence=0.9, wait="searchable")
            eight = await agent.remember("sku one costs eight euros", kind="semantic", board=board, key=key,
                                         occurred_at=t("2025-01-01"), wait="searchable")  # late, and oldest
            other = await agent.remember("the shop opens at nine", kind="semantic", board=board,
                                         wait="searchable")

            async def ids(**filters: Any) -> set[str]:
                hits = await agent.recall("sku one costs euros", board=board, top_k=10, **filters)
                return {h.id for h in hits}

            assert await ids() == {twelve, other}
            assert await ids(include_superseded=True) == {eight, ten, twelve, other}
            assert await ids(as_of=t("2025-01-15")) == {eight}
            assert await ids(as_of=t("2025-02-15")) == {ten}
            assert await ids(min_confidence=0.5) == {twelve}
            detail = await agent.memory(ten, board=board)
            assert [v.id for v in detail.versions] == [eight, ten, twelve]
            assert [(v.valid_from, v.valid_to) for v in detail.versions] == [
                (t("2025-01-01"), t("2025-02-01")), (t("2025-02-01"), t("2025-03-01")), (t("2025-03-01"), None)]
            assert detail.memory.superseded_by == twelve
    finally:
        drop_db(postgres_server, f"lce{unique}")
