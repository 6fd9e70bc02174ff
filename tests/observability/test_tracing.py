"""Tracing (docs/observability.md, "Tracing"): a write's spans form one trace from the SDK
across JetStream to the worker's ingest, its PostgreSQL commit and its embedding; a search is a client span
in the SDK and a server span in the search service, in the same trace.

Spans go to OpenTelemetry's in-memory exporter through a tracer provider of the test's own
(:func:`blackboard.observability.tracing.enable`), not the global one.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from agents_sdk import Agent
from blackboard.observability import tracing
from blackboard.protocol.subjects import Header, Subjects
from blackboard.settings import Settings
from tests._auth import operator_nats
from tests._worker_helpers import HashProvider, StartWorker, count_rows, wait_for

_async = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()
        provider.shutdown()


def _one(exporter: InMemorySpanExporter, name: str, trace_id: int | None = None) -> ReadableSpan:
    found = [s for s in exporter.get_finished_spans()
             if s.name == name and (trace_id is None or s.context.trace_id == trace_id)]
    assert len(found) == 1, (name, [s.name for s in exporter.get_finished_spans()])
    return found[0]


def _has(exporter: InMemorySpanExporter, name: str, trace_id: int) -> bool:
    return any(s.name == name and s.context.trace_id == trace_id for s in exporter.get_finished_spans())


def _parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


@_async
async def test_a_board_put_is_one_trace_from_the_sdk_to_the_postgres_commit(
        spans: InMemorySpanExporter, pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    await start_worker(pg_settings, name=f"w{unique}", embed=False)
    async with Agent.connect(f"{unique}-a", settings=pg_settings) as agent:
        rev = await agent.board(f"b{unique}").put("notes", "k1", {"v": 1})
        put = _one(spans, "board.put")
        trace_id = put.context.trace_id
        await wait_for(lambda: _has(spans, "postgres commit", trace_id), 60, "the worker's spans")
    assert put.kind == SpanKind.PRODUCER
    assert put.attributes is not None
    assert (put.attributes["blackboard.board"], put.attributes["blackboard.section"], put.attributes["blackboard.key"]) == \
        (f"b{unique}", "notes", "k1")
    ingest = _one(spans, "ingest KV_blackboard", trace_id)
    commit = _one(spans, "postgres commit", trace_id)
    assert ingest.kind == SpanKind.CONSUMER and _parent_of(ingest) == put.context.span_id
    assert ingest.parent is not None and ingest.parent.is_remote  # joined through the message's headers
    assert _parent_of(commit) == ingest.context.span_id
    assert commit.attributes is not None and commit.attributes["db.system.name"] == "postgresql"
    assert ingest.start_time is not None and commit.start_time is not None and commit.end_time is not None
    assert ingest.end_time is not None and ingest.start_time <= commit.start_time <= commit.end_time
    assert count_rows(pg_settings.postgres.dsn.get_secret_value(),
                      "SELECT count(*) FROM bb_entry_revisions WHERE board = %s AND seq = %s", f"b{unique}", rev) == 1


@_async
async def test_remember_and_recall_are_traced_end_to_end(
        spans: InMemorySpanExporter, pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider())
    board = f"m{unique}"
    async with Agent.connect(f"{unique}-a", settings=pg_settings) as agent:
        mid = await agent.remember("the deploy runs at noon", board=board, wait="searchable")
        remember = _one(spans, "remember")
        trace_id = remember.context.trace_id
        await wait_for(lambda: _has(spans, "embeddings test-hash", trace_id), 60, "the worker's spans")
        hits = await agent.recall("deploy noon", board=board)
        assert [h.id for h in hits] == [mid]
    assert remember.attributes is not None
    assert remember.attributes["gen_ai.operation.name"] == "create_memory"
    assert remember.attributes["gen_ai.memory.store.id"] == board
    ingest = _one(spans, "ingest BB_MEMORY", trace_id)
    assert _parent_of(ingest) == remember.context.span_id
    assert _parent_of(_one(spans, "postgres commit", trace_id)) == ingest.context.span_id
    embedding = _one(spans, "embeddings test-hash", trace_id)  # the worker's embedder, after the ingest
    assert _parent_of(embedding) == ingest.context.span_id
    assert embedding.attributes is not None and embedding.attributes["gen_ai.operation.name"] == "embeddings"
    # the recall: the SDK's client span, the service's server span under it
    client = next(s for s in spans.get_finished_spans() if s.name == "search memories" and s.kind == SpanKind.CLIENT)
    server = next(s for s in spans.get_finished_spans() if s.name == "search memories" and s.kind == SpanKind.SERVER)
    assert server.context.trace_id == client.context.trace_id and _parent_of(server) == client.context.span_id
    assert client.attributes is not None and client.attributes["gen_ai.operation.name"] == "search_memory"
    assert client.attributes["gen_ai.memory.store.id"] == board


@_async
async def test_send_and_vote_are_traced_to_the_worker(
        spans: InMemorySpanExporter, pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    await start_worker(pg_settings, name=f"w{unique}", embed=False)
    async with Agent.connect(f"{unique}-a", settings=pg_settings) as a, \
            Agent.connect(f"{unique}-b", settings=pg_settings) as b:
        await a.send(b.id, "note", {"x": 1})
        send = _one(spans, "send")
        await wait_for(lambda: _has(spans, "ingest BB_MSG", send.context.trace_id), 60, "the message's ingest")
        board = a.board(f"v{unique}")
        handle = await board.propose("plan", "p", ["x", "y"], voters=[a.id])
        await board.vote(handle.id, "x")
        vote = _one(spans, "vote")
        await wait_for(lambda: _has(spans, "ingest BB_VOTE", vote.context.trace_id), 60, "the ballot's ingest")
    assert send.attributes is not None and send.attributes["blackboard.to"] == b.id
    assert _parent_of(_one(spans, "ingest BB_MSG", send.context.trace_id)) == send.context.span_id
    assert vote.attributes is not None and vote.attributes["blackboard.proposal"] == handle.id
    assert _parent_of(_one(spans, "ingest BB_VOTE", vote.context.trace_id)) == vote.context.span_id


async def _stored_headers(settings: Settings, board: str, section: str, key: str) -> dict[str, str]:
    nc = await operator_nats(settings.nats.url)
    try:
        subjects = Subjects(settings.board.bucket)
        msg = await nc.jetstream().get_last_msg(subjects.kv_stream, subjects.entry(board, section, key))
        return dict(msg.headers or {})
    finally:
        await nc.close()


@_async
async def test_the_trace_context_travels_in_the_message_headers(
        spans: InMemorySpanExporter, settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as agent:
        await agent.board(f"b{unique}").put("notes", "k", 1)
    put = _one(spans, "board.put")
    headers = await _stored_headers(settings, f"b{unique}", "notes", "k")
    assert headers[Header.TRACEPARENT.value] == f"00-{put.context.trace_id:032x}-{put.context.span_id:016x}-{int(put.context.trace_flags):02x}"


@_async
async def test_off_no_trace_header(settings: Settings, unique: str) -> None:
    assert not tracing.enabled
    async with Agent.connect(f"{unique}-a", settings=settings) as agent:
        await agent.board(f"b{unique}").put("notes", "k", 1)
    headers = await _stored_headers(settings, f"b{unique}", "notes", "k")
    assert Header.MSG_ID.value in headers and Header.TRACEPARENT.value not in headers


def test_off_nothing_of_opentelemetry_is_imported() -> None:
    code = ("import sys, agents_sdk, blackboard.worker, blackboard.search.service, blackboard.client.publisher\n"
            "from blackboard.observability import tracing\n"
            "from blackboard.settings import Settings\n"
            "tracing.configure(Settings().observability)\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
