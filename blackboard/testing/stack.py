"""A test stack: NATS with JetStream (one node or a 3-node cluster), PostgreSQL + pgvector
and a worker, with authorization and TLS, ready for a test suite's agents.

:class:`Stack` is what a test sees; :class:`~blackboard.testing.embedded.EmbeddedStack`
runs the servers as child processes (the ``embedded`` extra's nats-server and PostgreSQL)
and :class:`~blackboard.testing.containers.ContainerStack` as containers (testcontainers,
the images of ``Settings.containers``). Either is started by :meth:`Stack.start` (or
``with``), which returns once every part is ready: the servers accept connections, the
JetStream assets exist, the database is migrated and the worker answers.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self, TypeVar

from pydantic import SecretStr

from blackboard.protocol.errors import (
    AuthenticationError,
    ConfigurationError,
    DevStackError,
    PermissionDeniedError,
)
from blackboard.protocol.subjects import SEARCH_SERVICE
from blackboard.settings import NatsSettings, Settings
from blackboard.testing.identities import StackIdentities

if TYPE_CHECKING:
    from agents_sdk import Agent

__all__ = ["Stack", "StackMode", "run_sync"]

#: How a stack runs its servers.
StackMode = Literal["embedded", "containers"]

T = TypeVar("T")


def run_sync(factory: Callable[[], Coroutine[Any, Any, T]], timeout: float = 300.0) -> T:
    """Run the coroutine ``factory()`` makes to completion on a thread of its own (with its own
    event loop), so that synchronous set-up code works inside a running loop as well.

    Raises:
        DevStackError: it did not finish within ``timeout`` seconds.
        Exception: what the coroutine raised.
    """
    result: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(factory()))
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=target, name="blackboard-testing", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise DevStackError(f"a test stack's set-up step did not finish within {timeout:g}s")
    if errors:
        raise errors[0]
    return result[0]


class Stack(abc.ABC):
    """NATS (JetStream; ``nats_nodes`` 1 or 3), PostgreSQL + pgvector and (``worker``) one
    worker, with an identity authority and TLS of their own under ``directory`` (default: a
    new temporary directory, removed by :meth:`stop`).

    ``settings`` is the base of every settings object the stack hands out (a suite's own
    embedding provider, board bucket, ...); the connection fields (NATS URLs, credentials,
    CA, DSN) are the stack's. ``policy`` (TOML) replaces the default policy
    (:data:`~blackboard.testing.identities.TEST_POLICY`: any agent id is a member of every
    board); it must declare ``worker`` and ``operator``.
    """

    #: How this kind of stack runs its servers.
    mode: ClassVar[StackMode]

    def __init__(self, directory: Path | None = None, *, settings: Settings | None = None,
                 nats_nodes: int = 1, worker: bool = True, policy: str | None = None) -> None:
        if nats_nodes not in (1, 3):
            raise ValueError(f"nats_nodes must be 1 or 3 (a JetStream cluster), not {nats_nodes}")
        base = settings if settings is not None else Settings()
        if nats_nodes == 3 and base.board.replicas == 1:
            base = base.model_copy(update={"board": base.board.model_copy(update={"replicas": 3})})
        self.base_settings = base
        self.nats_nodes = nats_nodes
        self.run_worker = worker
        self.policy = policy
        self._own_directory = directory is None
        self._directory = Path(directory).resolve() if directory is not None else None
        self._identities: StackIdentities | None = None
        self._started = False

    # -- what each kind of stack provides ------------------------------------------------
    @property
    @abc.abstractmethod
    def nats_urls(self) -> list[str]:
        """Each NATS node's URL as this process reaches it (``tls://host:port``)."""

    @property
    @abc.abstractmethod
    def postgres_dsn(self) -> str:
        """The application role's DSN of the database, as this process reaches it (with
        its password)."""

    def _server_hosts(self) -> list[str]:
        """Names the servers' certificate must cover besides loopback."""
        return []

    @abc.abstractmethod
    def _start_servers(self) -> None:
        """Start NATS and PostgreSQL; return once they accept connections."""

    @abc.abstractmethod
    def _stop_servers(self) -> None:
        """Stop and remove everything started (idempotent, never raises for what is gone)."""

    @abc.abstractmethod
    def _launch_worker(self) -> None:
        """Start the worker (or start it again after :meth:`kill_worker`)."""

    @abc.abstractmethod
    def kill_worker(self) -> None:
        """Kill the worker at once (SIGKILL: a crash, nothing flushed)."""

    @abc.abstractmethod
    def stop_worker(self) -> None:
        """Stop the worker gracefully."""

    @abc.abstractmethod
    def kill_nats(self, index: int = 0) -> None:
        """Kill NATS node ``index`` (SIGKILL); :meth:`start_nats` brings it back."""

    @abc.abstractmethod
    def start_nats(self, index: int = 0) -> None:
        """Start NATS node ``index`` again; returns once it accepts connections."""

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def directory(self) -> Path:
        """Where the stack keeps its authority, data and logs."""
        if self._directory is None:
            # Not under a mode-700 directory: the embedded PostgreSQL runs as an unprivileged
            # user when the suite runs as root, and must reach its data directory.
            self._directory = Path(tempfile.mkdtemp(prefix="bb-stack-"))
            self._directory.chmod(0o755)
        return self._directory

    @property
    def identities(self) -> StackIdentities:
        """The stack's authority and TLS files.

        Raises:
            DevStackError: the stack was not started.
        """
        if self._identities is None:
            raise DevStackError("the test stack is not started")
        return self._identities

    @property
    def nats_url(self) -> str:
        """Every node's URL, comma-separated (what ``nats.url`` takes)."""
        return ",".join(self.nats_urls)

    def start(self) -> Self:
        """Start every part and return once the stack is ready (idempotent); on a failure,
        what was started is stopped.

        Raises:
            DevStackError: a part did not start or become ready (the reason, with its log's tail).
        """
        if self._started:
            return self
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._identities = StackIdentities.create(self.directory / "auth", settings=self.base_settings,
                                                      hosts=self._server_hosts(), policy=self.policy)
            self._start_servers()
            run_sync(self._set_up)
            self._started = True
            if self.run_worker:
                self.start_worker()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every part and remove the stack's directory if the stack made it."""
        self._started = False
        try:
            self._stop_servers()
        finally:
            if self._own_directory and self._directory is not None:
                shutil.rmtree(self._directory, ignore_errors=True)
                self._directory = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- settings ------------------------------------------------------------------------
    def settings(self, principal: str | None = None) -> Settings:
        """Settings connecting to this stack (the base settings' other fields kept).

        ``principal`` None: an agent's; the SDK has each agent id issued its credential
        by the stack's authority on first use (``security.authority_dir``). ``"worker"`` or
        ``"operator"`` (or another declared system principal): with that principal's
        credential in ``nats.creds_file``.
        """
        ids = self.identities
        base = self.base_settings
        nats_update: dict[str, Any] = {"url": self.nats_url, "tls_ca_file": ids.tls.ca,
                                       "credentials_dir": ids.authority.creds_dir,
                                       "insecure_open_bus": False,
                                       "creds_file": ids.creds(principal) if principal is not None else None}
        return base.model_copy(update={
            "nats": NatsSettings.model_validate({**base.nats.model_dump(), **nats_update}),
            "postgres": base.postgres.model_copy(update={"dsn": SecretStr(self.postgres_dsn)}),
            "security": base.security.model_copy(update={"authority_dir": ids.directory,
                                                         "policy_file": ids.policy_file}),
        })

    def agent(self, agent_id: str | None = None, **kwargs: Any) -> contextlib.AbstractAsyncContextManager[Agent]:
        """``Agent.connect(agent_id, settings=self.settings(), **kwargs)``: use as ``async with
        stack.agent("alice") as agent`` (``agent_id`` None: a new unique id)."""
        from agents_sdk import Agent

        return Agent.connect(agent_id or f"agent-{uuid.uuid4().hex[:12]}", settings=self.settings(), **kwargs)

    # -- set-up and readiness --------------------------------------------------------------
    async def _set_up(self) -> None:
        """As the operator: the JetStream assets (retried while a new cluster elects its
        leaders) and the key registry; then the migrations, as the application role."""
        from blackboard.client.connection import connect_nats
        from blackboard.client.keys import publish_registry
        from blackboard.client.streams import ensure_streams
        from blackboard.db import migrate

        settings = self.settings("operator")
        deadline = time.monotonic() + self.base_settings.containers.start_timeout
        while True:
            try:
                nc = await connect_nats(settings, name="blackboard-testing-setup")
                try:
                    await ensure_streams(nc.jetstream(), settings, update=True)
                    await publish_registry(nc, self.identities.authority,
                                           timeout=settings.nats.request_timeout)
                finally:
                    await nc.close()
                break
            except (AuthenticationError, ConfigurationError, PermissionDeniedError):
                raise  # no waiting mends these
            except Exception as exc:  # a cluster without a meta leader yet: try again
                if time.monotonic() > deadline:
                    raise DevStackError(f"the test stack's JetStream assets could not be created: {exc!r}") from exc
                await asyncio.sleep(0.5)
        await migrate(settings)

    def worker_ids(self, wait: float = 0.5) -> set[str]:
        """The ids of the search services (one per running worker) answering a ping within
        ``wait`` seconds."""
        return run_sync(lambda: self._ping_workers(wait))

    async def _ping_workers(self, wait: float) -> set[str]:
        from nats.micro.service import ServiceVerb, control_subject

        from blackboard.client.connection import connect_nats

        nc = await connect_nats(self.settings("operator"), name="blackboard-testing-ping")
        try:
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
            await nc.publish(control_subject(ServiceVerb.PING, SEARCH_SERVICE), b"", reply=inbox)
            found: set[str] = set()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait
            while (left := deadline - loop.time()) > 0:
                try:
                    msg = await sub.next_msg(timeout=left)
                except TimeoutError:
                    break
                with contextlib.suppress(ValueError, AttributeError):
                    found.add(str(json.loads(msg.data)["id"]))
            return found
        finally:
            await nc.close()

    def start_worker(self) -> None:
        """Start the worker (again, after :meth:`kill_worker` or :meth:`stop_worker`) and
        return once it serves: its search service answers a ping with an id not seen before.

        Raises:
            DevStackError: it did not answer within ``containers.start_timeout`` seconds
                (with the tail of its log).
        """
        before = self.worker_ids(0.2)
        self._launch_worker()
        deadline = time.monotonic() + self.base_settings.containers.start_timeout
        while time.monotonic() < deadline:
            self._check_worker_alive()
            if self.worker_ids(0.3) - before:
                return
        raise DevStackError(f"the test stack's worker did not become ready within "
                            f"{self.base_settings.containers.start_timeout:g}s:\n{self.worker_log()}")

    @abc.abstractmethod
    def _check_worker_alive(self) -> None:
        """Raise ``DevStackError`` (with its log) if the worker exited."""

    @abc.abstractmethod
    def worker_log(self) -> str:
        """The tail of the worker's log."""
