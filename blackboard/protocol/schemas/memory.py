from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from blackboard.protocol.limits import MAX_ID_CHARS
from blackboard.protocol.schemas._base import Id, Label, Name, Timestamp, WireModel

__all__ = ["MemoryKind", "MemoryRecord"]

MemoryKind = Literal["episodic", "semantic", "procedural", "knowledge", "summary"]


class MemoryRecord(WireModel):
    """A long-term memory, published on ``bb.mem.<board>.<agent>`` and persisted by the worker."""

    v: Literal[1] = Field(1, description="Schema version.")
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
