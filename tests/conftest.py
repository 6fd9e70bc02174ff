"""Real servers for the test suite: nats-server and PostgreSQL + pgvector,
started from their pip packages on free ports, once per session.

Tests isolate themselves by unique board names / subjects (``unique``). Tests
that kill or restart a server use the ``nats_factory`` / ``postgres_factory``
fixtures to get servers of their own. ``start_worker`` starts in-process workers that
run until the test ends (``tests._worker_helpers.running_worker`` is the same as an
``async with`` block, for tests that stop a worker part-way).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
import pytest_asyncio
from nats.js import api

from blackboard.devstack import EmbeddedNats, EmbeddedPostgres
from blackboard.protocol import codec
from blackboard.protocol.subjects import MEMORY_STREAM, Subjects
from blackboard.settings import (
    NatsSettings,
    ObservabilitySettings,
    PostgresSettings,
    SecuritySettings,
    Settings,
    WorkerSettings,
)
from tests._auth import SystemService, TestAuth, make_test_auth, operator_nats, setup_streams
from tests.fakes.openai_server import OpenAIFake

if TYPE_CHECKING:
    from blackboard.worker import Worker
    from tests._worker_helpers import StartWorker


@pytest.fixture(scope="session")
def stack_dir() -> Iterator[Path]:
    # Not under pytest's mode-700 tmp dir: the embedded PostgreSQL runs as an
    # unprivileged user (when the suite runs as root) that must reach it.
    path = Path(tempfile.mkdtemp(prefix="bb-tests-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


#: The session's identity authority (tests/_auth.py): made with the first server.
_AUTH: TestAuth | None = None


@pytest.fixture(scope="session")
def test_auth(stack_dir: Path) -> TestAuth:
    """The session's identity authority and TLS files: every test server runs with them."""
    global _AUTH
    if _AUTH is None:
        _AUTH = make_test_auth(stack_dir / "auth")
    return _AUTH


def auth_nats(data_dir: Path, auth: TestAuth, **options: Any) -> EmbeddedNats:
    """An EmbeddedNats with the session's authorization and TLS."""
    return EmbeddedNats(data_dir, auth_config=auth.config, tls=auth.tls, **options)


class _SetUpNats(EmbeddedNats):
    """A private server whose JetStream assets are created (as the operator) at each start."""

    auth: TestAuth

    def start(self, timeout: float = 20.0) -> None:
        fresh = not self.running
        super().start(timeout)
        if fresh:
            setup_streams(self.url, self.auth)


def _private_nats(data_dir: Path, *, auth: TestAuth, **options: Any) -> EmbeddedNats:
    server = _SetUpNats(data_dir, auth_config=auth.config, tls=auth.tls, **options)
    server.auth = auth
    return server


@pytest.fixture(scope="session")
def nats_server(stack_dir: Path, test_auth: TestAuth) -> Iterator[EmbeddedNats]:
    server = auth_nats(stack_dir / "nats", test_auth, port=0)
    server.start()
    setup_streams(server.url, test_auth)
    system = SystemService(make_settings(server.url))  # inbox administration, as a worker runs it
    system.start()
    yield server
    system.stop()
    server.stop()


@pytest.fixture(scope="session")
def open_nats_server(stack_dir: Path) -> Iterator[EmbeddedNats]:
    """A server WITHOUT authorization (the insecure open bus, ``blackboard dev
    --insecure-open-bus``), for the tests of that mode; its streams are made by a client."""
    server = EmbeddedNats(stack_dir / "nats-open", port=0)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def open_settings(open_nats_server: EmbeddedNats) -> Settings:
    """Settings of an agent on the open bus (no credential; agents commit votes themselves)."""
    return make_open_settings(open_nats_server.url)


def make_open_settings(nats_url: str) -> Settings:
    return Settings().model_copy(update={"nats": NatsSettings(url=nats_url, write_timeout=10.0,
                                                              insecure_open_bus=True)})


@pytest.fixture(scope="session")
def postgres_server(stack_dir: Path) -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres(stack_dir / "postgres", port=0)
    server.start()
    yield server
    server.stop()


S = TypeVar("S", EmbeddedNats, EmbeddedPostgres)


