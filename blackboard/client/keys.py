"""The key registry on the bus (stream ``BB_KEYS``): signing keys' certificates and revocations.

* ``bb.keys.cert.<public key>``: a key's certificate, the identity's user JWT.
  Each identity publishes its own at connect (:meth:`KeyRegistry.publish_own`);
  the server lets it publish no other key's. An operator publishes every
  active identity's (:func:`publish_registry`, ``blackboard auth publish``).
* ``bb.keys.revocations``: the revoked keys (``KeyRevocations``; operators only;
  the last message wins). A :class:`KeyRegistry` follows it live.

:class:`KeyRegistry` is the :class:`~blackboard.security.verifier.KeyLookup` of a
connection's verifier: certificates are fetched by direct get when a record
signed by an unknown key is read, checked (``security/certificates.py``) and
kept; a key without a valid certificate is asked again after
:data:`NEGATIVE_TTL` seconds at the earliest.

**A replica behind.** ``BB_KEYS`` may be replicated, and any replica answers a
direct get: one that has not applied a certificate yet (a node restarted and
catching up) answers 404 for a key whose records are valid. So a 404 is not
taken at once: the direct get is asked again after
:data:`~blackboard.client.consumers.STALE_PAUSES`, then the subject is read
from its first message with a one-shot consumer
(:func:`~blackboard.client.consumers.read_first`); only then is the key
unknown (and that answer kept for :data:`NEGATIVE_TTL`, so a made-up key
costs this once per that time). Certificates found so are counted in
:attr:`KeyRegistry.stale_reads`. Any writer can put a made-up key id in a
header, and a reader would pay the pauses and a consumer for each: so once
:data:`MAX_FALLBACK_MISSES` such reads found nothing within
:data:`FALLBACK_WINDOW` seconds, a 404 is taken at once until they age out
(a replica behind then reads as before this rule: ``unknown_key`` for a
moment).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.errors import Error as JetStreamError
from nats.js.errors import NoStreamResponseError

from blackboard.client.consumers import ask_again, read_first
from blackboard.protocol import codec
from blackboard.protocol.errors import (
    BlackboardError,
    InvalidKeyError,
    InvalidPayloadError,
    OperationTimeoutError,
)
from blackboard.protocol.schemas import KeyRevocations, validate_wire
from blackboard.protocol.subjects import KEYS_STREAM, Header, Subjects
from blackboard.security.certificates import KeyInfo, Revocations, read_certificate
from blackboard.security.jwt import Credentials
from blackboard.security.signer import Signer
from blackboard.settings import Settings

if TYPE_CHECKING:
    from blackboard.security.authority import Authority

__all__ = ["NEGATIVE_TTL", "KeyRegistry", "PublishedRegistry", "publish_registry"]

log = logging.getLogger("blackboard.client.keys")

#: Seconds a key without a valid certificate is taken as unknown before it is asked for again.
NEGATIVE_TTL = 1.0
#: Keys remembered as unknown at most (the oldest are forgotten first: any key may be claimed).
_MAX_MISSING = 10_000
#: Seconds a key registry does not read certificates through a consumer after one was refused.
_NO_CONSUMER_PAUSE = 60.0
#: Reads again after a 404 that found nothing (made-up key ids) allowed within FALLBACK_WINDOW;
#: past that, a 404 is taken at once until the oldest ages out.
MAX_FALLBACK_MISSES = 3
#: Seconds a read again that found nothing counts against MAX_FALLBACK_MISSES.
FALLBACK_WINDOW = 10.0
#: Seconds after start at which the revocations record is read again: the start's direct get may
#: be answered by a replica behind (an older record, or none), and the news subscription only
#: brings later changes. An older record than the one held is ignored.
REVOCATIONS_REREAD = (2.0, 10.0, 30.0)
#: What a failed direct get of the registry raises (no stream, no right, a timeout, the connection).
_IO_ERRORS = (BlackboardError, nats.errors.Error, JetStreamError, TimeoutError, OSError)


def _no_stream(exc: BaseException) -> bool:
    """Whether nothing answered (no ``BB_KEYS`` stream yet: a server before ``blackboard setup``)."""
    return isinstance(exc, nats.errors.NoRespondersError | NoStreamResponseError)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


async def _direct_get(nc: NATS, subject: str, timeout: float) -> Msg | None:
    """The last message of ``subject`` in ``BB_KEYS``, or None when it has none.

    Raises:
        TransportError, nats errors: the request failed (see ``_IO_ERRORS``).
    """
    return _answered(await nc.request(Subjects.direct_get(KEYS_STREAM, subject), b"", timeout=timeout), subject)


def _answered(msg: Msg, subject: str) -> Msg | None:
    """A direct get's answer: the stored message, or None for 404.

    Raises:
        nats.errors.Error: another status.
    """
    status = (msg.headers or {}).get(Header.STATUS.value)
    if status == "404":
        return None
    if status:
        raise nats.errors.Error(f"direct get of {subject} failed: {status} "
                                f"{(msg.headers or {}).get(Header.DESCRIPTION.value, '')}")
    return msg


def _read_revocations(msg: Msg) -> KeyRevocations | None:
    try:
        data = codec.decode(msg.data, codec.encoding_of(msg.headers, msg.data))
        return validate_wire(KeyRevocations, data)
    except InvalidPayloadError as exc:
        log.warning("ignoring an unreadable key revocations record: %s", exc)
        return None


async def _publish(nc: NATS, subject: str, payload: bytes, msg_id: str, timeout: float) -> None:
    await nc.jetstream(timeout=timeout).publish(subject, payload, timeout=timeout,
                                                headers={Header.MSG_ID.value: msg_id})


class KeyRegistry:
    """Certificates and revocations of signing keys, read from the bus (a ``KeyLookup``)."""

    def __init__(self, nc: NATS, settings: Settings, trusted_accounts: Collection[str]) -> None:
        self._nc = nc
        self._timeout = settings.nats.request_timeout
        #: Account keys whose certificates are trusted.
        self.trusted_accounts = frozenset(trusted_accounts)
        self._known: dict[str, KeyInfo] = {}
        #: key -> loop time until which it counts as unknown
        self._missing: dict[str, float] = {}
        self._pending: dict[str, asyncio.Future[KeyInfo | None]] = {}
        self._revocations = Revocations()
        self._revocations_at: datetime | None = None
        self._sub: Subscription | None = None
        self._reread: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[set[str]], object]] = []
        self._stale_reads = 0
        #: loop time until which a 404 is not read again through a consumer (one was refused)
        self._no_consumer_until = 0.0
        #: loop times of the reads again after a 404 that found nothing (the last MAX_FALLBACK_MISSES)
        self._misses: deque[float] = deque(maxlen=MAX_FALLBACK_MISSES)

    @property
    def stale_reads(self) -> int:
        """Certificates a direct get answered 404 for (a replica behind), found by reading again."""
        return self._stale_reads

    # -- KeyLookup -------------------------------------------------------------------
    def lookup(self, public_key: str) -> KeyInfo | None:
        return self._known.get(public_key)

    def revoked_at(self, public_key: str) -> datetime | None:
        return self._revocations.revoked_at(public_key)

    async def ensure(self, public_key: str) -> KeyInfo | None:
        """The key's certificate: known, or fetched now (None: none valid; asked again after
        :data:`NEGATIVE_TTL`). Concurrent calls for one key share one fetch."""
        info = self._known.get(public_key)
        if info is not None:
            return info
        loop = asyncio.get_running_loop()
        until = self._missing.get(public_key)
        if until is not None and until > loop.time():
            return None
        pending = self._pending.get(public_key)
        if pending is None:
            pending = self._pending[public_key] = asyncio.ensure_future(self._fetch(public_key))
            pending.add_done_callback(lambda _: self._pending.pop(public_key, None))
        return await asyncio.shield(pending)

    async def _fetch(self, public_key: str) -> KeyInfo | None:
        info: KeyInfo | None = None
        try:
            msg = await self._certificate(public_key)
            if msg is not None:
                info = read_certificate(public_key, msg.data.decode("utf-8", "replace"), self.trusted_accounts)
        except InvalidKeyError:
            pass
        except _IO_ERRORS as exc:
            log.debug("cannot fetch the certificate of %s: %r", public_key, exc)
        if info is not None:
            self._known[public_key] = info
            self._missing.pop(public_key, None)
            return info
        if len(self._missing) >= _MAX_MISSING:
            self._missing.pop(next(iter(self._missing)))
        self._missing[public_key] = asyncio.get_running_loop().time() + NEGATIVE_TTL
        return None

    async def _request(self, subject: str) -> Msg:
        """The direct get of ``subject``'s last message in ``BB_KEYS``: the one place a registry
        sends one for a certificate (any replica may answer)."""
        return await self._nc.request(Subjects.direct_get(KEYS_STREAM, subject), b"", timeout=self._timeout)

    async def _certificate(self, public_key: str) -> Msg | None:
        """The key's certificate message, or None when it has none.

        A 404 may come from a replica behind: the direct get is asked again after
        :data:`~blackboard.client.consumers.STALE_PAUSES` (:func:`ask_again`), then the subject is read from its first message with a one-shot
        consumer (which waits, within the request timeout, for a message it counts as pending).

        Raises:
            ``_IO_ERRORS``: the direct get failed.
        """
        subject = Subjects.key_certificate(public_key)

        async def ask() -> Msg | None:
            return _answered(await self._request(subject), subject)

        msg = await ask()
        if msg is not None:
            return msg
        now = asyncio.get_running_loop().time()
        if len(self._misses) == MAX_FALLBACK_MISSES and now - self._misses[0] < FALLBACK_WINDOW:
            return None  # made-up key ids of late: a 404 is taken at once
        msg = await ask_again(ask)
        if msg is None:
            msg = await self._read_first(subject, public_key)
        if msg is not None:
            self._stale_reads += 1
            log.debug("the certificate of %s was found only after a direct get answered 404 "
                      "(a replica behind)", public_key)
        else:
            self._misses.append(asyncio.get_running_loop().time())
        return msg

    async def _read_first(self, subject: str, public_key: str) -> Msg | None:
        """The subject's first stored message, through a one-shot consumer; None when it has none
        or the consumer cannot be made (then not tried again for :data:`_NO_CONSUMER_PAUSE`: a
        credential issued without the right to it would wait out every request timeout)."""
        loop = asyncio.get_running_loop()
        if loop.time() < self._no_consumer_until:
            return None
        try:
            return await read_first(self._nc, self._nc.jetstream(timeout=self._timeout), KEYS_STREAM, subject, 1,
                                    timeout=self._timeout, what=f"read the certificate of {public_key}")
        except OperationTimeoutError as exc:  # counted as pending, not delivered in time
            log.debug("cannot read the certificate of %s through a consumer: %s", public_key, exc)
            return None
        except BlackboardError as exc:
            self._no_consumer_until = loop.time() + _NO_CONSUMER_PAUSE
            log.warning("cannot read certificates through a consumer on %s (%s): a replica behind may make "
                        "valid records read as unknown_key; not tried again for %gs (reissue the credential "
                        "to grant it)", KEYS_STREAM, exc, _NO_CONSUMER_PAUSE)
            return None

    # -- revocations -------------------------------------------------------------------
    def add_listener(self, listener: Callable[[set[str]], object]) -> None:
        """Call ``listener(keys)`` with the keys whose revocation changed, on each news."""
        self._listeners.append(listener)

    @property
    def revocations(self) -> Revocations:
        return self._revocations

    def apply_revocations(self, record: KeyRevocations) -> set[str]:
        """Take a revocations record (unless older than the one held); returns the keys whose
        revocation changed (the listeners are told)."""
        if self._revocations_at is not None and record.updated_at < self._revocations_at:
            return set()
        new = Revocations.from_record(record)
        changed = new.changed(self._revocations)
        self._revocations, self._revocations_at = new, record.updated_at
        if changed:
            log.info("key revocations changed: %d key(s)", len(changed))
            for listener in list(self._listeners):
                listener(changed)
        return changed

    async def _on_revocations(self, msg: Msg) -> None:
        record = _read_revocations(msg)
        if record is not None:
            self.apply_revocations(record)

    async def start(self) -> None:
        """Follow the revocations: subscribe to the news, then read the last record.

        A registry that cannot be read (no ``BB_KEYS`` stream, no right to it) is
        logged; the keys then stay unknown.
        """
        if self._sub is None:
            self._sub = await self._nc.subscribe(Subjects.key_revocations(), cb=self._on_revocations)
            self._reread = asyncio.get_running_loop().create_task(self._read_again(), name="read revocations again")
        await self._read_revocations(logging.WARNING)

    async def _read_revocations(self, level: int) -> None:
        try:
            msg = await _direct_get(self._nc, Subjects.key_revocations(), self._timeout)
        except _IO_ERRORS as exc:
            log.log(logging.INFO if _no_stream(exc) else level,
                    "cannot read the key revocations (%r): is the BB_KEYS stream set up (blackboard setup)?", exc)
            return
        if msg is not None:
            await self._on_revocations(msg)

    async def _read_again(self) -> None:
        """Read the revocations record again at :data:`REVOCATIONS_REREAD` after start (while
        following them)."""
        started = asyncio.get_running_loop().time()
        for at in REVOCATIONS_REREAD:
            await asyncio.sleep(max(0.0, started + at - asyncio.get_running_loop().time()))
            if self._sub is None or self._nc.is_closed:
                return
            await self._read_revocations(logging.DEBUG)

    async def stop(self) -> None:
        sub, self._sub = self._sub, None
        reread, self._reread = self._reread, None
        if reread is not None:
            reread.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reread
        if sub is not None and not self._nc.is_closed:
            with contextlib.suppress(*_IO_ERRORS):
                await sub.unsubscribe()

    # -- certificates ------------------------------------------------------------------
    async def publish_own(self, signer: Signer) -> bool:
        """Publish the signer's certificate unless the registry holds it already; returns
        whether it was published. A failure (no right, no stream) is logged, not raised:
        the records it signs stay ``unknown_key`` to readers until it is published."""
        own = read_certificate(signer.public_key, signer.certificate, self.trusted_accounts)
        if own is not None:
            self._known[signer.public_key] = own
        try:
            return await publish_certificate(self._nc, signer.public_key, signer.certificate, self._timeout)
        except _IO_ERRORS as exc:
            log.log(logging.INFO if _no_stream(exc) else logging.WARNING,
                    "cannot publish the certificate of %s (%s): %r; readers will not verify its records "
                    "until it is published (at its next connect, or by blackboard auth publish)",
                    signer.principal, signer.public_key, exc)
            return False


async def publish_certificate(nc: NATS, public_key: str, certificate: str, timeout: float) -> bool:
    """Publish ``certificate`` at ``bb.keys.cert.<public key>`` unless it is there already.

    Raises:
        PermissionDeniedError: not this identity's key (and it is no operator); errors of the
            request (``_IO_ERRORS``).
    """
    subject = Subjects.key_certificate(public_key)
    data = certificate.encode("utf-8")
    last = await _direct_get(nc, subject, timeout)
    if last is not None and last.data == data:
        return False
    await _publish(nc, subject, data, Subjects.certificate_msg_id(public_key, _digest(data)), timeout)
    return True


@dataclass(frozen=True, slots=True)
class PublishedRegistry:
    """What :func:`publish_registry` did."""

    #: Certificates published (of the active identities whose credential file was at hand).
    published: list[str]
    #: Active identities' certificates already in the registry.
    unchanged: list[str]
    #: Active identities whose credential is not in the authority's ``creds/`` (issued elsewhere).
    missing: list[str]
    #: Whether the revocations record was published (it differed from the last one).
    revocations: bool


async def publish_registry(nc: NATS, authority: Authority, *, timeout: float = 5.0) -> PublishedRegistry:
    """Publish every active identity's certificate and the revocations record (as an operator).

    The certificate of an identity is the JWT of its ``creds/<id>.creds`` while that holds
    its active key. Raises what the publications raise (``PermissionDeniedError`` for an
    identity other than an operator).
    """
    published: list[str] = []
    unchanged: list[str] = []
    missing: list[str] = []
    for ident in authority.identities():
        if not ident.active:
            continue
        path = authority.credentials_path(ident.principal)
        try:
            creds = Credentials.parse(path.read_text(encoding="utf-8"), source=str(path))
        except (OSError, BlackboardError):
            creds = None
        if creds is None or creds.public_key != ident.public_key:
            missing.append(ident.principal)
            continue
        if await publish_certificate(nc, ident.public_key, creds.jwt, timeout):
            published.append(ident.principal)
        else:
            unchanged.append(ident.principal)
    revoked = authority.revocations()
    last = await _direct_get(nc, Subjects.key_revocations(), timeout)
    current = _read_revocations(last) if last is not None else None
    changed = (current.revoked != revoked) if current is not None else bool(revoked)
    if changed:
        record = KeyRevocations(revoked=revoked, updated_at=datetime.now(UTC))
        data = record.canonical_bytes()
        await _publish(nc, Subjects.key_revocations(), data, Subjects.revocations_msg_id(_digest(data)), timeout)
    return PublishedRegistry(published, unchanged, missing, changed)
