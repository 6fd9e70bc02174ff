"""Signing the records an identity writes, with its credential's key (docs/security.md, "Signatures").

The key is the user nkey of the identity's ``.creds`` (the one its NATS
connection authenticates with); its certificate is the user JWT of the same
file, which the key registry publishes (``bb.keys.cert.<public key>``).
"""

from __future__ import annotations

import collections
import hashlib
import os
import threading
import time
from collections.abc import MutableMapping, Sequence

import nkeys
from nacl.bindings import (
    crypto_core_ed25519_scalar_add,
    crypto_core_ed25519_scalar_mul,
    crypto_core_ed25519_scalar_reduce,
    crypto_scalarmult_ed25519_base_noclamp,
    crypto_sign,
    crypto_sign_seed_keypair,
)

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


#: Nonces a signer keeps made ahead, and how few left start a refill.
_NONCES = 128
_NONCES_LOW = 32


class _Nonces:
    """Ed25519 nonces made ahead of their use: pairs ``(r, R = r·B)``.

    An Ed25519 signature is ``R || S`` with ``S = r + SHA-512(R || A || M)·a mod L``
    (RFC 8032 §5.1.6); ``R = r·B``, the fixed-base multiplication, is most of the cost of
    signing, and it does not depend on the message. So a thread makes pairs ahead (libsodium
    releases the GIL while it multiplies) and a signature then costs a SHA-512 and two scalar
    operations (~7 µs instead of ~22 µs). RFC 8032 derives ``r`` from the key and the message;
    any ``r`` drawn uniformly at random and never used twice gives signatures every verifier
    accepts, as securely: here 64 bytes of the OS's randomness reduced modulo L, each pair
    taken once (popped), and the pairs dropped in a forked child, which must not reuse its
    parent's. With none ready, the signer signs as libsodium does.
    """

    __slots__ = ("_filling", "_lock", "_pid", "_pool")

    def __init__(self) -> None:
        self._pool: collections.deque[tuple[bytes, bytes]] = collections.deque()
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._filling = False

    def take(self) -> tuple[bytes, bytes] | None:
        """A pair never handed out before (None: none ready); starts a refill when few are left."""
        if os.getpid() != self._pid:  # a forked child: its parent may use these
            self._pool.clear()
            self._pid = os.getpid()
            self._filling = False
        try:
            pair: tuple[bytes, bytes] | None = self._pool.popleft()
        except IndexError:
            pair = None
        if len(self._pool) < _NONCES_LOW:
            self._refill()
        return pair

    def _refill(self) -> None:
        with self._lock:
            if self._filling:
                return
            self._filling = True
        threading.Thread(target=self._fill, args=(os.getpid(),), name="bb-nonces", daemon=True).start()

    def _fill(self, pid: int) -> None:
        try:
            while len(self._pool) < _NONCES and os.getpid() == pid:
                r = crypto_core_ed25519_scalar_reduce(os.urandom(64))
                self._pool.append((r, crypto_scalarmult_ed25519_base_noclamp(r)))
        finally:
            self._filling = False


class Signer:
    """Signs records as one identity (the principal its credential was issued for)."""

    __slots__ = ("_nonces", "_point", "_scalar", "_secret", "certificate", "principal", "public_key")

    def __init__(self, credentials: Credentials, *, deterministic: bool = False) -> None:
        """``deterministic``: sign exactly as RFC 8032 (libsodium) does, every time, with no
        nonce made ahead: the same input gives the same signature (a document's worked example);
        slower (~22 µs a signature instead of ~7).

        Raises:
            AuthenticationError: the credential's seed is not a user nkey seed, or its JWT
                names no principal.
        """
        try:
            prefix, raw = nkeys.decode_seed(bytearray(credentials.seed.encode("ascii")))
        except (nkeys.NkeysError, ValueError, UnicodeEncodeError) as exc:
            raise AuthenticationError(f"the credential's seed is not an nkey seed: {exc!r}") from exc
        if prefix != nkeys.PREFIX_BYTE_USER or len(raw) != 32:
            raise AuthenticationError("the credential's seed is not a user nkey seed")
        self._point, self._secret = crypto_sign_seed_keypair(bytes(raw))
        # The secret scalar a (RFC 8032 §5.1.5: the clamped first half of SHA-512(seed)), mod L.
        expanded = bytearray(hashlib.sha512(bytes(raw)).digest()[:32])
        expanded[0] &= 248
        expanded[31] &= 127
        expanded[31] |= 64
        self._scalar = crypto_core_ed25519_scalar_reduce(bytes(expanded) + bytes(32))
        self._nonces = None if deterministic else _Nonces()
        self.public_key: str = credentials.public_key
        self.principal: str = credentials.principal
        #: The user JWT: the certificate of the key, published to the key registry.
        self.certificate: str = credentials.jwt

    def _signature(self, message: bytes) -> bytes:
        """The Ed25519 signature of ``message`` (with a nonce made ahead when one is ready)."""
        pair = None if self._nonces is None else self._nonces.take()
        if pair is None:
            return crypto_sign(message, self._secret)[:SIGNATURE_BYTES]
        r, point_r = pair
        k = crypto_core_ed25519_scalar_reduce(hashlib.sha512(point_r + self._point + message).digest())
        return point_r + crypto_core_ed25519_scalar_add(r, crypto_core_ed25519_scalar_mul(k, self._scalar))

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
        signature = self._signature(data)
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
        signature = encode_signature(self._signature(batch_message(root)))
        stamp = str(at)
        for (_, headers, _), path in zip(writes, paths, strict=True):
            headers[_SIG_KEY] = key
            headers[_SIG_TIME] = stamp
            headers[_SIG] = signature
            headers[_SIG_PATH] = encode_path(path)
