"""The production shape: a 3-node JetStream cluster (``docker/nats/nats.conf``), R3 streams.

`blackboard setup` (as the operator, the way the compose file runs it: its
``.creds`` file, the CA, ``tls://`` URLs) waits for the cluster to form, then
creates every asset with three replicas; agents and a worker connected to all
three nodes, each with its own credential, go on through the crash
(``kill -9``) of the node leading the board's stream, and every acknowledged
write is then on the board and in PostgreSQL exactly once.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import nats.errors
import psycopg
import pytest

from agents_sdk import Agent
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.devstack import EmbeddedPostgres, _find_nats_server, _wait_tcp, free_port
from blackboard.protocol.errors import BlackboardError, ConfigurationError, OperationTimeoutError
from blackboard.protocol.subjects import MEMORY_STREAM, MESSAGE_STREAM, VOTE_STREAM, Subjects
from blackboard.settings import NatsSettings, SecuritySettings, Settings
from tests._auth import raw_connect
from tests._cluster import COMPOSE_NATS_CONF, NatsCluster, render_node_config
from tests._worker_helpers import count_rows, spawn_worker, stop_worker, wait_for
from tests.conftest import make_settings

pytestmark = [pytest.mark.slow]



def _cluster_settings(cluster: NatsCluster, dsn: str) -> Settings:
    settings = make_settings(cluster.urls, dsn)
    return settings.model_copy(update={"board": settings.board.model_copy(update={"replicas": 3})})


def _as_operator(settings: Settings, cluster: NatsCluster) -> Settings:
    """``settings`` connecting as the operator (stream administration; agents hold no right to)."""
    return settings.model_copy(update={
        "nats": settings.nats.model_copy(update={"creds_file": cluster.auth.creds("operator")})})


def _setup_env(cluster: NatsCluster, dsn: str, replicas: int | None = 3) -> dict[str, str]:
    """The compose file's setup service: the operator's credential, the CA, every node."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")}
    env.update({"BLACKBOARD_NATS__URL": cluster.urls, "BLACKBOARD_POSTGRES__DSN": dsn,
                "BLACKBOARD_NATS__CREDS_FILE": str(cluster.auth.creds("operator")),
                "BLACKBOARD_NATS__TLS_CA_FILE": str(cluster.auth.tls.ca)})
    if replicas is not None:
        env["BLACKBOARD_BOARD__REPLICAS"] = str(replicas)
    return env


def _setup(cluster: NatsCluster, dsn: str, replicas: int | None = 3) -> subprocess.CompletedProcess[str]:
    """``blackboard setup`` as the compose file runs it (R3; ``None``: the setting left out), to its end."""
    return subprocess.run([sys.executable, "-m", "blackboard", "setup"], env=_setup_env(cluster, dsn, replicas),
                          capture_output=True, text=True, timeout=120)


def _setup_process(cluster: NatsCluster, dsn: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "blackboard", "setup"], env=_setup_env(cluster, dsn),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def _replicas(settings: Settings) -> list[int]:
    """Replicas of the KV bucket, the three streams and the object store, in that order
    (each with a leader and its followers in place)."""
    nc = await connect_nats(settings.nats, name="check")
    counts: list[int] = []
    try:
        js = nc.jetstream()
        for name in [Subjects(settings.board.bucket).kv_stream, MEMORY_STREAM, MESSAGE_STREAM, VOTE_STREAM,
                     Subjects.objects_stream(settings.board.objects_bucket)]:
            deadline = time.monotonic() + 30
            while True:
                info = await js.stream_info(name)
                want = info.config.num_replicas or 1
                have = 1 + len(info.cluster.replicas or []) if info.cluster and info.cluster.leader else 0
                if have == want:
                    break
                assert time.monotonic() < deadline, f"{name}: {have} of {want} replicas in place"
                await asyncio.sleep(0.2)
            counts.append(want)
    finally:
        await nc.close()
    return counts


