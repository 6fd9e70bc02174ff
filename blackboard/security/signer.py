"""Signing the records an identity writes, with its credential's key (docs/security.md, "Signatures").

The key is the user nkey of the identity's ``.creds`` (the one its NATS
connection authenticates with); its certificate is the user JWT of the same
file, which the key registry publishes (``bb.keys.cert.<public key>``).
"""

from __future__ import annotations

import time
from collections.abc import MutableMapping, Sequence

import nkeys
from nacl.bindings import crypto_sign, crypto_sign_seed_keypair

from blackboard.protocol.errors import AuthenticationError
from blackboard.protocol.signing import (
    SIGNATURE_BYTES,
    batch_message,
    encode_path,
    encode_signature,
    leaf_hash,
    merkle_tree,
    signing_input,
)
from blackboard.protocol.subjects import Header
from blackboard.security.jwt import Credentials

__all__ = ["Signer", "now_us"]

_SIG_KEY = Header.SIG_KEY.value
_SIG_TIME = Header.SIG_TIME.value
_SIG = Header.SIG.value
_SIG_PATH = Header.SIG_PATH.value


def now_us() -> int:
    """The current time in microseconds since the Unix epoch (a signed time)."""
    return time.time_ns() // 1000


class Signer:
    """Signs records as one identity (the principal its credential was issued for)."""

    __slots__ = ("_secret", "certificate", "principal", "public_key")

    def __init__(self, credentials: Credentials) -> None:
        """Raises:
            AuthenticationError: the credential's seed is not a user nkey seed, or its JWT
                names no principal.
        """
        try:
            prefix, raw = nkeys.decode_seed(bytearray(credentials.seed.encode("ascii")))
        except (nkeys.NkeysError, ValueError, UnicodeEncodeError) as exc:
            raise AuthenticationError(f"the credential's seed is not an nkey seed: {exc!r}") from exc
        if prefix != nkeys.PREFIX_BYTE_USER or len(raw) != 32:
            raise AuthenticationError("the credential's seed is not a user nkey seed")
        _, self._secret = crypto_sign_seed_keypair(bytes(raw))
        self.public_key: str = credentials.public_key
        self.principal: str = credentials.principal
        #: The user JWT: the certificate of the key, published to the key registry.
        self.certificate: str = credentials.jwt

    def sign(self, subject: str, headers: MutableMapping[str, str], record: bytes, *,
             now_us: int | None = None) -> None:
        """Add the signature headers to ``headers`` (in place) for a write of ``record``
        (its canonical bytes; empty for a tombstone) to ``subject``.

        ``headers`` must hold the message's ``Nats-Msg-Id`` and every other header the
        signature covers (``Nats-Expected-Last-Subject-Sequence``, ``KV-Operation``,
        ``Nats-TTL``) as it will be sent. Sign again on each (re)send: the time is fresh.

        Raises:
            InvalidPayloadError: no ``Nats-Msg-Id``, or a covered value holding a line break.
        """
        at = time.time_ns() // 1000 if now_us is None else now_us
        data = signing_input(subject, headers, at, self.public_key, record)
        signature = crypto_sign(data, self._secret)[:SIGNATURE_BYTES]
        headers.pop(_SIG_PATH, None)  # (a record of a batch, signed again alone)
        headers[_SIG_KEY] = self.public_key
        headers[_SIG_TIME] = str(at)
        headers[_SIG] = encode_signature(signature)

    def sign_batch(self, writes: Sequence[tuple[str, MutableMapping[str, str], bytes]], *,
                   now_us: int | None = None) -> None:
        """Sign many writes ``(subject, headers, record)`` with one signature (in place).

        Each write's signing input is a leaf of a Merkle tree; the one Ed25519
        signature covers the tree's root, and each write carries its path to it
        (``Bb-Sig-Path``). One write alone is signed as by :meth:`sign`. A reader
        checks the signature once per batch.

        Raises:
            InvalidPayloadError: a write without ``Nats-Msg-Id``, or a covered value
                holding a line break (no write is signed then).
        """
        if len(writes) == 1:
            subject, headers, record = writes[0]
            self.sign(subject, headers, record, now_us=now_us)
            return
        if not writes:
            return
        at = time.time_ns() // 1000 if now_us is None else now_us
        key = self.public_key
        leaves = [leaf_hash(signing_input(subject, headers, at, key, record)) for subject, headers, record in writes]
        root, paths = merkle_tree(leaves)
        signature = encode_signature(crypto_sign(batch_message(root), self._secret)[:SIGNATURE_BYTES])
        stamp = str(at)
        for (_, headers, _), path in zip(writes, paths, strict=True):
            headers[_SIG_KEY] = key
            headers[_SIG_TIME] = stamp
            headers[_SIG] = signature
            headers[_SIG_PATH] = encode_path(path)
