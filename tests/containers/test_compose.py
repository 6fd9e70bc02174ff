"""docker/compose.yml, brought up by docker-compose (v1) the way an operator does (docs/operations.md,
"Production topology"), with the images of ``Settings.containers`` (CI: the local ones,
``scripts/containers``): identities and TLS made for the run by the authority (``blackboard auth``
as the compose file's header shows), random PostgreSQL passwords (the file ships none), the
healthchecks gating the start-up (setup after the nodes and PostgreSQL are healthy, the workers
after setup exited 0), then: SDK writes and reads, the workers persist (as their restricted role)
and search answers, a NATS node killed loses nothing acknowledged, the worker containers killed
and restarted by their restart policy leave every row exactly once.

The file is used as it is (``-f docker/compose.yml``); ``--project-directory`` points its relative
mounts at the run's directory, which holds what an operator puts in ``docker/`` (the operator's
own files are never touched). No Docker engine or an image missing: the tests fail, never skip.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agents_sdk import Agent
from blackboard.client.connection import connect_nats
from blackboard.devstack import free_port
from blackboard.protocol.errors import BlackboardError, NotFoundError
from blackboard.protocol.subjects import Subjects
from blackboard.security.tls import ensure_dev_certificates
from blackboard.settings import NatsSettings, Settings

pytestmark = [pytest.mark.containers, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker" / "compose.yml"
#: Every project this module starts is named so: a sweep removes what a killed run left.
PROJECT_PREFIX = "bbcompose"
#: The image's user (docker/Dockerfile): it reads the mounted .creds files.
IMAGE_UID = 10001
#: A project's containers older than this are a killed run's (the module's timeout is 900 s).
STALE_AFTER = 1800
LONG_RUNNING = ["nats-1", "nats-2", "nats-3", "postgres", "worker"]


def _docker(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def sweep_projects() -> None:
    """Remove what this module's earlier projects left (a killed run): containers created more
    than :data:`STALE_AFTER` seconds ago (a run still going, another checkout's, is left alone),
    then the networks and volumes nothing uses any more."""
    label = "com.docker.compose.project"
    now = datetime.now(UTC)
    stale = []
    for cid in _docker("ps", "-aq", "--filter", f"label={label}").split():
        project, created = _docker("inspect", "-f", f'{{{{index .Config.Labels "{label}"}}}} {{{{.Created}}}}',
                                   cid).split()
        if project.startswith(PROJECT_PREFIX) and (now - _time(created)).total_seconds() > STALE_AFTER:
            stale.append(cid)
    if stale:
        _docker("rm", "-f", "-v", *stale)
    for kind in ("network", "volume"):
        for name in _docker(kind, "ls", "-q").split():
            if name.startswith(PROJECT_PREFIX):  # in use: refused, and left
                subprocess.run(["docker", kind, "rm", name], capture_output=True, timeout=60)


@dataclass
class Compose:
    """One run of the compose file: its project, directory, environment and published ports."""

    project: str
    directory: Path
    env: dict[str, str]
    nats_port: int
    pg_port: int

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = ["docker-compose", "-f", str(COMPOSE_FILE), "--project-directory", str(self.directory),
               "-p", self.project, "--compatibility", *args]
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)} failed ({done.returncode}):\n"
                                 f"{done.stderr[-3000:]}\n{self.logs()}")
        return done

    def logs(self, tail: int = 40) -> str:
        done = subprocess.run(["docker-compose", "-f", str(COMPOSE_FILE), "--project-directory",
                               str(self.directory), "-p", self.project, "logs", "--no-color",
                               f"--tail={tail}"], env=self.env, capture_output=True, text=True, timeout=60)
        return done.stdout[-12000:]

    def containers(self, service: str) -> list[str]:
        """The ids of ``service``'s containers (stopped ones too)."""
        return self.run("ps", "-a", "-q", service).stdout.split()

    def state(self, container: str) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(_docker("inspect", "-f", "{{json .State}}", container))
        return state

    def restarts(self, container: str) -> int:
        return int(_docker("inspect", "-f", "{{.RestartCount}}", container))

    def container_of(self, server_name: str) -> str:
        (cid,) = self.containers(server_name)
        return cid

    @property
    def pg_dsn(self) -> str:
        """The workers' role, over the port published on loopback."""
        return (f"postgresql://blackboard:{self.env['POSTGRES_APP_PASSWORD']}@127.0.0.1:{self.pg_port}"
                "/blackboard")

    def settings(self, principal: str) -> Settings:
        """Settings of a process on this host connecting as ``principal`` (its .creds file)."""
        auth = self.directory / "nats" / "auth" / "tls"
        return Settings(nats=NatsSettings(url=f"tls://127.0.0.1:{self.nats_port}",
                                          creds_file=self.directory / "creds" / f"{principal}.creds",
                                          tls_ca_file=auth / "ca.pem", write_timeout=60.0))


def _time(stamp: str) -> datetime:
    """A Docker state time (RFC 3339, nanoseconds, trailing zeros trimmed)."""
    day, _, rest = stamp.rstrip("Z").partition("T")
    clock, _, frac = rest.partition(".")
    return datetime.fromisoformat(f"{day}T{clock}.{(frac + '000000')[:6]}+00:00")


def _blackboard(env: dict[str, str], *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "blackboard", *args], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"blackboard {' '.join(args)}: {done.stderr}"


def prepare(directory: Path) -> None:
    """What docs/operations.md has an operator put in docker/ before the first start, made for
    this run: identities from a new authority, its rendered NATS config, TLS, the config and
    the init script (the repository's own files, linked)."""
    authority = directory / "authority"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLACKBOARD_")}
    env["BLACKBOARD_SECURITY__AUTHORITY_DIR"] = str(authority)
    identity, creds, auth_dir = directory / "identity", directory / "creds", directory / "nats" / "auth"
    for d in (identity, creds, auth_dir / "tls", directory / "postgres"):
        d.mkdir(parents=True, exist_ok=True)
    _blackboard(env, "auth", "init")
    _blackboard(env, "auth", "add", "worker", "--kind", "worker", "--out", str(identity / "worker.creds"))
    _blackboard(env, "auth", "add", "operator", "--kind", "operator", "--out", str(identity / "operator.creds"))
    for agent in ("writer", "kv-writer"):
        _blackboard(env, "auth", "add", agent, "--out", str(creds / f"{agent}.creds"))
    shutil.copy(identity / "operator.creds", creds / "operator.creds")
    shutil.copy(authority / "policy.toml", identity / "policy.toml")
    _blackboard(env, "auth", "render", "--out", str(auth_dir / "nats-auth.conf"))
    tls = ensure_dev_certificates(authority / "tls", ["nats-1", "nats-2", "nats-3", "localhost", "127.0.0.1"])
    for src in (tls.ca, tls.cert, tls.key):
        shutil.copy(src, auth_dir / "tls" / src.name)
    for f in identity.glob("*.creds"):
        os.chown(f, IMAGE_UID, -1)
    (directory / "nats" / "nats.conf").symlink_to(ROOT / "docker" / "nats" / "nats.conf")
    (directory / "postgres" / "init-app-role.sh").symlink_to(ROOT / "docker" / "postgres" / "init-app-role.sh")


@pytest.fixture(scope="module")
def compose() -> Iterator[Compose]:
    if os.geteuid() != 0:
        pytest.fail("the compose tests run as root (scripts/containers): the .creds files are given to uid 10001")
    sweep_projects()
    directory = Path(tempfile.mkdtemp(prefix="bb-compose-"))
    images = Settings().containers
    run = Compose(
        project=f"{PROJECT_PREFIX}{secrets.token_hex(3)}", directory=directory,
        env={**{k: v for k, v in os.environ.items() if not k.startswith(("BLACKBOARD_", "POSTGRES_"))},
             "POSTGRES_PASSWORD": secrets.token_hex(16), "POSTGRES_APP_PASSWORD": secrets.token_hex(16),
             "BLACKBOARD_NATS_IMAGE": images.nats_image, "BLACKBOARD_POSTGRES_IMAGE": images.postgres_image,
             "BLACKBOARD_IMAGE": images.worker_image},
        nats_port=free_port(), pg_port=free_port())
    run.env |= {"BLACKBOARD_NATS_PORT": str(run.nats_port), "BLACKBOARD_POSTGRES_PORT": str(run.pg_port)}
    try:
        prepare(directory)
        started = time.monotonic()
        run.run("up", "-d", "--no-build", timeout=600)
        print(f"compose up: {time.monotonic() - started:.1f} s")
        yield run
    finally:
        run.run("down", "-v", "--remove-orphans", "-t", "5", check=False, timeout=300)
        shutil.rmtree(directory, ignore_errors=True)


async def _wait(what: str, timeout: float, check: Any) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.5)