def test_render_follows_the_compose_config(tmp_path: Path) -> None:
    text = render_node_config(COMPOSE_NATS_CONF.read_text(), index=1, client_ports=[1, 2, 3],
                              route_ports=[4, 5, 6], store_dir=tmp_path, auth_dir=tmp_path / "auth")
    assert "listen: 127.0.0.1:2\n" in text and "  listen: 127.0.0.1:5\n" in text
    assert [f"nats-route://127.0.0.1:{p}" in text for p in (4, 5, 6)] == [True] * 3
    assert "sync_interval: always" in text and "server_name: $SERVER_NAME" in text
    assert "nats-route://nats-" not in text and "http:" not in text
    # The authorization is the compose file's own: its include, its TLS (the files moved).
    assert '\ninclude "auth/nats-auth.conf"\n' in text
    assert f'cert_file: "{tmp_path / "auth" / "tls" / "server.pem"}"' in text
    assert f'key_file: "{tmp_path / "auth" / "tls" / "server-key.pem"}"' in text
    assert "/etc/nats/auth/tls" not in text
    with pytest.raises(ValueError, match="no line matching"):
        render_node_config("port: 4333\n", index=0, client_ports=[1], route_ports=[2], store_dir=tmp_path,
                           auth_dir=tmp_path)


def test_the_compose_file_runs_nats_and_the_blackboard_processes_with_identities() -> None:
    """What the cluster tests cannot run, read as text (no Docker engine here): every node
    mounts the authority's directory where the config includes it; setup runs as the operator
    and the workers as the worker, with TLS URLs, the CA and (workers) the policy mounted."""
    text = (COMPOSE_NATS_CONF.parent.parent / "compose.yml").read_text()
    assert text.count('"./nats/auth:/etc/nats/auth:ro"') == 3
    assert COMPOSE_NATS_CONF.parent.name == "nats" and "./nats/nats.conf:/etc/nats/nats.conf:ro" in text
    assert re.findall(r"^\s*BLACKBOARD_NATS__URL: (.+)$", text, flags=re.MULTILINE) == [
        "tls://nats-1:4222,tls://nats-2:4222,tls://nats-3:4222"]
    assert re.findall(r"^\s*BLACKBOARD_NATS__CREDS_FILE: (.+)$", text, flags=re.MULTILINE) == [
        "/etc/blackboard/operator.creds", "/etc/blackboard/worker.creds"]
    for mount in ("./identity/operator.creds:/etc/blackboard/operator.creds:ro",
                  "./identity/worker.creds:/etc/blackboard/worker.creds:ro",
                  "./identity/policy.toml:/etc/blackboard/policy.toml:ro",
                  "./nats/auth/tls/ca.pem:/etc/blackboard/ca.pem:ro"):
        assert f"- {mount}\n" in text, mount
    assert "BLACKBOARD_NATS__TLS_CA_FILE: /etc/blackboard/ca.pem\n" in text
    assert "BLACKBOARD_SECURITY__POLICY_FILE: /etc/blackboard/policy.toml\n" in text
    assert "6222:" not in text  # the routes (no credential, no TLS) are published nowhere
    ignored = (COMPOSE_NATS_CONF.parent / "auth" / ".gitignore").read_text().splitlines()
    assert "*" in ignored  # the operator's files are never committed


@pytest.mark.cluster
@pytest.mark.asyncio
async def test_setup_waits_for_the_cluster_then_creates_every_asset_with_three_replicas(
        cluster: NatsCluster, postgres_factory: Callable[[], EmbeddedPostgres]) -> None:
    pg = postgres_factory()
    settings = _cluster_settings(cluster, pg.dsn)
    # A new cluster elects its JetStream meta leader once every node has met
    # the others: with two of three up, every JetStream request fails.
    cluster.start(0)
    cluster.start(1)
    setup = _setup_process(cluster, pg.dsn)
    await asyncio.sleep(2.0)
    assert setup.poll() is None  # still waiting for the third node
    cluster.start(2)
    _, err = setup.communicate(timeout=120)
    assert setup.returncode == 0, err
    assert "JetStream not ready" in err
    again = _setup(cluster, pg.dsn)  # idempotent
    assert again.returncode == 0, again.stderr
    assert "JetStream not ready" not in again.stderr
    assert await _replicas(settings) == [3] * 5
    # Run without the replicas setting (default 1): nothing loses its copies.
    default = _setup(cluster, pg.dsn, replicas=None)
    assert default.returncode == 0, default.stderr
    assert f"stream {MEMORY_STREAM} has 3 replicas and the settings ask for 1: kept at 3" in default.stderr
    assert await _replicas(settings) == [3] * 5


