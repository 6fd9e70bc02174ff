"""OpenTelemetry spans that follow a write across the bus (docs/observability.md, "Tracing").

A write's path is one trace: the SDK's span (``board.put``, ``remember``, ``send``,
``vote``) is the parent of the worker's ``ingest`` span, through the W3C trace context
the publisher puts in the message's ``traceparent`` / ``tracestate`` headers
(:class:`~blackboard.protocol.subjects.Header`); the ingest span's child is the
PostgreSQL commit of the batch that held the message. A search is a client span in the
SDK and a server span in the search service, joined the same way.

Off (``observability.tracing`` false, the default) costs a flag test: nothing of
OpenTelemetry is imported, and the instrumented code tests :data:`enabled` (read as
``tracing.enabled``, an attribute of this module) before doing anything else. Tracing
is a property of the process (OpenTelemetry's context is too): :func:`configure` with
the setting on turns it on for every client and worker of the process; :func:`disable`
turns it off again (tests).

Attribute names: the OpenTelemetry messaging conventions (``messaging.system`` =
``nats``, ``messaging.destination.name``, ``messaging.operation.type``), the database
ones (``db.system.name`` = ``postgresql``) and the generative-AI memory ones where they
fit: ``gen_ai.operation.name`` (``create_memory`` for ``remember``, ``search_memory``
for a memory search), ``gen_ai.memory.store.id`` (the board) and ``gen_ai.memory.id``.
Ours are under ``blackboard.`` (``blackboard.board``, ``blackboard.section``, ``blackboard.key``, ``blackboard.proposal``).
"""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

from blackboard.protocol.errors import ConfigurationError
from blackboard.protocol.subjects import Header

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanContext, Tracer, TracerProvider

    from blackboard.settings import ObservabilitySettings

__all__ = [
    "INSTRUMENTATION",
    "SpanKindName",
    "configure",
    "consumer_spans",
    "disable",
    "embedding_spans",
    "enable",
    "enabled",
    "inject",
    "remote_span",
    "search_attributes",
    "span",
    "traced",
]

#: The instrumentation scope of every span this package makes.
INSTRUMENTATION = "blackboard"

SpanKindName = Literal["internal", "producer", "consumer", "client", "server"]

#: True while spans are made (the one flag the hot paths test; read it as ``tracing.enabled``).
enabled = False

_tracer: Tracer | None = None
_provider: TracerProvider | None = None  # the provider configure() built (shut down by disable())

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: The ingest spans of stored messages still to embed, by (stream, sequence): the parents of
#: their embedding spans (a bounded map of this process; the oldest are forgotten).
_awaiting_embedding: OrderedDict[tuple[str, int], SpanContext] = OrderedDict()
_AWAITING_MAX = 16384

_TRACEPARENT = Header.TRACEPARENT.value
_TRACESTATE = Header.TRACESTATE.value


def configure(settings: ObservabilitySettings) -> None:
    """Turn tracing on for this process when ``settings.tracing`` is true (else do nothing).

    ``tracing_exporter``: ``otlp`` sends spans to ``otlp_endpoint`` (OTLP over HTTP, the
    ``opentelemetry-exporter-otlp-proto-http`` package), ``console`` prints them, ``none``
    uses the tracer provider the application installed (OpenTelemetry's global one). The
    first two sample by ``tracing_sample_ratio`` (parent-based: a remote parent decides).
    Idempotent: a process that is already tracing keeps its tracer.

    Raises:
        ConfigurationError: the ``tracing`` extra (or the OTLP exporter) is not installed,
            or ``otlp`` without ``otlp_endpoint``.
    """
    if not settings.tracing or enabled:
        return
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise ConfigurationError("observability.tracing needs the tracing extra: "
                                 "pip install 'blackboard[tracing]'") from exc
    if settings.tracing_exporter == "none":
        enable(trace.get_tracer_provider())
        return
    provider = _build_provider(settings)
    enable(provider)
    global _provider
    _provider = provider


