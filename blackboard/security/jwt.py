"""NATS JWTs (version 2) and ``.creds`` files, signed with nkeys.

The server runs in operator mode: an operator key signs the account JWTs
(the application account, with JetStream enabled, and the system account),
and the application account's key signs each identity's user JWT. A user JWT
carries the identity's name (its principal id) and its permissions; the
server checks the signature chain and enforces the permissions, so nothing
but the signing keys is secret.

The encoding follows nats-io/jwt v2: ``base64url(header) "." base64url(claims)
"." base64url(ed25519 signature of the first two parts)``, unpadded, with the
header ``{"typ":"JWT","alg":"ed25519-nkey"}``; ``jti`` is the unpadded base32
of SHA-512/256 over the claims without it. Pure functions (the clock is an
argument where it matters).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any

import nkeys
from nacl.exceptions import CryptoError
from nacl.signing import VerifyKey

from blackboard.protocol.errors import AuthenticationError

__all__ = [
    "Credentials",
    "KeyKind",
    "account_claims",
    "decode_claims",
    "encode",
    "new_seed",
    "operator_claims",
    "public_key",
    "render_creds",
    "user_claims",
    "verify",
]

_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
_PREFIXES = {"operator": nkeys.PREFIX_BYTE_OPERATOR, "account": nkeys.PREFIX_BYTE_ACCOUNT,
             "user": nkeys.PREFIX_BYTE_USER}
KeyKind = str
_JWT_BLOCK = re.compile(r"-{3,}BEGIN NATS USER JWT-{3,}\s*\n\s*(\S+)\s*\n\s*-{3,}END NATS USER JWT-{3,}")
_SEED_BLOCK = re.compile(r"-{3,}BEGIN USER NKEY SEED-{3,}\s*\n\s*(\S+)\s*\n\s*-{3,}END USER NKEY SEED-{3,}")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def new_seed(kind: KeyKind) -> str:
    """A fresh nkey seed (``SO...``, ``SA...`` or ``SU...``) for an operator, account or user."""
    seed: bytes = nkeys.encode_seed(os.urandom(32), _PREFIXES[kind])
    return seed.decode("ascii")


def _pair(seed: str) -> nkeys.KeyPair:
    try:
        return nkeys.from_seed(bytearray(seed.encode("ascii")))
    except (nkeys.NkeysError, binascii.Error, ValueError) as exc:
        raise AuthenticationError(f"not a valid nkey seed: {exc}") from exc


def public_key(seed: str) -> str:
    """The public key (``O...``, ``A...``, ``U...``) of a seed."""
    key: bytes = _pair(seed).public_key
    return key.decode("ascii")


def encode(claims: dict[str, Any], issuer_seed: str) -> str:
    """Sign ``claims`` (``sub``, ``name``, ``nats``...) as a JWT issued by ``issuer_seed``.

    ``iss`` is set from the seed and ``jti`` computed; ``iat`` must be in ``claims``.
    """
    pair = _pair(issuer_seed)
    body = {k: v for k, v in claims.items() if k != "jti"}
    body["iss"] = pair.public_key.decode("ascii")
    digest = hashlib.new("sha512_256", json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    body["jti"] = base64.b32encode(digest.digest()).rstrip(b"=").decode("ascii")
    head = _b64(json.dumps(_HEADER, separators=(",", ":")).encode())
    payload = _b64(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    signature = pair.sign(f"{head}.{payload}".encode("ascii"))
    return f"{head}.{payload}.{_b64(signature)}"


def decode_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT, NOT verified (the server verifies; readers use this for the name).

    Raises:
        AuthenticationError: not a JWT.
    """
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise AuthenticationError("not a NATS JWT (expected three dot-separated parts)")
    try:
        claims = json.loads(_unb64(parts[1]))
    except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
        raise AuthenticationError(f"not a NATS JWT: {exc}") from exc
    if not isinstance(claims, dict):
        raise AuthenticationError("not a NATS JWT: the claims are not an object")
    return claims


def verify(token: str) -> dict[str, Any]:
    """The claims of a JWT whose signature checks against its ``iss`` key.

    Raises:
        AuthenticationError: not a JWT, or the signature does not verify.
    """
    claims = decode_claims(token)
    head, payload, signature = token.strip().split(".")
    issuer = claims.get("iss")
    try:
        # nkeys' KeyPair cannot verify from a public key alone (it needs the seed's keys).
        _verify_key(str(issuer)).verify(f"{head}.{payload}".encode("ascii"), _unb64(signature))
    except (CryptoError, binascii.Error, ValueError, TypeError) as exc:
        raise AuthenticationError(f"the JWT's signature does not verify against {issuer!r}") from exc
    return claims


