"""Verifying records' signatures (docs/security.md, "Signatures").

:meth:`Verifier.check` gives one record's :class:`~blackboard.protocol.signing.Verdict`
from what is known (certificates and revocations come from a :class:`KeyLookup`,
the IO side: ``blackboard.client.keys.KeyRegistry``); :meth:`Verifier.verify`
first makes sure the signer's certificate was looked for; :meth:`Verifier.verify_many`
does a batch, with the Ed25519 checks in a thread pool (PyNaCl releases the GIL).

A stored message never changes, so a verdict is kept per ``(stream, sequence)``
(least recently used out); a revocation forgets the verdicts of its key.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from nacl.bindings import crypto_sign_open
from nacl.exceptions import BadSignatureError, CryptoError

from blackboard.protocol.errors import InvalidPayloadError
from blackboard.protocol.signing import (
    SignatureHeaders,
    Verdict,
    batch_message,
    leaf_hash,
    node_hash,
    parse_signature,
    signing_input,
)
from blackboard.security.certificates import KeyInfo

__all__ = ["KeyLookup", "Signed", "Verifier"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
#: Items per thread-pool task of :meth:`Verifier.verify_many` (at most), and how many records
#: signed alone a batch needs before their checks go to the pool (fewer: not worth the handover).
_CHUNK = 256
_POOLED_MIN = 8
#: Verdicts kept per stored message: they depend only on the message and on
#: what never changes about its key once known (its certificate), or on a
#: revocation (whose news forgets them). ``unknown_key`` is not kept (the
#: certificate may be published later), nor is ``unsigned`` (nothing to check).
_CACHED = frozenset({Verdict.MALFORMED, Verdict.BAD_SIGNATURE, Verdict.WRONG_AUTHOR, Verdict.STALE,
                     Verdict.REVOKED, Verdict.VERIFIED})


class KeyLookup(Protocol):
    """Where a verifier learns keys' certificates and revocations."""

    def lookup(self, public_key: str) -> KeyInfo | None:
        """The key's certificate if already known and valid (no IO)."""

    def revoked_at(self, public_key: str) -> datetime | None:
        """When the key was revoked, or None."""

    async def ensure(self, public_key: str) -> KeyInfo | None:
        """The key's certificate, fetched when not yet known."""


@dataclass(slots=True)
class Signed:
    """One record to verify, as stored (or as received)."""

    subject: str
    headers: Mapping[str, str] | None
    #: The payload bytes as received.
    payload: bytes
    #: When the server stored it (None: now, for a core-NATS delivery).
    stored_at: datetime | None = None
    #: The record's author field (None: a tombstone, whose signer is its author).
    author: str | None = None
    #: The record's canonical bytes, computed when the payload is not them (e.g. JSON).
    canonical: Callable[[], bytes] | None = None
    #: ``(stream, sequence)`` of a stored message: its verdict is kept.
    cache_key: tuple[str, int] | None = None
    #: The kind of identity that must have signed it (``worker`` for derived vote records), or None.
    kind: str | None = None


def _raw_key(public_key: str) -> bytes | None:
    """The Ed25519 key of a user public nkey (the form was checked by ``parse_signature``)."""
    try:
        raw = base64.b32decode(public_key)
    except (binascii.Error, ValueError):
        return None
    return raw[1:33] if len(raw) == 35 else None


#: Nodes and roots of batches whose signature was checked, kept up to this many.
_ROOTS_KEPT = 65536


def _signed_by(data: bytes, sig: SignatureHeaders, key: bytes, roots: dict[bytes, bytes] | None) -> bool:
    """Whether ``sig`` signs the signing input ``data``: directly, or, for a record of a batch,
    the root its path leads to.

    ``roots`` keeps what a batch's first record proved, for its other records: every node of a
    path that led to a root ``sig`` validly signs maps to ``key + signature``, and a later
    record of the same batch whose path reaches one of them is under that root (the rest of
    the way was checked), usually after one or two hashes; a root found invalid maps to b"".
    """
    if sig.path is None:
        try:
            crypto_sign_open(sig.signature + data, key)
            return True
        except (BadSignatureError, CryptoError, ValueError, TypeError):
            return False
    signer = key + sig.signature
    node = leaf_hash(data)
    trail = [node]
    for side, sibling in sig.path:
        node = node_hash(sibling, node) if side == "L" else node_hash(node, sibling)
        if roots is not None and roots.get(node) == signer:
            return True  # a node of a tree this signature was found to sign
        trail.append(node)
    memo = b"root" + signer + node  # (the answer for this root itself, valid or not)
    known = None if roots is None else roots.get(memo)
    if known is None:
        try:
            crypto_sign_open(sig.signature + batch_message(node), key)
            valid = True
        except (BadSignatureError, CryptoError, ValueError, TypeError):
            valid = False
        if roots is not None:
            if len(roots) >= _ROOTS_KEPT:
                roots.clear()
            roots[memo] = signer if valid else b""
    else:
        valid = known == signer
    if valid and roots is not None:
        for proven in trail:
            roots[proven] = signer
    return valid


