"""Acknowledged JetStream publishing that waits out outages without duplicates.

Every write carries a ``Nats-Msg-Id``; a publish whose ack was lost (server
restart, network blip, a stream leader's death) is sent again with the same id
until it is acknowledged or ``write_timeout`` passes, and the server's
duplicate window (``nats.duplicate_window``, 2 minutes by default) makes sure it
is stored once. A signed write (docs/security.md, "Signatures") is signed again
before each send (``sign``): the same Msg-Id, a fresh signed time, so a write
that went through only late is not ``stale`` to its readers.

An attempt is abandoned and the write sent again as soon as the connection is
re-established after carrying it (it may have died with the server), or after
``write_attempt_timeout`` seconds of connected silence (a stream whose leader
is being elected drops publishes), so a write goes through within about that
long of the cluster being able to take it, not after a long request timeout.

Acks come back on one wildcard inbox subscription per publisher (no request
object, task or ``wait_for`` per message), which keeps the SDK's write path
as fast as raw nats-py. For the same reason nothing is armed per write: the
ack handler releases the write's slot, one timer per publisher checks the
writes still waiting (only while some are), and a pipelined write's future is
resolved by the ack handler itself to what its caller needs (the revision or
the typed refusal), with no callback chained to it.

A write or a request the server refuses for want of a right (an asynchronous
``Permissions Violation`` error, after which no ack or reply ever comes) fails
at once with ``PermissionDeniedError``: the publisher listens to its
connection's :class:`~blackboard.client.connection.PermissionViolations` and
fails the sends waiting on that subject (the connection's own requests fail at once too).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, overload

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from blackboard.client.connection import Kind, permission_violations
from blackboard.client.consumers import read_first
from blackboard.observability import tracing
from blackboard.protocol.errors import (
    BlackboardError,
    NotConnectedError,
    OperationTimeoutError,
    PayloadTooLargeError,
    PermissionDeniedError,
    TransportError,
)
from blackboard.protocol.subjects import Header, Subjects
from blackboard.settings import NatsSettings

__all__ = ["RETRYABLE", "Ack", "Publisher", "Sign"]

#: Errors after which a publish (or a read) is retried until the write timeout.
RETRYABLE: tuple[type[BaseException], ...] = (
    nats.errors.TimeoutError,
    nats.js.errors.NoStreamResponseError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    asyncio.TimeoutError,
)

_WRONG_LAST_SEQ = 10071
#: JetStream answers that a moment later become a definite one: our earlier
#: copy of this write is still being replicated ("duplicate message id is in
#: process", clustered streams), or another write on the subject is ("wrong
#: last sequence" without a number, to a compare-and-set write).
_IN_PROCESS = frozenset({10158, 10164})
#: Seconds between checks of the unacknowledged attempts (a reconnect, their
#: ``write_attempt_timeout``, the write timeout): one timer per publisher, armed
#: only while writes wait, so a write acknowledged at once costs no timer.
_TICK = 0.1

ApiErrorMapper = Callable[[nats.js.errors.APIError], BlackboardError]
#: Signs a write's headers in place (a fresh ``Bb-Sig-Time`` and ``Bb-Sig``), called before each send.
Sign = Callable[[], None]


@dataclass(frozen=True, slots=True)
class Ack:
    """A JetStream publish acknowledgement."""

    stream: str
    seq: int
    duplicate: bool = False


def _api_error(err: dict[str, Any]) -> nats.js.errors.APIError:
    try:
        nats.js.errors.APIError.from_error(err)  # always raises the specific class
    except nats.js.errors.APIError as exc:
        return exc
    return nats.js.errors.APIError(**err)  # pragma: no cover


class Publisher:
    """Publishes to JetStream and waits for the ack, retrying through outages.

    No IO in ``__init__``; the ack subscription is made on first use.
    """

    def __init__(self, nc: NATS, js: JetStreamContext, settings: NatsSettings) -> None:
        self.nc = nc
        self.js = js
        self.settings = settings
        # Msg-Ids: a random per-publisher prefix and a counter (unique, and cheap).
        self._id_prefix = secrets.token_hex(8)
        self._id_counter = itertools.count(1)
        self._token_counter = itertools.count(1)
        self._inbox: str | None = None
        self._sub: Any = None
        #: Sends awaiting their ack, by reply token; each holds one of ``_slots``,
        #: released when it leaves this dict (answered, forgotten, or failed to go out).
        self._acks: dict[str, asyncio.Future[Any]] = {}
        self._slots: asyncio.Semaphore | None = None
        #: Pipelined sends (``send(..., refusal=...)``), by token: how a refusal becomes the typed error.
        self._refusals: dict[str, ApiErrorMapper] = {}
        #: Pipelined sends answered with no ack (no responders, an unreadable answer): left open
        #: for their caller to send again (``wait_acks`` counts them as answered).
        self._unanswered: set[asyncio.Future[Any]] = set()
        #: ``publish`` attempts waiting for their ack: (epoch, sent at, deadline), checked by one timer.
        self._attempts: dict[asyncio.Future[Any], tuple[int, float, float]] = {}
        self._ticker: asyncio.TimerHandle | None = None
        #: When the ticker last saw the connection down (seconds count only while connected).
        self._offline_at = -math.inf
        #: The server's permission refusals on this connection (None: not made by connect_nats).
        self._violations = permission_violations(nc)
        #: The subject of each send awaiting its ack, by reply token (kept while
        #: ``_violations`` is known, to fail the sends the server refused).
        self._subjects: dict[str, str] = {}

    def msg_id(self) -> str:
        """A new unique ``Nats-Msg-Id``."""
        return f"{self._id_prefix}{next(self._id_counter):x}"

    # ------------------------------------------------------------ ack inbox
    async def _ensure_inbox(self) -> str:
        if self._inbox is None:
            prefix = self.nc.new_inbox()
            self._sub = await self.nc.subscribe(Subjects.reply_inbox(prefix, "*"), cb=self._on_ack)
            self._inbox = prefix + "."
            self._slots = asyncio.Semaphore(self.settings.max_pending_writes)
            if self._violations is not None:
                self._violations.add_listener(self._on_violation)
        return self._inbox

    def _on_violation(self, kind: Kind, subject: str) -> None:
        """The server refused a publish to ``subject`` (lower-cased): fail the sends waiting on it
        (no ack will come). Sends to subjects that differ only in case cannot be told apart: then
        none is failed here, and :meth:`publish` finds the refusal when their attempt times out."""
        if kind != "publish" or self._violations is None:
            return
        tokens = [t for t, s in self._subjects.items() if s.lower() == subject]
        if not tokens or len({self._subjects[t] for t in tokens}) > 1:
            return
        error = self._violations.error("publish", self._subjects[tokens[0]])
        for token in tokens:
            del self._subjects[token]
            fut = self._acks.pop(token, None)
            refusal = self._refusals.pop(token, None)
            if fut is None:
                continue
            self._release()
            if not fut.done():
                fut.set_exception(error)
                if refusal is not None:
                    fut.exception()  # seen: the pipeline's flush reports it, a caller need not

    async def _on_ack(self, msg: Msg) -> None:
        assert self._inbox is not None
        token = msg.subject[len(self._inbox):]
        fut = self._acks.pop(token, None)
        if fut is None:
            return
        self._release()
        if self._subjects:
            self._subjects.pop(token, None)
        refusal = self._refusals.pop(token, None) if self._refusals else None
        if fut.done():  # cancelled by its caller
            return
        headers = msg.headers
        if headers and headers.get(Header.STATUS.value) == "503":
            self._fail(fut, refusal, nats.errors.NoRespondersError())
            return
        try:
            resp = json.loads(msg.data)
        except ValueError:
            self._fail(fut, refusal, TransportError(f"unreadable JetStream ack: {msg.data[:100]!r}"))
            return
        error = resp.get("error")
        if error is None and refusal is not None:
            fut.set_result(int(resp["seq"]))
        elif error is None:
            fut.set_result(Ack(resp.get("stream", ""), int(resp["seq"]), bool(resp.get("duplicate"))))
        elif refusal is not None:
            fut.set_exception(refusal(_api_error(error)))
            fut.exception()  # seen: the pipeline's flush reports it, a caller need not
        else:
            fut.set_exception(_api_error(error))

    def _fail(self, fut: asyncio.Future[Any], refusal: ApiErrorMapper | None, exc: Exception) -> None:
        """No ack for this send: ``publish`` retries on the exception; a pipelined send's future
        stays open for its caller to send it again (``wait_acks`` counts it as answered)."""
        if refusal is None:
            fut.set_exception(exc)
        else:
            self._unanswered.add(fut)

    def _release(self) -> None:
        assert self._slots is not None
        self._slots.release()

    @overload
    async def send(self, subject: str, payload: bytes, headers: dict[str, str], *,
                   sign: Sign | None = None) -> asyncio.Future[Ack]: ...

    @overload
    async def send(self, subject: str, payload: bytes, headers: dict[str, str], *,
                   refusal: ApiErrorMapper, sign: Sign | None = None) -> asyncio.Future[int]: ...

    async def send(self, subject: str, payload: bytes, headers: dict[str, str], *,
                   refusal: ApiErrorMapper | None = None, sign: Sign | None = None) -> asyncio.Future[Any]:
        """Send without waiting for the ack; returns a future of it.

        Waits while ``max_pending_writes`` acks are outstanding. The future
        never times out by itself: callers bound the wait. With ``refusal``
        (a pipelined write) the future resolves to the stored revision, or
        to ``refusal(api_error)`` when JetStream refuses the write; when no
        ack comes (or no responders answer) it stays open, for the caller to
        send the write again (``wait_acks``, then ``forget(..., cancel=False)``).
        ``sign`` is called right before the message goes out (after any wait
        for a slot), to sign ``headers`` in place with a fresh time.
        """
        inbox = await self._ensure_inbox()
        slots = self._slots
        assert slots is not None
        await slots.acquire()
        token = f"{next(self._token_counter):x}"
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._acks[token] = fut
        if refusal is not None:
            self._refusals[token] = refusal
        if self._violations is not None:
            self._subjects[token] = subject
        try:
            if tracing.enabled:  # the writer's span, for the worker's to join (not signed)
                tracing.inject(headers)
            if sign is not None:
                sign()
            await self.nc.publish(subject, payload, reply=inbox + token, headers=headers)
        except BaseException:
            if self._acks.pop(token, None) is not None:
                slots.release()
            self._refusals.pop(token, None)
            self._subjects.pop(token, None)
            fut.cancel()
            raise
        return fut

    def forget(self, *futs: asyncio.Future[Any], cancel: bool = True) -> None:
        """Stop tracking unanswered sends (after a timeout), releasing their slots.

        ``cancel=False`` leaves the futures open, for a caller that resolves
        them itself (a pipelined write it sends again).
        """
        if not futs:
            return
        forgotten = set(futs)
        for token in [t for t, f in self._acks.items() if f in forgotten]:
            del self._acks[token]
            self._refusals.pop(token, None)
            self._subjects.pop(token, None)
            self._release()
        self._unanswered.difference_update(forgotten)
        if cancel:
            for fut in futs:
                if not fut.done():
                    fut.cancel()

    def _epoch(self) -> int:
        """The connection a publish made now goes out on (``reconnects`` counts
        completed reconnects; one made while reconnecting waits for the next)."""
        nc = self.nc
        return nc.stats["reconnects"] + (0 if nc.is_connected else 1)

    async def _wait(self, fut: asyncio.Future[Ack], epoch: int, deadline: float) -> Ack:
        """Wait for one attempt's ack.

        Raises:
            nats.errors.TimeoutError: the attempt is abandoned (the future is
                forgotten by :meth:`_check_attempts`): its connection was replaced,
                it went unanswered for ``write_attempt_timeout`` connected seconds,
                or ``deadline`` passed.
        """
        loop = asyncio.get_running_loop()
        self._attempts[fut] = (epoch, loop.time(), deadline)
        if self._ticker is None:
            self._ticker = loop.call_later(min(_TICK, self.settings.write_attempt_timeout), self._check_attempts)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.cancelled() and not asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise nats.errors.TimeoutError from None
            self.forget(fut)  # the caller was cancelled: free the slot now, the ack may never come
            raise
        finally:
            del self._attempts[fut]

    def _check_attempts(self) -> None:
        """The publisher's timer: abandon the attempts to send again (see :meth:`_wait`);
        re-armed while attempts wait."""
        self._ticker = None
        if not self._attempts:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        nc = self.nc
        attempt = self.settings.write_attempt_timeout
        if not nc.is_connected:
            # Seconds count only while connected: while reconnecting the write
            # waits in the client's buffer, and is flushed on reconnect.
            self._offline_at = now
            expired = [f for f, (_, _, deadline) in self._attempts.items() if now >= deadline]
        else:
            reconnects, offline_at = nc.stats["reconnects"], self._offline_at
            expired = [f for f, (epoch, sent_at, deadline) in self._attempts.items()
                       if reconnects > epoch or now - max(sent_at, offline_at) >= attempt or now >= deadline]
        self.forget(*expired)
        self._ticker = loop.call_later(min(_TICK, attempt), self._check_attempts)

    async def wait_acks(self, futs: Iterable[asyncio.Future[Any]]) -> None:
        """Wait for pipelined sends' acks until all are answered, or until the
        rest should be sent again: none of them was answered for
        ``write_attempt_timeout`` connected seconds, or the connection was
        re-established since (what was in flight on the old one may be lost).
        Never raises for them.

        Acks mostly come in order: this waits on the first open future, then
        on the next one still open, so a flush costs a wake-up per batch of
        acks read, not a callback per write; a timer checks for progress."""
        pending = [f for f in futs if not f.done()]
        if not pending:
            return
        loop = asyncio.get_running_loop()
        nc = self.nc
        attempt = self.settings.write_attempt_timeout
        unanswered = self._unanswered
        epoch = nc.stats["reconnects"]
        waiter: asyncio.Future[None] | None = None
        stop = False
        answered = 0
        last = loop.time()
        handle: asyncio.TimerHandle

        def wake(_: object = None) -> None:
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

        def check() -> None:
            nonlocal answered, last, stop, handle
            now = loop.time()
            count = sum(1 for f in pending if f.done() or f in unanswered)
            if count > answered:
                answered, last = count, now
            if not nc.is_connected:
                last = now
            elif nc.stats["reconnects"] != epoch or now - last >= attempt:
                stop = True
            if stop or count == len(pending):
                wake()
                return
            handle = loop.call_later(min(_TICK, attempt), check)

        handle = loop.call_later(min(_TICK, attempt), check)
        try:
            for fut in pending:
                while not (fut.done() or fut in unanswered or stop):
                    waiter = loop.create_future()
                    fut.add_done_callback(wake)
                    try:
                        await waiter
                    finally:
                        fut.remove_done_callback(wake)
                if stop:
                    return
        finally:
            handle.cancel()

    # ------------------------------------------------------------ publishing
    async def publish(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str],
        *,
        what: str,
        map_api_error: ApiErrorMapper | None = None,
        stream: str | None = None,
        resend: bool = False,
        sign: Sign | None = None,
    ) -> Ack:
        """Publish and wait for the JetStream ack.

        ``headers`` should carry a ``Nats-Msg-Id`` so that re-sends are
        deduplicated. An attempt is abandoned and the write sent again (same
        headers) when the connection that carried it is replaced, or after
        ``write_attempt_timeout`` seconds without an answer while connected;
        answers that mean "still in process" are retried shortly. ``sign``
        signs ``headers`` in place before each attempt (the same Msg-Id, a
        fresh signed time: a write re-sent late is not ``stale``).

        A compare-and-set write that may already have been applied (any sent
        attempt, ``resend=True``, or a ``Nats-Msg-Id`` another writer used
        too) and is answered "wrong last sequence" is checked against the stored message right after its
        expected revision (which needs ``stream``): if that carries our
        Msg-Id, the write succeeded (a single server checks the expected
        sequence before deduplicating, so it answers a re-sent CAS write that
        way; a clustered stream answers it as a duplicate).

        Raises:
            NotConnectedError: not connected within ``write_timeout``.
            OperationTimeoutError: connected, but no ack within ``write_timeout``.
            PermissionDeniedError: the server refused the publish (no right for the subject).
            PayloadTooLargeError: larger than the server's max payload.
            BlackboardError: the server refused it (via ``map_api_error``,
                ``TransportError`` by default).
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.settings.write_timeout
        pause_cap = max(0.05, self.settings.write_attempt_timeout / 2)
        delay = 0.05
        maybe_sent = resend
        while True:
            try:
                epoch = self._epoch()
                fut = await self.send(subject, payload, headers, sign=sign)
                # Sent: a "wrong last sequence" may now be about this very
                # write (or one with the same Msg-Id from another writer).
                maybe_sent = True
                try:
                    return await self._wait(fut, epoch, deadline)
                except nats.errors.TimeoutError:
                    violations = self._violations
                    if violations is not None and violations.refused("publish", subject, started):
                        raise violations.error("publish", subject, what) from None
                    if loop.time() >= deadline:
                        raise
                    continue  # sent again at once: the attempt already waited
            except nats.js.errors.APIError as exc:
                if exc.err_code in _IN_PROCESS:
                    if loop.time() + delay >= deadline:
                        raise self.timeout_error(what) from exc
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, pause_cap)
                    continue
                if exc.err_code == _WRONG_LAST_SEQ and maybe_sent and stream is not None:
                    own = await self._own_revision(stream, subject, headers, what)
                    if own is not None:
                        return Ack(stream, own, duplicate=True)
                if map_api_error is not None:
                    raise map_api_error(exc) from exc
                raise TransportError(
                    f"JetStream refused {what}: {exc.description} (code {exc.err_code})") from exc
            except nats.errors.MaxPayloadError as exc:
                raise PayloadTooLargeError(len(payload), self.nc.max_payload) from exc
            except nats.errors.ConnectionClosedError as exc:
                raise NotConnectedError("the NATS connection is closed") from exc
            except RETRYABLE as exc:
                if loop.time() + delay >= deadline:
                    raise self.timeout_error(what) from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, pause_cap)

    async def _own_revision(self, stream: str, subject: str, headers: dict[str, str], what: str) -> int | None:
        """The revision of our own earlier copy of this compare-and-set write, if it was applied.

        A CAS write that was applied is the first message on its subject after
        the expected revision, whatever was written after it. Read in the forms
        an agent may use: the last message on the subject (a direct get, last by
        subject); only when that is neither ours nor right after the expected
        revision, the first message after it (a one-shot consumer filtered on
        the subject, :func:`~blackboard.client.consumers.read_first`).
        """
        msg_id = headers.get(Header.MSG_ID.value)
        expected = headers.get(Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value)
        if not msg_id or expected is None or not expected.isdigit():
            return None
        after = int(expected) + 1
        outcome = f"the outcome of {what}"
        try:
            last = await self.request(Subjects.direct_get(stream, subject), b"", what=outcome)
        except BlackboardError:
            return None
        stored = last.headers or {}
        seq = stored.get(Header.SEQUENCE.value, "")
        if stored.get(Header.STATUS.value) or not seq.isdigit() or int(seq) < after:
            return None  # nothing on the subject, or nothing after the expected revision
        if stored.get(Header.MSG_ID.value) == msg_id:
            return int(seq)
        if int(seq) == after:
            return None  # the first message after the expected revision is another write
        try:
            first = await read_first(self.nc, self.js, stream, subject, after,
                                     timeout=self.settings.request_timeout, what=f"read {outcome}")
        except BlackboardError:
            return None
        if first is None or (first.headers or {}).get(Header.MSG_ID.value) != msg_id:
            return None
        return int(first.metadata.sequence.stream)

    async def request(self, subject: str, payload: bytes, *, what: str) -> Msg:
        """A core NATS request (a JetStream API call, a direct get), retried
        through outages like a write until ``write_timeout``.

        Raises:
            NotConnectedError, OperationTimeoutError: no answer in time.
            PermissionDeniedError: the server refused the request (no right for the subject).
        """
        try:
            return await self._request(subject, payload, what)
        except PermissionDeniedError as exc:  # the connection's request saw the refusal: say what it was for
            raise PermissionDeniedError(f"{exc} ({what})", exc.operation) from exc

    async def _request(self, subject: str, payload: bytes, what: str) -> Msg:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.write_timeout
        delay = 0.05
        while True:
            try:
                return await self.nc.request(subject, payload, timeout=self.settings.request_timeout)
            except nats.errors.ConnectionClosedError as exc:
                raise NotConnectedError("the NATS connection is closed") from exc
            except RETRYABLE as exc:
                if loop.time() + delay >= deadline:
                    raise self.timeout_error(f"reading {what}") from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def timeout_error(self, what: str) -> BlackboardError:
        if not self.nc.is_connected:
            return NotConnectedError(
                f"not connected to NATS: {what} not acknowledged within {self.settings.write_timeout:g}s")
        return OperationTimeoutError(f"{what} not acknowledged within {self.settings.write_timeout:g}s")

    async def close(self) -> None:
        """Drop the ack subscription (pending futures are cancelled)."""
        for fut in self._acks.values():
            if not fut.done():
                fut.cancel()
        self._acks.clear()
        self._refusals.clear()
        self._subjects.clear()
        self._unanswered.clear()
        if self._violations is not None:
            self._violations.remove_listener(self._on_violation)
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if self._sub is not None:
            sub, self._sub, self._inbox = self._sub, None, None
            try:
                await sub.unsubscribe()
            except nats.errors.Error:
                pass
