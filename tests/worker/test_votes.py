"""Voting with the worker: many agents under every policy against a recount
from PostgreSQL, ballots' fates in PostgreSQL (a ballot whose payload names
another voter than its subject is a dead letter), deadlines closed by the
worker's committer (also across a kill -9), and two workers racing agents on
an open bus to commit."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from agents_sdk import Agent
from blackboard.client.connection import connect_nats
from blackboard.client.consensus import ProposalFollower, VoteStore
from blackboard.consensus.log import VoteMessage, same_outcome
from blackboard.consensus.tally import StampedBallot, tally
from blackboard.protocol import codec
from blackboard.protocol.errors import OutcomeTimeoutError, ProposalClosedError, VoteError
from blackboard.protocol.schemas import Ballot, Outcome, Policy, Proposal
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings
from tests._committer import connect_agent
from tests._worker_helpers import (
    StartWorker,
    credentials,
    running_worker,
    spawn_worker,
    stop_worker,
    worker_settings,
)
from tests.conftest import make_settings

pytestmark = pytest.mark.asyncio

FAR = datetime(2100, 1, 1, tzinfo=UTC)


async def until_past(deadline: datetime | None, margin: float = 0.05) -> None:
    """Sleep until this machine's clock is past ``deadline``."""
    assert deadline is not None
    await asyncio.sleep(max(0.0, (deadline - datetime.now(UTC)).total_seconds()) + margin)


def _voting_settings(base: Settings, name: str, **kw: Any) -> Settings:
    return worker_settings(base, name=name, embed=False, serve_search=False, deadline_interval=0.1, batch_wait=0.02,
                           **kw)


async def recount(dsn: str, board: str, pid: str) -> tuple[Outcome | None, dict[int, tuple[str, str | None]]]:
    """Re-run the tally on the proposal and ballots read back from PostgreSQL."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        prow = await (await conn.execute(
            "SELECT seq, body FROM bb_proposals WHERE board = %s AND proposal_id = %s", (board, pid))).fetchone()
        rows = await (await conn.execute(
            "SELECT seq, stored_at, body, status, reason FROM bb_ballots WHERE board = %s AND proposal_id = %s "
            "ORDER BY seq", (board, pid))).fetchall()
    assert prow is not None
    proposal = Proposal.model_validate(prow[1], strict=True)
    stamped = [StampedBallot(seq, at, Ballot.model_validate(body, strict=True)) for seq, at, body, _, _ in rows]
    outcome = tally(proposal, stamped, FAR, proposal_sequence=prow[0]).outcome
    return outcome, {seq: (status, reason) for seq, _, _, status, reason in rows}


async def sql_counts(dsn: str, board: str, pid: str) -> Counter[str]:
    """Counted ballots per choice, by SQL alone."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        rows = await (await conn.execute(
            "SELECT choice, count(*) FROM bb_ballots WHERE board = %s AND proposal_id = %s AND status = 'counted' "
            "GROUP BY choice", (board, pid))).fetchall()
    return Counter({choice: n for choice, n in rows})


async def outcome_row(dsn: str, board: str, pid: str) -> tuple[Any, ...] | None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        return await (await conn.execute(
            "SELECT o.status, o.revision, o.closed_by, p.status FROM bb_outcomes o JOIN bb_proposals p "
            "USING (board, proposal_id) WHERE o.board = %s AND o.proposal_id = %s", (board, pid))).fetchone()


