"""Turn-level recall@k on LoCoMo through the SDK: remember every turn, recall every question.

Each conversation is one scope (board ``locomo-<id>``); every dialog turn is
stored with ``agent.remember_many`` (JetStream -> worker -> Postgres ->
embeddings) with speaker, session, date and dia_id in metadata, and its
session as its thread (``metadata.thread``: contextual indexing, see
blackboard/worker/embed_text.py; thread-level scoring, search.thread_weight);
once every turn is embedded, every question
of categories 1-4 is asked through ``agent.recall(question, board=...)`` in
each mode, and recall@k = |evidence in top-k| / |evidence| is averaged over
questions (per category too, at k=10).

Tuning and held-out conversations: parameters were chosen on ``--tune``
(26 and 30, the two smallest); the figures are printed for those, for the
others (held out) and for all. The ablation table (hybrid R@10) adds one
technique at a time: each variant is a board set (the turns are also stored
without a thread on ``locomo-<id>-flat``) and search settings (a search
service restarted with them); ``--no-ablation`` measures the defaults only.
``--rerank-url`` (an OpenAI-compatible chat API; ``--rerank-model``,
``OPENAI_API_KEY`` or ``--rerank-key``) or ``--rerank-onnx`` (a cross-encoder
directory: model.onnx and tokenizer.json) adds a reranked variant
(``search.rerank``, blackboard/search/rerank.py).

Data: ``../shared/data/locomo`` (not shipped). Usage:
    python bench/locomo_recall.py [--data ../shared/data/locomo] [--modes keyword,semantic,hybrid]
                                  [--convs 26,30] [--tune 26,30] [--no-ablation]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import add_bus_option, embedded_stack
from pydantic import SecretStr

from agents_sdk.agent import Agent
from agents_sdk.memory.longterm import MemoryInput
from blackboard.settings import SearchSettings, Settings, WorkerSettings
from blackboard.worker import Worker

KS = (1, 5, 10, 20)
#: The conversations the parameters were chosen on.
TUNE = ("26", "30")
#: The search settings before issue 22's retrieval work (the ablation's first rows).
BEFORE: dict[str, Any] = {"neighbour_weight": 0.2, "semantic_weight": 1.0, "keyword_weight": 1.0,
                          "thread_weight": 0.0}

QA = list[dict[str, Any]]


@dataclass
class Conv:
    cid: str
    board: str
    turns: list[MemoryInput]
    qa: QA


@dataclass
class Variant:
    """One row of the ablation: the boards read (suffix) and the search settings."""

    name: str
    suffix: str = ""
    search: dict[str, Any] = field(default_factory=dict)


def load(path: Path, *, thread: bool = True, suffix: str = "") -> Conv:
    conv = json.loads(path.read_text())
    cid = path.stem
    board = f"locomo-{cid}{suffix}"
    turns: list[MemoryInput] = []
    n = 1
    while f"session_{n}" in conv:
        date = conv.get(f"session_{n}_date_time", "")
        for t in conv[f"session_{n}"]:
            text = t["text"]
            if t.get("blip_caption"):
                text += f" [shares a photo: {t['blip_caption']}]"
            meta: dict[str, Any] = {"speaker": t["speaker"], "session": n, "date": date, "dia_id": t["dia_id"]}
            if thread:
                meta["thread"] = f"session-{n}"
            turns.append(MemoryInput(text=text, kind="episodic", board=board, id=f"{cid}{suffix}-{t['dia_id']}",
                                     metadata=meta))
        n += 1
    qa = [q for q in conv["qa"] if q.get("category") in (1, 2, 3, 4) and q.get("evidence")]
    return Conv(cid, board, turns, qa)


@dataclass
class Scores:
    """Per question recall@k of one mode, by conversation."""

    by_conv: dict[str, list[dict[int, float]]] = field(default_factory=dict)
    by_cat: dict[int, list[float]] = field(default_factory=dict)
    ms: float = 0.0

    def mean(self, k: int, convs: set[str] | None = None) -> float:
        vals = [q[k] for c, qs in self.by_conv.items() if convs is None or c in convs for q in qs]
        return sum(vals) / len(vals) if vals else float("nan")

    def count(self, convs: set[str] | None = None) -> int:
        return sum(len(qs) for c, qs in self.by_conv.items() if convs is None or c in convs)


async def measure(agent: Agent, convs: list[Conv], mode: str, suffix: str) -> Scores:
    out = Scores()
    t0 = time.perf_counter()
    for c in convs:
        rows = out.by_conv.setdefault(c.cid, [])
        for q in c.qa:
            hits = await agent.recall(str(q["question"]), board=c.board + suffix, top_k=max(KS), mode=mode)
            ids = [h.metadata.get("dia_id") for h in hits]
            ev = set(q["evidence"])
            rows.append({k: len(ev & set(ids[:k])) / len(ev) for k in KS})
            out.by_cat.setdefault(int(q["category"]), []).append(rows[-1][10])
    out.ms = (time.perf_counter() - t0) / max(1, out.count()) * 1000
    return out


def with_search(s: Settings, overrides: dict[str, Any]) -> Settings:
    return s.model_copy(update={"search": s.search.model_copy(update=overrides)}) if overrides else s


def rerank_settings(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.rerank_url:
        key = args.rerank_key or os.environ.get("OPENAI_API_KEY")
        return {"rerank": "llm", "rerank_base_url": args.rerank_url, "rerank_model": args.rerank_model,
                **({"rerank_api_key": SecretStr(key)} if key else {})}
    if args.rerank_onnx:
        return {"rerank": "cross-encoder", "rerank_model_path": args.rerank_onnx}
    return None


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/locomo")
    ap.add_argument("--modes", default="keyword,semantic,hybrid")
    ap.add_argument("--convs", help="comma-separated conversation ids (default: all)")
    ap.add_argument("--tune", default=",".join(TUNE), help="the conversations parameters were chosen on")
    ap.add_argument("--no-ablation", action="store_true", help="the defaults only (no flat boards, no variants)")
    ap.add_argument("--fusion", choices=["convex", "rrf"], help="override settings.search.fusion")
    ap.add_argument("--neighbour-weight", type=float, help="override settings.search.neighbour_weight")
    ap.add_argument("--semantic-weight", type=float, help="override settings.search.semantic_weight")
    ap.add_argument("--thread-weight", type=float, help="override settings.search.thread_weight")
    ap.add_argument("--grid", action="store_true",
                    help="hybrid R@10 on the tuning conversations over a grid of fusion settings (how they were chosen)")
    ap.add_argument("--rerank-url", help="OpenAI-compatible chat API of an LLM reranker (adds a variant)")
    ap.add_argument("--rerank-model", default="gpt-4o-mini")
    ap.add_argument("--rerank-key")
    ap.add_argument("--rerank-onnx", type=Path, help="a cross-encoder directory (model.onnx, tokenizer.json)")
    add_bus_option(ap)
    args = ap.parse_args()
    wanted = set(args.convs.split(",")) if args.convs else None
    paths = [p for p in sorted(args.data.glob("*.json")) if wanted is None or p.stem in wanted]
    convs = [load(p) for p in paths]
    flat = [] if args.no_ablation else [load(p, thread=False, suffix="-flat") for p in paths]
    tune = set(args.tune.split(",")) & {c.cid for c in convs}
    held = {c.cid for c in convs} - tune
    overrides = {k: v for k, v in (("fusion", args.fusion), ("neighbour_weight", args.neighbour_weight),
                                   ("semantic_weight", args.semantic_weight),
                                   ("thread_weight", args.thread_weight)) if v is not None}
    async with embedded_stack("bb-locomo-", open_bus=args.insecure_open_bus,
                              worker=WorkerSettings(lag_interval=600)) as (s0, bus, _):
        print(f"locomo_recall: {bus.label}")
        if overrides:
            print(f"search settings overridden: {overrides}")
        s = with_search(s0, overrides)
        async with Agent.connect("locomo", settings=s) as agent:
            async with Worker(s) as worker:
                t0 = time.perf_counter()
                n_turns = 0
                for c in convs + flat:
                    await agent.remember_many(c.turns)
                    n_turns += len(c.turns)
                acked = time.perf_counter() - t0
                await worker.wait_caught_up(3600, embedded=True, poll=0.2)
                searchable = time.perf_counter() - t0
                print(f"{n_turns} turns remembered: acknowledged in {acked:.1f}s, all searchable after "
                      f"{searchable:.1f}s")
                print(f"tuning conversations {sorted(tune)}, held out {sorted(held)}")
                for mode in args.modes.split(","):
                    sc = await measure(agent, convs, mode, "")
                    cats = " ".join(f"c{c}:{sum(v) / len(v):.2f}" for c, v in sorted(sc.by_cat.items()))
                    print(f"{mode:8s} " + "  ".join(f"R@{k} {sc.mean(k):.3f}" for k in KS)
                          + f"   R@10 tune {sc.mean(10, tune):.3f} held-out {sc.mean(10, held):.3f}"
                          + f"   by category {cats}   ({sc.count()} questions, {sc.ms:.1f} ms/question)")
            if args.grid:
                await grid(agent, s0, [c for c in convs if c.cid in tune])
            if flat:
                await ablation(agent, s0, convs, tune, held, rerank_settings(args))
        print("reference (issue): BM25 R@10 ~0.55, MiniLM dense ~0.57, their RRF ~0.62; before issue 22 "
              "hybrid 0.733; target >= 0.77")


async def grid(agent: Agent, s: Settings, convs: list[Conv]) -> None:
    """Hybrid R@10 on the tuning conversations for each (thread_weight, neighbour_weight)."""
    print("\ngrid (tuning conversations): hybrid R@10 by thread_weight (rows) x neighbour_weight (columns)")
    nws = (0.0, 0.1, 0.2, 0.3)
    print("        " + " ".join(f"{nw:6.2f}" for nw in nws))
    for tw in (0.0, 0.3, 0.5, 0.7, 1.0):
        cells = []
        for nw in nws:
            async with Worker(with_search(s, {"thread_weight": tw, "neighbour_weight": nw})) as w:
                await w.wait_caught_up(600, embedded=True, poll=0.2)
                cells.append((await measure(agent, convs, "hybrid", "")).mean(10))
        print(f"{tw:6.2f}  " + " ".join(f"{c:6.3f}" for c in cells), flush=True)


async def ablation(agent: Agent, s: Settings, convs: list[Conv], tune: set[str], held: set[str],
                   rerank: dict[str, Any] | None) -> None:
    """Hybrid recall of each variant, one search service (a worker) at a time."""
    defaults = SearchSettings()
    now = {k: getattr(defaults, k) for k in BEFORE}
    variants = [
        Variant("before (no threads, search settings before)", "-flat", BEFORE),
        Variant("+ contextual indexing (previous turn of the thread)", "", BEFORE),
        Variant(f"+ thread-level scoring (thread_weight {now['thread_weight']:g}) = defaults", ""),
        Variant("defaults without neighbour smoothing", "", {"neighbour_weight": 0.0}),
    ]
    if rerank is not None:
        variants.append(Variant(f"+ rerank ({rerank['rerank']})", "", rerank))
    print("\nablation: hybrid recall@10 (R@20 of all in brackets)")
    print(f"{'variant':64s} {'tune':>6s} {'held':>6s} {'all':>6s} {'R@20':>6s}")
    for v in variants:
        async with Worker(with_search(s, v.search)) as w:
            await w.wait_caught_up(600, embedded=True, poll=0.2)
            sc = await measure(agent, convs, "hybrid", v.suffix)
        print(f"{v.name:64s} {sc.mean(10, tune):6.3f} {sc.mean(10, held):6.3f} {sc.mean(10):6.3f} "
              f"{sc.mean(20):6.3f}   ({sc.ms:.1f} ms/q)")


if __name__ == "__main__":
    asyncio.run(main())
