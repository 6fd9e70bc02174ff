"""Failover benchmark: write gaps while nodes of an R3 cluster die, next to its leader elections.

Starts three nats-server nodes from ``docker/nats/nats.conf`` (as
``tests/_cluster.py`` does: loopback ports, a temporary store; the file's
authorization and TLS, with a throw-away identity authority's rendered config
and dev certificates), creates the assets with three replicas as the
operator, and has agents (each with its own credential) write board entries
continuously (sequential writers, the default ``nats.write_timeout`` and
``nats.write_attempt_timeout``) while one node at a time is killed
(``kill -9``): the KV stream's leader, or a follower. Each node is restarted
after ``--down`` seconds and caught up before the next kill.

For each kill it measures, in the same run:

* the election: seconds from the kill until stream info names a new leader
  (polled every 50 ms), or the stream's leader-elected advisory, whichever
  comes first (0 when a follower was killed: nothing to elect);
* the write gap: the longest time between two acknowledged writes of one
  writer that spans the kill;

and whether the gap stayed within election + 1 s (the failover target: a write
in flight goes through within about a second of the cluster being able to
take it). It prints the gaps' and elections' p50/p90/max, the failed writes
(none may fail), the writes lost or applied twice (checked on the stream), and
"target met: yes/no".

Run: ``python bench/failover_bench.py`` (about 1 min; ``--kills`` sets how many).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` and ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from agents_sdk import Agent, BlackboardError
from bench._common import (
    AUTH_LABEL,
    BenchAuth,
    add_bus_option,
    make_bench_auth,
    percentile,
    secured_settings,
)
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings
from tests._auth import TestAuth
from tests._cluster import NatsCluster

BOARD = "failover"
#: The advisory a stream's new leader publishes (a monitoring subject: the SDK never uses it).
_LEADER_ELECTED = "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.{stream}"
TARGET_SLACK = 1.0


@dataclass
class Kill:
    victim: str  # "leader" or "follower"
    node: str
    at: float
    election: float = 0.0
    gap: float = 0.0

    @property
    def met(self) -> bool:
        return self.gap <= self.election + TARGET_SLACK


@dataclass
class Writes:
    acks: list[list[float]] = field(default_factory=list)  # per writer: monotonic time of each ack
    revisions: dict[str, int] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)


async def _stream_leader(js: JetStreamContext, stream: str) -> str | None:
    with contextlib.suppress(nats.errors.Error, TimeoutError):
        info = await js.stream_info(stream)
        if info.cluster is not None:
            return info.cluster.leader
    return None


async def _new_leader(js: JetStreamContext, stream: str, old: str) -> str:
    """The stream's leader once it is another node than ``old`` (polled every 50 ms)."""
    for _ in itertools.count():
        leader = await _stream_leader(js, stream)
        if leader is not None and leader != old:
            return leader
        await asyncio.sleep(0.05)
    raise AssertionError("unreachable")


async def _advised(elected: asyncio.Queue[str], old: str) -> str:
    """The first leader-elected advisory naming another node than ``old``."""
    while (leader := await elected.get()) == old:
        pass
    return leader


async def _settled(js: JetStreamContext, stream: str) -> str:
    """The leader once there is one and both followers are current."""
    while True:
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            info = await js.stream_info(stream)
            c = info.cluster
            if c is not None and c.leader and len(c.replicas or []) == 2 \
                    and all(r.current and not r.offline for r in c.replicas or []):
                return c.leader
        await asyncio.sleep(0.1)


async def _writer(agent: Agent, name: str, writes: Writes, stop: asyncio.Event, pause: float) -> None:
    board = agent.board(BOARD)
    acks: list[float] = []
    writes.acks.append(acks)
    for i in itertools.count():
        if stop.is_set():
            return
        key = f"{name}-{i}"
        try:
            writes.revisions[key] = await board.put("s", key, i)
        except BlackboardError as exc:
            writes.failed.append(f"{key}: {exc!r}")
            continue
        acks.append(time.monotonic())
        await asyncio.sleep(pause)


def _gap_across(acks: list[list[float]], at: float) -> float:
    """The longest interval between consecutive acks of one writer that contains ``at``."""
    longest = 0.0
    for times in acks:
        for before, after in itertools.pairwise(times):
            if before <= at < after:
                longest = max(longest, after - before)
                break
    return longest


async def run(args: argparse.Namespace) -> bool:
    with tempfile.TemporaryDirectory(prefix="failover-bench-") as tmp:
        auth = make_bench_auth(Path(tmp) / "auth")
        cluster = NatsCluster(Path(tmp), TestAuth(auth.authority, auth.tls))
        cluster.start()
        try:
            return await _run(cluster, auth, Path(tmp), args)
        finally:
            cluster.stop()


