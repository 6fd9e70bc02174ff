"""The key registry's revocations record (``bb.keys.revocations`` on ``BB_KEYS``).

Only operators may publish it; it holds the whole list (the last message wins).
A signing key revoked at ``t`` makes every record stored at or after ``t`` under
it ``revoked`` (docs/security.md, "Signatures").
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from blackboard.protocol.schemas._base import Timestamp, WireModel

__all__ = ["KeyRevocations"]


class KeyRevocations(WireModel):
    """Every revoked signing key, and when."""

    v: Literal[1] = Field(1, description="Schema version.")
    revoked: dict[str, int] = Field(
        default_factory=dict,
        description="User public key (U...) -> Unix seconds it is revoked from (records stored at or after).")
    updated_at: Timestamp = Field(description="When the operator published this list.")