def _rows(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        return conn.execute(query, params).fetchall()


def _count(dsn: str, query: str, *params: Any) -> int:
    try:
        return int(_rows(dsn, query, *params)[0][0])
    except psycopg.OperationalError:
        return -1


async def _get_eventually(board: Any, section: str, key: str, revision: int) -> Any:
    deadline = time.monotonic() + 5
    while True:
        try:
            entry = await board.get(section, key)
            if entry.revision >= revision or time.monotonic() > deadline:
                return entry
        except NotFoundError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


def test_the_healthchecks_gate_the_start_up(compose: Compose) -> None:
    for service in LONG_RUNNING:
        ids = compose.containers(service)
        assert len(ids) == (2 if service == "worker" else 1), (service, ids)
        for cid in ids:
            state = compose.state(cid)
            assert state["Status"] == "running", (service, state)
    (setup,) = compose.containers("setup")
    setup_state = compose.state(setup)
    assert (setup_state["Status"], setup_state["ExitCode"]) == ("exited", 0)
    # setup ran once PostgreSQL and every node were healthy; the workers started after it ended.
    for service in ("nats-1", "nats-2", "nats-3", "postgres"):
        (cid,) = compose.containers(service)
        assert _time(compose.state(cid)["StartedAt"]) < _time(setup_state["StartedAt"]), service
    for cid in compose.containers("worker"):
        assert _time(compose.state(cid)["StartedAt"]) > _time(setup_state["FinishedAt"])

    async def all_healthy() -> bool:
        return all(compose.state(c).get("Health", {}).get("Status") == "healthy"
                   for s in LONG_RUNNING for c in compose.containers(s))

    asyncio.run(_wait("every service healthy", 180, all_healthy))


@pytest.mark.asyncio
async def test_sdk_writes_and_reads_the_workers_persist_and_search_answers(compose: Compose) -> None:
    board_name = f"compose-{secrets.token_hex(3)}"
    async with Agent.connect("writer", settings=compose.settings("writer")) as agent:
        board = agent.board(board_name)
        revision = await board.put("notes", "plan", {"text": "bring the compose stack up"})
        # A direct get of an R3 stream may be answered by a follower that has not applied the
        # write yet (allow_direct: any replica answers): read-your-write is eventual here.
        entry = await _get_eventually(board, "notes", "plan", revision)
        assert (entry.revision, entry.value) == (revision, {"text": "bring the compose stack up"})
        memory = await agent.remember("The harbour crane lifts containers onto the ship at dawn",
                                      board=board_name, id=f"{board_name}-crane", wait="searchable", timeout=180)
        await agent.remember("Bread is baked with flour, water and salt", board=board_name,
                             id=f"{board_name}-bread", wait="searchable", timeout=180)
        hits = await agent.recall("what lifts containers onto a ship", board=board_name, mode="semantic")
        assert hits and hits[0].id == memory
        hits = await agent.recall("harbour crane", board=board_name, mode="keyword")
        assert [h.id for h in hits] == [memory]
    assert _count(compose.pg_dsn, "SELECT count(*) FROM bb_memories WHERE board = %s", board_name) == 2
    assert _count(compose.pg_dsn, "SELECT count(*) FROM bb_entries WHERE board = %s", board_name) == 1
    # The workers connect as their restricted role, never as the superuser.
    (role,) = _rows(compose.pg_dsn, "SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles "
                    "WHERE rolname = current_user")
    assert role == (False, False, False)
    users = {u for (u,) in _rows(compose.pg_dsn, "SELECT DISTINCT usename FROM pg_stat_activity "
                                 "WHERE backend_type = 'client backend' AND usename IS NOT NULL")}
    assert users == {"blackboard"}


async def _write_load(agent: Agent, board_name: str, n: int, acked: dict[str, int], memories: set[str], *,
                      pause: float = 0.0) -> int:
    """Four writers putting entries and memories until ``n`` of each are acknowledged (each
    writer waiting ``pause`` seconds between its writes); returns how many writes the test
    itself sent again (not acknowledged within the write timeout)."""
    board = agent.board(board_name)
    retried = 0

    async def writer(first: int) -> None:
        nonlocal retried
        for i in range(first, n, 4):
            while True:
                try:
                    acked[f"k{i}"] = await board.put("load", f"k{i}", {"i": i})
                    await agent.remember(f"load memory number {i}", board=board_name, id=f"{board_name}-{i}")
                    memories.add(f"{board_name}-{i}")
                    await asyncio.sleep(pause)
                    break
                except BlackboardError:
                    retried += 1
                    await asyncio.sleep(0.2)

    await asyncio.gather(*(writer(w) for w in range(4)))
    return retried


def _exactly_once(compose: Compose, board_name: str, acked: dict[str, int], memories: set[str],
                  retried: int) -> None:
    revs = _rows(compose.pg_dsn, "SELECT key, seq FROM bb_entry_revisions WHERE board = %s", board_name)
    current = dict(_rows(compose.pg_dsn, "SELECT key, revision FROM bb_entries WHERE board = %s", board_name))
    ids = [i for (i,) in _rows(compose.pg_dsn, "SELECT id FROM bb_memories WHERE board = %s", board_name)]
    seqs = [int(s) for _, s in revs]
    assert len(seqs) == len(set(seqs))  # each stream message stored once
    assert {(k, r) for k, r in acked.items()} <= {(str(k), int(s)) for k, s in revs}
    assert {str(k): int(r) for k, r in current.items()} == acked
    assert sorted(ids) == sorted(memories)
    assert len(revs) - len(acked) <= retried  # only a write the test sent again may have two


async def _persisted(compose: Compose, board_name: str, acked: dict[str, int], memories: set[str]) -> None:
    async def done() -> bool:
        return (_count(compose.pg_dsn, "SELECT count(*) FROM bb_entries WHERE board = %s", board_name) >= len(acked)
                and _count(compose.pg_dsn, "SELECT count(*) FROM bb_memories WHERE board = %s", board_name)
                >= len(memories))

    await _wait("the workers to store every acknowledged write", 240, done)


@pytest.mark.asyncio
async def test_a_killed_nats_node_loses_nothing_acknowledged(compose: Compose) -> None:
    board_name = f"nodekill-{secrets.token_hex(3)}"
    settings = compose.settings("kv-writer")
    kv_stream = Subjects(settings.board.bucket).kv_stream
    admin = await connect_nats(compose.settings("operator").nats, name="compose-check")
    js = admin.jetstream(timeout=10)

    async def leader() -> str | None:
        info = await js.stream_info(kv_stream)
        return info.cluster.leader if info.cluster else None

    # This host reaches nats-1 only (the published port): the leader to kill is another node.
    for _ in range(5):
        if await leader() not in (None, "nats-1"):
            break
        await admin.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{kv_stream}", b"", timeout=10)
        await asyncio.sleep(2)
    victim = await leader()
    assert victim in ("nats-2", "nats-3"), victim
    acked: dict[str, int] = {}
    memories: set[str] = set()
    try:
        async with Agent.connect("kv-writer", settings=settings) as agent:
            # Paced (about 80 writes a second): on a fast machine the whole load was done before
            # `docker kill` returned, and the node died after it.
            load = asyncio.create_task(_write_load(agent, board_name, 240, acked, memories, pause=0.05))
            await _wait("a first part of the writes", 120, lambda: _true(len(memories) >= 60))
            _docker("kill", compose.container_of(victim))
            killed_at = len(memories)
            await _wait("writes to go on without the leader", 120,
                        lambda: _true(len(memories) >= killed_at + 60 or load.done()))
            _docker("start", compose.container_of(victim))
            retried = await load
            assert killed_at < 240 - 60  # the node died mid-load
            assert await leader() not in (None, victim)
            # The restarted node may answer a direct get before it caught up (see _get_eventually).
            for key, revision in acked.items():
                assert (await _get_eventually(agent.board(board_name), "load", key, revision)).revision == revision
    finally:
        await admin.close()
    assert len(acked) == len(memories) == 240
    await _persisted(compose, board_name, acked, memories)
    _exactly_once(compose, board_name, acked, memories, retried)

    async def victim_healthy() -> bool:
        return compose.state(compose.container_of(victim)).get("Health", {}).get("Status") == "healthy"

    await _wait(f"{victim} to be healthy again (caught up)", 180, victim_healthy)


async def _true(value: bool) -> bool:
    return value


@pytest.mark.asyncio
async def test_killed_worker_containers_restart_and_store_every_row_exactly_once(compose: Compose) -> None:
    board_name = f"workerkill-{secrets.token_hex(3)}"
    workers = compose.containers("worker")
    before = {c: compose.restarts(c) for c in workers}
    acked: dict[str, int] = {}
    memories: set[str] = set()
    async with Agent.connect("writer", settings=compose.settings("writer")) as agent:
        load = asyncio.create_task(_write_load(agent, board_name, 400, acked, memories))
        await _wait("the workers to be storing the load", 120, lambda: _true(
            _count(compose.pg_dsn, "SELECT count(*) FROM bb_memories WHERE board = %s", board_name) >= 40))
        # A crash (SIGKILL of the main process), not `docker kill`: the restart policy applies.
        for cid in workers:
            os.kill(int(_docker("inspect", "-f", "{{.State.Pid}}", cid)), 9)
        retried = await load
    assert len(acked) == len(memories) == 400

    async def restarted() -> bool:
        return all(compose.restarts(c) > before[c] and compose.state(c)["Status"] == "running" for c in workers)

    await _wait("the killed workers to be restarted", 120, restarted)
    await _persisted(compose, board_name, acked, memories)
    _exactly_once(compose, board_name, acked, memories, retried)

    async def healthy() -> bool:
        return all(compose.state(c).get("Health", {}).get("Status") == "healthy" for c in workers)

    await _wait("the restarted workers to be healthy", 240, healthy)
