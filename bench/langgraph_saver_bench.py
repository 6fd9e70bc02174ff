"""LangGraph's checkpointer API on both backends: our BlackboardSaver next to LangGraph's AsyncPostgresSaver.

Our saver (``agents_sdk.langgraph.BlackboardSaver``, one agent, board
``langgraph-checkpoints``) runs on an embedded nats-server (authorization and TLS as
``blackboard dev`` runs them; ``--insecure-open-bus`` for the open bus); LangGraph's
(``langgraph.checkpoint.postgres.aio.AsyncPostgresSaver``, one connection, its defaults:
no pipeline) on the embedded PostgreSQL of the same stack, in the same process, with the
same serializer (LangGraph's default ``JsonPlusSerializer``). No worker runs: the saver
needs none (a deployment's worker would copy the board into PostgreSQL meanwhile, off the
saver's path). The embedded PostgreSQL commits with ``fsync=on, synchronous_commit=on``;
the embedded nats-server acknowledges a write once stored and flushes every second (a
production cluster's durability is its replication, docs/operations.md).

Each round, each saver gets a fresh thread and:

* aput: ``--checkpoints`` checkpoints as a chat graph's "agent" step writes them: channel
  values ``messages`` (the last ``--messages`` chat messages, LangChain ``HumanMessage`` /
  ``AIMessage`` of ``--message-bytes`` bytes of LoCoMo dialogue, ``../shared/data``; synthetic
  text if missing), ``turns`` (an int) and a ``branch:to:review`` trigger, four new channel
  versions, versions seen by three nodes, metadata ``source="loop"``; each the child of the
  one before;
* aput_writes: after each aput, the task's writes to it (a message, ``turns``, the trigger);
* aget_tuple: ``--reads`` reads of the thread's newest checkpoint (config without
  ``checkpoint_id``), the thread now ``--checkpoints`` long;
* alist: ``--reads`` listings ``alist(config, limit=10)`` of that thread, read to the end;
* graph step: ``--steps`` ``graph.ainvoke`` of a two-node ``StateGraph`` (``START -> agent ->
  review -> END``, state ``messages`` with ``add_messages`` and ``turns``) compiled with each
  saver, a user message in, each node adding a message; 5 turns a thread, then a new thread
  (an invoke reads the thread's newest checkpoint, then puts four checkpoints and three
  tasks' writes; durability: LangGraph's default, "async").

The two savers alternate operation by operation (``alternate``: the order reversed every
other one), so drift and noise on a shared machine hit both. Printed: p50 / p95 / p99 of
every operation over all rounds, the ratio ours / LangGraph's (below 1: ours is faster), and
the range of the per-round ratios. A short warm-up runs every operation first (untimed).

Needs the ``bench`` and ``langgraph`` extras (``pip install -e '.[bench,langgraph]'``).

Usage: python bench/langgraph_saver_bench.py [--rounds 5] [--checkpoints 400] [--reads 150]
    [--steps 60] [--messages 5] [--message-bytes 300] [--insecure-open-bus]
(about 40 s on 2 cores with the defaults; ``--rounds 2 --checkpoints 50`` for a quick look).
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Annotated, Any, TypedDict

from _common import Table, add_bus_option, alternate, embedded_stack, locomo_dialogs, percentile
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
)
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from agents_sdk import Agent
from agents_sdk.langgraph import BlackboardSaver

#: The systems, LangGraph's first (the baseline).
SYSTEMS = ("langgraph", "ours")
#: Graph turns on one thread before the next thread.
_TURNS = 5
_TASK_PATH = "~__pregel_pull, agent"
_PERCENTILES = (50, 95, 99)
#: Operation name -> row label.
OPS = {"aput": "aput", "aput_writes": "aput_writes", "aget_tuple": "aget_tuple (newest)",
       "alist": "alist(limit=10)", "graph": "graph step (ainvoke)"}

Saver = BaseCheckpointSaver[Any]


def message_texts(n: int, size: int) -> list[str]:
    """``n`` texts of ``size`` characters: consecutive LoCoMo turns joined (synthetic if missing)."""
    turns, _ = locomo_dialogs()
    if not turns:
        turns = [f"note {i}: the team discussed topic {i % 37} and will revisit item {i % 11} next week"
                 for i in range(500)]
    out: list[str] = []
    j = 0
    while len(out) < n:
        text = ""
        while len(text) < size:
            text += turns[j % len(turns)] + " "
            j += 1
        out.append(text[:size])
    return out


def conversation(texts: Sequence[str], n: int, offset: int) -> list[BaseMessage]:
    """``n`` messages, user and assistant in turn, with ids (as ``add_messages`` gives them)."""
    return [(HumanMessage if k % 2 == 0 else AIMessage)(texts[(offset + k) % len(texts)], id=str(uuid.uuid4()))
            for k in range(n)]


@dataclass(frozen=True, slots=True)
class Step:
    """One checkpoint of the "agent" step and its task's writes."""

    checkpoint: Checkpoint
    metadata: CheckpointMetadata
    new_versions: ChannelVersions
    writes: list[tuple[str, Any]]
    task_id: str


