"""Durable inboxes: one JetStream pull consumer per agent on ``BB_MSG``.

An agent's inbox is the durable consumer ``inbox-<agent>`` (explicit acks,
deliver-all on creation). Its filter subjects are the agent's direct subject
plus the broadcast subjects of the boards it joined and the topic patterns it
subscribed to. Each of those *grants* is stored with the stream sequence it was
added at, in the consumer's metadata (``bb.start:<subject> = <seq>``); a
message is admitted when a grant matches its subject and its sequence is above
that grant's start, so joining a board does not replay the board's old
broadcasts, while direct messages (start 0) are all delivered, including those
sent before the agent ever connected. The grants and the consumer's
configuration are :mod:`blackboard.client.inboxes` (re-exported here).

Who creates and changes the consumer: an agent may pull from, acknowledge,
inspect and reset its own inbox consumer, but not create or update it (a
consumer with several filter subjects is created through the API subject
without a filter, so the server cannot check them against the agent's rights).
It asks the system service instead (``bb.inbox.<agent>``, run by every worker),
which checks each filter against the agent's rights. Only on a dev bus without
authorization (``nats.insecure_open_bus``), and only when no system service
answers, does the SDK create and change the consumer itself.

Ordering and redelivery: a reader fetches in stream order and keeps every
message it holds alive (``+WPI``) until it is acknowledged, so the server never
redelivers out of order behind the reader's back. When a reader opens and the
consumer has delivered-but-unacknowledged messages (a crashed or closed
earlier reader), it resets the consumer to its ack floor (``CONSUMER.RESET``,
nats-server 2.14+; delete and re-create at ``floor + 1`` on older servers, by
the system service unless on an open bus), so they come again at once and in
order.

Signatures: every delivery is verified (:mod:`agents_sdk.messaging.trust`) before
it is yielded: one that does not verify (another agent's ``sender``, a tampered
payload, a revoked or unknown key) is terminated and counted, or yielded with
its ``verdict`` when ``security.unverified = "flag"``. See docs/messaging.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Collection, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api

from agents_sdk._args import positive_count, seconds, str_list
from agents_sdk.lifecycle import TaskHost
from agents_sdk.messaging.envelope import decode_envelope
from agents_sdk.messaging.trust import MessageTrust
from blackboard.client.consumers import consumer_limit_error, is_consumer_limit
from blackboard.client.inboxes import (
    admitted,
    consumer_filters,
    grants_from_metadata,
    grants_of,
    inbox_config,
    metadata_from_grants,
    with_grant,
    without_grant,
)
from blackboard.client.signing import signing_of
from blackboard.protocol import codec
from blackboard.protocol.errors import (
    BlackboardError,
    ConsumerLimitError,
    InboxBusyError,
    InvalidKeyError,
    InvalidPayloadError,
    MessagingError,
    NoResponderError,
    NotConnectedError,
    OperationTimeoutError,
    PermissionDeniedError,
    TransportError,
)
from blackboard.protocol.schemas import MessageEnvelope, MessageKind, validate_wire
from blackboard.protocol.schemas.inbox import InboxReply, InboxRequest
from blackboard.protocol.schemas.search import ErrorReply
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import (
    MESSAGE_STREAM,
    Header,
    Subjects,
    pattern_covers,
    patterns_overlap,
    subject_matches,
)
from blackboard.settings import Settings

__all__ = [
    "Inbox",
    "InboxConsumer",
    "InboxState",
    "Message",
    "admitted",
    "consumer_filters",
    "grants_from_metadata",
    "metadata_from_grants",
    "pattern_covers",
    "patterns_overlap",
    "subject_matches",
    "with_grant",
    "without_grant",
]

log = logging.getLogger("agents_sdk.messaging.inbox")

#: Longest wait of the reader between checks (stop, deadline, lost requests).
_MAX_POLL = 1.0
#: A pull request lives this long on the server; heartbeats come every _PULL_HEARTBEAT
#: while it waits, so a request lost to a reconnect is noticed after _STALE_PULL.
_PULL_EXPIRES = 30.0
_PULL_HEARTBEAT = 1.0
_STALE_PULL = 3.0
_STATUS = Header.STATUS.value
_DESCRIPTION = Header.DESCRIPTION.value
_PENDING_MSGS = Header.PENDING_MESSAGES.value


# ------------------------------------------------------------------- received
class Message:
    """A received message: an inbox message, or a request given to a handler.

    The envelope's fields are attributes (``id``, ``sender``, ``type``,
    ``body``...). Inbox messages must be settled with :meth:`ack` (processed),
    :meth:`nak` (deliver again) or :meth:`term` (never again); until then they
    stay in the inbox and come back after a crash. Requests need no settling
    (the settle methods do nothing).

    ``verdict`` is what this agent's connection concluded about its signature:
    ``verified`` (signed by its ``sender``), ``unsigned`` when the connection
    does not verify (an open bus), or another verdict with ``security.unverified
    = "flag"`` (by default such messages are not yielded at all).
    """

    __slots__ = ("_inbox", "_raw", "_settled", "delivered", "envelope", "seq", "stored_at", "subject", "verdict")

    def __init__(self, envelope: MessageEnvelope, *, subject: str, seq: int | None = None,
                 stored_at: datetime | None = None, delivered: int = 1, raw: Msg | None = None,
                 inbox: Inbox | None = None, verdict: Verdict = Verdict.UNSIGNED) -> None:
        self.envelope = envelope
        #: The verdict on its signature (see the class docstring).
        self.verdict = verdict
        #: Subject it arrived on (``bb.msg.agent.<me>``, ``bb.msg.board.<b>``, ``bb.rpc.<me>``...).
        self.subject = subject
        #: Stream sequence in ``BB_MSG`` (None for requests).
        self.seq = seq
        #: When the server stored it (None for requests).
        self.stored_at = stored_at
        #: Times it has been delivered to this inbox (1 the first time).
        self.delivered = delivered
        self._raw = raw
        self._inbox = inbox
        self._settled = raw is None

    def __repr__(self) -> str:
        return (f"Message(id={self.id!r}, sender={self.sender!r}, kind={self.kind!r}, type={self.type!r}, "
                f"seq={self.seq})")

    # envelope fields
    @property
    def id(self) -> str:
        return self.envelope.id

    @property
    def sender(self) -> str:
        return self.envelope.sender

    @property
    def kind(self) -> MessageKind:
        return self.envelope.kind

    @property
    def type(self) -> str:
        return self.envelope.type

    @property
    def body(self) -> Any:
        return self.envelope.body

    @property
    def recipients(self) -> list[str]:
        return self.envelope.recipients

    @property
    def board(self) -> str | None:
        return self.envelope.board

    @property
    def topic(self) -> str | None:
        return self.envelope.topic

    @property
    def correlation_id(self) -> str | None:
        return self.envelope.correlation_id

    @property
    def reply_to(self) -> str | None:
        return self.envelope.reply_to

    @property
    def created_at(self) -> datetime:
        return self.envelope.created_at

    @property
    def metadata(self) -> dict[str, Any]:
        return self.envelope.metadata

    @property
    def settled(self) -> bool:
        """Acknowledged, nak'ed or terminated (always True for requests)."""
        return self._settled

    # settling
    async def ack(self, *, wait: bool = False) -> None:
        """Mark the message processed: it is not delivered again.

        The ack is sent without waiting unless ``wait=True`` (then it returns
        once the server has recorded it; a process that dies right after a
        plain ack may see the message again).

        Raises:
            NotConnectedError: the connection is closed.
            OperationTimeoutError: ``wait=True`` and the server did not confirm.
        """
        if self._raw is None or self._settled:
            return
        async with _nats_errors("ack"):
            if wait:
                await self._raw.ack_sync(timeout=5.0)
            else:
                await self._raw.ack()
        self._done()

    async def nak(self, delay: float | None = None) -> None:
        """Ask for the message again (after ``delay`` seconds); it comes after those already fetched."""
        if self._raw is None or self._settled:
            return
        async with _nats_errors("nak"):
            await self._raw.nak(delay=delay)
        self._done()

    async def term(self) -> None:
        """Drop the message for good without processing it (it is not redelivered)."""
        if self._raw is None or self._settled:
            return
        async with _nats_errors("term"):
            await self._raw.term()
        self._done()

    async def in_progress(self) -> None:
        """Tell the server the message is still being worked on (the inbox also does it by itself)."""
        if self._raw is None or self._settled:
            return
        async with _nats_errors("in-progress"):
            await self._raw.in_progress()

    def _done(self) -> None:
        self._settled = True
        if self._inbox is not None and self.seq is not None:
            self._inbox._release(self.seq)


