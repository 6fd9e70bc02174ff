"""The embedded servers' configuration (beyond starting and stopping, which every test relies on)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from blackboard.db import open_pool
from blackboard.devstack import EmbeddedPostgres, default_shared_buffers
from blackboard.settings import Settings


def test_default_shared_buffers_is_a_quarter_of_memory_within_bounds() -> None:
    value = default_shared_buffers()
    assert value.endswith("MB")
    mb = int(value[:-2])
    assert 128 <= mb <= 1024
    import os
    total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    assert mb == max(128, min(1024, total_mb // 4))


def test_embedded_postgres_runs_with_its_shared_buffers(postgres_server: EmbeddedPostgres) -> None:
    with psycopg.connect(postgres_server.dsn) as conn:
        row = conn.execute("SELECT setting::bigint * 8192 / 1048576 FROM pg_settings "
                           "WHERE name = 'shared_buffers'").fetchone()
    assert row is not None and f"{row[0]}MB" == postgres_server.shared_buffers == default_shared_buffers()


@pytest.mark.asyncio
@pytest.mark.parametrize("autocommit", [True, False])
async def test_pool_session_settings_hold_on_every_connection(pg_settings: Settings, autocommit: bool) -> None:
    async with open_pool(pg_settings.postgres, min_size=2, max_size=2, autocommit=autocommit,
                         session={"work_mem": "7MB", "application_name": "session-test"}) as pool:
        async with pool.connection() as a, pool.connection() as b:
            for conn in (a, b):
                if not autocommit:
                    await conn.rollback()  # the settings were committed, not left in a transaction
                row = await (await conn.execute("SELECT current_setting('work_mem'), "
                                                "current_setting('application_name')")).fetchone()
                assert row == ("7MB", "session-test")


def test_free_ports_are_below_the_kernels_range_for_connections_local_ports() -> None:
    """A server restarted on its port must not find it taken by a client connection's local port;
    servers started after their ports were all picked must not be given the same one."""
    import socket

    from blackboard.devstack import free_port

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    picked = [free_port() for _ in range(400)]  # 400 random picks of 10,000 ports almost surely repeat one
    ports = set(picked)
    assert all(1024 <= p < low for p in ports)
    assert len(ports) == len(picked)  # none given out twice, though none was bound in between
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free
