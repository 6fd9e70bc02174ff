"""A stack of the fuzz suite's own: a private nats-server, a fresh database on the shared
PostgreSQL, one worker (ingest, embedding with the instant hash model, search) and
one agent, shared by every fuzz test (each example uses a board and agent of its own).

The worker's ERROR records (a component that "crashed; restarting") are collected
in ``fuzz_crashes``: no hostile message may crash a consumer.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from agents_sdk import Agent
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.devstack import EmbeddedNats, EmbeddedPostgres
from blackboard.settings import Settings
from blackboard.worker import Worker
from tests._auth import TestAuth
from tests._worker_helpers import HashProvider, drop_db, fresh_db, running_worker
from tests.conftest import make_settings
from tests.fuzz.accounting import CrashLog


@dataclass
class FuzzStack:
    settings: Settings
    dsn: str
    worker: Worker
    nc: NATS
    agent: Agent
    crashes: CrashLog


@pytest.fixture(scope="session")
def fuzz_settings_(stack_dir: Path, postgres_server: EmbeddedPostgres, test_auth: TestAuth) -> Iterator[Settings]:
    # (test_auth: the servers and settings below use the session's authority, also when this module runs alone)
    name = f"fuzz{uuid.uuid4().hex[:8]}"
    ns = EmbeddedNats(stack_dir / name, port=0)
    ns.start()
    dsn = fresh_db(postgres_server, name)
    try:
        yield make_settings(ns.url, dsn)
    finally:
        ns.stop()
        drop_db(postgres_server, name)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def fuzz(fuzz_settings_: Settings) -> AsyncIterator[FuzzStack]:
    crashes = CrashLog()
    logger = logging.getLogger("blackboard")
    logger.addHandler(crashes)
    s = fuzz_settings_
    nc = await connect_nats(s.nats, name="fuzz-publisher")
    await ensure_streams(nc.jetstream(), s)
    try:
        async with running_worker(s, name="fuzz", batch_wait=0.02, lag_interval=60.0, provider=HashProvider(),
                                  query_provider=HashProvider(), serve_search=True) as worker, \
                Agent.connect("fuzzer", settings=s) as agent:
            yield FuzzStack(s, s.postgres.dsn.get_secret_value(), worker, nc, agent, crashes)
    finally:
        logger.removeHandler(crashes)
        await nc.close()
