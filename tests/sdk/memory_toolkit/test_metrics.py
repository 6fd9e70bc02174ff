"""agent.memory.metrics(): retrieval latency percentiles, the recalled-then-used rate (mark_used,
or rendered by context then mark_step(success=True)), sizes and pruned counts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from agents_sdk import Agent
from agents_sdk.memory import LayerHit, MemoryMetrics
from agents_sdk.memory.metrics import LatencyStats, MetricsRecorder, percentile
from blackboard.settings import Settings


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 99), percentile(values, 100)) == (
        50.0, 95.0, 99.0, 100.0)
    assert percentile([], 50) == 0.0 and percentile([7.0], 99) == 7.0
    stats = LatencyStats.of([3.0, 1.0, 2.0])
    assert (stats.count, stats.p50, stats.p99, stats.max) == (3, 2.0, 3.0, 3.0)


def test_the_recorder_counts_used_only_among_recalled_and_keeps_a_window() -> None:
    rec = MetricsRecorder(window=16)
    for ms in range(40):
        rec.retrieval(float(ms))
        rec.retrieval(1.0, "short_term")
    rec.recalled(["a", "b", "c", "d"])
    rec.used(["a", "never-recalled"])
    rec.rendered(["e", "f"])  # put into a prompt: recalled
    rec.step(success=False)  # a failed step: not used
    rec.rendered(["f", "g"])
    rec.step(success=True)
    rec.step(success=True)  # nothing rendered since
    rec.cache(True)
    rec.cache(False)
    rec.cache(False)
    rec.pruned("long_term", 2)
    rec.pruned("working", 0)
    snap = rec.snapshot({"short_term_items": 3}, router_fallbacks=1)
    assert snap.latency.count == 16 and snap.latency.p50 == 31.0  # the newest 16: 24..39
    assert snap.latency_by_layer["short_term"].count == 16
    assert (snap.recalled, snap.used, round(snap.used_rate, 3)) == (7, 3, round(3 / 7, 3))  # a, f, g
    assert (snap.cache_hits, snap.cache_misses, round(snap.cache_hit_rate, 3)) == (1, 2, 0.333)
    assert snap.pruned == {"long_term": 2} and snap.router_fallbacks == 1
    data = snap.as_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["cache"] == {"hits": 1, "misses": 2, "hit_rate": 0.3333}
    assert MemoryMetrics().as_dict()["used_rate"] == 0.0


class _Notes:
    """A store kept in a list: what a test needs of the MemoryStore protocol."""

    kind = "notes"
    writable = True

    def __init__(self, name: str, texts: list[str]) -> None:
        self.name = name
        self.texts = texts

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def search(self, query: str, top_k: int, threshold: float) -> list[LayerHit]:
        return [LayerHit(layer=f"store:{self.name}", id=f"{self.name}-{i}", text=t, score=0.9, kind="note",
                         source=self.name, provenance={}) for i, t in enumerate(self.texts)
                if any(w in t for w in query.split())][:top_k]

    async def write(self, text: str, metadata: Mapping[str, Any] | None = None) -> str:
        self.texts.append(text)
        return f"{self.name}-{len(self.texts) - 1}"

    def size(self) -> int:
        return len(self.texts)


@pytest.mark.asyncio
async def test_agent_memory_metrics(settings: Settings, unique: str) -> None:
    local = settings.model_copy(update={"agent_memory": settings.agent_memory.model_copy(
        update={"layers": ["short_term", "working"]})})
    async with Agent.connect(f"{unique}-a", settings=local) as agent:
        memory = agent.memory
        empty = memory.metrics()
        assert (empty.recalled, empty.used, empty.used_rate, empty.latency.count) == (0, 0, 0.0, 0)
        assert empty.sizes == {"short_term_items": 0, "short_term_bytes": 0, "working_items": 0}
        await memory.write("the price is in span.price")
        await memory.write("the title is in h1")
        await memory.write("price selector found", layer="working", key="focus")
        hits = await memory.search("price")
        assert len(hits) == 2
        memory.mark_used([hits[0].id, "st:default:999"])
        after_search = memory.metrics()
        assert (after_search.recalled, after_search.used, after_search.used_rate) == (2, 1, 0.5)
        assert after_search.latency.count == 1
        assert set(after_search.latency_by_layer) == {"short_term", "working"}
        assert after_search.sizes["short_term_items"] == 2 and after_search.sizes["working_items"] == 1
        assert after_search.sizes["short_term_bytes"] == memory.short_term.nbytes > 0

        notes = _Notes(f"notes{unique[:8]}", ["the price of SKU-1 is 3", "shipping is free"])
        memory.attach(notes, write=True, stages=["gen"])
        rendered = await memory.context("gen", "price")
        assert [h.id for h in rendered.hits] == [f"{notes.name}-0"]
        memory.mark_step(success=False)  # rendered, but the step failed: not used
        assert memory.metrics().used == 1
        await memory.context("gen", "price")
        memory.mark_step(success=True)
        final = memory.metrics()
        assert (final.recalled, final.used) == (3, 2)
        assert final.latency_by_layer["context"].count == 2 and final.latency.count == 3
        await memory.after_turn("the price went up")
        assert memory.metrics().sizes[f"store:{notes.name}"] == 3
        await memory.prune(layer="short_term", strategy="max_per_board", threshold=1)
        assert memory.metrics().pruned == {"short_term": 1}
        assert json.loads(json.dumps(memory.metrics().as_dict()))["recalled"] == 3
