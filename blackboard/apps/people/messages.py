"""``blackboard send / inbox``: direct messages, as one agent."""

from __future__ import annotations

import argparse
from typing import Any

from agents_sdk import Message
from blackboard.apps.people.common import connect_agent, read_value
from blackboard.apps.people.output import dumps, instant, jsonable, preview, table
from blackboard.protocol.errors import InvalidPayloadError

__all__ = ["inbox", "message_json", "send"]


def message_json(msg: Message) -> dict[str, Any]:
    """A received message as a JSON object: its envelope's fields and where it was stored."""
    return {
        "id": msg.id, "sender": msg.sender, "kind": msg.kind, "type": msg.type, "body": jsonable(msg.body),
        "recipients": msg.recipients, "board": msg.board, "topic": msg.topic,
        "correlation_id": msg.correlation_id, "metadata": jsonable(msg.metadata),
        "created_at": jsonable(msg.created_at), "stored_at": jsonable(msg.stored_at), "seq": msg.seq,
        "subject": msg.subject, "delivered": msg.delivered, "verdict": msg.verdict.value,
    }


async def send(args: argparse.Namespace) -> int:
    """Send a direct message to one agent or several (``a,b,c``).

    Raises:
        InvalidKeyError: an invalid recipient or type.
        PermissionDeniedError: this agent may not send it.
    """
    recipients = [name.strip() for name in args.to.split(",") if name.strip()]
    if not recipients:
        raise InvalidPayloadError("give at least one recipient (TO)")
    body = None if args.body is None else read_value(args.body, what="BODY", plain=args.string)
    async with connect_agent(args) as agent:
        sent = await agent.send(recipients if len(recipients) > 1 else recipients[0], args.type, body,
                                board=args.board, correlation_id=args.correlation_id)
        me = agent.id
    if args.json:
        print(dumps({"id": sent.id, "sender": me, "to": recipients, "type": args.type,
                     "sequences": list(sent.sequences)}), flush=True)
    else:
        print(f"sent {sent.id} ({args.type}) to {', '.join(recipients)}: stream sequence "
              f"{', '.join(str(s) for s in sent.sequences)}", flush=True)
    return 0


async def inbox(args: argparse.Namespace) -> int:
    """Print the inbox's messages, oldest first; acknowledge them with ``--ack``.

    Raises:
        InvalidPayloadError: ``--max`` below 1 or a negative ``--wait``.
        NoResponderError: no system service (worker) answers to create the inbox.
    """
    if args.max < 1:
        raise InvalidPayloadError(f"--max must be at least 1, not {args.max}")
    if args.wait < 0:
        raise InvalidPayloadError(f"--wait must be 0 or more seconds, not {args.wait:g}")
    messages: list[Message] = []
    async with connect_agent(args) as agent:
        async with agent.inbox(types=args.types, timeout=args.wait or 0.001, limit=args.max) as reader:
            async for msg in reader:
                messages.append(msg)
                if args.json:
                    print(dumps(message_json(msg)), flush=True)
                if args.ack:
                    await msg.ack(wait=True)
    if not args.json:
        if messages:
            print(table(["SEQ", "FROM", "TYPE", "SENT (UTC)", "BODY"],
                        [[m.seq or "-", m.sender, m.type, instant(m.created_at), preview(m.body)] for m in messages],
                        right=("SEQ",)), flush=True)
            print(f"({len(messages)} {'acknowledged' if args.ack else 'left in the inbox: --ack to acknowledge'})",
                  flush=True)
        else:
            print("(inbox empty)", flush=True)
    return 0
