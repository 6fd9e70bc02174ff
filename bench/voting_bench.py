"""Voting benchmark: from the deciding ballot to the committed outcome.

Measures, on a nats-server it starts itself (JetStream, temporary directory;
with authorization as ``blackboard dev`` runs it, JWT identities and TLS,
unless ``--insecure-open-bus``), with the worker's vote committer running
beside (``bench._common.system_services``):

* **deciding ballot → committed outcome**, as the deciding voter sees it:
  ``await board.vote(...)`` for the ballot that settles a majority of three,
  from the call to its return with the committed outcome (publish the ballot,
  follow the stream up to it; the commit: tally, record the outcome with CAS,
  write the accepted value to the board entry with CAS, mark it applied, is
  the committer's under authorization, where agents may not commit, and the
  voter's own on the open bus);
* the same, **with the proposer waiting** on ``outcome()`` (it races the voter
  to commit): deciding call → the proposer's ``outcome()`` returns;
* the parts: a counted, non-deciding ``vote`` (publish + fate) and the commit
  alone (``VoteStore.commit`` as the worker, on a decided proposal nobody
  committed, on a board the committer leaves alone);
* the raw layer in the same run: a nats-py JetStream publish awaited for its
  ack, and a direct get (the commit is five such round trips: a read of the
  target, the outcome CAS, a scan, the entry CAS, the applied CAS), on the
  board's KV stream, connected with the proposer's credential.

Variants alternate round by round (order reversed every round); figures are
medians over rounds, ratios are to the raw publish round trip.

Run: ``python bench/voting_bench.py`` (15-30 s on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents_sdk import Agent
from bench._common import (
    LatencyStats,
    Table,
    add_bus_option,
    alternate,
    embedded_nats,
    median,
    system_services,
)
from blackboard.client.connection import connect_nats
from blackboard.client.consensus import ProposalFollower, VoteStore
from blackboard.protocol.schemas import Ballot
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings

BOARD = "bench"
#: The board of "commit alone": the committer running beside commits only BOARD's proposals.
COMMIT_BOARD = "bench-commit"


async def timed(n: int, op: Callable[[int], Awaitable[float | None]]) -> LatencyStats:
    """Run ``op`` n times; it returns its own latency (or None: time the call)."""
    latencies: list[float] = []
    start = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        own = await op(i)
        latencies.append(own if own is not None else time.perf_counter() - t0)
    return LatencyStats.of(latencies, time.perf_counter() - start)


async def run(args: argparse.Namespace) -> None:
    async with embedded_nats(open_bus=args.insecure_open_bus, settings=Settings()) as bus, \
            system_services(bus, committer_board=BOARD):
        settings = bus.settings
        print(f"voting_bench: {bus.label}", flush=True)
        voters = [await Agent.connect(f"voter{i}", settings=settings) for i in range(3)]
        proposer = voters[0]
        raw = await bus.raw_connect(proposer.id)
        js = raw.jetstream()
        subjects = Subjects(settings.board.bucket)
        rawnc = await connect_nats(settings.nats, name="raw-committer")  # the worker's identity
        store = VoteStore(rawnc, settings, name="raw-committer")
        counter = iter(range(10**9))

        async def new_proposal(key: str, board: str = BOARD) -> str:
            p = await proposer.board(board).propose("facts", key, ["x", "y"], voters=[v.id for v in voters])
            for v in voters[1:]:  # followers started outside the timing
                await v.voting.follower(board, p.id)
            return p.id

        async def deciding(r: int) -> LatencyStats:
            pids = [await new_proposal(f"d{r}-{i}") for i in range(args.per_round)]
            for pid in pids:
                await voters[1].board(BOARD).vote(pid, "x")

            async def op(i: int) -> float:
                t0 = time.perf_counter()
                receipt = await voters[2].board(BOARD).vote(pids[i], "x")
                assert receipt.outcome is not None and receipt.outcome.revision is not None
                return time.perf_counter() - t0

            return await timed(len(pids), op)

        async def with_waiter(r: int) -> LatencyStats:
            pids = [await new_proposal(f"w{r}-{i}") for i in range(args.per_round)]
            for pid in pids:
                await voters[1].board(BOARD).vote(pid, "x")
                await proposer.voting.follower(BOARD, pid)

            async def op(i: int) -> float:
                waiting = asyncio.ensure_future(proposer.voting.outcome(BOARD, pids[i], timeout=10))
                await asyncio.sleep(0)
                t0 = time.perf_counter()
                await voters[2].board(BOARD).vote(pids[i], "x")
                outcome = await waiting
                assert outcome.revision is not None
                return time.perf_counter() - t0

            return await timed(len(pids), op)

        async def counted(r: int) -> LatencyStats:
            pids = [await new_proposal(f"c{r}-{i}") for i in range(args.per_round)]
            return await timed(len(pids), lambda i: _none(voters[1].board(BOARD).vote(pids[i], "x")))

        async def commit_only(r: int) -> LatencyStats:
            decided = []
            for i in range(args.per_round):
                pid = await new_proposal(f"k{r}-{i}", COMMIT_BOARD)
                for v in ("voter1", "voter2"):  # ballots of a voter that "crashed" before committing
                    await store.publish_ballot(COMMIT_BOARD, Ballot(id=f"{pid}-{v}", proposal_id=pid, voter=v,
                                                             choice=0, created_at=datetime.now(UTC)))
                decided.append(pid)
            # The decided outcomes, computed outside the timing.
            outcomes = []
            for pid in decided:
                async with ProposalFollower(store, COMMIT_BOARD, pid) as f:
                    await f.wait_for(lambda log: log.decided is not None, timeout=5)
                    assert f.log.decided is not None
                    outcomes.append(f.log.decided)
            return await timed(len(outcomes), lambda i: _none(store.commit(outcomes[i])))

        async def raw_publish(r: int) -> LatencyStats:
            payload = json.dumps({"n": r}).encode()
            return await timed(args.per_round, lambda i: _none(
                js.publish(subjects.entry(BOARD, "raw", f"p{r}-{next(counter)}"), payload)))

        async def raw_get(r: int) -> LatencyStats:
            subject = subjects.entry(BOARD, "raw", f"get{r}")
            await js.publish(subject, b"x")
            return await timed(args.per_round, lambda i: _none(
                raw.request(Subjects.direct_get(subjects.kv_stream, subject), b"", timeout=5)))

        variants = {"deciding": deciding, "waiter": with_waiter, "counted": counted, "commit": commit_only,
                    "raw_publish": raw_publish, "raw_get": raw_get}
        await alternate(1, variants)  # warm-up round
        results = await alternate(args.rounds, variants)
        for a in voters:
            await a.close()
        await store.close()
        await rawnc.close()
        await raw.close()

    def med(name: str, field: str) -> float:
        return median([getattr(s, field) for s in results[name]])

    base50, base99 = med("raw_publish", "p50"), med("raw_publish", "p99")
    n = args.rounds * args.per_round
    table = Table(f"Voting, {n} proposals per figure ({args.rounds} rounds x {args.per_round}), "
                  f"nats-server on {platform.machine()}, Python {platform.python_version()}",
                  measured_label="voting", baseline_label="raw publish")
    rows = [("deciding ballot -> committed (voter), p50", "deciding", "p50", base50),
            ("deciding ballot -> committed (voter), p99", "deciding", "p99", base99),
            ("deciding ballot -> proposer's outcome(), p50", "waiter", "p50", base50),
            ("deciding ballot -> proposer's outcome(), p99", "waiter", "p99", base99),
            ("counted ballot (publish + fate), p50", "counted", "p50", base50),
            ("commit alone (5 round trips), p50", "commit", "p50", base50),
            ("commit alone (5 round trips), p99", "commit", "p99", base99),
            ("raw direct get, p50", "raw_get", "p50", base50)]
    for label, name, field, base in rows:
        table.add(label, med(name, field), base, "ms")
    table.add("raw publish+ack, p50", base50, base50, "ms")
    print(table.render())


async def _none(aw: Awaitable[object]) -> None:
    await aw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=40, help="proposals per round and variant")
    add_bus_option(parser)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
