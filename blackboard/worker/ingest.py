"""The ingest loop of one stream: fetch a batch, write it in one transaction, ack.

Acks go out only after the commit, so a crash (even ``kill -9``) mid-batch
leaves the batch unacknowledged and JetStream redelivers it after
``ack_wait``; the writers are idempotent on (stream, seq), so the redelivery
writes nothing twice. A message that cannot be decoded goes to the dead-letter
table in the same transaction and is acknowledged once that transaction
commits. Every message is either stored or dead-lettered with its reason: an
unexpected exception while decoding one message, or while writing one row
(serialization, a value PostgreSQL refuses), dead-letters that message alone
instead of failing the batch, so no payload can stop a consumer or be
redelivered forever (``docs/worker.md``, "Dead letters"). While PostgreSQL is down the
loop keeps the batch, tells JetStream it is still in progress, backs off
(doubling up to ``max_backoff``) and retries; nothing is acknowledged, nothing
is lost.

Signatures (docs/security.md, "Signatures"): with a verifier, every decoded
record's signature is checked once, here, for the whole batch at a time
(:meth:`~blackboard.security.verifier.Verifier.verify_many`: the Ed25519
checks in ``worker.verify_threads`` threads, while another writer's batch is
being written). A row carries its verdict into PostgreSQL; a record whose
verdict is not ``verified`` is a dead letter (reason ``signature <verdict>:
...``), and so is an unsigned one when ``worker.require_signatures`` holds.
Without a verifier (``worker.verify`` off, or a worker without a credential on
an open bus) every row is stored ``unsigned``.

Throughput (see docs/worker.md for the figures): batches are pulled with a
lean pull request on a private inbox (one request in flight, the next one sent
as soon as a batch is taken, so fetching overlaps writing), decoded without
pydantic on the common path, COPYed in binary, and, for handlers that allow
it, written by several concurrent transactions so that PostgreSQL works on
one batch while this process decodes the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from blackboard.db import ingest_sql as q
from blackboard.observability import tracing
from blackboard.observability.metrics import WorkerMetrics
from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.signing import Verdict, parse_signature
from blackboard.protocol.subjects import Header, Subjects
from blackboard.security.verifier import KeyLookup, Signed, Verifier
from blackboard.settings import Settings
from blackboard.worker._tasks import run_until_stopped
from blackboard.worker.decode import DeadLetter, RawMessage, parse_ack_reply
from blackboard.worker.stream_handler import Conn, StreamHandler

__all__ = [
    "RETRYABLE",
    "ROW_FAULT_CLASSES",
    "ConsumerLag",
    "IngestLoop",
    "IngestStats",
    "backoff_delays",
    "error_line",
    "is_retryable",
    "signature_reason",
    "to_raw",
]

log = logging.getLogger("blackboard.worker.ingest")

#: Errors after which the same batch is simply retried (connection trouble,
#: deadlock or serialization failure between workers).
RETRYABLE = (psycopg.OperationalError, psycopg.errors.TransactionRollback, PoolTimeout)
#: SQLSTATE classes of errors a row's content causes, whatever psycopg's class
#: (``ProgramLimitExceeded``, an index row over PostgreSQL's size limit, is an
#: ``OperationalError``): data exception, integrity constraint violation,
#: program limit exceeded. The same row fails the same way on every retry, so
#: the batch is written row by row and the row dead-lettered instead.
ROW_FAULT_CLASSES = frozenset({"22", "23", "54"})


def is_retryable(exc: BaseException) -> bool:
    """Whether a failed write is retried as it is: connection trouble (no SQLSTATE,
    class 08, an administrator's shutdown, resources), a deadlock or serialization
    failure, a pool timeout; not an error of :data:`ROW_FAULT_CLASSES`."""
    if not isinstance(exc, RETRYABLE):
        return False
    state = getattr(exc, "sqlstate", None)
    return not (isinstance(state, str) and state[:2] in ROW_FAULT_CLASSES)


def error_line(exc: BaseException) -> str:
    """The first line of an error's message (its type's name if it has none), for a log line."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def signature_reason(verdict: Verdict, item: Signed, keys: KeyLookup) -> str:
    """The dead-letter reason of a record whose signature gave ``verdict``: ``signature
    <verdict>: ...``, naming the signer (principal, kind and key, when its certificate is
    known) and what the record claims (its author, or the kind of identity that writes it)."""
    try:
        sig = parse_signature(item.headers)
    except InvalidPayloadError as exc:
        return f"signature {verdict}: {exc.reason}"
    if sig is None:
        return f"signature {verdict}: the record carries no signature (worker.require_signatures)"
    info = keys.lookup(sig.public_key)
    signer = (f"{info.principal!r} ({info.kind}, key {sig.public_key})" if info is not None
              else f"key {sig.public_key}, which has no valid certificate in the key registry")
    if item.author is not None:
        claim = f"; the record's author is {item.author!r}"
    elif item.kind is not None:
        claim = f"; only a {item.kind} identity writes this record"
    else:
        claim = ""
    detail = ""
    if verdict is Verdict.STALE and item.stored_at is not None:
        signed = datetime.fromtimestamp(sig.signed_at_us / 1e6, UTC)
        detail = f"; signed at {signed.isoformat()}, stored at {item.stored_at.isoformat()}"
    elif verdict is Verdict.REVOKED:
        at = keys.revoked_at(sig.public_key)
        detail = f"; the key was revoked at {at.isoformat()}" if at is not None else ""
    elif verdict is Verdict.BAD_SIGNATURE:
        detail = "; the signature does not match the message (altered, or signed for another subject)"
    return f"signature {verdict}: signed by {signer}{claim}{detail}"


