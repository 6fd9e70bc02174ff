"""Fixtures of the client tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from blackboard.client.connection import Connection
from tests._auth import TestAuth
from tests._cluster import NatsCluster


@pytest.fixture
def no_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a connection is attempted (a refusal must come before that)."""

    async def refuse(self: Connection, **options: Any) -> None:
        raise AssertionError(f"connected to {options['servers']!r}")

    monkeypatch.setattr(Connection, "connect", refuse)


@pytest.fixture
def cluster(stack_dir: Path, test_auth: TestAuth) -> Iterator[NatsCluster]:
    """A 3-node JetStream cluster of this test's own, not started (``cluster.start()``), stopped after."""
    nodes = NatsCluster(stack_dir / f"cluster-{os.urandom(4).hex()}", test_auth)
    yield nodes
    nodes.stop()
