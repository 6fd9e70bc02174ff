"""``tracing.configure``: the setting turns tracing on for the process with the exporter it
names; off, it does nothing; a bad combination is a ConfigurationError naming the setting."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace

from blackboard.observability import tracing
from blackboard.protocol.errors import ConfigurationError
from blackboard.settings import ObservabilitySettings


@pytest.fixture(autouse=True)
def _off_after() -> Iterator[None]:
    assert not tracing.enabled
    yield
    tracing.disable()


def test_off_does_nothing() -> None:
    tracing.configure(ObservabilitySettings())
    assert not tracing.enabled


def test_console_exporter_turns_it_on_and_disable_off() -> None:
    tracing.configure(ObservabilitySettings(tracing=True, tracing_exporter="console", service_name="svc-x"))
    assert tracing.enabled
    with tracing.span("hello", "internal", {"blackboard.board": "b", "ignored": None}) as span:
        assert span is not None and span.is_recording()  # an SDK span: the provider configure built
        assert span.resource.attributes["service.name"] == "svc-x"  # type: ignore[attr-defined]
        assert dict(span.attributes) == {"blackboard.board": "b"}  # type: ignore[attr-defined]
        headers: dict[str, str] = {}
        tracing.inject(headers)
        ctx = span.get_span_context()
        assert headers["traceparent"].startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")
    tracing.disable()
    assert not tracing.enabled
    with tracing.span("after") as after:
        assert after is None


def test_the_sample_ratio_decides_new_traces_and_a_remote_parent_decides_its_children() -> None:
    tracing.configure(ObservabilitySettings(tracing=True, tracing_exporter="console", tracing_sample_ratio=0.0))
    with tracing.span("dropped", "producer") as span:
        assert span is not None and not span.is_recording()
        headers: dict[str, str] = {}
        tracing.inject(headers)
    assert int(headers["traceparent"].rsplit("-", 1)[1], 16) & 1 == 0  # the sampled flag is off
    sampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with tracing.remote_span({"traceparent": sampled}, "kept", "consumer") as child:
        assert child is not None and child.is_recording()  # the writer sampled it: kept
    with tracing.remote_span({"traceparent": headers["traceparent"]}, "also dropped", "consumer") as child:
        assert child is not None and not child.is_recording()
    tracing.disable()
    tracing.configure(ObservabilitySettings(tracing=True, tracing_exporter="console", tracing_sample_ratio=1.0))
    with tracing.span("kept", "producer") as span:
        assert span is not None and span.is_recording()


def test_the_worker_records_no_span_for_a_trace_its_writer_did_not_sample() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON)  # the worker's own sampler would keep everything
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    kept = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    dropped = "00-1af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-00"
    tracing.consumer_spans("BB_X", [({"traceparent": kept}, 1), ({"traceparent": dropped}, 2), (None, 3)],
                           0, 1, 2, rows=3)
    spans = exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == ["ingest BB_X", "postgres commit"]
    assert {s.context.trace_id for s in spans} == {0x0af7651916cd43dd8448eb211c80319c}


def test_none_uses_the_global_provider() -> None:
    tracing.configure(ObservabilitySettings(tracing=True, tracing_exporter="none"))
    assert tracing.enabled
    with tracing.span("x") as span:  # the default global provider (no SDK installed): a no-op span
        assert span is not None
        assert span.get_span_context() == trace.get_current_span().get_span_context()


def test_otlp_without_an_endpoint_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="otlp_endpoint"):
        tracing.configure(ObservabilitySettings(tracing=True, tracing_exporter="otlp"))
    assert not tracing.enabled


def test_inject_without_a_span_writes_nothing_and_remote_span_without_headers_is_a_root() -> None:
    tracing.configure(ObservabilitySettings(tracing=True, tracing_exporter="console"))
    headers: dict[str, str] = {}
    tracing.inject(headers)
    assert headers == {}
    with tracing.remote_span({"traceparent": "garbage"}, "root", "server") as span:
        assert span is not None and span.parent is None
