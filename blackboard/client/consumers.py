"""Ephemeral consumers an agent may create, and consumers at the server's limit.

**Creating.** Every consumer of a view, a watch, a vote follower or a one-shot
read is created by :func:`create_consumer` through the *named* JetStream API
subject with its one filter subject in it,
``$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>``
(:meth:`~blackboard.protocol.subjects.Subjects.consumer_create_api`): the
server refuses a request whose body names another filter, so its permissions,
which see only the subject, decide which subjects an identity may read. The
bare ``$JS.API.CONSUMER.CREATE.<stream>`` (no name, no filter) is never used.
Each consumer has a fresh random name.

**Ending.** An agent has no right to delete or inspect consumers
(``CONSUMER.DELETE``/``CONSUMER.INFO``), so nothing here does: a consumer's
subscriber unsubscribes, and the server removes the consumer once nobody has
listened on its deliver subject for :data:`INACTIVE_THRESHOLD` seconds. Until
then it still counts against the consumer limit.

**Reading one message.** :func:`read_first` reads the first message of one
subject from a stream sequence on (a revision of a key, the outcome of a
re-sent compare-and-set write) with a one-shot consumer: a body-based direct
get (``{"seq": ..., "next_by_subj": ...}``) would name the subject only in its
body, where permissions cannot check it. A direct get answered by a replica
that is behind is asked again after :data:`STALE_PAUSES`, then read this way
(the board store's latest-value reads, the key registry's certificates).

**The limit.** JetStream bounds consumers: a stream's ``max_consumers`` and an
account's JetStream ``max_consumers``; past either it refuses a new one with
error 10026 ("maximum consumers limit reached", the same words for both),
which :func:`consumer_limit_error` turns into one
:class:`~blackboard.protocol.errors.ConsumerLimitError` naming the setting that
raises it, and the limit when it is the account's (one ``$JS.API.INFO``
request, which every identity may make, on the error path only). The stream's
configuration (``$JS.API.STREAM.INFO``) is not read: an agent has no right to.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from blackboard.protocol.errors import (
    BlackboardError,
    ConfigurationError,
    ConsumerLimitError,
    NotConnectedError,
    OperationTimeoutError,
    TransportError,
)
from blackboard.protocol.subjects import Header, Subjects

__all__ = ["CONSUMER_LIMIT_CODE", "INACTIVE_THRESHOLD", "STALE_PAUSES", "START_ERRORS", "ask_again",
           "consumer_limit_error", "consumer_name", "create_consumer", "is_consumer_limit", "is_control",
           "read_first", "start_error"]

_T = TypeVar("_T")

log = logging.getLogger("blackboard.client.consumers")

#: JetStream's API error code of "maximum consumers limit reached" (the stream's limit or
#: the account's).
CONSUMER_LIMIT_CODE = 10026

#: Seconds the server keeps an ephemeral consumer of ours after its last subscriber left
#: (a follower stopped, a one-shot read done, a connection lost): then it deletes it.
INACTIVE_THRESHOLD = 5.0

#: Pauses before a direct get answered older than expected (or 404) is asked again, before a
#: one-shot consumer (:func:`read_first`) reads instead: in a replicated stream any replica
#: answers a direct get, and one behind (a follower a moment late, a node restarted and catching
#: up) answers what it has applied; a follower applies a write within milliseconds.
STALE_PAUSES: tuple[float, ...] = (0.005, 0.02)


async def ask_again(ask: Callable[[], Awaitable[_T | None]]) -> _T | None:
    """``ask`` (a direct get that found nothing) again after each of :data:`STALE_PAUSES`: its
    first answer that is not None, or None (then :func:`read_first` is the caller's next step)."""
    for pause in STALE_PAUSES:
        await asyncio.sleep(pause)
        answer = await ask()
        if answer is not None:
            return answer
    return None

#: What creating a consumer may raise that :func:`start_error` maps.
START_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.ConnectionClosedError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.APIError,
    TimeoutError,
)


def consumer_name() -> str:
    """A fresh random consumer name (every consumer we create has its own)."""
    return f"bb{secrets.token_hex(8)}"


def is_control(msg: Msg) -> bool:
    """Whether a push delivery is a JetStream control message (an idle heartbeat or a
    flow-control request: status 100, no payload) rather than a stored message (pure)."""
    headers = msg.headers
    return not msg.data and headers is not None and headers.get(Header.STATUS.value) == "100"


def is_consumer_limit(exc: BaseException) -> bool:
    """Whether ``exc`` is JetStream refusing a consumer at its consumer limit (pure)."""
    return isinstance(exc, nats.js.errors.APIError) and exc.err_code == CONSUMER_LIMIT_CODE


def start_error(exc: BaseException, stream: str, what: str) -> BlackboardError:
    """Our error for a failure to create a consumer (pure)."""
    if isinstance(exc, nats.errors.ConnectionClosedError):
        return NotConnectedError("the NATS connection is closed")
    if isinstance(exc, nats.js.errors.NotFoundError):
        return ConfigurationError(f"cannot {what}: the stream {stream} does not exist "
                                  "(ensure_streams() creates it)")
    if isinstance(exc, nats.js.errors.APIError):
        return TransportError(f"cannot {what}: JetStream refused the consumer: {exc.description} "
                              f"(code {exc.err_code})")
    return NotConnectedError(f"cannot {what}: {exc!r}")


