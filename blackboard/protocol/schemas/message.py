"""Agent-to-agent messages on the wire.

Published on ``bb.msg.agent.<agent>`` (direct, one message per recipient's
inbox), ``bb.msg.board.<board>`` (broadcast) or ``bb.msg.topic.<topic>``
(topic), stream ``BB_MSG``; requests and replies use the same envelope on
``bb.rpc.<agent>``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from blackboard.protocol.limits import MAX_DEPTH, MAX_ID_CHARS, MAX_LABEL_CHARS, check_value
from blackboard.protocol.schemas._base import Name, Timestamp, WireModel
from blackboard.protocol.subjects import Subjects

__all__ = ["MessageEnvelope", "MessageKind"]

MessageKind = Literal["direct", "broadcast", "topic"]


class MessageEnvelope(WireModel):
    """One message from an agent to agents.

    ``direct`` messages name their recipients; ``broadcast`` messages name a
    board and reach every agent on it; ``topic`` messages name a topic and
    reach the agents subscribed to a matching pattern.
    """

    v: Literal[1] = Field(default=1, description="Schema version.")
    id: str = Field(
        min_length=1,
        max_length=MAX_ID_CHARS,
        description="Unique message id chosen by the sender (deduplication key).",
    )
    sender: Name = Field(description="Agent id of the sender.")
    kind: MessageKind = Field(description="direct, broadcast or topic.")
    recipients: list[Name] = Field(
        default_factory=list,
        description="Agent ids of the recipients: at least one for a direct message, none otherwise.",
    )
    board: Name | None = Field(
        default=None, description="Board of a broadcast (required), or context of any message."
    )
    topic: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_LABEL_CHARS,
        description="Dot-separated topic of a topic message (required for kind 'topic'), e.g. 'build.failed'.",
    )
    type: str = Field(
        min_length=1,
        max_length=MAX_LABEL_CHARS,
        description="Application-defined message type, e.g. 'task.handoff'.",
    )
    body: Any = Field(
        default=None, description="The payload: any JSON value, or bytes (msgpack only)."
    )
    correlation_id: str | None = Field(
        default=None,
        max_length=MAX_LABEL_CHARS,
        description="Ties a reply to its request, or messages of one conversation.",
    )
    reply_to: str | None = Field(
        default=None, max_length=MAX_LABEL_CHARS, description="Subject to send a reply to (requests)."
    )
    created_at: Timestamp = Field(description="Sender's clock, RFC 3339 in UTC.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free-form metadata.")

    @model_validator(mode="after")
    def _check(self) -> MessageEnvelope:
        # The writer dumps the envelope through pydantic (which stops at 255
        # levels): bound the free-form fields first, as the codec bounds a decoded one.
        check_value(self.body, MAX_DEPTH - 1)
        check_value(self.metadata, MAX_DEPTH - 1)
        if self.kind == "direct" and not self.recipients:
            raise ValueError("a direct message needs at least one recipient")
        if self.kind != "direct" and self.recipients:
            raise ValueError(f"a {self.kind} message takes no recipients")
        if self.kind == "broadcast" and self.board is None:
            raise ValueError("a broadcast needs a board")
        if self.kind == "topic" and self.topic is None:
            raise ValueError("a topic message needs a topic")
        if self.kind != "topic" and self.topic is not None:
            raise ValueError(f"a {self.kind} message takes no topic")
        if self.topic is not None:
            Subjects.topic(self.topic, pattern=False)  # every token a valid name
        return self
