"""Inbox administration: the system service creates and updates agents' inbox consumers.

An agent's durable inbox consumer ``inbox-<agent>`` on ``BB_MSG`` has several
filter subjects (its direct subject, the boards it joined, the topics it
subscribed to). JetStream creates such a consumer through the API subject
without a filter (``$JS.API.CONSUMER.CREATE.BB_MSG.inbox-<agent>``), so the
server cannot check the filters against the agent's permissions: an agent
allowed to create it could read anyone's direct messages. So agents may only
pull from, acknowledge, inspect and reset their own inbox consumer; creating
and changing it is a request to this service on ``bb.inbox.<agent>``
(:class:`~blackboard.protocol.schemas.inbox.InboxRequest`), which

1. takes the agent from the subject (the server lets only that agent publish
   there), never from the request, and its rights from the policy;
2. checks every filter subject (:func:`check_filter`): its own direct subject
   only, broadcasts of boards it may read, topics within its topic patterns;
   one filter outside them refuses the whole request (``PermissionDeniedError``,
   service error code 403);
3. creates or updates the consumer with the configuration of
   :func:`blackboard.client.inboxes.inbox_config` (the one the SDK itself uses
   on an open bus), filling in "from now" starts with the stream's last
   sequence, and replies with :class:`~blackboard.protocol.schemas.inbox.InboxReply`.

It needs NATS only (no PostgreSQL), and runs in the worker's system part, in
the queue group ``blackboard-inbox`` (several workers share the requests).
See docs/messaging.md, "Inboxes".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Mapping

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext, api
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import Service

from blackboard.client.consumers import consumer_limit_error, is_consumer_limit
from blackboard.client.inboxes import grants_of, inbox_config
from blackboard.protocol import codec
from blackboard.protocol.errors import (
    BlackboardError,
    OperationTimeoutError,
    PermissionDeniedError,
    TransportError,
)
from blackboard.protocol.schemas import validate_wire
from blackboard.protocol.schemas.inbox import InboxReply, InboxRequest
from blackboard.protocol.subjects import INBOX_SERVICE, MESSAGE_STREAM, Subjects
from blackboard.search.access import RightsLookup
from blackboard.search.service import error_reply
from blackboard.security.policy import Right, Rights
from blackboard.security.source import RightsSource
from blackboard.settings import Settings

__all__ = ["INBOX_ADMIN_VERSION", "InboxAdmin", "check_filter", "wanted_grants"]

log = logging.getLogger("blackboard.worker.inbox_admin")

INBOX_ADMIN_VERSION = "1.0.0"
#: Requests answered at once by one service (each is a few JetStream API calls).
_CONCURRENCY = 32


def check_filter(rights: Rights, subject: str) -> None:
    """Refuse a filter subject the principal of ``rights`` may not read through its inbox (pure).

    Allowed: its own direct subject, the broadcast subject of a board it may
    ``read``, a topic pattern within its topic patterns.

    Raises:
        InvalidKeyError: not a direct, broadcast or topic subject (a wildcard agent or board,
            ``bb.msg.>``, another stream's subject, an invalid token).
        PermissionDeniedError: a subject outside its rights.
    """
    kind, token = Subjects.parse_message_filter(subject)
    who = rights.principal
    if kind == "direct":
        if token != who:
            raise PermissionDeniedError(f"{who!r} may not receive the direct messages of {token!r}",
                                        operation=f"inbox filter {subject}")
    elif kind == "broadcast":
        if not rights.can(token, Right.READ):
            raise PermissionDeniedError(f"{who!r} may not read board {token!r} (its broadcasts)",
                                        operation=f"inbox filter {subject}")
    elif not rights.topic_allowed(token):
        raise PermissionDeniedError(f"{who!r} may not subscribe to topic {token!r} (outside its topic patterns)",
                                    operation=f"inbox filter {subject}")


def wanted_grants(agent: str, requested: Mapping[str, int | None], current: Mapping[str, int],
                  last_seq: int) -> dict[str, int]:
    """The grants a request asks for (pure): a ``None`` start is a grant's current start when
    the inbox holds it already, else ``last_seq`` (from now); the agent's direct subject is
    always there (from 0 when missing)."""
    grants = {s: (start if start is not None else current.get(s, last_seq)) for s, start in requested.items()}
    grants.setdefault(Subjects.direct(agent), 0)
    return grants


class InboxAdmin:
    """The ``bb.inbox.*`` endpoint of the system service (``nats.micro`` service
    ``blackboard-inbox``). No IO in ``__init__``; :meth:`start` / :meth:`stop`, or ``async with``.

    Args:
        nc: a connection of the worker's identity (it creates consumers on ``BB_MSG``).
        settings: the deployment's settings (the inbox defaults: ``messaging``).
        rights: where principals' rights come from (default, at :meth:`start`:
            :meth:`RightsSource.from_settings`, the policy file or the open bus).
    """

    def __init__(self, nc: NATS, settings: Settings, *, rights: RightsLookup | None = None) -> None:
        self._nc = nc
        self._settings = settings
        self._rights = rights
        self._js: JetStreamContext | None = None
        self._service: Service | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._sem = asyncio.Semaphore(_CONCURRENCY)
        #: One change at a time per agent in this process (two processes of one agent may still race).
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        #: Requests answered, and refused for rights (for the worker's status).
        self.answered = 0
        self.refused = 0

    async def start(self) -> None:
        """Register the service; returns once it answers (idempotent).

        Raises:
            ConfigurationError: no rights were given and the settings name no policy (nor
                ``nats.insecure_open_bus``), or the policy file is invalid.
            NotConnectedError: the connection is closed.
        """
        if self._service is not None:
            return
        if self._rights is None:
            self._rights = RightsSource.from_settings(self._settings)
        self._js = self._nc.jetstream(timeout=self._settings.nats.request_timeout)
        svc = await add_service(self._nc, name=INBOX_SERVICE, version=INBOX_ADMIN_VERSION,
                                description="blackboard inbox administration: agents' inbox consumers",
                                queue_group=INBOX_SERVICE)
        await svc.add_endpoint(name="inbox", subject=Subjects.inbox_admin_all(), handler=self._handle)
        self._service = svc

    async def stop(self) -> None:
        """Stop answering and let the requests in flight finish (idempotent)."""
        service, self._service = self._service, None
        if service is not None:
            with contextlib.suppress(Exception):
                await service.stop()
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    async def __aenter__(self) -> InboxAdmin:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _handle(self, request: Request) -> None:
        # nats-py runs a subscription's callbacks one at a time: answer in a task.
        if self._service is None:
            return
        task = asyncio.create_task(self._answer(request), name="inbox admin request")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, request: Request) -> None:
        encoding = codec.encoding_of(request.headers)
        try:
            async with self._sem:
                principal = Subjects.parse_inbox_admin(request.subject)
                assert self._rights is not None
                rights = self._rights.rights(principal)
                if rights is None:
                    raise PermissionDeniedError(f"{principal!r} is not declared in the access policy",
                                                operation=f"inbox administration as {principal}")
                req = validate_wire(InboxRequest, codec.decode(request.data, encoding))
                reply = await self.apply(rights, req)
            body = codec.encode(reply.model_dump(), encoding)
            self.answered += 1
            await request.respond(body, headers=codec.headers_for(encoding) or None)
        except Exception as exc:
            if isinstance(exc, PermissionDeniedError):
                self.refused += 1
                log.info("inbox administration refused on %s: %s", request.subject, exc)
            elif not isinstance(exc, BlackboardError):
                log.exception("inbox administration on %s failed", request.subject)
            body, headers = error_reply(exc, encoding, fallback="TransportError")
            with contextlib.suppress(Exception):
                await request.respond(body, headers=headers)

    def _lock(self, agent: str) -> asyncio.Lock:
        lock = self._locks.get(agent)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[agent] = lock
        return lock

    async def apply(self, rights: Rights, req: InboxRequest) -> InboxReply:
        """Check ``req`` against ``rights`` and make the principal's inbox consumer hold its grants.

        Raises:
            PermissionDeniedError: a filter outside the principal's rights.
            InvalidKeyError: a filter that is not a message subject, or two that overlap partially.
            ConsumerLimitError: the consumer is new and the server's consumer limit is reached.
            OperationTimeoutError, TransportError: JetStream trouble.
        """
        agent = rights.principal
        for subject in req.grants:
            check_filter(rights, subject)
        name = Subjects.inbox_consumer(agent)
        what = f"create or update the inbox consumer {name}"
        assert self._js is not None
        js = self._js
        async with self._lock(agent):
            try:
                info: api.ConsumerInfo | None
                try:
                    info = await js.consumer_info(MESSAGE_STREAM, name)
                except nats.js.errors.NotFoundError:
                    info = None
                current = grants_of(info.config, agent) if info is not None else {}
                last = 0
                if any(start is None and subject not in current for subject, start in req.grants.items()):
                    last = int((await js.stream_info(MESSAGE_STREAM)).state.last_seq)
                grants = wanted_grants(agent, req.grants, current, last)
                base = info.config if info is not None else None
                if req.rewind and info is not None and base is not None:
                    # Servers before 2.14 (no CONSUMER.RESET): re-create just above the ack floor.
                    base.deliver_policy = api.DeliverPolicy.BY_START_SEQUENCE
                    base.opt_start_seq = (int(info.ack_floor.stream_seq) if info.ack_floor else 0) + 1
                    await js.delete_consumer(MESSAGE_STREAM, name)
                config = inbox_config(agent, grants, self._settings.messaging, base=base, ack_wait=req.ack_wait,
                                      max_ack_pending=req.max_ack_pending)
                new = await js.add_consumer(MESSAGE_STREAM, config)
            except nats.js.errors.APIError as exc:
                if is_consumer_limit(exc):
                    raise await consumer_limit_error(js, MESSAGE_STREAM, what) from exc
                raise TransportError(f"{what}: JetStream refused: {exc.description} (code {exc.err_code})") from exc
            except (nats.errors.TimeoutError, TimeoutError) as exc:
                raise OperationTimeoutError(f"{what}: no answer from the server in time") from exc
            except nats.errors.Error as exc:
                raise TransportError(f"{what}: {exc!r}") from exc
        log.debug("inbox %s: %d filter(s)%s", name, len(grants), " (created)" if info is None else "")
        return InboxReply(consumer=name, grants=grants_of(new.config, agent), created=info is None,
                          num_ack_pending=int(new.num_ack_pending or 0), num_pending=int(new.num_pending or 0),
                          ack_floor=int(new.ack_floor.stream_seq) if new.ack_floor else 0)
