"""Provenance of derived records: which stored, signed records one was made from.

A record the system derives (a vote outcome, the board entry that applies it,
and later the memories the worker merges) is signed by the worker identity and
names its sources as :class:`SourceRef`: the stream and sequence where each
source is stored, and the signing key and signature the source carried. A
verifier fetches a source by its sequence, checks that it carries that very
signature, and verifies it like any other record (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field

from blackboard.protocol.schemas._base import WireModel
from blackboard.protocol.subjects import Header

__all__ = ["SourceRef", "source_ref"]

#: ``Bb-Sig-Key`` is 56 characters and ``Bb-Sig`` 86; anything longer is not one.
_MAX_SIG_CHARS = 128


class SourceRef(WireModel):
    """A stored record a derived record was made from (part of the records that
    carry it, versioned by them)."""

    stream: str = Field(min_length=1, max_length=256, description="The stream it is stored in, e.g. BB_VOTE.")
    seq: int = Field(ge=1, description="Its stream sequence.")
    key: str | None = Field(
        default=None,
        max_length=_MAX_SIG_CHARS,
        description="The public key that signed it (its Bb-Sig-Key header), or null if it was unsigned.",
    )
    sig: str | None = Field(
        default=None,
        max_length=_MAX_SIG_CHARS,
        description="Its signature (its Bb-Sig header, unpadded base64url), or null if it was unsigned.",
    )


def source_ref(stream: str, seq: int, headers: Mapping[str, str] | None) -> SourceRef:
    """The reference of a stored message from its stream, sequence and headers (pure).

    The key and signature are copied as the headers carry them (null when
    absent); whether they verify is the reader's business.
    """
    h = headers or {}
    key, sig = h.get(Header.SIG_KEY.value), h.get(Header.SIG.value)
    return SourceRef.model_construct(
        stream=stream, seq=seq,
        key=key if key and len(key) <= _MAX_SIG_CHARS else None,
        sig=sig if sig and len(sig) <= _MAX_SIG_CHARS else None)