@pytest.mark.cluster
@pytest.mark.asyncio
async def test_setup_raises_the_replicas_of_existing_assets(
        cluster: NatsCluster, postgres_factory: Callable[[], EmbeddedPostgres]) -> None:
    pg = postgres_factory()
    settings = _cluster_settings(cluster, pg.dsn)
    cluster.start()
    single = _as_operator(settings, cluster)
    single = single.model_copy(update={"board": settings.board.model_copy(update={"replicas": 1})})
    nc = await connect_nats(single.nats, name="r1")
    try:
        await ensure_streams(nc.jetstream(), single)
    finally:
        await nc.close()
    assert await _replicas(settings) == [1] * 5
    done = _setup(cluster, pg.dsn)
    assert done.returncode == 0, done.stderr
    assert await _replicas(settings) == [3] * 5


@pytest.mark.cluster
@pytest.mark.asyncio
async def test_the_compose_cluster_enforces_the_authority(cluster: NatsCluster, unique: str) -> None:
    """Every node runs the authority's operator config and TLS; routes work in operator mode
    (they carry no user credential): a topic message crosses from one node to another."""
    cluster.start()
    for i in range(cluster.size):
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await raw_connect(cluster.url(i), cluster.auth, principal=None)
    violations: list[str] = []

    async def record(exc: Exception) -> None:
        violations.append(str(exc))

    subject = Subjects.topic(f"cluster.{unique}", pattern=False)
    listener = await raw_connect(cluster.url(2), cluster.auth, principal=f"listener{unique}")
    speaker = await raw_connect(cluster.url(0), cluster.auth, principal=f"speaker{unique}", error_cb=record)
    try:
        sub = await listener.subscribe(subject)
        await listener.flush()
        deadline = time.monotonic() + 10
        got = None
        while got is None:  # until the interest has crossed the route
            await speaker.publish(subject, b"hello")
            try:
                got = await sub.next_msg(timeout=0.2)
            except nats.errors.TimeoutError:
                assert time.monotonic() < deadline, "no message crossed the route"
        assert got.data == b"hello"
        # An agent administers no stream, on any node.
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await speaker.request(f"$JS.API.STREAM.DELETE.{VOTE_STREAM}", b"", timeout=1)
        refused = f'permissions violation for publish to "$js.api.stream.delete.{VOTE_STREAM.lower()}"'
        await wait_for(lambda: any(refused in v.lower() for v in violations), 5, "the server's refusal")
    finally:
        await speaker.close()
        await listener.close()


@pytest.fixture
def plain_nats(stack_dir: Path) -> Iterator[str]:
    """The URL of a nats-server without JetStream (and without authorization: an open bus)."""
    port = free_port()
    log = stack_dir / f"nojs-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([_find_nats_server(), "-a", "127.0.0.1", "-p", str(port)], stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        _wait_tcp("127.0.0.1", port, proc, 20.0, "nats-server", log)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.asyncio
async def test_a_server_without_jetstream_is_a_configuration_error(plain_nats: str, tmp_path: Path) -> None:
    # An agent makes the JetStream assets only on an open bus (with a credential it holds
    # no right to: `blackboard setup` and the worker do, through the same ensure_streams).
    settings = make_settings(plain_nats, nats=NatsSettings(url=plain_nats, insecure_open_bus=True),
                             security=SecuritySettings())
    settings = settings.model_copy(update={"dev": settings.dev.model_copy(update={"data_dir": tmp_path})})
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match=re.escape(f"no JetStream at {plain_nats}")):
        async with Agent.connect("nojs", settings=settings):
            pass
    assert time.monotonic() - started < 10


@pytest.mark.cluster
@pytest.mark.asyncio
async def test_streams_not_placeable_in_time_raise_a_timeout(cluster: NatsCluster, unique: str) -> None:
    cluster.start(0)
    cluster.start(1)
    settings = _as_operator(_cluster_settings(cluster, "postgresql://unused@127.0.0.1:1/x"), cluster)
    settings = settings.model_copy(update={"board": settings.board.model_copy(update={"bucket": unique})})
    nc = await connect_nats(settings.nats, name="check")
    try:
        started = time.monotonic()
        with pytest.raises(OperationTimeoutError, match="JetStream not ready after 1s"):
            await ensure_streams(nc.jetstream(timeout=0.5), settings, ready_timeout=1.0)
        assert time.monotonic() - started < 5
    finally:
        await nc.close()


