"""The command lines of the commands for people, added to ``blackboard``'s parser.

Each command runs in its module (:mod:`.board`, :mod:`.find`, :mod:`.memory`, :mod:`.messages`,
:mod:`.status`), imported when it runs: ``blackboard --help`` and the server commands do
not load the SDK.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["PEOPLE_COMMANDS", "add_people_commands"]

#: The commands, in the order ``blackboard --help`` lists them.
PEOPLE_COMMANDS = ("get", "put", "delete", "ls", "history", "watch", "search", "recall", "remember", "send", "inbox",
                   "status")

Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]

_IDENTITY = ("act as agent NAME (its credential is found as Agent.connect finds it); default: "
             "BLACKBOARD_CLI__AGENT, else the agent of BLACKBOARD_NATS__CREDS_FILE")
_EPILOG = ("Exit codes: 0 done, 1 failed (no server, no worker, timeout), 2 bad input, 3 not found, "
           "4 conflict, 5 permission refused, 6 no credential or refused, 130 interrupted. See docs/cli.md.")


def _lazy(module: str, name: str) -> Command:
    """Run ``blackboard.apps.people.<module>.<name>(args)`` (imported now) under
    :func:`~blackboard.apps.people.common.run_command`."""
    async def run(args: argparse.Namespace) -> int:
        from blackboard.apps.people.common import run_command

        fn = getattr(importlib.import_module(f"blackboard.apps.people.{module}"), name)
        return await run_command(args, fn)

    return run


def _common(*, identity: str = _IDENTITY) -> argparse.ArgumentParser:
    """The flags every command for people takes."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--as", dest="as_agent", metavar="NAME", help=identity)
    p.add_argument("--json", action="store_true",
                   help="machine output: one JSON document (records: one JSON object per line)")
    p.add_argument("--nats-url", help="NATS server URL(s), comma-separated (env BLACKBOARD_NATS__URL)")
    return p


def _filters(p: argparse.ArgumentParser) -> None:
    """The search filters and ranking flags of ``search`` and ``recall``."""
    p.add_argument("--mode", choices=("hybrid", "semantic", "keyword"), default="hybrid",
                   help="how to rank (default hybrid: keyword and semantic fused)")
    p.add_argument("--where", metavar="JSON",
                   help='comparison filter, e.g. \'{"metadata.confidence": {"$gt": 0.8}}\' (docs/search.md)')
    p.add_argument("--metadata", metavar="JSON", help="metadata containment filter, e.g. '{\"team\": \"a\"}'")
    p.add_argument("--tag", action="append", dest="tags", metavar="TAG", help="has this tag (repeatable: all)")
    p.add_argument("--author", help="written by this agent")
    p.add_argument("--top-k", type=int, help="results at most (default search.default_top_k)")
    p.add_argument("--min-score", type=float, help="drop hits scoring below this")


