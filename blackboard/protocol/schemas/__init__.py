"""Wire schemas: pydantic models, one module per concept, all versioned (``v``).

Decoding tolerates unknown fields (``validate_wire``); ``strict=True`` refuses
them. ``docs/protocol.md`` documents them and ``python -m blackboard.protocol.schemas``
prints their JSON Schema.
"""

from blackboard.protocol.schemas._base import Name, Timestamp, WireModel, utcnow, validate_wire
from blackboard.protocol.schemas.entry import ENTRY_SCHEMA_VERSION, EntryEnvelope
from blackboard.protocol.schemas.inbox import InboxReply, InboxRequest
from blackboard.protocol.schemas.keys import KeyRevocations
from blackboard.protocol.schemas.memory import MemoryForget, MemoryKind, MemoryRecord
from blackboard.protocol.schemas.message import MessageEnvelope, MessageKind
from blackboard.protocol.schemas.message_search import (
    MessageHit,
    MessageSearchRequest,
    MessageSearchResponse,
)
from blackboard.protocol.schemas.provenance import SourceRef
from blackboard.protocol.schemas.search import (
    AsOfRequest,
    BoardsResponse,
    EntryHit,
    EntryRevision,
    EntrySearchRequest,
    EntrySearchResponse,
    ErrorReply,
    HistoryRequest,
    HistoryResponse,
    MemoryDetail,
    MemoryGetRequest,
    MemoryHit,
    MemorySearchRequest,
    MemorySearchResponse,
    MemorySource,
    SearchableItem,
    SearchableRequest,
    SearchableResponse,
    SearchMode,
)
from blackboard.protocol.schemas.vote import (
    Ballot,
    BallotRejection,
    Choice,
    CountedBallot,
    Outcome,
    OutcomeStatus,
    Policy,
    PolicyKind,
    Proposal,
    RejectReason,
    TallyCounts,
    canonical_json,
)

__all__ = [
    "ENTRY_SCHEMA_VERSION",
    "AsOfRequest",
    "Ballot",
    "BallotRejection",
    "BoardsResponse",
    "Choice",
    "CountedBallot",
    "EntryEnvelope",
    "EntryHit",
    "EntryRevision",
    "EntrySearchRequest",
    "EntrySearchResponse",
    "ErrorReply",
    "HistoryRequest",
    "HistoryResponse",
    "InboxReply",
    "InboxRequest",
    "KeyRevocations",
    "MemoryDetail",
    "MemoryForget",
    "MemoryGetRequest",
    "MemoryHit",
    "MemoryKind",
    "MemoryRecord",
    "MemorySearchRequest",
    "MemorySearchResponse",
    "MemorySource",
    "MessageEnvelope",
    "MessageHit",
    "MessageKind",
    "MessageSearchRequest",
    "MessageSearchResponse",
    "Name",
    "Outcome",
    "OutcomeStatus",
    "Policy",
    "PolicyKind",
    "Proposal",
    "RejectReason",
    "SearchMode",
    "SearchableItem",
    "SearchableRequest",
    "SearchableResponse",
    "SourceRef",
    "TallyCounts",
    "Timestamp",
    "WireModel",
    "canonical_json",
    "json_schemas",
    "utcnow",
    "validate_wire",
]


def json_schemas() -> dict[str, object]:
    """JSON Schema of every wire model, by model name."""
    models: list[type[WireModel]] = [
        EntryEnvelope,
        MemoryRecord,
        MemoryForget,
        MessageEnvelope,
        Proposal,
        Ballot,
        Outcome,
        MemorySearchRequest,
        MemorySearchResponse,
        EntrySearchRequest,
        EntrySearchResponse,
        HistoryRequest,
        HistoryResponse,
        AsOfRequest,
        EntryRevision,
        MessageSearchRequest,
        MessageSearchResponse,
        BoardsResponse,
        SearchableRequest,
        SearchableResponse,
        MemoryGetRequest,
        MemoryDetail,
        ErrorReply,
        InboxRequest,
        InboxReply,
        KeyRevocations,
    ]
    return {m.__name__: m.model_json_schema() for m in models}