@contextlib.asynccontextmanager
async def _nats_errors(what: str, js: JetStreamContext | None = None) -> AsyncIterator[None]:
    """Map NATS client errors of an inbox or consumer operation onto the error tree (with
    ``js``, a consumer refused at the server's limit is a ``ConsumerLimitError``)."""
    try:
        yield
    except BlackboardError:
        raise
    except nats.errors.ConnectionClosedError as exc:
        raise NotConnectedError(f"{what}: the NATS connection is closed") from exc
    except (nats.errors.TimeoutError, TimeoutError) as exc:
        raise OperationTimeoutError(f"{what}: no answer from the server in time") from exc
    except nats.js.errors.APIError as exc:
        if js is not None and is_consumer_limit(exc):
            raise await consumer_limit_error(js, MESSAGE_STREAM, what) from exc
        raise TransportError(f"{what}: JetStream refused: {exc.description} (code {exc.err_code})") from exc
    except nats.errors.Error as exc:
        raise TransportError(f"{what}: {exc!r}") from exc


# ------------------------------------------------------------ consumer state
@dataclass(frozen=True, slots=True)
class InboxState:
    """The inbox consumer as last seen: its grants, and what a new reader needs to know."""

    grants: dict[str, int]
    #: Delivered and not yet acknowledged (an earlier reader's, when a reader opens).
    num_ack_pending: int
    #: Stream sequence of the acknowledgement floor.
    ack_floor: int
    #: The consumer's configuration, when this process read it (None: from the system service).
    config: api.ConsumerConfig | None = None

    @classmethod
    def of(cls, info: api.ConsumerInfo, agent: str) -> InboxState:
        return cls(grants_of(info.config, agent), int(info.num_ack_pending or 0),
                   int(info.ack_floor.stream_seq) if info.ack_floor else 0, info.config)


