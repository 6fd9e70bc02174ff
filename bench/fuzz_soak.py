"""Soak the worker with malformed messages: every one must be stored or dead-lettered.

Starts its own nats-server and PostgreSQL, a worker process (``python -m
blackboard.worker``), then pushes ``--messages`` messages (50,000 by default)
raw with nats-py across every consumed subject (board entries, memories and
forgets, direct/broadcast/topic messages, proposals, ballots, close requests,
outcomes, applied outcomes): most of them malformed (deep nesting in JSON and
msgpack, huge and odd strings, NaN/infinities/integers beyond 64 bits, bad
timestamps and offsets, wrong types, unknown fields, truncated and garbage
bytes, lying ``Bb-Encoding``/``KV-Operation`` headers, odd subjects), some
valid. It also calls the SDK (``board.put``, ``agent.send``, ``board.propose``,
``agent.remember``) with hostile arguments, where the SDK should refuse before
publishing. Then it waits for the worker to catch up and accounts for each
acknowledged message in PostgreSQL.

Prints ingested / dead-lettered / refused-at-publish / dropped (acknowledged
but neither stored nor dead-lettered; must be 0), the RSS of the worker,
nats-server and PostgreSQL before and after, and the elapsed time. Exits 1 if
anything was dropped, the worker died, or it did not catch up.

Usage: python bench/fuzz_soak.py [--messages 50000] [--sdk 2000] [--seed 1] [--catch-up 600]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgpack
import psycopg
from _common import Bus, add_bus_option, embedded_stack
from nats.js import JetStreamContext

from agents_sdk import Agent, BlackboardError
from blackboard.client.connection import connect_nats
from blackboard.protocol.subjects import MEMORY_STREAM, MESSAGE_STREAM, VOTE_STREAM, Subjects
from blackboard.settings import Settings
from blackboard.worker.decode import MemoryRow, RawMessage, decode_memory

KINDS = ["entry", "entry", "entry", "memory", "memory", "forget", "direct", "broadcast", "topic",
         "proposal", "ballot", "ballot", "close", "outcome", "applied"]
DEPTHS = [40, 190, 210, 600, 1_000, 5_000, 20_000]
ODD = [float("nan"), float("inf"), float("-inf"), 2**63, 2**64 - 1, -(2**63) - 1, 2**64, 10**30, -0.0, 5e-324,
       "9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59", "2026-02-30T00:00:00Z", "+10000-01-01T00:00:00Z",
       "2026-01-01T00:00:00+99:99", "NaN", "", "\x00", "a\x00b", "\ud800", "\u202eevil", "x" * 5000, None, True,
       b"bytes", [], {}, {1: "int key"}, {b"k": "bytes key"}, ["a", 1], 1.5, -1, "bad name!", "a.b"]
HEADERS = [("Bb-Encoding", "json"), ("Bb-Encoding", "msgpack"), ("Bb-Encoding", "xml"), ("Bb-Encoding", ""),
           ("KV-Operation", "DEL"), ("KV-Operation", "PURGE"), ("KV-Operation", "BOGUS"),
           ("Bb-Base-Revision", "-5"), ("Bb-Base-Revision", "abc"), ("Nats-Marker-Reason", "MaxAge")]
_STORED = {
    MEMORY_STREAM: """SELECT seq FROM bb_memories WHERE stream = %(s)s AND seq = ANY(%(q)s)
                      UNION SELECT seq FROM bb_memory_forgets WHERE stream = %(s)s AND seq = ANY(%(q)s)""",
    MESSAGE_STREAM: "SELECT seq FROM bb_messages WHERE stream = %(s)s AND seq = ANY(%(q)s)",
    VOTE_STREAM: """SELECT seq FROM bb_proposals WHERE stream = %(s)s AND seq = ANY(%(q)s)
                    UNION SELECT seq FROM bb_ballots WHERE stream = %(s)s AND seq = ANY(%(q)s)
                    UNION SELECT seq FROM bb_outcomes WHERE stream = %(s)s AND seq = ANY(%(q)s)
                    UNION SELECT applied_seq FROM bb_outcomes WHERE stream = %(s)s AND applied_seq = ANY(%(q)s)""",
}
_ENTRIES = "SELECT seq FROM bb_entry_revisions WHERE stream = %(s)s AND seq = ANY(%(q)s)"
_DEAD = "SELECT seq FROM bb_dead_letters WHERE stream = %(s)s AND seq = ANY(%(q)s)"
_REPLACED = """SELECT 1 FROM bb_memories WHERE id = %(id)s AND seq > %(seq)s
               UNION ALL SELECT 1 FROM bb_memory_forgets WHERE id = %(id)s AND seq > %(seq)s"""


# -- generation (seeded; the same categories as tests/fuzz/strategies.py) ----------
def _deep(depth: int, encoding: str) -> bytes:
    return b"[" * depth + b"1" + b"]" * depth if encoding == "json" else b"\x91" * depth + b"\x01"


def _base(kind: str, rng: random.Random, board: str, agent: str, n: int) -> tuple[dict[str, Any], str, str | None]:
    now = datetime.now(UTC)
    stamp = now.isoformat()
    pid = f"p{n}"
    if kind == "entry":
        return ({"v": 1, "value": {"n": n, "text": "soak"}, "author": agent, "tags": ["soak"], "metadata": {},
                 "created_at": stamp, "content_type": "application/json"},
                Subjects().entry(board, "s", f"k{n}"), None)
    if kind == "memory":
        mid = f"{board}-m{n}"
        return ({"v": 1, "id": mid, "board": board, "agent": agent, "text": f"soak memory {n}", "created_at": stamp},
                Subjects.memory(board, agent), mid)
    if kind == "forget":
        return ({"v": 1, "op": "forget", "board": board, "agent": agent, "ids": [f"{board}-m{n - 1}"],
                 "created_at": stamp}, Subjects.memory(board, agent), None)
    if kind in ("direct", "broadcast", "topic"):
        rec: dict[str, Any] = {"v": 1, "id": f"{board}-x{n}", "sender": "peer", "kind": kind, "type": "note",
                               "body": {"n": n}, "created_at": stamp}
        if kind == "direct":
            rec["recipients"] = [agent]
            return rec, Subjects.direct(agent), None
        if kind == "broadcast":
            rec["board"] = board
            return rec, Subjects.broadcast(board), None
        rec["topic"] = f"{board}.t"
        return rec, Subjects.topic(f"{board}.t", pattern=False), None
    if kind == "proposal":
        rec = {"v": 1, "id": pid, "board": board, "section": "s", "key": "k", "candidates": ["a", "b"],
               "policy": {"kind": "majority"}, "voters": ["v1", "v2"], "proposer": "v1", "created_at": stamp,
               "deadline": (now + timedelta(hours=1)).isoformat() if rng.random() < 0.5 else None}
    elif kind == "ballot":
        rec = {"v": 1, "id": f"b{n}", "proposal_id": pid, "voter": "v1", "choice": rng.choice([0, 1, "reject"]),
               "created_at": stamp}
    elif kind == "close":
        rec = {}
    else:
        rec = {"v": 1, "proposal_id": pid, "board": board, "section": "s", "key": "k", "status": "accepted",
               "candidate": 0, "value": "a", "closed_by": "decision", "deciding_sequence": 2, "decided_at": stamp,
               "counts": {"ballots": 1, "votes": [1, 0], "reject": 0, "abstain": 0, "support": [1.0, 0.0],
                          "reject_support": 0.0},
               "counted_ballots": [], "superseded_ballots": [], "rejected_ballots": []}
        if kind == "applied":
            rec["revision"] = rng.randint(1, 2**40)
    # A ballot's subject names its voter (the payload's, unless a mutation changes that one).
    return rec, Subjects.vote(board, pid, kind, "v1" if kind == "ballot" else None), None


def _encode(rec: Any, encoding: str) -> bytes:
    for enc in ([encoding, "msgpack" if encoding == "json" else "json"]):
        try:
            if enc == "json":
                return json.dumps(rec, default=repr, ensure_ascii=False).encode("utf-8", "surrogatepass")
            return msgpack.packb(rec, use_bin_type=True, default=repr)  # type: ignore[no-any-return]
        except (TypeError, ValueError, OverflowError, UnicodeEncodeError):
            continue
    return repr(rec).encode("utf-8", "surrogatepass")


def hostile(rng: random.Random, board: str, agent: str, n: int) -> tuple[str, bytes, dict[str, str] | None, str | None]:
    """One message: (subject, payload, headers, memory id)."""
    kind = rng.choice(KINDS)
    rec, subject, ident = _base(kind, rng, board, agent, n)
    encoding = "json" if rng.random() < 0.35 else "msgpack"
    headers = {"Bb-Encoding": "json"} if encoding == "json" and rng.random() < 0.8 else None
    deep: bytes | None = None
    if rng.random() < 0.9:  # about one in ten is left valid
        for _ in range(rng.randint(1, 3)):
            field = rng.choice([*rec, "zz", "v"]) if rec else "zz"
            op = rng.random()
            if op < 0.45:
                rec[field] = rng.choice(ODD)
            elif op < 0.6:
                rec.pop(field, None)
            elif op < 0.75:
                rec[field] = "\u2063deep\u2063"
                deep = _deep(rng.choice(DEPTHS), encoding)
            elif op < 0.8:
                rec[field] = "x" * rng.choice([10_000, 200_000])
            else:
                rec[f"unknown{rng.randint(0, 9)}"] = rng.choice(ODD)
    data = _encode(rec, encoding)
    if deep is not None:
        marker = _encode("\u2063deep\u2063", "json" if data[:1] == b"{" else "msgpack")
        data = data.replace(marker, deep)
    r = rng.random()
    if r < 0.05:
        data = data[:rng.randint(0, len(data))]
    elif r < 0.08:
        data = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 40)))
    elif r < 0.1:
        data = data + b"\xc1"
    if rng.random() < 0.1:
        headers = {**(headers or {}), **dict([rng.choice(HEADERS)])}
    if rng.random() < 0.05:
        # Unique per message: the KV stream keeps 64 messages a subject, so a shared odd
        # subject would lose messages to the stream's limit before the worker sees them.
        subject = rng.choice([f"{subject}.extra", f"{subject.rsplit('.', 1)[0]}x{n}", f"{subject}!{n}"])
    if ident is not None:  # a spoilt id may still be a valid one, shared with another message
        ident = stored_id(subject, data, headers)
    return subject, data, headers, ident


def stored_id(subject: str, data: bytes, headers: dict[str, str] | None) -> str | None:
    """The id a memory is stored under, as the worker decodes it (a later message of the same
    id replaces it: then its own row is gone); None if it does not decode to a memory."""
    try:
        row = decode_memory(RawMessage(MEMORY_STREAM, 1, subject, headers or {}, data, datetime.now(UTC)),
                            max_bytes=1 << 20, index_chars=1000)
    except Exception:
        return None
    return row.id if isinstance(row, MemoryRow) else None


# -- measuring -------------------------------------------------------------------
def rss_kib(pid: int | None, *, tree: bool = False) -> int:
    """Resident memory (KiB) of a process, and of its children with ``tree`` (PostgreSQL's backends)."""
    if pid is None:
        return 0
    pids = [pid]
    if tree:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    pids += [int(c) for c in (task / "children").read_text().split()]
    total = 0
    for p in pids:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def spawn_worker(settings: Settings, bus: Bus) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")}
    env.update({**bus.worker_env(),  # its identity, the CA and the policy (or the open bus)
                "BLACKBOARD_POSTGRES__DSN": settings.postgres.dsn.get_secret_value(),
                "BLACKBOARD_WORKER__NAME": "soak", "BLACKBOARD_WORKER__GROUP": "soak",
                "BLACKBOARD_WORKER__EMBED": "false",
                "BLACKBOARD_WORKER__SERVE_SEARCH": "false", "BLACKBOARD_WORKER__ACK_WAIT": "10"})
    proc = subprocess.Popen([sys.executable, "-m", "blackboard.worker"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != b"ready":
        proc.kill()
        raise SystemExit(f"worker did not start: {line!r}")
    return proc


async def publish_raw(js: JetStreamContext, n: int, seed: int, board: str, agent: str
                      ) -> tuple[list[tuple[str, int, str, str | None]], Counter[str]]:
    """Publish ``n`` messages (windows of pipelined publishes); acknowledged ones and refusal counts."""
    rng = random.Random(seed)
    acked: list[tuple[str, int, str, str | None]] = []
    refused: Counter[str] = Counter()
    window = 256
    for start in range(0, n, window):
        batch = [hostile(rng, board, agent, i) for i in range(start, min(n, start + window))]
        futures = []
        for subject, data, headers, _ in batch:
            try:
                futures.append(await js.publish_async(subject, data, headers=headers))
            except Exception as exc:
                futures.append(exc)
        for (subject, _, _, ident), fut in zip(batch, futures, strict=True):
            if isinstance(fut, BaseException):
                refused[type(fut).__name__] += 1
                continue
            try:
                ack = await asyncio.wait_for(fut, 30)
            except Exception as exc:
                refused[type(exc).__name__] += 1
                continue
            acked.append((ack.stream, int(ack.seq), subject, ident))
        if start // 10_000 != (start + window) // 10_000:
            print(f"  {len(acked)} published", flush=True)
    return acked, refused


async def sdk_refusals(settings: Settings, n: int, seed: int, board: str
                       ) -> tuple[list[tuple[str, int, str, str | None]], Counter[str], Counter[str]]:
    """Hostile SDK calls: the acknowledged writes, the typed refusals, and raw (untyped) errors."""
    rng = random.Random(seed + 1)
    acked: list[tuple[str, int, str, str | None]] = []
    refused: Counter[str] = Counter()
    raw: Counter[str] = Counter()
    async with Agent.connect("soaker", settings=settings) as agent:
        b = agent.board(board)
        for i in range(n):
            if i and i % 500 == 0:
                print(f"  {i} SDK calls", flush=True)
            odd = rng.choice(ODD)
            call = rng.choice(["put", "send", "propose", "remember"])
            try:
                if call == "put":
                    rev = await b.put("s", f"sdk{i}", odd, metadata={"x": rng.choice(ODD)})
                    acked.append((Subjects().kv_stream, rev, "", None))
                elif call == "send":
                    sent = await agent.send("peer", "note", odd, metadata={"x": rng.choice(ODD)})
                    acked += [(MESSAGE_STREAM, s, "", None) for s in sent.sequences]
                elif call == "propose":
                    handle = await b.propose("s", "k", [odd, "b"], voters=["v1"], proposal_id=f"sdk{i}")
                    acked.append((VOTE_STREAM, handle.sequence if hasattr(handle, "sequence") else 0, "", None))
                else:
                    await agent.remember(odd if isinstance(odd, str) else repr(odd), board=board,
                                         metadata={"x": rng.choice(ODD)}, tags=[rng.choice(ODD)])
            except BlackboardError as exc:
                refused[type(exc).__name__] += 1
            except Exception as exc:
                raw[f"{call}: {type(exc).__name__}"] += 1
    return [a for a in acked if a[1] > 0], refused, raw


def account(dsn: str, acked: list[tuple[str, int, str, str | None]], max_bytes: int) -> Counter[str]:
    fates: Counter[str] = Counter()
    by_stream: dict[str, list[tuple[int, str, str | None]]] = {}
    for stream, seq, subject, ident in acked:
        by_stream.setdefault(stream, []).append((seq, subject, ident))
    with psycopg.connect(dsn) as conn:
        for stream, items in by_stream.items():
            params = {"s": stream, "q": [seq for seq, _, _ in items]}
            stored = {r[0] for r in conn.execute(_STORED.get(stream, _ENTRIES), params)}  # type: ignore[arg-type]
            dead = {r[0] for r in conn.execute(_DEAD, params)}
            for seq, subject, ident in items:
                if seq in dead:
                    fates["dead-lettered"] += 1
                elif seq in stored:
                    fates["ingested"] += 1
                elif stream == VOTE_STREAM and subject.endswith(".close") and subject.count(".") == 4:
                    fates["close (no row by design)"] += 1
                elif ident and conn.execute(_REPLACED, {"id": ident, "seq": seq}).fetchone():  # type: ignore[arg-type]
                    fates["ingested"] += 1  # replaced or forgotten by a later message of its id
                else:
                    fates["dropped"] += 1
                    if fates["dropped"] <= 5:
                        print(f"  dropped: {stream} seq {seq} {subject}")
    return fates


async def lag(js: JetStreamContext, settings: Settings) -> int:
    total = 0
    for stream, handler in ((Subjects(settings.board.bucket).kv_stream, "entries"), (MEMORY_STREAM, "memories"),
                            (MESSAGE_STREAM, "messages"), (VOTE_STREAM, "votes")):
        info = await js.consumer_info(stream, Subjects.worker_consumer("soak", handler))
        total += int(info.num_pending or 0) + int(info.num_ack_pending or 0)
    return total


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--sdk", type=int, default=2_000, help="hostile SDK calls")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--catch-up", type=float, default=600.0, help="seconds the worker may take to catch up")
    add_bus_option(ap)
    a = ap.parse_args()
    async with embedded_stack("bb-fuzz-soak-", open_bus=a.insecure_open_bus) as (settings, bus, pg):
        ns = bus.server
        print(f"fuzz_soak: {bus.label}" + ("" if bus.open_bus else " (raw messages published as the worker, "
                                           "hostile SDK calls as the agent 'soaker')"), flush=True)
        worker = spawn_worker(settings, bus)
        try:
            before = {"worker": rss_kib(worker.pid), "nats-server": rss_kib(ns.pid),
                      "postgres": rss_kib(pg.pid, tree=True)}
            nc = await connect_nats(settings.nats, name="soak")
            js = nc.jetstream()
            t0 = time.perf_counter()
            print(f"publishing {a.messages} messages...", flush=True)
            acked, refused = await publish_raw(js, a.messages, a.seed, "soak", "soaker")
            published = time.perf_counter() - t0
            sdk_acked, sdk_refused, sdk_raw = await sdk_refusals(settings, a.sdk, a.seed, "soak")
            deadline = time.monotonic() + a.catch_up
            caught_up = False
            print(f"published in {published:.1f} s; hostile SDK calls done; waiting for the worker", flush=True)
            shown = 0.0
            while time.monotonic() < deadline and worker.poll() is None:
                behind = await lag(js, settings)
                if behind == 0:
                    caught_up = True
                    break
                if time.monotonic() - shown > 10:
                    shown = time.monotonic()
                    print(f"  worker lag: {behind}", flush=True)
                await asyncio.sleep(0.5)
            elapsed = time.perf_counter() - t0
            alive = worker.poll() is None
            after = {"worker": rss_kib(worker.pid), "nats-server": rss_kib(ns.pid),
                     "postgres": rss_kib(pg.pid, tree=True)}
            fates = account(settings.postgres.dsn.get_secret_value(), acked + sdk_acked,
                            settings.board.max_value_size)
            await nc.close()
        finally:
            worker.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(10)
    total = a.messages + a.sdk
    print(f"\nfuzz soak: {a.messages} raw messages (seed {a.seed}) + {a.sdk} hostile SDK calls = {total}")
    print(f"  ingested                  {fates['ingested']:>8}")
    print(f"  dead-lettered             {fates['dead-lettered']:>8}")
    print(f"  close requests (no row)   {fates['close (no row by design)']:>8}")
    print(f"  refused at publish        {sum(refused.values()) + sum(sdk_refused.values()):>8}"
          f"   (raw: {dict(refused.most_common(4))}; SDK: {dict(sdk_refused.most_common(4))})")
    print(f"  dropped                   {fates['dropped']:>8}   (acknowledged, neither stored nor dead-lettered)")
    if sdk_raw:
        print(f"  SDK errors outside the error tree: {dict(sdk_raw.most_common(8))}")
    print(f"  RSS (MiB)     {'before':>8} {'after':>8}")
    for name in before:
        print(f"  {name:<13} {before[name] / 1024:>8.1f} {after[name] / 1024:>8.1f}")
    print(f"  elapsed: {elapsed:.1f} s (publishing {published:.1f} s); worker "
          f"{'alive' if alive else 'DIED'}, {'caught up' if caught_up else 'NOT caught up'}")
    ok = fates["dropped"] == 0 and alive and caught_up
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
