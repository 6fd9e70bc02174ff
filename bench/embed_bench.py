"""Throughput of the local embedding provider next to onnxruntime called directly.

Texts are LoCoMo dialogue turns (../shared/data/locomo/*.json), a fixed random
sample. For each batch size, in the same run and interleaved so that machine
noise hits all three alike:

* raw, input order: tokenised up front, padded per batch, ``session.run`` only
  (what a naive caller gets);
* raw, sorted: the same with the texts of each call sorted by length first
  (the ideal the provider aims at; no pooling, no thread hop);
* provider: ``await LocalProvider.embed(chunk)`` (tokenise, sort, run, mean
  pool, normalise, in a worker thread), called with chunks of ``--call-size``
  texts as the worker does, with its defaults: one-thread model calls,
  ``--parallel`` of them at once (0: one per core).

The raw session runs one call at a time on ``--raw-threads`` intra-op threads
(0: onnxruntime's default, one per core): onnxruntime as a caller gets it.

Prints texts/s and the ratios provider/raw. Usage::

    python bench/embed_bench.py [--texts 300] [--spin] [--batch-sizes 8,32,64] [--call-size 64] \
        [--threads 1] [--parallel 0] [--raw-threads 0]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from blackboard.embeddings import LocalProvider, packaged_model_files

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo"


def locomo_turns(data_dir: Path) -> list[str]:
    """Every dialogue turn's text, in file and session order."""
    texts: list[str] = []
    for path in sorted(glob.glob(str(data_dir / "*.json"))):
        conversation = json.loads(Path(path).read_text())
        sessions = sorted(
            (k for k, v in conversation.items() if k.startswith("session_") and isinstance(v, list)),
            key=lambda k: int(k.split("_")[1]),
        )
        for key in sessions:
            texts.extend(turn["text"] for turn in conversation[key])
    return texts


def raw_session(threads: int, spin: bool) -> tuple[Any, Tokenizer]:
    files = packaged_model_files()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    session = ort.InferenceSession(str(files.model), sess_options=options, providers=["CPUExecutionProvider"])
    tokenizer = Tokenizer.from_file(str(files.tokenizer))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=256)
    return session, tokenizer


