"""View benchmark: live-view update latency and snapshot load, next to raw KV watch.

Measures, in one run on a nats-server it starts itself (JetStream, temporary
directory; with authorization as ``blackboard dev`` runs it, JWT identities and
TLS, unless ``--insecure-open-bus``; the writer and the raw reader connect with
their own agent credentials, the same CA and their ``_INBOX.<id>`` prefixes):

* **update latency**: a writer puts an entry; the time until a *second* agent's
  :class:`~agents_sdk.view.View` shows it (its change callback fires, i.e. the
  entry is readable with ``view.get``), next to the time until a raw nats-py
  watch on the same bucket yields it (``kv.watch``'s ordered consumer, created
  by name with its filter as an agent must: :func:`bench._common.raw_kv_watch`). The writer is the same for both
  variants (nats-py ``kv.put`` of a pre-encoded entry envelope on its own
  connection), so the difference is the observer side only: decoding the
  envelope into an :class:`~blackboard.protocol.entries.Entry`, the watch queue, the
  view task and the callbacks. Two patterns:

  - *ping-pong*: put, wait until it is seen, next put (uncontended latency);
  - *stream*: writes at a fixed rate, latency of every delivery (queueing).

* **snapshot load**: ``await board.view(section)`` over N existing keys until
  the view is ready (every key readable), next to that raw watch collecting
  the current values into a dict until the last one (no more pending); a third column adds decoding every envelope to the raw watch
  (the work a view must do), to show where the remaining cost lies.

Every write is signed with the writer's key (as an agent signs it: the
entry's canonical encoding, docs/security.md "Signatures"), and the view
verifies each update. The same reader agent also runs a view with
``security.verify`` false ("not verifying") in the same rounds, so the second
table shows what verification adds to a view's update latency (target: p99 with
verification <= 1.25x without). The snapshot's keys are signed one by one (as
many agents' single puts), so loading it checks one signature per key.

Raw and view rounds alternate (order reversed every round); every figure is
the median over rounds and the ratio the median of the per-round ratios
(view / raw: above 1 means slower than raw).

Run: ``python bench/view_bench.py`` (about a minute on 2 cores);
``--snapshot-keys 100000`` for a bigger snapshot.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import platform
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import version as _version
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from agents_sdk import Agent, Board, Change
from agents_sdk.view import View
from bench._common import (
    LatencyStats,
    Table,
    add_bus_option,
    alternate,
    embedded_nats,
    median,
    paced_writes,
    raw_kv_watch,
)
from blackboard.client.keys import publish_certificate
from blackboard.protocol.entries import decode_entry, encode_entry
from blackboard.protocol.subjects import Header, Subjects
from blackboard.security.jwt import Credentials
from blackboard.security.signer import Signer
from blackboard.settings import Settings

BOARD = "viewbench"
WRITER = "viewbench-writer"
#: A view's update p99 with signatures verified, next to the same view not verifying (issue 20).
TARGET_VERIFY_P99 = 1.25


@dataclass(slots=True)
class Ctx:
    args: argparse.Namespace
    reader: Board
    #: The same reader agent with verification off (``security.verify`` false): what a view
    #: costs without checking signatures.
    unverified: Board
    writer_kv: KeyValue
    reader_js: JetStreamContext
    payload: bytes
    subjects: Subjects
    #: The writer's signer (None on the open bus): every write is signed as an agent signs it.
    signer: Signer | None
    msg_ids: Iterator[int] = field(default_factory=itertools.count)

    async def put(self, section: str, key: str) -> None:
        """The writer's put of the entry (signed with the writer's key unless on the open bus)."""
        subject = self.subjects.entry(BOARD, section, key)
        headers = {Header.MSG_ID.value: f"vb{next(self.msg_ids):x}"}
        if self.signer is not None:
            self.signer.sign(subject, headers, self.payload)
        await self.writer_kv._js.publish(subject, self.payload, headers=headers)


# ------------------------------------------------------------------ observers
def _raw_filter(ctx: Ctx, section: str) -> str:
    """The KV key filter of a section, for nats-py's ``kv.watch`` (no subject prefix)."""
    return ctx.subjects.entry_filter(BOARD, section)[len(ctx.subjects.kv_prefix):]


class _Arrivals:
    """Arrival times by key index; ``wait(i)`` until key ``m<i>`` has arrived."""

    def __init__(self, count: int) -> None:
        self.times: list[float] = [0.0] * count
        self._events = [asyncio.Event() for _ in range(count)]
        self.done = asyncio.Event()
        self._left = count

    def record(self, key: str) -> None:
        i = int(key[key.rindex("m") + 1:])
        if not self._events[i].is_set():
            self.times[i] = time.perf_counter()
            self._events[i].set()
            self._left -= 1
            if self._left == 0:
                self.done.set()

    async def wait(self, i: int) -> None:
        await self._events[i].wait()


#: Starts an observer of ``section`` feeding ``arrivals``; returns its stop function.
_Observe = Callable[[str, _Arrivals], Awaitable[Callable[[], Awaitable[None]]]]


async def _observe_view(ctx: Ctx, section: str, arrivals: _Arrivals, *, verify: bool = True
                        ) -> Callable[[], Awaitable[None]]:
    view: View = await (ctx.reader if verify else ctx.unverified).view(section)

    def on_change(change: Change) -> None:
        arrivals.record(change.entry.key)

    view.on_change(on_change)
    return view.close


async def _observe_raw(ctx: Ctx, section: str, arrivals: _Arrivals) -> Callable[[], Awaitable[None]]:
    watcher = await raw_kv_watch(ctx.reader_js, ctx.subjects.bucket, _raw_filter(ctx, section))

    async def consume() -> None:
        async for entry in watcher:
            if entry is not None:  # None: nats-py's "initial values done" marker
                arrivals.record(entry.key)

    task = asyncio.create_task(consume())

    async def stop() -> None:
        await watcher.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    return stop


def _observer(ctx: Ctx, variant: str) -> _Observe:
    if variant == "view":
        return lambda section, arrivals: _observe_view(ctx, section, arrivals)
    if variant == "view-unverified":
        return lambda section, arrivals: _observe_view(ctx, section, arrivals, verify=False)
    return lambda section, arrivals: _observe_raw(ctx, section, arrivals)


# ------------------------------------------------------------------- latency
async def pingpong(ctx: Ctx, variant: str, r: int) -> LatencyStats:
    """Put, wait until the observer has it, next put."""
    count, section = ctx.args.pingpong, f"pp-{variant}-{r}"
    arrivals = _Arrivals(count)
    stop = await _observer(ctx, variant)(section, arrivals)
    lat: list[float] = []
    clock = time.perf_counter
    try:
        start = clock()
        for i in range(count):
            t = clock()
            await ctx.put(section, f"m{i}")
            await asyncio.wait_for(arrivals.wait(i), 10.0)
            lat.append(arrivals.times[i] - t)
        elapsed = clock() - start
    finally:
        await stop()
    return LatencyStats.of(lat, elapsed)


async def stream(ctx: Ctx, variant: str, r: int) -> LatencyStats:
    """Writes at a fixed rate; latency of every delivery."""
    rate = ctx.args.rate
    count, section = int(rate * ctx.args.stream_seconds), f"st-{variant}-{r}"
    arrivals = _Arrivals(count)
    stop = await _observer(ctx, variant)(section, arrivals)
    try:
        t0, sent = await paced_writes(
            count, rate, lambda i: ctx.put(section, f"m{i}"))
        await asyncio.wait_for(arrivals.done.wait(), 10.0)
        elapsed = time.perf_counter() - t0
    finally:
        await stop()
    return LatencyStats.of([arrivals.times[i] - sent[i] for i in range(count)], elapsed)


# ------------------------------------------------------------------ snapshot
SNAPSHOT_SECTION = "snap"


async def _prefill(ctx: Ctx) -> float:
    n = ctx.args.snapshot_keys
    js = ctx.writer_kv._js  # the writer connection's JetStream context
    t = time.perf_counter()
    pending: list[asyncio.Future[Any]] = []
    for i in range(n):
        subject = ctx.subjects.entry(BOARD, SNAPSHOT_SECTION, f"m{i}")
        headers = {Header.MSG_ID.value: f"snap{i}"}
        if ctx.signer is not None:  # each key signed alone (as n agents' single puts): n checks
            ctx.signer.sign(subject, headers, ctx.payload)
        pending.append(await js.publish_async(subject, ctx.payload, headers=headers))
        if len(pending) >= 2000:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    return time.perf_counter() - t


async def snapshot_view(ctx: Ctx, r: int) -> float:
    t = time.perf_counter()
    view = await ctx.reader.view(SNAPSHOT_SECTION)
    elapsed = time.perf_counter() - t
    await view.close()
    if len(view) != ctx.args.snapshot_keys:
        raise RuntimeError(f"view snapshot has {len(view)} keys, expected {ctx.args.snapshot_keys}")
    return elapsed