def _build_provider(settings: ObservabilitySettings) -> TracerProvider:
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as exc:
        raise ConfigurationError("observability.tracing_exporter needs opentelemetry-sdk: "
                                 "pip install 'blackboard[tracing]'") from exc
    exporter: SpanExporter
    if settings.tracing_exporter == "otlp":
        if not settings.otlp_endpoint:
            raise ConfigurationError("observability.tracing_exporter = otlp needs observability.otlp_endpoint")
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ConfigurationError("observability.tracing_exporter = otlp needs "
                                     "opentelemetry-exporter-otlp-proto-http") from exc
        exporter = OTLPSpanExporter(endpoint=settings.otlp_endpoint.rstrip("/") + "/v1/traces")
    else:
        exporter = ConsoleSpanExporter()
    provider = SdkProvider(resource=Resource.create({"service.name": settings.service_name}),
                           sampler=ParentBased(TraceIdRatioBased(settings.tracing_sample_ratio)))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def enable(provider: TracerProvider | None = None) -> None:
    """Make spans from now on, with ``provider``'s tracer (None: OpenTelemetry's global one).

    Raises:
        ConfigurationError: opentelemetry-api is not installed.
    """
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise ConfigurationError("tracing needs the tracing extra: pip install 'blackboard[tracing]'") from exc
    global _tracer, enabled
    _tracer = (provider or trace.get_tracer_provider()).get_tracer(INSTRUMENTATION)
    enabled = True


def disable() -> None:
    """Stop making spans (and flush and shut down the provider :func:`configure` built)."""
    global _tracer, _provider, enabled
    enabled = False
    _tracer = None
    _awaiting_embedding.clear()
    provider, _provider = _provider, None
    shutdown = getattr(provider, "shutdown", None)
    if shutdown is not None:
        shutdown()


def _kind(kind: SpanKindName) -> Any:
    from opentelemetry.trace import SpanKind

    return {"internal": SpanKind.INTERNAL, "producer": SpanKind.PRODUCER, "consumer": SpanKind.CONSUMER,
            "client": SpanKind.CLIENT, "server": SpanKind.SERVER}[kind]


@contextmanager
def span(name: str, kind: SpanKindName = "internal", attributes: Mapping[str, Any] | None = None,
         *, parent: Context | None = None) -> Iterator[Span | None]:
    """A span around the block, the current one inside it (None and nothing done when off).

    An exception leaving the block is recorded on the span and sets its status to error.
    """
    tracer = _tracer
    if tracer is None:
        yield None
        return
    with tracer.start_as_current_span(name, context=parent, kind=_kind(kind),
                                      attributes=_clean(attributes)) as current:
        yield current


def remote_span(headers: Mapping[str, str] | None, name: str, kind: SpanKindName = "server",
                attributes: Mapping[str, Any] | None = None) -> Any:
    """:func:`span` whose parent is the trace context carried by ``headers`` (a message's)."""
    return span(name, kind, attributes, parent=_extract(headers))


def traced(name: str, kind: SpanKindName = "producer",
           attributes: Callable[..., Mapping[str, Any]] | None = None
           ) -> Callable[[Callable[_P, Coroutine[Any, Any, _R]]], Callable[_P, Coroutine[Any, Any, _R]]]:
    """Decorate a coroutine function: each call is a span ``name`` when tracing is on.

    ``attributes(*args, **kwargs)`` gives the span's attributes from the call's arguments
    (called only when on). Off, the call costs the flag test and one more await.
    """
    def decorate(fn: Callable[_P, Coroutine[Any, Any, _R]]) -> Callable[_P, Coroutine[Any, Any, _R]]:
        @functools.wraps(fn)
        async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            if not enabled:
                return await fn(*args, **kwargs)
            attrs = attributes(*args, **kwargs) if attributes is not None else None
            with span(name, kind, attrs):
                return await fn(*args, **kwargs)

        return wrapper

    return decorate


def inject(headers: dict[str, str]) -> None:
    """Write the current span's W3C trace context into ``headers`` (``traceparent`` and,
    when there is one, ``tracestate``); nothing when there is no valid current span."""
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return
    headers[_TRACEPARENT] = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    if ctx.trace_state:
        headers[_TRACESTATE] = ctx.trace_state.to_header()


