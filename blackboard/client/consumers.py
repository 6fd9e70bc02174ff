"""Consumers at the server's limit, and ephemeral consumers deleted when they close.

Every live view, watch and vote follower holds an ordered (ephemeral)
consumer on its stream, every inbox a durable one on the message stream.
JetStream bounds them: a stream's ``max_consumers`` and an account's JetStream
``max_consumers``; past either it refuses a new one with error 10026
("maximum consumers limit reached"), which :func:`consumer_limit_error` turns
into one :class:`~blackboard.protocol.errors.ConsumerLimitError` naming the
limit and the setting that raises it (one lookup, on the error path only).

An ordered consumer that its subscriber leaves stays on the server until its
inactivity threshold passes (seconds: 752 of 1,200 closed views' consumers
were still counted 3 s after closing, issue 18), so it counts against the
limit after its view closed: :func:`delete_consumer` deletes it at once.
"""

from __future__ import annotations

import asyncio
import logging

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext

from blackboard.protocol.errors import ConsumerLimitError

__all__ = ["CONSUMER_LIMIT_CODE", "consumer_limit_error", "delete_consumer", "is_consumer_limit"]

log = logging.getLogger("blackboard.client.consumers")

#: JetStream's API error code of "maximum consumers limit reached" (the stream's limit or
#: the account's).
CONSUMER_LIMIT_CODE = 10026

#: How long deleting a closed consumer may take before it is left to the server's own
#: inactivity threshold (a close must not hang on a server that is going away).
_DELETE_TIMEOUT = 2.0


def is_consumer_limit(exc: BaseException) -> bool:
    """Whether ``exc`` is JetStream refusing a consumer at its consumer limit (pure)."""
    return isinstance(exc, nats.js.errors.APIError) and exc.err_code == CONSUMER_LIMIT_CODE


async def consumer_limit_error(js: JetStreamContext, stream: str, what: str) -> ConsumerLimitError:
    """The :class:`ConsumerLimitError` of a consumer refused on ``stream``: the stream's
    ``max_consumers`` when it has one and it is reached, else the account's JetStream
    ``max_consumers`` (``limit`` None when neither lookup answers)."""
    account_setting = "the account's JetStream max_consumers"
    try:
        info = await js.stream_info(stream)
        limit = info.config.max_consumers
        if limit is not None and limit >= 0 and (info.state.consumer_count or 0) >= limit:
            return ConsumerLimitError(stream, limit, f"the max_consumers of stream {stream}", what)
        account = await js.account_info()
        limit = account.limits.max_consumers if account.limits is not None else None
        return ConsumerLimitError(stream, limit if limit is not None and limit >= 0 else None, account_setting,
                                  what)
    except (nats.errors.Error, TimeoutError) as exc:
        log.debug("cannot read the consumer limits of %s: %r", stream, exc)
        return ConsumerLimitError(stream, None, f"the max_consumers of stream {stream} or {account_setting}",
                                  what)


async def delete_consumer(js: JetStreamContext, stream: str, name: str | None, *,
                          connected: bool | None = None) -> None:
    """Delete the consumer ``name`` of ``stream`` now (a closed ordered consumer would count
    against the limit until its inactivity threshold). Gone already, or no server to ask
    (``connected`` False: the connection is down): nothing to do, the server's threshold
    removes it. ``connected`` None (unknown): tried for at most a couple of seconds."""
    if name is None or connected is False:
        return
    try:
        await asyncio.wait_for(js.delete_consumer(stream, name), _DELETE_TIMEOUT)
    except nats.js.errors.NotFoundError:
        pass
    except (nats.errors.Error, TimeoutError) as exc:
        log.debug("cannot delete consumer %s of %s: %r", name, stream, exc)
