"""What the worker's ``/readyz`` and ``/metrics`` read (docs/observability.md).

:class:`WorkerProbe` answers the readiness check (connected to NATS and PostgreSQL, and
caught up: every stream's pending messages at most ``observability.ready_max_lag``) and
refreshes the metrics read at scrape time: consumer lag, stream and account consumer
counts, the embedding backlog, and the embedder's and vote committer's counters (moved
by the difference since the last scrape, so those components need no hook).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from prometheus_client import Counter

from blackboard.observability.health import Readiness
from blackboard.observability.metrics import WorkerMetrics

if TYPE_CHECKING:
    from blackboard.worker.runner import Worker

__all__ = ["WorkerProbe"]

log = logging.getLogger("blackboard.worker")

#: Seconds PostgreSQL may take to answer the readiness check's ``SELECT 1``.
_PG_TIMEOUT = 3.0


class WorkerProbe:
    """Readiness and the scrape-time metrics of one running worker.

    Args:
        worker: the worker (its loops, embedder, committer and pool are read as they are).
        nc: its NATS connection.
        metrics: what :meth:`refresh` sets.
    """

    def __init__(self, worker: Worker, nc: NATS, metrics: WorkerMetrics) -> None:
        self._worker = worker
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream(timeout=worker.settings.nats.request_timeout)
        self._metrics = metrics
        #: The last value of each component counter moved into a Prometheus counter.
        self._seen: dict[str, float] = {}

    async def readiness(self) -> Readiness:
        """Ready when NATS is connected, PostgreSQL answers, and every stream's pending
        messages are at most ``observability.ready_max_lag``."""
        w = self._worker
        checks: dict[str, object] = {"nats": self._nc.is_connected}
        self._metrics.nats_connected.set(1 if self._nc.is_connected else 0)
        checks["postgres"] = await self._postgres_ok()
        limit = w.settings.observability.ready_max_lag
        lag: dict[str, int] = {}
        try:
            for lg in await w.lag():
                lag[lg.stream] = lg.pending
        except Exception as exc:
            checks["lag"] = f"unknown: {type(exc).__name__}: {exc}"
        else:
            checks["lag"] = lag
        caught_up = isinstance(checks["lag"], dict) and all(n <= limit for n in lag.values())
        checks["caught_up"] = caught_up
        checks["ready_max_lag"] = limit
        ready = bool(checks["nats"]) and checks["postgres"] is True and caught_up
        self._metrics.ready.set(1 if ready else 0)
        return Readiness(ready, checks)

    async def _postgres_ok(self) -> bool | str:
        pool = self._worker.pool
        if pool is None:
            return "no pool"
        try:
            async with asyncio.timeout(_PG_TIMEOUT), pool.connection(timeout=_PG_TIMEOUT) as conn:
                await conn.execute("SELECT 1")
        except Exception as exc:
            return f"{type(exc).__name__}: {str(exc).strip()[:200]}"
        return True

    async def refresh(self) -> None:
        """Set the gauges and move the component counters (before a scrape)."""
        w, m = self._worker, self._metrics
        m.nats_connected.set(1 if self._nc.is_connected else 0)
        for loop in w.loops:
            try:
                info = await self._js.consumer_info(loop.handler.stream, loop.durable)
            except Exception as exc:
                log.debug("metrics: consumer %s: %r", loop.durable, exc)
                continue
            m.consumer_pending.labels(loop.handler.stream, loop.durable).set(info.num_pending or 0)
            m.consumer_ack_pending.labels(loop.handler.stream, loop.durable).set(info.num_ack_pending or 0)
            m.consumer_max_ack_pending.labels(loop.handler.stream, loop.durable).set(
                info.config.max_ack_pending or -1)
        for stream in dict.fromkeys(loop.handler.stream for loop in w.loops):
            try:
                sinfo = await self._js.stream_info(stream)
            except Exception as exc:
                log.debug("metrics: stream %s: %r", stream, exc)
                continue
            m.stream_consumers.labels(stream).set(sinfo.state.consumer_count)
            m.stream_messages.labels(stream).set(sinfo.state.messages)
        try:
            account = await self._js.account_info()
        except Exception as exc:
            log.debug("metrics: account info: %r", exc)
        else:
            m.account_consumers.set(account.consumers)
            m.account_consumer_limit.set(account.limits.max_consumers)
        if w.embedder is not None:
            try:
                m.embedding_backlog.labels("queue").set(await w.embedder.backlog())
                if w.inbox is not None:
                    m.embedding_backlog.labels("inbox").set(await w.inbox.size())
            except Exception as exc:
                log.debug("metrics: embedding backlog: %r", exc)
            self._advance("embedded", m.embedded, w.embedder.stats.embedded)
            self._advance("embed_failures", m.embedding_failures, w.embedder.stats.failures)
        if w.committer is not None:
            self._advance("commits", m.vote_commits, w.committer.stats.commits)
            self._advance("closes", m.vote_deadline_expiries, w.committer.stats.close_requests)
            m.vote_open_proposals.set(w.committer.open_proposals)

    def _advance(self, name: str, counter: Counter, value: float) -> None:
        """Move ``counter`` by what ``value`` (a component's own monotonic count) grew."""
        grew = value - self._seen.get(name, 0.0)
        if grew > 0:
            counter.inc(grew)
            self._seen[name] = value
