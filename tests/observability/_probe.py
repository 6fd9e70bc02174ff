"""Helpers of the observability tests: reading a worker's endpoints, a gated handler."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx
from nats.aio.client import Client as NATS
from prometheus_client.parser import text_string_to_metric_families

from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.settings import Settings
from blackboard.worker import Worker
from blackboard.worker.handlers import StreamHandler
from blackboard.worker.stream_handler import Conn
from tests._worker_helpers import board_memories_handler


async def bus(settings: Settings) -> NATS:
    """A connection as the worker identity, the streams made sure of."""
    nc = await connect_nats(settings.nats, name="test-observability")
    await ensure_streams(nc.jetstream(), settings)
    return nc


async def get(worker: Worker, path: str) -> httpx.Response:
    """GET ``path`` from the worker's metrics and health server."""
    assert worker.http is not None, "the worker serves no endpoints"
    async with httpx.AsyncClient(base_url=worker.http.url, timeout=10) as client:
        return await client.get(path)


async def metrics(worker: Worker) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``/metrics``: (name, labels) -> value."""
    response = await get(worker, "/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def sample(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """One sample's value (0 when it is not there yet: a counter never moved)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


async def until(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    """Poll ``check`` until it holds (AssertionError naming ``what`` after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        await asyncio.sleep(0.05)


def gated_memories(settings: Settings, board: str, gate: asyncio.Event) -> StreamHandler:
    """The memory handler of one board, whose writes wait for ``gate`` (the worker falls behind)."""
    base = board_memories_handler(settings, board)

    async def write(conn: Conn, rows: Sequence[Any]) -> None:
        await gate.wait()
        await base.write(conn, rows)

    return dataclasses.replace(base, write=write, concurrent_writes=False)


def with_observability(settings: Settings, **fields: Any) -> Settings:
    """``settings`` with these fields of its ``observability`` section replaced."""
    return settings.model_copy(update={"observability": settings.observability.model_copy(update=fields)})
