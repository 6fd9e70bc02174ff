"""The board on one JetStream KV bucket: the IO layer under ``agents_sdk.Board``.

Writes are JetStream publishes to ``$KV.<bucket>.<board>.<section>.<key>``
carrying a ``Nats-Msg-Id``, so a write retried after a lost ack (server
restart, network blip) is deduplicated by the server and never applied twice.
Compare-and-set uses ``Nats-Expected-Last-Subject-Sequence``. Reads of a key's
latest revision use a direct get of the last message on its subject
(``$JS.API.DIRECT.GET.<stream>.<subject>``, no body); a read at a revision, a
key's next revision, history, listings and watches use consumers created
through the named API subject with their one filter in it
(:mod:`blackboard.client.consumers`): the forms an agent's permissions allow.

**Read-your-writes.** A latest-value read (:meth:`BoardStore.get`,
:meth:`BoardStore.latest_revision`, a create's read of a tombstone) returns a
revision at least as new as anything this store wrote or read of that key
(:mod:`blackboard.client.revisions`, bounded). In a replicated stream any
replica answers a direct get; when one that is behind answers older (or 404),
the store asks again after short pauses, then reads from the known revision
with a one-shot consumer, within ``nats.request_timeout``
(:class:`OperationTimeoutError` saying the replicas lag behind that revision);
each such read is counted in :attr:`BoardStore.stale_reads`. A current answer,
the normal case, costs the one direct get. A pipeline's writes are remembered
when its ``flush`` settles them (a done callback on each write's future cost a
third of the pipeline's throughput with signatures on).

**Signatures** (docs/security.md, "Signatures"). With its connection's
:class:`~blackboard.client.signing.Signing`, every write is signed: the payload
is the entry's canonical encoding (JSON text with ``encoding="json"``, its
canonical bytes signed), and the three ``Bb-Sig*`` headers are made again
before each (re)send. Every read is verified, once per stored revision (the
connection's :class:`~blackboard.security.verifier.Verifier` keeps verdicts
per revision; this store decodes a revision once for all its watches): an
entry carries its ``verdict``. A strict read (:meth:`BoardStore.get`) of a
revision that does not verify raises :class:`UnverifiedRecordError`; watches,
history and listings hide it (``security.unverified = "hide"``, counted in
``hidden``) or pass it with its verdict (``"flag"``). The server's own expiry
markers carry no signature and are taken as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from blackboard.client.consumers import STALE_PAUSES, read_first
from blackboard.client.expiry import ExpiryTimer
from blackboard.client.follower import OrderedFollower, StartPosition
from blackboard.client.publisher import RETRYABLE, Publisher, Sign
from blackboard.client.revisions import SeenRevisions
from blackboard.client.signing import Signing, signing_of
from blackboard.protocol import codec
from blackboard.protocol.entries import (
    Change,
    Entry,
    Operation,
    decode_entry,
    encode_entry_record,
    entry_record_bytes,
    make_entry,
    parse_server_time,
    read_envelope,
)
from blackboard.protocol.errors import (
    BlackboardError,
    ConflictError,
    InvalidKeyError,
    InvalidPayloadError,
    NotConnectedError,
    NotFoundError,
    OperationTimeoutError,
    PayloadTooLargeError,
    TransportError,
    UnverifiedRecordError,
)
from blackboard.protocol.filters import Where, matches, parse_where
from blackboard.protocol.schemas import EntryEnvelope
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import Header, KeyParts, Subjects, parse_ttl, validate_name
from blackboard.security.verifier import Signed
from blackboard.settings import Settings

__all__ = ["BoardStore", "Hidden", "Pipeline", "Watch", "WatchStart", "WriteOp"]

_DECODED_CACHE = 1024

_PIPELINE_RETRYABLE: tuple[type[BaseException], ...] = RETRYABLE

log = logging.getLogger("blackboard.client.board_store")

#: Where a watch starts: only new changes, the current value of every key, or all history.
WatchStart = StartPosition
#: What a watch that hides a revision (it does not verify) delivers: nothing, or the key's removal
#: at that revision (what a view and the key listings do: the key reads as absent).
Hidden = Literal["skip", "remove"]

_WRONG_LAST_SEQ = 10071
_MSG_TOO_BIG = 10054
#: Subjects one stream-info listing holds at most (nats-server's page); beyond, boards() scans.
_MAX_SUBJECT_DETAILS = 100_000
#: Boards whose keys boards() reads at once (one ordered consumer each).
_LIVE_CHECKS = 8
#: Keys of a board ``boards()`` reads by direct get before it reads the board through.
_DIRECT_CHECKS = 4
#: Keys a watch remembers having expired itself, so that a server expiry marker that
#: follows (a stream with markers) is not delivered as a second removal.
_EXPIRED_REMEMBERED = 10_000
_SEQ_RE = re.compile(r"(\d+)\s*$")
_SIG_KEY = Header.SIG_KEY.value
_MARKER_REASON = Header.MARKER_REASON.value
_MSG_TTL = Header.MSG_TTL.value
_STATUS = Header.STATUS.value
_SEQUENCE = Header.SEQUENCE.value
_TIMESTAMP = Header.TIMESTAMP.value
#: The pause between one-shot reads from the known revision while nothing is there yet.
_STALE_POLL = 0.05

#: A stored message as the readers take it: revision, payload, headers, the server's time.
_Stored = tuple[int, bytes | None, Mapping[str, str], datetime | None]


@dataclass(frozen=True, slots=True)
class WriteOp:
    """One write of a pipelined batch."""

    section: str
    key: str
    value: Any
    content_type: str | None = None
    tags: tuple[str, ...] = ()
    metadata: Mapping[str, Any] | None = None
    expected_revision: int | None = None
    ttl: float | None = None


@dataclass(slots=True)
class _Prepared:
    subject: str
    payload: bytes
    headers: dict[str, str]
    key: str
    expected: int | None
    #: The record's canonical bytes, what its signature covers (the payload itself with
    #: msgpack; empty for a tombstone).
    record: bytes = b""


def _tag_tuple(tags: Any) -> tuple[str, ...]:
    """Tags given as another sequence than a tuple, as a tuple (the schema checks each tag).

    Raises:
        InvalidPayloadError: a string, bytes, a mapping or no sequence at all.
    """
    if type(tags) is list:  # the common case, without the ABC check below
        return tuple(tags)
    if isinstance(tags, str | bytes | bytearray | Mapping):
        raise InvalidPayloadError(f"tags must be a list of strings, not {type(tags).__name__}")
    try:
        return tuple(tags)
    except TypeError as exc:
        raise InvalidPayloadError(f"tags must be a list of strings, not {type(tags).__name__}") from exc


def _ttl_ok(ttl: Any) -> bool:
    """Whether ``ttl`` is a number of seconds a message TTL can be: finite, at least 1."""
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        return False
    return ttl >= 1 and (isinstance(ttl, int) or math.isfinite(ttl))


class BoardStore:
    """Board operations over one NATS connection. No IO in ``__init__``.

    Args:
        nc: a connected NATS client (it reconnects by itself).
        settings: the deployment's settings.
        signing: what writes are signed and reads verified with (default: the
            connection's, :func:`~blackboard.client.signing.signing_of`; none on
            a plain nats-py client).
    """

    def __init__(self, nc: NATS, settings: Settings, signing: Signing | None = None) -> None:
        self._nc = nc
        self._settings = settings
        self._js = nc.jetstream(timeout=settings.nats.request_timeout,
                                publish_async_max_pending=settings.nats.max_pending_writes)
        self.subjects = Subjects(settings.board.bucket)
        #: ``$JS.API.DIRECT.GET.KV_<bucket>``: a key's last message is this plus ``.<subject>`` (the get hot path).
        self._direct_prefix = Subjects.direct_get(self.subjects.kv_stream)
        self._publisher = Publisher(nc, self._js, settings.nats)
        #: recently decoded (and verified) revisions, shared by this store's watches
        self._decoded: OrderedDict[int, Entry] = OrderedDict()
        self._max = settings.board.max_value_size
        #: What this store signs its writes and verifies its reads with.
        self.signing = signing if signing is not None else signing_of(nc)
        self._signer = self.signing.signer
        self._verifier = self.signing.verifier
        #: ``security.unverified = "flag"``: readers get what does not verify, with its verdict.
        self._flag = self.signing.unverified == "flag"
        self._stream = self.subjects.kv_stream
        #: Revisions this store's watches, listings and histories hid (they do not verify).
        self.hidden = 0
        #: The stream places expiry markers (unsigned: the server writes them), which readers take.
        self._markers = settings.board.expiry_marker_ttl > 0
        #: The highest revision of each key this store wrote or read (read-your-writes).
        self._seen = SeenRevisions()
        self._stale_reads = 0

    @property
    def stale_reads(self) -> int:
        """Latest-value reads whose direct get answered older than a revision this store had
        written or read of the key (a replica behind), read again until at least that revision."""
        return self._stale_reads

    # ------------------------------------------------------------------ writes
    def _msg_id(self) -> str:
        return self._publisher.msg_id()

    def _prepare(
        self,
        board: str,
        section: str,
        key: str,
        value: Any,
        *,
        author: str,
        content_type: str | None,
        tags: Sequence[str],
        metadata: Mapping[str, Any] | None,
        expected_revision: int | None,
        ttl: float | None,
        encoding: codec.Encoding,
        msg_id: str | None = None,
    ) -> _Prepared:
        subject = self.subjects.entry(board, section, key)
        payload, record = encode_entry_record(value, author=author, content_type=content_type,
                                              tags=tags if type(tags) is tuple else _tag_tuple(tags),
                                              metadata=metadata, encoding=encoding)
        if len(payload) > self._max:
            raise PayloadTooLargeError(len(payload), self._max)
        headers = {Header.MSG_ID.value: msg_id or self._msg_id()}
        if encoding == "json":
            headers[Header.ENCODING.value] = "json"
        if expected_revision is not None:
            if type(expected_revision) is not int or expected_revision < 0:
                got = "a negative one" if type(expected_revision) is int else type(expected_revision).__name__
                raise InvalidPayloadError(f"expected_revision must be an integer >= 0, not {got}")
            headers[Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value] = str(expected_revision)
        if ttl is not None:
            if not _ttl_ok(ttl):
                raise InvalidPayloadError("ttl must be a finite number of seconds, at least 1")
            headers[Header.MSG_TTL.value] = f"{math.ceil(ttl)}s"
        return _Prepared(subject, payload, headers, f"{board}.{section}.{key}", expected_revision, record)

    def _sign(self, prep: _Prepared) -> Sign | None:
        """Signs ``prep``'s headers in place before each send (None: this store does not sign)."""
        return self.signing.sign_before_send(prep.subject, prep.headers, prep.record)

    def own_verdict(self, author: str) -> Verdict:
        """The verdict this store's readers give its own write as ``author``: ``unsigned``
        when they do not verify, else ``verified`` when the signer is ``author``."""
        if self._verifier is None:
            return Verdict.UNSIGNED
        signer = self._signer
        if signer is None:
            return Verdict.UNSIGNED
        return Verdict.VERIFIED if signer.principal == author else Verdict.WRONG_AUTHOR

    def shows(self, verdict: Verdict) -> bool:
        """Whether this store's readers show an entry of this verdict (``False``: they hide it)."""
        return verdict is Verdict.VERIFIED or self._verifier is None or self._flag

    async def _publish(self, prep: _Prepared) -> int:
        """Publish with retries until acked or the write timeout; returns the revision."""
        return await self._publish_prepared(prep, resend=False)

    async def _publish_prepared(self, prep: _Prepared, *, resend: bool) -> int:
        ack = await self._publisher.publish(prep.subject, prep.payload, prep.headers,
                                            what=f"write to {prep.key!r}",
                                            map_api_error=lambda exc: self._map_api_error(exc, prep),
                                            stream=self.subjects.kv_stream, resend=resend, sign=self._sign(prep))
        self._wrote(prep, ack.seq)
        return ack.seq

    def _wrote(self, prep: _Prepared, revision: int) -> None:
        """Remember an acknowledged write: this store's latest-value reads of its key return it
        or a later revision (an expiring one only until its TTL has run out)."""
        ttl = prep.headers.get(_MSG_TTL)
        seconds = parse_ttl(ttl) if ttl is not None else None
        expires_at = None if seconds is None else asyncio.get_running_loop().time() + seconds
        self._seen.wrote(prep.subject, revision, expires_at)

    def _map_api_error(self, exc: nats.js.errors.APIError, prep: _Prepared) -> BlackboardError:
        if exc.err_code == _WRONG_LAST_SEQ:
            match = _SEQ_RE.search(exc.description or "")
            current = int(match.group(1)) if match else -1
            return ConflictError(prep.key, prep.expected, current)
        if exc.err_code == _MSG_TOO_BIG:
            return PayloadTooLargeError(len(prep.payload), self._max)
        return TransportError(f"JetStream refused the write to {prep.key!r}: {exc.description} "
                              f"(code {exc.err_code})")

    async def put(
        self,
        board: str,
        section: str,
        key: str,
        value: Any,
        *,
        author: str,
        content_type: str | None = None,
        tags: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
        expected_revision: int | None = None,
        ttl: float | None = None,
        encoding: codec.Encoding = "msgpack",
        msg_id: str | None = None,
    ) -> int:
        """Write a value; with ``expected_revision`` only if the key is at that revision.

        ``msg_id`` (default: a fresh one) is the write's ``Nats-Msg-Id``:
        writers that send the same id within the stream's duplicate window
        make one write, and each gets its revision (a vote's application uses
        this to turn racing appliers into one write).

        Returns:
            The new revision (the first write's, for a duplicate ``msg_id``).

        Raises:
            ConflictError: ``expected_revision`` did not match.
            InvalidKeyError, PayloadTooLargeError, InvalidPayloadError: bad input.
            NotConnectedError, OperationTimeoutError: not acknowledged in time.
        """
        prep = self._prepare(board, section, key, value, author=author, content_type=content_type, tags=tags,
                             metadata=metadata, expected_revision=expected_revision, ttl=ttl, encoding=encoding,
                             msg_id=msg_id)
        return await self._publish(prep)

    async def create(self, board: str, section: str, key: str, value: Any, *, author: str,
                     **kwargs: Any) -> int:
        """Write only if the key does not exist (or was deleted).

        Raises:
            ConflictError: the key exists; ``current_revision`` is its revision.
        """
        try:
            return await self.put(board, section, key, value, author=author, expected_revision=0, **kwargs)
        except ConflictError as exc:
            # A deleted key may be re-created: CAS on the tombstone's revision.
            try:
                latest = await self._get_raw(board, section, key)
            except NotFoundError:
                raise exc from None
            if latest.operation is Operation.PUT:
                raise ConflictError(exc.key, 0, latest.revision) from None
            return await self.put(board, section, key, value, author=author,
                                  expected_revision=latest.revision, **kwargs)

    async def delete(self, board: str, section: str, key: str, *, expected_revision: int | None = None,
                     purge: bool = False) -> int:
        """Write a tombstone: ``KV-Operation: DEL``, or ``PURGE`` with ``purge=True``.

        Both make the key read as absent; the earlier revisions stay in the
        key's history until newer ones push them out (the history depth): the
        board stream refuses rollups, which would drop them at once.

        Returns:
            The tombstone's revision.

        Raises:
            ConflictError: ``expected_revision`` did not match.
        """
        return await self._publish(self._prepare_delete(board, section, key, expected_revision, purge))

    def _prepare_delete(self, board: str, section: str, key: str, expected_revision: int | None,
                        purge: bool) -> _Prepared:
        subject = self.subjects.entry(board, section, key)
        headers = {Header.MSG_ID.value: self._msg_id(),
                   Header.KV_OPERATION.value: "PURGE" if purge else "DEL"}
        if expected_revision is not None:
            headers[Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value] = str(expected_revision)
        return _Prepared(subject, b"", headers, f"{board}.{section}.{key}", expected_revision)

    async def purge_board(self, board: str) -> int:
        """Purge every key of a board (watchers see a purge per key).

        Returns:
            The number of keys purged.
        """
        keys = await self._scan_keys(self.subjects.entry_filter(board))
        if not keys:
            return 0
        async with self.pipeline() as pipe:
            for parts in keys:
                await pipe.delete(parts.board, parts.section, parts.key, purge=True)
        return len(keys)

    async def close(self) -> None:
        """Drop the write acknowledgement subscription (made again on the next write)."""
        await self._publisher.close()

    def pipeline(self, *, author: str = "") -> Pipeline:
        """A pipelined write path: many writes in flight, each still acknowledged.

        At most ``settings.nats.max_pending_writes`` writes are unacknowledged
        at a time; sending more waits.
        """
        return Pipeline(self, author=author)

    # ------------------------------------------------------------------- reads
    async def _request(self, subject: str, payload: bytes, what: str) -> Msg:
        return await self._publisher.request(subject, payload, what=what)

    # -------------------------------------------------------- verification
    def _item(self, subject: str, headers: Mapping[str, str] | None, data: bytes | None,
              stored_at: datetime | None, env: EntryEnvelope | None, seq: int) -> Signed:
        """What the verifier checks of a stored revision (its verdict kept per revision)."""
        return Signed(subject, headers, data or b"", stored_at, None if env is None else env.author,
                      None if env is None else functools.partial(entry_record_bytes, env), (self._stream, seq))

    def _known(self, headers: Mapping[str, str] | None) -> bool:
        """Whether the verifier can check a message now (no certificate to fetch first)."""
        key = headers.get(_SIG_KEY) if headers else None
        return key is None or self._verifier is None or self._verifier.keys.lookup(key) is not None

    def _signer_of(self, headers: Mapping[str, str] | None) -> str | None:
        """The principal of a message's signing key, when known."""
        return None if self._verifier is None else self._verifier.signer_of(headers)

    async def _read(self, parts: KeyParts, seq: int, subject: str, data: bytes | None,
                    headers: Mapping[str, str] | None, stored_at: datetime | None) -> Entry:
        """Decode and verify one stored revision (a strict read's: not shared).

        Raises:
            InvalidPayloadError, LimitExceededError: not a readable entry.
        """
        op, env = read_envelope(parts, seq, data, headers)
        verifier = self._verifier
        if verifier is None:
            return make_entry(parts, seq, op, env, stored_at)
        item = self._item(subject, headers, data, stored_at, env, seq)
        verdict = verifier.check(item) if self._known(headers) else await verifier.verify(item)
        return make_entry(parts, seq, op, env, stored_at, verdict)

    def _strict(self, entry: Entry, subject: str, headers: Mapping[str, str] | None) -> Entry:
        """``entry`` when a strict read may return it.

        Raises:
            UnverifiedRecordError: it does not verify (``security.unverified = "hide"``).
        """
        if self.shows(entry.verdict) or self.server_marker(entry, headers):
            return entry
        raise UnverifiedRecordError(entry.verdict, subject, revision=entry.revision,
                                    signer=self._signer_of(headers), record=entry)

    def _decode_shared(self, seq: int, msg: Msg, stored_at: datetime | None) -> Entry | Awaitable[Entry]:
        """Decode and verify a stored message once for every watch of this store: the entry,
        or (when the signer's certificate must be fetched first) an awaitable of it.

        Several watches (views) of one agent see the same revisions; the
        first decodes and verifies it and the others get the same (read-only)
        Entry. A verified entry whose key has since been revoked is verified again.

        Raises:
            InvalidKeyError, InvalidPayloadError: not a readable entry.
        """
        entry = self._decoded.get(seq)  # a stream sequence is never reused
        if entry is not None and (entry.verdict is not Verdict.VERIFIED or not self._revoked(msg.headers)):
            return entry
        parts = self.subjects.parse_entry(msg.subject)
        op, env = read_envelope(parts, seq, msg.data, msg.headers)
        verifier = self._verifier
        if verifier is None:
            return self._keep(make_entry(parts, seq, op, env, stored_at))
        item = self._item(msg.subject, msg.headers, msg.data, stored_at, env, seq)
        if not self._known(msg.headers):
            return self._verify_shared(item, parts, seq, op, env, stored_at)
        return self._keep(make_entry(parts, seq, op, env, stored_at, verifier.check(item)))

    async def _verify_shared(self, item: Signed, parts: KeyParts, seq: int, op: Operation,
                             env: EntryEnvelope | None, stored_at: datetime | None) -> Entry:
        assert self._verifier is not None
        verdict = await self._verifier.verify(item)
        return self._keep(make_entry(parts, seq, op, env, stored_at, verdict))

    def _keep(self, entry: Entry) -> Entry:
        """Share a decoded entry with the other watches (not one whose signer's certificate
        was not found: it may be published yet)."""
        if entry.verdict is not Verdict.UNKNOWN_KEY:
            self._decoded[entry.revision] = entry
            if len(self._decoded) > _DECODED_CACHE:
                self._decoded.popitem(last=False)
        return entry

    def server_marker(self, entry: Entry, headers: Mapping[str, str] | None) -> bool:
        """Whether an unsigned entry is the server's expiry marker, which readers take as it is:
        a purge with ``Nats-Marker-Reason`` on a stream that places markers
        (``board.expiry_marker_ttl``; on one that does not, such a message is forged)."""
        return (self._markers and entry.verdict is Verdict.UNSIGNED and entry.operation is Operation.PURGE
                and headers is not None and _MARKER_REASON in headers)

    def _revoked(self, headers: Mapping[str, str] | None) -> bool:
        """Whether a message's signing key has a revocation (a kept verdict may be out of date)."""
        key = headers.get(_SIG_KEY) if headers else None
        return key is not None and self._verifier is not None and self._verifier.keys.revoked_at(key) is not None

    async def _direct_get(self, subject: str, what: str) -> Msg:
        """The direct get of ``subject``'s last message: the one place this store sends one
        (``$JS.API.DIRECT.GET.<stream>.<subject>``, no body; any replica may answer)."""
        return await self._request(f"{self._direct_prefix}.{subject}", b"", what)

    @staticmethod
    def _answered(msg: Msg, what: str) -> _Stored | None:
        """A direct get's answer: the stored message, or ``None`` for 404 (no message).

        Raises:
            TransportError: another status (an error).
        """
        headers = msg.headers or {}
        status = headers.get(_STATUS)
        if status:
            if status == "404":
                return None
            raise TransportError(f"direct get of {what!r} failed: {status} {headers.get('Description', '')}")
        return int(headers[_SEQUENCE]), msg.data, headers, parse_server_time(headers.get(_TIMESTAMP))

    @staticmethod
    def _delivered(msg: Msg) -> _Stored:
        """A consumer's delivery as a stored message (the revision and exact server time from its
        reply subject, as a direct get's headers give them)."""
        _, revision, stored_at = Subjects.parse_ack(msg.reply)
        return revision, msg.data, msg.headers or {}, stored_at

    def _held(self, subject: str, stored: _Stored) -> None:
        """Remember a latest-value read's revision, unless it expires (``Nats-TTL``, a server
        expiry marker): after that the server serves the key's previous revision again."""
        headers = stored[2]
        if _MSG_TTL not in headers and _MARKER_REASON not in headers:
            self._seen.saw(subject, stored[0])

    async def _last(self, subject: str, what: str) -> _Stored | None:
        """The key's last stored message (``None``: it has none), never older than a revision
        this store wrote or read of it (read-your-writes, monotonic reads).

        One direct get when its answer is current (the normal case, and always on one
        server). When a replica that has not applied a known revision yet answers (older, or
        404), :meth:`_catch_up` reads again.

        Raises:
            OperationTimeoutError: the replicas did not reach the known revision in time.
            NotConnectedError, TransportError: the read failed.
        """
        got = self._answered(await self._direct_get(subject, what), what)
        known = self._seen.revisions.get(subject)
        if known is not None and (got is None or got[0] < known):
            got = await self._catch_up(subject, known, got, what)
        elif got is not None and (known is None or got[0] > known):
            self._held(subject, got)
        return got

    async def _catch_up(self, subject: str, known: int, got: _Stored | None, what: str) -> _Stored | None:
        """A latest-value read whose direct get answered older than ``known`` (or nothing): the
        direct get again after short pauses, then a one-shot consumer from ``known`` (it waits
        for the first message at or after it), until ``nats.request_timeout``.

        An expiring write whose TTL has run out is no longer insisted on: ``got`` is the key's
        state then. After a timeout ``known`` is forgotten (a stream made again from scratch
        starts its revisions at 1 again: the key must not stay unreadable).

        Raises:
            OperationTimeoutError: nothing at or after ``known`` within the request timeout.
        """
        self._stale_reads += 1
        log.debug("direct get of %s answered revision %s, older than revision %d this store wrote or read: "
                  "reading again", what, None if got is None else got[0], known)
        loop = asyncio.get_running_loop()
        timeout = self._settings.nats.request_timeout
        deadline = loop.time() + timeout
        seen = self._seen
        pauses = iter(STALE_PAUSES)
        while True:
            if seen.expired(subject, loop.time()):
                seen.forget(subject)
                return got
            pause = next(pauses, None)
            if pause is None:  # the direct gets did not catch up: read from the known revision on
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    first = await read_first(self._nc, self._js, self._stream, subject, known,
                                             timeout=remaining, what=f"read {what} from revision {known}")
                except (OperationTimeoutError, NotConnectedError) as exc:
                    if isinstance(exc, NotConnectedError) and not self._nc.is_connected:
                        raise
                    # Out of time, the consumer's creation included (its answer is a timeout
                    # too, which read_first names NotConnectedError): the replicas lag.
                    raise self._lagging(subject, known, what, timeout) from exc
                if first is not None:
                    stored = self._delivered(first)
                    log.debug("read %s at revision %d through a consumer", what, stored[0])
                    self._held(subject, stored)
                    return stored
                pause = min(_STALE_POLL, max(0.0, deadline - loop.time()))
            await asyncio.sleep(pause)
            got = self._answered(await self._direct_get(subject, what), what)
            if got is not None and got[0] >= known:
                self._held(subject, got)
                return got
            if loop.time() >= deadline:
                break
        raise self._lagging(subject, known, what, timeout)

    def _lagging(self, subject: str, known: int, what: str, timeout: float) -> OperationTimeoutError:
        self._seen.forget(subject)
        return OperationTimeoutError(f"reading {what}: the replicas lag behind revision {known} (written or read "
                                     f"by this client): it did not arrive within {timeout:g}s")

    async def _get_raw(self, board: str, section: str, key: str) -> Entry:
        """The key's last revision, decoded, its signature not checked (what a write reads to
        compare-and-set on a tombstone)."""
        subject = self.subjects.entry(board, section, key)  # validates the names
        what = f"{board}.{section}.{key}"
        got = await self._last(subject, what)
        if got is None:
            raise NotFoundError(what)
        revision, data, headers, stored_at = got
        return decode_entry(KeyParts(board, section, key), revision, data, headers, stored_at)

    async def _get_latest(self, parts: KeyParts, subject: str, what: str) -> tuple[Entry, Mapping[str, str]]:
        """The key's last revision, decoded and verified, and its headers."""
        got = await self._last(subject, what)
        if got is None:
            raise NotFoundError(what)
        revision, data, headers, stored_at = got
        return await self._read(parts, revision, subject, data, headers, stored_at), headers

    async def latest_revision(self, board: str, section: str, key: str) -> int:
        """The revision of the key's last write (a delete included), 0 if it has none; never
        older than a revision this store wrote or read of it."""
        subject = self.subjects.entry(board, section, key)
        got = await self._last(subject, f"{board}.{section}.{key}")
        return 0 if got is None else got[0]

    async def _read_first(self, subject: str, start: int, what: str) -> Msg | None:
        """The first stored message on ``subject`` from revision ``start`` on (a one-shot
        consumer, :func:`~blackboard.client.consumers.read_first`), or ``None``."""
        return await read_first(self._nc, self._js, self.subjects.kv_stream, subject, start,
                                timeout=self._settings.nats.request_timeout, what=f"read {what}")

    async def _entry_from_delivery(self, msg: Msg) -> Entry:
        """A consumer's delivery as an entry, verified (the revision and exact server time from
        its reply subject, as a direct get's headers give them)."""
        revision, data, headers, stored_at = self._delivered(msg)
        return await self._read(self.subjects.parse_entry(msg.subject), revision, msg.subject, data, headers,
                                stored_at)

    async def next_revision(self, board: str, section: str, key: str, after: int) -> tuple[int, Entry | None] | None:
        """The key's first revision after ``after`` and its entry (``None`` when that
        message is not a readable entry, or does not verify and ``security.unverified``
        is ``hide``), or ``None`` if the key has no later revision."""
        what = f"{board}.{section}.{key}"
        msg = await self._read_first(self.subjects.entry(board, section, key), max(1, after + 1), what)
        if msg is None:
            return None
        revision = msg.metadata.sequence.stream
        try:
            entry = await self._entry_from_delivery(msg)
        except (InvalidKeyError, InvalidPayloadError):
            return revision, None
        return revision, entry if self.shows(entry.verdict) else None

    async def get(self, board: str, section: str, key: str, *, revision: int | None = None) -> Entry:
        """The latest value of a key, or the value at ``revision``, verified.

        Raises:
            NotFoundError: no such key, it was deleted, or that revision is not
                (or no longer) in the history of this key.
            UnverifiedRecordError: that revision (a tombstone included) does not
                verify, with ``security.unverified = "hide"`` (with ``"flag"`` it
                is returned, its ``verdict`` telling why).
        """
        what = f"{board}.{section}.{key}"
        subject = self.subjects.entry(board, section, key)  # validates the names
        parts = KeyParts(board, section, key)
        headers: Mapping[str, str] | None
        if revision is None:
            entry, headers = await self._get_latest(parts, subject, what)
        else:
            if type(revision) is not int:
                raise InvalidPayloadError(f"revision must be an integer, not {type(revision).__name__}")
            if revision < 1:
                raise NotFoundError(what, f"{what!r} has no revision {revision}")
            msg = await self._read_first(subject, revision, f"{what}@{revision}")
            if msg is None or msg.metadata.sequence.stream != revision:
                raise NotFoundError(what, f"{what!r} has no revision {revision}")
            entry, headers = await self._entry_from_delivery(msg), msg.headers
        entry = self._strict(entry, subject, headers)
        if entry.operation is not Operation.PUT:
            raise NotFoundError(what, f"{what!r} was deleted at revision {entry.revision}")
        return entry

    async def history(self, board: str, section: str, key: str) -> list[Entry]:
        """Every revision JetStream keeps of a key, oldest first (deletes included); those
        that do not verify are left out (``security.unverified = "hide"``, counted in
        :attr:`hidden`) or carry their verdict (``"flag"``)."""
        subject = self.subjects.entry(board, section, key)
        entries: list[Entry] = []
        async with Watch(self, subject, start="all", stop_when_caught_up=True) as watch:
            async for change in watch:
                entries.append(change.entry)
        return entries

    async def _scan_keys(self, filter_subject: str) -> list[KeyParts]:
        """The keys whose latest revision is a put (that verifies, or any with ``flag``).

        Headers are enough for that unless revisions are verified (a signature covers the payload).
        """
        parts: list[KeyParts] = []
        async with Watch(self, filter_subject, start="current", headers_only=self._verifier is None,
                         stop_when_caught_up=True, hidden="remove") as watch:
            async for change in watch:
                if change.entry.operation is Operation.PUT:
                    e = change.entry
                    parts.append(KeyParts(e.board, e.section, e.key))
        return parts

    async def keys(self, board: str, section: str) -> list[str]:
        """Live keys of a section, sorted."""
        return sorted(p.key for p in await self._scan_keys(self.subjects.entry_filter(board, section)))

    async def entries(self, board: str, section: str | None = None, *,
                      where: Mapping[str, Any] | Where | None = None) -> list[Entry]:
        """The live entries of a board (or of one of its sections), sorted by (section, key); with
        ``where``, only those it matches (:func:`~blackboard.protocol.filters.matches` on each
        entry's metadata and value: the search's semantics, docs/search.md "Filters").

        Reads each key's latest revision once (a consumer from the current values, stopped when
        caught up, as :meth:`keys`); a revision that does not verify reads as the key's absence
        (``security.unverified = "hide"``).

        Raises:
            InvalidKeyError: an invalid board or section name.
            InvalidPayloadError: ``where`` is invalid (:func:`~blackboard.protocol.filters.parse_where`).
            NotConnectedError, OperationTimeoutError, TransportError: the read failed.
        """
        validate_name(board, "board")
        if section is not None:
            validate_name(section, "section")
        w = parse_where(where)
        latest: dict[tuple[str, str], Entry] = {}
        async with Watch(self, self.subjects.entry_filter(board, section), start="current",
                         stop_when_caught_up=True, hidden="remove") as watch:
            async for change in watch:
                e = change.entry
                if e.operation is Operation.PUT:
                    latest[(e.section, e.key)] = e
                else:
                    latest.pop((e.section, e.key), None)
        return [e for _, e in sorted(latest.items()) if not w or matches(w, metadata=e.metadata, value=e.value)]

    async def sections(self, board: str) -> list[str]:
        """Sections of a board that hold at least one live key, sorted."""
        return sorted({p.section for p in await self._scan_keys(self.subjects.entry_filter(board))})

    async def boards(self, where: Callable[[str], bool] | None = None) -> list[str]:
        """Boards that hold at least one live key, sorted (with ``where``: only those it accepts).

        Cheap however many keys there are: the server lists the bucket's
        subjects (one API request, no message read), which names every board
        that has held a key and its keys; then a few keys of each board are read
        by direct get of their last revision (a few boards at a time) until a
        live one that verifies, which is usually the first. Only a board whose every key is deleted or purged
        is read through. Past ``_MAX_SUBJECT_DETAILS`` subjects (one page of
        the server's listing) every key's latest revision is scanned instead.

        The listing and the scan read across every board (the stream's subjects,
        ``$KV.<bucket>.>``), which only the system identity (the worker) and an
        open bus may do: with a credential, an agent asks the system service
        (``bb.search.<principal>.boards``, :meth:`agents_sdk.Agent.boards`), which
        passes its rights as ``where``.

        Raises:
            NotConnectedError, OperationTimeoutError, TransportError: the listing failed.
        """
        named = await self._boards_named()
        if named is None:
            scanned = {p.board for p in await self._scan_keys(self.subjects.entry_filter())}
            return sorted(b for b in scanned if where is None or where(b))
        candidates = [b for b in sorted(named) if where is None or where(b)]
        slots = asyncio.Semaphore(_LIVE_CHECKS)

        async def live(board: str) -> bool:
            async with slots:
                return await self._has_live_key(board, named[board])

        found = await asyncio.gather(*(live(board) for board in candidates))
        return sorted(board for board, ok in zip(candidates, found, strict=True) if ok)

    async def _boards_named(self) -> dict[str, list[KeyParts]] | None:
        """The boards named by the bucket's subjects, with their keys (None: more subjects than
        one listing holds)."""
        try:
            info = await self._js.stream_info(self.subjects.kv_stream, subjects_filter=self.subjects.entry_filter())
        except nats.errors.ConnectionClosedError as exc:
            raise NotConnectedError("the NATS connection is closed") from exc
        except RETRYABLE as exc:
            raise OperationTimeoutError(f"listing the boards of {self.subjects.kv_stream}: {exc!r}") from exc
        except nats.js.errors.APIError as exc:
            raise TransportError(f"listing the boards of {self.subjects.kv_stream}: {exc.description} "
                                 f"(code {exc.err_code})") from exc
        subjects = info.state.subjects or {}
        if len(subjects) >= _MAX_SUBJECT_DETAILS:
            return None
        boards: dict[str, list[KeyParts]] = {}
        for subject in subjects:
            try:
                parts = self.subjects.parse_entry(subject)
            except InvalidKeyError:
                continue  # not a key of ours (written by hand): no board
            boards.setdefault(parts.board, []).append(parts)
        return boards

    async def _has_live_key(self, board: str, keys: Sequence[KeyParts]) -> bool:
        """Whether some key of ``board`` is live: its last revision a put that this store's
        readers show. The first few keys are read by direct get (one of them is live, usually
        the first); a board with more keys than that and none of them live is read through by
        one consumer (its keys' latest revisions, stopping at the first live one)."""
        for parts in keys[:_DIRECT_CHECKS]:
            subject = self.subjects.entry(parts.board, parts.section, parts.key)
            got = await self._last(subject, f"{parts.board}.{parts.section}.{parts.key}")
            if got is None:
                continue  # gone since the listing
            revision, data, headers, stored_at = got
            try:
                entry = await self._read(parts, revision, subject, data, headers, stored_at)
            except (InvalidKeyError, InvalidPayloadError):
                continue  # not a readable entry: not live
            if entry.operation is Operation.PUT and self.shows(entry.verdict):
                return True
        if len(keys) <= _DIRECT_CHECKS:
            return False
        async with Watch(self, self.subjects.entry_filter(board), start="current",
                         headers_only=self._verifier is None, stop_when_caught_up=True, hidden="remove") as watch:
            async for change in watch:
                if change.entry.operation is Operation.PUT:
                    return True
        return False

    def follow(
        self,
        filter_subject: str,
        on_message: Callable[[Msg], Awaitable[None] | None],
        *,
        start: WatchStart = "all",
        from_revision: int | None = None,
        headers_only: bool = False,
        on_ready: Callable[[], None] | None = None,
        what: str | None = None,
    ) -> OrderedFollower:
        """An ordered follower of the board bucket's messages matching ``filter_subject``
        (raw messages, in revision order; :class:`Watch` decodes them into changes)."""
        return OrderedFollower(self._js, self.subjects.kv_stream, filter_subject, on_message, nc=self._nc,
                               start=start, from_sequence=from_revision, headers_only=headers_only,
                               on_ready=on_ready, what=what, timeout=self._settings.nats.request_timeout)

    def watch(
        self,
        board: str | None = None,
        section: str | None = None,
        key: str | None = None,
        *,
        start: WatchStart = "new",
        from_revision: int | None = None,
        include_deletes: bool = True,
        hidden: Hidden = "skip",
    ) -> Watch:
        """Watch changes to a board, a section or one key (``None`` = wildcard).

        ``start``: ``"new"`` only changes from now on, ``"current"`` first the
        current value of every matching key, ``"all"`` the whole kept history;
        ``from_revision`` replays from that revision on (overrides ``start``).
        ``hidden``: what a revision that does not verify becomes (with
        ``security.unverified = "hide"``): nothing (``"skip"``), or the key's
        removal at that revision (``"remove"``, what a view does).
        """
        if board is not None:
            validate_name(board, "board")
        return Watch(self, self.subjects.entry_filter(board, section, key), start=start,
                     from_revision=from_revision, include_deletes=include_deletes, hidden=hidden)


