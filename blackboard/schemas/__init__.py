"""Wire schemas: pydantic models, one module per concept, all versioned (``v``).

Decoding tolerates unknown fields (``validate_wire``); ``strict=True`` refuses
them. ``docs/protocol.md`` documents them and ``python -m blackboard.schemas``
prints their JSON Schema.
"""

from blackboard.schemas._base import WireModel, utcnow, validate_wire
from blackboard.schemas.entry import ENTRY_SCHEMA_VERSION, EntryEnvelope
from blackboard.schemas.memory import MemoryKind, MemoryRecord

__all__ = [
    "ENTRY_SCHEMA_VERSION",
    "EntryEnvelope",
    "MemoryKind",
    "MemoryRecord",
    "WireModel",
    "json_schemas",
    "utcnow",
    "validate_wire",
]


def json_schemas() -> dict[str, object]:
    """JSON Schema of every wire model, by model name."""
    models: list[type[WireModel]] = [EntryEnvelope, MemoryRecord]
    return {m.__name__: m.model_json_schema() for m in models}
