"""``blackboard mcp``: the MCP server for MCP hosts, and its client tokens (docs/mcp.md).

``blackboard mcp --stdio --as AGENT``          one identity, over stdin/stdout (a host starts it)
``blackboard mcp --http [--host --port]``      many clients over HTTP, each as its token's identity
``blackboard mcp token add|list|revoke``       the HTTP clients' bearer tokens

The ``blackboard`` command hands everything after ``mcp`` to :func:`run` (imported only then,
so the other commands neither load nor need the ``mcp`` extra).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from blackboard.apps.people.common import load_settings
from blackboard.apps.signals import stop_on_signal
from blackboard.protocol.errors import ConfigurationError, InvalidKeyError
from blackboard.settings import Settings

__all__ = ["DEFAULT_TOKENS", "parser", "run"]

#: The token file when ``--tokens`` is not given: under the dev data directory.
DEFAULT_TOKENS = "<data-dir>/mcp-tokens.json"

_DESCRIPTION = """\
Serve the blackboard to MCP hosts (Claude Desktop, Claude Code, Cursor, VS Code, agent
frameworks): tools to read and write boards, search, remember and recall, message other agents
and vote, and the boards as resources. Every call acts as ONE agent identity, with that
identity's credential, so the blackboard's permissions hold as for any agent.

  --stdio --as AGENT   the host starts this command and talks MCP over stdin/stdout; it acts as
                       AGENT (its credential is found as for any agent: nats.creds_file,
                       nats.credentials_dir, or the dev stack's <data-dir>/auth/creds).
  --http               streamable HTTP on 127.0.0.1:8765/mcp for several clients; each sends
                       'Authorization: Bearer <token>' and acts as the identity its token names
                       (make tokens with `blackboard mcp token add AGENT`). No token or a wrong
                       one: 401. Another address than loopback needs --tls-cert/--tls-key.

Tokens live in a file (default <data-dir>/mcp-tokens.json, mode 0600) that keeps only their
SHA-256; `token add` prints a new token once. See docs/mcp.md for host configuration."""


def parser() -> argparse.ArgumentParser:
    """The ``blackboard mcp`` argument parser."""
    p = argparse.ArgumentParser(prog="blackboard mcp", description=_DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--stdio", action="store_true", help="serve one identity over stdin/stdout (needs --as)")
    mode.add_argument("--http", action="store_true", help="serve token-authenticated clients over streamable HTTP")
    p.add_argument("--as", dest="agent", metavar="AGENT", help="the agent identity of --stdio")
    p.add_argument("--host", help="--http: address to listen on (default 127.0.0.1; another needs TLS)")
    p.add_argument("--port", type=int, help="--http: port (default 8765; 0 = any free port)")
    p.add_argument("--tls-cert", type=Path, help="--http: TLS certificate chain (PEM)")
    p.add_argument("--tls-key", type=Path, help="--http: the certificate's private key (PEM)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="--http: a host name clients use besides the listening address (the Host "
                        "header is checked against DNS rebinding); repeatable")
    _add_common(p)
    sub = p.add_subparsers(dest="mcp_command", metavar="COMMAND")
    t = sub.add_parser("token", help="the HTTP clients' bearer tokens: add, list, revoke",
                       description="Bearer tokens of `blackboard mcp --http`: each names the agent identity its "
                                   "holder acts as. The file keeps only each token's SHA-256.")
    tsub = t.add_subparsers(dest="token_command", required=True, metavar="TOKEN_COMMAND")
    a = tsub.add_parser("add", help="make a token for AGENT; prints it once (on stdout, alone)",
                        description="Make a random token for AGENT and store its SHA-256 in the token file "
                                    "(made with mode 0600 if missing). The token is printed once, alone on "
                                    "stdout (`TOKEN=$(blackboard mcp token add planner)`); it cannot be shown "
                                    "again: lost, revoke it and add another. A running server takes it at once.")
    a.add_argument("agent", metavar="AGENT", help="the agent id the token's holder acts as")
    a.add_argument("--no-check", action="store_true",
                   help="do not check that a credential for AGENT is found here (the server runs elsewhere)")
    _add_common(a)
    tsub_list = tsub.add_parser("list", help="every token: id, agent, when made (never the token)")
    _add_common(tsub_list)
    r = tsub.add_parser("revoke", help="remove AGENT's tokens, or one token by --id",
                        description="Remove every token of AGENT, or the one token --id names (the id `token "
                                    "list` shows). A running server refuses it (401) from its next request.")
    r.add_argument("agent", metavar="AGENT", nargs="?", help="revoke every token of this agent")
    r.add_argument("--id", dest="token_id", help="revoke only this token (its id or a prefix of 4+ digits)")
    _add_common(r)
    return p


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", type=Path, default=argparse.SUPPRESS,
                   help=f"the token file (default {DEFAULT_TOKENS}; the data directory is "
                        "BLACKBOARD_DEV__DATA_DIR, default ./.blackboard)")
    p.add_argument("--nats-url", default=argparse.SUPPRESS,
                   help="NATS server URL(s), comma-separated (env BLACKBOARD_NATS__URL)")


def _tokens_path(args: argparse.Namespace, settings: Settings) -> Path:
    given: Path | None = getattr(args, "tokens", None)
    return given if given is not None else settings.dev.data_dir / "mcp-tokens.json"


async def run(argv: Sequence[str]) -> int:
    """Run ``blackboard mcp`` with these arguments; the exit code.

    Raises:
        ConfigurationError: bad usage, a missing or invalid token file, an address refused.
        BlackboardError: the agent could not connect (``--stdio``), and as the server raises.
    """
    p = parser()
    args = p.parse_args(list(argv))
    if args.mcp_command == "token":
        if args.stdio or args.http:
            p.error("a token command takes neither --stdio nor --http")
        return _token(args)
    if args.stdio:
        if not args.agent:
            p.error("--stdio needs --as AGENT: the identity every call acts as")
        for flag in ("host", "port", "tls_cert", "tls_key"):
            if getattr(args, flag) is not None:
                p.error(f"--{flag.replace('_', '-')} is an option of --http, not --stdio")
        return await _stdio(args)
    if args.http:
        if args.agent:
            p.error("--as is for --stdio: over HTTP each client acts as the identity of its token")
        return await _http(args)
    p.error("give --stdio --as AGENT, --http, or a token command (blackboard mcp --help)")
    return 2  # not reached: error() exits


async def _stdio(args: argparse.Namespace) -> int:
    from blackboard.apps.mcp.stdio import run_stdio

    _check_agent_id(args.agent, "agent id (--as)")
    await run_stdio(load_settings(args), args.agent)
    return 0


async def _http(args: argparse.Namespace) -> int:
    from blackboard.apps.mcp.http import DEFAULT_HOST, DEFAULT_PORT, HttpServer, serve_http

    settings = load_settings(args)
    tokens = _tokens_path(args, settings)
    stop = stop_on_signal()

    def ready(server: HttpServer) -> None:
        names = sorted({r.agent_id for r in server.tokens.records()})
        print(f"blackboard mcp: serving MCP on {server.url}", flush=True)
        print(f"  tokens        {tokens} ({len(names)} identities: {', '.join(names) or 'none yet'})", flush=True)
        print("  clients send  Authorization: Bearer <token>  (blackboard mcp token add AGENT)", flush=True)
        _warn_missing_credentials(settings, names)

    await serve_http(settings, tokens=tokens, host=args.host or DEFAULT_HOST,
                     port=DEFAULT_PORT if args.port is None else args.port, tls_cert=args.tls_cert,
                     tls_key=args.tls_key, allowed_hosts=args.allowed_host, stop=stop, on_ready=ready)
    print("blackboard mcp: stopped", flush=True)
    return 0


def _check_agent_id(agent_id: str, what: str) -> None:
    """A malformed agent id is a usage error (exit 2).

    Raises:
        ConfigurationError: not a valid agent id.
    """
    from blackboard.protocol.subjects import validate_name

    try:
        validate_name(agent_id, what)
    except InvalidKeyError as exc:
        raise ConfigurationError(str(exc)) from None


def _warn_missing_credentials(settings: Settings, names: Sequence[str]) -> None:
    """Say which identities of the token file have no credential here (their calls would fail)."""
    from blackboard.protocol.errors import AuthenticationError
    from blackboard.security.credentials import find_credentials

    for name in names:
        try:
            find_credentials(name, settings)
        except AuthenticationError as exc:
            print(f"  warning       {name!r} has no credential here; its clients' calls fail: {exc}",
                  file=sys.stderr, flush=True)


def _token(args: argparse.Namespace) -> int:
    from blackboard.apps.mcp.tokens import TokenFile

    settings = load_settings(args)
    path = _tokens_path(args, settings)
    tokens = TokenFile(path)
    if args.token_command == "add":
        _check_agent_id(args.agent, "agent id")
        if not args.no_check:
            from blackboard.security.credentials import find_credentials

            find_credentials(args.agent, settings)  # AuthenticationError: told, nothing written
        token, record = tokens.add(args.agent)
        print(token, flush=True)
        print(f"token {record.id} for {record.agent_id!r} (above, shown once) stored as its SHA-256 in {path};\n"
              f"a client sends it as the header  Authorization: Bearer <token>", file=sys.stderr)
        return 0
    if args.token_command == "list":
        if not tokens.exists:
            raise ConfigurationError(f"no MCP token file at {path} (make one with `blackboard mcp token add AGENT`)")
        records = tokens.records()
        print(f"{'id':<13} {'agent':<28} created (UTC)")
        for rec in records:
            print(f"{rec.id:<13} {rec.agent_id:<28} {rec.created}")
        if not records:
            print(f"(no tokens in {path})")
        return 0
    # revoke
    if (args.agent is None) == (args.token_id is None):
        raise ConfigurationError("revoke takes AGENT (all its tokens) or --id TOKEN_ID (one), not both or neither")
    if not tokens.exists:
        raise ConfigurationError(f"no MCP token file at {path}")
    gone = tokens.revoke(agent_id=args.agent, token_id=args.token_id)
    if not gone:
        what = f"agent {args.agent!r}" if args.agent else f"id {args.token_id!r}"
        print(f"no token of {what} in {path}")
        return 1
    for rec in gone:
        print(f"revoked token {rec.id} of {rec.agent_id!r}")
    return 0
