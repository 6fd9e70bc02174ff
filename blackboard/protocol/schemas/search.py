"""Requests and replies of the search micro service (``bb.search.<principal>.<endpoint>``).

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

The filters of a request (which boards, kinds or sections, author, tags, time,
metadata) travel flat on the wire; :class:`SearchFilters` is the same set as one
typed value, which the SDK builds from its keyword arguments and the SQL
builders take (``request.filters``).
"""

from __future__ import annotations

from datetime import datetime
from functools import cached_property
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    SerializerFunctionWrapHandler,
    WithJsonSchema,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.filters import EMPTY_WHERE, MAX_IN, MAX_PATHS, Where, parse_where
from blackboard.protocol.schemas._base import Id, Name, Timestamp, WireModel
from blackboard.protocol.schemas.memory import MemoryKind
from blackboard.protocol.signing import Verdict

__all__ = [
    "MAX_SEARCHABLE_ITEMS",
    "AsOfRequest",
    "BoardsResponse",
    "EntryHit",
    "EntryRevision",
    "EntrySearchRequest",
    "EntrySearchResponse",
    "ErrorReply",
    "HistoryRequest",
    "HistoryResponse",
    "MemoryDetail",
    "MemoryGetRequest",
    "MemoryHit",
    "MemorySearchRequest",
    "MemorySearchResponse",
    "MemorySource",
    "SearchFilters",
    "SearchMode",
    "SearchTarget",
    "SearchableItem",
    "SearchableRequest",
    "SearchableResponse",
]

SearchMode = Literal["semantic", "keyword", "hybrid"]
#: The description of a hit's ``verdict`` (every stored record has one).
_VERDICT = ("The record's signature as the worker found it at ingest: verified, or unsigned (stored "
            "without a signature: worker.require_signatures off, an open bus, verification off, or "
            "written before signatures). Records with any other verdict are never stored.")
#: What a search looks through: long-term memories or current board entries.
SearchTarget = Literal["memory", "entry"]


def _where_json(where: Where) -> dict[str, Any]:
    return where.to_json()


def _parse_where(obj: Any) -> Where:
    try:
        return parse_where(obj)
    except InvalidPayloadError as exc:  # pydantic would prefix "Value error, "
        raise PydanticCustomError("where", exc.reason.removeprefix("where: ")) from exc


#: ``where`` on the wire: an object of dotted path -> condition (see :mod:`blackboard.protocol.filters`);
#: in Python the parsed :class:`~blackboard.protocol.filters.Where` (parsed once, as the request is
#: validated; a mapping or a ``Where`` is accepted).
WhereField = Annotated[
    Where,
    PlainValidator(_parse_where),
    PlainSerializer(_where_json, return_type=dict[str, Any]),
    WithJsonSchema({
        "type": "object", "maxProperties": MAX_PATHS,
        "propertyNames": {"pattern": r"^(metadata|value)(\.[^.]+){0,8}$", "maxLength": 256},
        "additionalProperties": {
            "description": "A JSON value (equality) or an object of operators, ANDed: $eq, $ne (any JSON "
                           "value), $gt, $gte, $lt, $lte (a number or a string), $in, $nin (a list of at "
                           f"most {MAX_IN} JSON scalars), $exists (a boolean)."},
    }),
]