class Watch:
    """An async iterator of :class:`Change` over an ordered follower.

    Use as ``async with store.watch(...) as w: async for change in w: ...``.
    ``ready`` is set once the changes that existed when the watch started
    (current values, history or replay) have been received from the server;
    ``caught_up`` once the iterating consumer has also taken all of them. The
    follower (:class:`~blackboard.client.follower.OrderedFollower`) recreates
    its consumer after a disconnect or a server restart, resuming after the
    last delivered revision: no gaps, no duplicates. A stored message that
    cannot be decoded into an entry is skipped with a warning and counted in
    ``skipped``; the watch goes on. ``stop`` unsubscribes (the server removes
    the consumer a few seconds later, :data:`~blackboard.client.consumers.INACTIVE_THRESHOLD`).

    **Expiry.** When the latest revision of a key that the watch delivered
    was written with a TTL, the watch delivers a ``PURGE`` change for the key
    at the moment it expires (its stored time plus its TTL, on the server's
    clock; one timer per watch, :class:`~blackboard.client.expiry.ExpiryTimer`):
    the server writes nothing then (no expiry markers by default), so that
    change carries the expired revision, not a new one, and ``stored_at`` is
    the expiry time. On a stream with expiry markers the server's marker that
    follows is not delivered again. A watch that stops when caught up
    (listings, history) does not track expiries.

    **Signatures.** Each change's entry carries its ``verdict``. A revision
    that does not verify is hidden (``security.unverified = "hide"``, counted in
    ``hidden``): skipped, or with ``hidden="remove"`` (views, key listings)
    delivered as the key's removal at that revision (``DELETE``, no value, its
    verdict kept), so the key reads as absent rather than at an older value.
    With ``"flag"`` it is delivered with its verdict. The signer's certificate
    is fetched when not yet known, the watch's deliveries waiting in order.
    """

    def __init__(
        self,
        store: BoardStore,
        filter_subject: str,
        *,
        start: WatchStart = "new",
        from_revision: int | None = None,
        include_deletes: bool = True,
        headers_only: bool = False,
        stop_when_caught_up: bool = False,
        hidden: Hidden = "skip",
    ) -> None:
        self._store = store
        self._filter = filter_subject
        self._include_deletes = include_deletes
        self._headers_only = headers_only
        self._stop_when_caught_up = stop_when_caught_up
        self._queue: asyncio.Queue[Change | BaseException | None] = asyncio.Queue()
        self._follower = store.follow(filter_subject, self._on_msg, start=start, from_revision=from_revision,
                                      headers_only=headers_only, on_ready=self._on_ready,
                                      what=f"start a watch on {filter_subject}")
        self.ready = self._follower.ready
        self.caught_up = asyncio.Event()
        self._enqueued = 0
        self._dequeued = 0
        self._ready_mark = 0
        self._closed = False
        self._undecodable = 0
        self._expiry: ExpiryTimer[KeyParts] | None = None if stop_when_caught_up else ExpiryTimer(self._expire)
        #: Keys this watch expired itself (a server marker may follow), oldest first.
        self._expired: OrderedDict[KeyParts, int] = OrderedDict()
        #: Hide what does not verify (``security.unverified = "hide"`` on a verifying store).
        self._hide = store._verifier is not None and not store._flag
        self._remove_hidden = hidden == "remove"
        self._hidden = 0
        #: The verdict an expiry carries: its entry's (kept here only when not this one).
        self._ok = Verdict.UNSIGNED if store._verifier is None else Verdict.VERIFIED
        self._ttl_verdicts: dict[KeyParts, Verdict] = {}

    @property
    def skipped(self) -> int:
        """Stored messages this watch skipped: not decodable into an entry (a bad key, a payload
        that is not an entry), or failing in a way the follower caught (each logged)."""
        return self._undecodable + self._follower.skipped

    @property
    def hidden(self) -> int:
        """Revisions this watch hid because they do not verify (``security.unverified = "hide"``)."""
        return self._hidden

    @property
    def last_revision(self) -> int:
        """The revision of the last change delivered (filtered ones included), 0 before any."""
        return self._follower.last_sequence

    async def __aenter__(self) -> Watch:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Create the consumer (idempotent).

        Raises:
            NotConnectedError: NATS is unreachable.
            ConfigurationError: the board bucket's stream does not exist.
        """
        await self._follower.start()

    def _on_ready(self) -> None:
        self._ready_mark = self._enqueued
        if self._dequeued >= self._ready_mark:
            self.caught_up.set()
        if self._stop_when_caught_up:
            self._queue.put_nowait(None)

    def _on_msg(self, msg: Msg) -> Awaitable[None] | None:
        md = msg.metadata
        seq = md.sequence.stream
        try:
            if self._headers_only:
                entry = decode_entry(self._store.subjects.parse_entry(msg.subject), seq, None, msg.headers,
                                     md.timestamp)
            else:
                got = self._store._decode_shared(seq, msg, md.timestamp)
                if not isinstance(got, Entry):  # the signer's certificate is fetched first
                    return self._deliver_later(got, msg.headers, md.timestamp, md.num_pending)
                entry = got
        except (InvalidPayloadError, InvalidKeyError) as exc:
            self._undecodable += 1
            log.warning("skipping undecodable board message %s (revision %d): %s", msg.subject, seq, exc)
            return None
        self._deliver(entry, msg.headers, md.timestamp, md.num_pending)
        return None

    async def _deliver_later(self, pending: Awaitable[Entry], headers: Mapping[str, str] | None,
                             stored_at: datetime | None, num_pending: int) -> None:
        self._deliver(await pending, headers, stored_at, num_pending)

    def _deliver(self, entry: Entry, headers: Mapping[str, str] | None, stored_at: datetime | None,
                 num_pending: int) -> None:
        if self._hide and entry.verdict is not Verdict.VERIFIED and not self._store.server_marker(entry, headers):
            self._hidden += 1
            self._store.hidden += 1
            log.debug("hiding board revision %d of %s.%s.%s: %s", entry.revision, entry.board, entry.section,
                      entry.key, entry.verdict)
            if self._expiry is not None:  # the key's latest revision now: an earlier one's TTL no longer applies
                self._expiry.seen(KeyParts(entry.board, entry.section, entry.key), entry.revision, None)
            if not self._remove_hidden:
                return
            entry = Entry(entry.board, entry.section, entry.key, entry.revision, stored_at=entry.stored_at,
                          operation=Operation.DELETE if entry.operation is Operation.PUT else entry.operation,
                          verdict=entry.verdict)
        elif self._expiry is not None and self._track_expiry(entry, headers, stored_at):
            return
        if entry.operation is Operation.PUT or self._include_deletes:
            self._queue.put_nowait(Change(entry, num_pending))
            self._enqueued += 1

    def _track_expiry(self, entry: Entry, headers: Mapping[str, str] | None, stored_at: datetime | None) -> bool:
        """Note ``entry`` as its key's latest revision, with its expiry when it has a TTL; True when
        it is the server's expiry marker of a key this watch has already expired (not delivered)."""
        assert self._expiry is not None
        key = KeyParts(entry.board, entry.section, entry.key)
        expired = self._expired.pop(key, None) if self._expired else None
        if expired is not None and headers and Header.MARKER_REASON.value in headers:
            return True
        if self._ttl_verdicts:
            self._ttl_verdicts.pop(key, None)
        ttl = headers.get(Header.MSG_TTL.value) if headers and entry.operation is Operation.PUT else None
        seconds = parse_ttl(ttl) if ttl else None
        deadline = stored_at.timestamp() + seconds if seconds is not None and stored_at is not None else None
        if deadline is not None and entry.verdict is not self._ok:
            self._ttl_verdicts[key] = entry.verdict  # (flag) its expiry carries its verdict
        self._expiry.seen(key, entry.revision, deadline)
        return False

    def _expire(self, key: KeyParts, revision: int, deadline: float) -> None:
        """The TTL of ``key``'s latest revision ran out: deliver its removal."""
        if self._closed:
            return
        self._expired[key] = revision
        while len(self._expired) > _EXPIRED_REMEMBERED:
            self._expired.popitem(last=False)
        verdict = self._ttl_verdicts.pop(key, self._ok) if self._ttl_verdicts else self._ok
        if self._include_deletes:
            entry = Entry(key.board, key.section, key.key, revision, operation=Operation.PURGE,
                          stored_at=datetime.fromtimestamp(deadline, UTC), verdict=verdict)
            self._queue.put_nowait(Change(entry, 0))
            self._enqueued += 1

    def __aiter__(self) -> AsyncIterator[Change]:
        return self

    async def __anext__(self) -> Change:
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            self._closed = True
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        self._dequeued += 1
        if self.ready.is_set() and self._dequeued >= self._ready_mark:
            self.caught_up.set()
        return item

    async def next(self, timeout: float | None = None) -> Change:
        """The next change, waiting at most ``timeout`` seconds.

        Raises:
            OperationTimeoutError: nothing arrived in time.
        """
        try:
            return await asyncio.wait_for(self.__anext__(), timeout)
        except TimeoutError as exc:
            raise OperationTimeoutError(f"no change on {self._filter} within {timeout}s") from exc

    async def stop(self) -> None:
        """Stop following (unsubscribe) and end the iteration."""
        if self._expiry is not None:
            self._expiry.close()
        await self._follower.stop()
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(None)


