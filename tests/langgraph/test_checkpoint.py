"""``BlackboardSaver`` on a real nats-server, under authorization: the sync API, a long
thread's index, concurrent writers, large values, arbitrary ids, bad input, rights, and
graphs interrupted in one saver (or process) and resumed in another.

LangGraph's own conformance suite is test_checkpoint_conformance.py; the pure layout
has its unit tests in test_checkpoint_layout.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from langgraph.checkpoint.base import Checkpoint, CheckpointTuple
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT
from langgraph.types import Command

from agents_sdk import Agent
from agents_sdk.langgraph import BlackboardSaver
from agents_sdk.langgraph._checkpoint_layout import (
    PAGE_SIZE,
    ThreadSections,
    head_key,
    page_key,
    record_key,
)
from blackboard.devstack import EmbeddedNats
from blackboard.protocol.errors import (
    InvalidKeyError,
    InvalidPayloadError,
    NotFoundError,
    PermissionDeniedError,
)
from blackboard.settings import Settings
from tests._auth import TestAuth
from tests.langgraph._review_graph import review_graph

ROOT = Path(__file__).resolve().parents[2]


@pytest_asyncio.fixture
async def agent(settings: Settings, unique: str) -> AsyncIterator[Agent]:
    async with Agent.connect(f"{unique}-saver", settings=settings) as agent:
        yield agent


def _cfg(thread: Any, ns: str = "", checkpoint_id: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def _checkpoint(values: dict[str, Any] | None = None, checkpoint_id: str | None = None) -> Checkpoint:
    values = values or {}
    return generate_checkpoint(checkpoint_id=checkpoint_id, channel_values=values,
                               channel_versions={k: 1 for k in values})


async def _chain(saver: BlackboardSaver, thread: Any, n: int, ns: str = "", **meta: Any) -> list[str]:
    """``n`` checkpoints, each the parent of the next; their ids."""
    ids: list[str] = []
    for step in range(n):
        cfg = _cfg(thread, ns, ids[-1] if ids else None)
        cp = _checkpoint({"step": step})
        await saver.aput(cfg, cp, generate_metadata(step=step, **meta), {"step": 1} if step == 0 else {})
        ids.append(cp["id"])
    return ids


async def _ids(saver: BlackboardSaver, config: Any, **kwargs: Any) -> list[str]:
    return [t.checkpoint["id"] async for t in saver.alist(config, **kwargs)]


# ------------------------------------------------------------------ sync API
def test_sync_api_in_a_program_without_an_event_loop(settings: Settings, unique: str) -> None:
    with BlackboardSaver.connect_sync(f"{unique}-sync", settings=settings, board=unique) as saver:
        first = _checkpoint({"a": "x", "b": [1, 2]})
        c1 = saver.put(_cfg("t"), first, generate_metadata(source="input", step=-1), {"a": 1, "b": 1})
        assert c1 == _cfg("t", "", first["id"])
        second = generate_checkpoint(channel_values={"a": "y", "b": [1, 2]}, channel_versions={"a": 2, "b": 1})
        c2 = saver.put(c1, second, generate_metadata(step=0, run_id="r1"), {"a": 2})
        saver.put_writes(c2, [("a", "z"), (INTERRUPT, {"why": "approval"})], "task-1", "path")

        latest = saver.get_tuple(_cfg("t"))
        assert latest is not None
        assert latest.checkpoint["id"] == second["id"]
        assert latest.checkpoint["channel_values"] == {"a": "y", "b": [1, 2]}
        assert latest.parent_config == c1
        assert latest.metadata["run_id"] == "r1"
        assert latest.pending_writes == [("task-1", INTERRUPT, {"why": "approval"}), ("task-1", "a", "z")]
        older = saver.get_tuple(c1)
        assert older is not None and older.checkpoint["channel_values"] == {"a": "x", "b": [1, 2]}
        assert saver.get(c1) == older.checkpoint

        assert [t.checkpoint["id"] for t in saver.list(_cfg("t"))] == [second["id"], first["id"]]
        assert [t.checkpoint["id"] for t in saver.list(None)] == [second["id"], first["id"]]
        assert [t.checkpoint["id"] for t in saver.list(_cfg("t"), filter={"source": "input"})] == [first["id"]]
        assert [t.checkpoint["id"] for t in saver.list(_cfg("t"), before=c2)] == [first["id"]]
        assert len(list(saver.list(_cfg("t"), limit=1))) == 1

        saver.copy_thread("t", "t2")
        assert [t.checkpoint["id"] for t in saver.list(_cfg("t2"))] == [second["id"], first["id"]]
        saver.prune(["t2"], strategy="keep_latest")
        assert [t.checkpoint["id"] for t in saver.list(_cfg("t2"))] == [second["id"]]
        saver.delete_for_runs(["r1"])
        assert [t.checkpoint["id"] for t in saver.list(_cfg("t"))] == [first["id"]]
        saver.delete_thread("t")
        assert saver.get_tuple(_cfg("t")) is None
        saver.prune(["t2"], strategy="delete")
        assert list(saver.list(None)) == []

        v1 = saver.get_next_version(None, None)
        v2 = saver.get_next_version(v1, None)
        assert v1 < v2 and v2.startswith("0" * 31 + "2.")
    with pytest.raises(RuntimeError, match="not running"):
        saver.get_tuple(_cfg("t"))


@pytest.mark.asyncio
async def test_sync_methods_on_the_agents_loop_say_which_async_method_to_await(agent: Agent, unique: str) -> None:
    saver = BlackboardSaver(agent, board=unique)
    with pytest.raises(RuntimeError, match=r"await aget_tuple\(\)"):
        saver.get_tuple(_cfg("t"))
    with pytest.raises(RuntimeError, match=r"await aput\(\)"):
        saver.put(_cfg("t"), _checkpoint(), generate_metadata(), {})
    with pytest.raises(RuntimeError, match=r"await alist\(\)"):
        list(saver.list(None))
    # from another thread the same calls work (LangGraph's sync runner)
    assert await asyncio.to_thread(saver.get_tuple, _cfg("t")) is None
    with pytest.raises(RuntimeError, match="connect_sync"):
        await asyncio.to_thread(BlackboardSaver, agent, board=unique)


@pytest.mark.asyncio
async def test_connect_builds_a_saver_that_owns_its_agent(settings: Settings, unique: str) -> None:
    async with await BlackboardSaver.connect(f"{unique}-owner", settings=settings, board=unique) as saver:
        await _chain(saver, "t", 1)
        agent = saver.agent
        assert not agent.nc.is_closed
    assert agent.nc.is_closed
    with pytest.raises(InvalidKeyError):
        await BlackboardSaver.connect(f"{unique}-owner", settings=settings, board="no such board!")


def test_async_methods_hop_onto_the_agents_loop_from_another_loop(settings: Settings, unique: str) -> None:
    with BlackboardSaver.connect_sync(f"{unique}-sync", settings=settings, board=unique) as saver:
        async def run() -> list[str]:
            ids = await _chain(saver, "t", 3)
            tup = await saver.aget_tuple(_cfg("t"))
            assert tup is not None and tup.checkpoint["channel_values"] == {"step": 0}
            assert await _ids(saver, _cfg("t")) == ids[::-1]
            return ids

        assert len(asyncio.run(run())) == 3
    with pytest.raises(RuntimeError, match="not running"):  # closed: an error, not a wait forever
        asyncio.run(saver.aget_tuple(_cfg("t")))


# ------------------------------------------------------------------ the index
@pytest.mark.asyncio
async def test_a_long_thread_is_listed_newest_first_and_its_newest_found_in_few_reads(
        agent: Agent, settings: Settings, unique: str) -> None:
    saver = BlackboardSaver(agent, board=unique)
    n = 2 * PAGE_SIZE + 11
    ids = await _chain(saver, "long", n)
    sections = ThreadSections.of("long")
    assert await agent.board(unique).get(sections.index, head_key("")) is not None  # three pages
    assert await _ids(saver, _cfg("long")) == ids[::-1]
    assert await _ids(saver, _cfg("long"), limit=5) == ids[::-1][:5]
    assert await _ids(saver, _cfg("long"), before=_cfg("long", "", ids[40]), limit=3) == ids[39:36:-1]
    assert await _ids(saver, _cfg("long"), filter={"step": 7}) == [ids[7]]

    # A reader that never saw the thread: the newest checkpoint costs the head, one page,
    # one record and its values and writes, not the thread's 75 checkpoints.
    async with Agent.connect(f"{unique}-fresh", settings=settings) as fresh:
        reader = BlackboardSaver(fresh, board=unique)
        before = fresh.verification.get("verified", 0)
        latest = await reader.aget_tuple(_cfg("long"))
        read = fresh.verification.get("verified", 0) - before
    assert latest is not None and latest.checkpoint["id"] == ids[-1]
    assert read <= 8, read


@pytest.mark.asyncio
async def test_checkpoint_ids_appended_out_of_order_are_still_listed_newest_first(agent: Agent, unique: str) -> None:
    saver = BlackboardSaver(agent, board=unique)
    ids = [str(uuid6(clock_seq=i)) for i in range(PAGE_SIZE + 20)]
    shuffled = random.Random(7).sample(ids, len(ids))  # writers with skewed clocks
    for checkpoint_id in shuffled:
        await saver.aput(_cfg("skew"), _checkpoint(checkpoint_id=checkpoint_id), generate_metadata(), {})
    assert await _ids(saver, _cfg("skew")) == sorted(ids, reverse=True)
    latest = await saver.aget_tuple(_cfg("skew"))
    assert latest is not None and latest.checkpoint["id"] == max(ids)


@pytest.mark.asyncio
async def test_concurrent_writers_lose_no_checkpoint_and_no_write(agent: Agent, settings: Settings,
                                                                  unique: str) -> None:
    async with Agent.connect(f"{unique}-other", settings=settings) as other:
        savers = [BlackboardSaver(agent, board=unique), BlackboardSaver(other, board=unique)]
        checkpoints = [_checkpoint() for _ in range(40)]
        await asyncio.gather(*(savers[i % 2].aput(_cfg("busy"), cp, generate_metadata(step=i), {})
                               for i, cp in enumerate(checkpoints)))
        assert await _ids(savers[0], _cfg("busy")) == sorted((c["id"] for c in checkpoints), reverse=True)

        target = _cfg("busy", "", checkpoints[0]["id"])
        await asyncio.gather(*(savers[i % 2].aput_writes(target, [("out", i), ("log", f"task {i}")], f"task-{i:02d}")
                               for i in range(32)))
        tup = await savers[1].aget_tuple(target)
    assert tup is not None and tup.pending_writes is not None
    assert [(t, c) for t, c, _ in tup.pending_writes] == [(f"task-{i:02d}", c) for i in range(32) for c in ("out", "log")]


# ------------------------------------------------------------------ values
@pytest.mark.asyncio
async def test_values_beyond_an_entry_go_to_the_object_store_and_leave_with_the_thread(agent: Agent,
                                                                                        unique: str) -> None:
    saver = BlackboardSaver(agent, board=unique)
    big = os.urandom(1536 * 1024)  # more than a whole entry may hold (1 MiB)
    cp = _checkpoint({"big": big, "small": "s"})
    stored = await saver.aput(_cfg("large"), cp, generate_metadata(), {"big": 1, "small": 1})
    await saver.aput_writes(stored, [("big", big[:900_000]), ("small", "w")], "task")
    # many medium writes of one checkpoint: together over an entry, so they move too
    await saver.aput_writes(stored, [(f"c{i}", os.urandom(200_000)) for i in range(8)], "task-many")
    tup = await saver.aget_tuple(_cfg("large"))
    assert tup is not None
    assert tup.checkpoint["channel_values"] == {"big": big, "small": "s"}
    writes = {(t, c): v for t, c, v in tup.pending_writes or []}
    assert writes[("task", "big")] == big[:900_000] and writes[("task", "small")] == "w"
    assert len([k for k in writes if k[0] == "task-many"]) == 8

    sections = ThreadSections.of("large")
    board = agent.board(unique)
    names = await board.keys(sections.objects)
    assert len(names) >= 10

    await saver.acopy_thread("large", "large-copy")
    await saver.adelete_thread("large")
    for name in names:
        with pytest.raises(NotFoundError):
            await agent.objects.get(name)
    copied = await saver.aget_tuple(_cfg("large-copy"))
    assert copied is not None and copied.checkpoint["channel_values"]["big"] == big
    await saver.adelete_thread("large-copy")
    assert await board.keys(ThreadSections.of("large-copy").objects) == []


@pytest.mark.asyncio
async def test_inline_limit_zero_sends_every_value_to_the_object_store(agent: Agent, unique: str) -> None:
    saver = BlackboardSaver(agent, board=unique, inline_limit=0)
    ids = await _chain(saver, "objects", 2)
    tup = await saver.aget_tuple(_cfg("objects"))
    assert tup is not None and tup.checkpoint["id"] == ids[-1] and tup.checkpoint["channel_values"] == {"step": 0}
    await saver.aprune(["objects"], strategy="keep_latest")
    tup = await saver.aget_tuple(_cfg("objects"))
    assert tup is not None and tup.checkpoint["channel_values"] == {"step": 0}


@pytest.mark.asyncio
async def test_any_thread_id_and_namespace(agent: Agent, unique: str) -> None:
    saver = BlackboardSaver(agent, board=unique)
    threads: list[Any] = ["", "with spaces/and.dots", "ü" * 300, 42, "plain_id-1"]
    namespaces = ["", "child:1", "outer:1|inner:2", "n" * 2000]
    for thread in threads:
        for ns in namespaces:
            await saver.aput(_cfg(thread, ns), _checkpoint({"where": f"{thread}/{ns[:10]}"}), generate_metadata(),
                             {"where": 1})
    for thread in threads:
        for ns in namespaces:
            tup = await saver.aget_tuple(_cfg(thread, ns))
            assert tup is not None and tup.checkpoint["channel_values"] == {"where": f"{thread}/{ns[:10]}"}
            assert tup.config["configurable"]["thread_id"] == str(thread)
            assert tup.config["configurable"]["checkpoint_ns"] == ns
        listed = [t async for t in saver.alist({"configurable": {"thread_id": thread}})]  # every namespace
        assert sorted(t.config["configurable"]["checkpoint_ns"] for t in listed) == sorted(namespaces)
    every = [t async for t in saver.alist(None)]
    assert len(every) == len(threads) * len(namespaces)
    assert [t.checkpoint["id"] for t in every] == sorted((t.checkpoint["id"] for t in every), reverse=True)
    await saver.adelete_thread("ü" * 300)
    assert await saver.aget_tuple(_cfg("ü" * 300, "child:1")) is None
    assert await saver.aget_tuple(_cfg("", "child:1")) is not None


# ------------------------------------------------------------------ bad input, rights
@pytest.mark.asyncio
async def test_bad_input_raises_typed_errors(agent: Agent, unique: str) -> None:
    saver = BlackboardSaver(agent, board=unique)
    for config in ({}, {"configurable": {}}, {"configurable": None}, _cfg(None), _cfg(b"t"), _cfg(1.5)):
        with pytest.raises(InvalidKeyError):
            await saver.aget_tuple(config)  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyError, match="checkpoint_ns"):
        await saver.aget_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": 3}})  # type: ignore[typeddict-item]
    with pytest.raises(InvalidKeyError, match="checkpoint_id"):
        await saver.aput_writes(_cfg("t"), [("c", 1)], "task")
    with pytest.raises(InvalidKeyError, match="task_id"):
        await saver.aput_writes(_cfg("t", "", "x"), [("c", 1)], 7)  # type: ignore[arg-type]
    with pytest.raises(InvalidPayloadError, match="'id'"):
        await saver.aput(_cfg("t"), {"v": 1}, generate_metadata(), {})  # type: ignore[typeddict-item]
    with pytest.raises(InvalidPayloadError, match="strategy"):
        await saver.aprune(["t"], strategy="everything")
    with pytest.raises(ValueError, match="inline_limit"):
        BlackboardSaver(agent, board=unique, inline_limit=2 * 1024 * 1024)
    with pytest.raises(InvalidKeyError):
        BlackboardSaver(agent, board="not a board name")
    assert [t async for t in saver.alist(_cfg("t"), limit=0)] == []

    # A record another writer put where a checkpoint should be is refused, not returned.
    cp = _checkpoint()
    await saver.aput(_cfg("t"), cp, generate_metadata(), {})
    board = agent.board(unique)
    await board.put(ThreadSections.of("t").checkpoints, record_key("", cp["id"]), {"thread": "other"})
    with pytest.raises(InvalidPayloadError, match="not the checkpoint record"):
        await saver.aget_tuple(_cfg("t"))
    await board.put(ThreadSections.of("t").index, page_key("", 0), {"thread": "t"})
    with pytest.raises(InvalidPayloadError, match="malformed index page"):
        await saver.aget_tuple(_cfg("t"))


@pytest.mark.asyncio
async def test_a_reader_reads_checkpoints_and_may_not_write_them(agent: Agent, settings: Settings,
                                                                 unique: str) -> None:
    ids = await _chain(BlackboardSaver(agent, board=unique), "t", 2)
    async with Agent.connect(f"reader-{unique}", settings=settings) as reader:
        saver = BlackboardSaver(reader, board=unique)
        tup = await saver.aget_tuple(_cfg("t"))
        assert tup is not None and tup.checkpoint["id"] == ids[-1]
        with pytest.raises(PermissionDeniedError):
            await saver.aput(_cfg("t", "", ids[-1]), _checkpoint(), generate_metadata(), {})
        with pytest.raises(PermissionDeniedError):
            await saver.aput_writes(_cfg("t", "", ids[-1]), [("c", 1)], "task")


@pytest.mark.asyncio
async def test_keep_latest_refuses_a_thread_with_a_delta_channel(agent: Agent, unique: str) -> None:
    saver = BlackboardSaver(agent, board=unique)
    await saver.aput(_cfg("delta"), _checkpoint(), generate_metadata(counters_since_delta_snapshot={"c": [1, 1]}), {})
    with pytest.raises(NotImplementedError, match="DeltaChannel"):
        await saver.aprune(["delta"], strategy="keep_latest")


# ------------------------------------------------------------------ graphs
def _log(tup: CheckpointTuple | None) -> list[str]:
    assert tup is not None
    return list(tup.checkpoint["channel_values"].get("log", []))


@pytest.mark.asyncio
async def test_a_graph_interrupted_in_one_saver_is_resumed_by_another(agent: Agent, settings: Settings,
                                                                      unique: str) -> None:
    config = {"configurable": {"thread_id": "review-1"}}
    first = review_graph(BlackboardSaver(agent, board=unique))
    result = await first.ainvoke({"log": []}, config)
    assert result["__interrupt__"][0].value == {"question": "approve?", "drafts": 1}

    async with Agent.connect(f"{unique}-reviewer", settings=settings) as reviewer:
        second = review_graph(BlackboardSaver(reviewer, board=unique))
        state = await second.aget_state(config)
        assert state.next == ("review",)
        done = await second.ainvoke(Command(resume="yes"), config)
        assert done["answer"] == "yes"
        assert done["log"][1:] == ["reviewed: yes", f"published by pid {os.getpid()}"]
        history = [s async for s in second.aget_state_history(config)]
    assert [s.metadata["step"] for s in history if s.metadata] == [3, 2, 1, 0, -1]
    # each identity signed what it wrote
    saver = BlackboardSaver(agent, board=unique)
    assert [await saver.aget_author(s.config) for s in history] == [f"{unique}-reviewer"] * 2 + [f"{unique}-saver"] * 3
    assert await saver.aget_author(config) == f"{unique}-reviewer"  # the newest
    assert await saver.aget_author({"configurable": {"thread_id": "nobody"}}) is None
    assert await asyncio.to_thread(saver.get_author, history[-1].config) == f"{unique}-saver"


def _child_env(nats_url: str, auth: TestAuth) -> dict[str, str]:
    """A process with the test authority (its agents get credentials on first use), no other setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")}
    return env | {"BLACKBOARD_NATS__URL": nats_url,
                  "BLACKBOARD_SECURITY__AUTHORITY_DIR": str(auth.authority.directory),
                  "BLACKBOARD_NATS__TLS_CA_FILE": str(auth.tls.ca),
                  "BLACKBOARD_DEV__DATA_DIR": str(auth.authority.directory / "no-dev")}


