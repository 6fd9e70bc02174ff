"""``blackboard prune`` and ``blackboard restore``: archive (or delete) the long-term memories
least worth keeping, and bring archived ones back, on PostgreSQL directly (like ``blackboard
reindex``; docs/memory-lifecycle.md, "Pruning and archive"; docs/cli.md).

The work is :func:`blackboard.worker.pruning.prune` and :func:`~blackboard.worker.pruning.restore`;
this module parses the command line and prints what was done.
"""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime
from typing import Any

from blackboard.protocol.errors import ConfigurationError
from blackboard.settings import Settings

__all__ = ["add_prune_commands", "parse_duration"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_EXIT_NOT_RESTORED = 3
_STRATEGIES = ("lru", "low_confidence", "old_age", "importance", "max_per_board")


def parse_duration(text: str) -> float:
    """Seconds of a duration: ``90d``, ``12h``, ``30m``, ``45s``, ``2w`` or a number of seconds.

    Raises:
        ConfigurationError: not a duration.
    """
    match = _DURATION.match(text)
    if match is None:
        raise ConfigurationError(f"not a duration: {text!r} (give e.g. 90d, 12h, 30m, 45s or seconds)")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def _threshold(strategy: str, text: str | None) -> float | None:
    if text is None:
        return None
    if strategy in ("lru", "old_age"):
        return parse_duration(text)
    try:
        value = float(text) if strategy != "max_per_board" else int(text)
    except ValueError:
        want = "a whole number" if strategy == "max_per_board" else "a number within 0..1"
        raise ConfigurationError(f"--threshold of {strategy}: {want}, not {text!r}") from None
    return value


def _settings(args: argparse.Namespace) -> Settings:
    from blackboard.apps.people.common import load_settings

    return load_settings(args)


def _why(strategy: str, threshold: Any) -> str:
    from blackboard.apps.people.output import instant

    return {
        "lru": lambda: f"lru: not recalled nor written since {instant(threshold)}",
        "old_age": lambda: f"old_age: event time before {instant(threshold)}",
        "low_confidence": lambda: f"low_confidence: confidence below {threshold}",
        "importance": lambda: f"importance: score below {threshold}",
        "max_per_board": lambda: f"max_per_board: beyond the {threshold} most important of each board",
    }[strategy]()


async def _prune(args: argparse.Namespace) -> int:
    from blackboard.apps.people.output import dumps, instant, preview, table
    from blackboard.db import connect, migrate
    from blackboard.worker.pruning import prune, threshold_of

    settings = _settings(args)
    threshold = _threshold(args.strategy, args.threshold)
    threshold_of(settings.memory, args.strategy, threshold, now=datetime.now(UTC))  # told before connecting
    if args.dry_run and args.hard:
        raise ConfigurationError("--dry-run lists what would go: give --hard without it to delete")
    if args.limit is not None and args.limit < 1:
        raise ConfigurationError(f"--limit must be >= 1, not {args.limit}")
    await migrate(settings)
    conn = await connect(settings.postgres, autocommit=True, name="blackboard-prune")
    try:
        report = await prune(conn, settings.memory, args.strategy, threshold=threshold, board=args.board,
                             dry_run=args.dry_run, hard=args.hard, limit=args.limit)
    finally:
        await conn.close()
    if args.json:
        for p in report.memories:
            print(dumps({"id": p.id, "board": p.board, "agent": p.agent, "kind": p.kind, "text": p.text,
                         "importance_score": p.score, "importance": p.importance, "confidence": p.confidence,
                         "hits": p.hits, "last_used": p.used_at, "event_time": p.event_at,
                         "strategy": report.strategy, "dry_run": report.dry_run, "hard": report.hard}))
        return 0
    if report.memories:
        print(table(["ID", "BOARD", "SCORE", "LAST USED", "EVENT TIME", "CONF", "HITS", "TEXT"],
                    [[p.id, p.board, f"{p.score:.3f}", instant(p.used_at), instant(p.event_at),
                      "-" if p.confidence is None else f"{p.confidence:.2f}", p.hits, preview(p.text)]
                     for p in report.memories], right=["SCORE", "CONF", "HITS"]))
    done = "deleted" if args.hard else "archived"
    verb = f"would be {done}" if args.dry_run else done
    noun = "memory" if report.count == 1 else "memories"
    print(f"{report.count} {noun} {verb} ({_why(report.strategy, report.threshold)})")
    return 0


async def _restore(args: argparse.Namespace) -> int:
    from blackboard.db import connect, migrate
    from blackboard.worker.pruning import restore

    settings = _settings(args)
    await migrate(settings)
    conn = await connect(settings.postgres, autocommit=True, name="blackboard-restore")
    try:
        report = await restore(conn, args.ids, board=args.board)
    finally:
        await conn.close()
    for mid in report.restored:
        print(f"restored {mid}")
    for mid, why in sorted(report.refused.items()):
        print(f"not restored {mid}: {why}")
    return _EXIT_NOT_RESTORED if report.refused else 0


def add_prune_commands(sub: Any) -> None:
    """Add ``prune`` and ``restore`` to ``sub`` (the subparsers of ``blackboard``'s parser)."""
    p = sub.add_parser(
        "prune", help="archive (or delete) the long-term memories least worth keeping",
        description="Archive the live memories a strategy selects, least worth keeping first: lru (not "
                    "recalled nor written for memory.prune_unused_for), low_confidence (confidence below "
                    "memory.prune_min_confidence), old_age (event time older than memory.prune_max_age), "
                    "importance (importance score below memory.prune_min_importance), max_per_board (beyond "
                    "the memory.max_per_board most important of each board). Recall leaves archived "
                    "memories out; `blackboard restore` brings them back. Knowledge-file memories and "
                    "memories under a contradiction vote are never pruned. See docs/memory-lifecycle.md.",
        epilog="Exit codes: 0 done, 1 failed (PostgreSQL), 2 bad input.")
    p.add_argument("--strategy", required=True, choices=_STRATEGIES)
    p.add_argument("--threshold", metavar="X",
                   help="replaces the strategy's setting: a duration for lru and old_age (90d, 12h, 30m, 45s, "
                        "seconds), 0..1 for low_confidence and importance, a count for max_per_board")
    p.add_argument("--board", help="only this board's memories (default: every board)")
    p.add_argument("--dry-run", action="store_true", help="print what would go, one line each, and the count")
    p.add_argument("--hard", action="store_true",
                   help="delete instead of archiving: rows, vectors and sources, with a forget tombstone per id "
                        "(not restorable)")
    p.add_argument("--limit", type=int, metavar="N", help="at most N memories")
    p.add_argument("--json", action="store_true", help="one JSON object per memory")
    p.add_argument("--postgres-dsn", help="PostgreSQL DSN (env BLACKBOARD_POSTGRES__DSN)")
    p.set_defaults(func=_prune)

    p = sub.add_parser(
        "restore", help="bring archived long-term memories back into recall",
        description="Clear the archive mark of the memories with these ids. A memory merged into another "
                    "(a duplicate) is not restored: the memory kept carries its provenance.",
        epilog="Exit codes: 0 all restored, 1 failed (PostgreSQL), 2 bad input, 3 some not restored (each told).")
    p.add_argument("ids", nargs="+", metavar="ID")
    p.add_argument("--board", help="only memories of this board")
    p.add_argument("--postgres-dsn", help="PostgreSQL DSN (env BLACKBOARD_POSTGRES__DSN)")
    p.set_defaults(func=_restore)
