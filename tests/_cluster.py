"""A 3-node JetStream cluster on loopback, configured by ``docker/nats/nats.conf``.

The production compose file (``docker/compose.yml``) runs three nats-server
nodes from that one file, told apart by the ``SERVER_NAME`` environment
variable. The tests run the same file: only what a container provides is
rewritten for loopback (the client and route ports, the routes' host names,
the store directory, no monitoring port); JetStream's settings
(``sync_interval: always``) and the cluster's name are the file's own.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from blackboard.devstack import _find_nats_server, _wait_tcp, free_port

__all__ = ["COMPOSE_NATS_CONF", "NatsCluster", "render_node_config"]

COMPOSE_NATS_CONF = Path(__file__).resolve().parent.parent / "docker" / "nats" / "nats.conf"


def render_node_config(template: str, *, index: int, client_ports: list[int], route_ports: list[int],
                       store_dir: Path) -> str:
    """The compose file's node configuration for node ``index`` (0-based) on loopback.

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
    return text


class NatsCluster:
    """Three nats-server processes forming the compose file's JetStream cluster."""

    size = 3

    def __init__(self, data_dir: Path, template: str | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.template = template if template is not None else COMPOSE_NATS_CONF.read_text()
        self.client_ports = [free_port() for _ in range(self.size)]
        self.route_ports = [free_port() for _ in range(self.size)]
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * self.size

    def name(self, index: int) -> str:
        return f"nats-{index + 1}"

    def url(self, index: int) -> str:
        return f"nats://127.0.0.1:{self.client_ports[index]}"

    @property
    def urls(self) -> str:
        """All nodes' URLs, comma-separated (as ``BLACKBOARD_NATS__URL`` takes them)."""
        return ",".join(self.url(i) for i in range(self.size))

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
            conf.write_text(render_node_config(self.template, index=i, client_ports=self.client_ports,
                                               route_ports=self.route_ports, store_dir=node / "jetstream"))
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
