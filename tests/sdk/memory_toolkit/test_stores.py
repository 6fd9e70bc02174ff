"""Memory stores: the protocol and the registry, and the conversation store (long-term memories
in a board scope, deduplicated by the worker) on a real worker; config-declared stores attached
through agent.memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents_sdk import Agent
from agents_sdk.memory.stores import (
    ConversationOptions,
    ConversationStore,
    FileStore,
    LogStore,
    MemoryStore,
    create_store,
    store_type,
    store_types,
)
from blackboard.protocol.errors import ConfigurationError
from blackboard.settings import Settings
from tests._worker_helpers import HashProvider, StartWorker


def test_the_builtin_types_are_registered() -> None:
    types = store_types()
    assert list(types)[:3] == ["conversation", "file", "log"]
    assert (types["conversation"].writable, types["file"].writable, types["log"].writable) == (True, False, True)
    with pytest.raises(ConfigurationError, match="unknown store type 'vector'"):
        store_type("vector")


@pytest.mark.asyncio
async def test_the_builtin_stores_keep_the_protocol(settings: Settings, unique: str, tmp_path: Path) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as agent:
        stores = [create_store(agent, "c", "conversation"), create_store(agent, "f", "file", paths=[tmp_path]),
                  create_store(agent, "l", "log")]
        assert [type(s) for s in stores] == [ConversationStore, FileStore, LogStore]
        assert all(isinstance(s, MemoryStore) for s in stores)
        assert [(s.name, s.kind, s.writable) for s in stores] == [
            ("c", "conversation", True), ("f", "file", False), ("l", "log", True)]
        with pytest.raises(ConfigurationError, match="unknown store type"):
            create_store(agent, "x", "vector")
        with pytest.raises(ConfigurationError, match="colour"):
            create_store(agent, "x", "conversation", colour="red")


@pytest.mark.asyncio
async def test_a_conversation_store_writes_and_finds_memories_in_its_scope(
        pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    model = f"hash-{unique}"
    await start_worker(pg_settings, name=f"w{unique}", provider=HashProvider(32, model),
                       query_provider=HashProvider(32, model))
    async with Agent.connect(f"{unique}-a", settings=pg_settings) as a, \
            Agent.connect(f"{unique}-b", settings=pg_settings) as b:
        notes = ConversationStore(a, "notes", ConversationOptions(board=unique, mode="keyword", tags=["team"]))
        theirs = ConversationStore(b, "notes", ConversationOptions(board=unique, mode="keyword"))
        other = ConversationStore(a, "other", ConversationOptions(board=unique, mode="keyword"))
        mine_only = ConversationStore(a, "notes", ConversationOptions(board=unique, mode="keyword", own_only=True))
        first = await notes.write(f"{unique} the price selector is span.price", {"turn": 1})
        # The memory stored first is kept (docs/memory-lifecycle.md): the worker writes batches in
        # concurrent transactions (worker.ingest_writers), so a copy written right after may be
        # stored first, and `first` merged into it, unless `first` is stored before it is sent.
        await a.wait_searchable([first], board=unique)
        copy = await notes.write(f"{unique} THE price   selector is span.price")  # the same text, normalised
        second = await theirs.write(f"{unique} the title selector is h1.title")
        elsewhere = await other.write(f"{unique} the price selector of the other shop is div.cost")
        last = await notes.write(f"{unique} pagination uses ?page=N")
        await a.wait_searchable([copy, elsewhere, last], board=unique)  # the copy merged: answers as `first`
        await b.wait_searchable([second], board=unique)

        hits = await notes.search("price", 10, 0.0)
        assert [h.text for h in hits] == [f"{unique} the price selector is span.price"]  # deduplicated, scoped
        hit = hits[0]
        assert (hit.id, hit.layer, hit.source, hit.kind, hit.score) == (first, "store:notes", "notes", "episodic", 1.0)
        assert hit.metadata == {"turn": 1, "store": "notes"} and hit.provenance["board"] == unique
        assert set(hit.provenance["tags"]) == {"store:notes", "team"}
        assert [h.id for h in await notes.search("title", 10, 0.0)] == [second]  # b's, same store
        assert await mine_only.search("title", 10, 0.0) == []  # own_only: b's left out
        assert [h.id for h in await other.search("price", 10, 0.0)] == [elsewhere]
        assert {h.id for h in await notes.search("selector", 10, 0.0)} == {first, second}
        assert len(await notes.search("selector", 1, 0.0)) == 1  # top_k
        assert notes.size() == 3 and notes.writable


@pytest.mark.asyncio
async def test_config_declared_stores_attach_through_agent_memory(settings: Settings, unique: str,
                                                                 tmp_path: Path) -> None:
    config = tmp_path / "memory.yaml"
    config.write_text(f"""
stores:
  journal:
    type: log
    board: {unique}
agents:
  {unique}-a:
    attach:
      journal: {{write: true, stages: [pre]}}
""")
    agent_settings = settings.model_copy(update={"agent_memory": settings.agent_memory.model_copy(
        update={"stores_file": config})})
    async with Agent.connect(f"{unique}-a", settings=agent_settings) as agent:
        assert [a.name for a in agent.memory.attachments.attached] == ["journal"]
        ids = await agent.memory.after_turn("the first page is done")
        assert len(ids) == 1
        ctx = await agent.memory.context("pre", "progress?")
        assert [h.text for h in ctx.hits] == ["the first page is done"]
        assert (await agent.memory.context("plan", "progress?")).hits == []
