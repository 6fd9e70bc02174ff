"""Requests and replies of the message search endpoint (``bb.search.<principal>.messages``).

Encoded like every search request (msgpack, or JSON with ``Bb-Encoding:
json``); errors come back as in ``blackboard.protocol.schemas.search`` (``Bb-Error``
header, ``ErrorReply`` body). Messages are found by keyword (PostgreSQL full
text over the message type, topic and the strings of its body) and filtered by
sender, recipient, kind, type, board, topic, correlation id and time. The copies
of one direct message to several recipients are one hit.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field, model_validator

from blackboard.protocol.schemas._base import Name, Timestamp, WireModel
from blackboard.protocol.schemas.message import MessageKind
from blackboard.protocol.signing import Verdict

__all__ = ["MessageHit", "MessageSearchRequest", "MessageSearchResponse"]


class MessageSearchRequest(WireModel):
    """``bb.search.<principal>.messages``: find stored agent messages.

    Without ``query`` the matching messages are listed by time (``order``);
    with it they are ranked by ``ts_rank`` (keyword mode; messages have no
    embeddings).
    """

    v: Literal[1] = Field(1, description="Schema version.")
    query: str | None = Field(None, min_length=1, max_length=10_000,
                              description="Words to look for (any of them); none lists by time.")
    senders: list[Name] = Field(default_factory=list, description="Sent by one of these agents.")
    recipients: list[Name] = Field(default_factory=list,
                                   description="Direct messages to at least one of these agents.")
    kinds: list[MessageKind] = Field(default_factory=list, description="direct, broadcast and/or topic.")
    types: list[str] = Field(default_factory=list, description="Only these message types.")
    boards: list[Name] = Field(default_factory=list, description="Only messages about these boards.")
    topics: list[str] = Field(default_factory=list, description="Only these exact topics.")
    correlation_id: str | None = Field(None, description="Only messages of this conversation/request.")
    since: Timestamp | None = Field(None, description="Stored at or after this instant.")
    until: Timestamp | None = Field(None, description="... and before this instant.")
    top_k: int = Field(50, ge=1, le=1000, description="At most this many hits.")
    order: Literal["newest", "oldest"] = Field("newest", description="Order without a query.")

    @model_validator(mode="after")
    def _window(self) -> MessageSearchRequest:
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise ValueError("until must be after since")
        return self


class MessageHit(WireModel):
    """One stored message (the first stored copy of a multi-recipient direct message)."""

    id: str | None
    seq: int = Field(description="Stream sequence in BB_MSG.")
    sender: str | None
    recipients: list[str]
    kind: str | None
    board: str | None = None
    topic: str | None = None
    type: str | None
    body: Any = None
    correlation_id: str | None = None
    reply_to: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime | None = None
    stored_at: datetime
    verdict: Verdict = Field(Verdict.UNSIGNED, description=(
        "The message's signature as the worker found it at ingest: verified, or unsigned (stored "
        "without a signature). Messages with any other verdict are never stored."))
    score: float = Field(0.0, description="ts_rank with a query, 0 otherwise.")


class MessageSearchResponse(WireModel):
    v: Literal[1] = 1
    hits: list[MessageHit]
    took_ms: float = 0.0
