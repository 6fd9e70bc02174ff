from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from blackboard.protocol.schemas._base import Label, Timestamp, WireModel

__all__ = ["ENTRY_SCHEMA_VERSION", "EntryEnvelope"]

ENTRY_SCHEMA_VERSION = 1


class EntryEnvelope(WireModel):
    """The value stored under a board key (one KV revision).

    Encoded as msgpack by default, as JSON when the message carries the header
    ``Bb-Encoding: json``. A delete or purge is an empty payload with a
    ``KV-Operation`` header instead.
    """

    v: Literal[1] = Field(1, description="Schema version.")
    value: Any = Field(description="The entry's value: any JSON value, or bytes (msgpack only).")
    content_type: str = Field(
        "application/json",
        description="MIME type of value, e.g. text/plain, application/json, image/png.",
    )
    tags: list[Label] = Field(default_factory=list, description="Free-form labels (each at most 256 characters).")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free-form metadata.")
    author: Label = Field(description="Agent id of the writer (at most 256 characters).")
    created_at: Timestamp = Field(description="Writer's clock, RFC 3339 / ISO 8601 with a UTC offset.")
