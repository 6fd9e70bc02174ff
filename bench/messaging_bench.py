"""Messaging benchmark: the SDK next to raw nats-py on the same embedded server.

Measures, in one run on a nats-server it starts itself (JetStream, temporary
directory; with authorization as ``blackboard dev`` runs it, JWT identities and
TLS, unless ``--insecure-open-bus``). Each SDK agent connects with its own
credential; inboxes are created by the inbox administration service and votes
committed by the committer, run beside (``bench._common.system_services``). The
raw connections use the worker's identity (the same TLS and authorization; the
raw variants create consumers and use core subjects, which an agent may not):

* **direct send** (awaited one by one): ``agent.send`` next to nats-py
  ``js.publish`` of the same envelope bytes (with a ``Nats-Msg-Id``) on the
  same stream: throughput and ack latency;
* **inbox drain**: reading 4000 waiting direct messages with
  ``async for msg in agent.inbox(): await msg.ack()`` next to a raw durable
  pull consumer (``fetch(64)`` + ``ack`` each, no decoding);
* **direct end-to-end latency** (send call to the recipient's loop step) at a
  fixed rate: SDK next to raw JetStream (``js.publish`` + pull consumer) and
  raw core NATS (``publish`` + subscription);
* **broadcast to 20 agents**: end-to-end latency at a fixed rate over every
  delivery, and burst throughput (deliveries per second until the last of
  the 20 receivers has everything), SDK (20 agents, 20 connections, one
  inbox each) next to 20 raw pull consumers and 20 raw core subscribers;
* **request/reply** round trip: ``agent.request`` to an ``agent.handle``
  handler next to ``nc.request`` to a raw responder.

Raw and SDK rounds alternate (order reversed every round); figures are
medians over rounds and ratios are SDK / raw (throughput: higher is better;
latency: lower is better). The raw figures decode nothing, so the ratios
include the SDK's envelope encoding, validation and decoding.

Run: ``python bench/messaging_bench.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import platform
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from importlib.metadata import version as _version
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from agents_sdk import Agent, Message
from agents_sdk.messaging.envelope import encode_envelope, new_envelope
from bench._common import (
    Bus,
    LatencyStats,
    Table,
    add_bus_option,
    alternate,
    embedded_nats,
    interleaved_ops,
    median,
    percentile,
    system_services,
)
from blackboard.protocol.subjects import MESSAGE_STREAM, Subjects
from blackboard.settings import Settings

Op = Callable[[int], Awaitable[Any]]
#: The identity of the raw connections (on the open bus: none).
RAW = "worker"
clock = time.perf_counter
_ids = itertools.count()


def _stamp(size: int) -> bytes:
    """A raw payload: the send time (8 bytes) padded to ``size`` bytes."""
    return struct.pack("d", clock()) + b"x" * max(0, size - 8)


def _sent_at(data: bytes) -> float:
    return float(struct.unpack_from("d", data)[0])


async def _pace(n: int, rate: float, send: Callable[[int], Awaitable[Any]]) -> None:
    """Call ``send(i)`` n times at ``rate`` per second (no catch-up bursts beyond one)."""
    start = clock()
    for i in range(n):
        delay = start + i / rate - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        await send(i)


async def _barrier(nc: NATS) -> None:
    """Return once the server has processed this connection's SUBs (``flush`` can overtake them)."""
    with contextlib.suppress(nats.errors.NoRespondersError):
        await nc.request(nc.new_inbox(), b"", timeout=5)


async def _raw_consumer(js: JetStreamContext, name: str, subject: str) -> JetStreamContext.PullSubscription:
    await js.add_consumer(MESSAGE_STREAM, api.ConsumerConfig(
        durable_name=name, ack_policy=api.AckPolicy.EXPLICIT, deliver_policy=api.DeliverPolicy.ALL,
        filter_subject=subject, max_ack_pending=1000))
    return await js.pull_subscribe_bind(name, MESSAGE_STREAM)


