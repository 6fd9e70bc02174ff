"""The ingest loop of one stream: fetch a batch, write it in one transaction, ack.

Acks go out only after the commit, so a crash (even ``kill -9``) mid-batch
leaves the batch unacknowledged and JetStream redelivers it after
``ack_wait``; the writers are idempotent on (stream, seq), so the redelivery
writes nothing twice. A message that cannot be decoded goes to the dead-letter
table in the same transaction and is acknowledged. While PostgreSQL is down the
loop keeps the batch, tells JetStream it is still in progress, backs off
(doubling up to ``max_backoff``) and retries; nothing is acknowledged, nothing
is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from blackboard.db import ingest_sql as q
from blackboard.errors import InvalidPayloadError
from blackboard.settings import Settings
from blackboard.votelog import jetstream_time
from blackboard.worker.decode import DeadLetter, RawMessage
from blackboard.worker.handlers import Conn, StreamHandler

__all__ = ["ConsumerLag", "IngestLoop", "IngestStats", "backoff_delays", "to_raw"]

log = logging.getLogger("blackboard.worker.ingest")

#: Errors after which the same batch is simply retried (connection trouble,
#: deadlock or serialization failure between workers).
_RETRYABLE = (psycopg.OperationalError, psycopg.errors.TransactionRollback, PoolTimeout)


def backoff_delays(first: float, maximum: float) -> Callable[[], float]:
    """A generator of exponential back-off delays: first, 2x, 4x, ... capped at maximum."""
    state = [first / 2]

    def nxt() -> float:
        state[0] = min(maximum, state[0] * 2)
        return state[0]

    return nxt


def to_raw(msg: Msg) -> RawMessage:
    """The fields of a JetStream message the decoders need."""
    md = msg.metadata
    # The exact server time (nats-py's metadata.timestamp goes through a float
    # and can be 1 µs off, which a recount of a vote deadline would notice).
    stamp = jetstream_time(msg.reply) or md.timestamp
    return RawMessage(md.stream, md.sequence.stream, msg.subject, msg.headers or {}, msg.data, stamp)


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
    batches: int = 0
    retries: int = 0
    last_error: str | None = None
    last_batch_at: float | None = field(default=None)


class IngestLoop:
    """Consumes one stream into PostgreSQL (one per handler per worker process).

    Several processes running the same handler share its durable consumer, so
    JetStream splits the messages between them.
    """

    def __init__(self, handler: StreamHandler, js: JetStreamContext, pool: AsyncConnectionPool,
                 settings: Settings, *, on_written: Callable[[], None] | None = None) -> None:
        self.handler = handler
        self.settings = settings
        self.durable = f"{settings.worker.name}-{handler.name}"
        self.stats = IngestStats()
        self._js = js
        self._pool = pool
        self._on_written = on_written
        self._psub: JetStreamContext.PullSubscription | None = None

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
        self._psub = await self._js.pull_subscribe_bind(self.durable, self.handler.stream)

    async def lag(self) -> ConsumerLag:
        """The consumer's lag as JetStream reports it."""
        info = await self._js.consumer_info(self.handler.stream, self.durable)
        return ConsumerLag(self.handler.stream, self.durable, int(info.num_pending or 0),
                           int(info.num_ack_pending or 0),
                           int(info.ack_floor.stream_seq if info.ack_floor else 0))

    async def _fetch(self) -> list[Msg]:
        assert self._psub is not None
        try:
            return await self._psub.fetch(self.settings.worker.batch_size, timeout=self.settings.worker.batch_wait)
        except TimeoutError:
            return []

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set. Fetching the next batch overlaps writing this one."""
        if self._psub is None:
            await self.setup()
        pending_fetch: asyncio.Task[list[Msg]] = asyncio.create_task(self._fetch())
        try:
            while not stop.is_set():
                try:
                    msgs = await pending_fetch
                except Exception as exc:  # NATS trouble (reconnecting): retry the fetch
                    log.debug("%s: fetch failed: %r", self.durable, exc)
                    self.stats.last_error = repr(exc)
                    msgs = []
                    await asyncio.sleep(0.2)
                pending_fetch = asyncio.create_task(self._fetch())
                if msgs:
                    await self.process(msgs, stop)
        finally:
            pending_fetch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pending_fetch

    def decode(self, msgs: Sequence[Msg]) -> tuple[list[tuple[Msg, Any]], list[DeadLetter]]:
        """Decode a batch (pure): rows to write, and dead letters."""
        rows: list[tuple[Msg, Any]] = []
        dead: list[DeadLetter] = []
        for msg in msgs:
            try:
                raw = to_raw(msg)
            except Exception as exc:  # not a JetStream message: cannot even be dead-lettered by seq
                log.error("%s: dropping message without JetStream metadata: %r", self.durable, exc)
                continue
            try:
                rows.append((msg, self.handler.decode(raw)))
            except InvalidPayloadError as exc:
                dead.append(DeadLetter.of(raw, exc.reason))
        return rows, dead

    async def process(self, msgs: Sequence[Msg], stop: asyncio.Event | None = None) -> bool:
        """Write one batch and ack it. Returns False when stopped before it was written."""
        rows, dead = self.decode(msgs)
        delay = backoff_delays(0.05, self.settings.worker.max_backoff)
        while True:
            try:
                await self._write(rows, dead)
                break
            except _RETRYABLE as exc:
                self.stats.retries += 1
                self.stats.last_error = repr(exc)
                wait = delay()
                log.warning("%s: PostgreSQL unavailable (%s); retrying in %.2fs", self.durable,
                            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, wait)
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
            except psycopg.Error as exc:
                # A row PostgreSQL refuses (a constraint, a value out of range):
                # write row by row, dead-lettering the ones that fail.
                log.warning("%s: batch refused (%s); writing row by row", self.durable, exc)
                rows, dead = await self._isolate(rows, dead)
        for msg in msgs:
            with contextlib.suppress(Exception):
                await msg.ack()
        self.stats.messages += len(msgs)
        self.stats.written += len(rows)
        self.stats.dead_letters += len(dead)
        self.stats.batches += 1
        self.stats.last_batch_at = time.time()
        if dead:
            log.warning("%s: %d message(s) dead-lettered, e.g. seq %d: %s", self.durable, len(dead),
                        dead[0].seq, dead[0].reason)
        if rows and self.handler.embeds and self._on_written is not None:
            self._on_written()
        return True

    async def _write(self, rows: Sequence[tuple[Msg, Any]], dead: Sequence[DeadLetter]) -> None:
        async with self._pool.connection() as conn, conn.transaction():
            if dead:
                await _write_dead(conn, dead)
            if rows:
                await self.handler.write(conn, [r for _, r in rows])

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
                except _RETRYABLE:
                    raise
                except psycopg.Error as exc:
                    dead.append(DeadLetter.of(to_raw(msg), f"refused by PostgreSQL: {exc}"))
        # The good rows are now committed; writing them again in the retried
        # batch is a no-op (idempotent), and keeps one code path.
        return good, dead


async def _write_dead(conn: Conn, dead: Sequence[DeadLetter]) -> None:
    async with conn.cursor() as cur:
        await cur.executemany(q.INSERT_DEAD_LETTER, [
            (d.stream, d.seq, d.subject, d.reason, d.data, Jsonb(dict(d.headers))) for d in dead
        ])