def add_people_commands(sub: Any) -> None:
    """Add the commands for people to ``sub`` (the subparsers of ``blackboard``'s parser)."""
    common = _common()

    def add(name: str, help: str, description: str, func: Command) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help, description=description, epilog=_EPILOG,
                                                    parents=[common])
        p.set_defaults(func=func)
        return p

    p = add("get", "print an entry of a board", "Print the latest value of a key (or the one at --revision), "
            "with its revision, author, time, tags and metadata.", _lazy("board", "get"))
    p.add_argument("board")
    p.add_argument("section")
    p.add_argument("key")
    p.add_argument("--revision", type=int, help="this revision of the key (one JetStream keeps)")

    p = add("put", "write an entry", "Write VALUE to a key: JSON text is its JSON value (42, true, "
            "'{\"a\": 1}', '\"text\"'), anything else the string itself; - reads it from stdin. "
            "With --expect-revision the write is a compare-and-set (0: only if the key is absent).",
            _lazy("board", "put"))
    p.add_argument("board")
    p.add_argument("section")
    p.add_argument("key")
    p.add_argument("value", metavar="VALUE|-")
    p.add_argument("--expect-revision", type=int, metavar="N",
                   help="write only if the key is at revision N (0: only if absent); exit 4 otherwise")
    p.add_argument("--ttl", type=float, metavar="S", help="the server removes the entry after S seconds (>= 1)")
    p.add_argument("--tags", help="comma-separated tags")
    p.add_argument("--metadata", metavar="JSON", help="a JSON object of metadata")
    p.add_argument("--string", action="store_true", help="VALUE is a string, even if it reads as JSON")
    p.add_argument("--content-type", help="the value's content type (default from the value)")

    p = add("delete", "delete an entry", "Delete a key (a tombstone: its history stays, a watch sees the "
            "delete). With --expect-revision only if the key is still at revision N.", _lazy("board", "delete"))
    p.add_argument("board")
    p.add_argument("section")
    p.add_argument("key")
    p.add_argument("--expect-revision", type=int, metavar="N",
                   help="delete only if the key is at revision N; exit 4 otherwise")

    p = add("ls", "list boards, sections, keys or entries",
            "Without BOARD: the boards this agent may read (with a credential a worker lists them). "
            "With BOARD: its sections; with SECTION: its keys. --long (or --where) lists the live "
            "entries instead, filtered by --where.", _lazy("board", "ls"))
    p.add_argument("board", nargs="?")
    p.add_argument("section", nargs="?")
    p.add_argument("-l", "--long", action="store_true", help="entries (revision, author, time, value)")
    p.add_argument("--where", metavar="JSON",
                   help='comparison filter on the entries, e.g. \'{"value.status": {"$in": ["open"]}}\'')

    p = add("history", "the revisions of a key", "The revisions JetStream keeps of a key (board.history, "
            "deletes included), oldest first; --stored: every revision ever written, from PostgreSQL "
            "(a worker answers).", _lazy("board", "history"))
    p.add_argument("board")
    p.add_argument("section")
    p.add_argument("key")
    p.add_argument("--stored", action="store_true", help="every revision ever written (from PostgreSQL)")
    p.add_argument("--limit", type=int, help="with --stored: the newest N revisions at most")

    p = add("watch", "print changes to a board as they happen",
            "Print each change to a board, a section or one key as it happens, until Ctrl-C "
            "(or --count changes). --json prints one JSON object per change.", _lazy("board", "watch"))
    p.add_argument("board")
    p.add_argument("section", nargs="?")
    p.add_argument("key", nargs="?")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--from-start", action="store_true", help="first every revision kept, then changes")
    start.add_argument("--current", action="store_true", help="first the current value of every key")
    p.add_argument("--count", type=int, metavar="N", help="stop after N changes")

    p = add("search", "search board entries", "Search the current entries of boards (semantic, keyword or "
            "hybrid), best first; a worker answers.", _lazy("find", "search"))
    p.add_argument("query")
    p.add_argument("--board", action="append", dest="boards", metavar="BOARD",
                   help="search this board (repeatable; default every board this agent may read)")
    p.add_argument("--section", action="append", dest="sections", metavar="SECTION",
                   help="only this section (repeatable)")
    _filters(p)

    p = add("recall", "search long-term memories", "Search the shared long-term memory, best first; "
            "a worker answers.", _lazy("find", "recall"))
    p.add_argument("query")
    p.add_argument("--board", action="append", dest="boards", metavar="BOARD",
                   help="memories of this board (repeatable)")
    p.add_argument("--kind", action="append", dest="kinds",
                   choices=("episodic", "semantic", "procedural", "knowledge", "summary"),
                   help="memories of this kind (repeatable)")
    _filters(p)
    p.add_argument("--include-superseded", action="store_true",
                   help="older versions of a key and contested memories too (default: current memories only)")
    p.add_argument("--include-archived", action="store_true", help="archived memories (pruned, merged) too")
    p.add_argument("--as-of", metavar="TIME", help="the versions valid at TIME (ISO 8601 with an offset)")
    p.add_argument("--known-at", metavar="TIME",
                   help="what the board knew at TIME: memories written by then, the newest version of each key")
    p.add_argument("--occurred-after", metavar="TIME", help="event time at or after TIME")
    p.add_argument("--occurred-before", metavar="TIME", help="event time before TIME")
    p.add_argument("--min-confidence", type=float, metavar="X", help="confidence at least X (0 to 1)")

    p = add("remember", "write a long-term memory", "Store TEXT (- reads stdin) as a long-term memory any "
            "agent can recall; prints its id once JetStream has it. --key, --occurred-at and --confidence "
            "describe a fact that may change (docs/memory-lifecycle.md).", _lazy("memory", "remember"))
    p.add_argument("text", metavar="TEXT|-")
    p.add_argument("--board", help="scope it to this board (default 'default')")
    p.add_argument("--kind", default="episodic",
                   choices=("episodic", "semantic", "procedural", "knowledge", "summary"),
                   help="what it is (default episodic)")
    p.add_argument("--tag", action="append", dest="tags", metavar="TAG", help="a label (repeatable)")
    p.add_argument("--metadata", metavar="JSON", help="a JSON object of metadata")
    p.add_argument("--importance", type=float, default=0.5, metavar="X", help="0 to 1 (default 0.5)")
    p.add_argument("--key", metavar="KEY",
                   help="what it is about, e.g. price:sku-1: a newer memory on the same key supersedes it")
    p.add_argument("--occurred-at", metavar="TIME",
                   help="when what it says happened, ISO 8601 with an offset, e.g. 2026-01-31T12:00:00Z")
    p.add_argument("--confidence", type=float, metavar="X", help="how sure, 0 to 1")
    p.add_argument("--id", help="its id (the same id again: a new version of that memory)")
    p.add_argument("--wait", action="store_true",
                   help="return once a worker has stored and embedded it (recall finds it)")
    p.add_argument("--timeout", type=float, metavar="S", help="with --wait: seconds at most (default 30)")

    p = add("send", "send a message to an agent", "Send a direct message of TYPE to agent TO (several: "
            "a,b,c); BODY as put's VALUE (JSON, else a string; - reads stdin).", _lazy("messages", "send"))
    p.add_argument("to")
    p.add_argument("type")
    p.add_argument("body", nargs="?", metavar="BODY|-")
    p.add_argument("--string", action="store_true", help="BODY is a string, even if it reads as JSON")
    p.add_argument("--board", help="the board the message is about")
    p.add_argument("--correlation-id", help="correlation id (ties a reply to its request)")

    p = add("inbox", "read this agent's inbox", "Print the messages in this agent's inbox, oldest first. "
            "Without --ack they stay in the inbox (the next reader gets them again); with --ack each "
            "one printed is acknowledged. A worker must run (it creates the inbox).",
            _lazy("messages", "inbox"))
    p.add_argument("--ack", action="store_true", help="acknowledge the messages printed")
    p.add_argument("--max", type=int, default=20, metavar="N", help="messages at most (default 20)")
    p.add_argument("--wait", type=float, default=1.0, metavar="S",
                   help="stop after S seconds without a new message (default 1)")
    p.add_argument("--type", action="append", dest="types", metavar="TYPE", help="only this type (repeatable)")

    status_common = _common(identity="act as agent NAME: what that agent may see (default: the operator, "
                                     "the full picture)")
    p = sub.add_parser("status", help="servers, streams, consumers, worker lag, backlog, dead letters",
                       description="The state of the deployment: the NATS servers, JetStream usage, the "
                                   "streams and their consumers, the workers' lag, the embedding backlog and "
                                   "dead letters. Runs as the operator (nats.creds_file, else the operator's "
                                   "credential, as `blackboard setup` finds it); --as NAME shows what an "
                                   "agent may see (no stream or consumer details).",
                       epilog=_EPILOG, parents=[status_common])
    p.add_argument("--wait", type=float, default=0.5, metavar="S",
                   help="seconds to collect the search services' answers (default 0.5)")
    p.add_argument("--db", action="store_true",
                   help="also read PostgreSQL (postgres.dsn): every dead letter, by stream and reason, and "
                        "the embedding queue")
    p.add_argument("--postgres-dsn", help="PostgreSQL DSN for --db (env BLACKBOARD_POSTGRES__DSN)")
    p.set_defaults(func=_lazy("status", "status"))