@pytest.mark.cluster
@pytest.mark.asyncio
async def test_leader_crash_loses_no_acknowledged_write(
        cluster: NatsCluster, postgres_factory: Callable[[], EmbeddedPostgres], unique: str) -> None:
    pg = postgres_factory()
    settings = _cluster_settings(cluster, pg.dsn)
    cluster.start()
    assert _setup(cluster, pg.dsn).returncode == 0
    kv_stream = Subjects(settings.board.bucket).kv_stream
    worker = spawn_worker(settings, "cw", BOARD__REPLICAS="3", WORKER__BATCH_SIZE="100",
                          NATS__CREDS_FILE=str(cluster.auth.creds("worker")),
                          NATS__TLS_CA_FILE=str(cluster.auth.tls.ca))
    acked: dict[str, int] = {}  # key -> revision
    memories: set[str] = set()
    retried = 0
    try:
        async with Agent.connect("writer", settings=settings) as agent:
            board = agent.board(unique)

            async def write(i: int) -> None:
                nonlocal retried
                while True:
                    try:
                        acked[f"k{i}"] = await board.put("s", f"k{i}", {"i": i, "text": f"value {i}"})
                        await agent.remember(f"memory number {i}", board=unique, id=f"{unique}-{i}")
                        memories.add(f"{unique}-{i}")
                        return
                    except BlackboardError:  # not acknowledged (no leader for too long): again
                        retried += 1
                        await asyncio.sleep(0.2)

            async def writer(first: int, step: int, n: int) -> None:
                for i in range(first, n, step):
                    await write(i)

            # Four writers, so that writes are in flight when the leader dies.
            writers = [asyncio.create_task(writer(w, 4, 600)) for w in range(4)]
            await wait_for(lambda: len(memories) >= 150, 60, "a first part of the writes")
            nc = await connect_nats(settings.nats, name="check")
            js = nc.jetstream(timeout=10)
            leader = (await js.stream_info(kv_stream)).cluster.leader  # type: ignore[union-attr]
            assert leader is not None
            cluster.kill(cluster.index_of(leader))
            killed_at = len(memories)
            await wait_for(lambda: len(memories) >= killed_at + 150, 90, "writes to go on without the leader")
            cluster.start(cluster.index_of(leader))
            await asyncio.gather(*writers)
            assert killed_at < 600 - 150  # the crash happened mid-load
            # The new leader is another node; the restarted one catches up.
            info = await js.stream_info(kv_stream)
            assert info.cluster is not None and info.cluster.leader not in (None, leader)

            async def caught_up() -> bool:
                c = (await js.stream_info(kv_stream)).cluster
                return c is not None and all(r.current and not r.lag for r in c.replicas or [])

            deadline = time.monotonic() + 60
            while not await caught_up():
                assert time.monotonic() < deadline, "the restarted node did not catch up"
                await asyncio.sleep(0.2)
            await nc.close()
            # Every acknowledged write is on the board at its revision.
            for key, revision in acked.items():
                entry = await board.get("s", key)
                assert entry.revision == revision
        q = "SELECT count(*) FROM bb_entry_revisions WHERE board = %s"
        await wait_for(lambda: count_rows(pg.dsn, q, unique) >= len(acked) and
                       count_rows(pg.dsn, "SELECT count(*) FROM bb_memories WHERE board = %s", unique)
                       >= len(memories), 120, "the worker to store every write")
    finally:
        stop_worker(worker)
    with psycopg.connect(pg.dsn) as conn:
        revs = conn.execute("SELECT key, seq FROM bb_entry_revisions WHERE board = %s", (unique,)).fetchall()
        ids = [r[0] for r in conn.execute("SELECT id FROM bb_memories WHERE board = %s", (unique,))]
        current: dict[str, int] = dict(
            conn.execute("SELECT key, revision FROM bb_entries WHERE board = %s", (unique,)).fetchall())
    seqs = [int(s) for _, s in revs]
    assert len(seqs) == len(set(seqs))  # exactly once
    assert {(k, r) for k, r in acked.items()} <= {(str(k), int(s)) for k, s in revs}
    assert current == acked
    assert set(ids) == memories and len(ids) == len(memories)
    assert len(acked) == 600
    # The SDK's own re-sends across the failover carry their first Msg-Id: no
    # duplicate revision (only a write this test retried may have two).
    assert len(revs) - len(acked) <= retried