#: How the system service's error replies come back (the class names of its ``Bb-Error``).
_ADMIN_ERRORS: dict[str, type[BlackboardError]] = {
    "PermissionDeniedError": PermissionDeniedError, "OperationTimeoutError": OperationTimeoutError}


def _admin_error(agent: str, headers: Mapping[str, str], data: bytes) -> BlackboardError:
    """The typed error of an error reply of the inbox administration."""
    name = headers.get(Header.ERROR.value, "TransportError")
    try:
        err = validate_wire(ErrorReply, codec.decode(data, codec.encoding_of(headers)))
        message, key = err.message, err.key
    except InvalidPayloadError:
        message, key = headers.get(Header.SERVICE_ERROR.value, name), None
    if name == "PermissionDeniedError":
        return PermissionDeniedError(message, operation=key)
    if name == "InvalidKeyError":
        return InvalidKeyError(key or "", message)
    if name in ("InvalidPayloadError", "LimitExceededError", "PayloadTooLargeError"):
        return InvalidPayloadError(message)
    if name == "ConsumerLimitError":
        return ConsumerLimitError(MESSAGE_STREAM, None, "the max_consumers of stream BB_MSG or the account's "
                                  "JetStream max_consumers", f"create the inbox consumer of {agent}")
    if name == "OperationTimeoutError":
        return OperationTimeoutError(f"inbox administration of {agent}: {message}")
    return TransportError(f"inbox administration of {agent}: {message}")


