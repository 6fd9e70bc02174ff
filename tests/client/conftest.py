"""Fixtures of the client tests."""

from __future__ import annotations

from typing import Any

import pytest

from blackboard.client.connection import Connection


@pytest.fixture
def no_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a connection is attempted (a refusal must come before that)."""

    async def refuse(self: Connection, **options: Any) -> None:
        raise AssertionError(f"connected to {options['servers']!r}")

    monkeypatch.setattr(Connection, "connect", refuse)
