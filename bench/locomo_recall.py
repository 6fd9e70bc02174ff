"""Turn-level recall@k on LoCoMo through the SDK: remember every turn, recall every question.

Each conversation is one scope (board ``locomo-<id>``); every dialog turn is
stored with ``agent.remember_many`` (JetStream -> worker -> Postgres ->
embeddings) with speaker, session, date and dia_id in metadata; once every
turn is embedded, every question of categories 1-4 is asked through
``agent.recall(question, board=...)`` in each mode, and
recall@k = |evidence in top-k| / |evidence| is averaged over questions
(per category too, at k=10).

Data: ``../shared/data/locomo`` (not shipped). Usage:
    python bench/locomo_recall.py [--data ../shared/data/locomo] [--modes keyword,semantic,hybrid]
                                  [--fusion rrf] [--neighbour-weight 0]   (ablations)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from _common import add_bus_option, embedded_stack

from agents_sdk.agent import Agent
from agents_sdk.memory.longterm import MemoryInput
from blackboard.settings import WorkerSettings
from blackboard.worker import Worker

KS = (1, 5, 10, 20)


def load(path: Path) -> tuple[str, list[MemoryInput], list[dict[str, Any]]]:
    conv = json.loads(path.read_text())
    cid = path.stem
    board = f"locomo-{cid}"
    turns: list[MemoryInput] = []
    n = 1
    while f"session_{n}" in conv:
        date = conv.get(f"session_{n}_date_time", "")
        for t in conv[f"session_{n}"]:
            text = t["text"]
            if t.get("blip_caption"):
                text += f" [shares a photo: {t['blip_caption']}]"
            turns.append(MemoryInput(text=text, kind="episodic", board=board, id=f"{cid}-{t['dia_id']}",
                                     metadata={"speaker": t["speaker"], "session": n, "date": date,
                                               "dia_id": t["dia_id"]}))
        n += 1
    qa = [q for q in conv["qa"] if q.get("category") in (1, 2, 3, 4) and q.get("evidence")]
    return board, turns, qa


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/locomo")
    ap.add_argument("--modes", default="keyword,semantic,hybrid")
    ap.add_argument("--fusion", choices=["convex", "rrf"], help="override settings.search.fusion (ablation)")
    ap.add_argument("--neighbour-weight", type=float, help="override settings.search.neighbour_weight (ablation)")
    add_bus_option(ap)
    args = ap.parse_args()
    convs = [load(p) for p in sorted(args.data.glob("*.json"))]
    async with embedded_stack("bb-locomo-", open_bus=args.insecure_open_bus,
                              worker=WorkerSettings(lag_interval=600)) as (s, bus, _):
        print(f"locomo_recall: {bus.label}")
        overrides = {k: v for k, v in (("fusion", args.fusion), ("neighbour_weight", args.neighbour_weight))
                     if v is not None}
        if overrides:
            s = s.model_copy(update={"search": s.search.model_copy(update=overrides)})
            print(f"search settings overridden: {overrides}")
        async with Worker(s) as worker, Agent.connect("locomo", settings=s) as agent:
            t0 = time.perf_counter()
            n_turns = 0
            for _, turns, _ in convs:
                await agent.remember_many(turns)
                n_turns += len(turns)
            acked = time.perf_counter() - t0
            await worker.wait_caught_up(3600, embedded=True, poll=0.2)
            searchable = time.perf_counter() - t0
            print(f"{n_turns} turns remembered: acknowledged in {acked:.1f}s, all searchable after {searchable:.1f}s")
            for mode in args.modes.split(","):
                sums = dict.fromkeys(KS, 0.0)
                by_cat: dict[int, list[float]] = {}
                nq = 0
                t1 = time.perf_counter()
                for board, _, qa in convs:
                    for q in qa:
                        hits = await agent.recall(str(q["question"]), board=board, top_k=max(KS),
                                                  mode=mode)
                        ids = [h.metadata.get("dia_id") for h in hits]
                        ev = set(q["evidence"])
                        for k in KS:
                            sums[k] += len(ev & set(ids[:k])) / len(ev)
                        by_cat.setdefault(int(q["category"]), []).append(len(ev & set(ids[:10])) / len(ev))
                        nq += 1
                per_q = (time.perf_counter() - t1) / nq * 1000
                cats = " ".join(f"c{c}:{sum(v) / len(v):.2f}" for c, v in sorted(by_cat.items()))
                print(f"{mode:8s} " + "  ".join(f"R@{k} {sums[k] / nq:.3f}" for k in KS)
                      + f"   R@10 by category {cats}   ({nq} questions, {per_q:.1f} ms/question)")
        print("reference (issue): BM25 R@10 ~0.55, MiniLM dense ~0.57, their RRF ~0.62; target hybrid >= 0.70")


if __name__ == "__main__":
    asyncio.run(main())
