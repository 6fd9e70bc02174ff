"""The stack in containers, through testcontainers (blackboard.testing.ContainerStack) with the
images of ``Settings.containers`` (CI: the locally built ones, ``scripts/containers``): the
checks of tests/testing/_scenarios.py (tests/testing/test_stacks.py runs them embedded).

No Docker engine, or an image missing: the tests fail with the reason (never a skip).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from blackboard.settings import Settings
from blackboard.testing import LABEL, ContainerStack, sweep_containers
from blackboard.testing.containers import docker_client
from tests.testing import _scenarios as scenarios

pytestmark = [pytest.mark.containers, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def stack() -> Iterator[ContainerStack]:
    """One NATS node, PostgreSQL + pgvector and the worker, in containers."""
    sweep_containers()
    with ContainerStack(settings=Settings()) as started:
        yield started


@pytest.mark.asyncio
async def test_sdk_writes_and_reads(stack: ContainerStack) -> None:
    await scenarios.sdk_writes_and_reads(stack)


@pytest.mark.asyncio
async def test_worker_persists_and_search_answers(stack: ContainerStack) -> None:
    await scenarios.worker_persists_and_search_answers(stack)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_killed_nats_node_loses_nothing_acknowledged() -> None:
    with ContainerStack(settings=Settings(), nats_nodes=3, worker=False) as cluster:
        await scenarios.killed_nats_node_loses_nothing(cluster)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_killed_worker_container_restarts_with_rows_exactly_once() -> None:
    with ContainerStack(settings=scenarios.quick_redelivery(Settings())) as stack:
        await scenarios.killed_worker_rows_exactly_once(stack)


def test_stacks_leave_no_containers(stack: ContainerStack) -> None:
    """The private stacks above removed their containers and networks; only the module's
    stack (still up) has some. (Other runs on this engine, at the same time, have theirs.)"""
    client = docker_client()

    def ours(labels: dict[str, str]) -> bool:
        return labels.get(f"{LABEL}.pid") == str(os.getpid()) and labels.get(f"{LABEL}.stack") != stack.stack_id

    left = [c.name for c in client.containers.list(all=True, filters={"label": LABEL}) if ours(c.labels)]
    networks = [n.name for n in client.networks.list(filters={"label": LABEL})
                if ours(n.attrs.get("Labels") or {})]
    assert (left, networks) == ([], [])


def test_sweep_removes_only_what_dead_runs_left() -> None:
    """Containers labelled by a process of this host that is gone are removed; those of a live
    process (this one) are kept."""
    client = docker_client()
    dead = subprocess.Popen(["true"])
    dead.wait()
    image = Settings().containers.nats_image
    made = {}
    for who, pid in (("dead", dead.pid), ("alive", 0)):
        labels = {LABEL: "true", f"{LABEL}.stack": f"sweep-{uuid.uuid4().hex[:8]}",
                  f"{LABEL}.host": socket.gethostname(), f"{LABEL}.pid": str(pid or os.getpid())}
        made[who] = client.containers.create(image, labels=labels, name=f"bb-sweep-{who}-{uuid.uuid4().hex[:6]}")
    try:
        sweep_containers()
        ids = {c.id for c in client.containers.list(all=True, filters={"label": LABEL})}
        assert made["dead"].id not in ids
        assert made["alive"].id in ids
    finally:
        for container in made.values():
            with contextlib.suppress(Exception):
                container.remove(force=True)


@pytest.mark.asyncio
async def test_a_host_port_taken_meanwhile_is_picked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A published port that something took between its pick and the container's start (another
    run's containers) is picked again instead of failing the stack."""
    import blackboard.testing.containers as containers_module
    from blackboard.devstack import free_port

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        picks = iter([taken.getsockname()[1]])
        monkeypatch.setattr(containers_module, "free_port", lambda: next(picks, None) or free_port())
        with ContainerStack(settings=Settings(), worker=False) as stack:
            assert stack.nats_urls[0] != f"tls://127.0.0.1:{taken.getsockname()[1]}"
            await scenarios.sdk_writes_and_reads(stack)