def _verify_key(public: str) -> VerifyKey:
    """The ed25519 key of a public nkey (``O...``, ``A...``, ``U...``), its prefix and checksum checked.

    Raises:
        ValueError: not a public nkey.
    """
    raw = base64.b32decode(public.encode("ascii"))
    if (len(raw) != 35 or not nkeys.valid_public_prefix_byte(raw[0])
            or nkeys.crc16(raw[:-2]) != int.from_bytes(raw[-2:], "little")):
        raise ValueError(f"not a public nkey: {public!r}")
    return VerifyKey(raw[1:33])


def operator_claims(operator_seed: str, name: str, system_account: str, *, issued_at: int) -> dict[str, Any]:
    return {"iat": issued_at, "name": name, "sub": public_key(operator_seed),
            "nats": {"type": "operator", "version": 2, "system_account": system_account}}


#: No limit (the account's JetStream limits: -1 means unlimited, 0 would disable JetStream).
_UNLIMITED: dict[str, Any] = {
    "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True,
    "conn": -1, "leaf": -1,
}


def account_claims(account_seed: str, name: str, *, issued_at: int, jetstream: bool,
                   revocations: dict[str, int] | None = None) -> dict[str, Any]:
    """An account: unlimited connections; JetStream enabled (unlimited storage) when asked.

    ``revocations`` maps a user public key to a Unix time: the server refuses
    (and disconnects) that user's JWTs issued at or before it.
    """
    limits = dict(_UNLIMITED)
    if jetstream:
        limits.update({"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
                       "max_ack_pending": -1, "mem_max_stream_bytes": -1, "disk_max_stream_bytes": -1})
    nats: dict[str, Any] = {"type": "account", "version": 2, "limits": limits,
                            "default_permissions": {"pub": {}, "sub": {}}}
    if revocations:
        nats["revocations"] = dict(sorted(revocations.items()))
    return {"iat": issued_at, "name": name, "sub": public_key(account_seed), "nats": nats}


def user_claims(user_public_key: str, name: str, *, issued_at: int, pub_allow: list[str],
                sub_allow: list[str], pub_deny: list[str] | None = None, sub_deny: list[str] | None = None,
                responses: bool = True, tags: list[str] | None = None,
                expires: int | None = None) -> dict[str, Any]:
    """A user: its name is the principal id; its permissions are allow lists (deny wins)."""
    nats: dict[str, Any] = {
        "type": "user", "version": 2, "subs": -1, "data": -1, "payload": -1,
        "pub": {"allow": pub_allow, **({"deny": pub_deny} if pub_deny else {})},
        "sub": {"allow": sub_allow, **({"deny": sub_deny} if sub_deny else {})},
    }
    if responses:
        # Replies to requests it received (request/reply handlers, flow control):
        # one reply each, within the server's default window.
        nats["resp"] = {"max": 1, "ttl": 0}
    if tags:
        nats["tags"] = tags
    claims: dict[str, Any] = {"iat": issued_at, "name": name, "sub": user_public_key, "nats": nats}
    if expires is not None:
        claims["exp"] = expires
    return claims


@dataclass(frozen=True, slots=True)
class Credentials:
    """One identity's credential: its user JWT and nkey seed (what a ``.creds`` file holds)."""

    jwt: str
    seed: str

    @property
    def claims(self) -> dict[str, Any]:
        return decode_claims(self.jwt)

    @property
    def principal(self) -> str:
        """The id the credential was issued for (the JWT's ``name``)."""
        name = self.claims.get("name")
        if not isinstance(name, str) or not name:
            raise AuthenticationError("the credential's JWT names no identity")
        return name

    @property
    def public_key(self) -> str:
        return public_key(self.seed)

    @classmethod
    def parse(cls, text: str, *, source: str = "the credential") -> Credentials:
        """Read the standard NATS ``.creds`` format.

        Raises:
            AuthenticationError: the text holds no JWT block or no seed block.
        """
        jwt_match = _JWT_BLOCK.search(text)
        seed_match = _SEED_BLOCK.search(text)
        if jwt_match is None or seed_match is None:
            raise AuthenticationError(f"{source} is not a NATS .creds file (a user JWT and an nkey seed)")
        return cls(jwt_match.group(1), seed_match.group(1))

    def render(self) -> str:
        return render_creds(self.jwt, self.seed)


def render_creds(jwt: str, seed: str) -> str:
    """The standard NATS ``.creds`` text (what ``nsc`` writes; every NATS client reads it)."""
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{seed}\n"
        "------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )
