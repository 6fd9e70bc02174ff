"""Fixtures of the worker tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from nats.aio.client import Client as NATS

from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.settings import Settings


@pytest_asyncio.fixture
async def nc(pg_settings: Settings) -> AsyncIterator[NATS]:
    """A connection to the session's server as the worker identity, its streams made sure of."""
    conn = await connect_nats(pg_settings.nats, name="test-worker")
    await ensure_streams(conn.jetstream(), pg_settings)
    yield conn
    await conn.close()
