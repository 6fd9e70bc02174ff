"""``blackboard status``: the deployment at a glance.

As the operator (the default: ``nats.creds_file``, else the operator's credential, as
``blackboard setup`` finds it; no credential on an open bus) it reads everything: the server
connected to and the cluster's other servers, the account's JetStream usage, every stream and
its durable consumers (the workers' consumers' pending messages are the worker lag), the search
services that answer (one per worker process), and one worker's status (its consumers' lag
and dead letters since it started, the embedding backlog). With ``--db`` it also counts the
dead letters PostgreSQL holds, by stream and by reason.

As an agent (``--as NAME``) it shows what that agent may see: the server, the account's
usage, its own inbox consumer and the worker's status; an agent may not read the streams'
and other consumers' state (the server refuses it).

A part that cannot be read says why (``"error"``) and the rest is still shown; the command
fails only when it cannot connect.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import api
from nats.micro.service import ServiceVerb, control_subject

from agents_sdk import Agent
from agents_sdk.search import search_request
from blackboard.apps.people.common import acting_agent, load_settings
from blackboard.apps.people.output import dumps, instant, printable, table
from blackboard.client.connection import check_nats_url, connect_nats
from blackboard.protocol.errors import BlackboardError, InvalidPayloadError
from blackboard.protocol.subjects import MESSAGE_STREAM, SEARCH_SERVICE, Subjects
from blackboard.security.credentials import OPERATOR_PRINCIPAL, find_system_credentials
from blackboard.settings import Settings

__all__ = ["DEAD_LETTERS_BY_REASON", "DEAD_LETTERS_BY_STREAM", "EMBED_QUEUE", "collect", "database_report", "render", "status"]

#: Dead letters by stream: how many, the newest.
DEAD_LETTERS_BY_STREAM = "SELECT stream, count(*) AS count, max(at) AS newest FROM bb_dead_letters GROUP BY stream ORDER BY stream"
#: The most frequent reasons (cut to 120 characters).
DEAD_LETTERS_BY_REASON = """
SELECT left(reason, 120) AS reason, count(*) AS count FROM bb_dead_letters GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 10
"""
#: Items waiting for an embedding.
EMBED_QUEUE = "SELECT count(*) AS count FROM bb_embed_queue"

_FAILURES: tuple[type[BaseException], ...] = (BlackboardError, nats.errors.Error, TimeoutError, OSError)


async def _part(fn: Callable[[], Awaitable[Any]]) -> Any:
    """The value of one part of the report, or ``{"error": why}`` when it cannot be read."""
    try:
        return await fn()
    except _FAILURES as exc:
        return {"error": " ".join(str(exc).split()) or type(exc).__name__}


@contextlib.asynccontextmanager
async def _connection(args: argparse.Namespace, settings: Settings) -> AsyncIterator[tuple[NATS, str, str]]:
    """The connection status reads with, the principal it runs as, and the view (operator/agent)."""
    if args.as_agent:
        async with Agent.connect(acting_agent(args, settings), settings=settings, ensure=False) as agent:
            yield agent.nc, agent.id, "agent"
        return
    check_nats_url(settings.nats.url)
    found = find_system_credentials(OPERATOR_PRINCIPAL, settings, process="blackboard status")
    nc = await connect_nats(settings, name="blackboard-status", credentials=found)
    try:
        yield nc, found.principal if found is not None else OPERATOR_PRINCIPAL, "operator"
    finally:
        with contextlib.suppress(*_FAILURES):
            await nc.close()


def _server(nc: NATS) -> dict[str, Any]:
    url = nc.connected_url
    version = nc.connected_server_version
    known = sorted({u.geturl() for u in [*(s.uri for s in nc.server_pool), *nc.discovered_servers]})
    return {"url": url.geturl() if url is not None else None,
            "version": f"{version.major}.{version.minor}.{version.patch}" if version else None,
            "max_payload": nc.max_payload, "servers": known}


async def _account(nc: NATS, timeout: float) -> dict[str, Any]:
    info = await nc.jetstream(timeout=timeout).account_info()
    return {"memory": info.memory, "storage": info.storage, "streams": info.streams, "consumers": info.consumers}


async def _streams(nc: NATS, timeout: float) -> list[dict[str, Any]]:
    js = nc.jetstream(timeout=timeout)
    out = []
    for info in sorted(await js.streams_info(), key=lambda i: i.config.name or ""):
        state, cluster = info.state, info.cluster
        out.append({"name": info.config.name, "messages": state.messages, "bytes": state.bytes,
                    "first_seq": state.first_seq, "last_seq": state.last_seq, "consumers": state.consumer_count,
                    "replicas": info.config.num_replicas or 1,
                    "leader": cluster.leader if cluster is not None else None})
    return out


def _consumer(info: api.ConsumerInfo) -> dict[str, Any]:
    return {"stream": info.stream_name, "name": info.name, "pending": info.num_pending or 0,
            "ack_pending": info.num_ack_pending or 0, "redelivered": info.num_redelivered or 0,
            "waiting": info.num_waiting or 0,
            "ack_floor": info.ack_floor.stream_seq if info.ack_floor is not None else 0}


async def _consumers(nc: NATS, timeout: float, streams: list[dict[str, Any]]) -> dict[str, Any]:
    """The durable consumers of every stream (the ephemeral ones, watches and views, counted)."""
    js = nc.jetstream(timeout=timeout)
    durable: list[dict[str, Any]] = []
    ephemeral = 0
    for stream in streams:
        if not stream["consumers"]:
            continue
        for info in await js.consumers_info(stream["name"]):
            if info.config.durable_name:
                durable.append(_consumer(info))
            else:
                ephemeral += 1
    durable.sort(key=lambda c: (c["stream"], c["name"]))
    return {"durable": durable, "ephemeral": ephemeral}


async def _services(nc: NATS, wait: float) -> list[dict[str, Any]]:
    """The search services (one per worker process) that answer ``$SRV.STATS`` within ``wait`` s."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    found = []
    try:
        await nc.publish(control_subject(ServiceVerb.STATS, SEARCH_SERVICE), b"", reply=inbox)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while (left := deadline - loop.time()) > 0:
            try:
                msg = await sub.next_msg(timeout=left)
            except (nats.errors.TimeoutError, TimeoutError):
                break
            with contextlib.suppress(ValueError):
                stats = json.loads(msg.data)
                endpoints = stats.get("endpoints") or []
                found.append({"id": stats.get("id"), "version": stats.get("version"), "started": stats.get("started"),
                              "requests": sum(int(e.get("num_requests", 0)) for e in endpoints),
                              "errors": sum(int(e.get("num_errors", 0)) for e in endpoints)})
    finally:
        with contextlib.suppress(*_FAILURES):
            await sub.unsubscribe()
    return sorted(found, key=lambda s: str(s["id"]))