class InboxConsumer:
    """The durable inbox consumer of one agent (create, change grants, reset).

    No IO in ``__init__``. One per agent and process; grant changes are
    serialized by a lock (two processes of the same agent changing grants at
    the same moment may lose one change: run one process per agent id).
    Creating and changing the consumer goes through the system service
    (``bb.inbox.<agent>``); with ``settings.nats.insecure_open_bus``, when no
    system service answers, this process does it itself.
    """

    def __init__(self, nc: NATS, js: JetStreamContext, settings: Settings, agent: str) -> None:
        self.agent = agent
        self.name = Subjects.inbox_consumer(agent)
        self.direct = Subjects.direct(agent)
        #: Whether this process may create and change the consumer itself when no system service
        #: answers (an open bus only).
        self.self_managed = settings.nats.insecure_open_bus
        self._nc = nc
        self._js = js
        self._settings = settings
        self._lock = asyncio.Lock()
        #: Latest known grants (pattern -> start sequence); refreshed by every call.
        self.grants: dict[str, int] = {self.direct: 0}
        #: The open reader, if any (one reader per agent).
        self.reader: Inbox | None = None

    def config(self, grants: Mapping[str, int], *, base: api.ConsumerConfig | None = None) -> api.ConsumerConfig:
        """The consumer configuration for ``grants`` (keeping ``base``'s start policy and foreign
        metadata): :func:`blackboard.client.inboxes.inbox_config`."""
        return inbox_config(self.agent, grants, self._settings.messaging, base=base)

    def _seen(self, state: InboxState) -> InboxState:
        self.grants = dict(state.grants)
        return state

    async def _info(self) -> api.ConsumerInfo | None:
        """The consumer's info, None when it does not exist (``CONSUMER.INFO``: allowed to the agent)."""
        async with _nats_errors(f"inbox {self.name}"):
            try:
                info: api.ConsumerInfo = await self._js.consumer_info(MESSAGE_STREAM, self.name)
            except nats.js.errors.NotFoundError:
                return None
            return info

    async def _administer(self, grants: Mapping[str, int | None], *, rewind: bool = False) -> InboxState | None:
        """Ask the system service to make the consumer hold ``grants`` (None: from now).

        Returns:
            The consumer's new state; None when no system service answers and this process may
            manage the consumer itself (:attr:`self_managed`).

        Raises:
            NoResponderError: no system service runs (no worker), and this is not an open bus.
            PermissionDeniedError: a grant outside the agent's rights.
            InvalidKeyError, ConsumerLimitError, OperationTimeoutError, TransportError, NotConnectedError.
        """
        m = self._settings.messaging
        request = InboxRequest(grants=dict(grants), ack_wait=m.inbox_ack_wait, max_ack_pending=m.inbox_max_ack_pending,
                               rewind=rewind)
        subject = Subjects.inbox_admin(self.agent)
        timeout = self._settings.nats.request_timeout
        try:
            msg = await self._nc.request(subject, codec.encode(request.model_dump(exclude_none=True)),
                                         timeout=timeout)
        except nats.errors.NoRespondersError as exc:
            if self.self_managed:
                return None
            err = NoResponderError(subject)
            err.args = (f"no system service answers inbox administration on {subject!r}: a worker must run "
                        f"(its system service creates and changes agents' inboxes); only on a dev bus "
                        f"without authorization may the SDK do it itself (nats.insecure_open_bus)",)
            raise err from exc
        except (nats.errors.TimeoutError, TimeoutError) as exc:
            raise OperationTimeoutError(f"inbox administration of {self.agent}: the system service did not "
                                        f"answer within {timeout:g}s") from exc
        except nats.errors.ConnectionClosedError as exc:
            raise NotConnectedError("inbox administration: the NATS connection is closed") from exc
        except nats.errors.Error as exc:
            raise TransportError(f"inbox administration of {self.agent}: {exc!r}") from exc
        if msg.headers and Header.ERROR.value in msg.headers:
            raise _admin_error(self.agent, msg.headers, msg.data)
        reply = validate_wire(InboxReply, codec.decode(msg.data, codec.encoding_of(msg.headers)))
        return self._seen(InboxState(dict(reply.grants), reply.num_ack_pending, reply.ack_floor))

    async def ensure(self) -> InboxState:
        """The consumer's state, creating the consumer (direct messages only) if it is missing.

        Raises:
            NoResponderError: the consumer is missing and no system service runs to create it.
            PermissionDeniedError: the system service refused the agent.
            NotConnectedError, OperationTimeoutError, TransportError, ConsumerLimitError: NATS trouble.
        """
        info = await self._info()
        if info is not None:
            return self._seen(InboxState.of(info, self.agent))
        state = await self._administer({self.direct: 0})
        if state is not None:
            return state
        async with _nats_errors(f"create the inbox consumer {self.name}", self._js):
            info = await self._js.add_consumer(MESSAGE_STREAM, self.config({self.direct: 0}))
        return self._seen(InboxState.of(info, self.agent))

    async def add(self, pattern: str) -> dict[str, int]:
        """Admit messages on ``pattern`` (a broadcast subject or topic pattern) from now on
        (a pattern already granted keeps its start).

        Returns:
            The new grants.

        Raises:
            InvalidKeyError: the pattern overlaps an existing one partially.
            PermissionDeniedError: the agent may not read it (the system service said so).
            NoResponderError: no system service runs (no worker).
            NotConnectedError, OperationTimeoutError, TransportError: NATS trouble.
        """
        return await self._change(pattern, add=True)

    async def remove(self, pattern: str) -> dict[str, int]:
        """Stop admitting messages on ``pattern`` (no change when it is not granted).

        Returns:
            The new grants.

        Raises:
            NoResponderError: no system service runs (no worker).
            NotConnectedError, OperationTimeoutError, TransportError: NATS trouble.
        """
        return await self._change(pattern, add=False)

    async def _change(self, pattern: str, *, add: bool) -> dict[str, int]:
        async with self._lock:
            state = await self.ensure()
            grants = state.grants
            if (pattern in grants) == add:
                return grants
            if add:
                with_grant(grants, pattern, 0)  # refuses a partial overlap before asking anyone
            wanted: dict[str, int | None] = {p: s for p, s in grants.items() if p != pattern}
            if add:
                wanted[pattern] = None
            changed = await self._administer(wanted)
            if changed is not None:
                return changed.grants
            async with _nats_errors(f"update the inbox consumer {self.name}", self._js):
                if add:
                    last = int((await self._js.stream_info(MESSAGE_STREAM)).state.last_seq)
                    new = with_grant(grants, pattern, last)
                else:
                    new = without_grant(grants, pattern)
                await self._js.add_consumer(MESSAGE_STREAM, self.config(new, base=state.config))
            self.grants = new
            return new

    async def reset_if_pending(self, state: InboxState) -> bool:
        """Rewind to the ack floor if an earlier reader left messages unacknowledged.

        Returns:
            Whether the consumer was rewound.
        """
        if not state.num_ack_pending:
            return False
        async with self._lock, _nats_errors(f"reset of inbox {self.name}", self._js):
            version = self._nc.connected_server_version
            if (version.major, version.minor) >= (2, 14):
                resp = await self._nc.request(Subjects.consumer_reset_api(MESSAGE_STREAM, self.name), b"",
                                              timeout=self._settings.nats.request_timeout)
                data = json.loads(resp.data or b"{}")
                if "error" in data:
                    err = data["error"]
                    raise TransportError(f"reset of inbox {self.name} refused: {err.get('description')} "
                                         f"(code {err.get('err_code')})")
            elif await self._administer(dict(state.grants), rewind=True) is None:
                # pre-2.14, open bus, no system service: re-create it just above the ack floor here
                info = await self._js.consumer_info(MESSAGE_STREAM, self.name)
                base = info.config
                base.deliver_policy = api.DeliverPolicy.BY_START_SEQUENCE
                base.opt_start_seq = (int(info.ack_floor.stream_seq) if info.ack_floor else 0) + 1
                await self._js.delete_consumer(MESSAGE_STREAM, self.name)
                await self._js.add_consumer(MESSAGE_STREAM, self.config(grants_of(base, self.agent), base=base))
        log.debug("inbox %s rewound to its ack floor (%d unacknowledged)", self.name, state.num_ack_pending)
        return True