#: Writes a pipeline signs with one signature (a Merkle batch: docs/protocol.md, "Signatures").
_SIGN_BATCH = 32


def _chain(source: asyncio.Future[int], target: asyncio.Future[int]) -> None:
    """Resolve ``target`` (a caller's future) like ``source`` (the publisher's) once it is done."""
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif (exc := source.exception()) is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())


class Pipeline:
    """Many writes in flight, each still acknowledged (and deduplicated on retry).

    ``await put(...)`` / ``await delete(...)`` send a write and return an
    ``asyncio.Future`` of its revision (an ``int``; the write's typed error if it
    failed), resolved as its ack comes in or by ``flush`` (they wait only while
    ``settings.nats.max_pending_writes`` writes are unacknowledged). Leaving the ``async with`` block (or
    ``flush()``) waits for every ack; writes still unacknowledged when no ack
    came for ``nats.write_attempt_timeout`` seconds, or when the connection
    that carried them was replaced, are re-sent through the retrying path with
    the same ``Nats-Msg-Id``, so the server applies each at most once. ``flush`` raises
    the first error if any write failed (the others are still applied).

    A signing store signs pipelined writes in batches of up to 32, one
    Ed25519 signature over a Merkle root per batch (each write carries its
    path, ``Bb-Sig-Path``): a batch goes out when it is full or as soon as the
    caller yields, in order; readers check each batch's signature once.
    """

    def __init__(self, store: BoardStore, *, author: str = "") -> None:
        self.store = store
        self.author = author
        #: Each write sent, with the publisher's future of its ack (its revision or typed error):
        #: the publisher resolves it from the ack, ``flush`` when it sends the write again.
        self._sent: list[tuple[_Prepared, asyncio.Future[int]]] = []
        #: Writes waiting to be signed (with the futures handed to their callers), and the tasks
        #: that sign a batch and then send it, each after the one before.
        self._unsigned: list[tuple[_Prepared, asyncio.Future[int]]] = []
        #: The task sending a short batch dispatched when the caller yielded (the next batch
        #: goes after it).
        self._sending: asyncio.Task[None] | None = None
        #: Errors of writes that could not be sent from a signed batch (``flush`` raises the first).
        self._failed: list[Exception] = []
        self._dispatch_soon = False
        #: The publisher's future of each signed write sent, and its caller's (resolved at once
        #: by its done callback, and by ``flush``, which may not wait for callbacks to run).
        self._links: list[tuple[asyncio.Future[int], asyncio.Future[int]]] = []

    async def __aenter__(self) -> Pipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.flush()

    async def put(self, board: str, section: str, key: str, value: Any, *, content_type: str | None = None,
                  tags: Sequence[str] = (), metadata: Mapping[str, Any] | None = None,
                  expected_revision: int | None = None, ttl: float | None = None,
                  encoding: codec.Encoding = "msgpack") -> asyncio.Future[int]:
        """Send a put; validation errors raise here, at once.

        Returns:
            A future of the write's revision, or of its error (``ConflictError``,
            ``PayloadTooLargeError``, ``TransportError``...); ``flush`` resolves
            every future it waits for.
        """
        prep = self.store._prepare(board, section, key, value, author=self.author, content_type=content_type,
                                   tags=tags, metadata=metadata, expected_revision=expected_revision, ttl=ttl,
                                   encoding=encoding)
        return await self._send(prep)

    async def delete(self, board: str, section: str, key: str, *, purge: bool = False) -> asyncio.Future[int]:
        """Send a delete (a tombstone; ``purge``: a purge marker); a future of its revision."""
        return await self._send(self.store._prepare_delete(board, section, key, None, purge))

    async def _send(self, prep: _Prepared) -> asyncio.Future[int]:
        if self.store._signer is None:
            return await self._send_now(prep, sign=None)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        self._unsigned.append((prep, fut))
        if len(self._unsigned) >= _SIGN_BATCH:
            # the caller's own turn sends a full batch (no task, no extra yield)
            if self._sending is not None:
                await asyncio.wait([self._sending])
            await self._send_signed(self._take_batch())
        elif not self._dispatch_soon:
            # a short batch goes as soon as the caller yields: its ack still comes without a flush
            self._dispatch_soon = True
            loop.call_soon(self._dispatch)
        return fut

    def _take_batch(self) -> list[tuple[_Prepared, asyncio.Future[int]]]:
        """The waiting writes, signed as one batch (a write the batch cannot sign is signed,
        or fails, alone as it goes out)."""
        batch, self._unsigned = self._unsigned, []
        if batch:
            signer = self.store._signer
            assert signer is not None
            with contextlib.suppress(BlackboardError):
                signer.sign_batch([(prep.subject, prep.headers, prep.record) for prep, _ in batch])
        return batch

    def _dispatch(self) -> None:
        """Sign the waiting writes and send them in a task, after what is being sent."""
        self._dispatch_soon = False
        batch = self._take_batch()
        if batch:
            self._sending = asyncio.create_task(self._send_signed(batch, self._sending))

    async def _send_signed(self, batch: list[tuple[_Prepared, asyncio.Future[int]]],
                           previous: asyncio.Task[None] | None = None) -> None:
        if previous is not None:
            await asyncio.wait([previous])  # in order (its failure is its callers' business)
        for n, (prep, fut) in enumerate(batch):
            try:
                ack = await self._send_now(prep, sign=None if Header.SIG.value in prep.headers else
                                           self.store._sign(prep))
            except BlackboardError as exc:  # this write only (e.g. too large): its caller's error
                self._failed.append(exc)
                fut.set_exception(exc)
                continue
            except BaseException as exc:  # the connection closed, or cancelled: none of the rest goes out
                for _, rest in batch[n:]:
                    if isinstance(exc, Exception):
                        rest.set_exception(exc)
                    else:
                        rest.cancel()
                if isinstance(exc, Exception):
                    self._failed.append(exc)
                    return
                raise
            if ack.done():
                _chain(ack, fut)
            else:
                ack.add_done_callback(functools.partial(_chain, target=fut))
                self._links.append((ack, fut))

    async def _drain_signing(self) -> None:
        """Sign and send every write waiting for its signature (``flush`` first does this)."""
        if self._sending is not None:
            await asyncio.wait([self._sending])
            self._sending = None
        await self._send_signed(self._take_batch())

    async def _send_now(self, prep: _Prepared, *, sign: Sign | None) -> asyncio.Future[int]:
        # The publisher waits by itself while max_pending_writes acks are
        # outstanding, which bounds memory.
        store = self.store
        try:
            fut = await store._publisher.send(prep.subject, prep.payload, prep.headers,
                                              refusal=lambda exc: store._map_api_error(exc, prep),
                                              sign=sign)
        except _PIPELINE_RETRYABLE:
            fut = asyncio.get_running_loop().create_future()  # resolved by the retrying path in flush
        except nats.errors.ConnectionClosedError as exc:
            raise NotConnectedError("the NATS connection is closed") from exc
        except nats.errors.MaxPayloadError as exc:
            raise PayloadTooLargeError(len(prep.payload), store._nc.max_payload) from exc
        self._sent.append((prep, fut))
        return fut

    async def flush(self) -> list[int]:
        """Wait for every write sent so far; return their revisions in order.

        Raises:
            BlackboardError: the first failed write's error.
        """
        await self._drain_signing()
        sent, self._sent = self._sent, []
        failed, self._failed = self._failed, []
        links, self._links = self._links, []
        revisions: list[int] = []
        if sent:
            try:
                revisions = await self._settle_all(sent)
            finally:
                # flush itself failed or was cancelled: no future stays pending
                self.store._publisher.forget(*(fut for _, fut in sent if not fut.done()))
                for ack, fut in links:
                    if ack.done():
                        _chain(ack, fut)
        if failed:  # writes of a signed batch that could not be sent (the others were)
            raise failed[0]
        return revisions

    async def _settle_all(self, sent: list[tuple[_Prepared, asyncio.Future[int]]]) -> list[int]:
        publisher = self.store._publisher
        # Until every ack is in, or the rest should be sent again (no ack for
        # write_attempt_timeout, or the connection that carried them replaced).
        await publisher.wait_acks(fut for _, fut in sent)
        revisions: list[int] = []
        first_error: BlackboardError | None = None
        wrote = self.store._wrote
        for prep, fut in sent:
            if fut.done() and not fut.cancelled():
                exc = fut.exception()  # the publisher maps a refusal to its typed error
                if exc is None:
                    revision = fut.result()
                    wrote(prep, revision)  # read-your-writes, from the flush on
                    revisions.append(revision)
                    continue
                if isinstance(exc, BlackboardError):
                    revisions.append(-1)
                    first_error = first_error or exc
                    continue
            try:
                # No ack (or cancelled by its caller): re-send with the same Msg-Id.
                publisher.forget(fut, cancel=False)
                revisions.append(await self.store._publish_prepared(prep, resend=True))
                if not fut.done():
                    fut.set_result(revisions[-1])
            except BlackboardError as err:
                revisions.append(-1)
                first_error = first_error or err
                if not fut.done():
                    _resolve_error(fut, err)
        if first_error is not None:
            raise first_error
        return revisions

    async def put_many(self, board: str, ops: Iterable[WriteOp]) -> list[int]:
        """Send ``ops`` on ``board`` and wait for all of them; revisions in order."""
        for op in ops:
            await self.put(board, op.section, op.key, op.value, content_type=op.content_type, tags=op.tags,
                           metadata=op.metadata, expected_revision=op.expected_revision, ttl=op.ttl)
        return await self.flush()


def _resolve_error(result: asyncio.Future[int], err: BaseException) -> None:
    """Fail a pipelined write's future, marked as seen: ``flush`` raises the first error, and a
    caller that never awaits the others must not get "exception was never retrieved" logs."""
    result.set_exception(err)
    result.exception()