class _Scope(WireModel):
    """The filters of every search target, declared once (:class:`SearchFilters` and both
    search requests inherit them)."""

    boards: list[Name] = Field(default_factory=list, description="Only these boards (all when empty).")
    author: str | None = Field(None, description="Only items written by this agent.")
    tags_any: list[str] = Field(default_factory=list, description="Items with at least one of these tags.")
    tags_all: list[str] = Field(default_factory=list, description="Items with all of these tags.")
    since: Timestamp | None = Field(None, description="Created (memories) / updated (entries) at or after.")
    until: Timestamp | None = Field(None, description="... and before this instant.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="JSON containment (@>) on metadata.")
    where: WhereField = Field(EMPTY_WHERE, json_schema_extra={"default": {}}, description=(
        "Comparison filters: dotted path (metadata.<...>, or value.<...> for entries) -> condition, "
        "ANDed (docs/search.md, 'Filters')."))

    @model_serializer(mode="wrap")
    def _without_empty_where(self, handler: SerializerFunctionWrapHandler) -> Any:
        # An empty where is left out: a request without one encodes as it did before it existed.
        # A request with one is schema version 2: a service from before where refuses v 2
        # (its v is Literal[1]) rather than skip the unknown field and widen the search.
        # Likewise the lifecycle filters (memories): left out at their defaults, and a request
        # setting one is version 3, which a service from before them refuses.
        out = handler(self)
        if isinstance(out, dict):
            version = 1
            if not self.where:
                out.pop("where", None)
            else:
                version = 2
            for name, default in _LIFECYCLE_DEFAULTS.items():
                if name in out and out[name] == default:
                    del out[name]
                elif name in out:
                    version = 3
            if "v" in out and version > 1:
                out["v"] = max(version, out["v"])
        return out


class _Kinds(WireModel):
    kinds: list[MemoryKind] = Field(default_factory=list, description="Only these kinds (all when empty).")


class _Lifecycle(WireModel):
    """The filters of a memory's lifecycle (docs/memory-lifecycle.md): which versions, by valid
    time, by what the board knew, by event time and confidence. Memory searches only."""

    include_superseded: bool = Field(False, description=(
        "Closed versions (superseded on their subject key) and contested ones too. Default: only "
        "current memories (live, not superseded, not contested)."))
    include_archived: bool = Field(False, description="Archived memories (pruned or merged) too.")
    as_of: Timestamp | None = Field(None, description=(
        "Valid time: the versions valid at this instant (valid_from <= as_of < valid_to, or no "
        "valid_to; a memory without a key: valid_from <= as_of); superseded versions are eligible."))
    known_at: Timestamp | None = Field(None, description=(
        "What the board knew then: memories written (created_at) at or before this instant and, per "
        "subject key, only the newest version (by valid_from, then stream order) among those."))
    occurred_after: Timestamp | None = Field(None, description=(
        "Event time (occurred_at, else the write time) at or after this instant."))
    occurred_before: Timestamp | None = Field(None, description="Event time before this instant.")
    min_confidence: float | None = Field(None, ge=0.0, le=1.0, description=(
        "Confidence at least this (a memory without a confidence fails it)."))


#: The lifecycle filters and their defaults (a request leaves them out at these).
_LIFECYCLE_DEFAULTS: dict[str, Any] = {name: f.default for name, f in _Lifecycle.model_fields.items()}


class _Sections(WireModel):
    sections: list[Name] = Field(default_factory=list, description="Only these sections (all when empty).")


class SearchFilters(_Sections, _Lifecycle, _Kinds, _Scope):
    """Which items a search may return: a frozen value object that carries the filters from
    the SDK's signatures through the search request to the SQL that applies them.

    The filters are ANDed; an empty list or None leaves its field free. ``kinds`` and the
    lifecycle filters (``include_superseded``, ``include_archived``, ``as_of``, ``known_at``,
    ``occurred_after``, ``occurred_before``, ``min_confidence``) apply to memories only and
    ``sections`` to entries only (a request for the other target refuses them). Without a
    lifecycle filter a memory search returns current memories only: live (not archived),
    not superseded, not contested. Unknown fields are refused: a misspelt filter would
    otherwise widen the search without a word.

    Raises:
        pydantic.ValidationError: a wrong type, an invalid board or section name, an
            unknown field, a ``where`` :func:`~blackboard.protocol.filters.parse_where` refuses.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


class _Query(WireModel):
    v: Literal[1, 2, 3] = Field(1, description=(
        "Schema version: 3 when a memory request sets a lifecycle filter, 2 when a request carries a where "
        "(a service that predates them refuses it), else 1."))
    query: str = Field(min_length=1, max_length=10_000, description="What to look for, in words.")
    mode: SearchMode = "hybrid"
    top_k: int = Field(10, ge=1, le=1000)
    min_score: float | None = Field(None, description="Drop hits scoring below this (mode's score).")


class _SearchRequest(_Scope, _Query):
    """A search request: the query, how to rank, and the filters (flat on the wire:
    ``query``, ``mode``, ``top_k``, ``min_score``, then the filters; :attr:`filters`
    gathers them)."""

    #: The target searched, and the filters of the other target this request refuses.
    target: ClassVar[SearchTarget]
    _foreign: ClassVar[tuple[str, ...]]

    @classmethod
    def of(cls, query: str, filters: SearchFilters, *, mode: SearchMode = "hybrid", top_k: int = 10,
           min_score: float | None = None) -> Self:
        """The request for ``query`` under ``filters``.

        Raises:
            ValueError: ``filters`` sets the other target's filter (``sections`` for
                memories, ``kinds`` for entries, a ``where`` path on ``value.`` for memories); pydantic's ``ValidationError`` (a
                ``ValueError``) for an invalid query or option.
        """
        fields = filters.model_dump(exclude={*cls._foreign, "where"})
        for name in cls._foreign:
            if getattr(filters, name) != _FILTER_DEFAULTS[name]:
                verb = "do" if name in ("kinds", "sections") else "does"
                raise ValueError(f"{name} {verb} not filter {cls.target} searches")
        if cls.target == "memory" and filters.where.reads_value:
            raise ValueError(_no_value(filters.where))
        # (the parsed where as it is: parse_where passes a Where through)
        return cls(query=query, mode=mode, top_k=top_k, min_score=min_score, where=filters.where, **fields)

    @cached_property
    def filters(self) -> SearchFilters:
        """The request's filters (built once; its fields were validated with the request)."""
        # Every field given (the other target's empty): for a missing one, model_construct
        # calls its default factory through inspect.signature, ~0.2 ms a request.
        own = type(self).model_fields
        return SearchFilters.model_construct(**{name: getattr(self, name) if name in own else _default(name)
                                                for name in _FILTER_FIELDS})


