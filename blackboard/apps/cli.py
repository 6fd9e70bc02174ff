"""The ``blackboard`` command line.

``blackboard dev``      embedded nats-server + PostgreSQL + worker, one command
``blackboard worker``   persistence worker (run several to scale out)
``blackboard migrate``  apply the SQL migrations
``blackboard setup``    create the JetStream assets and apply migrations
``blackboard reindex``  re-embed everything with the configured model
``blackboard ingest``   load text/markdown files as knowledge memories
``blackboard prune``    archive (or delete) the long-term memories least worth keeping; ``restore`` them
``blackboard auth``     identities: init, add, list, revoke, show, render, publish (docs/security.md)
``blackboard mcp``      the MCP server for MCP hosts: stdio, or HTTP with per-client tokens (docs/mcp.md)
``blackboard inspect``  a read-only web page on the boards, votes, messages and search, as one identity
                        (docs/inspector.md)
``blackboard get|put|ls|history|watch|search|recall|send|inbox|status``
                        the board, messages and the deployment for people (docs/cli.md)

Every option can also come from the environment (``BLACKBOARD_*``, see
``docs/configuration.md``); command-line flags win.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from blackboard.apps.people import add_people_commands
from blackboard.apps.prune import add_prune_commands
from blackboard.apps.signals import stop_on_signal
from blackboard.protocol.errors import (
    AuthenticationError,
    BlackboardError,
    ConfigurationError,
    TransportError,
)
from blackboard.settings import Settings, describe_errors

if TYPE_CHECKING:
    from blackboard.client.keys import PublishedRegistry
    from blackboard.security.authority import Authority
    from blackboard.security.tls import TlsFiles

__all__ = ["main"]

log = logging.getLogger("blackboard.apps.cli")


def _settings(overrides: dict[str, dict[str, Any]]) -> Settings:
    """The environment's settings with the command line's values over them, validated as one
    (a flag is checked as its environment variable would be, before anything starts).

    Raises:
        ConfigurationError: a setting is invalid (each named, with its variable).
    """
    given: dict[str, Any] = {group: values for group, values in overrides.items() if values}
    try:
        return Settings(**given)
    except ValidationError as exc:
        raise ConfigurationError(describe_errors(exc)) from exc


def _given(**values: Any) -> dict[str, Any]:
    """The flags given on the command line (a flag left out is None)."""
    return {name: value for name, value in values.items() if value is not None}


def _settings_from(args: argparse.Namespace, **worker: Any) -> Settings:
    return _settings({
        "nats": _given(url=getattr(args, "nats_url", None) or None),
        "postgres": _given(dsn=getattr(args, "postgres_dsn", None) or None),
        "worker": _given(**worker),
    })


def _check_host(host: str) -> None:
    """Refuse a ``--host`` this machine cannot listen on, before any server starts.

    Raises:
        ConfigurationError: not an address of this machine, or a name that does not resolve.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, 0))
        except OSError as exc:
            raise ConfigurationError(
                f"cannot listen on {host!r} (--host, BLACKBOARD_DEV__HOST): {exc.strerror or exc}; "
                "give an address of this machine, such as 127.0.0.1 or 0.0.0.0") from exc


def _add_conn_flags(p: argparse.ArgumentParser, *, nats: bool = True, pg: bool = True) -> None:
    if nats:
        p.add_argument("--nats-url", help="NATS server URL(s), comma-separated (env BLACKBOARD_NATS__URL)")
    if pg:
        p.add_argument("--postgres-dsn", help="PostgreSQL DSN (env BLACKBOARD_POSTGRES__DSN)")


# --------------------------------------------------------------------------- dev
_OPEN_BUS_BANNER = """
  ********************************************************************
  *  INSECURE OPEN BUS (--insecure-open-bus): NO AUTHORIZATION.       *
  *  Any process that reaches this NATS port can act as any agent,   *
  *  read every board and message, cast any vote and erase data.     *
  *  For a laptop experiment only; never for a shared machine.       *
  ********************************************************************"""


@dataclass(frozen=True)
class _DevIdentities:
    config: Path
    creds_dir: Path
    policy: Path
    tls: TlsFiles
    issued: list[str]
    authority: Authority