async def _inbox(nc: NATS, agent: str, timeout: float) -> dict[str, Any]:
    """The agent's inbox consumer (``exists``: false until its first read makes it)."""
    name = Subjects.inbox_consumer(agent)
    try:
        info = await nc.jetstream(timeout=timeout).consumer_info(MESSAGE_STREAM, name)
    except nats.js.errors.NotFoundError:
        return {"stream": MESSAGE_STREAM, "name": name, "exists": False}
    return {**_consumer(info), "exists": True}


async def database_report(settings: Settings, *, name: str = "blackboard-status") -> dict[str, Any]:
    """Dead letters (in all, by stream and by reason) and the embedding queue, from PostgreSQL
    (``blackboard status --db``, the inspector's ``--db``)."""
    from psycopg.rows import dict_row

    from blackboard.db import connect

    conn = await connect(settings.postgres, name=name)
    try:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(DEAD_LETTERS_BY_STREAM)
            by_stream = list(await cur.fetchall())
            await cur.execute(DEAD_LETTERS_BY_REASON)
            by_reason = list(await cur.fetchall())
            await cur.execute(EMBED_QUEUE)
            queue = await cur.fetchone()
    finally:
        await conn.close()
    return {"dead_letters": sum(int(r["count"]) for r in by_stream), "dead_letters_by_stream": by_stream,
            "dead_letter_reasons": by_reason, "embedding_queue": int(queue["count"]) if queue else 0}


