"""``blackboard inspect``: serve the inspector's page and API as one identity (docs/inspector.md).

Its own parser (``blackboard inspect --help``), loaded only by that command, so the other
commands neither load nor need the ``inspect`` extra (Starlette, uvicorn).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from blackboard.apps.inspect.app import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    InspectorServer,
    running_inspector,
)
from blackboard.apps.people.common import acting_agent, load_settings
from blackboard.apps.signals import stop_on_signal
from blackboard.protocol.errors import ConfigurationError, InvalidKeyError
from blackboard.protocol.subjects import validate_name
from blackboard.security.credentials import load_credentials_file

__all__ = ["parser", "run"]


def parser() -> argparse.ArgumentParser:
    """The parser of ``blackboard inspect``."""
    p = argparse.ArgumentParser(
        prog="blackboard inspect",
        description="Serve a read-only web page on the blackboard: boards, entries (live), history and "
                    "as-of views, votes, messages, a search playground and the system's state, as one "
                    "identity: only what it may read is shown. Bound to 127.0.0.1 unless --host.",
        epilog="See docs/inspector.md.")
    p.add_argument("--as", dest="as_agent", metavar="AGENT",
                   help="the identity to read as, with its credential found as Agent.connect finds it "
                        "(default cli.agent, else the agent of nats.creds_file)")
    p.add_argument("--creds", metavar="FILE", help="the .creds file to connect with (its identity, unless --as)")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = a free port)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="another Host name browsers use to reach it (a proxy's); repeatable")
    p.add_argument("--no-warm", action="store_true",
                   help="open a board's live state on its first request only (default: the first 8 readable boards' at start)")
    p.add_argument("--db", action="store_true",
                   help="also show the dead letters' reasons from PostgreSQL (postgres.dsn: an operator's view)")
    p.add_argument("--nats-url", help="NATS server URL(s), comma-separated (env BLACKBOARD_NATS__URL)")
    p.add_argument("--postgres-dsn", help="PostgreSQL DSN, for --db (env BLACKBOARD_POSTGRES__DSN)")
    return p


async def run(argv: Sequence[str]) -> int:
    """Run ``blackboard inspect`` with these arguments until SIGINT/SIGTERM; the exit code.

    Raises:
        ConfigurationError: bad usage, no identity to act as, an address that cannot be listened on.
        AuthenticationError, NotConnectedError: the identity could not connect.
    """
    p = parser()
    args = p.parse_args(list(argv))
    if not 0 <= args.port <= 65535:
        p.error(f"--port must be 0..65535, not {args.port}")
    settings = load_settings(args)
    creds = Path(args.creds) if args.creds else None
    try:
        if args.as_agent:
            agent_id = validate_name(args.as_agent, "agent id (--as)")
        elif creds is not None:
            agent_id = load_credentials_file(creds, f"--creds {creds}").principal
        else:
            agent_id = acting_agent(args, settings)
    except InvalidKeyError as exc:
        raise ConfigurationError(str(exc)) from None
    signalled = stop_on_signal()

    def ready(server: InspectorServer) -> None:
        print(f"blackboard inspect: {server.url}  (as {agent_id}; read-only; Ctrl-C to stop)", flush=True)

    async with running_inspector(settings, agent_id, credentials=creds, host=args.host, port=args.port,
                                 allowed_hosts=args.allowed_host, db=args.db, warm=not args.no_warm) as server:
        ready(server)
        await signalled.wait()
    print("blackboard inspect: stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(asyncio.run(run(sys.argv[1:])))