def _dev_identities(settings: Settings, data_dir: Path, host: str, agents: list[str]) -> _DevIdentities:
    """The dev stack's authority under ``<data_dir>/auth``: keys and policy (made once), the
    agents named with ``--agent`` declared, credentials issued to the worker, the operator and
    every agent the policy names exactly, TLS certificates, and the server's config."""
    from blackboard.security.authority import Authority, LocalAuth

    dev_settings = settings.model_copy(update={"security": settings.security.model_copy(
        update={"authority_dir": settings.security.authority_dir or data_dir / "auth"})})
    authority = Authority.from_settings(dev_settings)
    authority.init()
    for name in agents:
        authority.declare(name, roles=["member"])
    policy = authority.policy()
    # Every exact id of the policy, and every --agent name (one a glob declares already, such as
    # the example team's team-*, is not appended to the policy, but asked for all the same).
    exact = [name for _kind, name in policy.principals() if not any(c in name for c in "*?[")]
    issued = [*exact, *(name for name in dict.fromkeys(agents) if name not in exact)]
    local = LocalAuth.prepare(authority, principals=issued, host=host)
    # Clients that find their credential in this directory trust this CA (docs/security.md).
    (authority.creds_dir / "ca.pem").write_bytes(local.tls.ca.read_bytes())
    return _DevIdentities(local.config, authority.creds_dir, authority.policy_file, local.tls, issued, authority)


async def _dev(args: argparse.Namespace) -> int:
    from pydantic import SecretStr

    from blackboard.client.connection import connect_nats
    from blackboard.client.keys import publish_registry
    from blackboard.client.streams import ensure_streams
    from blackboard.devstack import EmbeddedNats, EmbeddedPostgres

    settings = _settings({
        "nats": _given(sync_interval=args.sync_interval or None),
        "dev": _given(data_dir=args.data_dir or None, host=args.host or None, nats_port=args.nats_port,
                      pg_port=args.pg_port),
    })
    dev = settings.dev
    data_dir = dev.data_dir.resolve()
    host = dev.host
    nats_port = dev.nats_port
    pg_port = dev.pg_port
    sync = settings.nats.sync_interval
    _check_host(host)
    data_dir.mkdir(parents=True, exist_ok=True)

    open_bus = bool(args.insecure_open_bus or settings.nats.insecure_open_bus)
    secured = None if open_bus else _dev_identities(settings, data_dir, host, args.agent or [])
    nats_server = EmbeddedNats(data_dir / "nats", host=host, port=nats_port, sync_interval=sync,
                               auth_config=secured.config if secured else None,
                               tls=secured.tls if secured else None)
    pg_server = EmbeddedPostgres(data_dir / "postgres", host=host, port=pg_port,
                                 shared_buffers=dev.pg_shared_buffers)
    print(f"blackboard dev: data in {data_dir}", flush=True)
    if open_bus:
        print(_OPEN_BUS_BANNER, flush=True)
    await asyncio.to_thread(nats_server.start)
    try:
        auth_note = "authorization on, TLS" if secured else "NO AUTHORIZATION, NO TLS"
        print(f"  nats-server   {nats_server.url}  (JetStream, sync_interval={sync}; {auth_note})", flush=True)
        if secured:
            print(f"  identities    {secured.creds_dir}  ({', '.join(secured.issued)}; "
                  f"policy {secured.policy})", flush=True)
        if not args.no_postgres:
            await asyncio.to_thread(pg_server.start)
            print(f"  postgres      {pg_server.dsn}  (PostgreSQL 18 + pgvector, "
                  f"shared_buffers={pg_server.shared_buffers})", flush=True)
        nats_update: dict[str, Any] = {"url": nats_server.url, "insecure_open_bus": open_bus}
        if secured:
            nats_update |= {"credentials_dir": secured.creds_dir, "tls_ca_file": secured.tls.ca}
        settings = settings.model_copy(update={
            "nats": settings.nats.model_copy(update=nats_update),
            "postgres": settings.postgres.model_copy(update={"dsn": SecretStr(pg_server.dsn)}),
            "security": settings.security.model_copy(
                update={"policy_file": secured.policy} if secured else {}),
            # The worker's metrics and health endpoints on a free port, like the servers, unless
            # observability.http_port is set: two dev stacks on one machine do not collide.
            "observability": settings.observability if "http_port" in settings.observability.model_fields_set
            else settings.observability.model_copy(update={"http_port": 0}),
        })
        admin = settings.nats.model_copy(update={"creds_file": secured.creds_dir / "operator.creds"}) \
            if secured else settings.nats
        nc = await connect_nats(admin, name="blackboard-dev")
        try:
            await ensure_streams(nc.jetstream(), settings, update=True)
            # The key registry: every issued identity's certificate and the revocations, so
            # readers verify the records of identities that did not connect since a restart.
            registry = await publish_registry(nc, secured.authority, timeout=settings.nats.request_timeout) \
                if secured else None
        finally:
            await nc.close()
        print("  streams       ready (KV bucket, memory, messages, votes, key registry, objects)", flush=True)
        if registry is not None:
            print(f"  key registry  {_registry_summary(registry)}", flush=True)
        runner: Callable[[Settings, asyncio.Event, asyncio.Event], Coroutine[Any, Any, None]] | None = None
        if not args.no_postgres:
            from blackboard.db import migrate

            applied = await migrate(settings)
            print(f"  migrations    up to date ({len(applied)} applied now)", flush=True)
            if not args.no_worker and dev.run_worker:
                runner = _worker_runner()
        print("\nConnect agents with:", flush=True)
        print(f"  export BLACKBOARD_NATS__URL={nats_server.url}", flush=True)
        if secured:
            print(f"  export BLACKBOARD_NATS__CREDENTIALS_DIR={secured.creds_dir}", flush=True)
            print("  (from this directory the SDK finds them itself; more agents: "
                  "blackboard dev --agent NAME, or blackboard auth add NAME)", flush=True)
        else:
            print("  export BLACKBOARD_NATS__INSECURE_OPEN_BUS=true", flush=True)
        if not args.no_postgres:
            print(f"  export BLACKBOARD_POSTGRES__DSN={pg_server.dsn}", flush=True)
        print("Press Ctrl-C to stop.\n", flush=True)
        stop = asyncio.Event()
        worker_task: asyncio.Task[None] | None = None
        if runner is not None:
            ready = asyncio.Event()
            worker_settings = settings.model_copy(update={"nats": settings.nats.model_copy(
                update={"creds_file": secured.creds_dir / "worker.creds"})}) if secured else settings
            worker_task = asyncio.create_task(runner(worker_settings, ready, stop))
            done, _ = await asyncio.wait({worker_task, asyncio.create_task(ready.wait())},
                                         return_when=asyncio.FIRST_COMPLETED)
            if worker_task in done:
                worker_task.result()
        signalled = stop_on_signal()
        if worker_task is not None:
            print("  worker        running (persistence, embeddings, search, deadlines)", flush=True)
        await signalled.wait()
        print("\nblackboard dev: shutting down...", flush=True)
        stop.set()
        if worker_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(worker_task, 15)
    finally:
        await asyncio.to_thread(pg_server.stop)
        await asyncio.to_thread(nats_server.stop)
    print("blackboard dev: stopped; data kept in", data_dir, flush=True)
    return 0