def _child(*args: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "tests.langgraph._review_graph", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.asyncio
async def test_two_processes_run_and_resume_one_thread(agent: Agent, nats_server: EmbeddedNats, test_auth: TestAuth,
                                                       unique: str) -> None:
    env = _child_env(nats_server.url, test_auth)
    started = await asyncio.to_thread(_child, f"{unique}-proc", unique, "shared", "start", env=env)
    assert started["next"] == ["review"]
    assert started["interrupts"] == [{"question": "approve?", "drafts": 1}]
    child_pid = started["log"][0].removeprefix("draft by pid ")
    assert child_pid != str(os.getpid())

    config = {"configurable": {"thread_id": "shared"}}
    graph = review_graph(BlackboardSaver(agent, board=unique))
    done = await graph.ainvoke(Command(resume="ship it"), config)
    assert done["log"] == [f"draft by pid {child_pid}", "reviewed: ship it", f"published by pid {os.getpid()}"]

    seen = await asyncio.to_thread(_child, f"{unique}-proc", unique, "shared", "history", env=env)
    history = seen["history"]
    assert [h["step"] for h in history] == [3, 2, 1, 0, -1]
    assert history[0]["log"] == done["log"] and history[0]["next"] == []
    assert [h["id"] for h in history] == sorted((h["id"] for h in history), reverse=True)


@pytest.mark.asyncio
async def test_an_error_write_survives_for_the_next_attempt(agent: Agent, unique: str) -> None:
    saver = BlackboardSaver(agent, board=unique)
    ids = await _chain(saver, "t", 1)
    target = _cfg("t", "", ids[0])
    await saver.aput_writes(target, [(ERROR, ValueError("first"))], "task")
    await saver.aput_writes(target, [(ERROR, ValueError("second"))], "task")  # replaces the first
    tup = await saver.aget_tuple(target)
    assert tup is not None and tup.pending_writes is not None
    [(task, channel, error)] = tup.pending_writes
    assert (task, channel) == ("task", ERROR) and "second" in str(error)


@pytest.mark.asyncio
async def test_a_graph_with_parallel_tasks_and_a_subgraph_runs_as_on_the_in_memory_saver(
        agent: Agent, unique: str) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    from tests.langgraph._fanout_graph import fanout_graph

    async def run(saver: Any) -> tuple[Any, list[Any], Any]:
        config = {"configurable": {"thread_id": "fan"}}
        graph = fanout_graph(saver)
        first = await graph.ainvoke({"items": ["a", "b", "c", "d"]}, config)
        interrupted = (await graph.aget_state(config, subgraphs=True)).tasks
        done = await graph.ainvoke(Command(resume="ok"), config)
        history = [(s.metadata or {}).get("step") for s in [h async for h in graph.aget_state_history(config)]]
        return (first["__interrupt__"][0].value, done), history, [(t.name, t.state is not None) for t in interrupted]

    ours = await run(BlackboardSaver(agent, board=unique))
    reference = await run(InMemorySaver())
    assert ours == reference
    (question, done), _, _ = ours
    assert question == {"done": ["A", "B", "C", "D"]}
    assert done["verdict"] == "ok" and set(done["done"]) == {"A", "B", "C", "D"}
    # the subgraph's checkpoints live in a namespace of their own
    saver = BlackboardSaver(agent, board=unique)
    namespaces = {t.config["configurable"]["checkpoint_ns"].split(":")[0]
                  async for t in saver.alist({"configurable": {"thread_id": "fan"}})}
    assert namespaces == {"", "review"}


@pytest.mark.asyncio
async def test_copy_into_a_thread_with_checkpoints_joins_its_index(agent: Agent, unique: str) -> None:
    saver = BlackboardSaver(agent, board=unique)
    source = await _chain(saver, "src", PAGE_SIZE + 3)
    own = await _chain(saver, "dst", 2)
    await saver.acopy_thread("src", "dst")
    assert await _ids(saver, _cfg("dst")) == sorted(source + own, reverse=True)
    assert await _ids(saver, _cfg("src")) == source[::-1]


@pytest.mark.asyncio
async def test_delete_for_runs_frees_the_values_only_those_checkpoints_used(agent: Agent, unique: str) -> None:
    saver = BlackboardSaver(agent, board=unique)
    kept = await saver.aput(_cfg("t"), _checkpoint({"shared": 1, "mine": "k"}),
                            generate_metadata(run_id="keep"), {"shared": 1, "mine": 1})
    cp = generate_checkpoint(channel_values={"shared": 1, "mine": "d"}, channel_versions={"shared": 1, "mine": 2})
    doomed = await saver.aput(kept, cp, generate_metadata(run_id="drop"), {"mine": 2})
    await saver.aput_writes(doomed, [("mine", "w")], "task")
    blobs = ThreadSections.of("t").blobs
    board = agent.board(unique)
    assert len(await board.keys(blobs)) == 3
    await saver.adelete_for_runs(["drop"])
    assert await _ids(saver, _cfg("t")) == [kept["configurable"]["checkpoint_id"]]
    assert await saver.aget_tuple(doomed) is None
    assert len(await board.keys(blobs)) == 2  # "mine" at version 2 was only the dropped one's
    tup = await saver.aget_tuple(_cfg("t"))
    assert tup is not None and tup.checkpoint["channel_values"] == {"shared": 1, "mine": "k"}


@pytest.mark.asyncio
async def test_a_missing_index_page_costs_its_ids_not_the_thread(agent: Agent, unique: str) -> None:
    saver = BlackboardSaver(agent, board=unique)
    ids = await _chain(saver, "gap", 2 * PAGE_SIZE + 5)
    await agent.board(unique).purge(ThreadSections.of("gap").index, page_key("", 1))  # as if never written
    assert await _ids(saver, _cfg("gap")) == (ids[:PAGE_SIZE] + ids[2 * PAGE_SIZE:])[::-1]
    more = await _chain(saver, "gap", 1)
    assert (await _ids(saver, _cfg("gap"), limit=1)) == more


def test_langgraphs_sync_runner_uses_a_saver_built_in_async_code(settings: Settings, unique: str) -> None:
    async def main() -> dict[str, Any]:
        async with Agent.connect(f"{unique}-async", settings=settings) as agent:
            graph = review_graph(BlackboardSaver(agent, board=unique))
            config = {"configurable": {"thread_id": "sync-runner"}}
            await asyncio.to_thread(graph.invoke, {"log": []}, config)  # LangGraph's sync runner, in a thread
            result: dict[str, Any] = await asyncio.to_thread(graph.invoke, Command(resume="fine"), config)
            return result

    result = asyncio.run(main())
    assert result["answer"] == "fine" and len(result["log"]) == 3