def backoff_delays(first: float, maximum: float) -> Callable[[], float]:
    """A generator of exponential back-off delays: first, 2x, 4x, ... capped at maximum."""
    state = [first / 2]

    def nxt() -> float:
        state[0] = min(maximum, state[0] * 2)
        return state[0]

    return nxt


_NO_HEADERS: dict[str, str] = {}
_STATUS = Header.STATUS.value
_DESCRIPTION = Header.DESCRIPTION.value
#: Messages decoded between two yields to the event loop.
_DECODE_SLICE = 64


def to_raw(msg: Msg) -> RawMessage:
    """The fields of a JetStream message the decoders need.

    The timestamp is the exact server time (nats-py's ``metadata.timestamp``
    goes through a float and can be 1 µs off, which a recount of a vote
    deadline would notice).

    Raises:
        ValueError: not a JetStream message (no ack subject).
    """
    stream, seq, stamp = parse_ack_reply(msg.reply or "")
    return RawMessage(stream, seq, msg.subject, msg.headers or _NO_HEADERS, msg.data, stamp)


class _ConnSlot:
    """One pooled connection held by a writer across batches, returned on error or exit."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool
        self._conn: Conn | None = None

    async def get(self) -> Conn:
        if self._conn is None or self._conn.closed:
            self._conn = await self._pool.getconn()
        return self._conn

    async def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await self._pool.putconn(conn)


class PullFetcher:
    """Pulls batches of a durable consumer with one request in flight, on a private inbox.

    nats-py's ``fetch`` waits for every message with ``asyncio.wait_for`` (a
    task per message, ~50 µs of CPU each here); this collects them in a
    subscription callback (~5 µs). A request asks for ``batch`` messages and
    expires after ``wait``: the server sends what it has at once and the rest
    as it arrives, and ends the request with a 408 status at expiry (no status
    when the batch filled). Messages arriving after a fetch returned (a lost
    status, a reconnect) go to the next batch: every delivered message is
    handed out exactly once by this object.
    """

    def __init__(self, nc: NATS, stream: str, durable: str) -> None:
        self._nc = nc
        self._next = Subjects.consumer_next_api(stream, durable)
        self._inbox = nc.new_inbox()
        self._sub: Subscription | None = None
        self._buf: list[Msg] = []
        self._want = 0
        self._done: asyncio.Future[None] | None = None
        #: Status code and description of the last request that ended with one
        #: other than a timeout (e.g. ``409 Consumer Deleted``).
        self.last_error: tuple[str, str] | None = None

    async def start(self) -> None:
        """Subscribe the inbox (idempotent)."""
        if self._sub is None:
            # Unbounded client-side queue: the requests bound what the server sends.
            self._sub = await self._nc.subscribe(self._inbox, cb=self._on_msg, pending_msgs_limit=0,
                                                 pending_bytes_limit=0)

    async def stop(self) -> None:
        """Unsubscribe; messages delivered and not handed out are redelivered after ack_wait."""
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def _on_msg(self, msg: Msg) -> None:
        headers = msg.headers
        if headers and not msg.data and _STATUS in headers:
            status = headers[_STATUS]
            if status == "100":  # idle heartbeat (not requested, but harmless)
                return
            if status not in ("404", "408"):
                self.last_error = (status, headers.get(_DESCRIPTION, ""))
            if self._done is not None and not self._done.done():
                self._done.set_result(None)
            return
        self._buf.append(msg)
        if len(self._buf) >= self._want and self._done is not None and not self._done.done():
            self._done.set_result(None)

    async def fetch(self, batch: int, wait: float) -> list[Msg]:
        """Up to ``batch`` messages (a few more if stragglers of an earlier request came in).

        Returns once the batch is full or ``wait`` seconds passed (empty if
        nothing came).
        """
        await self.start()
        self.last_error = None
        self._want = batch
        done = self._done = asyncio.get_running_loop().create_future()
        if len(self._buf) < batch:
            req = {"batch": batch - len(self._buf), "expires": max(1_000_000, int(wait * 1e9))}
            await self._nc.publish(self._next, json.dumps(req).encode(), reply=self._inbox)
            # The server ends the request itself; the margin covers a lost status.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(done), wait + 1.0)
        self._done = None
        msgs, self._buf = self._buf, []
        return msgs


@dataclass(frozen=True, slots=True)
class ConsumerLag:
    """How far a durable consumer is behind its stream."""

    stream: str
    consumer: str
    #: Messages not yet delivered to any worker.
    pending: int
    #: Delivered but not yet acknowledged (being written).
    ack_pending: int
    #: Stream sequence of the last acknowledged message (all below are done).
    ack_floor: int

    @property
    def total(self) -> int:
        return self.pending + self.ack_pending


@dataclass
class IngestStats:
    """Counters of one ingest loop since start."""

    messages: int = 0
    written: int = 0
    dead_letters: int = 0
    #: Dead letters caused by an unexpected exception (a bug, or a limit the
    #: decoders missed): each is logged with its traceback.
    unexpected: int = 0
    batches: int = 0
    retries: int = 0
    #: Dead letters whose signature did not verify (or was missing where required), by verdict.
    rejected: dict[str, int] = field(default_factory=dict)
    #: Seconds spent waiting for batches' signature checks.
    verify_seconds: float = 0.0
    last_error: str | None = None
    last_batch_at: float | None = field(default=None)


class IngestLoop:
    """Consumes one stream into PostgreSQL (one per handler per worker process).

    Several processes running the same handler share its durable consumer, so
    JetStream splits the messages between them.
    """

    def __init__(self, handler: StreamHandler, js: JetStreamContext, pool: AsyncConnectionPool,
                 settings: Settings, *, on_written: Callable[[], None] | None = None,
                 verifier: Verifier | None = None) -> None:
        """``verifier``: checks each record's signature (None: rows are stored ``unsigned``,
        as with ``worker.verify`` off or on an open bus); a handler without
        :attr:`~blackboard.worker.stream_handler.StreamHandler.signed` is not checked."""
        self.handler = handler
        self.settings = settings
        self.durable = Subjects.worker_consumer(settings.worker.group, handler.name)
        self.stats = IngestStats()
        self._js = js
        self._pool = pool
        self._on_written = on_written
        self._fetcher: PullFetcher | None = None
        self._verifier = verifier if handler.signed is not None else None
        #: Unsigned records are dead letters (when there is a verifier).
        self._require = settings.worker.require_signatures
        #: Concurrent write transactions (batches in flight to PostgreSQL).
        self.writers = max(1, settings.worker.ingest_writers) if handler.concurrent_writes else 1
        #: Counts batches, dead letters and latency (None: the worker's metrics are off).
        self.metrics: WorkerMetrics | None = None

    async def setup(self) -> None:
        """Create (or bind to) the durable consumer."""
        w = self.settings.worker
        config = api.ConsumerConfig(
            durable_name=self.durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=api.DeliverPolicy.ALL,
            filter_subject=self.handler.filter_subject,
            ack_wait=w.ack_wait,
            max_ack_pending=w.max_ack_pending,
            max_deliver=-1,
            max_waiting=512,
        )
        try:
            await self._js.add_consumer(self.handler.stream, config)
        except BadRequestError as exc:
            # Exists with another configuration: keep it (an operator changed
            # settings on one worker only); log so it can be fixed.
            log.warning("consumer %s on %s exists with a different configuration: %s",
                        self.durable, self.handler.stream, exc.description)
        if self._fetcher is None:
            # nats-py offers no public accessor of a JetStream context's client.
            self._fetcher = PullFetcher(self._js._nc, self.handler.stream, self.durable)
        await self._fetcher.start()

    async def lag(self) -> ConsumerLag:
        """The consumer's lag as JetStream reports it."""
        info = await self._js.consumer_info(self.handler.stream, self.durable)
        return ConsumerLag(self.handler.stream, self.durable, int(info.num_pending or 0),
                           int(info.num_ack_pending or 0),
                           int(info.ack_floor.stream_seq if info.ack_floor else 0))

    async def _fetch_loop(self, stop: asyncio.Event, queue: asyncio.Queue[list[Msg]]) -> None:
        assert self._fetcher is not None
        w = self.settings.worker
        while not stop.is_set():
            try:
                msgs = await self._fetcher.fetch(w.batch_size, w.batch_wait)
            except Exception as exc:  # NATS trouble (reconnecting): retry the fetch
                log.debug("%s: fetch failed: %r", self.durable, exc)
                self.stats.last_error = repr(exc)
                await asyncio.sleep(0.2)
                continue
            if stop.is_set():
                # The cancel that came with ``stop`` may have been lost in the fetch (Python
                # 3.11's wait_for returns a result that is ready instead of raising it): the
                # writers are gone, a full queue would keep this waiting for ever. The batch
                # is not acknowledged: it is redelivered.
                return
            if self._fetcher.last_error is not None:
                status, desc = self._fetcher.last_error
                self.stats.last_error = f"pull request ended with {status} {desc}"
                log.warning("%s: %s", self.durable, self.stats.last_error)
                if "deleted" in desc.lower():
                    with contextlib.suppress(Exception):
                        await self.setup()  # the consumer was removed: create it again
                await asyncio.sleep(0.2)
            if msgs:
                await queue.put(msgs)

    async def _write_loop(self, stop: asyncio.Event, queue: asyncio.Queue[list[Msg]]) -> None:
        slot = _ConnSlot(self._pool)
        try:
            while not stop.is_set():
                msgs = await queue.get()
                await self.process(msgs, stop, slot)
        finally:
            await slot.release()

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set.

        One task pulls batches (the next request goes out as soon as a batch
        is taken, so fetching overlaps writing); ``writers`` tasks decode and
        write them, each in its own transaction, so that this process decodes
        one batch while PostgreSQL writes another.
        """
        if self._fetcher is None:
            await self.setup()
        queue: asyncio.Queue[list[Msg]] = asyncio.Queue(maxsize=1)
        await run_until_stopped(stop, {
            f"{self.durable} fetch": lambda halt: self._fetch_loop(halt, queue),
            **{f"{self.durable} write {i}": lambda halt: self._write_loop(halt, queue) for i in range(self.writers)},
        })

    def decode(self, msgs: Sequence[Msg]) -> tuple[list[tuple[Msg, Any]], list[DeadLetter], list[Signed | None]]:
        """Decode a batch (pure): rows to write, dead letters, and what each row's signature
        must prove (None: not checked; all None without a verifier)."""
        rows: list[tuple[Msg, Any]] = []
        dead: list[DeadLetter] = []
        checks: list[Signed | None] = []
        signed = self.handler.signed if self._verifier is not None else None
        decode = self.handler.decode
        for msg in msgs:
            try:
                raw = to_raw(msg)
            except Exception as exc:  # not a JetStream message: cannot even be dead-lettered by seq
                log.error("%s: dropping message without JetStream metadata: %r", self.durable, exc)
                continue
            try:
                row = decode(raw)
                check = signed(raw, row) if signed is not None else None
            except InvalidPayloadError as exc:
                dead.append(DeadLetter.of(raw, exc.reason))
                continue
            except Exception as exc:  # the per-message guard: one payload never stops the consumer
                dead.append(self._unexpected(raw, "decoding", exc))
                continue
            rows.append((msg, row))
            checks.append(check)
        return rows, dead, checks

    def _unexpected(self, raw: RawMessage, stage: str, exc: Exception) -> DeadLetter:
        """The dead letter of a message whose ``stage`` raised an exception no decoder names."""
        self.stats.unexpected += 1
        log.error("%s: seq %d on %s: unexpected %s while %s; dead-lettered", self.durable, raw.seq,
                  raw.subject, type(exc).__name__, stage, exc_info=exc)
        return DeadLetter.of(raw, f"unexpected {type(exc).__name__} while {stage}: {error_line(exc)}")

    async def _decode_yielding(self, msgs: Sequence[Msg]
                               ) -> tuple[list[tuple[Msg, Any]], list[DeadLetter], list[Signed | None]]:
        """:meth:`decode` in slices, letting the event loop run in between.

        Another writer's transaction waits for this process at every round
        trip: decoding a whole batch in one go would leave PostgreSQL idle.
        """
        rows: list[tuple[Msg, Any]] = []
        dead: list[DeadLetter] = []
        checks: list[Signed | None] = []
        for i in range(0, len(msgs), _DECODE_SLICE):
            r, d, c = self.decode(msgs[i:i + _DECODE_SLICE])
            rows += r
            dead += d
            checks += c
            if self.writers > 1:
                await asyncio.sleep(0)
        return rows, dead, checks

    async def _verify(self, rows: list[tuple[Msg, Any]], checks: list[Signed | None],
                      dead: list[DeadLetter]) -> list[tuple[Msg, Any]]:
        """The rows whose records may be stored, each with its verdict; the others become
        dead letters (appended to ``dead``).

        The signature checks of the batch run in the verifier's threads: meanwhile the
        event loop serves the other writers' transactions.
        """
        verifier = self._verifier
        items = [c for c in checks if c is not None]
        if verifier is None or not items:
            return rows
        started = time.perf_counter()
        verdicts = iter(await verifier.verify_many(items))
        self.stats.verify_seconds += time.perf_counter() - started
        kept: list[tuple[Msg, Any]] = []
        for pair, check in zip(rows, checks, strict=True):
            if check is None:  # written by the server (a delete marker): stored unsigned
                kept.append(pair)
                continue
            verdict = next(verdicts)
            if verdict is Verdict.VERIFIED or (verdict is Verdict.UNSIGNED and not self._require):
                pair[1].verdict = verdict.value
                kept.append(pair)
                continue
            self.stats.rejected[verdict.value] = self.stats.rejected.get(verdict.value, 0) + 1
            try:
                reason = signature_reason(verdict, check, verifier.keys)
            except Exception as exc:  # the reason is a courtesy: never lose the dead letter over it
                reason = f"signature {verdict}: ({type(exc).__name__} while describing it)"
            dead.append(DeadLetter.of(to_raw(pair[0]), reason))
        return kept

    async def process(self, msgs: Sequence[Msg], stop: asyncio.Event | None = None,
                      slot: _ConnSlot | None = None) -> bool:
        """Write one batch and ack it. Returns False when stopped before it was written.

        ``slot`` keeps one pooled connection across batches (the pool checks a
        connection on every checkout, a round trip per batch otherwise).
        """
        traced = tracing.enabled
        started_ns = time.time_ns() if traced else 0
        started = time.perf_counter()
        rows, dead, checks = await self._decode_yielding(msgs)
        rows = await self._verify(rows, checks, dead)
        commit_ns = time.time_ns() if traced else 0
        delay = backoff_delays(0.05, self.settings.worker.max_backoff)
        own = slot is None
        if slot is None:
            slot = _ConnSlot(self._pool)
        isolate = isolated = False
        try:
            while True:
                try:
                    if isolate:
                        rows, dead = await self._isolate(rows, dead)
                        isolate, isolated = False, True
                    await self._write(rows, dead, slot)
                    break
                except Exception as exc:
                    # Refused again once isolated (the dead letters themselves?): back
                    # off like a retryable error rather than spin.
                    if not isolated and not is_retryable(exc):
                        # A row PostgreSQL refuses (a constraint, a value or an index
                        # row out of range), or one the writer cannot build or
                        # serialize: write row by row, dead-lettering the ones that fail.
                        log.warning("%s: batch refused (%s: %s); writing row by row", self.durable,
                                    type(exc).__name__, error_line(exc))
                        isolate = True
                        continue
                    self.stats.retries += 1
                    self.stats.last_error = repr(exc)
                    if self.metrics is not None:
                        self.metrics.ingest_retries.labels(self.handler.stream).inc()
                    wait = delay()
                    log.warning("%s: PostgreSQL unavailable (%s); retrying in %.2fs", self.durable,
                                error_line(exc), wait)
                    for msg in msgs:  # keep the batch ours while we wait
                        with contextlib.suppress(Exception):
                            await msg.in_progress()
                    if stop is not None:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), wait)
                        if stop.is_set():
                            return False
                    else:
                        await asyncio.sleep(wait)
        finally:
            if own:
                await slot.release()
        if traced:  # spans in each traced writer's trace (docs/observability.md, "Tracing")
            tracing.consumer_spans(self.handler.stream, [(m.headers, _sequence(m)) for m in msgs], started_ns,
                                   commit_ns, time.time_ns(), rows=len(rows), embeds=self.handler.embeds)
        # Acks are fire-and-forget publishes; nats-py buffers them and its
        # flusher sends them together.
        for msg in msgs:
            with contextlib.suppress(Exception):
                await msg.ack()
        self.stats.messages += len(msgs)
        self.stats.written += len(rows)
        self.stats.dead_letters += len(dead)
        self.stats.batches += 1
        self.stats.last_batch_at = time.time()
        if self.metrics is not None:
            self.metrics.ingested(self.handler.stream, len(msgs), len(rows), (d.reason for d in dead),
                                  time.perf_counter() - started)
        if dead:
            log.warning("%s: %d message(s) dead-lettered, e.g. seq %d: %s", self.durable, len(dead),
                        dead[0].seq, dead[0].reason)
        if rows and self.handler.embeds and self._on_written is not None:
            self._on_written()
        return True

    async def _write(self, rows: Sequence[tuple[Msg, Any]], dead: Sequence[DeadLetter], slot: _ConnSlot) -> None:
        conn = await slot.get()
        try:
            async with conn.transaction():
                if dead:
                    await _write_dead(conn, dead)
                if rows:
                    await self.handler.write(conn, [r for _, r in rows])
        except BaseException:
            # Back to the pool, which rolls back or discards a broken connection.
            await slot.release()
            raise

    async def _isolate(self, rows: list[tuple[Msg, Any]], dead: list[DeadLetter]
                       ) -> tuple[list[tuple[Msg, Any]], list[DeadLetter]]:
        good: list[tuple[Msg, Any]] = []
        dead = list(dead)
        async with self._pool.connection() as conn:
            for msg, row in rows:
                try:
                    async with conn.transaction():
                        await self.handler.write(conn, [row])
                    good.append((msg, row))
                except psycopg.Error as exc:
                    if is_retryable(exc):  # the connection, not the row: retry the batch
                        raise
                    dead.append(DeadLetter.of(to_raw(msg), f"refused by PostgreSQL: {exc}"))
                except Exception as exc:  # the per-message guard, on the write side
                    dead.append(self._unexpected(to_raw(msg), "writing", exc))
        # The good rows are now committed; writing them again in the retried
        # batch is a no-op (idempotent), and keeps one code path.
        return good, dead


def _sequence(msg: Msg) -> int:
    """A message's stream sequence (0 when its reply is not a JetStream ack subject)."""
    try:
        return parse_ack_reply(msg.reply or "")[1]
    except ValueError:
        return 0


async def _write_dead(conn: Conn, dead: Sequence[DeadLetter]) -> None:
    async with conn.cursor() as cur:
        await cur.executemany(q.INSERT_DEAD_LETTER, [
            (d.stream, d.seq, d.subject, d.reason, d.data, Jsonb(dict(d.headers))) for d in dead
        ])
