"""The inspector's ASGI app and its server: :class:`Inspector` (the connected identity's
reads), :func:`create_app` (the Starlette app: the JSON API, the event streams and the page),
:func:`running_inspector` (served by uvicorn on a socket, for the CLI and the tests).

Read-only: every route is a GET but the search (a POST that only reads). It binds to 127.0.0.1
unless told otherwise, and answers only requests whose ``Host`` names the address it serves
(DNS-rebinding protection: a web page elsewhere cannot read it through a name of its own).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import nats.errors
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from agents_sdk import Agent
from blackboard.apps._serving import QuietServer, Started, listen
from blackboard.apps.inspect.access import BoardAccess
from blackboard.apps.inspect.api import routes
from blackboard.apps.inspect.events import Feeds
from blackboard.protocol.entries import Entry
from blackboard.protocol.errors import BlackboardError, ConfigurationError
from blackboard.settings import Settings

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "WARM_BOARDS",
    "AsOf",
    "Inspector",
    "InspectorServer",
    "create_app",
    "running_inspector",
    "static_dir",
]

log = logging.getLogger("blackboard.apps.inspect")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8780
#: Readable boards whose live state is opened at start (in name order).
WARM_BOARDS = 8

_FAILURES: tuple[type[BaseException], ...] = (BlackboardError, nats.errors.Error, TimeoutError, OSError)


def static_dir() -> Path:
    """Where the page's files are (``blackboard/apps/inspect/static``, shipped as package data)."""
    return Path(str(resources.files("blackboard.apps.inspect").joinpath("static")))


@dataclass(frozen=True)
class AsOf:
    """A board's live entries as of a revision: their keys in (section, key) order, the entry of
    a key, and the last revision applied."""

    order: list[tuple[str, str]]
    get: Callable[[str, str], Entry | None]
    revision: int