async def _raw_snapshot(ctx: Ctx, decode: bool) -> float:
    t = time.perf_counter()
    watcher = await raw_kv_watch(ctx.reader_js, ctx.subjects.bucket, _raw_filter(ctx, SNAPSHOT_SECTION))
    values: dict[str, Any] = {}
    async for entry in watcher:
        if entry is None:
            break
        if decode:
            parts = ctx.subjects.parse_entry(entry.key)
            values[entry.key] = decode_entry(parts, entry.revision or 0, entry.value, None)
        else:
            values[entry.key] = entry.value
    elapsed = time.perf_counter() - t
    await watcher.stop()
    if len(values) != ctx.args.snapshot_keys:
        raise RuntimeError(f"raw snapshot has {len(values)} keys, expected {ctx.args.snapshot_keys}")
    return elapsed


# ---------------------------------------------------------------------- main
async def _between() -> None:
    gc.collect()
    await asyncio.sleep(0.05)


def _ratio_median(view: list[float], raw: list[float]) -> float:
    return median([v / r for v, r in zip(view, raw, strict=True) if r > 0])


async def run(args: argparse.Namespace) -> int:
    base = Settings()
    async with embedded_nats(base.nats.sync_interval, open_bus=args.insecure_open_bus, settings=base) as bus:
        settings = bus.settings
        writer_nc = await bus.raw_connect(WRITER, name=WRITER, pending_size=64 * 1024 * 1024)
        raw_nc = await bus.raw_connect("viewbench-raw-reader", name="viewbench-raw-reader",
                                       pending_size=64 * 1024 * 1024)
        try:
            unverified = settings.model_copy(update={"security": settings.security.model_copy(
                update={"verify": False})})
            signer: Signer | None = None
            if bus.auth is not None:
                signer = Signer(Credentials.parse(bus.auth.creds(WRITER).read_text()))
                await publish_certificate(writer_nc, signer.public_key, signer.certificate, 5.0)
            async with Agent.connect("viewbench-reader", settings=settings) as agent, \
                    Agent.connect("viewbench-reader", settings=unverified) as plain:
                bucket = settings.board.bucket
                timeout = settings.nats.request_timeout
                subjects = Subjects(bucket)
                # What js.key_value() returns, without its stream-info call (an agent may not).
                writer_kv = KeyValue(name=bucket, stream=subjects.kv_stream, pre=subjects.kv_prefix,
                                     js=writer_nc.jetstream(timeout=timeout), direct=True)
                value = {"text": "x" * args.value_bytes, "n": 12345}
                payload = encode_entry(value, author=WRITER)  # (the canonical encoding: what is signed)
                ctx = Ctx(args, agent.board(BOARD), plain.board(BOARD), writer_kv, raw_nc.jetstream(timeout=timeout),
                          payload, subjects, signer)
                print(f"view_bench: {bus.label}", flush=True)
                return await _measure(ctx, raw_nc)
        finally:
            await writer_nc.close()
            await raw_nc.close()


