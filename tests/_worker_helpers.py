"""Helpers of the worker and search tests: running a worker, a deterministic embedding provider,
publishers, and waiting for rows.

A test runs an in-process worker through :func:`running_worker` (or the ``start_worker``
fixture of ``tests/conftest.py``, which stops it when the test ends); a test that kills
the process uses :func:`spawn_worker`.

The worker stores only records whose signature verifies (docs/security.md, "Signatures"),
so a test that publishes raw records signs them as their author would:
:func:`signed_headers` (with the author's credential, issued by the test authority) and
:func:`certify` (its certificate in the server's key registry); :func:`publish_signed`
does both. :func:`put_entry`, :func:`delete_entry` and :func:`remember` publish signed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import psycopg
from nats.js import JetStreamContext

from blackboard.client.keys import publish_certificate
from blackboard.devstack import EmbeddedPostgres
from blackboard.embeddings import EmbeddingProvider
from blackboard.protocol import codec
from blackboard.protocol.subjects import Header, Subjects
from blackboard.security.jwt import Credentials
from blackboard.security.signer import Signer
from blackboard.settings import Settings, WorkerSettings
from blackboard.worker import Worker
from blackboard.worker.handlers import StreamHandler, default_handlers

_WORD = re.compile(r"[a-z0-9]+")

#: The ``start_worker`` fixture: ``worker = await start_worker(settings, **running_worker_arguments)``.
StartWorker = Callable[..., Awaitable[Worker]]


class HashProvider:
    """Bag-of-words feature hashing: texts sharing words get similar vectors.

    Deterministic and instant, for tests where the model itself does not matter.
    """

    def __init__(self, dimensions: int = 64, model: str = "test-hash") -> None:
        self._dims = dimensions
        self._model = model
        self.calls = 0

    @property
    def model(self) -> str:
        return self._model

    @property
    def dimensions(self) -> int:
        return self._dims

    def vector(self, text: str) -> np.ndarray:
        v = np.zeros(self._dims, dtype=np.float32)
        for word in _WORD.findall(text.lower()):
            h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
            v[h % self._dims] += 1.0 if (h >> 32) & 1 else -1.0
        n = float(np.linalg.norm(v))
        if n == 0:
            v[0] = 1.0
            n = 1.0
        return v / n

    async def aclose(self) -> None:
        pass

    async def __aenter__(self) -> HashProvider:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        if not texts:
            return np.zeros((0, self._dims), dtype=np.float32)
        return np.stack([self.vector(t) for t in texts]).astype(np.float32)


def worker_settings(settings: Settings, **fields: Any) -> Settings:
    """``settings`` with these fields of its ``worker`` section replaced, validated as
    :class:`WorkerSettings` (``name="w1"``, ``batch_wait=0.02``, ``embed=False``, ...). A
    ``name`` without a ``group`` also names the group, so the worker has consumers of its own.

    Raises:
        TypeError: a field :class:`WorkerSettings` does not have (a typo would otherwise be ignored).
    """
    unknown = sorted(set(fields) - set(WorkerSettings.model_fields))
    if unknown:
        raise TypeError(f"WorkerSettings has no field {', '.join(unknown)}")
    if not fields:
        return settings
    if "name" in fields and "group" not in fields:
        # A test's worker gets consumers of its own (the group), as its unique name used to give it.
        fields = {**fields, "group": fields["name"]}
    worker = WorkerSettings.model_validate({**settings.worker.model_dump(), **fields})
    return settings.model_copy(update={"worker": worker})


@contextlib.asynccontextmanager
async def running_worker(settings: Settings, *, handlers: list[StreamHandler] | None = None,
                         provider: EmbeddingProvider | None = None,
                         query_provider: EmbeddingProvider | None = None, **fields: Any) -> AsyncIterator[Worker]:
    """An in-process :class:`Worker`, fully up in the body of the ``async with`` and stopped after it.

    ``fields`` replace worker settings (:func:`worker_settings`: ``name=``, ``serve_search=False``,
    ``embed=False``, ...); ``handlers``, ``provider`` and ``query_provider`` go to the worker
    (a stream filter of its own, a test embedding provider).
    """
    async with Worker(worker_settings(settings, **fields), handlers=handlers, provider=provider,
                      query_provider=query_provider) as worker:
        yield worker


_SIGNERS: dict[str, Signer] = {}
#: (server URL, public key) of the certificates :func:`certify` published.
_CERTIFIED: set[tuple[str, str]] = set()


def credentials(principal: str) -> Credentials:
    """``principal``'s credential (issued by the test authority on first use)."""
    from tests import _auth

    assert _auth.SESSION is not None, "the test authority is made by the test_auth fixture"
    path = _auth.SESSION.creds(principal)
    return Credentials.parse(path.read_text(encoding="utf-8"), source=str(path))


