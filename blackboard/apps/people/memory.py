"""``blackboard remember``: write a long-term memory, as one agent."""

from __future__ import annotations

import argparse
from datetime import datetime

from blackboard.apps.people.common import connect_agent, json_object, read_value
from blackboard.apps.people.output import dumps
from blackboard.protocol.errors import InvalidPayloadError

__all__ = ["parse_time", "remember"]


def parse_time(text: str | None, *, what: str) -> datetime | None:
    """An ISO 8601 time with a UTC offset given with a flag (``Z`` for UTC); None when not given.

    Raises:
        InvalidPayloadError: not an ISO 8601 time, or one without an offset.
    """
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidPayloadError(f"{what} is not an ISO 8601 time: {text[:60]!r}") from None
    if value.tzinfo is None:
        raise InvalidPayloadError(f"{what} needs a UTC offset, e.g. {text}Z or {text}+02:00")
    return value


async def remember(args: argparse.Namespace) -> int:
    """Store a long-term memory; prints its id once JetStream has it (with ``--wait``, once a
    worker has stored and embedded it).

    Raises:
        InvalidPayloadError, InvalidKeyError: bad input (told before connecting where it can be).
        NotSearchableError: (``--wait``) not stored and embedded in time; the memory is written.
    """
    text = read_value(args.text, what="TEXT", plain=True)
    if args.text == "-":
        text = text.rstrip("\r\n")  # the final newline of a file or echo is not part of the memory
    metadata = json_object(args.metadata, what="--metadata")
    occurred_at = parse_time(args.occurred_at, what="--occurred-at")
    board = args.board or "default"
    async with connect_agent(args) as agent:
        mid = await agent.remember(text, kind=args.kind, tags=args.tags or (), metadata=metadata,
                                   importance=args.importance, board=board, id=args.id, key=args.key,
                                   occurred_at=occurred_at, confidence=args.confidence,
                                   wait="searchable" if args.wait else None, timeout=args.timeout)
    if args.json:
        print(dumps({"id": mid, "board": board}), flush=True)
    else:
        print(f"remembered {mid} on board {board}", flush=True)
    return 0
