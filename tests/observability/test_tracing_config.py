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
