from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    StringConstraints,
    ValidationError,
)

from blackboard.protocol.canonical import canonical_bytes
from blackboard.protocol.errors import InvalidPayloadError, LimitExceededError
from blackboard.protocol.limits import MAX_ID_CHARS, MAX_LABEL_CHARS, check_timestamp
from blackboard.protocol.subjects import validate_name

__all__ = ["Id", "Label", "Name", "Timestamp", "WireModel", "utcnow", "validate_wire"]

M = TypeVar("M", bound="WireModel")


def utcnow() -> datetime:
    return datetime.now(UTC)


def _parse_timestamp(value: Any) -> Any:
    # The codec carries datetimes as ISO 8601 strings (JSON and msgpack alike);
    # parse them here so that strict validation, which only takes datetime
    # objects from Python input, accepts what the codec produced.
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return value
    return value


#: A timezone-aware instant; ISO 8601 strings are accepted in strict mode too.
#: Within the protocol's range and offsets (``limits.check_timestamp``), so that
#: every reader, and PostgreSQL, can hold it.
Timestamp = Annotated[AwareDatetime, BeforeValidator(_parse_timestamp), AfterValidator(check_timestamp)]


def _check_name(value: str) -> str:
    return validate_name(value)


#: A board, section, agent, proposal or topic token (see ``subjects.validate_name``).
Name = Annotated[str, AfterValidator(_check_name)]


#: A short text PostgreSQL indexes (a tag, an author, a message's type...):
#: at most ``limits.MAX_LABEL_CHARS`` characters.
Label = Annotated[str, StringConstraints(max_length=MAX_LABEL_CHARS)]
#: A record's id: 1 to ``limits.MAX_ID_CHARS`` characters.
Id = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS)]


class WireModel(BaseModel):
    """Base of every wire schema: versioned, tolerant of unknown fields."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    def canonical_bytes(self) -> bytes:
        """The record's canonical encoding: what a signature covers (``docs/protocol.md``,
        "Canonical encoding"). Equal records give equal bytes, whatever encoding,
        map order or number form their writer used.

        Raises:
            InvalidPayloadError: the record holds a value with no canonical encoding.
        """
        return canonical_bytes(self)


def validate_wire(model: type[M], data: Any, *, strict: bool = False, coerce: bool = True) -> M:
    """Validate a decoded wire object (a dict) against ``model``.

    ``strict=True`` also refuses unknown fields and type coercion (used by the
    tests and by tools that want to check a producer). ``coerce=False`` refuses
    type coercion but still ignores unknown fields: the consensus records are
    read that way, so that every language reads the same message the same way.

    Raises:
        InvalidPayloadError: the object does not match the schema.
    """
    try:
        if strict:
            extra = set(data) - set(model.model_fields) if isinstance(data, dict) else set()
            if extra:
                raise InvalidPayloadError(f"{model.__name__}: unknown fields {sorted(extra)}")
            return model.model_validate(data, strict=True)
        return model.model_validate(data, strict=not coerce or None)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "<root>"
        cause = first.get("ctx", {}).get("error")
        if isinstance(cause, LimitExceededError):  # a protocol limit: keep its type and name
            raise LimitExceededError(cause.limit, f"{model.__name__}: {loc}: {cause.reason}") from exc
        raise InvalidPayloadError(f"{model.__name__}: {loc}: {first['msg']}") from exc
