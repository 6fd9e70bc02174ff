"""Supersession: a subject key's memories as versions in valid time (blackboard/worker/supersession.py).

The pure planner first (the chain, which contradictions go to a vote, settling once), then the
same on real servers: SQL rows settled by settle_keys, and memories remembered through the SDK,
stored by a worker, read back through recall (as_of, known_at, event-time filters).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from agents_sdk import Agent
from blackboard.db import migrate
from blackboard.settings import MemorySettings, Settings
from blackboard.worker.supersession import (
    CONTEST_PREFIX,
    ContradictionPolicy,
    Version,
    contest_id,
    keys_before_write,
    plan_key,
    settle_written,
)
from tests._worker_helpers import HashProvider, StartWorker, board_memories_handler

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def v(mid: int, minutes: int, *, seq: int | None = None, agent: str = "a", text: str | None = None,
      checked: bool = False, **kw: object) -> Version:
    seq = mid if seq is None else seq
    digest = (text or f"text {mid}").encode()
    return Version(mid=mid, id=f"m{mid}", seq=seq, agent=agent, valid_from=at(minutes), content_hash=digest,
                   checked_seq=seq if checked else None, **kw)  # type: ignore[arg-type]


def apply(versions: list[Version], board: str = "b", *, vote: bool = False) -> tuple[list[Version], list[str]]:
    """The versions after settling those not checked as just written (by mid), and the
    contests' challengers."""
    fresh = {(x.id, x.seq) for x in versions if x.checked_seq != x.seq}
    plan = plan_key(board, "k", versions, vote=vote, fresh=fresh)
    by_mid = {x.mid: x for x in versions}
    for u in plan.updates:
        by_mid[u.mid] = replace(by_mid[u.mid], valid_to=u.valid_to, superseded_by=u.superseded_by,
                                contested_by=u.contested_by, checked_seq=u.checked_seq)
    return sorted(by_mid.values(), key=lambda x: x.mid), [c.challenger.id for c in plan.contests]


def links(versions: list[Version]) -> dict[str, tuple[datetime | None, str | None]]:
    return {x.id: (x.valid_to, x.superseded_by) for x in versions}


def test_each_version_is_closed_by_the_next_in_valid_time_and_the_newest_is_open() -> None:
    # Written in stream order m1, m2, m3, but m3 happened first (its event time).
    out, contests = apply([v(1, 10), v(2, 20), v(3, 5)])
    assert contests == []
    assert links(out) == {"m3": (at(10), "m1"), "m1": (at(20), "m2"), "m2": (None, None)}
    # Without votes nothing needs remembering: a new current version costs no write of its row.
    assert all(x.checked_seq is None for x in out)
    assert [u.mid for u in plan_key("b", "k", [v(1, 10), v(2, 20)], vote=False, fresh={("m2", 2)}).updates] == [1]


def test_only_the_versions_just_written_are_settled() -> None:
    """Versions stored without a check (under the supersede policy) are not new arrivals when a
    board's contradictions start going to a vote."""
    old = [v(1, 10, agent="alice", text="10"), v(2, 20, agent="bob", text="12")]  # not checked, not fresh
    plan = plan_key("b", "k", [*old, v(3, 30, agent="carol", text="13")], vote=True, fresh={("m3", 3)})
    assert [c.challenger.id for c in plan.contests] == ["m3"] and plan.contests[0].incumbent.id == "m2"


def test_equal_valid_times_are_ordered_by_stream_sequence() -> None:
    out, _ = apply([v(1, 10, seq=7), v(2, 10, seq=3)])
    assert links(out) == {"m2": (at(10), "m1"), "m1": (None, None)}


def test_the_chain_does_not_depend_on_the_order_versions_are_settled_in() -> None:
    """Whatever order the batches commit in (each settles what it wrote, the earlier ones
    settled), the chain comes out the same."""
    rng = random.Random(7)
    versions = [v(i, rng.randrange(0, 30)) for i in range(1, 9)]
    expected, _ = apply(versions)
    for order in itertools.islice(itertools.permutations(versions), 0, 2000, 97):
        state: list[Version] = []
        for new in order:
            state, _ = apply([*state, new])
        assert links(state) == links(expected)


def test_merged_and_contested_memories_are_not_versions_but_archived_ones_are() -> None:
    out, _ = apply([v(1, 10, checked=True), v(2, 20, merged=True, checked=True),
                    v(3, 30, contested_by="p", checked=True), v(4, 40, archived=True, checked=True), v(5, 5)])
    got = links(out)
    assert got["m5"] == (at(10), "m1") and got["m1"] == (at(40), "m4") and got["m4"] == (None, None)
    assert got["m2"] == (None, None) and got["m3"] == (None, None)