class Inspector:
    """What the inspector reads, through one connected agent: the boards it may read
    (:attr:`access`), their live feeds (:attr:`feeds`), board states as of a revision, the
    deployment's state.

    Args:
        agent: the connected identity; it is not closed here.
        db: also read the dead letters' reasons from PostgreSQL (``settings.postgres``: an
            operator's view; an agent's credential does not reach the database).
    """

    def __init__(self, agent: Agent, *, db: bool = False) -> None:
        self.agent = agent
        self.db = db
        self.access = BoardAccess(agent)
        self.feeds = Feeds(agent)
        self._asof: collections.OrderedDict[tuple[str, int | None, datetime | None], AsOf] = \
            collections.OrderedDict()

    async def warm(self, limit: int = WARM_BOARDS) -> list[str]:
        """Open the live feed of the first ``limit`` readable boards, so that the page
        opens a board at once: loading a board's snapshot verifies every entry's signature
        (about 1.7 s for 10,000 entries), paid here rather than on the first request. A board
        that cannot be opened is skipped (its request will say why). Returns the boards opened.
        """
        opened = []
        try:
            boards = await self.access.boards()
        except _FAILURES as exc:
            log.warning("inspector: cannot list the boards to warm up: %s", exc)
            return []
        for board in boards[:min(limit, self.feeds.limit)]:
            try:
                await self.feeds.feed(board)
            except _FAILURES as exc:
                log.info("inspector: board %r not opened ahead: %s", board, exc)
            else:
                opened.append(board)
        return opened

    async def aclose(self) -> None:
        """Stop every live feed (the agent stays connected)."""
        await self.feeds.aclose()

    async def board_as_of(self, board: str, *, revision: int | None = None,
                          at: datetime | None = None) -> AsOf:
        """The live entries of ``board`` as of ``revision`` (or the instant ``at``, on the
        server's clock), replayed from the history JetStream keeps (``board.history``
        revisions per key). A revision at or past an open board's live state is that state (no
        replay); the last :data:`~blackboard.apps.inspect.api.ASOF_CACHE` replays are kept.

        Raises:
            NotConnectedError, PermissionDeniedError: as a watch raises.
        """
        from blackboard.apps.inspect.api import ASOF_CACHE

        if revision is not None:
            feed = self.feeds.opened(board)
            if feed is not None and revision >= feed.view.revision:  # the live state: no replay
                return AsOf(feed.ordered(), feed.view.get, feed.view.revision)
        cache_key = (board, revision, at)
        hit = self._asof.get(cache_key)
        if hit is not None:
            self._asof.move_to_end(cache_key)
            return hit
        state: dict[tuple[str, str], Entry] = {}
        reached = 0
        async with self.agent.board(board).watch(start="all", hidden="remove") as watch:
            if not watch.caught_up.is_set():
                async for change in watch:
                    entry = change.entry
                    if revision is not None and entry.revision > revision:
                        break
                    if at is not None and entry.stored_at is not None and entry.stored_at > at:
                        break
                    if entry.revision > reached or not entry.deleted:
                        k = (entry.section, entry.key)
                        if entry.deleted:
                            state.pop(k, None)
                        else:
                            state[k] = entry
                        reached = max(reached, entry.revision)
                    if watch.caught_up.is_set():
                        break
        result = AsOf(sorted(state), lambda s, k: state.get((s, k)), reached)
        if (revision is not None and revision <= reached) or (at is not None and reached):
            self._asof[cache_key] = result
            while len(self._asof) > ASOF_CACHE:
                self._asof.popitem(last=False)
        return result

    async def system(self) -> dict[str, Any]:
        """The deployment as this identity may see it: the servers, JetStream usage, the streams
        and durable consumers (an operator's view; an agent is refused them, said per part),
        the worker's lag, embedding backlog and dead letters."""
        nc = self.agent.nc
        url = nc.connected_url
        version = nc.connected_server_version
        known = sorted({u.geturl() for u in [*(s.uri for s in nc.server_pool), *nc.discovered_servers]})
        out: dict[str, Any] = {
            "agent": self.agent.id,
            "servers": {"connected": url.geturl() if url is not None else None,
                        "version": f"{version.major}.{version.minor}.{version.patch}" if version else None,
                        "max_payload": nc.max_payload, "known": known},
        }
        timeout = self.agent.settings.nats.request_timeout
        js = nc.jetstream(timeout=timeout)

        async def account() -> dict[str, Any]:
            info = await js.account_info()
            return {"memory": info.memory, "storage": info.storage, "streams": info.streams,
                    "consumers": info.consumers}

        async def streams() -> list[dict[str, Any]]:
            found = []
            for info in sorted(await js.streams_info(), key=lambda i: i.config.name or ""):
                state = info.state
                found.append({"name": info.config.name, "messages": state.messages, "bytes": state.bytes,
                              "first_seq": state.first_seq, "last_seq": state.last_seq,
                              "consumers": state.consumer_count, "replicas": info.config.num_replicas or 1})
            return found

        out["jetstream"] = await _part(account)
        out["streams"] = await _part(streams)
        if isinstance(out["streams"], list):
            listed: list[dict[str, Any]] = out["streams"]

            async def consumers() -> list[dict[str, Any]]:
                found = []
                for stream in listed:
                    if not stream["consumers"]:
                        continue
                    for info in await js.consumers_info(stream["name"]):
                        if info.config.durable_name:
                            found.append({"stream": info.stream_name, "name": info.name,
                                          "pending": info.num_pending or 0, "ack_pending": info.num_ack_pending or 0,
                                          "redelivered": info.num_redelivered or 0})
                return sorted(found, key=lambda c: (c["stream"], c["name"]))

            out["consumers"] = await _part(consumers)
        else:
            out["consumers"] = {"error": "the streams could not be read"}
        worker = await _part(self.agent.search.status)
        out["worker"] = worker
        w = worker if isinstance(worker, dict) and "error" not in worker else {}
        out["worker_lag"] = w.get("lag")
        embedding = w.get("embedding")
        out["embedding_backlog"] = embedding.get("backlog") if isinstance(embedding, dict) else None
        wc = w.get("consumers")
        out["dead_letters"] = [{"stream": c.get("stream"), "consumer": c.get("consumer"),
                                "count": c.get("dead_letters", 0), "reason": c.get("last_error")}
                               for c in wc if c.get("dead_letters")] if isinstance(wc, list) else []
        if self.db:
            out["database"] = await _part(self._database)
        return out

    async def _database(self) -> dict[str, Any]:
        from blackboard.apps.people.status import database_report

        report = await database_report(self.agent.settings, name="blackboard-inspect")
        report.pop("dead_letters", None)  # the system panel's dead_letters are the consumers'
        return report


async def _part(fn: Any) -> Any:
    """A part of the system report, or ``{"error": why}`` when it cannot be read."""
    try:
        return await fn()
    except _FAILURES as exc:
        return {"error": " ".join(str(exc).split()) or type(exc).__name__, "type": type(exc).__name__}


