"""The worker process: ingest loops, the embedder, the vote committer and the search service.

``Worker(settings)`` is an async context manager: on entry it migrates the
schema, makes sure the JetStream assets exist, opens the Postgres pool and
starts everything; it is fully up when ``__aenter__`` returns (or it raised,
having closed what it opened). Its loops are children of one
:class:`asyncio.TaskGroup`, held by a host task with the connections it opened
(``async with``, closed in reverse on the way out). Each loop runs under a
supervisor that logs an unexpected crash and restarts it after a back-off, so
one bad day of a component never stops the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from psycopg_pool import AsyncConnectionPool

from blackboard.client.connection import check_nats_url, connect_nats
from blackboard.client.keys import KeyRegistry
from blackboard.client.lifecycle import first_error
from blackboard.client.signing import signing_of
from blackboard.client.streams import ensure_streams
from blackboard.db import migrate, open_pool
from blackboard.observability import tracing
from blackboard.observability.health import ObservabilityServer, Readiness
from blackboard.observability.metrics import WorkerMetrics
from blackboard.protocol.errors import ConfigurationError
from blackboard.security.credentials import FoundCredentials, find_system_credentials
from blackboard.security.verifier import Verifier
from blackboard.settings import Settings
from blackboard.worker.committer import VoteCommitter
from blackboard.worker.consolidator import Consolidator, consolidation_enabled
from blackboard.worker.contradictions import ContradictionPublisher
from blackboard.worker.derived import DerivedPublisher
from blackboard.worker.embed_inbox import EmbedInbox
from blackboard.worker.embedder import Embedder, EmbeddingProvider, load_provider
from blackboard.worker.handlers import StreamHandler, default_handlers
from blackboard.worker.ingest import ConsumerLag, IngestLoop, backoff_delays
from blackboard.worker.llm import ChatModel
from blackboard.worker.observed import WorkerProbe
from blackboard.worker.pruning import Pruner

__all__ = ["Worker", "run_worker"]

#: Seconds :meth:`Worker.stop` waits for its tasks to end after cancelling them, before it
#: cancels them again (and logs where they wait), at most STOP_ATTEMPTS times.
STOP_GRACE = 15.0
STOP_ATTEMPTS = 4

log = logging.getLogger("blackboard.worker")


class Worker:
    """One worker process's components, started and stopped together.

    Args:
        settings: the deployment's settings.
        handlers: streams to persist (default: :func:`default_handlers`).
        provider: embedding provider (default: from ``settings.embedding``
            when ``settings.worker.embed``).
        query_provider: embeds search queries (default: ``provider`` when
            given, else an instance of its own from ``settings.embedding``).
        serve_search: also serve the search micro service (default: ``settings.worker.serve_search``).
    """

    def __init__(self, settings: Settings, *, handlers: list[StreamHandler] | None = None,
                 provider: EmbeddingProvider | None = None, query_provider: EmbeddingProvider | None = None,
                 serve_search: bool | None = None) -> None:
        self.settings = settings
        self._handlers = handlers
        self._provider = provider
        self._query_provider = query_provider or provider
        self._serve_search = settings.worker.serve_search if serve_search is None else serve_search
        self._stop = asyncio.Event()
        #: Runs the worker's task group (see start()).
        self._host: asyncio.Task[None] | None = None
        self._components: set[asyncio.Task[None]] = set()
        self._nc: NATS | None = None
        self.pool: AsyncConnectionPool | None = None
        self.loops: list[IngestLoop] = []
        self.embedder: Embedder | None = None
        #: Moves ingest's hand-off rows into the embedding queue (with the embedder).
        self.inbox: EmbedInbox | None = None
        self.search: Any = None
        #: Creates and changes agents' inbox consumers (bb.inbox.<agent>), with the search service.
        self.inbox_admin: Any = None
        #: Commits vote outcomes and closes proposals at their deadline (docs/voting.md).
        self.committer: VoteCommitter | None = None
        #: Checks the ingested records' signatures (None: ``worker.verify`` off, or no credential).
        self.verifier: Verifier | None = None
        #: Merges near-duplicate memories after embedding (None: not embedding, or ``memory.*`` off).
        self.consolidator: Consolidator | None = None
        #: Publishes the proposals of contradictions put to a vote (None: ``memory.contradictions``
        #: is ``supersede``).
        self.contradictions: ContradictionPublisher | None = None
        #: Archives the memories least worth keeping on a schedule (None: ``memory.prune_interval``
        #: is 0, or no strategy nor bound is set).
        self.pruner: Pruner | None = None
        #: The worker's metrics (None: ``observability.http_enabled`` is off), served with the
        #: health endpoints by :attr:`http` (docs/observability.md).
        self.metrics: WorkerMetrics | None = WorkerMetrics() if settings.observability.http_enabled else None
        self.http: ObservabilityServer | None = None
        self._probe: WorkerProbe | None = None
        self.started_at = 0.0

    # -- lifecycle ---------------------------------------------------------
    async def start(self) -> None:
        """Migrate, connect, create consumers and start every loop; returns once all is up.

        Everything runs in one task group held by a host task of the worker's
        own (so ``start`` and ``stop`` may be called from different tasks).
        The worker is either fully up when this returns, or it raised, having
        closed whatever it had opened. Idempotent while running.

        Raises:
            StorageError, MigrationError: PostgreSQL unreachable or schema broken.
            NotConnectedError: NATS unreachable.
            AuthenticationError: no credential for the worker, an agent's credential, or the
                server refused it.
        """
        if self._host is not None and not self._host.done():
            return
        tracing.configure(self.settings.observability)  # observability.tracing: spans from now on
        self._stop.clear()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._host = asyncio.create_task(self._serve(ready), name=f"blackboard worker {self.settings.worker.name}")
        self._host.add_done_callback(_log_crash)
        try:
            await ready
        except BaseException:
            await self.stop()
            raise

    async def _serve(self, ready: asyncio.Future[None]) -> None:
        """The host task: opens what the worker holds, runs its task group, closes all in reverse."""
        try:
            async with contextlib.AsyncExitStack() as held:
                js = await self._open(held)
                async with asyncio.TaskGroup() as group:
                    self._start_components(group, js)
                    async with contextlib.AsyncExitStack() as services:
                        await self._start_search(group, services)
                        self._spawn(group, "lag reporter", self._report_lag)
                        self.started_at = time.time()
                        log.info("worker %s ready (group %s): consumers %s%s", self.settings.worker.name,
                                 self.settings.worker.group, ", ".join(lp.durable for lp in self.loops),
                                 f"; metrics and health on {self.http.url}" if self.http is not None else "")
                        if not ready.done():
                            ready.set_result(None)
                        # Until stop() cancels this task: the search service
                        # stops first, then the group cancels every loop.
                        await asyncio.Future()
        except BaseException as exc:
            if ready.done():
                raise
            if isinstance(exc, asyncio.CancelledError):
                ready.cancel()
                raise
            ready.set_exception(first_error(exc))  # start() raises it; the host ends quietly
        finally:
            self._nc = None
            self.pool = None
            self._probe = None

    async def _open(self, held: contextlib.AsyncExitStack) -> JetStreamContext:
        """Migrate, connect to NATS and PostgreSQL, set every component up (no task yet)."""
        s = self.settings
        if s.observability.http_enabled:  # first: a port already taken fails the start at once
            self.http = await held.enter_async_context(ObservabilityServer(
                s.observability, readiness=self.readiness, metrics=self.metrics, refresh=self.refresh_metrics))
        await migrate(s)
        check_nats_url(s.nats.url)  # a malformed URL is told before a missing credential
        # Its own identity: nats.creds_file, else the credential issued for its name; never an agent's.
        found = find_system_credentials(s.worker.name, s, process=f"the worker {s.worker.name!r}")
        self._nc = nc = await connect_nats(s, name=f"blackboard-{s.worker.name}", credentials=found)
        held.push_async_callback(_quietly, nc.close)
        log.info("worker %s: connected to NATS at %s", s.worker.name, _server_of(nc))
        js = nc.jetstream(timeout=s.nats.request_timeout)
        await ensure_streams(js, s)
        self.verifier = await self._start_verifier(held, nc, found)
        self.pool = await held.enter_async_context(open_pool(s.postgres, name=f"blackboard-{s.worker.name}"))
        log.info("worker %s: connected to PostgreSQL", s.worker.name)
        if s.worker.embed:
            provider = self._provider
            if provider is None:
                provider = load_provider(s)
                held.push_async_callback(_quietly, provider.aclose)
            self.embedder = Embedder(self.pool, provider, s)
            await self.embedder.setup()
            self.inbox = EmbedInbox(self.pool, s, on_moved=self.embedder.wake)
        if s.memory.contradictions == "vote":
            self.contradictions = ContradictionPublisher(self.pool, nc, s)
        wake = _wakes(self.inbox.wake if self.inbox else None,
                      self.contradictions.wake if self.contradictions else None)
        self.loops = []
        for handler in self._handlers or default_handlers(s):
            loop = IngestLoop(handler, js, self.pool, s, on_written=wake, verifier=self.verifier)
            loop.metrics = self.metrics
            await loop.setup()
            self.loops.append(loop)
        self.committer = VoteCommitter(nc, s)
        await self.committer.setup()
        await self._open_consolidator(held, nc)
        if self.metrics is not None:
            self._probe = WorkerProbe(self, nc, self.metrics)
        return js

    async def _open_consolidator(self, held: contextlib.AsyncExitStack, nc: NATS) -> None:
        """The consolidator of embedded memories (near-duplicates, the chat model's merges and
        facts: docs/memory-lifecycle.md), when the worker embeds and ``memory.*`` asks for it."""
        s = self.settings
        if self.embedder is None or self.embedder.space is None or not consolidation_enabled(s):
            return
        assert self.pool is not None
        publisher = DerivedPublisher(nc, s)
        held.push_async_callback(_quietly, publisher.close)
        model = None
        if s.llm.base_url is not None and (s.memory.llm_merge or s.memory.llm_extract_kinds):
            model = ChatModel.from_settings(s.llm)
            held.push_async_callback(_quietly, model.aclose)
        self.consolidator = Consolidator(self.pool, s, self.embedder.space, publisher=publisher, model=model)
        self.embedder.consolidation = self.consolidator.wake

    async def _start_verifier(self, held: contextlib.AsyncExitStack, nc: NATS,
                              found: FoundCredentials | None) -> Verifier | None:
        """The verifier of the ingested records (docs/security.md, "Signatures"): none with
        ``worker.verify`` off or without a credential (an open bus: rows are ``unsigned``).

        It reads certificates and revocations through the connection's key registry
        (one of its own when the connection neither signs nor verifies), and checks a
        batch's signatures in ``worker.verify_threads`` threads. Its verdicts are not
        cached: ingest sees each stored message once.
        """
        s = self.settings
        if not s.worker.verify or found is None:
            log.info("worker %s: signatures not verified (%s): rows are stored unsigned", s.worker.name,
                     "worker.verify is off" if found is not None else "no credential, an open bus")
            return None
        signing = signing_of(nc)
        registry = signing.registry
        if registry is None:
            issuer = found.credentials.claims.get("iss")
            registry = KeyRegistry(nc, s, {*s.security.trusted_accounts, *([issuer] if isinstance(issuer, str) else [])})
            held.push_async_callback(_quietly, registry.stop)
        if signing.verifier is None:  # the connection does not follow the revocations: this does
            await registry.start()
        verifier = Verifier(registry, max_skew=s.security.max_clock_skew, cache_size=0,
                            threads=s.worker.verify_threads)
        held.callback(verifier.close)
        return verifier

    def _start_components(self, group: asyncio.TaskGroup, js: JetStreamContext) -> None:
        if self.embedder is not None:
            self._spawn(group, "embedder", self.embedder.run)
        if self.inbox is not None:
            self._spawn(group, "embedding inbox", self.inbox.run)
        for loop in self.loops:
            self._spawn(group, f"ingest {loop.handler.name}", loop.run)
        if self.committer is not None:
            self._spawn(group, "vote committer", self.committer.run)
        if self.consolidator is not None:
            self._spawn(group, "consolidator", self.consolidator.run)
        if self.contradictions is not None:
            self._spawn(group, "contradiction proposals", self.contradictions.run)
        if Pruner.wanted(self.settings):
            assert self.pool is not None
            self.pruner = Pruner(self.pool, self.settings)
            self._spawn(group, "pruner", self.pruner.run)

    async def _start_search(self, group: asyncio.TaskGroup, services: contextlib.AsyncExitStack) -> None:
        if not self._serve_search:
            return
        from blackboard.search.service import SearchService

        s = self.settings
        query_provider = self._query_provider
        if query_provider is None:
            # An instance of its own: the local model runs one call at
            # a time, so queries would otherwise wait behind the
            # embedder's batches (a batch of 64 takes ~0.3 s here);
            # also lets a worker that does not embed answer semantic
            # queries. The model loads in the background now (the
            # local provider's quantised copy is made on first use,
            # a few seconds), not on the first query.
            try:
                query_provider = load_provider(s, queries=True)
            except ConfigurationError as exc:
                if self.embedder is not None:
                    raise
                log.warning("search: no embedding provider (%s): semantic and hybrid search "
                            "unavailable in this worker", exc)
            else:
                services.push_async_callback(_quietly, query_provider.aclose)
                load = getattr(query_provider, "load", None)  # a local model (an API has nothing to load)
                if load is not None:
                    self._spawn(group, "query model load", self._load_in_background(load))
        assert self._nc is not None
        from blackboard.security.source import RightsSource
        from blackboard.worker.inbox_admin import InboxAdmin

        rights = RightsSource.from_settings(s)
        self.search = await services.enter_async_context(
            SearchService(self._nc, s, provider=query_provider, status=self.status, rights=rights,
                          metrics=self.metrics))
        # The system service's inbox administration (bb.inbox.<agent>): bus only, beside search.
        self.inbox_admin = await services.enter_async_context(InboxAdmin(self._nc, s, rights=rights))

    async def stop(self) -> None:
        """Stop every loop (unacknowledged work is redelivered later) and close connections.

        Cancels the host task: the search service stops, the task group
        cancels and awaits every loop, then the pool and NATS close.
        """
        self._stop.set()
        host, self._host = self._host, None
        if host is None:
            return
        host.cancel()
        for attempt in range(1, STOP_ATTEMPTS + 1):
            done, _ = await asyncio.wait([host], timeout=STOP_GRACE)
            if done:
                break
            # A part that swallowed the cancellation (or waits on IO that ignores it) would keep
            # the worker from stopping for ever: say where each part is, and cancel them again.
            stuck = [t for t in (*self._components, host) if not t.done()]
            log.error("worker %s: still stopping after %.0f s (attempt %d of %d); cancelling again: %s",
                      self.settings.worker.name, STOP_GRACE * attempt, attempt, STOP_ATTEMPTS,
                      "; ".join(_where(t) for t in stuck))
            for task in stuck:
                task.cancel()
        else:
            log.error("worker %s: did not stop after %.0f s; its tasks are left running",
                      self.settings.worker.name, STOP_GRACE * STOP_ATTEMPTS)
            return
        if self.started_at:
            log.info("worker %s stopped", self.settings.worker.name)

    @property
    def tasks(self) -> tuple[asyncio.Task[None], ...]:
        """The running components' tasks (children of the worker's task group)."""
        return tuple(self._components)

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    @staticmethod
    def _load_in_background(load: Callable[[], Awaitable[None]]) -> Callable[[asyncio.Event], Awaitable[None]]:
        async def run(stop: asyncio.Event) -> None:
            try:
                await load()
            except Exception as exc:  # the first query will meet (and report) the same error
                log.warning("search: the query embedding model is unavailable: %s", exc)
            await stop.wait()

        return run

    def _spawn(self, group: asyncio.TaskGroup, what: str, fn: Callable[[asyncio.Event], Awaitable[None]]) -> None:
        """Run ``fn(stop)`` in the group under a supervisor that restarts it after a crash."""
        async def supervise() -> None:
            delay = backoff_delays(0.5, self.settings.worker.max_backoff)
            while not self._stop.is_set():
                try:
                    await fn(self._stop)
                except Exception:
                    wait = delay()
                    log.exception("%s crashed; restarting in %.1fs", what, wait)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), wait)

        task = group.create_task(supervise(), name=f"blackboard {what}")
        self._components.add(task)
        task.add_done_callback(self._components.discard)

    # -- status --------------------------------------------------------------
    async def readiness(self) -> Readiness:
        """What ``/readyz`` answers: ready once started, connected to NATS and PostgreSQL, and
        every stream's pending messages at most ``observability.ready_max_lag``."""
        probe = self._probe
        if probe is None or not self.started_at:
            return Readiness(False, {"started": False})
        return await probe.readiness()

    async def refresh_metrics(self) -> None:
        """Set the metrics read at scrape time (lag, backlog, consumer counts)."""
        if self._probe is not None:
            await self._probe.refresh()

    async def lag(self) -> list[ConsumerLag]:
        """Lag of every consumer of this worker (shared by all worker processes)."""
        return [await loop.lag() for loop in self.loops]

    async def status(self) -> dict[str, Any]:
        """Counters, lag and embedding backlog, as reported by the ``status`` endpoint."""
        lags = await self.lag()
        out: dict[str, Any] = {
            "worker": self.settings.worker.name,
            "uptime": time.time() - self.started_at if self.started_at else 0.0,
            "consumers": [
                {"stream": lg.stream, "consumer": lg.consumer, "pending": lg.pending,
                 "ack_pending": lg.ack_pending, "ack_floor": lg.ack_floor,
                 **{k: getattr(lp.stats, k) for k in ("messages", "written", "dead_letters", "rejected",
                                                      "batches", "retries", "last_error")}}
                for lg, lp in zip(lags, self.loops, strict=True)
            ],
            "lag": sum(lg.total for lg in lags),
            "verification": ({"threads": self.verifier.threads, **self.verifier.stats}
                             if self.verifier is not None else None),
        }
        if self.pruner is not None:
            out["pruning"] = {"archived": dict(self.pruner.archived)}
        if self.embedder is not None:
            out["embedding"] = await self.embedder.status()
            if self.inbox is not None:
                out["embedding"]["inbox"] = await self.inbox.size()
        if self.consolidator is not None:
            out["consolidation"] = {"backlog": await self.consolidator.backlog(), **self.consolidator.status()}
        return out

    async def wait_caught_up(self, within: float = 30.0, *, embedded: bool = False, consolidated: bool = False,
                             poll: float = 0.05) -> None:
        """Wait until every consumer's lag is 0 (and, with ``embedded``, the embedding inbox and queue are empty;
        with ``consolidated`` too, the consolidation queue).

        Raises:
            TimeoutError: not caught up within ``within`` seconds.
        """
        deadline = time.monotonic() + within
        while True:
            lags = await self.lag()
            done = all(lg.total == 0 for lg in lags)
            if done and embedded and self.embedder is not None:
                done = (self.inbox is None or await self.inbox.size() == 0) and await self.embedder.backlog() == 0
            if done and consolidated and self.consolidator is not None:
                done = await self.consolidator.backlog() == 0
            if done:
                return
            if time.monotonic() > deadline:
                waiting = ""
                if embedded and self.embedder is not None:
                    inbox = None if self.inbox is None else await self.inbox.size()
                    waiting = f"; embedding inbox {inbox}, queue {await self.embedder.backlog()}"
                raise TimeoutError(f"worker not caught up after {within:g}s: {lags}{waiting}")
            await asyncio.sleep(poll)

    async def _report_lag(self, stop: asyncio.Event) -> None:
        # At INFO while there is work, and once more when it is done; an idle worker's
        # reports go to DEBUG (INFO is the default level of ``blackboard worker``).
        busy = False
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.worker.lag_interval)
            if stop.is_set():
                return
            try:
                lags = await self.lag()
            except Exception as exc:
                log.warning("cannot read consumer lag: %r", exc)
                continue
            parts = [f"{lg.stream}: {lg.pending} pending, {lg.ack_pending} in flight" for lg in lags]
            work = sum(lg.total for lg in lags)
            if self.embedder is not None:
                with contextlib.suppress(Exception):
                    inbox = await self.inbox.size() if self.inbox is not None else 0
                    backlog = await self.embedder.backlog()
                    work += inbox + backlog
                    parts.append(f"embedding backlog {backlog} (+{inbox} handed over)")
            if busy and not work:
                log.info("lag caught up: %s", "; ".join(parts))
            else:
                log.log(logging.INFO if work else logging.DEBUG, "lag: %s", "; ".join(parts))
            busy = work > 0


