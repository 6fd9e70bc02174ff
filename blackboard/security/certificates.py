"""Certificates of signing keys and their revocations (pure; docs/security.md, "Signatures").

A signing key's certificate is the identity's NATS user JWT (as in its
``.creds``), published at ``bb.keys.cert.<public key>``. It is valid when its
signature verifies, its issuer is a trusted account key (the issuer of the
reader's own credential and ``security.trusted_accounts``), its subject is
the key and it names a principal. So a key is trusted only when the authority
signed it; the server lets an identity publish only its own key's certificate.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from blackboard.protocol.errors import AuthenticationError, InvalidKeyError
from blackboard.protocol.schemas.keys import KeyRevocations
from blackboard.protocol.subjects import validate_name
from blackboard.security.jwt import verify

__all__ = ["KIND_TAG", "KeyInfo", "Revocations", "read_certificate"]

#: The tag (``nats.tags``) the authority marks a JWT's kind of identity with: ``bb-kind:<kind>``.
KIND_TAG = "bb-kind:"
_KINDS = frozenset({"agent", "worker", "operator"})


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What a valid certificate says about a signing key."""

    public_key: str
    #: The principal the key was issued to (the JWT's ``name``).
    principal: str
    #: ``agent``, ``worker`` or ``operator`` (the JWT's ``bb-kind:`` tag; agent without one).
    kind: str
    issued_at: datetime


def _kind(claims: Mapping[str, object]) -> str | None:
    nats = claims.get("nats")
    tags = nats.get("tags") if isinstance(nats, dict) else None
    for tag in tags if isinstance(tags, list) else []:
        if isinstance(tag, str) and tag.startswith(KIND_TAG):
            kind = tag.removeprefix(KIND_TAG)
            return kind if kind in _KINDS else None
    return "agent"


def read_certificate(public_key: str, jwt_text: str, trusted_accounts: Collection[str]) -> KeyInfo | None:
    """The key a certificate vouches for, or None when it is not valid for ``public_key``.

    Valid: a user JWT whose signature verifies, issued (``iss``) by one of
    ``trusted_accounts``, whose subject (``sub``) is ``public_key`` and whose
    ``name`` is a valid principal id; an unknown ``bb-kind:`` tag makes it
    invalid (a reader cannot tell what it may sign), an expired one (``exp``) too.
    """
    try:
        claims = verify(jwt_text.strip())
    except (AuthenticationError, UnicodeError, ValueError):
        return None
    nats = claims.get("nats")
    if claims.get("iss") not in trusted_accounts or claims.get("sub") != public_key \
            or not isinstance(nats, dict) or nats.get("type", "user") != "user":
        return None
    name = claims.get("name")
    try:
        principal = validate_name(name if isinstance(name, str) else "", "principal")
    except InvalidKeyError:
        return None
    kind = _kind(claims)
    iat, exp = claims.get("iat"), claims.get("exp")
    if kind is None or not isinstance(iat, int) or isinstance(iat, bool):
        return None
    now = datetime.now(UTC)
    if isinstance(exp, int) and not isinstance(exp, bool) and exp > 0 and exp <= now.timestamp():
        return None
    try:
        issued = datetime.fromtimestamp(iat, UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return KeyInfo(public_key, principal, kind, issued)


class Revocations:
    """The revoked signing keys (from the latest ``KeyRevocations`` record)."""

    __slots__ = ("_at",)

    def __init__(self, revoked: Mapping[str, int] | None = None) -> None:
        self._at: dict[str, datetime] = {}
        for key, seconds in (revoked or {}).items():
            try:
                self._at[key] = datetime.fromtimestamp(seconds, UTC)
            except (OverflowError, OSError, ValueError, TypeError):
                # Unreadable time: revoked from the beginning (the safe reading).
                self._at[key] = datetime.fromtimestamp(0, UTC)

    @classmethod
    def from_record(cls, record: KeyRevocations) -> Revocations:
        return cls(record.revoked)

    def revoked_at(self, public_key: str) -> datetime | None:
        """When ``public_key`` was revoked (records stored at or after it are ``revoked``), or None."""
        return self._at.get(public_key)

    def keys(self) -> frozenset[str]:
        return frozenset(self._at)

    def changed(self, other: Revocations) -> set[str]:
        """Keys whose revocation differs between ``self`` and ``other`` (added, removed or moved)."""
        return {k for k in self._at.keys() | other._at.keys() if self._at.get(k) != other._at.get(k)}

    def __len__(self) -> int:
        return len(self._at)