async def collect(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    """The report (see the module's docstring) as JSON-ready data.

    Raises:
        AuthenticationError: no credential for the operator (or the agent), or refused.
        NotConnectedError: no server answered.
        ConfigurationError: a malformed URL.
    """
    timeout = settings.nats.request_timeout
    async with _connection(args, settings) as (nc, principal, view):
        report: dict[str, Any] = {"identity": {"principal": principal, "view": view}, "server": _server(nc),
                                  "jetstream": await _part(lambda: _account(nc, timeout))}
        if view == "operator":
            streams = await _part(lambda: _streams(nc, timeout))
            report["streams"] = streams
            report["consumers"] = (await _part(lambda: _consumers(nc, timeout, streams))
                                   if isinstance(streams, list) else {"error": "the streams could not be read"})
            report["search_services"] = await _part(lambda: _services(nc, args.wait))
        else:
            report["inbox"] = await _part(lambda: _inbox(nc, principal, timeout))
        worker = await _part(lambda: search_request(nc, "status", None, None, principal=principal,
                                                    timeout=settings.search.timeout))
        report["worker"] = worker
    report["lag"] = _lag(report, settings.worker.group)
    consumers = worker.get("consumers") if isinstance(worker, dict) else None
    report["dead_letters"] = (sum(int(c.get("dead_letters", 0)) for c in consumers)
                              if isinstance(consumers, list) else None)
    embedding = worker.get("embedding") if isinstance(worker, dict) else None
    report["embedding_backlog"] = embedding.get("backlog") if isinstance(embedding, dict) else None
    if args.db:
        report["database"] = await _part(lambda: database_report(settings))
    return report


def _lag(report: dict[str, Any], group: str) -> int | None:
    """Messages the workers have still to write: the worker's report, else (the operator) the
    pending and unacknowledged messages of the worker group's consumers (``<group>-<handler>``,
    :meth:`Subjects.worker_consumer`)."""
    worker = report.get("worker")
    if isinstance(worker, dict) and isinstance(worker.get("lag"), int):
        return int(worker["lag"])
    consumers = report.get("consumers")
    if isinstance(consumers, dict) and "durable" in consumers:
        return sum(int(c["pending"]) + int(c["ack_pending"]) for c in consumers["durable"]
                   if str(c["name"]).startswith(f"{group}-"))
    return None


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _error(part: Any) -> str | None:
    return str(part["error"]) if isinstance(part, dict) and "error" in part else None


def render(report: dict[str, Any]) -> str:
    """The report for people: one block per part."""
    ident, server = report["identity"], report["server"]
    lines = [f"as        {ident['principal']} ({ident['view']} view)",
             f"server    {server['url']}  (nats-server {server['version']}, max payload {_size(server['max_payload'])})"]
    others = [s for s in server["servers"] if s != server["url"]]
    if others:
        lines.append(f"servers   {', '.join(others)}")
    js = report["jetstream"]
    lines.append(f"jetstream error: {_error(js)}" if _error(js) else
                 f"jetstream {js['streams']} streams, {js['consumers']} consumers, storage {_size(js['storage'])}, "
                 f"memory {_size(js['memory'])}")
    lines.append(f"lag       {report['lag'] if report['lag'] is not None else 'unknown'} messages not yet written "
                 f"by the workers")
    backlog = report["embedding_backlog"]
    lines.append(f"embedding {backlog if backlog is not None else 'unknown'} items waiting for an embedding")
    dead = report["dead_letters"]
    lines.append(f"dead      {dead if dead is not None else 'unknown'} dead letters (since the answering worker "
                 "started; --db: all)")
    if "streams" in report:
        streams = report["streams"]
        lines += ["", "STREAMS"]
        lines.append(f"  error: {_error(streams)}" if _error(streams) else table(
            ["NAME", "MESSAGES", "BYTES", "FIRST", "LAST", "CONSUMERS", "REPLICAS", "LEADER"],
            [[s["name"], s["messages"], _size(s["bytes"]), s["first_seq"], s["last_seq"], s["consumers"],
              s["replicas"], s["leader"] or "-"] for s in streams],
            right=("MESSAGES", "BYTES", "FIRST", "LAST", "CONSUMERS", "REPLICAS")))
        consumers = report["consumers"]
        lines += ["", "CONSUMERS (durable)"]
        if _error(consumers):
            lines.append(f"  error: {_error(consumers)}")
        else:
            lines.append(table(["STREAM", "NAME", "PENDING", "ACK PENDING", "REDELIVERED", "ACK FLOOR"],
                               [[c["stream"], c["name"], c["pending"], c["ack_pending"], c["redelivered"],
                                 c["ack_floor"]] for c in consumers["durable"]],
                               right=("PENDING", "ACK PENDING", "REDELIVERED", "ACK FLOOR")))
            lines.append(f"(and {consumers['ephemeral']} ephemeral: watches, views, listings)")
        services = report["search_services"]
        lines += ["", "SEARCH SERVICES (one per worker process)"]
        lines.append(f"  error: {_error(services)}" if _error(services) else table(
            ["ID", "VERSION", "STARTED", "REQUESTS", "ERRORS"],
            [[s["id"], s["version"], s["started"], s["requests"], s["errors"]] for s in services],
            right=("REQUESTS", "ERRORS")) if services else "  none answered: is a worker running?")
    if "inbox" in report:
        inbox = report["inbox"]
        lines += ["", "INBOX"]
        if _error(inbox):
            lines.append(f"  error: {_error(inbox)}")
        elif not inbox["exists"]:
            lines.append(f"  {inbox['name']}: none yet (the agent's first read of its inbox makes it)")
        else:
            lines.append(f"  {inbox['name']}: {inbox['pending']} waiting, {inbox['ack_pending']} delivered and "
                         "not acknowledged")
    lines += ["", "WORKER"]
    worker = report["worker"]
    if _error(worker):
        lines.append(f"  error: {_error(worker)}")
    else:
        lines.append(f"  {worker.get('worker')}  up {float(worker.get('uptime', 0)):.0f} s")
        lines.append(table(["STREAM", "CONSUMER", "PENDING", "ACK PENDING", "WRITTEN", "DEAD LETTERS", "LAST ERROR"],
                           [[c.get("stream"), c.get("consumer"), c.get("pending"), c.get("ack_pending"), c.get("written"),
                             c.get("dead_letters"), c.get("last_error") or "-"] for c in worker.get("consumers", [])],
                           right=("PENDING", "ACK PENDING", "WRITTEN", "DEAD LETTERS")))
        emb = worker.get("embedding")
        if isinstance(emb, dict):
            lines.append(f"  embedding: model {emb.get('model')} ({emb.get('dimensions')} dims), backlog "
                         f"{emb.get('backlog')}, embedded {emb.get('embedded')}, failures {emb.get('failures')}"
                         + (f", last error {emb['last_error']}" if emb.get("last_error") else ""))
    if "database" in report:
        db = report["database"]
        lines += ["", "DATABASE"]
        if _error(db):
            lines.append(f"  error: {_error(db)}")
        else:
            lines.append(f"  {db['dead_letters']} dead letters; {db['embedding_queue']} items in the embedding queue")
            if db["dead_letters_by_stream"]:
                lines.append(table(["STREAM", "DEAD LETTERS", "NEWEST (UTC)"],
                                   [[r["stream"], r["count"], instant(r["newest"])] for r in db["dead_letters_by_stream"]],
                                   right=("DEAD LETTERS",)))
                lines.append(table(["COUNT", "REASON"], [[r["count"], r["reason"]] for r in db["dead_letter_reasons"]],
                                   right=("COUNT",)))
    return "\n".join(printable(line) for line in lines)


async def status(args: argparse.Namespace) -> int:
    """Print the report (``--json``: one JSON document).

    Raises:
        AuthenticationError, NotConnectedError, ConfigurationError: see :func:`collect`.
    """
    if args.wait < 0:
        raise InvalidPayloadError(f"--wait must be 0 or more seconds, not {args.wait:g}")
    settings = load_settings(args)
    report = await collect(args, settings)
    print(dumps(report, indent=2) if args.json else render(report), flush=True)
    return 0
