"""The containerized test stack: NATS, PostgreSQL + pgvector and the worker as containers
started through testcontainers (the ``testing`` extra) on a network of their own, with the
images of ``Settings.containers`` (by default the official ones: docs/testing.md).

The containers reach each other by name (``nats-1``..``nats-3``, ``postgres``); this process
reaches them through ports published on the Docker host. Files the servers need (their
config, the authority's rendered include, the TLS certificate and key, the worker's
credential, CA and policy) are copied into the containers before they start, so nothing of
this host is mounted and a remote engine (``DOCKER_HOST``) works too.

Testcontainers' reaper (Ryuk) is not used: its image is one more pull, and on machines
without a registry it cannot be had. Every container and network carries the labels of
:data:`LABEL` (with this process's host and pid): :meth:`ContainerStack.stop` removes them,
and :func:`sweep_containers` removes those whose process is gone (a run that was killed).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blackboard.devstack import free_port
from blackboard.protocol.errors import DevStackError
from blackboard.testing.environment import settings_env
from blackboard.testing.stack import Stack

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.network import Network

__all__ = ["LABEL", "ContainerStack", "docker_client", "sweep_containers"]

#: The label every container and network of a stack carries; ``<LABEL>.host`` and
#: ``<LABEL>.pid`` name the process that started it, ``<LABEL>.stack`` the stack.
LABEL = "io.blackboard.testing"

_NATS_CONF_DIR = "/etc/nats"
_WORKER_FILES = "/etc/blackboard"
_PG_SUPERUSER = "postgres"
_APP_ROLE = "blackboard"
_DATABASE = "blackboard"


def _disable_ryuk() -> None:
    from testcontainers.core.config import testcontainers_config

    testcontainers_config.ryuk_disabled = True


def docker_client() -> Any:
    """A Docker SDK client of the engine testcontainers uses (``DOCKER_HOST`` or the local socket).

    Raises:
        DevStackError: testcontainers is not installed, or no Docker engine answers (the reason).
    """
    try:
        from testcontainers.core.docker_client import DockerClient
    except ImportError as exc:
        raise DevStackError("containers mode needs testcontainers: pip install 'blackboard[testing]'") from exc
    try:
        client = DockerClient().client
        client.ping()
    except Exception as exc:  # docker.errors.DockerException and the transport's errors
        raise DevStackError(f"no Docker engine answers (is dockerd running? DOCKER_HOST?): {exc}") from exc
    return client


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_containers(*, everything: bool = False) -> int:
    """Remove the containers and networks of test stacks whose process (on this host) is gone,
    or (``everything``) of every test stack. Returns how many containers were removed.

    Raises:
        DevStackError: no Docker engine answers.
    """
    client = docker_client()
    host = socket.gethostname()

    def orphan(labels: dict[str, str]) -> bool:
        if everything:
            return True
        if labels.get(f"{LABEL}.host") != host:
            return False
        try:
            return not _pid_alive(int(labels.get(f"{LABEL}.pid", "")))
        except ValueError:
            return False

    removed = 0
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        if orphan(container.labels):
            with contextlib.suppress(Exception):
                container.remove(force=True, v=True)
                removed += 1
    for network in client.networks.list(filters={"label": LABEL}):
        if orphan(network.attrs.get("Labels") or {}):
            with contextlib.suppress(Exception):
                network.remove()
    return removed


def _nats_config(index: int, nodes: int, sync_interval: str) -> str:
    """Node ``index``'s config inside its container (the compose file's shape)."""
    cluster = ""
    if nodes > 1:
        routes = "\n".join(f"    nats-route://nats-{j + 1}:6222" for j in range(nodes))
        cluster = ("cluster {\n  name: blackboard\n  port: 6222\n  no_advertise: true\n"
                   f"  routes: [\n{routes}\n  ]\n}}\n")
    return (
        "# written by blackboard.testing\n"
        "port: 4222\n"
        f"server_name: nats-{index + 1}\n"
        "max_payload: 8MB\n"
        'include "auth/nats-auth.conf"\n'
        f'tls {{\n  cert_file: "{_NATS_CONF_DIR}/auth/tls/server.pem"\n'
        f'  key_file: "{_NATS_CONF_DIR}/auth/tls/server-key.pem"\n  timeout: 5\n}}\n'
        # A tmpfs (mode 1777): writable whatever user the image runs the server as.
        f"jetstream {{\n  store_dir: /data/jetstream\n  sync_interval: {sync_interval}\n}}\n"
        + cluster
    )


def _wait_tcp(host: str, port: int, timeout: float, what: str, container: DockerContainer) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        _check_running(container, what)
        time.sleep(0.1)
    raise DevStackError(f"{what} did not accept connections on {host}:{port} within {timeout:g}s:\n"
                        f"{_logs(container)}")


def _logs(container: DockerContainer) -> str:
    try:
        out, err = container.get_logs()
    except Exception as exc:  # the container is gone
        return f"(no logs: {exc})"
    return (out + err).decode(errors="replace")[-3000:]


def _check_running(container: DockerContainer, what: str) -> None:
    wrapped = container.get_wrapped_container()
    wrapped.reload()
    if wrapped.status in ("exited", "dead"):
        raise DevStackError(f"{what} exited ({wrapped.attrs['State'].get('ExitCode')}) during start-up:\n"
                            f"{_logs(container)}")


class ContainerStack(Stack):
    """The stack as containers (see :class:`~blackboard.testing.stack.Stack`), with the
    images of ``settings.containers``.

    Raises (from :meth:`start`):
        DevStackError: testcontainers missing, no Docker engine, an image missing or a
            container not ready within ``containers.start_timeout`` (with its logs).
    """

    mode = "containers"

    def __init__(self, directory: Path | None = None, **options: Any) -> None:
        super().__init__(directory, **options)
        self.stack_id = uuid.uuid4().hex[:12]
        self._network: Network | None = None
        self._nats: list[DockerContainer] = []
        self._nats_ports: list[int] = []
        self._postgres: DockerContainer | None = None
        self._pg_port = 0
        self._worker: DockerContainer | None = None
        self._passwords = {_PG_SUPERUSER: secrets.token_urlsafe(24), _APP_ROLE: secrets.token_urlsafe(24)}
        self._host = "127.0.0.1"

    @property
    def labels(self) -> dict[str, str]:
        """The labels of this stack's containers and network."""
        return {LABEL: "true", f"{LABEL}.stack": self.stack_id, f"{LABEL}.host": socket.gethostname(),
                f"{LABEL}.pid": str(os.getpid())}

    @property
    def nats_urls(self) -> list[str]:
        return [f"tls://{self._host}:{port}" for port in self._nats_ports]

    @property
    def postgres_dsn(self) -> str:
        return self._dsn(_APP_ROLE, self._host, self._pg_port)

    def _dsn(self, role: str, host: str, port: int) -> str:
        return f"postgresql://{role}:{self._passwords[role]}@{host}:{port}/{_DATABASE}"

    @property
    def containers(self) -> list[DockerContainer]:
        """Every container of the stack (NATS nodes, PostgreSQL, the worker)."""
        return [*self._nats, *([self._postgres] if self._postgres else []), *([self._worker] if self._worker else [])]

    def _server_hosts(self) -> list[str]:
        docker_client()  # fails early, with the reason, when there is no engine
        from testcontainers.core.docker_client import DockerClient

        self._host = DockerClient().host()
        if self._host == "localhost":
            self._host = "127.0.0.1"
        return [self._host, *(f"nats-{i + 1}" for i in range(self.nats_nodes))]

    # -- start and stop --------------------------------------------------------------------
    def _start_servers(self) -> None:
        from testcontainers.core.network import Network

        _disable_ryuk()
        self._network = Network(docker_network_kw={"labels": self.labels}).create()
        self._nats_ports = [free_port() for _ in range(self.nats_nodes)]
        self._nats = [self._nats_container(i) for i in range(self.nats_nodes)]
        for i, container in enumerate(self._nats):
            self._nats_ports[i] = self._start_published(container, f"NATS node nats-{i + 1}", 4222,
                                                        self._nats_ports[i])
        self._postgres = self._postgres_container()
        self._pg_port = self._start_published(self._postgres, "PostgreSQL", 5432, self._pg_port)
        timeout = self.base_settings.containers.start_timeout
        for i, container in enumerate(self._nats):
            _wait_tcp(self._host, self._nats_ports[i], timeout, f"NATS node nats-{i + 1}", container)
        self._prepare_database(timeout)

    def _container(self, image: str, alias: str) -> DockerContainer:
        from testcontainers.core.container import DockerContainer

        assert self._network is not None
        return (DockerContainer(image).with_network(self._network).with_network_aliases(alias)
                .with_name(f"bb-{self.stack_id}-{alias}").with_kwargs(labels=self.labels))

    def _start_published(self, container: DockerContainer, what: str, port: int, host_port: int) -> int:
        """Start ``container`` with ``port`` published on ``host_port``, or on another free port
        if something took that one since it was picked (another run's containers); returns the
        host port."""
        for _ in range(4):
            try:
                container.start()
                return host_port
            except Exception as exc:  # docker.errors.APIError
                if "already allocated" not in str(exc) and "already in use" not in str(exc):
                    raise DevStackError(f"the test stack's {what} container ({container.image}) did not "
                                        f"start: {exc}") from exc
                with contextlib.suppress(Exception):
                    container.get_wrapped_container().remove(force=True)
                host_port = free_port()
                container.with_bind_ports(port, host_port)
        raise DevStackError(f"the test stack's {what} container found no free host port")

    def _start(self, container: DockerContainer, what: str) -> None:
        try:
            container.start()
        except Exception as exc:  # docker.errors.ImageNotFound, APIError
            raise DevStackError(f"the test stack's {what} container ({container.image}) did not start: {exc}") from exc

    def _nats_container(self, index: int) -> DockerContainer:
        ids = self.identities
        auth = f"{_NATS_CONF_DIR}/auth"
        return (self._container(self.base_settings.containers.nats_image, f"nats-{index + 1}")
                .with_command(["-c", f"{_NATS_CONF_DIR}/nats.conf"])
                .with_bind_ports(4222, self._nats_ports[index])
                .with_tmpfs_mount("/data")
                .with_copy_into_container(
                    _nats_config(index, self.nats_nodes, self.base_settings.nats.sync_interval).encode(),
                    f"{_NATS_CONF_DIR}/nats.conf")
                .with_copy_into_container(ids.server_config, f"{auth}/nats-auth.conf")
                .with_copy_into_container(ids.tls.cert, f"{auth}/tls/server.pem")
                .with_copy_into_container(ids.tls.key, f"{auth}/tls/server-key.pem"))

    def _postgres_container(self) -> DockerContainer:
        self._pg_port = free_port()
        return (self._container(self.base_settings.containers.postgres_image, "postgres")
                .with_bind_ports(5432, self._pg_port)
                .with_envs(POSTGRES_USER=_PG_SUPERUSER, POSTGRES_PASSWORD=self._passwords[_PG_SUPERUSER],
                           POSTGRES_DB=_DATABASE)
                .with_kwargs(labels=self.labels, shm_size="256m"))

    def _prepare_database(self, timeout: float) -> None:
        """As the superuser, once the server accepts TCP connections (the image's temporary
        server during initialisation listens on its socket only): the application role (LOGIN
        and nothing more) owning the database, and the ``vector`` extension only a superuser
        may create (what ``docker/postgres/init-app-role.sh`` does in the compose file)."""
        import psycopg
        from psycopg import sql

        assert self._postgres is not None
        admin = self._dsn(_PG_SUPERUSER, self._host, self._pg_port)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(admin, autocommit=True, connect_timeout=2) as conn:
                    conn.execute(sql.SQL(
                        "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
                        "PASSWORD {}").format(sql.Identifier(_APP_ROLE), sql.Literal(self._passwords[_APP_ROLE])))
                    conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
                        sql.Identifier(_DATABASE), sql.Identifier(_APP_ROLE)))
                    conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(_DATABASE)))
                    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                    conn.execute(sql.SQL("ALTER SCHEMA public OWNER TO {}").format(sql.Identifier(_APP_ROLE)))
                return
            except psycopg.OperationalError as exc:
                _check_running(self._postgres, "PostgreSQL")
                if time.monotonic() > deadline:
                    raise DevStackError(f"PostgreSQL did not become ready within {timeout:g}s: {exc}\n"
                                        f"{_logs(self._postgres)}") from exc
                time.sleep(0.25)

    def _stop_servers(self) -> None:
        for container in self.containers:
            with contextlib.suppress(Exception):  # gone already
                container.get_wrapped_container().remove(force=True, v=True)
            with contextlib.suppress(Exception):
                container.get_docker_client().client.close()  # each container has its own client
        self._worker = None
        self._postgres = None
        self._nats = []
        if self._network is not None:
            with contextlib.suppress(Exception):
                self._network.remove()
            self._network = None

    # -- the worker ----------------------------------------------------------------------
    def _worker_env(self) -> dict[str, str]:
        settings = self.settings("worker")
        inside = settings.model_copy(update={
            "nats": settings.nats.model_copy(update={
                "url": ",".join(f"tls://nats-{i + 1}:4222" for i in range(self.nats_nodes)),
                "creds_file": Path(f"{_WORKER_FILES}/worker.creds"),
                "tls_ca_file": Path(f"{_WORKER_FILES}/ca.pem"), "credentials_dir": None}),
            "postgres": settings.postgres.model_copy(update={"dsn": self._dsn(_APP_ROLE, "postgres", 5432)}),
            "security": settings.security.model_copy(update={
                "authority_dir": None, "policy_file": Path(f"{_WORKER_FILES}/policy.toml")}),
        })
        # The image's user may have no home: caches (the quantized query model) go to /tmp.
        return {"HOME": "/tmp", **settings_env(inside)}

    def _launch_worker(self) -> None:
        if self._worker is not None:
            wrapped = self._worker.get_wrapped_container()
            wrapped.reload()
            if wrapped.status != "running":
                wrapped.start()  # the same container again: its name, settings and consumers
            return
        ids = self.identities
        self._worker = (self._container(self.base_settings.containers.worker_image, "worker")
                        .with_command(["worker"])
                        .with_envs(**self._worker_env())
                        .with_copy_into_container(ids.creds("worker"), f"{_WORKER_FILES}/worker.creds")
                        .with_copy_into_container(ids.tls.ca, f"{_WORKER_FILES}/ca.pem")
                        .with_copy_into_container(ids.policy_file, f"{_WORKER_FILES}/policy.toml"))
        self._start(self._worker, "worker")

    def _check_worker_alive(self) -> None:
        if self._worker is not None:
            _check_running(self._worker, "the worker")

    def worker_log(self) -> str:
        return _logs(self._worker) if self._worker is not None else ""

    def kill_worker(self) -> None:
        if self._worker is not None:
            with contextlib.suppress(Exception):  # already stopped
                self._worker.get_wrapped_container().kill()

    def stop_worker(self) -> None:
        if self._worker is not None:
            self._worker.get_wrapped_container().stop(timeout=30)

    # -- NATS nodes ------------------------------------------------------------------------
    def kill_nats(self, index: int = 0) -> None:
        with contextlib.suppress(Exception):  # already stopped
            self._nats[index].get_wrapped_container().kill()

    def start_nats(self, index: int = 0) -> None:
        container = self._nats[index]
        container.get_wrapped_container().start()
        _wait_tcp(self._host, self._nats_ports[index], self.base_settings.containers.start_timeout,
                  f"NATS node nats-{index + 1}", container)