class MemorySearchRequest(_Lifecycle, _Kinds, _SearchRequest):
    """``bb.search.<principal>.memories``: search long-term memories (a ``where`` path on
    ``value.`` is refused: memories have no value). Current memories only unless a lifecycle
    filter says otherwise (:class:`SearchFilters`)."""

    target: ClassVar[SearchTarget] = "memory"
    _foreign: ClassVar[tuple[str, ...]] = ("sections",)

    @model_validator(mode="after")
    def _no_value_paths(self) -> Self:
        if self.where.reads_value:
            raise ValueError(_no_value(self.where))
        return self


def _no_value(where: Where) -> str:
    path = next(p.path for p in where.paths if p.root == "value")
    return f"where: path {path[:64]!r}: memories have no value (only metadata.<...> paths)"


class EntrySearchRequest(_Sections, _SearchRequest):
    """``bb.search.<principal>.entries``: search the current (not deleted) board entries."""

    target: ClassVar[SearchTarget] = "entry"
    _foreign: ClassVar[tuple[str, ...]] = ("kinds", *_LIFECYCLE_DEFAULTS)


_FILTER_FIELDS = tuple(SearchFilters.model_fields)
#: Each filter's default (a list for the list filters).
_FILTER_DEFAULTS: dict[str, Any] = {
    name: f.default if f.default_factory is None else f.default_factory()  # type: ignore[call-arg]
    for name, f in SearchFilters.model_fields.items()}


def _default(name: str) -> Any:
    """Filter ``name``'s default (a new one for a list or a mapping)."""
    value = _FILTER_DEFAULTS[name]
    return type(value)() if isinstance(value, list | dict) else value


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
    verdict: Verdict = Field(Verdict.UNSIGNED, description=_VERDICT)
    key: str | None = Field(None, description="Its subject key: what it is about (versions share it).")
    occurred_at: datetime | None = Field(None, description="Its event time, when the writer gave one.")
    valid_from: datetime | None = Field(None, description="Valid from (its event time, else its write time).")
    valid_to: datetime | None = Field(None, description="Valid until (a newer version's valid_from); None: open.")
    superseded_by: str | None = Field(None, description="The id of the memory that closed it.")
    confidence: float | None = Field(None, description="The writer's confidence, 0..1 (None: not given).")
    seen_count: int = Field(1, description="How many memories were merged into it (itself included).")
    hits: int = Field(0, description="How often recall returned it.")
    archived_at: datetime | None = Field(None, description="When it was archived (None: live).")
    archive_reason: str | None = Field(None, description="Why: a pruning strategy, or 'merged'.")
    merged_into: str | None = Field(None, description="The id of the memory it was merged into.")
    contested_by: str | None = Field(None, description="The proposal deciding a contradiction it is part of.")


