"""What the MCP tools answer: structured results (pydantic models, so each tool
publishes an output schema) and the tool error a blackboard error becomes."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Literal, TypeVar, cast

from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel, Field, ValidationError

from agents_sdk import Entry
from agents_sdk.messaging.inbox import Message
from blackboard.protocol.errors import (
    BlackboardError,
    ConflictError,
    NotFoundError,
    ProposalClosedError,
    ProposalNotFoundError,
    RemoteError,
)
from blackboard.protocol.schemas.search import EntryHit, MemoryHit
from blackboard.protocol.schemas.vote import Outcome, TallyCounts

__all__ = [
    "AckResult", "BoardsResult", "ClaimResult", "DeleteResult", "EntriesResult", "EntryOut", "HistoryResult",
    "InboxResult", "KeysResult", "MemoryHits", "MessageOut", "OutcomeResult", "ProposeResult", "ReleaseResult",
    "RememberResult", "ReplyResult", "SearchHits", "SectionsResult", "SentResult", "ToolFailure", "VoteResult",
    "WriteResult", "entry_out", "error_result", "guarded", "message_out", "validation_message",
]

log = logging.getLogger("blackboard.apps.mcp")


class ToolFailure(Exception):
    """A tool's own refusal of its arguments (answered as a tool error, like a blackboard error)."""


class EntryOut(BaseModel):
    """One revision of a board entry."""

    board: str
    section: str
    key: str
    revision: int = Field(description="The entry's revision: pass it as expected_revision to update or delete.")
    value: Any = Field(default=None, description="The JSON value (null for a delete).")
    deleted: bool = Field(default=False, description="True for a delete or purge revision.")
    content_type: str
    author: str = Field(description="The agent that wrote this revision.")
    tags: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime | None = Field(default=None, description="The writer's clock.")
    stored_at: datetime | None = Field(default=None, description="When the server stored it.")
    verdict: str = Field(description="Signature verdict: 'verified', or 'unsigned' on an open bus.")


def entry_out(entry: Entry) -> EntryOut:
    """The result form of an SDK entry."""
    value = entry.value
    if isinstance(value, bytes | bytearray):
        value = {"$bytes": len(value), "note": "binary value: not shown"}
    return EntryOut(board=entry.board, section=entry.section, key=entry.key, revision=entry.revision,
                    value=value, deleted=entry.deleted, content_type=entry.content_type, author=entry.author,
                    tags=list(entry.tags), metadata=dict(entry.metadata), created_at=entry.created_at,
                    stored_at=entry.stored_at, verdict=str(entry.verdict.value))


class WriteResult(BaseModel):
    board: str
    section: str
    key: str
    revision: int = Field(description="The new revision (use it as expected_revision for the next update).")


class DeleteResult(WriteResult):
    deleted: bool = True


class HistoryResult(BaseModel):
    entries: list[EntryOut] = Field(description="The kept revisions, oldest first (deletes included).")


class BoardsResult(BaseModel):
    boards: list[str]


class SectionsResult(BaseModel):
    board: str
    sections: list[str]


class KeysResult(BaseModel):
    board: str
    section: str
    keys: list[str]


class EntriesResult(BaseModel):
    board: str
    section: str | None
    entries: list[EntryOut] = Field(description="Live entries sorted by (section, key).")


class SearchHits(BaseModel):
    hits: list[EntryHit] = Field(description="Best first; score is the relevance.")


class MemoryHits(BaseModel):
    hits: list[MemoryHit] = Field(description="Best first; score is the relevance.")


class RememberResult(BaseModel):
    id: str = Field(description="The memory's id (it is searchable once a worker has embedded it).")


class SentResult(BaseModel):
    id: str = Field(description="The message id (a reply's correlation_id).")
    seq: int = Field(description="Stream sequence of the stored message.")


