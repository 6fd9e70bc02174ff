"""Hostile messages on every subject the worker consumes are stored or dead-lettered, and
the worker keeps going.

Each example is a batch of generated messages of some kinds (board entries,
memories and forgets, direct/broadcast/topic messages, proposals, ballots,
close requests, outcomes and their applications), published raw with nats-py to
the running worker of ``tests/fuzz/conftest.py``, followed by one valid sentinel
per stream. Once the worker has caught up:

* every acknowledged message is stored or dead-lettered (``accounting.account``);
* the sentinels are stored (the consumers went on past the garbage);
* no component of the worker crashed (its supervisor logged no restart);
* a keyword and a hybrid search over the board meet the stored hostile rows
  without failing.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given

from blackboard.protocol import codec
from blackboard.protocol.subjects import Subjects
from tests._worker_helpers import entry_payload, memory_payload
from tests.fuzz.accounting import Published, account, publish_all, report
from tests.fuzz.conftest import FuzzStack
from tests.fuzz.profile import fuzz_settings
from tests.fuzz.strategies import WORD, Ctx, Plan, Wire, plans_of

pytestmark = pytest.mark.asyncio

#: How long the worker may take to catch up with one batch (a stalled consumer fails the example here).
CATCH_UP = 20.0


def _sentinels(ctx: Ctx) -> list[Wire]:
    """One valid message per stream, published after the garbage."""
    b, a = ctx.board, ctx.agent
    now = datetime.now(UTC)
    message = codec.encode({"v": 1, "id": f"{b}-sentinel", "sender": "peer", "kind": "direct", "recipients": [a],
                            "type": "note", "body": "after the garbage", "created_at": now})
    ballot = codec.encode({"v": 1, "id": "sentinel", "proposal_id": "sentinel", "voter": "v1", "choice": 0,
                           "created_at": now})
    return [
        Wire("entry", "sentinel", Subjects(ctx.bucket).entry(b, "fz", "sentinel"),
             entry_payload("still alive", author=a), None, signer=a),
        Wire("memory", "sentinel", Subjects.memory(b, a), memory_payload(f"{b}-sentinel", b, a, f"{WORD} alive"), None,
             signer=a),
        Wire("direct", "sentinel", Subjects.direct(a), message, None, signer="peer"),
        Wire("ballot", "sentinel", Subjects.vote(b, "sentinel", "ballot", "v1"), ballot, None, signer="v1"),
    ]


async def _run(fuzz: FuzzStack, batch: list[Plan]) -> tuple[Ctx, list[Published], list[Published]]:
    ctx = Ctx(board="fz" + uuid.uuid4().hex[:10], agent="a" + uuid.uuid4().hex[:8])
    crashes_before = len(fuzz.crashes.records)
    js = fuzz.nc.jetstream()
    published = await publish_all(js, [plan.wire(ctx, i) for i, plan in enumerate(batch)])
    sentinels = await publish_all(js, _sentinels(ctx))
    stalled = ""
    try:
        await fuzz.worker.wait_caught_up(CATCH_UP)
    except TimeoutError as exc:
        stalled = f"worker did not catch up: {exc}\n"
    account(fuzz.dsn, [*published, *sentinels])
    crashes = fuzz.crashes.records[crashes_before:]
    problems = [p for p in sentinels if p.fate != "stored"]
    assert not stalled and not crashes and not problems and all(p.fate != "missing" for p in published), (
        f"{stalled}crashes: {crashes[:5]}\nsentinels not stored: {problems}\n{report(published)}")
    return ctx, published, sentinels


@fuzz_settings(8)
@given(batch=plans_of(("entry",), min_size=20, max_size=40))
async def test_hostile_board_entries_are_stored_or_dead_lettered(fuzz: FuzzStack, batch: list[Plan]) -> None:
    ctx, _, _ = await _run(fuzz, batch)
    board = fuzz.agent.board(ctx.board)
    for mode in ("keyword", "hybrid"):
        await board.search(WORD, mode=mode)  # a stored hostile row must not fail the search


@fuzz_settings(8)
@given(batch=plans_of(("memory", "forget"), min_size=20, max_size=40))
async def test_hostile_memories_are_stored_or_dead_lettered(fuzz: FuzzStack, batch: list[Plan]) -> None:
    ctx, _, _ = await _run(fuzz, batch)
    for mode in ("keyword", "hybrid"):
        await fuzz.agent.recall(WORD, board=ctx.board, mode=mode)


@fuzz_settings(8)
@given(batch=plans_of(("direct", "broadcast", "topic"), min_size=20, max_size=40))
async def test_hostile_messages_are_stored_or_dead_lettered(fuzz: FuzzStack, batch: list[Plan]) -> None:
    await _run(fuzz, batch)
    await fuzz.agent.search_messages(WORD)


@fuzz_settings(8)
@given(batch=plans_of(("proposal", "ballot", "close", "outcome", "applied"), min_size=20, max_size=40))
async def test_hostile_vote_messages_are_stored_or_dead_lettered(fuzz: FuzzStack, batch: list[Plan]) -> None:
    await _run(fuzz, batch)