def thread_steps(saver: Saver, n: int, window: int, texts: Sequence[str], offset: int) -> list[Step]:
    """``n`` checkpoints of one thread as a chat graph writes them, versions from ``saver``'s
    ``get_next_version`` (each saver has its own scheme); ids increase (``uuid6``, as LangGraph's)."""
    msgs = conversation(texts, n + window + 1, offset)
    versions: dict[str, Any] = {}

    def bump(*channels: str) -> ChannelVersions:
        for c in channels:
            versions[c] = saver.get_next_version(versions.get(c), None)
        return {c: versions[c] for c in channels}

    bump("__start__")
    start = versions["__start__"]
    review_seen = None
    steps: list[Step] = []
    for i in range(n):
        agent_seen = versions.get("branch:to:agent")
        new = bump("messages", "branch:to:agent", "turns", "branch:to:review")
        seen: dict[str, ChannelVersions] = {"__input__": {}, "__start__": {"__start__": start}}
        if agent_seen is not None:
            seen["agent"] = {"branch:to:agent": agent_seen}
        if review_seen is not None:
            seen["review"] = {"branch:to:review": review_seen}
        review_seen = versions["branch:to:review"]
        checkpoint = Checkpoint(
            v=4, id=str(uuid6(clock_seq=i)), ts=datetime.now(UTC).isoformat(),
            channel_values={"messages": msgs[i:i + window], "turns": i, "branch:to:review": None},
            channel_versions=dict(versions), versions_seen=seen,
            updated_channels=["branch:to:review", "messages", "turns"])
        writes: list[tuple[str, Any]] = [("messages", [msgs[i + window]]), ("turns", i + 1),
                                         ("branch:to:review", None)]
        steps.append(Step(checkpoint, CheckpointMetadata(source="loop", step=i, parents={}), new, writes,
                          str(uuid.uuid4())))
    return steps


class ChatState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    turns: int


def chat_graph(texts: Sequence[str]) -> StateGraph[ChatState]:
    """START -> agent -> review -> END; each node adds a message, the agent counts the turns."""

    def agent(state: ChatState) -> dict[str, Any]:
        turns = state.get("turns", 0)
        return {"messages": [AIMessage(texts[(2 * turns) % len(texts)])], "turns": turns + 1}

    def review(state: ChatState) -> dict[str, Any]:
        return {"messages": [AIMessage(texts[(2 * state["turns"] + 1) % len(texts)])]}

    builder = StateGraph(ChatState)
    builder.add_node("agent", agent)
    builder.add_node("review", review)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", "review")
    builder.add_edge("review", END)
    return builder


