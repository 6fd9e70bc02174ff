"""``blackboard get / put / ls / history / watch``: a board as one agent sees it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from agents_sdk import Agent, Board
from blackboard.apps.people.common import connect_agent, json_object, read_value
from blackboard.apps.people.output import (
    dumps,
    entry_json,
    instant,
    preview,
    printable,
    table,
    value_text,
)
from blackboard.client.board_store import WatchStart
from blackboard.protocol.entries import Entry
from blackboard.protocol.errors import InvalidPayloadError, NotFoundError
from blackboard.protocol.filters import parse_where

__all__ = ["delete", "get", "history", "ls", "put", "watch"]


def _out(text: str) -> None:
    print(text, flush=True)


def _address(entry: Entry) -> str:
    return f"{entry.board}/{entry.section}/{entry.key}"


def _describe(entry: Entry) -> str:
    """An entry for people: its fields, a blank line, its value."""
    rows = [("entry", _address(entry)), ("revision", str(entry.revision)),
            ("author", f"{entry.author or '-'}  ({entry.verdict.value})"),
            ("stored", f"{instant(entry.stored_at)} UTC" if entry.stored_at else "-"),
            ("type", entry.content_type)]
    if entry.deleted:
        rows.append(("operation", entry.operation.value))
    if entry.tags:
        rows.append(("tags", ", ".join(entry.tags)))
    if entry.metadata:
        rows.append(("metadata", dumps(entry.metadata)))
    head = "\n".join(f"{name:<9} {printable(text, one_line=True)}" for name, text in rows)
    return head if entry.deleted else f"{head}\n\n{value_text(entry.value)}"


def _entry_rows(entries: Sequence[Entry], *, with_section: bool = True) -> str:
    headers = ["SECTION", "KEY", "REV", "AUTHOR", "STORED (UTC)", "VALUE"] if with_section else \
        ["REV", "OP", "AUTHOR", "STORED (UTC)", "VALUE"]
    rows = []
    for e in entries:
        value = "" if e.deleted else preview(e.value)
        if with_section:
            rows.append([e.section, e.key, e.revision, e.author or "-", instant(e.stored_at), value])
        else:
            rows.append([e.revision, e.operation.value, e.author or "-", instant(e.stored_at), value])
    return table(headers, rows, right=("REV",))


async def get(args: argparse.Namespace) -> int:
    """Print one entry (``--revision``: that revision).

    Raises:
        NotFoundError: absent, deleted, or that revision is not kept.
    """
    async with connect_agent(args) as agent:
        entry = await agent.board(args.board).get(args.section, args.key, revision=args.revision)
    _out(dumps(entry_json(entry)) if args.json else _describe(entry))
    return 0


async def put(args: argparse.Namespace) -> int:
    """Write an entry: unconditionally, or with ``--expect-revision`` as a compare-and-set
    (0: create, only if the key is absent).

    Raises:
        ConflictError: the key is not at the expected revision.
        InvalidPayloadError, InvalidKeyError: bad input.
    """
    value = read_value(args.value, what="VALUE", plain=args.string)
    metadata = json_object(args.metadata, what="--metadata")
    tags = [t.strip() for t in args.tags.split(",") if t.strip()] if args.tags else []
    expected = args.expect_revision
    if expected is not None and expected < 0:
        raise InvalidPayloadError(f"--expect-revision must be 0 (absent) or a revision, not {expected}")
    options: dict[str, Any] = {"content_type": args.content_type, "tags": tags, "metadata": metadata,
                               "ttl": args.ttl}
    async with connect_agent(args) as agent:
        board = agent.board(args.board)
        if expected is None:
            revision = await board.put(args.section, args.key, value, **options)
        elif expected == 0:
            revision = await board.create(args.section, args.key, value, **options)
        else:
            revision = await board.update(args.section, args.key, value, expected_revision=expected, **options)
    if args.json:
        _out(dumps({"board": args.board, "section": args.section, "key": args.key, "revision": revision}))
    else:
        _out(f"{args.board}/{args.section}/{args.key}: revision {revision}")
    return 0


async def delete(args: argparse.Namespace) -> int:
    """Delete a key: unconditionally, or with ``--expect-revision`` only at that revision.

    Raises:
        NotFoundError: the key is absent (or already deleted).
        ConflictError: the key is not at the expected revision.
    """
    expected = args.expect_revision
    if expected is not None and expected < 1:
        raise InvalidPayloadError(f"--expect-revision must be a revision (1 or more), not {expected}")
    async with connect_agent(args) as agent:
        board = agent.board(args.board)
        await board.get(args.section, args.key)  # NotFoundError: nothing to delete
        revision = await board.delete(args.section, args.key, expected_revision=expected)
    if args.json:
        _out(dumps({"board": args.board, "section": args.section, "key": args.key, "revision": revision,
                    "operation": "delete"}))
    else:
        _out(f"{args.board}/{args.section}/{args.key}: deleted at revision {revision}")
    return 0


async def _must_exist(board: Board, section: str | None) -> None:
    """Raise NotFoundError when the board (or the section) holds no live key."""
    if section is None:
        if not await board.sections():
            raise NotFoundError(board.name, f"board {board.name!r} holds no live key (or does not exist)")
    elif not await board.keys(section):
        raise NotFoundError(section, f"section {section!r} of board {board.name!r} holds no live key")


async def ls(args: argparse.Namespace) -> int:
    """List the boards, a board's sections, a section's keys, or (``--long``/``--where``) entries.

    Raises:
        NotFoundError: the board or section holds no live key.
        InvalidPayloadError: ``--where`` is not a valid filter.
    """
    raw = json_object(args.where, what="--where")
    where = parse_where(raw) if raw is not None else None  # a bad filter is told before connecting
    if args.board is None:
        if args.section is not None or args.long or where is not None:
            raise InvalidPayloadError("give BOARD to list sections, keys or entries")
        async with connect_agent(args) as agent:
            boards = await agent.boards()
        _out(dumps({"boards": boards}) if args.json else "\n".join(boards) if boards else "(no boards)")
        return 0
    async with connect_agent(args) as agent:
        board = agent.board(args.board)
        if args.long or where is not None:
            entries = await board.entries(args.section, where=where)
            if not entries:
                await _must_exist(board, args.section)
            if args.json:
                for entry in entries:
                    _out(dumps(entry_json(entry)))
            elif entries:
                _out(_entry_rows(entries))
            else:
                _out("(no entry matches)")
            return 0
        if args.section is None:
            names = await board.sections()
            listing: dict[str, Any] = {"board": args.board, "sections": names}
        else:
            names = await board.keys(args.section)
            listing = {"board": args.board, "section": args.section, "keys": names}
        if not names:
            await _must_exist(board, args.section)
    _out(dumps(listing) if args.json else "\n".join(printable(n, one_line=True) for n in names))
    return 0


async def history(args: argparse.Namespace) -> int:
    """Print the revisions of a key, oldest first (``--stored``: from PostgreSQL).

    Raises:
        NotFoundError: no revision of the key is kept (or stored).
        SearchError: ``--stored`` and no worker answers.
    """
    async with connect_agent(args) as agent:
        board = agent.board(args.board)
        if args.stored:
            revisions = await board.stored_history(args.section, args.key, limit=args.limit)
            if args.json:
                for rev in revisions:
                    _out(dumps(rev))
            else:
                _out(table(["REV", "OP", "AUTHOR", "STORED (UTC)", "VALUE"],
                           [[r.revision, r.op.lower(), r.author or "-", instant(r.stored_at),
                             "" if r.op != "PUT" else preview(r.value)] for r in revisions], right=("REV",)))
            return 0
        entries = await board.history(args.section, args.key)
    if not entries:
        raise NotFoundError(args.key, f"no revision of {args.board}/{args.section}/{args.key!r} is kept")
    if args.json:
        for entry in entries:
            _out(dumps(entry_json(entry)))
    else:
        _out(_entry_rows(entries, with_section=False))
    return 0


def _change_line(entry: Entry) -> str:
    """One change for people: time, operation, address, revision, author, value."""
    text = f"{instant(entry.stored_at)}  {entry.operation.value:<6} {_address(entry)}  rev {entry.revision}"
    if entry.author:
        text += f"  by {entry.author}"
    if not entry.deleted:
        text += f": {preview(entry.value, 100)}"
    return printable(text, one_line=True)


async def watch(args: argparse.Namespace) -> int:
    """Print changes to a board, a section or a key as they happen, until Ctrl-C or ``--count``."""
    if args.key is not None and args.section is None:  # argparse fills section first: cannot happen
        raise InvalidPayloadError("give SECTION with KEY")
    if args.count is not None and args.count < 1:
        raise InvalidPayloadError(f"--count must be at least 1, not {args.count}")
    start: WatchStart = "all" if args.from_start else "current" if args.current else "new"
    agent: Agent
    async with connect_agent(args) as agent:
        seen = 0
        async with agent.board(args.board).watch(args.section, args.key, start=start) as changes:
            if not args.json:
                print(f"watching {args.board}{'/' + args.section if args.section else ''}"
                      f"{'/' + args.key if args.key else ''} (Ctrl-C to stop)", file=sys.stderr, flush=True)
            async for change in changes:
                _out(dumps(entry_json(change.entry)) if args.json else _change_line(change.entry))
                seen += 1
                if args.count is not None and seen >= args.count:
                    break
    return 0
