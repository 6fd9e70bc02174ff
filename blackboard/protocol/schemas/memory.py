from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import Field, JsonValue, model_validator

from blackboard.protocol.canonical import EXTENSION
from blackboard.protocol.limits import MAX_ID_CHARS
from blackboard.protocol.schemas._base import Id, Label, Name, Timestamp, WireModel
from blackboard.protocol.schemas.provenance import SourceRef

__all__ = ["MAX_METADATA_ORDER", "MAX_PROVENANCE", "MAX_SUBJECT_KEY_CHARS", "SUBJECT_KEY_PATTERN", "MemoryKind", "MemoryRecord"]

MemoryKind = Literal["episodic", "semantic", "procedural", "knowledge", "summary"]

#: Longest subject key (``MemoryRecord.key``), in characters.
MAX_SUBJECT_KEY_CHARS: Final = 256
#: A subject key: no control characters (C0, DEL, C1), so it prints and logs as one line.
SUBJECT_KEY_PATTERN: Final = r"^[^\x00-\x1f\x7f-\x9f]+$"
#: Most sources a derived memory names.
MAX_PROVENANCE: Final = 64
#: Most keys a ``metadata_order`` names.
MAX_METADATA_ORDER: Final = 256
#: Fields of version 2 (left out of the canonical encoding when null: docs/protocol.md §13.1).
_V2: Final[dict[str, JsonValue]] = {EXTENSION: 2}


class MemoryRecord(WireModel):
    """A long-term memory, published on ``bb.mem.<board>.<agent>`` and persisted by the worker."""

    v: Literal[1, 2] = Field(1, description="Schema version: 2 when any of the version-2 fields "
                                            "(key, occurred_at, confidence, provenance, metadata_order) is set, "
                                            "else 1.")
    id: str = Field(min_length=1, max_length=MAX_ID_CHARS, description="Unique id chosen by the writer.")
    board: Name = Field(description="Scope of the memory (a board name).")
    agent: Name = Field(description="Agent id of the writer.")
    kind: MemoryKind = "episodic"
    text: str = Field(min_length=1, description="The memory's text (what is embedded and searched).")
    tags: list[Label] = Field(default_factory=list, description="Free-form labels (each at most 256 characters).")
    metadata: dict[str, Any] = Field(default_factory=dict)
    importance: float = Field(0.5, ge=0.0, le=1.0)
    source: str | None = Field(None, description="Where it came from (file path, URL...).")
    read_only: bool = False
    created_at: Timestamp = Field(description="Writer's clock, RFC 3339 / ISO 8601 with a UTC offset.")
    key: str | None = Field(
        None, min_length=1, max_length=MAX_SUBJECT_KEY_CHARS, pattern=SUBJECT_KEY_PATTERN, json_schema_extra=_V2,
        description="Version 2. The subject key: what the memory is about (e.g. 'price:shop.example.com:sku-1'), "
                    "1-256 characters, no control characters. A newer memory on the same key of a board "
                    "supersedes the older ones (docs/memory-lifecycle.md).")
    occurred_at: Timestamp | None = Field(
        None, json_schema_extra=_V2,
        description="Version 2. Event time: when what it says happened (created_at is when it was written).")
    confidence: float | None = Field(
        None, ge=0.0, le=1.0, json_schema_extra=_V2,
        description="Version 2. The writer's confidence in it, 0 to 1.")
    provenance: list[SourceRef] | None = Field(
        None, max_length=MAX_PROVENANCE, json_schema_extra=_V2,
        description="Version 2. Set only on memories the worker derives (merged or extracted): the stored, "
                    "signed records it was made from, by stream and sequence (the exact versions read).")
    metadata_order: list[str] | None = Field(
        None, max_length=MAX_METADATA_ORDER, json_schema_extra=_V2,
        description="Version 2. The writer's order of metadata's keys, each key once (the canonical encoding "
                    "sorts maps): the order of the metadata lines embedded before the text. Written only when "
                    "it differs from the canonical order.")

    @model_validator(mode="after")
    def _version(self) -> MemoryRecord:
        if self.v == 1 and (self.key is not None or self.occurred_at is not None or self.confidence is not None
                            or self.provenance is not None or self.metadata_order is not None):
            raise ValueError("key, occurred_at, confidence, provenance and metadata_order need v 2")
        order = self.metadata_order
        if order is not None and (len(order) != len(self.metadata) or set(order) != set(self.metadata)):
            raise ValueError("metadata_order must name each key of metadata once")
        return self


class MemoryForget(WireModel):
    """Forget long-term memories by id (published on the same ``bb.mem.<board>.<agent>`` subject).

    Told apart from a :class:`MemoryRecord` by ``op``. The worker deletes the
    memories (and their embeddings) that belong to ``board``.
    """

    v: Literal[1] = Field(1, description="Schema version.")
    op: Literal["forget"] = Field("forget", description="Discriminator: always 'forget'.")
    board: Name = Field(description="Scope of the memories.")
    agent: Name = Field(description="Agent id of the writer.")
    ids: list[Id] = Field(min_length=1, description="Ids of the memories to forget (each 1-128 characters).")
    created_at: Timestamp = Field(description="Writer's clock.")
