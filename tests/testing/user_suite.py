"""A user's test suite using the blackboard pytest plugin (the text tests/testing runs with
pytester): nothing here knows how the stack runs. Not collected in this repository (its name
does not start with ``test_``)."""

from __future__ import annotations

import os

import psycopg
import pytest


@pytest.mark.asyncio
async def test_stack_runs_in_the_asked_mode(blackboard_stack, blackboard_mode):
    assert blackboard_stack.mode == blackboard_mode == os.environ["EXPECTED_BLACKBOARD_MODE"]
    assert blackboard_stack.nats_url.startswith("tls://")  # authorization and TLS, as production


@pytest.mark.asyncio
async def test_agents_write_and_read(blackboard_agent, blackboard_board):
    async with blackboard_agent("alice") as alice, blackboard_agent("bob") as bob:
        revision = await alice.board(blackboard_board).put("notes", "plan", {"step": 1})
        entry = await bob.board(blackboard_board).get("notes", "plan")
    assert entry.value == {"step": 1}
    assert entry.revision == revision
    assert entry.author == "alice"


@pytest.mark.asyncio
async def test_worker_persists_and_search_answers(blackboard_agent, blackboard_board, blackboard_settings):
    async with blackboard_agent() as agent:
        mid = await agent.remember("the deploy window is friday at noon", board=blackboard_board,
                                   wait="searchable")
        hits = await agent.recall("when is the deploy window", board=blackboard_board)
    assert [hit.id for hit in hits] == [mid]
    # The worker wrote it to PostgreSQL (the settings carry the stack's DSN, for a suite's checks).
    with psycopg.connect(blackboard_settings.postgres.dsn.get_secret_value()) as conn:
        row = conn.execute("SELECT text FROM bb_memories WHERE id = %s", (mid,)).fetchone()
    assert row == ("the deploy window is friday at noon",)


def test_private_stacks_are_isolated(blackboard_stack, blackboard_stack_factory):
    private = blackboard_stack_factory(worker=False)
    assert private is not blackboard_stack
    assert private.nats_url != blackboard_stack.nats_url