async def create_consumer(nc: NATS, stream: str, config: api.ConsumerConfig, *, timeout: float) -> api.ConsumerInfo:
    """Create the consumer ``config`` describes (its ``name`` and one ``filter_subject`` set)
    through the named API subject with the filter in it.

    Raises:
        nats.js.errors.APIError: the server refused it (its specific subclass).
        nats.errors.Error, TimeoutError: no answer (see :data:`START_ERRORS`).
    """
    assert config.name is not None and config.filter_subject, "a named consumer with one filter"
    request = json.dumps({"stream_name": stream, "config": config.as_dict()}).encode()
    reply = await nc.request(Subjects.consumer_create_api(stream, config.name, config.filter_subject), request,
                             timeout=timeout)
    try:
        body: dict[str, Any] = json.loads(reply.data)
    except ValueError as exc:
        raise nats.js.errors.APIError(description=f"unreadable answer: {reply.data[:100]!r}") from exc
    if "error" in body:
        nats.js.errors.APIError.from_error(body["error"])  # raises its specific class
    info: api.ConsumerInfo = api.ConsumerInfo.from_response(body)
    return info


async def consumer_limit_error(js: JetStreamContext, stream: str, what: str) -> ConsumerLimitError:
    """The :class:`ConsumerLimitError` of a consumer refused on ``stream`` (error 10026).

    The refusal does not say which limit was reached, nor its value. The account's
    JetStream info (``$JS.API.INFO``, allowed to every identity) tells whether the
    account's ``max_consumers`` is reached: then the error names it and its value;
    otherwise it was the stream's ``max_consumers``, whose value stays unknown
    (``limit`` None): reading the stream's configuration (``$JS.API.STREAM.INFO``)
    would be a permission violation for an agent, so it is not asked. When the
    account info does not answer either, the error names both settings.
    """
    stream_setting = f"the max_consumers of stream {stream}"
    account_setting = "the account's JetStream max_consumers"
    try:
        account = await js.account_info()
    except (nats.errors.Error, TimeoutError, BlackboardError) as exc:
        log.debug("cannot read the account's consumer limits (after a refusal on %s): %r", stream, exc)
        return ConsumerLimitError(stream, None, f"{stream_setting} or {account_setting}", what)
    usages = [(account.consumers, account.limits), *((t.consumers, t.limits) for t in (account.tiers or {}).values())]
    for used, limits in usages:
        limit = limits.max_consumers if limits is not None else None
        if limit is not None and limit > 0 and (used or 0) >= limit:
            return ConsumerLimitError(stream, limit, account_setting, what)
    return ConsumerLimitError(stream, None, stream_setting, what)


async def read_first(nc: NATS, js: JetStreamContext, stream: str, subject: str, start: int, *,
                     timeout: float, what: str) -> Msg | None:
    """The first message of ``stream`` on ``subject`` (one subject, no wildcard) with a
    stream sequence of at least ``start``, or ``None`` when there is none.

    One consumer, created for this read (:func:`create_consumer`): it delivers
    that one message (explicit acks, at most one unacknowledged, never acked)
    and goes away :data:`INACTIVE_THRESHOLD` seconds after. Its create answer
    says how many messages match, so an absent one costs no wait.

    Raises:
        NotConnectedError: NATS is closed, or nothing answered.
        OperationTimeoutError: the message did not arrive within ``timeout``.
        ConfigurationError: the stream does not exist.
        ConsumerLimitError, TransportError: the server refused the consumer.
    """
    loop = asyncio.get_running_loop()
    first: asyncio.Future[Msg] = loop.create_future()

    async def on_msg(msg: Msg) -> None:
        if not first.done() and not is_control(msg):
            first.set_result(msg)

    deliver = nc.new_inbox()
    config = api.ConsumerConfig(
        name=consumer_name(), filter_subject=subject, deliver_subject=deliver,
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, start),
        ack_policy=api.AckPolicy.EXPLICIT, max_ack_pending=1, max_deliver=1,
        inactive_threshold=INACTIVE_THRESHOLD, mem_storage=True, num_replicas=1)
    try:
        sub = await nc.subscribe(deliver, cb=on_msg)
    except nats.errors.ConnectionClosedError as exc:
        raise NotConnectedError("the NATS connection is closed") from exc
    try:
        try:
            info = await create_consumer(nc, stream, config, timeout=timeout)
        except START_ERRORS as exc:
            if is_consumer_limit(exc):
                raise await consumer_limit_error(js, stream, what) from exc
            raise start_error(exc, stream, what) from exc
        if not info.num_pending and not first.done():
            return None
        try:
            return await asyncio.wait_for(first, timeout)
        except TimeoutError as exc:
            raise OperationTimeoutError(f"{what}: the stored message did not arrive within {timeout:g}s") from exc
    finally:
        try:
            await sub.unsubscribe()
        except (TimeoutError, nats.errors.Error):  # connection gone: the server drops the consumer
            pass
