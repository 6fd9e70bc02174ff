"""Every text column PostgreSQL indexes is bounded on the wire (issue 18, fuzz finding).

A message whose correlation id was a million characters made PostgreSQL refuse its
index row ("index row requires 11464 bytes, maximum size is 8191") and ingest of the
messages stream stalled. The indexed fields (migrations/: btree and GIN keys on text)
are bounded by ``MAX_ID_CHARS`` / ``MAX_LABEL_CHARS``; the schemas, their fast paths
and the writers refuse one character more with ``InvalidPayloadError``. And a
proposal's candidates are JSON values: bytes are refused with the typed error, never
a raw ``TypeError``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.limits import MAX_ID_CHARS, MAX_LABEL_CHARS
from blackboard.protocol.records import (
    decode_entry_envelope,
    decode_memory,
    entry_wire,
    memory_wire,
)
from blackboard.protocol.schemas import MessageEnvelope, Proposal, validate_wire

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LONG = "x" * (MAX_LABEL_CHARS + 1)
FIT = "é" * MAX_LABEL_CHARS  # at the limit, 2 bytes each: kept


def _entry(**fields: Any) -> dict[str, Any]:
    return {"v": 1, "value": 1, "author": "a", "created_at": NOW.isoformat(), **fields}


def _memory(**fields: Any) -> dict[str, Any]:
    return {"v": 1, "id": "m", "board": "b", "agent": "a", "text": "t", "created_at": NOW.isoformat(), **fields}


def _message(**fields: Any) -> dict[str, Any]:
    return {"v": 1, "id": "i", "sender": "a", "kind": "direct", "recipients": ["b"], "type": "t",
            "created_at": NOW.isoformat(), **fields}


@pytest.mark.parametrize("fields", [{"author": LONG}, {"tags": ["ok", LONG]}])
def test_an_entry_with_an_indexed_text_beyond_its_limit_is_refused_by_the_fast_path_and_the_schema(
        fields: dict[str, Any]) -> None:
    with pytest.raises(InvalidPayloadError):
        decode_entry_envelope(_entry(**fields))
    with pytest.raises(InvalidPayloadError):
        entry_wire(1, author=fields.get("author", "a"), content_type="text/plain", tags=fields.get("tags", ()))


def test_an_entry_at_the_limit_is_kept_whole() -> None:
    env = decode_entry_envelope(_entry(author=FIT, tags=[FIT]))
    assert env.author == FIT and env.tags == [FIT]
    assert entry_wire(1, author=FIT, content_type="text/plain", tags=[FIT])["tags"] == [FIT]


def test_a_memory_tag_beyond_its_limit_is_refused_and_one_at_it_kept() -> None:
    with pytest.raises(InvalidPayloadError):
        decode_memory(_memory(tags=[LONG]))
    with pytest.raises(InvalidPayloadError):
        memory_wire(id="m", board="b", agent="a", text="t", created_at=NOW, tags=[LONG])
    assert decode_memory(_memory(tags=[FIT])).tags == [FIT]


def test_a_forget_names_ids_of_at_most_the_id_limit() -> None:
    forget = {"v": 1, "op": "forget", "board": "b", "agent": "a", "created_at": NOW.isoformat()}
    with pytest.raises(InvalidPayloadError):
        decode_memory({**forget, "ids": ["x" * (MAX_ID_CHARS + 1)]})
    assert decode_memory({**forget, "ids": ["x" * MAX_ID_CHARS]}).ids == ["x" * MAX_ID_CHARS]  # type: ignore[union-attr]


@pytest.mark.parametrize("field", ["type", "correlation_id", "reply_to"])
def test_a_message_text_field_beyond_its_limit_is_refused(field: str) -> None:
    with pytest.raises(InvalidPayloadError, match=field):
        validate_wire(MessageEnvelope, _message(**{field: "x" * 1_000_000}))
    assert getattr(validate_wire(MessageEnvelope, _message(**{field: FIT})), field) == FIT


def test_a_message_id_and_topic_are_bounded() -> None:
    with pytest.raises(InvalidPayloadError, match="id"):
        validate_wire(MessageEnvelope, _message(id="x" * (MAX_ID_CHARS + 1)))
    topic = ".".join(["t" * 100] * 3)  # valid tokens, 302 characters
    with pytest.raises(InvalidPayloadError, match="topic"):
        validate_wire(MessageEnvelope, _message(kind="topic", recipients=[], topic=topic))


def _proposal(**fields: Any) -> dict[str, Any]:
    return {"id": "p", "board": "b", "section": "s", "key": "k", "candidates": ["a", "b"], "voters": ["v1"],
            "proposer": "v1", "created_at": NOW, **fields}


@pytest.mark.parametrize("candidate", [b"x", float("nan"), {"a": b"x"}])
def test_a_proposal_with_a_candidate_that_is_no_json_value_is_refused_with_the_typed_error(
        candidate: Any) -> None:
    """Before, ``Proposal._check`` let json's TypeError out ("Object of type bytes is not
    JSON serializable"): a raw exception from the constructor and from every reader."""
    with pytest.raises(InvalidPayloadError, match="candidates must be JSON values"):
        validate_wire(Proposal, _proposal(candidates=[candidate, "b"]))
    with pytest.raises(ValueError, match="candidates must be JSON values"):  # pydantic's ValidationError
        Proposal(**_proposal(candidates=[candidate, "b"]))