#: How long one step of the way out may take: a close that waits on the network (an
#: unsubscribe's consumer deletion while a cluster elects a leader, a flush to a dead
#: server) must not keep a stopping worker alive; what it held is released by the server.
_CLOSE_TIMEOUT = 5.0


async def _quietly(close: Callable[[], Awaitable[object]]) -> None:
    """Close something on the way out, for at most :data:`_CLOSE_TIMEOUT` seconds; a failure
    to close must not hide why we are closing."""
    try:
        async with asyncio.timeout(_CLOSE_TIMEOUT):
            await close()
    except TimeoutError:
        log.warning("closing %r took more than %.0f s: left behind", close, _CLOSE_TIMEOUT)
    except Exception as exc:
        log.debug("closing %r failed: %r", close, exc)


def _where(task: asyncio.Task[Any]) -> str:
    """A task's name and the line it waits at, for a log line."""
    frames = task.get_stack(limit=1)
    if not frames:
        return task.get_name()
    code = frames[-1].f_code
    return f"{task.get_name()} at {code.co_filename}:{frames[-1].f_lineno} ({code.co_name})"


def _server_of(nc: NATS) -> str:
    """The server a connection is connected to (``host:port``), for a log line."""
    url = nc.connected_url
    return f"{url.hostname}:{url.port}" if url is not None else "?"


def _wakes(*wakes: Callable[[], None] | None) -> Callable[[], None] | None:
    """One callback calling each of ``wakes`` (None: there is none)."""
    todo = [w for w in wakes if w is not None]
    if len(todo) <= 1:
        return todo[0] if todo else None

    def wake() -> None:
        for w in todo:
            w()

    return wake


def _log_crash(host: asyncio.Task[None]) -> None:
    if not host.cancelled() and (exc := host.exception()) is not None:
        log.error("worker stopped by an error", exc_info=exc)


async def run_worker(settings: Settings, *, ready: asyncio.Event | None = None,
                     stop: asyncio.Event | None = None) -> None:
    """Run a worker until ``stop`` is set (forever without one).

    ``ready`` is set once every component is up.
    """
    async with Worker(settings):
        if ready is not None:
            ready.set()
        await (stop.wait() if stop is not None else asyncio.Event().wait())