def test_a_settled_version_is_not_settled_again() -> None:
    """A redelivered batch: everything is checked and linked, nothing changes."""
    out, _ = apply([v(1, 10), v(2, 20)], vote=True)
    assert plan_key("b", "k", out, vote=True, fresh={("m1", 1), ("m2", 2)}).updates == []


def test_a_new_version_of_an_id_is_settled_afresh() -> None:
    """m2 was rejected by a vote; a new version of it (another seq) joins the chain again."""
    old = v(2, 20, seq=2, checked=True, contested_by="p", valid_to=at(20), superseded_by="m1")
    out, _ = apply([v(1, 10, checked=True), replace(old, seq=5)])
    assert links(out) == {"m1": (at(20), "m2"), "m2": (None, None)}
    assert [x.contested_by for x in out] == [None, None]


def test_a_contradiction_on_a_vote_board_is_contested_and_the_incumbent_stays_current() -> None:
    base = [v(1, 10, agent="alice", text="price 10", checked=True)]
    out, contests = apply([*base, v(2, 20, agent="bob", text="price 12")], vote=True)
    assert contests == ["m2"]
    m1, m2 = out
    assert m2.contested_by == contest_id("b", "m2", 2) and m2.contested_by.startswith(CONTEST_PREFIX)
    assert (m1.valid_to, m1.superseded_by) == (None, None) and (m2.valid_to, m2.superseded_by) == (None, None)


@pytest.mark.parametrize(("new", "why"), [
    (v(2, 20, agent="alice", text="price 12"), "the same agent updates its own fact"),
    (v(2, 20, agent="bob", text="price 10"), "the same text"),
    (v(2, 5, agent="bob", text="price 9"), "an older version arriving late"),
])
def test_not_a_contradiction(new: Version, why: str) -> None:
    out, contests = apply([v(1, 10, agent="alice", text="price 10", checked=True), new], vote=True)
    assert contests == [], why
    assert all(x.contested_by is None for x in out)


def test_without_a_vote_a_contradiction_supersedes() -> None:
    out, contests = apply([v(1, 10, agent="alice", checked=True), v(2, 20, agent="bob")], vote=False)
    assert contests == [] and links(out)["m1"] == (at(20), "m2")


def test_challengers_in_one_batch_are_each_put_against_the_current_version() -> None:
    """As if they had come one batch each: a pending challenger is not a version."""
    base = [v(1, 10, agent="alice", text="10", checked=True)]
    _, together = apply([*base, v(2, 20, agent="bob", text="12"), v(3, 30, agent="carol", text="13")], vote=True)
    one, first = apply([*base, v(2, 20, agent="bob", text="12")], vote=True)
    _, second = apply([*one, v(3, 30, agent="carol", text="13")], vote=True)
    assert together == first + second == ["m2", "m3"]


def test_policy_votes_on_matching_boards_only() -> None:
    assert not ContradictionPolicy().votes_on("x")
    everywhere = ContradictionPolicy.from_settings(MemorySettings(contradictions="vote"))
    assert everywhere.votes_on("anything")
    some = ContradictionPolicy.from_settings(MemorySettings(contradictions="vote", vote_boards=["team-*", "facts"]))
    assert some.votes_on("team-a") and some.votes_on("facts")
    assert not some.votes_on("Team-a") and not some.votes_on("factsx")


# -- on PostgreSQL ---------------------------------------------------------------

async def _connect(settings: Settings) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(settings.postgres.dsn.get_secret_value(), autocommit=True)


async def _write(conn: psycopg.AsyncConnection[Any], board: str, rows: Sequence[tuple[str, int, int, str, str]],
                 policy: ContradictionPolicy | None = None, *, pause: asyncio.Event | None = None,
                 key: str | None = "k") -> None:
    """Store memories (id, seq, valid-from minutes, agent, text) on ``key`` the way a batch does:
    the keys locked, the rows upserted forward only, then settled, in one transaction. Ids are
    the board's (``<board>/<id>``), and so is the stream the sequences count in."""
    rows = [(f"{board}/{r[0]}", *r[1:]) for r in rows]
    async with conn.transaction():
        changes = await keys_before_write(conn, [r[0] for r in rows],
                                          [(board, key, (at(m), seq)) for _, seq, m, _, _ in rows if key is not None])
        for mid_id, seq, minutes, agent, text in rows:
            await conn.execute(
                "INSERT INTO bb_memories (id, board, agent, kind, text, created_at, updated_at, stream, seq, "
                "subject_key, valid_from, content_hash) VALUES (%s, %s, %s, 'semantic', %s, now(), now(), "
                "%s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET seq = EXCLUDED.seq, subject_key = EXCLUDED.subject_key, "
                "valid_from = EXCLUDED.valid_from, text = EXCLUDED.text, content_hash = EXCLUDED.content_hash "
                "WHERE bb_memories.seq < EXCLUDED.seq",
                (mid_id, board, agent, text, board, seq, key, at(minutes), text.encode()))
        if pause is not None:
            await pause.wait()
        await settle_written(conn, changes, [(r[0], r[1], key) for r in rows], policy)