def _valid(item: Signed, sig: SignatureHeaders, key: bytes, roots: dict[bytes, bytes] | None = None) -> bool:
    """Whether the signature verifies over the payload as received or, failing that and
    when the payload is not already canonical, over the record's canonical bytes."""
    headers = item.headers or {}
    try:
        data = signing_input(item.subject, headers, sig.signed_at_us, sig.public_key, item.payload)
    except InvalidPayloadError:
        return False
    if _signed_by(data, sig, key, roots):
        return True
    if item.canonical is None:
        return False
    try:
        record = item.canonical()
    except (InvalidPayloadError, ValueError, TypeError, RecursionError):
        return False
    if record == item.payload:
        return False
    data = signing_input(item.subject, headers, sig.signed_at_us, sig.public_key, record)
    return _signed_by(data, sig, key, roots)


class Verifier:
    """Checks records' signatures against the keys a :class:`KeyLookup` knows."""

    def __init__(self, keys: KeyLookup, *, max_skew: float, cache_size: int, threads: int = 0) -> None:
        self.keys = keys
        self.max_skew_us = int(max_skew * 1_000_000)
        self.cache_size = cache_size
        self.threads = threads
        #: Verdicts of the verifications done, by verdict, and ``cache_hits``.
        self.stats: dict[str, int] = {v.value: 0 for v in Verdict}
        self.stats["cache_hits"] = 0
        self._cache: OrderedDict[tuple[str, int], tuple[Verdict, str]] = OrderedDict()
        self._raw: dict[str, bytes | None] = {}
        #: What batch roots already checked proved (see :func:`_signed_by`).
        self._roots: dict[bytes, bytes] = {}
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    # -- the cache ---------------------------------------------------------------
    def _cached(self, item: Signed) -> Verdict | None:
        key = item.cache_key
        if key is None or not self.cache_size:
            return None
        hit = self._cache.get(key)
        if hit is None:
            return None
        self._cache.move_to_end(key)
        self.stats["cache_hits"] += 1
        return hit[0]

    def _remember(self, item: Signed, verdict: Verdict, public_key: str) -> Verdict:
        self.stats[verdict.value] += 1
        if item.cache_key is not None and self.cache_size and verdict in _CACHED:
            self._cache[item.cache_key] = (verdict, public_key)
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return verdict

    def forget(self, public_keys: Iterable[str]) -> int:
        """Drop the kept verdicts of records signed by these keys (their revocation changed).

        Returns how many were dropped.
        """
        keys = set(public_keys)
        if not keys:
            return 0
        stale = [k for k, (_, pk) in self._cache.items() if pk in keys]
        for k in stale:
            del self._cache[k]
        return len(stale)

    # -- checking ------------------------------------------------------------------
    def _parse(self, item: Signed) -> Verdict | SignatureHeaders:
        """The item's signature headers, or its verdict when it has none or unreadable ones."""
        try:
            sig = parse_signature(item.headers)
        except InvalidPayloadError:
            return self._remember(item, Verdict.MALFORMED, "")
        if sig is None:
            self.stats[Verdict.UNSIGNED.value] += 1
            return Verdict.UNSIGNED
        return sig

    def _prepare(self, item: Signed) -> Verdict | tuple[SignatureHeaders, KeyInfo, bytes]:
        """The verdict reached before any crypto, or what the crypto needs."""
        sig = self._parse(item)
        if isinstance(sig, Verdict):
            return sig
        return self._keyed(sig)

    def _keyed(self, sig: SignatureHeaders) -> Verdict | tuple[SignatureHeaders, KeyInfo, bytes]:
        """``unknown_key``, or the signer's certificate and raw key."""
        info = self.keys.lookup(sig.public_key)
        raw = self._raw.get(sig.public_key)
        if raw is None and info is not None:
            raw = self._raw[sig.public_key] = _raw_key(sig.public_key)
        if info is None or raw is None:
            self.stats[Verdict.UNKNOWN_KEY.value] += 1
            return Verdict.UNKNOWN_KEY
        return sig, info, raw

    def _finish(self, item: Signed, sig: SignatureHeaders, info: KeyInfo, valid: bool) -> Verdict:
        """The verdict once the signature was checked (author, time, revocation)."""
        if not valid:
            return self._remember(item, Verdict.BAD_SIGNATURE, sig.public_key)
        if (item.author is not None and info.principal != item.author) \
                or (item.kind is not None and info.kind != item.kind):
            return self._remember(item, Verdict.WRONG_AUTHOR, sig.public_key)
        stored = item.stored_at if item.stored_at is not None else datetime.now(UTC)
        if abs((stored - _EPOCH) // _US - sig.signed_at_us) > self.max_skew_us:
            return self._remember(item, Verdict.STALE, sig.public_key)
        revoked = self.keys.revoked_at(sig.public_key)
        if revoked is not None and revoked <= stored:
            return self._remember(item, Verdict.REVOKED, sig.public_key)
        return self._remember(item, Verdict.VERIFIED, sig.public_key)

    def check(self, item: Signed) -> Verdict:
        """The record's verdict from the keys known now (an unknown key is ``unknown_key``)."""
        hit = self._cached(item)
        if hit is not None:
            return hit
        prepared = self._prepare(item)
        if isinstance(prepared, Verdict):
            return prepared
        sig, info, raw = prepared
        return self._finish(item, sig, info, _valid(item, sig, raw, self._roots))

    def _signer_key(self, item: Signed) -> str | None:
        """The signing key of an item to look up first (None: cached, unsigned, malformed or known)."""
        if item.cache_key is not None and self.cache_size and item.cache_key in self._cache:
            return None
        try:
            sig = parse_signature(item.headers)
        except InvalidPayloadError:
            return None
        if sig is None or self.keys.lookup(sig.public_key) is not None:
            return None
        return sig.public_key

    def signer_of(self, headers: Mapping[str, str] | None) -> str | None:
        """The principal of a message's signing key, when its certificate is known (for
        error reports; None: unsigned, malformed, or an unknown key)."""
        try:
            sig = parse_signature(headers)
        except InvalidPayloadError:
            return None
        info = None if sig is None else self.keys.lookup(sig.public_key)
        return None if info is None else info.principal

    async def verify(self, item: Signed) -> Verdict:
        """The record's verdict, its signer's certificate fetched first when not known."""
        key = self._signer_key(item)
        if key is not None:
            await self.keys.ensure(key)
        return self.check(item)

    async def verify_many(self, items: Sequence[Signed]) -> list[Verdict]:
        """Every record's verdict, in order: unknown signers' certificates are fetched
        first, then the signatures are checked (in ``threads`` threads when set)."""
        out: list[Verdict | None] = [None] * len(items)
        parsed: list[tuple[int, Signed, SignatureHeaders]] = []
        for i, item in enumerate(items):
            hit = self._cached(item)
            if hit is None:
                sig = self._parse(item)
                if isinstance(sig, Verdict):
                    out[i] = sig
                else:
                    parsed.append((i, item, sig))
            else:
                out[i] = hit
        missing = {sig.public_key for _, _, sig in parsed if self.keys.lookup(sig.public_key) is None}
        if missing:
            await asyncio.gather(*(self.keys.ensure(k) for k in missing))
        # Signatures of their own (about 55 µs each) go to the pool when there are enough to share
        # out; records of batches are checked here.
        pooled = self.threads > 0 and sum(1 for _, _, sig in parsed if sig.path is None) >= _POOLED_MIN
        work: list[tuple[int, Signed, SignatureHeaders, KeyInfo, bytes]] = []
        for i, item, sig in parsed:
            keyed = self._keyed(sig)
            if isinstance(keyed, Verdict):
                out[i] = keyed
            elif pooled and sig.path is None:
                # a signature of its own: its Ed25519 check goes to the pool; a record of a batch
                # (a few hashes, its root mostly checked already) is cheaper here than handed over
                work.append((i, item, *keyed))
            else:
                out[i] = self._finish(item, sig, keyed[1], _valid(item, sig, keyed[2], self._roots))
        if work:
            loop = asyncio.get_running_loop()
            pool = self._executor()
            size = min(_CHUNK, -(-len(work) // self.threads))  # at least one chunk per thread
            chunks = [work[n:n + size] for n in range(0, len(work), size)]
            results = await asyncio.gather(*(loop.run_in_executor(pool, _check_chunk, chunk, self._roots)
                                             for chunk in chunks))
            for chunk, valid in zip(chunks, results, strict=True):
                for (i, item, sig, info, _), ok in zip(chunk, valid, strict=True):
                    out[i] = self._finish(item, sig, info, ok)
        return [v if v is not None else Verdict.MALFORMED for v in out]

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.threads, thread_name_prefix="bb-verify")
        return self._pool

    def close(self) -> None:
        """Stop the thread pool (if one was started)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _check_chunk(chunk: Sequence[tuple[int, Signed, SignatureHeaders, KeyInfo, bytes]],
                 roots: dict[bytes, bytes]) -> list[bool]:
    """The crypto of one chunk (in a pool thread; the only shared state is ``roots``, whose
    single-key reads and writes are atomic)."""
    return [_valid(item, sig, raw, roots) for _, item, sig, _, raw in chunk]