# --------------------------------------------------------------------- reader
class Inbox:
    """Reads an agent's inbox in order: ``async for msg in agent.inbox(): ...; await msg.ack()``.

    Also an async context manager (``async with agent.inbox() as inbox``),
    which closes it on exit; iteration alone closes it when it ends (timeout,
    limit). Closing leaves unacknowledged messages in the inbox: the next
    reader gets them first.

    Args:
        consumer: the agent's inbox consumer.
        types: only yield messages of these types; others are acknowledged
            and skipped (they stay in the stream and in PostgreSQL).
        batch: messages per pull request (default ``messaging.inbox_batch``).
        timeout: stop after this many seconds without a message (None: wait forever).
        limit: stop after yielding this many messages.
        include_own: also yield broadcasts and topic messages this agent sent.
        trust: what deliveries are verified with (default: the connection's signing).
    """

    def __init__(self, consumer: InboxConsumer, settings: Settings, *, types: Collection[str] | None = None,
                 batch: int | None = None, timeout: float | None = None, limit: int | None = None,
                 include_own: bool = False, trust: MessageTrust | None = None) -> None:
        if batch is not None:
            positive_count(batch, "batch")
        if limit is not None:
            positive_count(limit, "limit", minimum=0)
        if timeout is not None:
            seconds(timeout, "timeout")
        self._consumer = consumer
        self._nc = consumer._nc
        self._settings = settings
        self._trust = trust if trust is not None else MessageTrust(signing_of(consumer._nc))
        self._types = frozenset(str_list(types, "types")) if types is not None else None
        self._batch = batch or settings.messaging.inbox_batch
        self._timeout = timeout
        self._limit = limit
        self._include_own = include_own
        self._sub: Subscription | None = None
        self._deliver = ""
        self._pull_subject = Subjects.consumer_next_api(MESSAGE_STREAM, consumer.name)
        #: Messages asked for with pull requests and not yet received.
        self._outstanding = 0
        self._last_activity = 0.0
        self._arrived = asyncio.Event()
        self._error: BlackboardError | None = None
        self._buffer: deque[Msg] = deque()
        self._held: dict[int, Msg] = {}
        #: The reader's background work (keeping held messages alive), while open.
        self._tasks: TaskHost | None = None
        self._yielded = 0
        self._opened = False
        self._closed = False
        self._busy = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def unacknowledged(self) -> int:
        """Messages received or yielded and not yet settled."""
        return len(self._held)

    async def open(self) -> None:
        """Claim the agent's inbox, rewind past an earlier reader's unacked messages, start pulling.

        Raises:
            InboxBusyError: another reader of this agent is being iterated right now.
            NotConnectedError, OperationTimeoutError, TransportError: NATS trouble.
        """
        if self._opened:
            return
        if self._closed:
            raise MessagingError("this inbox reader is closed; open a new one with agent.inbox()")
        current = self._consumer.reader
        if current is not None and current is not self and not current.closed:
            if current._busy:
                raise InboxBusyError(self._consumer.agent)
            await current.close()
        self._consumer.reader = self
        self._opened = True
        try:
            state = await self._consumer.ensure()
            await self._consumer.reset_if_pending(state)
            async with _nats_errors(f"inbox {self._consumer.name}"):
                self._deliver = self._nc.new_inbox()
                self._sub = await self._nc.subscribe(self._deliver, cb=self._on_msg)
            self._last_activity = asyncio.get_running_loop().time()
            self._tasks = await TaskHost(f"inbox {self._consumer.agent}").open()
            self._tasks.spawn(self._keep_alive(), name=f"inbox keepalive {self._consumer.agent}")
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Stop reading; unacknowledged messages stay in the inbox for the next reader."""
        if self._closed:
            return
        self._closed = True
        self._arrived.set()
        tasks, self._tasks = self._tasks, None
        try:
            if tasks is not None:
                await tasks.aclose()
        finally:
            if self._sub is not None:
                with contextlib.suppress(nats.errors.Error):
                    await self._sub.unsubscribe()
            self._buffer.clear()
            if self._consumer.reader is self:
                self._consumer.reader = None

    async def __aenter__(self) -> Inbox:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> Inbox:
        return self

    async def __anext__(self) -> Message:
        if self._closed:
            raise StopAsyncIteration
        if self._limit is not None and self._yielded >= self._limit:
            await self.close()
            raise StopAsyncIteration
        if self._busy:
            raise InboxBusyError(self._consumer.agent)
        self._busy = True
        try:
            await self.open()
            loop = asyncio.get_running_loop()
            deadline = None if self._timeout is None else loop.time() + self._timeout
            while True:
                while self._buffer:
                    msg = await self._admit(self._buffer.popleft())
                    if msg is not None:
                        self._yielded += 1
                        return msg
                if self._error is not None:
                    raise self._error
                if self._closed:
                    raise StopAsyncIteration
                self._arrived.clear()
                await self._request()
                if self._buffer or self._closed:
                    continue
                wait = _MAX_POLL if deadline is None else min(_MAX_POLL, deadline - loop.time())
                if wait <= 0:
                    await self.close()
                    raise StopAsyncIteration
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), wait)
        finally:
            self._busy = False

    # -- continuous pull: a standing pull request, topped up at half the batch --
    async def _request(self) -> None:
        """Ask for more messages when fewer than half a batch are on their way or buffered."""
        loop = asyncio.get_running_loop()
        if self._outstanding and loop.time() - self._last_activity > _STALE_PULL:
            # No message or heartbeat for a while: the request was lost (reconnect, server restart).
            self._outstanding = 0
        want = self._batch - self._outstanding - len(self._buffer)
        if want < max(1, self._batch // 2):
            return
        request = {"batch": want, "expires": int(_PULL_EXPIRES * 1e9), "idle_heartbeat": int(_PULL_HEARTBEAT * 1e9)}
        try:
            await self._nc.publish(self._pull_subject, json.dumps(request).encode(), reply=self._deliver)
        except nats.errors.ConnectionClosedError as exc:
            if not self._closed:
                raise NotConnectedError("inbox: the NATS connection is closed") from exc
            return
        except nats.errors.Error as exc:  # reconnecting: the next round asks again
            log.debug("inbox %s: pull request failed: %r", self._consumer.name, exc)
            await asyncio.sleep(0.1)
            return
        self._outstanding += want
        self._last_activity = loop.time()

    async def _on_msg(self, m: Msg) -> None:
        """Subscription callback: buffer a message, or account for a status of a pull request."""
        self._last_activity = asyncio.get_running_loop().time()
        status = m.headers.get(_STATUS) if m.headers else None
        if status:
            if status == "100":  # idle heartbeat: the request is alive
                return
            # 404/408: the request ended (expired or nothing left); 409: refused or
            # interrupted. Nats-Pending-Messages tells how much of it was unused.
            pending = m.headers.get(_PENDING_MSGS) if m.headers else None
            self._outstanding = max(0, self._outstanding - int(pending)) if pending else 0
            description = (m.headers or {}).get(_DESCRIPTION, "")
            if status == "409" and "deleted" in description.lower():
                self._error = TransportError(f"inbox {self._consumer.name}: the consumer was deleted")
            self._arrived.set()
            return
        self._outstanding = max(0, self._outstanding - 1)
        seq = _stream_seq(m)
        if seq is None or seq in self._held:
            return  # a redelivery of a message we still hold: the held copy is the one settled
        self._held[seq] = m
        self._buffer.append(m)
        self._arrived.set()

    async def _admit(self, raw: Msg) -> Message | None:
        """The message to yield, or None after settling one the reader skips."""
        md = raw.metadata
        seq = md.sequence.stream
        if not admitted(raw.subject, seq, self._consumer.grants):
            await self._skip(raw, seq)  # before the join/subscription, or no longer subscribed
            return None
        try:
            env = decode_envelope(raw.data, raw.headers)
        except InvalidPayloadError as exc:
            log.warning("inbox %s: dropping undecodable message seq %d on %s: %s", self._consumer.name, seq,
                        raw.subject, exc.reason)
            await self._skip(raw, seq, term=True)
            return None
        if ((not self._include_own and env.kind != "direct" and env.sender == self._consumer.agent)
                or (self._types is not None and env.type not in self._types)):
            await self._skip(raw, seq)
            return None
        verdict = await self._trust.verdict(raw.subject, raw.headers, raw.data, env, stored_at=md.timestamp,
                                            sequence=seq)
        if not self._trust.shows(verdict):
            log.warning("inbox %s: hiding message seq %d on %s (sender %r): signature %s", self._consumer.name,
                        seq, raw.subject, env.sender, verdict.value)
            await self._skip(raw, seq, term=True)
            return None
        return Message(env, subject=raw.subject, seq=seq, stored_at=md.timestamp,
                       delivered=md.num_delivered, raw=raw, inbox=self, verdict=verdict)

    async def _skip(self, raw: Msg, seq: int, *, term: bool = False) -> None:
        self._held.pop(seq, None)
        with contextlib.suppress(nats.errors.Error):  # not acked: it comes back and is skipped again
            await (raw.term() if term else raw.ack())

    def _release(self, seq: int) -> None:
        self._held.pop(seq, None)

    def _pending(self) -> Iterator[Msg]:
        return iter(list(self._held.values()))

    async def _keep_alive(self) -> None:
        """Send in-progress for every held message well within ack_wait (no out-of-order redelivery).

        Ends once the reader closes even if the cancel did not reach it (Python 3.11's
        ``asyncio.wait_for`` can swallow a cancel): ``close()`` sets ``closed`` first.
        """
        interval = self._settings.messaging.inbox_ack_wait / 3
        nc = self._consumer._nc
        while not nc.is_closed and not self._closed:
            await asyncio.sleep(interval)
            for m in self._pending():
                if self._closed:
                    return
                with contextlib.suppress(nats.errors.Error):
                    await m.in_progress()


def _stream_seq(m: Msg) -> int | None:
    try:
        return int(m.metadata.sequence.stream)
    except (nats.errors.Error, ValueError, IndexError, AttributeError):
        return None