def _extract(headers: Mapping[str, str] | None) -> Context | None:
    if not headers or _TRACEPARENT not in headers:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {_TRACEPARENT: headers[_TRACEPARENT]}
    if _TRACESTATE in headers:
        carrier[_TRACESTATE] = headers[_TRACESTATE]
    ctx = TraceContextTextMapPropagator().extract(carrier)
    from opentelemetry import trace

    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def consumer_spans(stream: str, messages: Sequence[tuple[Mapping[str, str] | None, int]], started_ns: int,
                   commit_started_ns: int, commit_ended_ns: int, *, rows: int, embeds: bool = False) -> None:
    """Record a worker batch's spans after the fact: for each message (its headers and
    stream sequence) that carries a trace context, a consumer span ``ingest <stream>``
    (from ``started_ns``, the batch's arrival, to now) in the writer's trace, and its child
    ``postgres commit`` (``commit_started_ns`` to ``commit_ended_ns``, the batch's
    transaction). Messages without one make no span (an untraced write starts no trace in
    the worker), nor do those whose writer did not sample its trace (the writer's decision
    holds, whatever the worker's sampler). ``embeds``: the ingest span is kept as the parent of the message's
    embedding span (:func:`embedding_spans`)."""
    tracer = _tracer
    if tracer is None:
        return
    from opentelemetry import trace

    ended = time.time_ns()
    consumer, internal = _kind("consumer"), _kind("client")
    for h, seq in messages:
        parent = _extract(h)
        if parent is None or not trace.get_current_span(parent).get_span_context().trace_flags.sampled:
            continue  # the writer did not trace it, or did not sample its trace: nothing to record
        ingest = tracer.start_span(f"ingest {stream}", context=parent, kind=consumer, start_time=started_ns,
                                   attributes={"messaging.system": "nats", "messaging.operation.type": "process",
                                               "messaging.destination.name": stream,
                                               "messaging.batch.message_count": len(messages),
                                               "blackboard.stream.sequence": seq})
        commit = tracer.start_span("postgres commit", context=trace.set_span_in_context(ingest), kind=internal,
                                   start_time=commit_started_ns,
                                   attributes={"db.system.name": "postgresql", "db.operation.name": "COMMIT",
                                               "db.operation.batch.size": rows})
        commit.end(end_time=commit_ended_ns)
        ingest.end(end_time=ended)
        if embeds:
            _awaiting_embedding[(stream, seq)] = ingest.get_span_context()
            while len(_awaiting_embedding) > _AWAITING_MAX:
                _awaiting_embedding.popitem(last=False)


def embedding_spans(items: Sequence[tuple[str, int]], model: str, started_ns: int) -> None:
    """Record the spans of an embedding batch after its vectors are committed: for each item
    (the stream and sequence of the message that stored it) whose ingest span is known, a
    span ``embeddings <model>`` (from ``started_ns``, when the batch was leased, to now) as
    that ingest span's child (``gen_ai.operation.name`` = ``embeddings``,
    ``gen_ai.request.model``)."""
    tracer = _tracer
    if tracer is None or not _awaiting_embedding:
        return
    from opentelemetry import trace

    ended = time.time_ns()
    kind = _kind("client")
    for item in items:
        parent = _awaiting_embedding.pop(item, None)
        if parent is None:
            continue
        span = tracer.start_span(f"embeddings {model}", context=trace.set_span_in_context(
            trace.NonRecordingSpan(parent)), kind=kind, start_time=started_ns,
            attributes={"gen_ai.operation.name": "embeddings", "gen_ai.request.model": model,
                        "gen_ai.request.batch_size": len(items), "blackboard.stream.sequence": item[1]})
        span.end(end_time=ended)


def search_attributes(endpoint: str, request: object, principal: str) -> dict[str, Any]:
    """A search request's span attributes: ``gen_ai.operation.name`` = ``search_memory`` for a
    memory search (endpoint ``memories``), the boards as ``gen_ai.memory.store.id``, the mode."""
    boards = getattr(request, "boards", None) or getattr(request, "board", None)
    mode = getattr(request, "mode", None)
    return {"rpc.system.name": "nats", "rpc.method": endpoint, "blackboard.principal": principal,
            "gen_ai.operation.name": "search_memory" if endpoint == "memories" else None,
            "gen_ai.memory.store.id": boards if isinstance(boards, str) else
            (",".join(map(str, boards)) if boards else None),
            "blackboard.search.mode": str(mode) if mode is not None else None}


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not attributes:
        return None
    return {k: v for k, v in attributes.items() if v is not None}