async def _chain(conn: psycopg.AsyncConnection[Any], board: str) -> dict[str, tuple[Any, ...]]:
    cur = await conn.execute("SELECT id, valid_to, superseded_by, contested_by FROM bb_memories "
                             "WHERE board = %s ORDER BY id", (board,))
    cut = len(board) + 1
    return {r[0][cut:]: (r[1], r[2] and r[2][cut:], r[3]) for r in await cur.fetchall()}


@pytest.mark.asyncio
async def test_settled_in_postgresql_whatever_order_concurrent_batches_commit_in(
        pg_settings: Settings, unique: str) -> None:
    await migrate(pg_settings)
    rows = [(f"m{i}", 100 + i, minutes, "a", f"v{i}") for i, minutes in enumerate([30, 10, 20, 40, 5, 25])]
    batches = [rows[0:2], rows[2:4], rows[4:6]]
    conns = [await _connect(pg_settings) for _ in batches]
    try:
        results = []
        for k, order in enumerate([(0, 1, 2), (2, 1, 0), (1, 2, 0)]):
            board = f"{unique}-{k}"
            # The batches run at once and commit in this order: each holds its key from before
            # its rows are stored until it commits (the first one is held a while, so the others
            # queue on the key's lock behind it, in the order they came).
            held = asyncio.Event()
            tasks = []
            for n, i in enumerate(order):
                tasks.append(asyncio.create_task(_write(conns[i], board, batches[i], pause=held if n == 0 else None)))
                await asyncio.sleep(0.05)
            held.set()
            await asyncio.gather(*tasks)
            results.append(await _chain(conns[0], board))
        expected = {"m4": (at(10), "m1", None), "m1": (at(20), "m2", None), "m2": (at(25), "m5", None),
                    "m5": (at(30), "m0", None), "m0": (at(40), "m3", None), "m3": (None, None, None)}
        assert results == [expected] * 3
        # A redelivered batch changes nothing; a new version of m1 moves it to the end.
        await _write(conns[0], f"{unique}-0", batches[0])
        assert await _chain(conns[0], f"{unique}-0") == expected
        await _write(conns[0], f"{unique}-0", [("m1", 200, 50, "a", "v1 again")])
        got = await _chain(conns[0], f"{unique}-0")
        assert got["m4"] == (at(20), "m2", None) and got["m3"] == (at(50), "m1", None) and got["m1"] == (None,) * 3
        # ... and a new version of m3 on another key leaves this one: m0 is current again.
        await _write(conns[0], f"{unique}-0", [("m3", 201, 45, "a", "v3 elsewhere")], key="k2")
        got = await _chain(conns[0], f"{unique}-0")
        assert got["m0"] == (at(50), "m1", None) and got["m3"] == (None,) * 3 and got["m1"] == (None,) * 3
        # ... and m0 written again without a key is no version: neither closed nor on the key.
        await _write(conns[0], f"{unique}-0", [("m0", 202, 30, "a", "v0, no key")], key=None)
        got = await _chain(conns[0], f"{unique}-0")
        assert got["m5"] == (at(50), "m1", None) and got["m0"] == (None,) * 3
    finally:
        for c in conns:
            await c.close()


@pytest.mark.asyncio
async def test_a_contradiction_is_contested_once_and_recorded_for_the_publisher(
        pg_settings: Settings, unique: str) -> None:
    await migrate(pg_settings)
    vote = ContradictionPolicy("vote", (f"{unique}*",))
    async with await _connect(pg_settings) as conn:
        await _write(conn, unique, [("a1", 1, 10, "alice", "price 10")], vote)
        await _write(conn, unique, [("b1", 2, 20, "bob", "price 12")], vote)
        await _write(conn, unique, [("b1", 2, 20, "bob", "price 12")], vote)  # redelivered
        pid = contest_id(unique, f"{unique}/b1", 2)
        assert await _chain(conn, unique) == {"a1": (None, None, None), "b1": (None, None, pid)}
        cur = await conn.execute("SELECT proposal_id, subject_key, challenger, challenger_seq, incumbent, "
                                 "incumbent_seq, proposed_at FROM bb_memory_contests WHERE board = %s", (unique,))
        assert await cur.fetchall() == [(pid, "k", f"{unique}/b1", 2, f"{unique}/a1", 1, None)]
        # Another board: no vote there.
        other = f"x{unique}"
        await _write(conn, other, [("a1x", 3, 10, "alice", "price 10")], vote)
        await _write(conn, other, [("b1x", 4, 20, "bob", "price 12")], vote)
        assert await _chain(conn, other) == {"a1x": (at(20), "b1x", None), "b1x": (None, None, None)}


