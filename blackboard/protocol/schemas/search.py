"""Requests and replies of the search micro service (``bb.search.<endpoint>``).

Every request and reply is encoded like any wire object (msgpack, or JSON with
``Bb-Encoding: json``; the reply uses the request's encoding). A failed request
is answered with the header ``Bb-Error: <ErrorClass>`` (plus the standard
``Nats-Service-Error`` / ``Nats-Service-Error-Code`` headers) and an
:class:`ErrorReply` body.

Scores: ``semantic`` is the cosine similarity (-1..1); ``keyword`` is BM25
over PostgreSQL full text (0 and up, not bounded); ``hybrid`` is a convex
combination of both, each min-max normalised over the candidates, with the
neighbour context of memories (0..1; 1.0: best of both retrievers), or
normalised reciprocal-rank fusion when the service is configured for it.
``min_score`` applies to the score of the requested mode.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field, model_validator

from blackboard.protocol.schemas._base import Name, Timestamp, WireModel
from blackboard.protocol.schemas.memory import MemoryKind

__all__ = [
    "AsOfRequest",
    "EntryHit",
    "EntryRevision",
    "EntrySearchRequest",
    "EntrySearchResponse",
    "ErrorReply",
    "HistoryRequest",
    "HistoryResponse",
    "MemoryHit",
    "MemorySearchRequest",
    "MemorySearchResponse",
    "SearchMode",
]

SearchMode = Literal["semantic", "keyword", "hybrid"]


class _Filters(WireModel):
    v: Literal[1] = Field(1, description="Schema version.")
    query: str = Field(min_length=1, max_length=10_000, description="What to look for, in words.")
    mode: SearchMode = "hybrid"
    top_k: int = Field(10, ge=1, le=1000)
    min_score: float | None = Field(None, description="Drop hits scoring below this (mode's score).")
    boards: list[Name] = Field(default_factory=list, description="Only these boards (all when empty).")
    author: str | None = Field(None, description="Only items written by this agent.")
    tags_any: list[str] = Field(default_factory=list, description="Items with at least one of these tags.")
    tags_all: list[str] = Field(default_factory=list, description="Items with all of these tags.")
    since: Timestamp | None = Field(None, description="Created (memories) / updated (entries) at or after.")
    until: Timestamp | None = Field(None, description="... and before this instant.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="JSON containment (@>) on metadata.")


class MemorySearchRequest(_Filters):
    """``bb.search.memories``: search long-term memories."""

    kinds: list[MemoryKind] = Field(default_factory=list, description="Only these kinds (all when empty).")


class EntrySearchRequest(_Filters):
    """``bb.search.entries``: search the current (not deleted) board entries."""

    sections: list[Name] = Field(default_factory=list, description="Only these sections (all when empty).")


class MemoryHit(WireModel):
    """One memory found, with its score and provenance."""

    id: str
    board: str
    agent: str
    kind: str
    text: str
    tags: list[str]
    metadata: dict[str, Any]
    importance: float
    source: str | None = None
    created_at: datetime
    updated_at: datetime
    revision: int = Field(description="Stream sequence of the message that stored this version.")
    score: float
    scores: dict[str, float] = Field(default_factory=dict, description="Per-retriever scores (hybrid).")


class EntryHit(WireModel):
    """One board entry found: the current value, its address and revision."""

    board: str
    section: str
    key: str
    revision: int
    value: Any = None
    content_type: str | None = None
    tags: list[str]
    metadata: dict[str, Any]
    author: str | None = None
    created_at: datetime | None = None
    updated_at: datetime
    score: float
    scores: dict[str, float] = Field(default_factory=dict)


class MemorySearchResponse(WireModel):
    v: Literal[1] = 1
    hits: list[MemoryHit]
    took_ms: float = 0.0


class EntrySearchResponse(WireModel):
    v: Literal[1] = 1
    hits: list[EntryHit]
    took_ms: float = 0.0


class HistoryRequest(WireModel):
    """``bb.search.history``: every stored revision of one key, oldest first."""

    v: Literal[1] = 1
    board: Name
    section: Name
    key: str = Field(min_length=1)
    limit: int | None = Field(None, ge=1, description="Only the newest `limit` revisions.")


class AsOfRequest(WireModel):
    """``bb.search.as_of``: a key's value at a revision or at an instant (give one)."""

    v: Literal[1] = 1
    board: Name
    section: Name
    key: str = Field(min_length=1)
    revision: int | None = Field(None, ge=0, description="The newest revision <= this.")
    at: Timestamp | None = Field(None, description="The newest revision stored at or before this.")

    @model_validator(mode="after")
    def _one(self) -> AsOfRequest:
        if (self.revision is None) == (self.at is None):
            raise ValueError("give exactly one of revision and at")
        return self


class EntryRevision(WireModel):
    """One stored revision of a key (``op`` PUT, DEL or PURGE)."""

    board: str
    section: str
    key: str
    revision: int
    op: Literal["PUT", "DEL", "PURGE"]
    value: Any = None
    content_type: str | None = None
    tags: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    author: str | None = None
    created_at: datetime | None = None
    stored_at: datetime


class HistoryResponse(WireModel):
    v: Literal[1] = 1
    revisions: list[EntryRevision]


class ErrorReply(WireModel):
    """Body of an error reply (header ``Bb-Error`` names the class)."""

    v: Literal[1] = 1
    error: str = Field(description="Error class name, e.g. NotFoundError, InvalidPayloadError, SearchError.")
    message: str
    key: str | None = None