def _worker_runner() -> Callable[[Settings, asyncio.Event, asyncio.Event], Coroutine[Any, Any, None]]:
    from blackboard.worker import run_worker

    async def run(settings: Settings, ready: asyncio.Event, stop: asyncio.Event) -> None:
        await run_worker(settings, ready=ready, stop=stop)

    return run


# ------------------------------------------------------------------------ worker
async def _worker(args: argparse.Namespace) -> int:
    settings = _settings_from(args, name=args.name or None, group=args.group or None,
                              embed=False if args.no_embed else None)
    stop = asyncio.Event()
    ready = asyncio.Event()
    signalled = stop_on_signal()
    task = asyncio.create_task(_worker_runner()(settings, ready, stop))
    sig = asyncio.create_task(signalled.wait())
    done, _ = await asyncio.wait({task, sig}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()
        return 0
    stop.set()
    await asyncio.wait_for(task, 30)
    return 0


async def _migrate(args: argparse.Namespace) -> int:
    from blackboard.db import migrate

    applied = await migrate(_settings_from(args))
    if applied:
        for name in applied:
            print(f"applied {name}")
    else:
        print("database is up to date")
    return 0


async def _setup(args: argparse.Namespace) -> int:
    from blackboard.client.connection import check_nats_url, connect_nats
    from blackboard.client.streams import ensure_streams
    from blackboard.security.credentials import OPERATOR_PRINCIPAL, find_system_credentials

    settings = _settings_from(args)
    check_nats_url(settings.nats.url)  # a malformed URL is told before a missing credential
    # As the operator (nats.creds_file, else the operator's credential): agents may create no stream.
    found = find_system_credentials(OPERATOR_PRINCIPAL, settings, process="blackboard setup")
    nc = await connect_nats(settings.nats, name="blackboard-setup", credentials=found)
    try:
        await ensure_streams(nc.jetstream(), settings, update=True)
    finally:
        await nc.close()
    print(f"JetStream assets ready on {settings.nats.url}")
    if not args.no_migrate:
        return await _migrate(args)
    return 0


async def _reindex(args: argparse.Namespace) -> int:
    from blackboard.worker.reindex import reindex

    settings = _settings_from(args)
    await reindex(settings, progress=_progress(args, settings))
    return 0


def _knowledge_token_limits(settings: Settings) -> dict[str, Any]:
    """How ``blackboard ingest`` bounds chunks by the embedding model's tokens: for the local
    model, its window (:data:`~blackboard.embeddings.local.LOCAL_MAX_TOKENS`), its tokenizer's
    counter and the tokens of the metadata lines the worker embeds before a memory's text
    (:func:`~blackboard.worker.embed_text.memory_embed_lines`); for an API model, nothing
    (characters only: 1,200 characters are far below such models' windows).

    Returns:
        ``max_tokens``, ``count_tokens`` and ``metadata_tokens`` for
        :func:`agents_sdk.memory.knowledge.ingest_files`.
    """
    if settings.embedding.provider != "local":
        return {}
    from agents_sdk.memory.knowledge import estimate_tokens
    from agents_sdk.memory.prompt import TokenCounter
    from blackboard.embeddings.local import LOCAL_MAX_TOKENS, count_tokens
    from blackboard.protocol.errors import EmbeddingModelUnavailableError
    from blackboard.worker.embed_text import memory_embed_lines

    counter: TokenCounter = count_tokens
    try:
        count_tokens("")
    except EmbeddingModelUnavailableError:  # no tokenizers package here: the cautious estimate
        counter = estimate_tokens

    def metadata_tokens(metadata: Mapping[str, Any]) -> int:
        lines = memory_embed_lines(metadata)
        return counter(lines) - 2 if lines else 0  # ([CLS] and [SEP] are the text's)

    return {"max_tokens": LOCAL_MAX_TOKENS, "count_tokens": counter, "metadata_tokens": metadata_tokens}


async def _ingest(args: argparse.Namespace) -> int:
    from agents_sdk.memory.knowledge import ingest_paths

    settings = _settings_from(args)
    report = await ingest_paths(settings, [Path(p) for p in args.paths], board=args.board,
                                agent_id=args.agent, chunk_size=args.chunk_size, overlap=args.overlap,
                                progress=_progress(args, settings), **_knowledge_token_limits(settings))
    print(report)
    return 0


# -------------------------------------------------------------------------- auth
def _authority(args: argparse.Namespace) -> tuple[Authority, Settings]:
    from blackboard.security.authority import Authority

    settings = _settings({"security": _given(authority_dir=args.dir or None),
                          "dev": _given(data_dir=getattr(args, "data_dir", None) or None),
                          "nats": _given(url=getattr(args, "nats_url", None) or None)})
    return Authority.from_settings(settings), settings


def _names(principals: list[str]) -> str:
    return ", ".join(principals) if principals else "none"


def _registry_summary(result: PublishedRegistry) -> str:
    """One line on what :func:`~blackboard.client.keys.publish_registry` did."""
    text = (f"certificates published: {_names(result.published)}; already there: {_names(result.unchanged)}; "
            f"revocations record {'published' if result.revocations else 'unchanged'}")
    if result.missing:
        text += (f"; no credential file here for {_names(result.missing)} (each publishes its own "
                 "certificate when it connects)")
    return text


def _request_errors() -> tuple[type[BaseException], ...]:
    """What publishing the key registry may fail with besides our errors (the request layer's)."""
    import nats.errors

    return nats.errors.Error, TimeoutError, OSError


#: Seconds a publish right after a config reload retries a refused credential: nats-server
#: applies a reload asynchronously, and a connection in the middle of it may be refused.
RELOAD_GRACE = 5.0


async def _publish_keys(authority: Authority, settings: Settings, process: str, *,
                        reloaded: bool = False) -> PublishedRegistry:
    """Connect as an operator (``nats.creds_file``, else the operator's credential, as
    ``blackboard setup`` does) and publish the key registry: every active identity's
    certificate and the revocations record. ``reloaded``: the server was just told to reload
    its config, so a refused credential is retried for :data:`RELOAD_GRACE` seconds.

    Raises:
        ConfigurationError: an open bus (nothing is signed there: no registry).
        AuthenticationError, NotConnectedError, PermissionDeniedError, nats errors: as connecting
            and publishing raise.
    """
    import nats.errors

    from blackboard.client.connection import connect_nats
    from blackboard.client.keys import publish_registry
    from blackboard.security.credentials import OPERATOR_PRINCIPAL, find_system_credentials

    found = find_system_credentials(OPERATOR_PRINCIPAL, settings, process=process)
    if found is None:
        raise ConfigurationError("no key registry on an insecure open bus: nothing is signed there")
    deadline = time.monotonic() + (RELOAD_GRACE if reloaded else 0.0)
    while True:
        try:
            nc = await connect_nats(settings, name="blackboard-auth", credentials=found)
            break
        except AuthenticationError:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.2)
    try:
        return await publish_registry(nc, authority, timeout=settings.nats.request_timeout)
    except nats.errors.NoRespondersError as exc:
        raise ConfigurationError(f"no key registry stream (BB_KEYS) on {settings.nats.url}: "
                                 "create the streams first (blackboard setup)") from exc
    finally:
        await nc.close()


