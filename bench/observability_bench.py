"""The cost of observability: board writes and worker ingest with tracing on and metrics on,
next to both off, in the same run (docs/observability.md).

Rounds alternate the variants' order (:func:`_common.alternate`) so that drift on a noisy
machine hits each alike; the ratio to "off" is taken per round and the median printed.

* board writes: ``board.put`` one after the other (each acknowledged) by an SDK agent, tracing
  off and on (spans to OpenTelemetry's SDK, a batch processor and an exporter that drops
  them: the cost of making spans and the ``traceparent`` header, not of shipping them).
  Metrics are the worker's; a write does not touch them.
* ingest: a worker running, ``--entries`` entries written pipelined by an agent, timed from
  the first write to the worker caught up (every entry in PostgreSQL): off, metrics on
  (the worker's Prometheus registry and its HTTP endpoint), tracing on (the writes carry the
  trace context of the span around their group of ``GROUP`` writes, as an application's
  operations would; the worker makes an ingest and a commit span per message), both.
* ``tracing 1%``, in both: the provider samples with ``ParentBased(TraceIdRatioBased(0.01))``
  (what ``observability.tracing_sample_ratio = 0.01`` builds): each put, each group of writes,
  is its own trace, one in a hundred recorded, and the worker records only those.
* the off path alone: a coroutine decorated with ``tracing.traced`` next to the same
  undecorated, tracing off (ns per call): what "off" adds to an SDK call.

Usage: python bench/observability_bench.py [--writes 300] [--entries 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from typing import Any

from _common import add_bus_option, alternate, embedded_stack
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from agents_sdk import Agent
from blackboard.observability import tracing
from blackboard.settings import Settings
from blackboard.worker import Worker

AGENT = "obsbench"
#: Pipelined writes per application span in the ingest variants (each group its own trace).
GROUP = 30
#: The sampled variant's ratio.
SAMPLED = 0.01


class _Dropping(SpanExporter):
    """Takes every span and keeps none (the exporter's own cost is not ours to measure)."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def _worker_settings(s: Settings, name: str, metrics: bool) -> Settings:
    return s.model_copy(update={
        "worker": s.worker.model_copy(update={"embed": False, "name": name, "group": name}),
        "observability": s.observability.model_copy(update={"http_enabled": metrics, "http_port": 0})})


async def _off_path(n: int) -> tuple[float, float]:
    """ns per call of a plain coroutine and of the same decorated with ``tracing.traced`` (off)."""
    async def plain(x: int) -> int:
        return x

    decorated = tracing.traced("bench")(plain)
    assert not tracing.enabled
    best_plain = best_traced = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for i in range(n):
            await plain(i)
        t1 = time.perf_counter_ns()
        for i in range(n):
            await decorated(i)
        t2 = time.perf_counter_ns()
        best_plain = min(best_plain, (t1 - t0) / n)
        best_traced = min(best_traced, (t2 - t1) / n)
    return best_plain, best_traced


async def run(args: argparse.Namespace) -> int:
    exporter = _Dropping()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=65536))
    sampled = TracerProvider(sampler=ParentBased(TraceIdRatioBased(SAMPLED)))
    sampled.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=65536))
    providers = {"tracing": provider, "sampled": sampled}

    def set_tracing(on: bool | str) -> None:
        if on:
            tracing.enable(providers["tracing" if on is True else str(on)])
        else:
            tracing.disable()

    writes_n, entries_n = int(args.writes), int(args.entries)
    plain_ns, traced_ns = await _off_path(200_000)
    async with embedded_stack("bb-obsbench-", open_bus=args.insecure_open_bus) as (settings, bus, _pg):
        async with Agent.connect(AGENT, settings=settings) as agent:
            board = agent.board("obsbench")
            for i in range(50):  # warm-up
                await board.put("warm", f"k{i}", {"i": i})

            def writes(on: bool | str) -> Any:
                async def go(r: int) -> float:
                    set_tracing(on)
                    try:
                        t0 = time.perf_counter()
                        for i in range(writes_n):
                            await board.put(f"w{r}", f"k{i}", {"i": i, "text": "x" * 100})
                        return writes_n / (time.perf_counter() - t0)
                    finally:
                        set_tracing(False)
                return go

            put_rates = await alternate(args.rounds, {"off": writes(False), "tracing": writes(True),
                                                      "tracing 1%": writes("sampled")})

            def ingest(name: str, metrics: bool, traced: bool | str) -> Any:
                async def go(r: int) -> float:
                    label = "".join(c for c in name if c.isalnum())
                    target = agent.board(f"ing{label}{r}")
                    async with Worker(_worker_settings(settings, f"obs{label}{r}", metrics)) as w:
                        await w.wait_caught_up(600, poll=0.02)
                        set_tracing(traced)
                        try:
                            t0 = time.perf_counter()
                            # A pipeline's puts carry the trace context of the span around them
                            # (one span a group of writes, as an application's operation).
                            async with target.pipeline() as p:
                                for start in range(0, entries_n, GROUP):
                                    with tracing.span("bench group", "producer"):
                                        for i in range(start, min(start + GROUP, entries_n)):
                                            await p.put("s", f"k{i}", {"i": i, "text": "y" * 100})
                            await w.wait_caught_up(600, poll=0.02)
                            return entries_n / (time.perf_counter() - t0)
                        finally:
                            set_tracing(False)
                return go

            await ingest("warm", True, True)(0)  # warm-up: the worker's and PostgreSQL's first batches
            ingest_rates = await alternate(args.rounds, {
                "off": ingest("off", False, False), "metrics": ingest("metrics", True, False),
                "tracing": ingest("tracing", False, True), "metrics+tracing": ingest("both", True, True),
                "tracing 1%": ingest("tracing 1%", False, "sampled")})
    provider.shutdown()
    sampled.shutdown()

    def ratio(rates: dict[str, list[float]], name: str) -> float:
        return statistics.median(a / b for a, b in zip(rates[name], rates["off"], strict=True))

    print(f"observability overhead ({bus.label}; {args.rounds} rounds, variants alternating; "
          f"ratio = rate / rate off, median per round)")
    print(f"board.put, one after the other ({args.writes} a round):")
    for name in ("off", "tracing", "tracing 1%"):
        print(f"  {name:16s} {statistics.median(put_rates[name]):9.1f} writes/s   {ratio(put_rates, name):.3f}x")
    print(f"worker ingest, write {args.entries} pipelined -> all in PostgreSQL:")
    for name in ("off", "metrics", "tracing", "metrics+tracing", "tracing 1%"):
        print(f"  {name:16s} {statistics.median(ingest_rates[name]):9.1f} entries/s  {ratio(ingest_rates, name):.3f}x")
    print(f"off path: a coroutine call {plain_ns:.0f} ns, decorated with tracing.traced (off) {traced_ns:.0f} ns "
          f"(+{traced_ns - plain_ns:.0f} ns a call)")
    print(f"spans made: {exporter.spans}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Observability overhead: tracing and metrics on next to off.")
    parser.add_argument("--writes", type=int, default=300, help="board.put calls per variant per round")
    parser.add_argument("--entries", type=int, default=3000, help="entries ingested per variant per round")
    parser.add_argument("--rounds", type=int, default=3)
    add_bus_option(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