@pytest.mark.slow
async def test_25_agents_under_every_policy_match_a_recount_from_postgres(
        pg_settings: Settings, unique: str) -> None:
    rng = random.Random(4)
    settings = _voting_settings(pg_settings, unique)
    dsn = settings.postgres.dsn.get_secret_value()
    async with running_worker(settings) as worker:
        agents = [await connect_agent(f"{unique}-{i:02d}", settings) for i in range(25)]
        try:
            ids = [a.id for a in agents]
            board = agents[0].board(unique)
            soon = timedelta(seconds=4)
            specs: list[tuple[str, dict[str, Any], Callable[[int], Any]]] = [
                ("majority", dict(candidates=["A", "B", "C"], voters=ids),
                 lambda i: rng.choice(["A", "B", "C", "B"])),
                ("threshold", dict(candidates=["yes"], policy=Policy(kind="threshold", threshold=2 / 3, quorum=10),
                                   voters=ids, deadline=soon),
                 lambda i: rng.choice(["accept", "accept", "reject", "abstain"])),
                ("unanimous", dict(candidates=["u"], policy=Policy(kind="unanimous"), voters=ids[:10]),
                 lambda i: "accept"),
                ("dissent", dict(candidates=["d1", "d2"], policy=Policy(kind="unanimous", quorum=3), voters=ids),
                 lambda i: "d1" if i % 7 else "d2"),
                ("weighted", dict(candidates=["w1", "w2"], voters=ids,
                                  policy=Policy(kind="weighted", weights={ids[0]: 10, ids[1]: 5, ids[2]: 0.5})),
                 lambda i: rng.choice(["w1", "w2"])),
                ("open", dict(candidates=["o1", "o2"], voters=None, deadline=soon),
                 lambda i: rng.choice(["o1", "o2", "reject"])),
                ("noquorum", dict(candidates=["n"], policy=Policy(quorum=20), voters=ids, deadline=soon),
                 lambda i: "accept" if i < 5 else None),
            ]
            handles = {name: await board.propose("policies", name, question=name, **kw) for name, kw, _ in specs}
            errors: Counter[str] = Counter()

            async def cast(i: int, agent: Agent) -> None:
                order = list(specs)
                rng.shuffle(order)
                for name, _, choose in order:
                    choice = choose(i)
                    if choice is None:
                        continue
                    votes = [choice, choose(i)] if i % 5 == 0 else [choice]  # some change their mind
                    for c in votes:
                        try:
                            await agent.board(unique).vote(handles[name].id, c, reason=f"{agent.id} on {name}")
                        except VoteError as exc:
                            errors[type(exc).__name__] += 1

            started = time.monotonic()
            await asyncio.gather(*[cast(i, a) for i, a in enumerate(agents)])
            print(f"25 agents cast their ballots in {time.monotonic() - started:.2f}s: {dict(errors)}")
            # Every agent waits for every outcome; the worker closes the deadlines.
            results = await asyncio.gather(*[a.voting.outcome(unique, h.id, timeout=20)
                                             for a in agents for h in handles.values()])
        finally:
            for a in agents:
                await a.close()
        await worker.wait_caught_up(30)
        committed = {name: results[k] for k, name in enumerate(handles)}
        for k, outcome in enumerate(results):
            assert outcome == committed[list(handles)[k % len(handles)]]  # every agent saw the same
        assert committed["unanimous"].status == "accepted" and committed["dissent"].status == "rejected"
        assert committed["noquorum"].status == "no_quorum" and committed["open"].closed_by == "deadline"
        assert errors["ProposalClosedError"] > 0 and errors["IneligibleVoterError"] > 0
        assert set(errors) <= {"ProposalClosedError", "IneligibleVoterError", "DeadlinePassedError"}
        for name, handle in handles.items():
            outcome = committed[name]
            again, fates = await recount(dsn, unique, handle.id)
            assert again is not None and same_outcome(again, outcome), name
            counted = {cb.sequence for cb in outcome.counted_ballots}
            assert {s for s, (st, _) in fates.items() if st == "counted"} == counted, name
            assert all(st in ("counted", "superseded", "rejected") for st, _ in fates.values())
            by_sql = await sql_counts(dsn, unique, handle.id)
            expected = Counter({str(i): n for i, n in enumerate(outcome.counts.votes) if n})
            expected.update({k: n for k, n in (("reject", outcome.counts.reject),
                                               ("abstain", outcome.counts.abstain)) if n})
            assert by_sql == expected, name
            row = await outcome_row(dsn, unique, handle.id)
            assert row == (outcome.status, outcome.revision, outcome.closed_by, outcome.status), name