# -- end to end: remembered through the SDK, stored by a worker ---------------------------

async def _versions(settings: Settings, board: str, count: int, timeout: float = 30) -> dict[str, tuple[Any, ...]]:
    """(text, valid_from, valid_to, superseded_by id's text) by text, once ``count`` memories of the
    board are stored (a batch's keys are settled in the transaction that stores it)."""
    deadline = asyncio.get_running_loop().time() + timeout
    async with await _connect(settings) as conn:
        while True:
            cur = await conn.execute(
                "SELECT m.text, m.valid_from, m.valid_to, n.text FROM bb_memories m "
                "LEFT JOIN bb_memories n ON n.id = m.superseded_by "
                "WHERE m.board = %s", (board,))
            rows = {r[0]: tuple(r[1:]) for r in await cur.fetchall()}
            if len(rows) == count or asyncio.get_running_loop().time() > deadline:
                return rows
            await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_remembered_versions_of_a_key_supersede_by_event_time_and_a_forget_reopens_the_previous(
        pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    """Versions remembered through the SDK, stored by a worker, read back through recall (keyword
    mode: no embeddings needed): the current version, as of a valid time, as known at an instant,
    by event time."""
    await start_worker(pg_settings, name=f"w{unique}", embed=False, provider=HashProvider(),
                       handlers=[board_memories_handler(pg_settings, unique)])
    key = "price:shop.example.com:sku-1"
    june, july, august = (datetime(2025, m, 1, tzinfo=UTC) for m in (6, 7, 8))
    async with Agent.connect(f"{unique}-a", settings=pg_settings) as alice, \
            Agent.connect(f"{unique}-b", settings=pg_settings) as bob:
        ten = await alice.remember("SKU-1 costs 10 EUR", board=unique, key=key, occurred_at=june)
        twelve = await bob.remember("SKU-1 costs 12 EUR", board=unique, key=key, occurred_at=august)
        await _versions(pg_settings, unique, 2)
        before_the_late_report = datetime.now(UTC)
        await asyncio.sleep(0.01)
        # Written last, happened in between: it takes its place in valid time.
        eleven = await alice.remember("SKU-1 costs 11 EUR", board=unique, key=key, occurred_at=july)
        other = await alice.remember("SKU-2 costs 5 EUR", board=unique, key="price:shop.example.com:sku-2")
        got = await _versions(pg_settings, unique, 4)
        assert got["SKU-1 costs 10 EUR"] == (june, july, "SKU-1 costs 11 EUR")
        assert got["SKU-1 costs 11 EUR"] == (july, august, "SKU-1 costs 12 EUR")
        assert got["SKU-1 costs 12 EUR"] == (august, None, None)
        assert got["SKU-2 costs 5 EUR"][1:] == (None, None)

        async def recalled(**filters: Any) -> set[str]:
            return {h.id for h in await alice.recall("costs EUR", board=unique, mode="keyword", top_k=20,
                                                     **filters)}

        assert await recalled() == {twelve, other}
        assert await recalled(include_superseded=True) == {ten, eleven, twelve, other}
        assert await recalled(as_of=datetime(2025, 7, 15, tzinfo=UTC)) == {eleven}  # valid then, as known now
        assert await recalled(known_at=before_the_late_report) == {twelve}  # the newest written by then
        assert await recalled(known_at=before_the_late_report, as_of=datetime(2025, 7, 15, tzinfo=UTC)) == {ten}
        assert await recalled(occurred_after=july, occurred_before=august, include_superseded=True) == {eleven}
        # Forgetting the current version: the one before it is current again.
        await bob.forget([twelve], board=unique)
        got = await _versions(pg_settings, unique, 3)
        assert got["SKU-1 costs 11 EUR"] == (july, None, None)
        assert got["SKU-1 costs 10 EUR"] == (june, july, "SKU-1 costs 11 EUR")
        assert await recalled() == {eleven, other}