def signer(principal: str) -> Signer:
    """A :class:`Signer` with ``principal``'s credential (:func:`credentials`)."""
    found = _SIGNERS.get(principal)
    if found is None:
        found = _SIGNERS[principal] = Signer(credentials(principal))
    return found


def signed_headers(principal: str, subject: str, record: bytes, headers: Mapping[str, str] | None = None,
                   *, now_us: int | None = None) -> dict[str, str]:
    """``headers`` with a fresh ``Nats-Msg-Id`` (unless given) and ``principal``'s signature of
    ``record`` (the payload as published: the verifier checks it first) on ``subject``."""
    out = dict(headers or {})
    out.setdefault(Header.MSG_ID.value, uuid.uuid4().hex)
    signer(principal).sign(subject, out, record, now_us=now_us)
    return out


def _server_url(js: JetStreamContext) -> str:
    url = js._nc.connected_url
    assert url is not None, "not connected"
    return f"{url.scheme}://{url.netloc}"


async def certify(js: JetStreamContext, *principals: str) -> None:
    """Publish the principals' certificates to the key registry of ``js``'s server, once per
    server: as the operator on a server with authorization (an identity publishes only its own
    certificate), without a credential on a server without (where a worker holding a
    credential still verifies: the fuzz stack's)."""
    from tests import _auth

    url = _server_url(js)
    todo = [signer(p) for p in principals if (url, signer(p).public_key) not in _CERTIFIED]
    if not todo:
        return
    secure = url.startswith("tls://")
    nc = await (_auth.operator_nats(url, name="test-certify") if secure
                else _auth.raw_connect(url, None, principal=None, name="test-certify"))
    try:
        for sig in todo:
            await publish_certificate(nc, sig.public_key, sig.certificate, 5.0)
            _CERTIFIED.add((url, sig.public_key))
    finally:
        await nc.close()


async def publish_signed(js: JetStreamContext, principal: str, subject: str, payload: bytes,
                         headers: Mapping[str, str] | None = None) -> int:
    """Publish ``payload`` signed by ``principal`` (its certificate published first); its sequence."""
    await certify(js, principal)
    ack = await js.publish(subject, payload, headers=signed_headers(principal, subject, payload, headers))
    return int(ack.seq)


def entry_payload(value: Any, *, author: str = "tester", tags: list[str] | None = None,
                  metadata: dict[str, Any] | None = None, created_at: datetime | None = None,
                  content_type: str = "application/json") -> bytes:
    return codec.encode({"v": 1, "value": value, "content_type": content_type, "tags": tags or [],
                         "metadata": metadata or {}, "author": author,
                         "created_at": created_at or datetime.now(UTC)})


def memory_payload(mid: str, board: str, agent: str, text: str, **fields: Any) -> bytes:
    rec: dict[str, Any] = {"v": 1, "id": mid, "board": board, "agent": agent, "text": text,
                           "created_at": datetime.now(UTC)}
    rec.update(fields)
    return codec.encode(rec)


async def put_entry(js: JetStreamContext, subjects: Subjects, board: str, section: str, key: str,
                    value: Any, **kw: Any) -> int:
    """Write an entry revision as its author (``author=``, default ``tester``) would: signed."""
    return await publish_signed(js, kw.get("author", "tester"), subjects.entry(board, section, key),
                                entry_payload(value, **kw))


async def delete_entry(js: JetStreamContext, subjects: Subjects, board: str, section: str, key: str,
                       *, by: str = "tester") -> int:
    """Delete a key as ``by`` would: a signed tombstone."""
    return await publish_signed(js, by, subjects.entry(board, section, key), b"", {"KV-Operation": "DEL"})


async def remember(js: JetStreamContext, board: str, agent: str, mid: str, text: str, **fields: Any) -> int:
    """Store a memory as its agent would: signed."""
    return await publish_signed(js, agent, Subjects.memory(board, agent), memory_payload(mid, board, agent, text,
                                                                                          **fields))


