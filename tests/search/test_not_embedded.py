"""A memory stored but not embedded yet: what each search mode does with it (docs/search.md,
"Not embedded yet")."""

from __future__ import annotations

import pytest

from agents_sdk import Agent
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.devstack import EmbeddedPostgres
from blackboard.settings import Settings
from tests._worker_helpers import HashProvider, fresh_db, remember, running_worker, worker_settings
from tests.conftest import make_settings

pytestmark = pytest.mark.asyncio


async def test_a_stored_memory_without_a_vector_is_found_by_keyword_and_hybrid_only(
        pg_settings: Settings, postgres_server: EmbeddedPostgres, unique: str) -> None:
    base = make_settings(pg_settings.nats.url, fresh_db(postgres_server, unique))
    # Without neighbour smoothing, so that the fused scores are the convex combination alone.
    own = base.model_copy(update={"search": base.search.model_copy(update={"neighbour_weight": 0.0})})
    model = f"hash-ne-{unique}"
    nc = await connect_nats(own.nats, name="not-embedded")
    js = nc.jetstream()
    await ensure_streams(js, own)
    await remember(js, unique, "alice", f"{unique}-a", "the falcon nests on the cliff")
    await remember(js, unique, "alice", f"{unique}-c", "a falcon was seen near the old harbour wall today")
    # A worker that embeds stores and embeds the first memory ...
    async with running_worker(worker_settings(own, name=f"a{unique}", serve_search=False),
                              provider=HashProvider(32, model)) as w:
        await w.wait_caught_up(30, embedded=True)
    await remember(js, unique, "alice", f"{unique}-b", "the falcon hunts at dusk")
    await nc.close()
    # ... one that does not embed (but answers searches in the same model's space) stores the second.
    async with running_worker(worker_settings(own, name=f"b{unique}", embed=False),
                              query_provider=HashProvider(32, model)) as w:
        await w.wait_caught_up(30)
        async with Agent.connect(f"{unique}-r", settings=own) as agent:
            query = "falcon"
            semantic = await agent.recall(query, mode="semantic", board=unique, top_k=10)
            keyword = await agent.recall(query, mode="keyword", board=unique, top_k=10)
            hybrid = await agent.recall(query, mode="hybrid", board=unique, top_k=10)
    a, b, c = f"{unique}-a", f"{unique}-b", f"{unique}-c"
    assert {h.id for h in semantic} == {a, c}  # no vector: semantic search cannot see b
    assert {h.id for h in keyword} == {a, b, c}  # keyword search sees it as soon as it is stored
    by_id = {h.id: h for h in hybrid}
    assert set(by_id) == {a, b, c}  # hybrid finds it through its words
    assert set(by_id[a].scores) == set(by_id[c].scores) == {"semantic", "keyword"}
    assert set(by_id[b].scores) == {"keyword"}  # no semantic score is reported for it
    # Its semantic score counts as the lowest of the candidates' (normalised: 0), so its fused
    # score is the keyword share of its normalised BM25 alone, as for the candidate that has
    # that lowest cosine.
    assert by_id[a].scores["semantic"] != pytest.approx(by_id[c].scores["semantic"])
    low = min((a, c), key=lambda i: by_id[i].scores["semantic"])
    kw = {i: h.scores["keyword"] for i, h in by_id.items()}
    lo, hi = min(kw.values()), max(kw.values())
    share = own.search.keyword_weight / (own.search.semantic_weight + own.search.keyword_weight)
    assert by_id[b].score == pytest.approx(share * (kw[b] - lo) / (hi - lo), abs=1e-6)
    assert by_id[low].score == pytest.approx(share * (kw[low] - lo) / (hi - lo), abs=1e-6)