def _allowed_hosts(host: str, extra: Sequence[str]) -> list[str]:
    """The ``Host`` names answered: the loopback names for a loopback address, else the address
    itself; and ``extra``. Every address (0.0.0.0, ::) without ``extra``: any name (told as a
    warning by :func:`running_inspector`)."""
    names: list[str] = []
    if is_loopback(host):
        names += ["127.0.0.1", "localhost", "::1", "[::1]"]
    elif host in ("0.0.0.0", "::", ""):
        names += [] if extra else ["*"]
    else:
        names.append(host)
    names += [n for n in extra if n not in names]
    return names


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def create_app(inspector: Inspector, *, host: str = DEFAULT_HOST, allowed_hosts: Sequence[str] = ()) -> Starlette:
    """The inspector's Starlette app: the API (:func:`blackboard.apps.inspect.api.routes`), the
    page (``/``) and its files (``/static``), answering only ``Host`` names of ``host`` (its
    loopback names for a loopback address) and ``allowed_hosts``."""
    static = static_dir()

    async def index(request: Request) -> Response:
        page = static / "index.html"
        if not page.is_file():
            return PlainTextResponse("the inspector's page is not installed (blackboard/apps/inspect/static)",
                                     status_code=503)
        return FileResponse(page, headers={"Cache-Control": "no-cache"})

    async def not_found(request: Request) -> Response:
        from blackboard.apps.inspect.api import JSONResponse

        return JSONResponse({"error": f"no route {request.url.path}", "type": "NotFoundError"}, status_code=404)

    app_routes: list[Route | Mount] = [Route("/", index), *routes(inspector),
                                       Route("/api/{rest:path}", not_found, methods=["GET", "POST"])]
    if static.is_dir():
        app_routes.append(Mount("/static", StaticFiles(directory=static), name="static"))
    return Starlette(routes=app_routes, middleware=[
        Middleware(TrustedHostMiddleware, allowed_hosts=_allowed_hosts(host, allowed_hosts))])


@dataclass(frozen=True)
class InspectorServer:
    """A running inspector: where a browser reaches it, and its :class:`Inspector`."""

    host: str
    port: int
    inspector: Inspector

    @property
    def url(self) -> str:
        """The page's address (``http://127.0.0.1:8780/``)."""
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"http://{host}:{self.port}/"


@contextlib.asynccontextmanager
async def running_inspector(settings: Settings, agent_id: str, *, credentials: Path | None = None,
                            host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                            allowed_hosts: Sequence[str] = (), db: bool = False,
                            warm: bool = True) -> AsyncIterator[InspectorServer]:
    """The inspector connected as ``agent_id`` (with ``credentials``, else its credential found
    as ``Agent.connect`` finds it), listening in the body of the ``async with`` (``port=0``: a
    free port, see :attr:`InspectorServer.port`); stopped and disconnected after it. With
    ``warm``, the readable boards' feeds are opened in the background from the start
    (:meth:`Inspector.warm`).

    Raises:
        ConfigurationError: the address cannot be listened on.
        AuthenticationError, NotConnectedError: as ``Agent.connect`` raises.
    """
    sock = listen(host, port, options="--host, --port")
    bound = int(sock.getsockname()[1])
    if not is_loopback(host):
        log.warning("SERVING THE INSPECTOR ON %s:%s (not loopback): whoever reaches this port reads what "
                    "%r may read", host, bound, agent_id)
    try:
        async with Agent.connect(agent_id, settings=settings, ensure=False, credentials=credentials) as agent:
            inspector = Inspector(agent, db=db)
            try:
                app = create_app(inspector, host=host, allowed_hosts=allowed_hosts)
                started = Started(app)
                config = uvicorn.Config(started, log_level="warning", access_log=False, lifespan="on",
                                        timeout_graceful_shutdown=1)
                server = QuietServer(config)
                task = asyncio.create_task(server.serve(sockets=[sock]))
                waiting = asyncio.create_task(started.done.wait())
                await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
                if task.done():
                    task.result()
                    raise ConfigurationError("the inspector's HTTP server did not start")
                warming = asyncio.create_task(inspector.warm()) if warm else None
                try:
                    yield InspectorServer(host, bound, inspector)
                finally:
                    if warming is not None:
                        warming.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await warming
                    server.should_exit = True
                    # Event streams never end on their own: closing the feeds ends them.
                    await inspector.aclose()
                    with contextlib.suppress(asyncio.CancelledError, SystemExit):
                        await task
            finally:
                await inspector.aclose()
    finally:
        sock.close()