def _is_nats_server(pid: int) -> bool:
    """Whether process ``pid`` runs nats-server (``/proc``, else ``ps``)."""
    import subprocess

    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        try:
            command = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True,
                                     timeout=5, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            return False
    return b"nats-server" in command


def _reload_dev_server(settings: Settings) -> str:
    """Ask a running ``blackboard dev`` nats-server to reload its config; say what happened."""
    pid_file = settings.dev.data_dir / "nats" / "nats.pid"
    try:
        pid = int(pid_file.read_text().strip())
        # The pid file outlives the server: signal the process only if it is a nats-server
        # (SIGHUP would end another process that got the pid since).
        if not _is_nats_server(pid):
            raise ProcessLookupError(pid)
        os.kill(pid, signal.SIGHUP)
    except (OSError, ValueError):
        return ("reload the NATS server's config for it to take effect "
                "(nats-server --signal reload, or SIGHUP to its process)")
    return f"the dev nats-server (pid {pid}) reloaded its config"


async def _auth(args: argparse.Namespace) -> int:
    authority, settings = _authority(args)
    cmd = args.auth_command
    if cmd == "init":
        made = authority.init()
        print(f"identity authority in {authority.directory} ({'made' if made else 'already there'})")
        print(f"  policy        {authority.policy_file}  (edit it; docs/security.md)")
        print(f"  signing keys  {authority.directory / 'keys'}  (secrets: keep them off the servers)")
        print("next: blackboard auth add <agent-id>; blackboard auth render --out <server include file>")
        return 0
    if not authority.initialized:
        raise ConfigurationError(f"no identity authority in {authority.directory}: run `blackboard auth init` "
                                 "(or `blackboard dev`, which makes one) first")
    if getattr(args, "id", None) is not None:  # a malformed id is a usage error, like an unknown role
        from blackboard.protocol.errors import InvalidKeyError
        from blackboard.protocol.subjects import validate_name

        try:
            validate_name(args.id, "a principal id")
        except InvalidKeyError as exc:
            raise ConfigurationError(str(exc)) from None
    if cmd == "add":
        if authority.declare(args.id, kind=args.kind,
                             roles=args.role or (["member"] if args.kind == "agent" else None)):
            print(f"declared {args.kind} {args.id!r} in {authority.policy_file}")
        creds, reissued = authority.issue(args.id)
        path = authority.credentials_path(args.id)
        if args.out:
            from blackboard.security.files import write_private

            path = Path(args.out)
            write_private(path, creds.render())
        print(f"issued {args.id!r}: {path}  (public key {creds.public_key})")
        if reissued:
            print(f"its earlier key is revoked: {_reload_dev_server(settings)}; "
                  "publish the revocation to readers with `blackboard auth publish`")
        return 0
    if cmd == "list":
        policy = authority.policy()
        rows = authority.identities()
        print(f"{'principal':<28} {'kind':<9} {'status':<8} {'issued (UTC)':<20} public key")
        for ident in rows:
            issued = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ident.issued_at))
            status = "active" if ident.active else "revoked"
            print(f"{ident.principal:<28} {ident.kind:<9} {status:<8} {issued:<20} {ident.public_key}")
        declared = [f"{k}:{n}" for k, n in policy.principals()
                    if not any(i.principal == n and i.active for i in rows)]
        if declared:
            print("declared in the policy, no active credential: " + ", ".join(declared))
        return 0
    if cmd == "revoke":
        if not args.no_publish:
            from blackboard.client.connection import check_nats_url

            check_nats_url(settings.nats.url)  # a malformed URL is a usage error, before anything changes
        revoked = authority.revoke(args.id)
        if not revoked:
            print(f"{args.id!r} holds no active credential")
            return 1
        reload = _reload_dev_server(settings)
        print(f"revoked {len(revoked)} key(s) of {args.id!r}: {reload}")
        unpublished = ("readers still take what the key signs as verified until the revocations record is "
                       "published: run `blackboard auth publish` (with the operator's credential and "
                       "--nats-url)")
        if args.no_publish:
            print(f"the revocations record was not published (--no-publish): {unpublished}")
            return 0
        failures: tuple[type[BaseException], ...] = (BlackboardError, *_request_errors())
        try:
            await _publish_keys(authority, settings, "blackboard auth revoke",
                                reloaded=reload.startswith("the dev nats-server"))
        except failures as exc:
            print(f"blackboard auth revoke: error: the revocations record was NOT published to "
                  f"{settings.nats.url}: {exc}\n  {unpublished} once the server can be reached", file=sys.stderr)
            return 1
        print(f"published the revocations record on {settings.nats.url}: readers take what the key "
              "signs from now on as revoked")
        return 0
    if cmd == "publish":
        from blackboard.client.connection import check_nats_url

        check_nats_url(settings.nats.url)
        try:
            result = await _publish_keys(authority, settings, "blackboard auth publish")
        except _request_errors() as exc:
            raise TransportError(f"cannot publish the key registry on {settings.nats.url}: {exc}") from exc
        print(f"key registry on {settings.nats.url}: {_registry_summary(result)}")
        return 0
    if cmd == "show":
        from blackboard.security.permissions import permissions_for

        rights = authority.rights(args.id)
        # With its active key (if issued): the one certificate subject it may publish.
        key = next((i.public_key for i in authority.identities() if i.principal == args.id and i.active), None)
        perms = permissions_for(rights, authority.grants, key)
        print(f"{args.id}: {rights.kind}")
        for board, held in sorted(rights.grants.items()):
            print(f"  board {board}: {', '.join(sorted(held))}")
        print(f"  topics: {', '.join(rights.topics)}; objects: {rights.objects}")
        print("  may publish:   " + "\n                 ".join(perms.publish))
        print("  may subscribe: " + "\n                 ".join(perms.subscribe))
        return 0
    if cmd == "render":
        path = authority.write_server_config(Path(args.out) if args.out else None)
        print(f"wrote {path}: include it in the nats-server config (docs/security.md)")
        return 0
    raise ConfigurationError(f"unknown auth command {cmd!r}")


