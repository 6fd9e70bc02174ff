"""The worker's health endpoints (docs/observability.md, "Health"): ``/healthz`` while the
process runs, ``/readyz`` ready only when connected and caught up; a port already taken fails
the worker with a ConfigurationError naming the setting."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from blackboard.observability.health import ObservabilityServer, Readiness
from blackboard.protocol.errors import ConfigurationError
from blackboard.protocol.subjects import MEMORY_STREAM
from blackboard.settings import ObservabilitySettings, Settings
from blackboard.worker import Worker
from tests._worker_helpers import StartWorker, board_memories_handler, remember, worker_settings
from tests.observability._probe import (
    bus,
    gated_memories,
    get,
    metrics,
    sample,
    until,
    with_observability,
)

pytestmark = pytest.mark.asyncio


async def test_a_caught_up_worker_is_healthy_and_ready(pg_settings: Settings, start_worker: StartWorker,
                                                       unique: str) -> None:
    worker = await start_worker(pg_settings, name=f"w{unique}", embed=False, serve_search=False,
                                handlers=[board_memories_handler(pg_settings, unique)])
    assert worker.http is not None and worker.http.port > 0  # http_port 0: a free port
    health = await get(worker, "/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    ready = await get(worker, "/readyz")
    assert ready.status_code == 200, ready.text
    body = ready.json()
    assert body["ready"] is True
    checks = body["checks"]
    assert checks["nats"] is True and checks["postgres"] is True and checks["caught_up"] is True
    assert checks["lag"] == {MEMORY_STREAM: 0}
    assert sample(await metrics(worker), "blackboard_ready") == 1.0
    assert (await get(worker, "/nothing")).status_code == 404
    async with httpx.AsyncClient(base_url=worker.http.url) as client:
        assert (await client.post("/readyz")).status_code == 405
        head = await client.head("/healthz")
        assert head.status_code == 200 and head.content == b""


async def test_ready_only_when_caught_up(pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    gate = asyncio.Event()
    s = with_observability(pg_settings, ready_max_lag=2)
    worker = await start_worker(s, name=f"w{unique}", embed=False, serve_search=False, batch_size=1,
                                handlers=[gated_memories(s, unique, gate)])
    nc = await bus(s)
    try:
        assert (await get(worker, "/readyz")).status_code == 200
        for i in range(12):  # one batch of one is held by the gate, a couple more are fetched
            await remember(nc.jetstream(), unique, "alice", f"{unique}-{i}", f"memory {i}")

        async def behind() -> bool:
            return (await get(worker, "/readyz")).status_code == 503

        await until(behind, 20, "/readyz answering 503 while the worker is behind")
        body = (await get(worker, "/readyz")).json()
        assert body["ready"] is False and body["checks"]["caught_up"] is False
        assert body["checks"]["lag"][MEMORY_STREAM] > 2 and body["checks"]["ready_max_lag"] == 2
        assert body["checks"]["nats"] is True and body["checks"]["postgres"] is True
        samples = await metrics(worker)
        consumer = worker.loops[0].durable
        assert sample(samples, "blackboard_consumer_pending", stream=MEMORY_STREAM, consumer=consumer) > 2
        assert sample(samples, "blackboard_ready") == 0.0
        assert (await get(worker, "/healthz")).status_code == 200  # up, only not ready

        gate.set()

        async def ready() -> bool:
            return (await get(worker, "/readyz")).status_code == 200

        await until(ready, 30, "/readyz answering 200 once caught up")
    finally:
        gate.set()
        await nc.close()


async def test_not_ready_before_started_nor_when_a_check_fails() -> None:
    async def failing() -> Readiness:
        raise RuntimeError("PostgreSQL is gone")

    async with ObservabilityServer(ObservabilitySettings(http_port=0), readiness=failing) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            answer = await client.get("/readyz")
            assert answer.status_code == 503
            assert answer.json() == {"ready": False, "checks": {"error": "RuntimeError: PostgreSQL is gone"}}
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.get("/metrics")).status_code == 404  # no metrics given


async def test_a_port_already_taken_fails_the_worker_naming_the_setting(pg_settings: Settings, unique: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        s = worker_settings(with_observability(pg_settings, http_port=port), name=f"w{unique}", embed=False,
                            serve_search=False)
        with pytest.raises(ConfigurationError) as caught:
            async with Worker(s):
                pass
    message = str(caught.value)
    assert "observability.http_port" in message and f"127.0.0.1:{port} is already in use" in message


async def test_endpoints_off(pg_settings: Settings, start_worker: StartWorker, unique: str) -> None:
    s = with_observability(pg_settings, http_enabled=False)
    worker = await start_worker(s, name=f"w{unique}", embed=False, serve_search=False,
                                handlers=[board_memories_handler(s, unique)])
    assert worker.http is None and worker.metrics is None
    assert (await worker.readiness()).ready is False  # nothing to answer it: no probe