async def _raw_drain(psub: JetStreamContext.PullSubscription, n: int, on: Callable[[Msg], None]) -> None:
    got = 0
    while got < n:
        try:
            msgs = await psub.fetch(64, timeout=1.0)
        except TimeoutError:
            continue
        for m in msgs:
            on(m)
            await m.ack()
        got += len(msgs)


async def _sdk_drain(agent: Agent, n: int, on: Callable[[Message], None]) -> None:
    async for msg in agent.inbox(limit=n, timeout=30):
        on(msg)
        await msg.ack()


class Bench:
    def __init__(self, args: argparse.Namespace, bus: Bus, nc: NATS) -> None:
        self.args = args
        self.bus = bus
        self.settings = settings = bus.settings
        self.nc = nc
        self.js = nc.jetstream(timeout=settings.nats.request_timeout)
        env = new_envelope(id="0123456789abcdef0", sender="bench-sender", kind="direct", recipients=["x"],
                           type="bench", body={"text": "y" * args.body})
        self.payload = encode_envelope(env)
        self.body = {"text": "y" * args.body}

    async def connect(self, agent_id: str) -> Agent:
        return await Agent.connect(agent_id, settings=self.settings, ensure=False)

    # ------------------------------------------------------------ direct send
    async def send_rounds(self) -> dict[str, list[LatencyStats]]:
        sender = await self.connect("send-sdk")
        try:
            async def sdk(r: int) -> Op:
                to, body = f"sink-sdk-{r}", self.body
                return lambda i: sender.send(to, "bench", body)

            async def raw(r: int) -> Op:
                subject, payload, js = Subjects.direct(f"sink-raw-{r}"), self.payload, self.js
                return lambda i: js.publish(subject, payload, headers={"Nats-Msg-Id": f"raw-{next(_ids)}"})

            return await interleaved_ops(self.args.rounds, self.args.send_ops, 250, {"sdk": sdk, "raw": raw})
        finally:
            await sender.close()

    # ------------------------------------------------------------ inbox drain
    async def drain_rounds(self) -> dict[str, list[LatencyStats]]:
        n = self.args.drain
        sender = await self.connect("drain-sender")

        async def fill(subject: str, msg_id: str) -> None:
            js = self.nc.jetstream(publish_async_max_pending=2000)
            futs = [await js.publish_async(subject, self.payload, headers={"Nats-Msg-Id": f"{msg_id}-{i}"})
                    for i in range(n)]
            await asyncio.gather(*futs)

        async def sdk(r: int) -> LatencyStats:
            agent_id = f"drain-sdk-{r}"
            await fill(Subjects.direct(agent_id), agent_id)  # same envelope bytes the SDK sends
            agent = await self.connect(agent_id)
            try:
                start = clock()
                await _sdk_drain(agent, n, lambda m: None)
                return LatencyStats(n, clock() - start, float("nan"), float("nan"), float("nan"))
            finally:
                await agent.close()

        async def raw(r: int) -> LatencyStats:
            subject = Subjects.direct(f"drain-raw-{r}")
            await fill(subject, f"drain-raw-{r}")
            psub = await _raw_consumer(self.js, f"drain-raw-{r}", subject)
            start = clock()
            await _raw_drain(psub, n, lambda m: None)
            elapsed = clock() - start
            await psub.unsubscribe()
            return LatencyStats(n, elapsed, float("nan"), float("nan"), float("nan"))

        try:
            return await alternate(self.args.rounds, {"sdk": sdk, "raw": raw})
        finally:
            await sender.close()

    # ------------------------------------------------------------ direct end to end
    async def e2e_rounds(self) -> dict[str, list[LatencyStats]]:
        n, rate = self.args.e2e_msgs, self.args.rate

        async def sdk(r: int) -> LatencyStats:
            a, b = await self.connect(f"e2e-a-{r}"), await self.connect(f"e2e-b-{r}")
            lat: list[float] = []
            try:
                await b.messaging.consumer.ensure()
                recv = asyncio.create_task(_sdk_drain(b, n, lambda m: lat.append(clock() - m.body)))
                await asyncio.sleep(0.05)
                await _pace(n, rate, lambda i: a.send(b.id, "bench", clock()))
                await asyncio.wait_for(recv, 30)
            finally:
                await a.close()
                await b.close()
            return LatencyStats.of(lat)

        async def raw_js(r: int) -> LatencyStats:
            subject = Subjects.direct(f"e2e-raw-{r}")
            recv_nc = await self.bus.raw_connect(RAW)
            lat: list[float] = []
            try:
                psub = await _raw_consumer(recv_nc.jetstream(), f"e2e-raw-{r}", subject)
                recv = asyncio.create_task(_raw_drain(psub, n, lambda m: lat.append(clock() - _sent_at(m.data))))
                await asyncio.sleep(0.05)
                size = len(self.payload)
                await _pace(n, rate, lambda i: self.js.publish(
                    subject, _stamp(size), headers={"Nats-Msg-Id": f"e2e-{next(_ids)}"}))
                await asyncio.wait_for(recv, 30)
            finally:
                await recv_nc.close()
            return LatencyStats.of(lat)

        async def raw_core(r: int) -> LatencyStats:
            return await self._core_fanout(f"bench.core.e2e.{r}", 1, n, rate)

        return await alternate(max(2, self.args.rounds - 1), {"sdk": sdk, "raw_js": raw_js, "raw_core": raw_core})

    async def _core_fanout(self, subject: str, receivers: int, n: int, rate: float | None) -> LatencyStats:
        """Core NATS: ``receivers`` connections subscribed to ``subject``; n publishes (paced or burst)."""
        conns = [await self.bus.raw_connect(RAW) for _ in range(receivers)]
        lat: list[float] = []
        done = asyncio.Event()
        total = n * receivers

        async def cb(m: Msg) -> None:
            lat.append(clock() - _sent_at(m.data))
            if len(lat) >= total:
                done.set()

        try:
            for c in conns:
                await c.subscribe(subject, cb=cb)
                await _barrier(c)
            size = len(self.payload)
            start = clock()
            if rate is None:
                for _ in range(n):
                    await self.nc.publish(subject, _stamp(size))
            else:
                await _pace(n, rate, lambda i: self.nc.publish(subject, _stamp(size)))
            await asyncio.wait_for(done.wait(), 30)
            elapsed = clock() - start
        finally:
            for c in conns:
                await c.close()
        return LatencyStats.of(lat, elapsed=elapsed, n=total)

    # ------------------------------------------------------------ broadcast to 20
    async def broadcast_rounds(self, rate: float | None, n: int) -> dict[str, list[LatencyStats]]:
        k = self.args.agents

        async def sdk(r: int) -> LatencyStats:
            board = f"bcast-{'burst' if rate is None else 'rate'}-{r}"
            sender = await self.connect(f"{board}-sender")
            agents = [await self.connect(f"{board}-{i}") for i in range(k)]
            lat: list[float] = []
            try:
                for agent in agents:
                    await agent.join(board)
                tasks = [asyncio.create_task(_sdk_drain(agent, n, lambda m: lat.append(clock() - m.body)))
                         for agent in agents]
                await asyncio.sleep(0.1)
                b = sender.board(board)
                start = clock()
                if rate is None:
                    for _ in range(n):
                        await b.broadcast("bench", clock())
                else:
                    await _pace(n, rate, lambda i: b.broadcast("bench", clock()))
                await asyncio.wait_for(asyncio.gather(*tasks), 60)
                elapsed = clock() - start
            finally:
                for agent in [sender, *agents]:
                    await agent.close()
            return LatencyStats.of(lat, elapsed=elapsed, n=n * k)

        async def raw_js(r: int) -> LatencyStats:
            subject = Subjects.broadcast(f"bcast-raw-{'burst' if rate is None else 'rate'}-{r}")
            conns = [await self.bus.raw_connect(RAW) for _ in range(k)]
            lat: list[float] = []
            try:
                psubs = [await _raw_consumer(c.jetstream(), f"bc-{'b' if rate is None else 'r'}-{r}-{i}", subject)
                         for i, c in enumerate(conns)]
                tasks = [asyncio.create_task(_raw_drain(p, n, lambda m: lat.append(clock() - _sent_at(m.data))))
                         for p in psubs]
                await asyncio.sleep(0.1)
                size = len(self.payload)

                async def send(i: int) -> None:
                    await self.js.publish(subject, _stamp(size), headers={"Nats-Msg-Id": f"bc-{next(_ids)}"})

                start = clock()
                if rate is None:
                    for i in range(n):
                        await send(i)
                else:
                    await _pace(n, rate, send)
                await asyncio.wait_for(asyncio.gather(*tasks), 60)
                elapsed = clock() - start
            finally:
                for c in conns:
                    await c.close()
            return LatencyStats.of(lat, elapsed=elapsed, n=n * k)

        async def raw_core(r: int) -> LatencyStats:
            return await self._core_fanout(f"bench.core.bc.{'b' if rate is None else 'r'}.{r}", k, n, rate)

        return await alternate(max(2, self.args.rounds - 1), {"sdk": sdk, "raw_js": raw_js, "raw_core": raw_core})

    # ------------------------------------------------------------ request / reply
    async def request_rounds(self) -> dict[str, list[LatencyStats]]:
        server = await self.connect("rpc-server")
        client = await self.connect("rpc-client")
        raw_server = await self.bus.raw_connect(RAW)
        try:
            await server.handle("echo", lambda req: req.body)
            reply = self.payload

            async def respond(m: Msg) -> None:
                await m.respond(reply)

            await raw_server.subscribe("bench.rpc.raw", cb=respond)
            await _barrier(raw_server)
            body = self.body

            async def sdk(r: int) -> Op:
                return lambda i: client.request("rpc-server", "echo", body)

            async def raw(r: int) -> Op:
                payload, nc = self.payload, self.nc
                return lambda i: nc.request("bench.rpc.raw", payload, timeout=5)

            return await interleaved_ops(self.args.rounds, self.args.rpc_ops, 250, {"sdk": sdk, "raw": raw})
        finally:
            await server.close()
            await client.close()
            await raw_server.close()