def raw_runner(session: Any, token_ids: list[list[int]], batch_size: int, call_size: int,
               sort: bool) -> Callable[[], None]:
    calls = [list(range(s, min(s + call_size, len(token_ids)))) for s in range(0, len(token_ids), call_size)]
    if sort:
        calls = [sorted(c, key=lambda i: len(token_ids[i])) for c in calls]
    batches = [c[s:s + batch_size] for c in calls for s in range(0, len(c), batch_size)]
    prepared = []
    for batch in batches:
        width = max(len(token_ids[i]) for i in batch)
        ids = np.zeros((len(batch), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, i in enumerate(batch):
            ids[row, :len(token_ids[i])] = token_ids[i]
            mask[row, :len(token_ids[i])] = 1
        prepared.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})

    def run() -> None:
        for feeds in prepared:
            session.run(None, feeds)

    return run


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--texts", type=int, default=300, help="sample size (0: every turn)")
    parser.add_argument("--batch-sizes", default="8,32,64")
    parser.add_argument("--call-size", type=int, default=64, help="texts per embed() call, as the worker")
    parser.add_argument("--threads", type=int, default=1, help="the provider's intra-op threads per call (0: auto)")
    parser.add_argument("--parallel", type=int, default=0, help="the provider's model calls at once (0: auto)")
    parser.add_argument("--raw-threads", type=int, default=0,
                        help="intra-op threads of the raw session, one call at a time (0: auto)")
    parser.add_argument("--spin", action="store_true", help="let idle onnxruntime threads spin (both sides)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best is reported")
    args = parser.parse_args()

    turns = locomo_turns(args.data)
    texts = random.Random(1).sample(turns, args.texts) if 0 < args.texts < len(turns) else turns
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    print(f"{len(texts)} LoCoMo turns (of {len(turns)}), cores={os.cpu_count()}, "
          f"provider threads={args.threads or 'auto'} parallel={args.parallel or 'auto'}, raw threads="
          f"{args.raw_threads or 'auto'}, spin={args.spin}, call size {args.call_size}, onnxruntime {ort.__version__}")

    started = time.perf_counter()
    probe = LocalProvider(threads=args.threads, parallel=args.parallel, spin=args.spin)
    probe.load_sync()
    load_seconds = time.perf_counter() - started
    print(f"model load (sha256 check + tokenizer + ONNX session): {load_seconds:.2f} s")

    session, tokenizer = raw_session(args.raw_threads, args.spin)
    token_ids = [e.ids for e in tokenizer.encode_batch(texts)]
    lengths = [len(t) for t in token_ids]
    print(f"tokens per text: mean {statistics.mean(lengths):.1f}, max {max(lengths)}")
    tok_s = timed(lambda: tokenizer.encode_batch(texts))
    print(f"tokenizer alone: {len(texts) / tok_s:,.0f} texts/s")

    async def provider_pass(provider: LocalProvider) -> float:
        started = time.perf_counter()
        for s in range(0, len(texts), args.call_size):
            await provider.embed(texts[s:s + args.call_size])
        return time.perf_counter() - started

    # Warm-up: first runs of a session allocate and pick kernels.
    raw_runner(session, token_ids[:64], 32, 64, True)()
    probe.embed_sync(texts[:64])

    print(f"\n{'batch':>5} {'raw in order':>13} {'raw sorted':>11} {'provider':>9}   "
          f"{'provider/raw sorted':>19} {'provider/raw in order':>21}")
    for batch_size in batch_sizes:
        naive = raw_runner(session, token_ids, batch_size, args.call_size, sort=False)
        ideal = raw_runner(session, token_ids, batch_size, args.call_size, sort=True)
        provider = LocalProvider(batch_size=batch_size, threads=args.threads, parallel=args.parallel, spin=args.spin)
        provider.load_sync()
        best: dict[str, float] = {"naive": 0.0, "ideal": 0.0, "provider": 0.0}
        for _ in range(args.rounds):
            best["naive"] = max(best["naive"], len(texts) / timed(naive))
            best["ideal"] = max(best["ideal"], len(texts) / timed(ideal))
            best["provider"] = max(best["provider"], len(texts) / asyncio.run(provider_pass(provider)))
        asyncio.run(provider.aclose())
        print(f"{batch_size:>5} {best['naive']:>13,.0f} {best['ideal']:>11,.0f} {best['provider']:>9,.0f}   "
              f"{best['provider'] / best['ideal']:>19.2f} {best['provider'] / best['naive']:>21.2f}")
    print("\ntexts/s, best of", args.rounds, "interleaved rounds")

    # One short text at a time: what a search query costs before the index is touched.
    queries = [t for t in texts if len(t) < 80][:100]
    query_ids = [e.ids for e in tokenizer.encode_batch(queries)]
    raw_lat, prov_lat = [], []

    async def query_latency() -> None:
        async with LocalProvider(threads=args.threads, parallel=args.parallel, spin=args.spin) as provider:
            for text, ids in zip(queries, query_ids, strict=True):
                feeds = {"input_ids": np.array([ids], dtype=np.int64)}
                feeds["attention_mask"] = np.ones_like(feeds["input_ids"])
                feeds["token_type_ids"] = np.zeros_like(feeds["input_ids"])
                raw_lat.append(timed(lambda f=feeds: session.run(None, f)))  # type: ignore[misc]
                started = time.perf_counter()
                await provider.embed([text])
                prov_lat.append(time.perf_counter() - started)

    asyncio.run(query_latency())
    raw_q, prov_q = np.percentile(raw_lat, [50, 95]) * 1e3, np.percentile(prov_lat, [50, 95]) * 1e3
    print(f"single query ({len(queries)} short turns): raw session.run p50 {raw_q[0]:.2f} ms p95 {raw_q[1]:.2f} ms; "
          f"provider.embed p50 {prov_q[0]:.2f} ms p95 {prov_q[1]:.2f} ms "
          f"(ratio p50 {prov_q[0] / raw_q[0]:.2f})")


if __name__ == "__main__":
    main()
