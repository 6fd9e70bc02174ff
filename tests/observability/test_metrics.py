"""The worker's ``/metrics`` (docs/observability.md, "Metrics"): Prometheus text on a
registry of the worker's own, whose values move as work happens."""

from __future__ import annotations

import json
import logging
import re
from datetime import timedelta
from pathlib import Path

import pytest

from agents_sdk.search import SearchClient
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.observability.metrics import WorkerMetrics, dead_letter_reason
from blackboard.protocol.schemas import Policy
from blackboard.protocol.subjects import MEMORY_STREAM, Subjects
from blackboard.settings import Settings
from tests._committer import connect_agent
from tests._worker_helpers import (
    HashProvider,
    StartWorker,
    board_memories_handler,
    publish_signed,
    remember,
)
from tests.observability._probe import metrics, sample, until

_async = pytest.mark.asyncio


@pytest.mark.parametrize(("reason", "label"), [
    ("signature bad_signature: signed by 'a' (agent, key U...)", "signature_bad_signature"),
    ("signature unsigned: the record carries no signature (worker.require_signatures)", "signature_unsigned"),
    ("unexpected KeyError while decoding: 'x'", "unexpected"),
    ("refused by PostgreSQL: value too long", "refused"),
    ("payload is not valid msgpack", "invalid"),
])
def test_dead_letter_reasons_are_a_bounded_label(reason: str, label: str) -> None:
    assert dead_letter_reason(reason) == label


def test_each_worker_has_a_registry_of_its_own() -> None:
    one, two = WorkerMetrics(), WorkerMetrics()  # the same names twice: no clash
    one.ingested("BB_MEMORY", 3, 2, ["not valid"], 0.01)
    assert b'blackboard_ingest_messages_total{stream="BB_MEMORY"} 3.0' in one.render()
    assert b"blackboard_ingest_messages_total{" not in two.render()


@_async
async def test_a_write_and_a_poison_message_move_the_counters(pg_settings: Settings, start_worker: StartWorker,
                                                              unique: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="blackboard.worker.ingest")
    worker = await start_worker(pg_settings, name=f"w{unique}", embed=False, serve_search=False,
                                handlers=[board_memories_handler(pg_settings, unique)])
    consumer = worker.loops[0].durable
    before = await metrics(worker)
    assert sample(before, "blackboard_consumer_pending", stream=MEMORY_STREAM, consumer=consumer) == 0
    assert sample(before, "blackboard_stream_consumers", stream=MEMORY_STREAM) >= 1
    assert sample(before, "blackboard_account_consumers") >= 1
    assert sample(before, "blackboard_nats_connected") == 1
    nc = await connect_nats(pg_settings.nats, name="test-metrics")
    try:
        js = nc.jetstream()
        await ensure_streams(js, pg_settings)
        await remember(js, unique, "alice", f"{unique}-1", "a memory that is counted")

        async def ingested() -> bool:
            return sample(await metrics(worker), "blackboard_ingest_rows_total", stream=MEMORY_STREAM) == 1

        await until(ingested, 20, "the ingest counter")
        samples = await metrics(worker)
        assert sample(samples, "blackboard_ingest_messages_total", stream=MEMORY_STREAM) == 1
        assert sample(samples, "blackboard_ingest_batch_seconds_count", stream=MEMORY_STREAM) >= 1
        assert sample(samples, "blackboard_dead_letters_total", stream=MEMORY_STREAM, reason="invalid") == 0

        seq = await publish_signed(js, "alice", Subjects.memory(unique, "alice"), b"\xc1 not a record")

        async def dead_lettered() -> bool:
            samples = await metrics(worker)
            return sample(samples, "blackboard_dead_letters_total", stream=MEMORY_STREAM, reason="invalid") == 1

        await until(dead_lettered, 20, "the dead-letter counter")
        samples = await metrics(worker)
        assert sample(samples, "blackboard_ingest_messages_total", stream=MEMORY_STREAM) == 2
        assert sample(samples, "blackboard_ingest_rows_total", stream=MEMORY_STREAM) == 1
    finally:
        await nc.close()
    # The dead letter's log line names its sequence and reason.
    lines = [r.getMessage() for r in caplog.records if r.name == "blackboard.worker.ingest"]
    assert any(f"dead-lettered, e.g. seq {seq}: " in line for line in lines), lines