def _factory(stack_dir: Path, cls: Callable[..., S], prefix: str) -> Iterator[Callable[[], S]]:
    servers: list[S] = []

    def make() -> S:
        server = cls(stack_dir / f"{prefix}-{uuid.uuid4().hex[:8]}", port=0)
        server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def nats_factory(stack_dir: Path, test_auth: TestAuth) -> Iterator[Callable[[], EmbeddedNats]]:
    """Start private nats-servers (for kill/restart tests), with the session's authorization
    and TLS; stopped afterwards."""
    yield from _factory(stack_dir, functools.partial(_private_nats, auth=test_auth), "nats")


@pytest.fixture
def postgres_factory(stack_dir: Path) -> Iterator[Callable[[], EmbeddedPostgres]]:
    """Start private PostgreSQL servers (for kill/restart tests); stopped afterwards."""
    yield from _factory(stack_dir, EmbeddedPostgres, "pg")


# Many test workers run at once (in this process, or children started with this environment:
# ``blackboard dev``, blackboard.testing's stacks): each serves its metrics and health endpoints
# on a free port instead of observability.http_port's default, 9464.
os.environ.setdefault("BLACKBOARD_OBSERVABILITY__HTTP_PORT", "0")


def make_settings(nats_url: str, pg_dsn: str | None = None, **overrides: object) -> Settings:
    """Settings pointing at the given servers (environment variables ignored), with the
    session's identities: agents are issued their credential by the test authority on first
    use (``security.authority_dir``); ``nats.creds_file`` is the worker's (what workers and
    ``connect_nats`` use; an agent passes over a file issued to another id); the test CA."""
    auth = _AUTH
    nats_values: dict[str, Any] = {"url": nats_url, "write_timeout": 10.0}
    values: dict[str, object] = {}
    if auth is not None:
        nats_values |= {"creds_file": auth.creds("worker"), "tls_ca_file": auth.tls.ca}
        values["security"] = SecuritySettings(authority_dir=auth.authority.directory,
                                              policy_file=auth.authority.policy_file)
    values["nats"] = NatsSettings(**nats_values)
    # A batch a killed test worker held is embedded by the next test's worker within seconds
    # (the default, 120 s, outlasts a test's wait for the shared database's embedding queue).
    values["worker"] = WorkerSettings(embed_lease=5.0)
    # Many test workers run at once: each serves its metrics and health endpoints on a free port.
    values["observability"] = ObservabilitySettings(http_port=0)
    if pg_dsn is not None:
        values["postgres"] = PostgresSettings(dsn=pg_dsn)  # type: ignore[arg-type]
    values.update(overrides)
    return Settings().model_copy(update=values)


async def stored_memories(url: str, board: str) -> list[dict[str, Any]]:
    """Every memory-stream message of ``board`` as JetStream holds it, decoded (an ephemeral
    pull consumer from the start, no acks; stops at the first empty fetch). Read as the
    operator: pulling from a consumer of ``BB_MEMORY`` is no agent's right (an agent's pull
    is refused by the server, and its fetch then only times out, i.e. reads nothing)."""
    nc = await operator_nats(url, name="test-stored-memories")
    try:
        sub = await nc.jetstream().pull_subscribe(
            Subjects.memory_board(board), stream=MEMORY_STREAM,
            config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL, ack_policy=api.AckPolicy.NONE))
        out: list[dict[str, Any]] = []
        try:
            while True:
                out += [codec.decode(m.data) for m in await sub.fetch(200, timeout=0.5)]
        except TimeoutError:
            pass
        finally:
            await sub.unsubscribe()
        return out
    finally:
        await nc.close()


@pytest.fixture
def settings(nats_server: EmbeddedNats) -> Settings:
    return make_settings(nats_server.url)


@pytest.fixture
def pg_settings(nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres) -> Settings:
    return make_settings(nats_server.url, postgres_server.dsn)


@pytest.fixture
def unique() -> str:
    """A unique token for board names, agent ids and subjects of one test."""
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture
def openai_fake() -> Iterator[OpenAIFake]:
    with OpenAIFake() as fake:
        yield fake


@pytest_asyncio.fixture
async def start_worker() -> AsyncIterator[StartWorker]:
    """Start in-process workers that run until the test ends, then stop (the last started first).

    ``worker = await start_worker(settings, name=f"w{unique}", embed=False, provider=...)``
    takes the arguments of ``tests._worker_helpers.running_worker``; it returns once the
    worker is fully up.
    """
    # Imported here: tests that never run a worker do not load it.
    from tests._worker_helpers import running_worker

    async with contextlib.AsyncExitStack() as stack:
        async def start(settings: Settings, **kwargs: Any) -> Worker:
            return await stack.enter_async_context(running_worker(settings, **kwargs))

        yield start