async def test_postgres_records_rejected_ballots_with_their_reasons(pg_settings: Settings, unique: str) -> None:
    settings = _voting_settings(pg_settings, unique)
    dsn = settings.postgres.dsn.get_secret_value()
    async with running_worker(settings) as worker:
        a, b, c = [await connect_agent(f"{unique}-{n}", settings) for n in "abc"]
        try:
            board = a.board(unique)
            p = await board.propose("s", "k", ["x", "y"], voters=[a.id, b.id])
            with pytest.raises(VoteError):
                await c.board(unique).vote(p.id, "x")  # ineligible
            with pytest.raises(VoteError):
                await board.vote("missing", "x")  # unknown proposal
            await board.vote(p.id, "x")
            await b.board(unique).vote(p.id, "x")
            with pytest.raises(ProposalClosedError):
                await b.board(unique).vote(p.id, "y")
            await p.outcome(timeout=5)
        finally:
            for agent in (a, b, c):
                await agent.close()
        await worker.wait_caught_up(30)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        rows = await (await conn.execute(
            "SELECT proposal_id, voter, choice, status, reason FROM bb_ballots WHERE board = %s ORDER BY seq",
            (unique,))).fetchall()
    assert rows == [
        (p.id, c.id, "0", "rejected", "ineligible"),
        ("missing", a.id, "abstain", "rejected", "unknown_proposal"),
        (p.id, a.id, "0", "counted", None),
        (p.id, b.id, "0", "counted", None),
        (p.id, b.id, "1", "rejected", "closed"),
    ]


async def test_the_worker_closes_a_proposal_at_its_deadline(pg_settings: Settings, unique: str,
                                                              start_worker: StartWorker) -> None:
    settings = _voting_settings(pg_settings, unique)
    worker = await start_worker(settings)
    async with await connect_agent(unique, settings) as agent:
        p = await agent.board(unique).propose("s", "k", ["x"], voters=[agent.id, "other"],
                                              policy=Policy(quorum=2), deadline=timedelta(seconds=2))
        await agent.board(unique).vote(p.id, "x")  # (before the deadline, even on a loaded machine)
        outcome = await p.outcome(timeout=10)  # the handle never closes: the worker does
        assert outcome.status == "no_quorum" and outcome.closed_by == "deadline"
        assert outcome.decided_at == p.proposal.deadline
        assert worker.committer is not None and worker.committer.stats.close_requests >= 1


async def test_two_workers_and_agents_race_to_commit_exactly_once(pg_settings: Settings, unique: str) -> None:
    settings = _voting_settings(pg_settings, unique, vote_commit_grace=0.0)
    async with running_worker(settings) as w1, running_worker(settings) as w2:
        nc = await connect_nats(settings.nats, name="raw")
        store = VoteStore(nc, settings, name="raw")
        # Agents under credentials commit nothing: they wait for the two workers' committers.
        agents = [await connect_agent(f"{unique}-{i}", settings) for i in range(4)]
        try:
            # Decided by ballots nobody commits (stored raw, each signed by its voter), and one
            # closed by deadline.
            voters = [f"{unique}-v{i}" for i in range(3)]
            decided = await agents[0].board(unique).propose("s", "decided", ["x", "y"], voters=voters)
            # Its ballot comes right away and the deadline leaves it 2 s: a loaded machine's ballot
            # once came after a 0.4 s deadline, behind the three voters' connections below.
            timed = await agents[0].board(unique).propose("s", "timed", ["x"], deadline=timedelta(seconds=2))
            await agents[1].board(unique).vote(timed.id, "accept")
            for v in voters:
                vnc = await connect_nats(settings, name=f"raw-{v}", credentials=credentials(v))
                try:
                    await VoteStore(vnc, settings, name=v).publish_ballot(unique, Ballot(
                        id=v, proposal_id=decided.id, voter=v, choice=1, created_at=datetime.now(UTC)))
                finally:
                    await vnc.close()
            handles = [await a.board(unique).proposal(pid) for a in agents for pid in (decided.id, timed.id)]
            await until_past(timed.proposal.deadline, 0.0)
            results = await asyncio.gather(*[h.commit() for h in handles], *[h.outcome(timeout=10) for h in handles])
            for pid in (decided.id, timed.id):
                outs = [r for r, h in zip(results, handles + handles, strict=True) if h.id == pid and r is not None]
                assert outs and all(o == outs[-1] for o in outs)
                kinds: list[str] = []

                def on(msg: VoteMessage, kinds: list[str] = kinds) -> None:
                    kinds.append(msg.kind)

                async with store.follow(Subjects.vote_filter(unique, pid), on) as f:
                    await f.ready.wait()
                assert kinds.count("outcome") == 1 and kinds.count("applied") == 1, kinds
                history = await agents[0].board(unique).history("s", "decided" if pid == decided.id else "timed")
                assert [e.revision for e in history] == [outs[-1].revision]
        finally:
            for a in agents:
                await a.close()
            await nc.close()
        assert w1.committer is not None and w2.committer is not None