def spawn_worker(settings: Settings, name: str, **env: str) -> subprocess.Popen[bytes]:
    """Start ``python -m blackboard.worker`` as a process (for kill -9 tests); returns once it is ready.

    Its settings come from the environment: NATS and Postgres from ``settings``,
    no embedding, no search service, a 2 s ack wait, plus ``env``
    (``WORKER__BATCH_SIZE="200"`` -> ``BLACKBOARD_WORKER__BATCH_SIZE=200``).
    """
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")}
    environ.update({
        "BLACKBOARD_NATS__URL": settings.nats.url,
        "BLACKBOARD_POSTGRES__DSN": settings.postgres.dsn.get_secret_value(),
        "BLACKBOARD_WORKER__NAME": name,
        **({"BLACKBOARD_NATS__CREDS_FILE": str(settings.nats.creds_file)} if settings.nats.creds_file else {}),
        **({"BLACKBOARD_NATS__TLS_CA_FILE": str(settings.nats.tls_ca_file)} if settings.nats.tls_ca_file else {}),
        **({"BLACKBOARD_SECURITY__POLICY_FILE": str(settings.security.policy_file)}
           if settings.security.policy_file else {}),
        **({"BLACKBOARD_NATS__INSECURE_OPEN_BUS": "true"} if settings.nats.insecure_open_bus else {}),
        "BLACKBOARD_WORKER__GROUP": name,  # consumers of its own (env may name another group)
        "BLACKBOARD_WORKER__EMBED": "false",
        "BLACKBOARD_WORKER__SERVE_SEARCH": "false",
        "BLACKBOARD_WORKER__ACK_WAIT": "2",
        "BLACKBOARD_OBSERVABILITY__HTTP_PORT": "0",  # several at once: each on a free port
    })
    environ.update({f"BLACKBOARD_{k}": v for k, v in env.items()})
    environ["PYTHONFAULTHANDLER"] = "1"  # stop_worker's SIGABRT prints every thread's stack
    log = tempfile.NamedTemporaryFile(prefix=f"bb-worker-{name}-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "blackboard.worker"], env=environ,
                            stdout=subprocess.PIPE, stderr=log)
    log.close()
    _worker_logs[proc.pid] = log.name
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until "ready" (or EOF if it died)
    assert line.strip() == b"ready", f"worker did not start: {line!r}\n{_log_tail(proc)}"
    return proc


_worker_logs: dict[int, str] = {}


def _log_tail(proc: subprocess.Popen[bytes], lines: int = 60) -> str:
    path = _worker_logs.get(proc.pid)
    if path is None:
        return ""
    with open(path, encoding="utf-8", errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def stop_worker(proc: subprocess.Popen[bytes], timeout: float = 20) -> int:
    """SIGTERM a :func:`spawn_worker` process and wait for it; returns its exit code.

    A worker that does not stop within ``timeout`` is a defect: it is aborted
    (its stacks are printed by faulthandler) and the test fails with its log's tail.
    """
    proc.terminate()
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise AssertionError(f"the worker did not stop within {timeout} s of SIGTERM; its log ends:\n"
                             f"{_log_tail(proc, 200)}") from None
    path = _worker_logs.pop(proc.pid, None)
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return code


def rows(settings: Settings, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """The rows of ``query`` on the worker's database."""
    with psycopg.connect(settings.postgres.dsn.get_secret_value()) as conn:
        return conn.execute(query, params).fetchall()


def dead_letters(settings: Settings, subject: str) -> dict[int, str]:
    """The dead letters of one subject: stream sequence -> reason."""
    return {int(seq): reason for seq, reason in rows(
        settings, "SELECT seq, reason FROM bb_dead_letters WHERE subject = %s", subject)}


def count_rows(dsn: str, query: str, *params: Any) -> int:
    """The count a ``SELECT count(*) ...`` returns; -1 while PostgreSQL is unreachable."""
    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            row = conn.execute(query, params).fetchone()
    except psycopg.OperationalError:
        return -1
    return int(row[0]) if row else 0


async def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``pred`` until it holds; ``AssertionError`` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


class GlitchyProvider(HashProvider):
    """HashProvider whose vectors hold NaN for texts saying "poison" and are 10^6 times too long
    for texts saying "loud" (as a self-hosted model server can give)."""

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = await super().embed(texts)
        for i, text in enumerate(texts):
            if "poison" in text:
                out[i, 0] = float("nan")
            elif "loud" in text:
                out[i] *= 1e6
        return out


def fresh_db(server: EmbeddedPostgres, name: str) -> str:
    """Create database ``name`` on ``server`` (empty: no migrations), owned by the application
    role as the server's own database is (pgvector created in it by the superuser); the
    application role's DSN of it."""
    return server.create_database(name)


def drop_db(server: EmbeddedPostgres, name: str) -> None:
    """Drop database ``name`` on ``server`` (as the superuser), closing its sessions."""
    server.drop_database(name)


def board_memories_handler(settings: Settings, board: str) -> StreamHandler:
    """The worker's memory handler, consuming one board's memories only (a worker on a fresh
    database then ignores what other tests left in the shared memory stream)."""
    return dataclasses.replace(default_handlers(settings)[1], filter_subject=Subjects.memory_board(board))


def read_until(proc: subprocess.Popen[str], needle: str, timeout: float) -> list[str]:
    """Lines of the process's stderr up to the first holding ``needle`` (all of them if it exits)."""
    assert proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stderr, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(deadline - time.monotonic()):
                break
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line.rstrip())
            if needle in line:
                break
    return lines
