"""Requests and replies of inbox administration (``bb.inbox.<agent>``, the system service).

An agent may read, acknowledge and reset its own durable inbox consumer
``inbox-<agent>`` on ``BB_MSG``, but not create or update it: the system
service does, after checking every filter subject against the agent's rights
(docs/messaging.md, "Inboxes"). The agent is the subject's last token, never a
field of the request. Encoded like every service request (msgpack, or JSON
with ``Bb-Encoding: json``); a refused request is answered like a search
request (``Bb-Error`` header, ``ErrorReply`` body).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from blackboard.protocol.schemas._base import WireModel

__all__ = ["MAX_INBOX_GRANTS", "InboxReply", "InboxRequest"]

#: Filter subjects (grants) one inbox may hold: boards joined and topic patterns, its direct subject.
MAX_INBOX_GRANTS = 1024


class InboxRequest(WireModel):
    """``bb.inbox.<agent>``: make the agent's inbox consumer hold exactly these grants.

    ``grants`` maps each filter subject (the agent's direct subject
    ``bb.msg.agent.<agent>``, a joined board's ``bb.msg.board.<board>``, a
    topic pattern's ``bb.msg.topic.<pattern>``) to the stream sequence it
    admits messages after; ``null`` means "from now": the service fills in
    the stream's last sequence. The direct subject is always kept (from 0 when
    missing). The consumer is created when it does not exist.
    """

    v: Literal[1] = Field(1, description="Schema version.")
    grants: dict[str, int | None] = Field(
        max_length=MAX_INBOX_GRANTS,
        description="Filter subject -> stream sequence it admits messages after (null: the stream's last).")
    ack_wait: float | None = Field(None, ge=1, le=86_400,
                                   description="Seconds a delivered message may stay unacknowledged "
                                               "(default: the service's messaging.inbox_ack_wait).")
    max_ack_pending: int | None = Field(None, ge=1, le=100_000,
                                        description="Delivered, unacknowledged messages at most "
                                                    "(default: the service's messaging.inbox_max_ack_pending).")
    rewind: bool = Field(False, description="Re-create the consumer just above its ack floor, so that what an "
                                            "earlier reader left unacknowledged comes again at once (for "
                                            "servers before 2.14, which have no CONSUMER.RESET).")


class InboxReply(WireModel):
    """The agent's inbox consumer as the service left it."""

    v: Literal[1] = 1
    consumer: str = Field(description="The consumer's name, inbox-<agent>.")
    grants: dict[str, int] = Field(description="Filter subject -> stream sequence it admits messages after.")
    created: bool = Field(False, description="The consumer did not exist before this request.")
    num_ack_pending: int = Field(0, description="Delivered and not yet acknowledged.")
    num_pending: int = Field(0, description="Not yet delivered.")
    ack_floor: int = Field(0, description="Stream sequence of the acknowledgement floor.")