# --------------------------------------------------------------------------- mcp
async def _mcp(args: argparse.Namespace) -> int:
    """``blackboard mcp ...``: its own parser (blackboard/apps/mcp/cli.py), loaded only here, so the
    other commands neither load nor need the ``mcp`` extra."""
    import importlib.util

    if importlib.util.find_spec("mcp") is None or importlib.util.find_spec("uvicorn") is None:
        raise ConfigurationError("the MCP server needs the mcp extra: pip install 'blackboard[mcp]'")
    from blackboard.apps.mcp.cli import run

    return await run(args.mcp_args)


# ----------------------------------------------------------------------- inspect
async def _inspect(args: argparse.Namespace) -> int:
    """``blackboard inspect ...``: its own parser (blackboard/apps/inspect/cli.py), loaded only here,
    so the other commands neither load nor need the ``inspect`` extra."""
    import importlib.util

    if importlib.util.find_spec("starlette") is None or importlib.util.find_spec("uvicorn") is None:
        raise ConfigurationError("the inspector needs the inspect extra: pip install 'blackboard[inspect]'")
    from blackboard.apps.inspect.cli import run

    return await run(args.inspect_args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="blackboard",
        description="A distributed blackboard for teams of LLM agents (NATS JetStream + PostgreSQL/pgvector).",
        epilog="Configuration: BLACKBOARD_* environment variables (nested with __), see docs/configuration.md.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("dev", help="run nats-server, PostgreSQL + pgvector and a worker locally",
                       description="Start the embedded dev stack: nats-server with JetStream and PostgreSQL 18 "
                                   "with pgvector from pip packages, create the streams, apply migrations and "
                                   "run a worker, until Ctrl-C. A second start reuses the data directory. "
                                   "Authorization and TLS are on: the identity authority lives in "
                                   "<data-dir>/auth, and the credentials of the worker, the operator and every "
                                   "agent the policy names are in <data-dir>/auth/creds, where the SDK finds "
                                   "them; their certificates are published to the key registry, so "
                                   "readers verify what each signs (docs/security.md §7).")
    p.add_argument("--data-dir", help="where the servers keep their data (default ./.blackboard)")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--nats-port", type=int, help="NATS port (default 4222; 0 = any free port)")
    p.add_argument("--pg-port", type=int, help="PostgreSQL port (default 5433; 0 = any free port)")
    p.add_argument("--sync-interval", help="JetStream fsync policy: 'always' or a duration like 1s, 2m "
                                           "(default 1s; see docs/operations.md)")
    p.add_argument("--agent", action="append", metavar="ID",
                   help="declare an agent (role member) and issue its credential; repeatable")
    p.add_argument("--insecure-open-bus", action="store_true",
                   help="INSECURE, dev only: run NATS with NO authorization and NO TLS, so any process "
                        "can act as any agent (docs/security.md)")
    p.add_argument("--no-worker", action="store_true", help="do not run the persistence worker")
    p.add_argument("--no-postgres", action="store_true", help="only NATS (no PostgreSQL, no worker)")
    p.set_defaults(func=_dev)

    p = sub.add_parser("worker", help="run a persistence worker (start several to scale out)",
                       description="Consume the board, memory, message and vote streams into PostgreSQL, embed "
                                   "memories, serve search, enforce vote deadlines. Workers share the work.")
    _add_conn_flags(p)
    p.add_argument("--name", help="worker name: a label in logs and status (env BLACKBOARD_WORKER__NAME)")
    p.add_argument("--group", help="consumer group: workers of one group share the work, whatever their names; "
                                   "another group gets every message again (default worker; env "
                                   "BLACKBOARD_WORKER__GROUP)")
    p.add_argument("--no-embed", action="store_true", help="do not compute embeddings in this worker")
    p.set_defaults(func=_worker)

    p = sub.add_parser("migrate", help="apply the SQL migrations (idempotent)")
    _add_conn_flags(p, nats=False)
    p.set_defaults(func=_migrate)

    p = sub.add_parser("setup", help="create the JetStream assets and apply migrations (idempotent)")
    _add_conn_flags(p)
    p.add_argument("--no-migrate", action="store_true", help="only create the JetStream assets")
    p.set_defaults(func=_setup)

    p = sub.add_parser("reindex", help="re-embed every memory and entry with the configured model")
    _add_conn_flags(p, nats=False)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_reindex)
    add_prune_commands(sub)  # prune, restore (blackboard/apps/prune.py)

    p = sub.add_parser("ingest", help="load text/markdown files as read-only knowledge memories",
                       description="Chunk text and markdown files and store the chunks as knowledge memories "
                                   "with their source; a second run re-ingests only files whose content changed.")
    _add_conn_flags(p)
    p.add_argument("paths", nargs="+", help="files or directories")
    p.add_argument("--board", default="knowledge", help="board (scope) of the memories (default knowledge)")
    p.add_argument("--agent", default="ingest",
                   help="agent id it writes as, with that agent's credential (default ingest)")
    p.add_argument("--chunk-size", type=int, default=1200,
                   help="characters per chunk (default 1200); with the local model, chunks also fit its "
                        "256-token window")
    p.add_argument("--overlap", type=int, default=200, help="characters shared by neighbouring chunks (200)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_ingest)

    p = sub.add_parser("auth", help="identities: init, add, list, revoke, show, render, publish",
                       description="Manage the identity authority: the signing keys, the declared access "
                                   "policy (policy.toml), the identities issued from it (.creds files) and "
                                   "the nats-server config that enforces it. See docs/security.md.")
    p.add_argument("--dir", help="the authority's directory (default <data-dir>/auth; "
                                 "env BLACKBOARD_SECURITY__AUTHORITY_DIR)")
    p.add_argument("--data-dir", help="the dev data directory (default ./.blackboard)")
    auth = p.add_subparsers(dest="auth_command", required=True, metavar="AUTH_COMMAND")
    auth.add_parser("init", help="make the signing keys and a starting policy (idempotent)")
    a = auth.add_parser("add", help="declare a principal (unless the policy does) and issue its credential",
                        description="Issue a credential (<dir>/creds/<id>.creds) with the rights the policy "
                                    "gives the id. Issuing an id again revokes its earlier keys.")
    a.add_argument("id", help="the principal id (an agent id, a worker or operator name)")
    a.add_argument("--kind", choices=("agent", "worker", "operator"), default="agent",
                   help="what the principal is when it is declared now (default agent)")
    a.add_argument("--role", action="append", help="role(s) when declared now (default member for agents)")
    a.add_argument("--out", help="also write the credential to this file")
    auth.add_parser("list", help="every identity issued (active and revoked)")
    a = auth.add_parser("revoke", help="revoke a principal's keys and publish the revocations record",
                        description="Revoke every active key of the id: the server refuses its credential after "
                                    "a config reload (a running `blackboard dev` server reloads at once), and "
                                    "the revocations record is published to the key registry as the operator, "
                                    "so readers take what the key signs from now on as revoked "
                                    "(docs/security.md §7). If the server cannot be reached, it says so and "
                                    "exits 1: run `blackboard auth publish` later.")
    a.add_argument("id")
    _add_conn_flags(a, pg=False)
    a.add_argument("--no-publish", action="store_true",
                   help="only revoke here (an authority host without access to the servers); "
                        "publish later with `blackboard auth publish`")
    a = auth.add_parser("show", help="a principal's rights and the NATS permissions they give")
    a.add_argument("id")
    a = auth.add_parser("render", help="write the nats-server config (operator, accounts, revocations)")
    a.add_argument("--out", help="file to write (default <dir>/nats-auth.conf)")
    a = auth.add_parser("publish", help="publish every active certificate and the revocations record",
                        description="Connect as the operator (nats.creds_file, else the operator's credential, "
                                    "as `blackboard setup` finds it) and publish the key registry (stream "
                                    "BB_KEYS): the certificate (user JWT) of every active identity whose "
                                    ".creds file is in <dir>/creds, and the revocations record, so readers can "
                                    "verify signed records (docs/security.md §7). Run it after `blackboard "
                                    "setup`, and after a revocation that could not be published. Idempotent.")
    _add_conn_flags(a, pg=False)
    p.set_defaults(func=_auth)

    # Everything after `mcp` goes to its own parser (`blackboard mcp --help` is that parser's).
    p = sub.add_parser("mcp", help="the MCP server for MCP hosts: --stdio --as AGENT, or --http with tokens",
                       add_help=False, prefix_chars="\0")
    p.add_argument("mcp_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_mcp)
    p = sub.add_parser("inspect", help="a read-only web page on the blackboard, as one identity (--as AGENT)",
                       add_help=False, prefix_chars="\0")
    p.add_argument("inspect_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_inspect)
    add_people_commands(sub)  # get, put, ls, history, watch, search, recall, send, inbox, status
    return parser


#: Commands whose lifecycle lines (INFO: ready, connected, lag caught up, reindex progress)
#: are shown at ``observability.log_level``; the others show warnings and errors only.
_LOGGING_COMMANDS = frozenset({"worker", "reindex"})


def _configure_logging(args: argparse.Namespace) -> None:
    """Level and format from ``observability.*`` (docs/observability.md); ``-v`` lowers the
    level by a step each. Invalid settings: the defaults here (the command reports them)."""
    from blackboard.observability import configure_logging
    from blackboard.settings import ObservabilitySettings

    try:
        observability = Settings().observability
    except ValidationError:
        observability = ObservabilitySettings()
    level = logging.getLevelNamesMapping()[observability.log_level]
    if args.command not in _LOGGING_COMMANDS:
        level = max(level, logging.WARNING)
    configure_logging(observability, level=max(logging.DEBUG, level - 10 * args.verbose), force=False)


def _progress(args: argparse.Namespace, settings: Settings) -> bool:
    """Whether to draw a progress bar: not with ``-q``, and per ``observability.progress``
    (``auto``: only on a terminal; a log gets lines instead)."""
    from blackboard.observability import progress_enabled

    return not args.quiet and progress_enabled(settings.observability.progress)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``blackboard`` command."""
    args = _parser().parse_args(argv)
    _configure_logging(args)
    try:
        code: int = asyncio.run(args.func(args))
        return code
    except KeyboardInterrupt:
        return 130
    except ConfigurationError as exc:  # the command line or the environment is wrong: like a usage error
        print(f"blackboard {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BlackboardError as exc:
        print(f"blackboard {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
