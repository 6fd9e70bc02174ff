"""The ordered follower: every message of a stream's subject filter, in order, to a callback.

Under the board's watches (:class:`blackboard.client.board_store.Watch`) and
vote following (:class:`blackboard.client.consensus.VoteFollower`). It is an
*ordered consumer* built here rather than nats-py's, because every consumer it
creates must go through the named API subject with its filter in it
(:func:`~blackboard.client.consumers.create_consumer`): nats-py's creates its
consumer through the bare ``$JS.API.CONSUMER.CREATE.<stream>`` and reads it back
with ``CONSUMER.INFO``, which an agent's permissions refuse.

* **the consumer**: an ephemeral push consumer with one filter subject, a fresh
  random name, no acks, flow control and idle heartbeats every
  ``_IDLE_HEARTBEAT`` seconds, in memory, one replica.
* **start position**: ``"new"`` (only what is stored from now on),
  ``"current"`` (the last message of every subject, then live), ``"all"``
  (everything the stream keeps), or ``from_sequence`` (replay from that stream
  sequence on; it overrides ``start``).
* **readiness**: :meth:`OrderedFollower.start` returns once the consumer
  exists, or raises (and leaves nothing behind): the follower is either
  started or raised. ``ready`` is set once the messages that were stored when
  it started have all been handed to the callback (at once for ``"new"``, or
  when the create answer says nothing is pending).
* **reconnects and gaps**: every delivery's consumer sequence is checked
  (and the last one an idle heartbeat names); on a gap, on two missed
  heartbeats (a server restart, a lost consumer) or after a reconnect the
  follower creates a *new* consumer, with a new name, starting at the stream
  sequence after the last one it handled (or that a heartbeat said it had
  scanned up to). The old one's deliveries are ignored from then on. So the
  callback sees every message once, in stream order, across outages.
* **errors**: failing to start raises our error classes (``NotConnectedError``
  when NATS does not answer, ``ConfigurationError`` when the stream does not
  exist, ``ConsumerLimitError`` at the server's consumer limit,
  ``TransportError`` when it refuses the consumer otherwise); a failed
  re-creation is logged and tried again; a callback that raises loses only
  that message (logged, kept in ``error``, counted in ``skipped``), never the
  consumer.
* **stop** unsubscribes; it does not delete the consumer (an agent may not):
  the server removes it :data:`~blackboard.client.consumers.INACTIVE_THRESHOLD`
  seconds later, and it counts against the consumer limit until then.
* **awaiting callbacks**: a callback may return an awaitable (a board watch
  that must fetch a signer's certificate before it can verify a revision);
  the follower awaits it before the next message, so the order holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Self

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from blackboard.client.consumers import (
    INACTIVE_THRESHOLD,
    START_ERRORS,
    consumer_limit_error,
    consumer_name,
    create_consumer,
    is_consumer_limit,
    is_control,
    start_error,
)
from blackboard.protocol.errors import BlackboardError
from blackboard.protocol.subjects import Header

__all__ = ["OrderedFollower", "StartPosition", "deliver_policy", "start_error"]

log = logging.getLogger("blackboard.client.follower")

#: Where a follower starts: new messages only, the last of every subject, or all.
StartPosition = Literal["new", "current", "all"]

_POLICIES: dict[str, api.DeliverPolicy] = {
    "new": api.DeliverPolicy.NEW,
    "current": api.DeliverPolicy.LAST_PER_SUBJECT,
    "all": api.DeliverPolicy.ALL,
}

#: Seconds between the server's idle heartbeats (two missed ones re-create the consumer).
_IDLE_HEARTBEAT = 1.0
#: Client-side buffer limits: a follower never drops what the server sent.
_PENDING_MSGS = 1_000_000
_PENDING_BYTES = 1024 * 1024 * 1024
#: Longest pause between attempts to re-create a lost consumer.
_MAX_RETRY = 2.0
#: What a failed re-creation raises (logged; tried again).
_RETRIED: tuple[type[BaseException], ...] = (BlackboardError, nats.errors.Error, *START_ERRORS)


def deliver_policy(start: StartPosition, from_sequence: int | None = None) -> tuple[api.DeliverPolicy, int | None]:
    """The JetStream deliver policy and start sequence of a start position (pure).

    Raises:
        ValueError: an unknown start position.
    """
    if from_sequence is not None:
        return api.DeliverPolicy.BY_START_SEQUENCE, max(1, from_sequence)
    try:
        return _POLICIES[start], None
    except KeyError:
        raise ValueError(f"unknown start position {start!r} (new, current or all)") from None


class OrderedFollower:
    """Hands every message of ``filter_subject`` on ``stream`` to ``on_message``, in stream order.

    Use as ``async with OrderedFollower(...) as f:`` or ``start()`` /
    ``stop()``. The callback runs on the subscription's task, so it must not
    block; when it returns an awaitable, that is awaited before the next
    message. Whatever it raises is logged and kept in ``error`` (the message is
    skipped).

    Args:
        js: the JetStream context (its consumer-limit lookups on the error path).
        stream: the stream to follow.
        filter_subject: the one subject filter to follow (wildcards allowed).
        on_message: called with each delivered message (an awaitable it returns is awaited).
        nc: the connection the consumer's messages arrive on (``js``'s).
        start: where to start (see :data:`StartPosition`).
        from_sequence: replay from this stream sequence on (overrides ``start``).
        headers_only: deliver headers without payloads.
        on_ready: called once, right after ``ready`` is set.
        what: how error messages name this follower ("follow <filter>").
        timeout: seconds to wait for the server's answer to a consumer creation.
    """

    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        filter_subject: str,
        on_message: Callable[[Msg], Awaitable[None] | None],
        *,
        nc: NATS,
        start: StartPosition = "all",
        from_sequence: int | None = None,
        headers_only: bool = False,
        on_ready: Callable[[], None] | None = None,
        what: str | None = None,
        timeout: float = 5.0,
    ) -> None:
        self._js = js
        self._nc = nc
        self.stream = stream
        self.filter_subject = filter_subject
        self._on_message = on_message
        self._policy, self._start_seq = deliver_policy(start, from_sequence)
        self._headers_only = headers_only
        self._on_ready = on_ready
        self._what = what or f"follow {filter_subject}"
        self._timeout = timeout
        self._sub: Any = None
        self._starting = asyncio.Lock()
        #: Set once the messages stored when the follower started have been handled.
        self.ready = asyncio.Event()
        self._ready = False
        #: The stream sequence of the last message delivered (0 before the first).
        self.last_sequence = 0
        #: The last callback error (that message was skipped, the follower went on).
        self.error: BaseException | None = None
        #: Messages skipped because the callback raised on them.
        self.skipped = 0
        #: The current consumer's name (each re-creation has a new one).
        self.consumer: str | None = None
        #: Consumers created so far (the first one, then one per re-creation).
        self.created = 0
        # The current consumer: deliveries of any other (an earlier one) are ignored.
        self._generation = 0
        self._next_dseq = 1  # the consumer sequence expected next
        #: The stream sequence a re-created consumer starts at (None: not known yet, which
        #: only "current" has before its first message or heartbeat: it starts over).
        self._resume: int | None = None
        self._heard = 0.0  # loop time of the current consumer's last delivery
        self._epoch = 0  # the connection's reconnect count when the consumer was created
        self._stale = False  # re-create the consumer (a gap)
        self._wake = asyncio.Event()
        self._watchdog: asyncio.Task[None] | None = None
        self._stopped = False  # stop() ran: a creation finishing after it installs nothing

    @property
    def started(self) -> bool:
        """Whether the consumer exists (between a successful ``start`` and ``stop``)."""
        return self._sub is not None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Create the consumer (idempotent): on return it exists; on error nothing is left.

        Raises:
            NotConnectedError: NATS is closed or did not answer.
            ConfigurationError: the stream does not exist.
            ConsumerLimitError: the server's consumer limit is reached.
            TransportError: the server refused the consumer.
        """
        async with self._starting:
            if self._sub is None:
                self._stopped = False
                if self._policy is api.DeliverPolicy.BY_START_SEQUENCE:
                    self._resume = self._start_seq
                elif self._policy is api.DeliverPolicy.ALL:
                    self._resume = 1
                try:
                    await self._create(self._policy, self._start_seq)
                except START_ERRORS as exc:
                    if is_consumer_limit(exc):
                        raise await consumer_limit_error(self._js, self.stream, self._what) from exc
                    raise start_error(exc, self.stream, self._what) from exc
                if self._sub is None:  # stop() ran while the consumer was being created
                    return
                if self._policy is api.DeliverPolicy.NEW:
                    self._mark_ready()
                self._watchdog = asyncio.get_running_loop().create_task(self._watch(), name=self._what)

    async def _create(self, policy: api.DeliverPolicy, start_seq: int | None) -> None:
        """Subscribe to a new deliver subject and create a new consumer pushing to it; the
        previous subscription (if any) is dropped once the new consumer exists.

        Raises:
            what :func:`create_consumer` raises (the new subscription is dropped).
        """
        nc = self._nc
        deliver = nc.new_inbox()
        self._generation += 1
        generation = self._generation

        async def on_msg(msg: Msg) -> None:
            if generation == self._generation:
                await self._on_delivery(msg)

        config = api.ConsumerConfig(
            name=consumer_name(), filter_subject=self.filter_subject, deliver_subject=deliver,
            deliver_policy=policy, opt_start_seq=start_seq, ack_policy=api.AckPolicy.NONE,
            flow_control=True, idle_heartbeat=_IDLE_HEARTBEAT, headers_only=self._headers_only or None,
            inactive_threshold=INACTIVE_THRESHOLD, mem_storage=True, num_replicas=1)
        epoch = nc.stats["reconnects"]
        self._next_dseq = 1
        self._heard = asyncio.get_running_loop().time()
        sub = await nc.subscribe(deliver, cb=on_msg, pending_msgs_limit=_PENDING_MSGS,
                                 pending_bytes_limit=_PENDING_BYTES)
        try:
            info = await create_consumer(nc, self.stream, config, timeout=self._timeout)
        except BaseException:
            if generation == self._generation:
                self._generation += 1  # what the failed consumer may still send is ignored
            await self._unsubscribe(sub)
            raise
        if self._stopped:
            # stop() ran while the server was answering, and its cancel did not reach us
            # (asyncio.wait_for in Python 3.11 returns a result that is ready instead of
            # raising the cancel): install nothing, or the watchdog would live on.
            self._generation += 1
            await self._unsubscribe(sub)
            return
        old, self._sub = self._sub, sub
        self.consumer = config.name
        self.created += 1
        self._epoch = epoch
        if policy is api.DeliverPolicy.NEW and self._resume is None and info.delivered is not None:
            self._resume = (info.delivered.stream_seq or 0) + 1  # the stream's last sequence, + 1
        if not info.num_pending:
            self._mark_ready()  # nothing was stored to wait for (what arrived went through)
        if old is not None:
            await self._unsubscribe(old)

    def _mark_ready(self) -> None:
        if not self._ready:
            self._ready = True
            self.ready.set()
            if self._on_ready is not None:
                self._on_ready()

    async def _on_delivery(self, msg: Msg) -> None:
        """One delivery of the current consumer, in the order the server sent them."""
        self._heard = asyncio.get_running_loop().time()
        if is_control(msg):
            await self._on_control(msg)
            return
        try:
            md = msg.metadata
            dseq, sseq, pending = md.sequence.consumer, md.sequence.stream, md.num_pending
        except (AttributeError, IndexError, ValueError, nats.errors.Error):  # not a JetStream delivery
            return
        if dseq != self._next_dseq:  # a delivery was lost: start again after the last one handled
            self._lost(f"consumer sequence {dseq}, expected {self._next_dseq}")
            return
        self._next_dseq = dseq + 1
        self.last_sequence = sseq
        self._resume = sseq + 1
        try:
            result = self._on_message(msg)
            if result is not None:
                await result
        except Exception as exc:  # a bad message must not stop the consumer
            self.error = exc
            self.skipped += 1
            log.warning("%s: skipping message %s: %r", self.filter_subject, msg.subject, exc)
        if pending == 0 and not self._ready:  # live messages (pending 0) skip the call
            self._mark_ready()

    async def _on_control(self, msg: Msg) -> None:
        """A flow-control request (answered now: every earlier delivery has been handled) or
        an idle heartbeat (its last consumer sequence checked; its stream position kept)."""
        headers = msg.headers or {}
        reply = msg.reply or headers.get(Header.CONSUMER_STALLED.value)
        if reply:
            with contextlib.suppress(nats.errors.Error):
                await self._nc.publish(reply)
        if msg.reply:
            return
        last = headers.get(Header.LAST_CONSUMER.value, "")
        if last.isdigit() and int(last) != self._next_dseq - 1:
            self._lost(f"the heartbeat's last consumer sequence {last}, handled {self._next_dseq - 1}")
            return
        scanned = headers.get(Header.LAST_STREAM.value, "")
        if last.isdigit() and scanned.isdigit():
            # Everything the filter matches up to there was delivered (and handled).
            self._resume = max(self._resume or 1, int(scanned) + 1)

    def _lost(self, why: str) -> None:
        log.info("%s: re-creating the consumer: %s", self.filter_subject, why)
        self._generation += 1  # ignore the rest of this consumer's deliveries
        self._stale = True
        self._wake.set()

    async def _watch(self) -> None:
        """Re-create the consumer after a gap, two missed heartbeats or a reconnect."""
        loop = asyncio.get_running_loop()
        nc = self._nc
        delay = 0.1
        while not self._stopped and not nc.is_closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), _IDLE_HEARTBEAT)
            self._wake.clear()
            if self._stopped or not nc.is_connected:
                continue
            silent = loop.time() - self._heard > 2 * _IDLE_HEARTBEAT + 0.5
            if not (self._stale or silent or nc.stats["reconnects"] != self._epoch):
                continue
            try:
                await self._recreate()
                self._stale = False
                delay = 0.1
            except _RETRIED as exc:
                log.warning("%s: cannot re-create the consumer (retrying): %r", self.filter_subject, exc)
                self._stale = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_RETRY)

    async def _recreate(self) -> None:
        if self._resume is None:  # "current" with nothing seen yet: start over
            await self._create(self._policy, self._start_seq)
        else:
            await self._create(api.DeliverPolicy.BY_START_SEQUENCE, self._resume)

    async def stop(self) -> None:
        """Unsubscribe (idempotent). The consumer is not deleted: the server removes it
        :data:`~blackboard.client.consumers.INACTIVE_THRESHOLD` seconds later."""
        self._stopped = True
        if self._sub is not None:
            sub, self._sub = self._sub, None
            self._generation += 1
            watchdog, self._watchdog = self._watchdog, None
            if watchdog is not None and watchdog is not asyncio.current_task():
                watchdog.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watchdog
            await self._unsubscribe(sub)

    @staticmethod
    async def _unsubscribe(sub: Any) -> None:
        try:
            await sub.unsubscribe()
        except (TimeoutError, nats.errors.Error):  # connection gone: nothing to clean up
            pass
