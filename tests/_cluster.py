"""A 3-node JetStream cluster on loopback, configured by ``docker/nats/nats.conf``.

The production compose file (``docker/compose.yml``) runs three nats-server
nodes from that one file, told apart by the ``SERVER_NAME`` environment
variable. The tests run the same file: only what a container provides is
rewritten for loopback (the client and route ports, the routes' host names,
the store directory, the mount point of the TLS files, no monitoring port);
JetStream's settings (``sync_interval: always``), the cluster's name, the
authorization (the ``include`` of the authority's rendered config, kept as it
is) and TLS are the file's own. Each node's ``auth/`` directory, beside its
config, gets what the compose file's operator puts in ``docker/nats/auth``:
the session authority's rendered config (``blackboard auth render --out``) and
the test TLS certificate.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from blackboard.devstack import _find_nats_server, _wait_tcp, free_port
from blackboard.settings import Settings
from tests._auth import TestAuth

__all__ = ["COMPOSE_NATS_CONF", "NatsCluster", "render_node_config"]

COMPOSE_NATS_CONF = Path(__file__).resolve().parent.parent / "docker" / "nats" / "nats.conf"
#: Where the compose file mounts ``docker/nats/auth`` (beside the config, which includes
#: ``auth/nats-auth.conf`` relative to itself; the TLS paths are absolute).
COMPOSE_AUTH_DIR = "/etc/nats/auth/"


def render_node_config(template: str, *, index: int, client_ports: list[int], route_ports: list[int],
                       store_dir: Path, auth_dir: Path) -> str:
    """The compose file's node configuration for node ``index`` (0-based) on loopback, its
    TLS files under ``auth_dir`` (which must be the ``auth`` directory beside the written
    config, where its ``include`` looks).

    Raises:
        ValueError: the template lacks a line this rewrites (it changed shape:
            the test must follow).
    """

    def sub(pattern: str, repl: str, text: str) -> str:
        new, n = re.subn(pattern, repl, text, flags=re.MULTILINE)
        if n == 0:
            raise ValueError(f"{COMPOSE_NATS_CONF.name} has no line matching {pattern!r}")
        return new

    text = sub(r"^port: 4222$", f"listen: 127.0.0.1:{client_ports[index]}", template)
    text = sub(r"^http: 8222\n", "", text)
    text = sub(r"store_dir: /data/jetstream", f'store_dir: "{store_dir}"', text)
    text = sub(r"^  port: 6222$", f"  listen: 127.0.0.1:{route_ports[index]}", text)
    for j, port in enumerate(route_ports):
        text = sub(rf"nats-route://nats-{j + 1}:6222", f"nats-route://127.0.0.1:{port}", text)
    if not re.search(r'^include "auth/nats-auth\.conf"$', text, flags=re.MULTILINE):  # kept as it is
        raise ValueError(f"{COMPOSE_NATS_CONF.name} does not include auth/nats-auth.conf")
    for name in ("server.pem", "server-key.pem"):
        text = sub(rf'"{re.escape(COMPOSE_AUTH_DIR)}tls/{re.escape(name)}"', f'"{auth_dir / "tls" / name}"', text)
    return text


class NatsCluster:
    """Three nats-server processes forming the compose file's JetStream cluster, with
    ``auth``'s authorization and TLS."""

    size = 3

    def __init__(self, data_dir: Path, auth: TestAuth, template: str | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.auth = auth
        self.template = template if template is not None else COMPOSE_NATS_CONF.read_text()
        self.client_ports = [free_port() for _ in range(self.size)]
        self.route_ports = [free_port() for _ in range(self.size)]
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * self.size

    def name(self, index: int) -> str:
        return f"nats-{index + 1}"

    def url(self, index: int) -> str:
        return f"tls://127.0.0.1:{self.client_ports[index]}"

    @property
    def urls(self) -> str:
        """All nodes' URLs, comma-separated (as ``BLACKBOARD_NATS__URL`` takes them)."""
        return ",".join(self.url(i) for i in range(self.size))

    def settings(self, principal: str = "worker", base: Settings | None = None) -> Settings:
        """``base`` (default: the defaults) connecting to every node with ``principal``'s
        credential in ``nats.creds_file`` and the test CA; agents are issued theirs by the
        authority (``security.authority_dir``), as ``tests.conftest.make_settings`` does."""
        base = base if base is not None else Settings()
        return base.model_copy(update={
            "nats": base.nats.model_copy(update={"url": self.urls, "creds_file": self.auth.creds(principal),
                                                 "tls_ca_file": self.auth.tls.ca}),
            "security": base.security.model_copy(update={"authority_dir": self.auth.authority.directory,
                                                         "policy_file": self.auth.authority.policy_file})})

    def index_of(self, server_name: str) -> int:
        return [self.name(i) for i in range(self.size)].index(server_name)

    def start(self, index: int | None = None) -> None:
        """Start every node (or one); returns once each accepts client connections."""
        for i in range(self.size) if index is None else [index]:
            proc = self._procs[i]
            if proc is not None and proc.poll() is None:
                continue
            node = self.data_dir / self.name(i)
            node.mkdir(parents=True, exist_ok=True)
            conf = node / "nats.conf"
            auth_dir = node / "auth"
            self._write_auth(auth_dir)
            conf.write_text(render_node_config(self.template, index=i, client_ports=self.client_ports,
                                               route_ports=self.route_ports, store_dir=node / "jetstream",
                                               auth_dir=auth_dir))
            log = node / "nats.log"
            with open(log, "ab") as out:
                self._procs[i] = subprocess.Popen(
                    [_find_nats_server(), "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                    env={**os.environ, "SERVER_NAME": self.name(i)})
        for i in range(self.size) if index is None else [index]:
            proc = self._procs[i]
            assert proc is not None
            _wait_tcp("127.0.0.1", self.client_ports[i], proc, 20.0, self.name(i),
                      self.data_dir / self.name(i) / "nats.log")

    def _write_auth(self, auth_dir: Path) -> None:
        """What the compose file's operator puts in ``docker/nats/auth``: the authority's
        rendered config (``blackboard auth render --out``, current revocations) and the
        server's certificate and key."""
        (auth_dir / "tls").mkdir(parents=True, exist_ok=True)
        self.auth.authority.write_server_config(auth_dir / "nats-auth.conf")
        for source in (self.auth.tls.cert, self.auth.tls.key):
            shutil.copy2(source, auth_dir / "tls" / source.name)

    def kill(self, index: int) -> None:
        """SIGKILL one node (a crash); :meth:`start` brings it back with its store."""
        proc = self._procs[index]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        self._procs[index] = None

    def stop(self) -> None:
        for proc in self._procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for i, proc in enumerate(self._procs):
            if proc is not None:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
            self._procs[i] = None
