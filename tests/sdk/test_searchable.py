"""remember(..., wait="searchable"): returns once a worker has stored and embedded the memory,
so that semantic recall finds it; a typed timeout when no worker embeds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import numpy as np
import pytest

from agents_sdk import Agent, MemoryInput, NotSearchableError, OperationTimeoutError
from blackboard.settings import Settings
from tests._worker_helpers import HashProvider, StartWorker

pytestmark = pytest.mark.asyncio

#: How long the slow model takes per batch: longer than a plain remember and recall.
_DELAY = 0.6


class _SlowProvider(HashProvider):
    """A hash provider that takes a while per batch (a busy model)."""

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        await asyncio.sleep(_DELAY)
        return await super().embed(texts)


async def test_remember_waits_until_semantic_recall_finds_the_memory(
        pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    model = f"slow-{unique}"
    await start_worker(pg_settings, name=f"w{unique}", provider=_SlowProvider(32, model),
                       query_provider=HashProvider(32, model))
    async with Agent.connect(f"{unique}-a", settings=pg_settings) as agent:
        # the default returns at once: not found by semantic search yet
        first = await agent.remember(f"the {unique} kestrel hovers over the meadow", board=unique)
        assert first not in {h.id for h in await agent.recall("kestrel hovers meadow", mode="semantic",
                                                              board=unique, top_k=50)}
        t0 = time.monotonic()
        mid = await agent.remember(f"the {unique} heron waits by the river", board=unique, wait="searchable",
                                   timeout=30)
        assert time.monotonic() - t0 >= _DELAY * 0.9  # it waited for the model
        assert mid in {h.id for h in await agent.recall("heron waits river", mode="semantic",
                                                        board=unique, top_k=50)}
        ids = await agent.remember_many([MemoryInput(f"the {unique} owl {i} calls at night", board=unique)
                                         for i in range(5)], wait="searchable")
        found = {h.id for h in await agent.recall("owl calls at night", mode="semantic", board=unique,
                                                  top_k=50)}
        assert set(ids) <= found
        board = agent.board(unique)
        other = await board.remember(f"the {unique} wren sings", wait="searchable")
        assert other in {h.id for h in await agent.recall("wren sings", mode="semantic", board=unique)}
        # and a wait on ids written earlier (the first one is embedded by now, or soon)
        await agent.wait_searchable([first], board=unique, timeout=30)
        assert first in {h.id for h in await agent.recall("kestrel hovers meadow", mode="semantic",
                                                          board=unique, top_k=50)}


async def test_remember_times_out_with_what_is_missing_when_no_worker_embeds(
        pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    await start_worker(pg_settings, name=f"w{unique}", embed=False,
                       query_provider=HashProvider(32, f"none-{unique}"))
    async with Agent.connect(f"{unique}-a", settings=pg_settings) as agent:
        t0 = time.monotonic()
        with pytest.raises(NotSearchableError) as caught:
            await agent.remember(f"the {unique} lark rises", board=unique, wait="searchable", timeout=1.0)
        assert 1.0 <= time.monotonic() - t0 < 5
        err = caught.value
        assert isinstance(err, OperationTimeoutError) and err.timeout == 1.0
        assert err.unstored == [] and len(err.unembedded) == 1  # stored by the worker, never embedded
        assert "not embedded" in str(err)
        mid = err.unembedded[0]
        hits = await agent.recall("lark rises", mode="keyword", board=unique)
        assert [h.id for h in hits] == [mid]  # written all the same, and keyword search finds it
        # an id no one wrote is reported as not stored
        with pytest.raises(NotSearchableError) as never:
            await agent.wait_searchable([f"{unique}-nothing"], board=unique, timeout=0.3)
        assert never.value.unstored == [f"{unique}-nothing"] and never.value.unembedded == []



async def test_a_service_without_an_embedding_model_refuses_searchable(pg_settings: Settings, unique: str) -> None:
    """No memory ever becomes searchable by every mode where no model embeds: an error, not a wait."""
    from blackboard.db import migrate, open_pool
    from blackboard.protocol.errors import SearchError
    from blackboard.protocol.schemas.search import SearchableItem, SearchableRequest
    from blackboard.search.engine import SearchEngine

    await migrate(pg_settings)
    async with open_pool(pg_settings.postgres) as pool:
        engine = SearchEngine(pool, None, pg_settings.search)
        with pytest.raises(SearchError, match="embedding provider"):
            await engine.searchable(SearchableRequest(board=unique, items=[SearchableItem(id="m")]))


async def test_remember_refuses_an_unknown_wait_before_writing(settings: Settings, unique: str) -> None:
    from blackboard.protocol.errors import InvalidPayloadError
    from tests.conftest import stored_memories

    async with Agent.connect(f"{unique}-a", settings=settings) as agent:
        with pytest.raises(InvalidPayloadError, match="wait"):
            await agent.remember("x", board=unique, wait="embedded")  # type: ignore[arg-type]
        with pytest.raises(InvalidPayloadError, match="wait"):
            await agent.remember_many([MemoryInput("y", board=unique)], wait="soon")  # type: ignore[arg-type]
    assert await stored_memories(settings.nats.url, unique) == []
