"""The log store: append-only on a board, shared by the agents attached to it, trimmed by count
and by age, read newest first with a recency score (no embeddings, no worker)."""

from __future__ import annotations

import time

import pytest

from agents_sdk import Agent
from agents_sdk.memory.stores import LogOptions, LogStore, create_store
from blackboard.protocol.errors import ConfigurationError, ConflictError
from blackboard.settings import Settings

pytestmark = pytest.mark.asyncio


async def test_a_log_is_append_only_and_read_newest_first(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as a, \
            Agent.connect(f"{unique}-b", settings=settings) as b:
        mine = LogStore(a, "ops", LogOptions(board=unique))
        theirs = create_store(b, "ops", "log", board=unique)  # the same log, attached by another agent
        first = await mine.write("crawl started", {"step": 1})
        await theirs.write("page 1 fetched")
        await mine.write("page 2 fetched")
        hits = await mine.search("anything at all", 10, 0.0)
        assert [h.text for h in hits] == ["page 2 fetched", "page 1 fetched", "crawl started"]
        assert [h.provenance["agent"] for h in hits] == [f"{unique}-a", f"{unique}-b", f"{unique}-a"]
        assert hits[2].id == first and hits[2].metadata == {"step": 1}
        assert {(h.layer, h.kind, h.source) for h in hits} == {("store:ops", "log", "ops")}
        assert all(0.99 < h.score <= 1.0 for h in hits)  # just written
        assert [h.text for h in await theirs.search("", 2, 0.0)] == ["page 2 fetched", "page 1 fetched"]
        assert mine.size() == 3
        # an entry is never overwritten: keys are created, not put
        board = a.board(unique)
        with pytest.raises(ConflictError):
            await board.create(mine.section, first, {"text": "rewritten"})
        assert mine.section == "log-ops" and mine.writable and mine.kind == "log"


async def test_the_log_is_trimmed_by_count(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as agent:
        log = LogStore(agent, "recent", LogOptions(board=unique, max_count=3))
        for i in range(6):
            await log.write(f"event {i}")
        assert len(await agent.board(unique).keys(log.section)) == 3  # the oldest were deleted
        assert [h.text for h in await log.search("q", 10, 0.0)] == ["event 5", "event 4", "event 3"]
        assert log.size() == 3


async def test_the_log_is_trimmed_by_age_and_scored_by_recency(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as agent:
        log = LogStore(agent, "aged", LogOptions(board=unique, max_age=600, half_life=3600))
        board = agent.board(unique)
        hour_ago = f"{int((time.time() - 3600) * 1000):013d}-old"
        minutes_ago = f"{int((time.time() - 300) * 1000):013d}-recent"
        # entries as an earlier writer left them (written directly, with their write time in the key)
        await board.create(log.section, hour_ago, {"text": "an hour ago", "metadata": {}})
        await board.create(log.section, minutes_ago, {"text": "five minutes ago", "metadata": {}})
        await log.write("now")
        hits = await log.search("q", 10, 0.0)
        assert [h.text for h in hits] == ["now", "five minutes ago"]  # older than max_age: left out
        assert hits[1].score == pytest.approx(0.5 ** (300 / 3600), abs=0.01)
        # the threshold leaves out what is older than the score it asks for
        assert [h.text for h in await log.search("q", 10, 0.99)] == ["now"]
        assert hour_ago not in await board.keys(log.section)  # the write trimmed it
        await board.create(log.section, f"{int((time.time() - 7200) * 1000):013d}-older", {"text": "2 h"})
        assert await log.trim() == 1
        assert len(await board.keys(log.section)) == 2


async def test_log_options_are_checked(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as agent:
        with pytest.raises(ConfigurationError, match="max_count"):
            create_store(agent, "l", "log", max_count=0)
        with pytest.raises(ConfigurationError, match="max_age"):
            create_store(agent, "l", "log", max_age=0.5)
        with pytest.raises(ConfigurationError, match="section"):
            create_store(agent, "l", "log", section="not a token")
        default = create_store(agent, "l", "log")
        assert isinstance(default, LogStore)
        assert default.board.name == agent.settings.agent_memory.long_term_board