def thread_config(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


Latencies = dict[str, dict[str, list[list[float]]]]  # op -> system -> one list per round


async def run_round(savers: Mapping[str, Saver], graphs: Mapping[str, Any], texts: Sequence[str], tag: str,
                    n: int, reads: int, steps: int, window: int, offset: int = 0) -> dict[str, dict[str, list[float]]]:
    """One round on fresh threads named after ``tag`` (messages from ``texts[offset:]``); seconds per
    operation, by op and system."""
    clock = time.perf_counter
    work = {name: thread_steps(saver, n, window, texts, offset)
            for name, saver in savers.items()}
    configs = {name: thread_config(f"{tag}-{name}") for name in savers}
    out: dict[str, dict[str, list[float]]] = {op: {} for op in OPS}

    def writer(name: str) -> Callable[[int], Awaitable[tuple[float, float]]]:
        saver, todo = savers[name], work[name]

        async def write(i: int) -> tuple[float, float]:
            step = todo[i]
            t0 = clock()
            cfg = await saver.aput(configs[name], step.checkpoint, step.metadata, step.new_versions)
            t1 = clock()
            await saver.aput_writes(cfg, step.writes, step.task_id, _TASK_PATH)
            t2 = clock()
            configs[name] = cfg
            return t1 - t0, t2 - t1
        return write

    written = await alternate(n, {name: writer(name) for name in savers})
    for name, pairs in written.items():
        out["aput"][name] = [p for p, _ in pairs]
        out["aput_writes"][name] = [w for _, w in pairs]

    def getter(name: str) -> Callable[[int], Awaitable[float]]:
        saver, cfg, newest = savers[name], thread_config(f"{tag}-{name}"), work[name][-1].checkpoint["id"]

        async def get(_i: int) -> float:
            t = clock()
            tup = await saver.aget_tuple(cfg)
            dt = clock() - t
            if tup is None or tup.checkpoint["id"] != newest or len(tup.pending_writes or ()) != 3:
                raise RuntimeError(f"{name}: aget_tuple did not return the newest checkpoint with its writes")
            return dt
        return get

    def lister(name: str) -> Callable[[int], Awaitable[float]]:
        saver, cfg = savers[name], thread_config(f"{tag}-{name}")

        async def lst(_i: int) -> float:
            t = clock()
            got = [tup async for tup in saver.alist(cfg, limit=10)]
            dt = clock() - t
            if len(got) != min(10, n):
                raise RuntimeError(f"{name}: alist(limit=10) returned {len(got)} checkpoints")
            return dt
        return lst

    out["aget_tuple"] = await alternate(reads, {name: getter(name) for name in savers})
    out["alist"] = await alternate(reads, {name: lister(name) for name in savers})

    def stepper(name: str) -> Callable[[int], Awaitable[float]]:
        graph = graphs[name]

        async def step(i: int) -> float:
            msg = HumanMessage(texts[(7 * i) % len(texts)])
            cfg: RunnableConfig = {"configurable": {"thread_id": f"{tag}-{name}-g{i // _TURNS}"}}
            t = clock()
            state = await graph.ainvoke({"messages": [msg]}, cfg)
            dt = clock() - t
            if len(state["messages"]) != 3 * (i % _TURNS + 1):
                raise RuntimeError(f"{name}: the graph's thread lost messages")
            return dt
        return step

    out["graph"] = await alternate(steps, {name: stepper(name) for name in savers})
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(
        description="LangGraph checkpointer benchmark: BlackboardSaver next to AsyncPostgresSaver "
                    "(aput, aput_writes, aget_tuple, alist, a graph step), p50/p95/p99 and ratios.")
    ap.add_argument("--rounds", type=int, default=5, help="rounds, each on fresh threads (default 5)")
    ap.add_argument("--checkpoints", type=int, default=400,
                    help="checkpoints (aput + aput_writes) per round and saver: the thread's length "
                         "for aget_tuple and alist (default 400)")
    ap.add_argument("--reads", type=int, default=150,
                    help="aget_tuple calls and alist calls per round and saver (default 150)")
    ap.add_argument("--steps", type=int, default=60, help="graph.ainvoke calls per round and saver (default 60)")
    ap.add_argument("--messages", type=int, default=5, help="messages in each checkpoint's messages channel (default 5)")
    ap.add_argument("--message-bytes", type=int, default=300, help="characters of each message (default 300)")
    add_bus_option(ap)
    args = ap.parse_args()
    if min(args.rounds, args.checkpoints, args.reads, args.steps, args.messages) < 1:
        ap.error("--rounds, --checkpoints, --reads, --steps and --messages must be at least 1")
    started = time.perf_counter()
    texts = message_texts(200, args.message_bytes)
    async with embedded_stack("bb-lg-saver-bench-", open_bus=args.insecure_open_bus) as (s, bus, pg), \
            AsyncPostgresSaver.from_conn_string(pg.dsn) as lg, \
            Agent.connect("bench", settings=s) as agent:
        await lg.setup()
        ours = BlackboardSaver(agent)
        savers: dict[str, Saver] = {"langgraph": lg, "ours": ours}
        builder = chat_graph(texts)
        graphs = {name: builder.compile(checkpointer=saver) for name, saver in savers.items()}
        sample = thread_steps(lg, 1, args.messages, texts, 0)[0].checkpoint["channel_values"]["messages"]
        size = len(lg.serde.dumps_typed(sample)[1])
        print(f"langgraph_saver_bench: {bus.label}; langgraph {version('langgraph')}, "
              f"langgraph-checkpoint-postgres {version('langgraph-checkpoint-postgres')}")
        print(f"{args.rounds} rounds x {args.checkpoints} checkpoints ({args.messages} messages of "
              f"{args.message_bytes} chars: {size} bytes serialised), {args.reads} reads, "
              f"{args.steps} graph steps, per saver", flush=True)
        await run_round(savers, graphs, texts, "warm", min(args.checkpoints, 20), 20, 10, args.messages)
        lat: Latencies = {op: {name: [] for name in SYSTEMS} for op in OPS}
        for r in range(args.rounds):
            t = time.perf_counter()
            got = await run_round(savers, graphs, texts, f"r{r}", args.checkpoints, args.reads, args.steps,
                                  args.messages, offset=r * args.checkpoints)
            for op, by_system in got.items():
                for name, values in by_system.items():
                    lat[op][name].append(values)
            print(f"  round {r + 1}: {time.perf_counter() - t:.1f}s", flush=True)

    table = Table(f"langgraph_saver_bench, {bus.label} (all rounds; ratio = ours / LangGraph's, "
                  "below 1x: ours faster)", measured_label="BlackboardSaver", baseline_label="AsyncPostgresSaver")
    for op, label in OPS.items():
        for p in _PERCENTILES:
            ours_all = [v for rnd in lat[op]["ours"] for v in rnd]
            lg_all = [v for rnd in lat[op]["langgraph"] for v in rnd]
            per_round = [percentile(o, p) / percentile(g, p)
                         for o, g in zip(lat[op]["ours"], lat[op]["langgraph"], strict=True)]
            note = f"rounds {min(per_round):.2f}-{max(per_round):.2f}x" if len(per_round) > 1 else ""
            table.add(f"{label} p{p}", percentile(ours_all, p), percentile(lg_all, p), "ms", note=note)
    print()
    print(table.render())
    print(f"total {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    asyncio.run(main())