async def _run(cluster: NatsCluster, auth: BenchAuth, root: Path, args: argparse.Namespace) -> bool:
    settings = secured_settings(Settings(), cluster.urls, auth, root)
    settings = settings.model_copy(update={"board": settings.board.model_copy(update={"replicas": 3})})
    print(f"failover_bench: {AUTH_LABEL}", flush=True)
    stream = Subjects(settings.board.bucket).kv_stream
    nc = await connect_nats(settings.nats.model_copy(update={"creds_file": auth.creds("operator")}),
                            name="failover-bench")
    js = nc.jetstream(timeout=1.0)
    await ensure_streams(nc.jetstream(), settings, ready_timeout=60)
    # Each stream leader, once elected, announces it.
    elected: asyncio.Queue[str] = asyncio.Queue()

    async def on_advisory(msg: Msg) -> None:
        with contextlib.suppress(ValueError):
            elected.put_nowait(json.loads(msg.data).get("leader", ""))

    await nc.subscribe(_LEADER_ELECTED.format(stream=stream), cb=on_advisory)
    leader = await _settled(js, stream)
    writes = Writes()
    stop = asyncio.Event()
    kills: list[Kill] = []
    victims = ["leader", "leader", "follower"]
    async with contextlib.AsyncExitStack() as stack:
        agents = [await stack.enter_async_context(Agent.connect(f"writer{a}", settings=settings))
                  for a in range(args.agents)]
        tasks = [asyncio.create_task(_writer(agent, f"a{a}w{w}", writes, stop, args.pause))
                 for a, agent in enumerate(agents) for w in range(args.writers)]
        print(f"cluster up, leader {leader}; {len(tasks)} writers on {len(agents)} connections; "
              f"write_timeout {settings.nats.write_timeout:g}s, "
              f"write_attempt_timeout {settings.nats.write_attempt_timeout:g}s", flush=True)
        await asyncio.sleep(args.settle)
        for k in range(args.kills):
            victim = victims[k % len(victims)]
            leader = await _settled(js, stream)  # afresh: leaders may move by themselves
            node = leader if victim == "leader" else next(
                cluster.name(i) for i in range(cluster.size) if cluster.name(i) != leader)
            kill = Kill(victim, node, time.monotonic())
            while not elected.empty():  # earlier elections (other streams' too: filtered below)
                elected.get_nowait()
            cluster.kill(cluster.index_of(node))
            if victim == "leader":
                # The new leader's advisory, or stream info naming it: whichever comes first.
                polled = asyncio.create_task(_new_leader(js, stream, node))
                advised = asyncio.create_task(_advised(elected, node))
                await asyncio.wait({polled, advised}, return_when=asyncio.FIRST_COMPLETED)
                kill.election = time.monotonic() - kill.at
                for task in (polled, advised):
                    task.cancel()
            await asyncio.sleep(max(0.0, args.down - (time.monotonic() - kill.at)))
            await asyncio.to_thread(cluster.start, cluster.index_of(node))
            leader = await _settled(js, stream)
            await asyncio.sleep(args.settle)
            kills.append(kill)
            print(f"  kill {k + 1}: {victim} {node}, election {kill.election:.2f}s", flush=True)
        stop.set()
        await asyncio.gather(*tasks)
        for kill in kills:
            kill.gap = _gap_across(writes.acks, kill.at)
        counts = (await js.stream_info(stream, subjects_filter=Subjects(settings.board.bucket)
                                       .entry_filter(BOARD, "s"))).state.subjects or {}
    await nc.close()
    subjects = Subjects(settings.board.bucket)
    stored = [counts.get(subjects.entry(BOARD, "s", key), 0) for key in writes.revisions]
    lost, doubled = sum(1 for c in stored if c == 0), sum(1 for c in stored if c > 1)
    return _report(kills, writes, lost, doubled)


def _report(kills: list[Kill], writes: Writes, lost: int, doubled: int) -> bool:
    print()
    print(f"{'kill':>4}  {'victim':<8}  {'election':>9}  {'write gap':>9}  within election + {TARGET_SLACK:g} s")
    for i, kill in enumerate(kills, 1):
        print(f"{i:>4}  {kill.victim:<8}  {kill.election:>8.2f}s  {kill.gap:>8.2f}s  "
              f"{'yes' if kill.met else 'NO'}")
    gaps = [k.gap for k in kills]
    elections = [k.election for k in kills if k.victim == "leader"]
    over = [k.gap - k.election for k in kills]

    def dist(values: list[float]) -> str:
        return (f"p50 {percentile(values, 50):.2f}s  p90 {percentile(values, 90):.2f}s  "
                f"max {max(values, default=float('nan')):.2f}s")

    print()
    print(f"write gaps:              {dist(gaps)}")
    print(f"leader elections:        {dist(elections)}")
    print(f"gap beyond the election: {dist(over)}")
    total = sum(len(a) for a in writes.acks)
    print(f"writes acknowledged {total}, failed {len(writes.failed)}, lost {lost}, applied twice {doubled}")
    for failure in writes.failed[:5]:
        print(f"  failed: {failure}")
    met = bool(kills) and all(k.met for k in kills) and not writes.failed and not lost and not doubled
    print(f"target met: {'yes' if met else 'no'} (every gap within election + {TARGET_SLACK:g} s, "
          "no write failed, none lost or applied twice)")
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=6, help="nodes killed, one at a time (default 6)")
    parser.add_argument("--agents", type=int, default=2, help="agent connections (default 2)")
    parser.add_argument("--writers", type=int, default=2, help="sequential writers per agent (default 2)")
    parser.add_argument("--pause", type=float, default=0.005, help="seconds between a writer's writes")
    parser.add_argument("--down", type=float, default=1.0, help="seconds a killed node stays down (default 1)")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds of writing between kills")
    add_bus_option(parser)
    args = parser.parse_args()
    if args.insecure_open_bus:
        parser.error("the compose file's cluster (docker/nats/nats.conf) runs with authorization and TLS; "
                     "its failover is measured that way only")
    sys.exit(0 if asyncio.run(run(args)) else 1)


if __name__ == "__main__":
    main()