class MessageOut(BaseModel):
    """A message read from the inbox."""

    id: str = Field(description="Pass it to inbox_ack once handled, or to message_reply.")
    sender: str
    kind: str = Field(description="'direct', 'broadcast' (a board's) or 'topic'.")
    type: str
    body: Any = None
    board: str | None = None
    topic: str | None = None
    correlation_id: str | None = Field(default=None, description="The id of the message this one answers.")
    created_at: datetime
    delivered: int = Field(description="Times delivered since the inbox was last rewound to its first "
                                       "unacknowledged message.")


def message_out(msg: Message) -> MessageOut:
    """The result form of an inbox message."""
    body = msg.body
    if isinstance(body, bytes | bytearray):
        body = {"$bytes": len(body), "note": "binary body: not shown"}
    return MessageOut(id=msg.id, sender=msg.sender, kind=str(msg.kind), type=msg.type, body=body, board=msg.board,
                      topic=msg.topic, correlation_id=msg.correlation_id, created_at=msg.created_at,
                      delivered=msg.delivered)


class InboxResult(BaseModel):
    messages: list[MessageOut] = Field(description="Oldest first. Unacknowledged ones come back on a later read.")
    unacknowledged: int = Field(description="Messages read by this session and not acknowledged yet.")


class AckResult(BaseModel):
    acknowledged: list[str]


class ReplyResult(BaseModel):
    reply: Any = Field(default=None, description="The body the other agent answered.")


class ProposeResult(BaseModel):
    proposal_id: str
    board: str
    section: str
    key: str


class VoteResult(BaseModel):
    proposal_id: str
    ballot_id: str
    decided: bool = Field(description="True when this ballot decided the proposal.")
    outcome: Outcome | None = None


class OutcomeResult(BaseModel):
    proposal_id: str
    status: Literal["open", "accepted", "rejected", "no_quorum"]
    outcome: Outcome | None = Field(default=None, description="The committed outcome (null while open).")
    counts: TallyCounts | None = Field(default=None, description="The tally so far (while open).")


class ClaimResult(BaseModel):
    board: str
    section: str
    key: str
    revision: int = Field(description="The claim's revision (task_release takes it).")
    owner: str
    ttl: float = Field(description="Seconds until the claim lapses by itself.")


class ReleaseResult(BaseModel):
    board: str
    section: str
    key: str
    released: bool


_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])


def error_result(exc: BaseException) -> CallToolResult:
    """The tool error for ``exc``: text for the model, and structured details (``error``: the
    error's class, ``message``; a conflict adds ``current_revision``)."""
    details: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    hint = ""
    if isinstance(exc, ConflictError):
        details.update(key=exc.key, expected_revision=exc.expected_revision, current_revision=exc.current_revision)
        hint = (f". The key is at revision {exc.current_revision}: read it again (board_get) and retry with "
                f"expected_revision={exc.current_revision}.")
    elif isinstance(exc, ProposalNotFoundError | ProposalClosedError):
        details["proposal_id"] = exc.proposal_id
    elif isinstance(exc, NotFoundError):
        details["key"] = exc.key
    elif isinstance(exc, RemoteError):
        details.update(to=exc.to, type=exc.type, remote_error=exc.error)
    elif isinstance(exc, ValidationError):
        details["message"] = validation_message(exc)
    text = f"{details['error']}: {details['message']}{hint}"
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=details, is_error=True)


def validation_message(exc: ValidationError) -> str:
    """``exc``'s errors in one line: ``field: problem; ...`` (no input echoed back)."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())


def guarded(fn: _F) -> _F:
    """Answer the blackboard's errors (and a tool's refusals) raised by tool ``fn`` as tool
    errors instead of letting the SDK hide them as an unexpected failure."""

    @functools.wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except (BlackboardError, ToolFailure, ValidationError) as exc:
            log.info("tool %s: %s: %s", fn.__name__, type(exc).__name__, exc)
            return error_result(exc)

    return cast(_F, call)


def dumps(value: Any) -> str:
    """Compact JSON of a result (resource bodies)."""
    return json.dumps(value, separators=(",", ":"), default=str, ensure_ascii=False)