class MemoryGetRequest(WireModel):
    """``bb.search.<principal>.memory``: one memory of a readable board by id, with its
    provenance and the versions of its subject key. The id of a memory merged into another
    answers with the kept memory."""

    v: Literal[1] = 1
    board: Name
    id: Id


class MemorySource(WireModel):
    """One memory merged into a kept memory (its provenance): the merged memory's id, author,
    write time, where it was stored (stream, seq) with the signature it carried, and how it
    was merged (``exact``, ``near`` or ``llm``)."""

    id: str
    agent: str
    created_at: datetime
    stream: str
    seq: int
    sig_key: str | None = None
    sig: str | None = None
    verdict: Verdict = Field(Verdict.UNSIGNED, description=_VERDICT)
    how: str = Field(description="exact (same normalised text), near (cosine), or llm (merged by a model).")
    merged_at: datetime


class MemoryDetail(WireModel):
    """The reply of ``memory``: the memory (score 0), the memories merged into it (oldest
    first) and every version of its subject key (valid-time order, itself included; empty
    without a key)."""

    v: Literal[1] = 1
    memory: MemoryHit
    sources: list[MemorySource] = Field(default_factory=list)
    versions: list[MemoryHit] = Field(default_factory=list)


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
    verdict: Verdict = Field(Verdict.UNSIGNED, description=_VERDICT)


class MemorySearchResponse(WireModel):
    v: Literal[1] = 1
    hits: list[MemoryHit]
    took_ms: float = 0.0


class EntrySearchResponse(WireModel):
    v: Literal[1] = 1
    hits: list[EntryHit]
    took_ms: float = 0.0


class HistoryRequest(WireModel):
    """``bb.search.<principal>.history``: every stored revision of one key, oldest first."""

    v: Literal[1] = 1
    board: Name
    section: Name
    key: str = Field(min_length=1)
    limit: int | None = Field(None, ge=1, description="Only the newest `limit` revisions.")


class AsOfRequest(WireModel):
    """``bb.search.<principal>.as_of``: a key's value at a revision or at an instant (give one)."""

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
    verdict: Verdict = Field(Verdict.UNSIGNED, description=_VERDICT)


class HistoryResponse(WireModel):
    v: Literal[1] = 1
    revisions: list[EntryRevision]


class BoardsResponse(WireModel):
    """``bb.search.<principal>.boards`` (no request body): the boards that hold at least one
    live key and that the principal may read, sorted."""

    v: Literal[1] = 1
    boards: list[Name] = Field(description="Board names, sorted.")


#: The most memories one ``searchable`` request asks about.
MAX_SEARCHABLE_ITEMS = 1000


class SearchableItem(WireModel):
    """One memory of a :class:`SearchableRequest`: its id and the stream sequence its writer
    got back (0: any stored version)."""

    id: Id
    seq: int = Field(0, ge=0, description="Stream sequence of the version written (its ack); 0: any version.")


class SearchableRequest(WireModel):
    """``bb.search.<principal>.searchable``: which of these memories of one board every search
    mode finds yet (stored by the worker and embedded). The principal must be able to read
    ``board``; a memory stored on another board counts as not stored."""

    v: Literal[1] = 1
    board: Name
    items: list[SearchableItem] = Field(min_length=1, max_length=MAX_SEARCHABLE_ITEMS)


class SearchableResponse(WireModel):
    """The reply to :class:`SearchableRequest`: the ids still missing, by what they miss (both
    empty: every one is searchable by every mode)."""

    v: Literal[1] = 1
    unstored: list[str] = Field(default_factory=list, description=(
        "Not stored on the board at that version or later (not ingested yet, forgotten, or never written)."))
    unembedded: list[str] = Field(default_factory=list, description=(
        "Stored, but the stored version has no vector yet (keyword search finds it, semantic does not)."))


class ErrorReply(WireModel):
    """Body of an error reply (header ``Bb-Error`` names the class)."""

    v: Literal[1] = 1
    error: str = Field(description="Error class name, e.g. NotFoundError, InvalidPayloadError, SearchError.")
    message: str
    key: str | None = None
