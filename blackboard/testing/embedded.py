"""The embedded test stack: nats-server and PostgreSQL + pgvector from their pip packages (the
``embedded`` extra, as ``blackboard dev`` runs them) and the worker, as child processes on
free loopback ports. No Docker needed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from blackboard.devstack import EmbeddedNats, EmbeddedPostgres, free_port
from blackboard.protocol.errors import DevStackError
from blackboard.testing.environment import settings_env
from blackboard.testing.stack import Stack

__all__ = ["EmbeddedStack"]


class _ClusterNode(EmbeddedNats):
    """One node of a 3-node JetStream cluster on loopback."""

    def __init__(self, data_dir: Path, *, name: str, route_port: int, routes: list[int], **options: Any) -> None:
        super().__init__(data_dir, **options)
        self.server_name = name
        self.route_port = route_port
        self.routes = routes

    def _write_config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / "nats.conf"
        routes = "\n".join(f"    nats-route://{self.host}:{port}" for port in self.routes)
        tls = self.tls
        conf.write_text(
            "# written by blackboard.testing\n"
            f"server_name: {self.server_name}\n"
            f"listen: {self.host}:{self.port}\n"
            "max_payload: 8MB\n"
            f'pid_file: "{self.pid_file}"\n'
            f'jetstream {{\n  store_dir: "{self.data_dir / "jetstream"}"\n  sync_interval: {self.sync_interval}\n}}\n'
            f"cluster {{\n  name: blackboard\n  listen: {self.host}:{self.route_port}\n  no_advertise: true\n"
            f"  routes: [\n{routes}\n  ]\n}}\n"
            + (f'include "{os.path.relpath(self.auth_config, self.data_dir)}"\n' if self.auth_config else "")
            + (f'tls {{\n  cert_file: "{tls.cert}"\n  key_file: "{tls.key}"\n  timeout: 5\n}}\n' if tls else "")
        )
        return conf


class EmbeddedStack(Stack):
    """The stack as child processes (see :class:`~blackboard.testing.stack.Stack`).

    The worker runs as ``python -m blackboard worker`` with this interpreter, its settings
    given in its environment (:func:`~blackboard.testing.environment.settings_env`); its log
    is ``<directory>/worker.log``.
    """

    mode = "embedded"

    def __init__(self, directory: Path | None = None, **options: Any) -> None:
        super().__init__(directory, **options)
        self._nats: list[EmbeddedNats] = []
        self._postgres: EmbeddedPostgres | None = None
        self._worker: subprocess.Popen[bytes] | None = None

    @property
    def nats_urls(self) -> list[str]:
        return [node.url for node in self._nats]

    @property
    def postgres_dsn(self) -> str:
        if self._postgres is None:
            raise DevStackError("the test stack is not started")
        return self._postgres.dsn

    @property
    def nats_servers(self) -> list[EmbeddedNats]:
        """The NATS nodes."""
        return list(self._nats)

    @property
    def postgres(self) -> EmbeddedPostgres:
        """The PostgreSQL server.

        Raises:
            DevStackError: the stack was not started.
        """
        if self._postgres is None:
            raise DevStackError("the test stack is not started")
        return self._postgres

    def _start_servers(self) -> None:
        ids = self.identities
        options: dict[str, Any] = {"auth_config": ids.server_config, "tls": ids.tls,
                                   "sync_interval": self.base_settings.nats.sync_interval}
        if self.nats_nodes == 1:
            self._nats = [EmbeddedNats(self.directory / "nats", port=free_port(), **options)]
        else:
            routes = [free_port() for _ in range(self.nats_nodes)]
            self._nats = [_ClusterNode(self.directory / f"nats-{i + 1}", name=f"nats-{i + 1}", port=free_port(),
                                       route_port=routes[i], routes=routes, **options)
                          for i in range(self.nats_nodes)]
        for node in self._nats:
            node.start()
        self._postgres = EmbeddedPostgres(self.directory / "postgres", port=free_port())
        self._postgres.start()

    def _stop_servers(self) -> None:
        try:
            self.stop_worker()
        finally:
            for node in self._nats:
                node.stop()
            if self._postgres is not None:
                self._postgres.stop()

    # -- the worker ----------------------------------------------------------------------
    @property
    def worker_log_file(self) -> Path:
        return self.directory / "worker.log"

    def _launch_worker(self) -> None:
        if self._worker is not None and self._worker.poll() is None:
            return
        env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")}
        env |= settings_env(self.settings("worker"))
        if "http_port" not in self.base_settings.observability.model_fields_set:
            # Its metrics and health endpoints on a free port: two stacks (or a stack beside a
            # running worker) would both want the default one.
            env["BLACKBOARD_OBSERVABILITY__HTTP_PORT"] = "0"
        with open(self.worker_log_file, "ab") as log:
            self._worker = subprocess.Popen(
                [sys.executable, "-m", "blackboard", "worker"], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env)  # in this process's group: a Ctrl-C reaches it

    def _check_worker_alive(self) -> None:
        if self._worker is not None and self._worker.poll() is not None:
            raise DevStackError(f"the test stack's worker exited with code {self._worker.returncode} during "
                                f"start-up:\n{self.worker_log()}")

    def worker_log(self) -> str:
        try:
            return self.worker_log_file.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def _end_worker(self, sig: int, timeout: float) -> None:
        proc = self._worker
        self._worker = None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def kill_worker(self) -> None:
        self._end_worker(signal.SIGKILL, 10)

    def stop_worker(self) -> None:
        self._end_worker(signal.SIGTERM, 30)

    # -- NATS nodes ------------------------------------------------------------------------
    def kill_nats(self, index: int = 0) -> None:
        self._nats[index].kill()

    def start_nats(self, index: int = 0) -> None:
        self._nats[index].start()