async def _measure(ctx: Ctx, raw_nc: NATS) -> int:
    args = ctx.args
    print(f"view_bench: python {platform.python_version()}, nats-py {_version('nats-py')}, "
          f"nats-server {raw_nc.connected_server_version}, envelope {len(ctx.payload)} B; "
          f"ping-pong {args.pingpong} x {args.rounds} rounds, stream {args.rate:g}/s x "
          f"{args.stream_seconds:g}s x {args.stream_rounds} rounds, snapshot {args.snapshot_keys} keys x "
          f"{args.rounds} rounds", flush=True)
    started = time.perf_counter()

    def bind(fn: Callable[[Ctx, str, int], Awaitable[Any]], variant: str) -> Callable[[int], Awaitable[Any]]:
        return lambda r: fn(ctx, variant, r)

    # warm-up (not measured), on sections of its own (round numbers from 1000)
    variants = ("raw", "view", "view-unverified")
    await alternate(1, {v: bind(lambda c, variant, r: pingpong(c, variant, 1000 + r), v) for v in variants})
    pp = await alternate(args.rounds, {v: bind(pingpong, v) for v in variants}, between=_between)
    print(f"  ping-pong: done ({time.perf_counter() - started:.0f}s)", flush=True)
    st = await alternate(args.stream_rounds, {v: bind(stream, v) for v in variants}, between=_between)
    print(f"  stream: done ({time.perf_counter() - started:.0f}s)", flush=True)
    fill = await _prefill(ctx)
    print(f"  prefilled {args.snapshot_keys} keys in {fill:.1f}s ({time.perf_counter() - started:.0f}s)", flush=True)
    snap = await alternate(args.rounds, {
        "raw": lambda r: _raw_snapshot(ctx, decode=False),
        "view": lambda r: snapshot_view(ctx, r),
        "raw+decode": lambda r: _raw_snapshot(ctx, decode=True),
    }, between=_between)
    print(f"  snapshot: done ({time.perf_counter() - started:.0f}s)", flush=True)

    table = Table("view_bench (median of rounds; ratio = view / raw, median of per-round ratios)",
                  measured_label="View", baseline_label="raw kv.watch")
    summary: dict[str, Any] = {"envelope_bytes": len(ctx.payload)}
    for name, runs in (("ping-pong", pp), (f"stream {args.rate:g}/s", st)):
        view, raw = runs["view"], runs["raw"]
        for p in ("p50", "p99"):
            v, rw = [getattr(s, p) for s in view], [getattr(s, p) for s in raw]
            table.add(f"update latency {name} {p}", median(v), median(rw), "us", ratio=_ratio_median(v, rw),
                      note="put -> visible" if p == "p50" else "")
            summary[f"{name.split()[0]}_{p}"] = {"view_us": median(v) * 1e6, "raw_us": median(rw) * 1e6,
                                                 "ratio": _ratio_median(v, rw)}
    verified_table = Table("view_bench: a view verifying signatures / the same view not verifying (median of "
                           "rounds; ratio: median of per-round ratios)",
                           measured_label="verifying", baseline_label="not verifying")
    for name, runs in (("ping-pong", pp), (f"stream {args.rate:g}/s", st)):
        view, plain = runs["view"], runs["view-unverified"]
        for p in ("p50", "p99"):
            v, pl = [getattr(s, p) for s in view], [getattr(s, p) for s in plain]
            verified_table.add(f"update latency {name} {p}", median(v), median(pl), "us",
                               ratio=_ratio_median(v, pl), max_ratio=TARGET_VERIFY_P99 if p == "p99" else None,
                               note="every update's signature checked" if p == "p50" else "")
            summary[f"{name.split()[0]}_{p}_verify_cost"] = {"verifying_us": median(v) * 1e6,
                                                             "unverified_us": median(pl) * 1e6,
                                                             "ratio": _ratio_median(v, pl)}
    n = args.snapshot_keys
    table.add(f"snapshot load, {n} keys", median(snap["view"]), median(snap["raw"]), "ms",
              ratio=_ratio_median(snap["view"], snap["raw"]), note="raw: values as bytes")
    table.add(f"snapshot load, {n} keys, raw decodes too", median(snap["view"]), median(snap["raw+decode"]), "ms",
              ratio=_ratio_median(snap["view"], snap["raw+decode"]), note="raw + decode_entry per key")
    summary["snapshot"] = {"keys": n, "view_ms": median(snap["view"]) * 1e3, "raw_ms": median(snap["raw"]) * 1e3,
                           "raw_decode_ms": median(snap["raw+decode"]) * 1e3,
                           "ratio": _ratio_median(snap["view"], snap["raw"]),
                           "view_keys_per_s": n / median(snap["view"])}
    print()
    print(table.render())
    print()
    print(verified_table.render())
    print(f"snapshot throughput: view {n / median(snap['view']):,.0f} keys/s, raw {n / median(snap['raw']):,.0f} "
          f"keys/s, raw+decode {n / median(snap['raw+decode']):,.0f} keys/s")
    print("per-round ratios (view/raw): ping-pong p50 "
          + " ".join(f"{v.p50 / r.p50:.2f}" for v, r in zip(pp["view"], pp["raw"], strict=True))
          + "; snapshot " + " ".join(f"{v / r:.2f}" for v, r in zip(snap["view"], snap["raw"], strict=True)))
    print(f"total {time.perf_counter() - started:.0f}s")
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description="View benchmark: live views next to raw nats-py KV watch.")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of ping-pong and snapshot (default 5)")
    parser.add_argument("--pingpong", type=int, default=500, help="writes per ping-pong round")
    parser.add_argument("--stream-rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=500.0, help="stream writes per second")
    parser.add_argument("--stream-seconds", type=float, default=2.0)
    parser.add_argument("--snapshot-keys", type=int, default=10_000, help="keys of the snapshot (default 10k)")
    parser.add_argument("--value-bytes", type=int, default=200, help="size of the text in the value")
    parser.add_argument("--json", action="store_true", help="also print the summary as one JSON line")
    add_bus_option(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