def _spawn_worker(settings: Settings, name: str) -> subprocess.Popen[bytes]:
    return spawn_worker(settings, name, WORKER__DEADLINE_INTERVAL="0.1")


@pytest.mark.slow
async def test_a_worker_killed_during_a_proposal_is_restarted_and_closes_it_at_the_deadline(
        pg_settings: Settings, unique: str) -> None:
    settings = make_settings(pg_settings.nats.url, pg_settings.postgres.dsn.get_secret_value())
    proc = await asyncio.to_thread(_spawn_worker, settings, unique)
    nc = await connect_nats(settings.nats, name="observer")
    store = VoteStore(nc, settings, name="observer")  # observes, never closes or commits
    try:
        async with await connect_agent(unique, settings) as agent:
            p = await agent.board(unique).propose("s", "k", ["x", "y"], voters=[agent.id, "b", "c"],
                                                  deadline=timedelta(seconds=2))
            await agent.board(unique).vote(p.id, "y")  # 1 of 3: not decided
        async with ProposalFollower(store, unique, p.id) as follower:
            await follower.ready.wait()
            proc.send_signal(signal.SIGKILL)
            await asyncio.to_thread(proc.wait)
            assert follower.log.is_open and follower.log.committed is None
            deadline = p.proposal.deadline
            await until_past(deadline, 0.3)
            assert follower.log.is_open  # nobody closed it while no worker ran
            started = time.monotonic()
            proc = await asyncio.to_thread(_spawn_worker, settings, unique)
            await follower.wait_for(lambda log: log.committed is not None, timeout=20)
            closed_after = time.monotonic() - started
            outcome = follower.log.committed
        assert outcome is not None and outcome.closed_by == "deadline" and outcome.status == "accepted"
        assert outcome.value == "y" and outcome.decided_at == deadline and outcome.revision is not None
        assert closed_after < 10
        assert (await store.read(unique, p.id, "close")) is not None  # the restarted worker asked for it
        dsn = settings.postgres.dsn.get_secret_value()
        for _ in range(100):
            row = await outcome_row(dsn, unique, p.id)
            if row is not None and row[1] is not None:
                break
            await asyncio.sleep(0.1)
        assert row == ("accepted", outcome.revision, "deadline", "accepted")
    finally:
        await asyncio.to_thread(stop_worker, proc)
        await nc.close()


async def test_a_ballot_whose_payload_names_another_voter_is_a_dead_letter(pg_settings: Settings,
                                                                          unique: str) -> None:
    """The subject's voter is authoritative: PostgreSQL never stores a ballot as the voter its
    payload claims when the subject names another; the committer does not count it either."""
    settings = _voting_settings(pg_settings, unique)
    dsn = settings.postgres.dsn.get_secret_value()
    async with running_worker(settings) as worker:
        async with await connect_agent(f"{unique}-a", settings) as a:
            board = a.board(unique)
            p = await board.propose("s", "k", ["x", "y"], voters=[a.id, "victim"])
            forged = {"v": 1, "id": "forged", "proposal_id": p.id, "voter": "victim", "choice": 1,
                      "created_at": datetime.now(UTC).isoformat()}
            # On its own ballot subject (the server refuses any other), naming another voter.
            subject = Subjects.vote(unique, p.id, "ballot", a.id)
            seq = (await a.nc.jetstream().publish(subject, codec.encode(forged))).seq
            receipt = await board.vote(p.id, "x")
            assert receipt.outcome is None  # 1 of 2: the forged ballot did not count for "victim"
            with pytest.raises(OutcomeTimeoutError):
                await p.outcome(timeout=0.5)
        await worker.wait_caught_up(30)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        ballots = await (await conn.execute(
            "SELECT seq, voter FROM bb_ballots WHERE board = %s AND proposal_id = %s ORDER BY seq",
            (unique, p.id))).fetchall()
        dead = await (await conn.execute(
            "SELECT reason FROM bb_dead_letters WHERE subject = %s AND seq = %s", (subject, seq))).fetchall()
    assert ballots == [(receipt.sequence, a.id)]
    assert len(dead) == 1 and "victim" in dead[0][0] and a.id in dead[0][0]