@_async
async def test_a_search_is_timed_by_endpoint_and_mode(pg_settings: Settings, start_worker: StartWorker,
                                                      unique: str) -> None:
    worker = await start_worker(pg_settings, name=f"w{unique}", embed=False, provider=HashProvider(),
                                handlers=[board_memories_handler(pg_settings, unique)])
    nc = await connect_nats(pg_settings.nats, name="test-metrics-search")
    try:
        client = SearchClient(nc, pg_settings, "tester")
        # Every worker of the server shares the search requests: ask until this one answered.
        for _ in range(50):
            await client.recall("anything", board=unique, mode="keyword")
            timed = sample(await metrics(worker), "blackboard_search_seconds_count", endpoint="memories",
                           mode="keyword")
            if timed:
                break
        assert timed >= 1
        assert sample(await metrics(worker), "blackboard_search_seconds_bucket", endpoint="memories", mode="keyword",
                      le="+Inf") == timed
    finally:
        await nc.close()


_DOCS = Path(__file__).resolve().parents[2] / "docs"


def _exposed_names() -> set[str]:
    """The names of every metric a worker exposes (counters with ``_total``)."""
    return {family.name + ("_total" if family.type == "counter" else "")
            for family in WorkerMetrics().registry.collect()}


def test_every_metric_is_documented() -> None:
    doc = (_DOCS / "observability.md").read_text()
    missing = sorted(name for name in _exposed_names() if f"| `{name}` |" not in doc)
    assert not missing, f"docs/observability.md's table lacks {missing}"


def test_the_example_dashboard_queries_metrics_that_exist() -> None:
    dashboard = json.loads((_DOCS / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = {name for expr in exprs for name in re.findall(r"\bblackboard_[a-z_]+", expr)}
    suffixes = ("_bucket", "_count", "_sum")
    known = _exposed_names()
    assert used and all(name in known or (name.endswith(suffixes) and name.rsplit("_", 1)[0] in known)
                        for name in used), sorted(used - known)


@_async
async def test_embedding_and_a_vote_at_its_deadline_move_their_metrics(pg_settings: Settings,
                                                                        start_worker: StartWorker,
                                                                        unique: str) -> None:
    worker = await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider(), serve_search=False,
                                handlers=[board_memories_handler(pg_settings, unique)])
    before = await metrics(worker)
    embedded = sample(before, "blackboard_embedded_items_total")
    commits = sample(before, "blackboard_vote_commits_total")
    expiries = sample(before, "blackboard_vote_deadline_expiries_total")
    assert ("blackboard_embedding_backlog", frozenset({("stage", "queue")})) in before
    nc = await connect_nats(pg_settings.nats, name="test-metrics-embed")
    agent = await connect_agent(f"a{unique}", pg_settings)
    try:
        js = nc.jetstream()
        await ensure_streams(js, pg_settings)
        await remember(js, unique, "alice", f"{unique}-1", "a memory to embed")
        board = agent.board(unique)
        proposal = await board.propose("s", "k", ["x"], voters=[agent.id, "other"], policy=Policy(quorum=2),
                                       deadline=timedelta(seconds=0.5))
        await board.vote(proposal.id, "x")
        outcome = await proposal.outcome(timeout=15)
        assert outcome.closed_by == "deadline"

        async def moved() -> bool:
            now = await metrics(worker)
            return (sample(now, "blackboard_embedded_items_total") > embedded
                    and sample(now, "blackboard_vote_commits_total") > commits
                    and sample(now, "blackboard_vote_deadline_expiries_total") > expiries)

        await until(moved, 20, "the embedding and vote counters")
    finally:
        await agent.close()
        await nc.close()


def test_public_names_are_pinned() -> None:
    import blackboard.observability as package
    from blackboard.observability import health, logs
    from blackboard.observability import metrics as metrics_module

    assert set(package.__all__) == {"TEXT_FORMAT", "JsonFormatter", "configure_logging", "progress_enabled",
                                    "tracing"}
    assert set(logs.__all__) == {"TEXT_FORMAT", "JsonFormatter", "configure_logging", "progress_enabled"}
    assert set(metrics_module.__all__) == {"METRICS_CONTENT_TYPE", "WorkerMetrics", "dead_letter_reason"}
    assert set(health.__all__) == {"ObservabilityServer", "Readiness"}
    for module in (package, logs, metrics_module, health):
        for name in module.__all__:
            assert hasattr(module, name), (module.__name__, name)
