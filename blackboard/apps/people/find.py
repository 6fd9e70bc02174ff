"""``blackboard search / recall``: the search service (a worker answers), as one agent."""

from __future__ import annotations

import argparse
from typing import Any

from blackboard.apps.people.common import connect_agent, json_object
from blackboard.apps.people.memory import parse_time
from blackboard.apps.people.output import dumps, preview, table
from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.filters import parse_where

__all__ = ["recall", "search"]


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    """The search keywords of the flags both commands take (checked before connecting).

    Raises:
        InvalidPayloadError: ``--where`` or ``--metadata`` is not valid, ``--top-k`` below 1.
    """
    raw = json_object(args.where, what="--where")
    where = parse_where(raw) if raw is not None else None  # told before connecting; not parsed again
    if args.top_k is not None and args.top_k < 1:
        raise InvalidPayloadError(f"--top-k must be at least 1, not {args.top_k}")
    found: dict[str, Any] = {"mode": args.mode, "top_k": args.top_k, "min_score": args.min_score,
                             "boards": args.boards, "author": args.author,
                             "metadata": json_object(args.metadata, what="--metadata"), "where": where}
    if args.tags:
        found["tags_all"] = args.tags
    return {name: value for name, value in found.items() if value is not None}


def _lifecycle(args: argparse.Namespace) -> dict[str, Any]:
    """The lifecycle filters of ``recall`` given on the command line (docs/memory-lifecycle.md).

    Raises:
        InvalidPayloadError: a time that is not ISO 8601 with an offset.
    """
    found: dict[str, Any] = {name: parse_time(getattr(args, name), what=f"--{name.replace('_', '-')}")
                             for name in ("as_of", "known_at", "occurred_after", "occurred_before")}
    found["min_confidence"] = args.min_confidence
    if args.include_superseded:
        found["include_superseded"] = True
    if args.include_archived:
        found["include_archived"] = True
    return {name: value for name, value in found.items() if value is not None}


def _print_hits(args: argparse.Namespace, hits: list[Any], headers: list[str], row: Any) -> None:
    if args.json:
        for hit in hits:
            print(dumps(hit), flush=True)
    elif hits:
        print(table(headers, [row(h) for h in hits], right=("SCORE",)), flush=True)
    else:
        print("(nothing found)", flush=True)


async def search(args: argparse.Namespace) -> int:
    """Search board entries, best first.

    Raises:
        SearchError: no worker answers, or the search failed.
        PermissionDeniedError: a ``--board`` this agent may not read.
        InvalidPayloadError: an invalid filter.
    """
    filters = _filters(args)
    if args.sections:
        filters["sections"] = args.sections
    async with connect_agent(args) as agent:
        hits = await agent.search.search_entries(args.query, **filters)
    _print_hits(args, hits, ["SCORE", "BOARD", "SECTION", "KEY", "REV", "VALUE"],
                lambda h: [f"{h.score:.3f}", h.board, h.section, h.key, h.revision, preview(h.value)])
    return 0


async def recall(args: argparse.Namespace) -> int:
    """Search long-term memories, best first.

    Raises:
        SearchError: no worker answers, or the search failed.
        PermissionDeniedError: a ``--board`` this agent may not read.
        InvalidPayloadError: an invalid filter.
    """
    filters = _filters(args)
    if args.kinds:
        filters["kinds"] = args.kinds
    filters.update(_lifecycle(args))
    async with connect_agent(args) as agent:
        hits = await agent.recall(args.query, **filters)
    _print_hits(args, hits, ["SCORE", "BOARD", "KIND", "AGENT", "TEXT"],
                lambda h: [f"{h.score:.3f}", h.board, h.kind, h.agent, preview(h.text, 80)])
    return 0
