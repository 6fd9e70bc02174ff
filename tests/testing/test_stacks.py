"""Embedded stacks (blackboard.testing.EmbeddedStack) pass the checks of _scenarios.py, as
containers do in tests/containers/test_stack.py: one suite, both modes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from blackboard.protocol.errors import DevStackError, PermissionDeniedError
from blackboard.settings import Settings
from blackboard.testing import EmbeddedStack, make_stack
from tests.testing import _scenarios as scenarios

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def stack() -> Iterator[EmbeddedStack]:
    with EmbeddedStack(settings=Settings()) as started:
        yield started


@pytest.mark.asyncio
async def test_sdk_writes_and_reads(stack: EmbeddedStack) -> None:
    await scenarios.sdk_writes_and_reads(stack)


@pytest.mark.asyncio
async def test_worker_persists_and_search_answers(stack: EmbeddedStack) -> None:
    await scenarios.worker_persists_and_search_answers(stack)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_killed_nats_node_loses_nothing_acknowledged() -> None:
    with EmbeddedStack(settings=Settings(), nats_nodes=3, worker=False) as cluster:
        await scenarios.killed_nats_node_loses_nothing(cluster)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_killed_worker_restarts_with_rows_exactly_once() -> None:
    with EmbeddedStack(settings=scenarios.quick_redelivery(Settings())) as stack:
        await scenarios.killed_worker_rows_exactly_once(stack)


def test_stop_removes_the_stack_directory() -> None:
    stack = make_stack("embedded", worker=False).start()
    directory = stack.directory
    assert (directory / "auth" / "policy.toml").exists()
    stack.stop()
    assert not directory.exists()


def test_a_failed_start_names_the_reason_and_stops_what_started() -> None:
    bad = 'version = 1\n[agents."*"]\n'  # no operator: the streams cannot be created
    stack = EmbeddedStack(policy=bad, worker=False)
    with pytest.raises(PermissionDeniedError, match="operator"):
        stack.start()
    assert all(not node.running for node in stack.nats_servers)
    assert not stack.postgres.running


def test_only_one_or_three_nats_nodes() -> None:
    with pytest.raises(ValueError, match="1 or 3"):
        EmbeddedStack(nats_nodes=2)


def test_settings_before_start_are_refused() -> None:
    with pytest.raises(DevStackError, match="not started"):
        EmbeddedStack().settings()