def _med(stats: list[LatencyStats], attr: str) -> float:
    return median([float(getattr(s, attr)) for s in stats])


def _paired(a: list[LatencyStats], b: list[LatencyStats], attr: str) -> float:
    return median([float(getattr(x, attr)) / float(getattr(y, attr)) for x, y in zip(a, b, strict=True)])


async def main(args: argparse.Namespace) -> None:
    started = clock()
    async with embedded_nats(args.sync_interval, open_bus=args.insecure_open_bus, settings=Settings()) as bus, \
            system_services(bus):
        nc = await bus.raw_connect(RAW)
        bench = Bench(args, bus, nc)
        raw = "no credential" if bus.open_bus else f"the {RAW}'s credential, the same CA"
        print(f"messaging bench: {bus.label}; SDK agents with their own credentials, raw nats-py with {raw}; "
              f"nats-server {bus.url}, nats-py {_version('nats-py')}, "
              f"Python {platform.python_version()}, envelope {len(bench.payload)} B, "
              f"{args.rounds} rounds, {args.agents} broadcast receivers\n")

        send = await bench.send_rounds()
        drain = await bench.drain_rounds()
        e2e = await bench.e2e_rounds()
        bc_rate = await bench.broadcast_rounds(args.bcast_rate, args.bcast_msgs)
        bc_burst = await bench.broadcast_rounds(None, args.burst_msgs)
        rpc = await bench.request_rounds()
        await nc.close()

    t = Table("Throughput (SDK / raw; higher is better)", "sdk", "raw")
    t.add("direct send, awaited one by one", _med(send["sdk"], "rate"), _med(send["raw"], "rate"), "/s",
          ratio=_paired(send["sdk"], send["raw"], "rate"), note="raw: js.publish + Nats-Msg-Id")
    t.add(f"inbox drain of {args.drain} (fetch+ack)", _med(drain["sdk"], "rate"), _med(drain["raw"], "rate"),
          "/s", ratio=_paired(drain["sdk"], drain["raw"], "rate"), note="raw: pull consumer, no decoding")
    t.add(f"broadcast burst to {args.agents}, deliveries", _med(bc_burst["sdk"], "rate"),
          _med(bc_burst["raw_js"], "rate"), "/s", ratio=_paired(bc_burst["sdk"], bc_burst["raw_js"], "rate"),
          note=f"{args.burst_msgs} msgs; raw: {args.agents} pull consumers")
    t.add(f"broadcast burst to {args.agents} vs core", _med(bc_burst["sdk"], "rate"),
          _med(bc_burst["raw_core"], "rate"), "/s", ratio=_paired(bc_burst["sdk"], bc_burst["raw_core"], "rate"),
          note="raw: core publish, not persisted")
    t.add("request/reply", _med(rpc["sdk"], "rate"), _med(rpc["raw"], "rate"), "/s",
          ratio=_paired(rpc["sdk"], rpc["raw"], "rate"), note="raw: nc.request to a core responder")
    print(t.render(), "\n")

    lt = Table("Latency (SDK / raw; lower is better)", "sdk", "raw")
    for label, stats, base, note in [
        ("direct send ack", send["sdk"], send["raw"], "js.publish"),
        (f"direct end-to-end @{args.rate:g}/s", e2e["sdk"], e2e["raw_js"], "js.publish + pull consumer"),
        (f"direct end-to-end @{args.rate:g}/s vs core", e2e["sdk"], e2e["raw_core"], "core pub/sub"),
        (f"broadcast to {args.agents} e2e @{args.bcast_rate:g}/s", bc_rate["sdk"], bc_rate["raw_js"],
         "per delivery; 20 pull consumers"),
        (f"broadcast to {args.agents} e2e vs core", bc_rate["sdk"], bc_rate["raw_core"], "20 core subscribers"),
        ("request/reply round trip", rpc["sdk"], rpc["raw"], "nc.request"),
    ]:
        for p in ("p50", "p99"):
            lt.add(f"{label} {p}", _med(stats, p), _med(base, p), "us", ratio=_paired(stats, base, p), note=note)
    print(lt.render())
    allp = [percentile([s.p99 for s in bc_burst["sdk"]], 50)]
    print(f"\nbroadcast burst e2e p99 (sdk): {allp[0] * 1e3:.1f} ms; total run {clock() - started:.0f} s")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--send-ops", type=int, default=1500)
    p.add_argument("--rpc-ops", type=int, default=1000)
    p.add_argument("--drain", type=int, default=4000)
    p.add_argument("--e2e-msgs", type=int, default=1000)
    p.add_argument("--rate", type=float, default=500.0, help="direct end-to-end send rate (msg/s)")
    p.add_argument("--agents", type=int, default=20)
    p.add_argument("--bcast-rate", type=float, default=100.0, help="broadcast end-to-end rate (msg/s)")
    p.add_argument("--bcast-msgs", type=int, default=200)
    p.add_argument("--burst-msgs", type=int, default=500)
    p.add_argument("--body", type=int, default=100, help="bytes of text in the message body")
    p.add_argument("--sync-interval", default="1s")
    add_bus_option(p)
    return p.parse_args()


if __name__ == "__main__":
    asyncio.run(main(_args()))
