"""Wire schemas: pydantic models, one module per concept, all versioned (``v``).

Decoding tolerates unknown fields (``validate_wire``); ``strict=True`` refuses
them. ``docs/protocol.md`` documents them and ``python -m blackboard.schemas``
prints their JSON Schema.
"""

from blackboard.schemas._base import Name, Timestamp, WireModel, utcnow, validate_wire
from blackboard.schemas.entry import ENTRY_SCHEMA_VERSION, EntryEnvelope
from blackboard.schemas.memory import MemoryKind, MemoryRecord
from blackboard.schemas.message import MessageEnvelope, MessageKind
from blackboard.schemas.vote import (
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
    "Ballot",
    "BallotRejection",
    "Choice",
    "CountedBallot",
    "EntryEnvelope",
    "MemoryKind",
    "MemoryRecord",
    "MessageEnvelope",
    "MessageKind",
    "Name",
    "Outcome",
    "OutcomeStatus",
    "Policy",
    "PolicyKind",
    "Proposal",
    "RejectReason",
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
        MessageEnvelope,
        Proposal,
        Ballot,
        Outcome,
    ]
    return {m.__name__: m.model_json_schema() for m in models}
