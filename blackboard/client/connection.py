"""Connecting to NATS from Settings (the one place connection options are chosen).

A connection made with a credential (``connect_nats(..., credentials=...)``)
authenticates with its user JWT and nkey seed, and takes its reply inboxes
under ``_INBOX.<principal>`` (the only inboxes the server lets it subscribe
to). The server's refusal of the credential at connect is an
:class:`AuthenticationError`; its later refusals of a publish or a
subscription arrive asynchronously (``-ERR 'Permissions Violation ...'``) and
are kept by the connection's :class:`PermissionViolations`, which the
publisher and the request paths use to fail fast with
:class:`PermissionDeniedError` instead of waiting out their timeouts.

Such a connection also signs what it writes and verifies what it reads
(``security.sign`` / ``security.verify``): its :class:`~blackboard.client.signing.Signing`
is ``nc.signing`` (``signing_of(nc)``), started at connect (the credential's
certificate published to the key registry) and stopped at close.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import logging
import re
import socket
import ssl
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal
from urllib.parse import SplitResult, urlsplit

import nats
import nats.errors
import nkeys
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import NoServersError

from blackboard.client.signing import Signing
from blackboard.protocol.errors import (
    AuthenticationError,
    ConfigurationError,
    NotConnectedError,
    PermissionDeniedError,
)
from blackboard.protocol.subjects import Grants
from blackboard.security.credentials import (
    FoundCredentials,
    credential_principal,
    load_credentials_file,
)
from blackboard.security.jwt import Credentials
from blackboard.security.tls import client_context
from blackboard.settings import NatsSettings, Settings

__all__ = ["Connection", "PermissionViolations", "check_nats_url", "connect_nats", "permission_violations"]

log = logging.getLogger("blackboard.client.connection")


class _QuietTlsClose(logging.Filter):
    """Drops asyncio's warning on every TLS connection's close ("returning true from
    eof_received() has no effect when using ssl"): nats-py's stream protocol returns True
    there, which means nothing over TLS; the warning is noise in every program's output."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received() has no effect when using ssl" not in record.getMessage()


logging.getLogger("asyncio").addFilter(_QuietTlsClose())

#: The URL schemes nats-py connects with (a URL without one is ``nats://``).
_SCHEMES = ("nats", "tls", "ws", "wss")


def _server_urls(url: str) -> list[SplitResult]:
    """The servers of a comma-separated ``nats.url`` setting, parsed and checked.

    Raises:
        ConfigurationError: no URL, an unknown scheme, no host, a bad port, or
            websocket and plain URLs mixed (nats-py takes one kind).
    """
    servers: list[SplitResult] = []
    for raw in (u.strip() for u in url.split(",")):
        if not raw:
            continue
        # nats-py reads "host" and "host:port" as nats://; anything else must name its scheme.
        try:
            parsed = urlsplit(raw if "://" in raw else f"nats://{raw}")
        except ValueError as exc:
            raise ConfigurationError(f"NATS URL {raw!r} is malformed: {exc}") from exc
        if parsed.scheme.lower() not in _SCHEMES:
            raise ConfigurationError(
                f"NATS URL {raw!r} has the scheme {parsed.scheme!r}; use one of "
                + ", ".join(f"{s}://" for s in _SCHEMES))
        try:
            parsed.port  # noqa: B018 - parsing the port is the check
        except ValueError as exc:
            raise ConfigurationError(f"NATS URL {raw!r} has an invalid port") from exc
        if not parsed.hostname:
            raise ConfigurationError(f"NATS URL {raw!r} names no host")
        servers.append(parsed)
    if not servers:
        raise ConfigurationError(f"no server in the NATS URL setting {url!r}")
    if len({s.scheme.lower() in ("ws", "wss") for s in servers}) > 1:
        raise ConfigurationError(f"NATS URLs {url!r} mix websocket (ws://, wss://) and plain servers; "
                                 "nats-py connects to one kind")
    return servers


def check_nats_url(url: str) -> None:
    """Check a ``nats.url`` setting without connecting (what :func:`connect_nats` checks first).

    Raises:
        ConfigurationError: an unknown scheme, no host, a bad port, or websocket and plain URLs mixed.
    """
    _server_urls(url)


# ------------------------------------------------------------ permission violations
Kind = Literal["publish", "subscribe"]

#: ``-ERR 'Permissions Violation for Publish to "<subject>"'`` (and ``Subscription to``, with
#: ``using queue "<q>"`` after it); nats-py hands the text over lower-cased.
_VIOLATION_RE = re.compile(r'permissions violation for (publish|subscription) to "([^"]*)"', re.IGNORECASE)
#: Distinct refusals a connection remembers (the oldest are forgotten first).
_REMEMBERED = 256


def parse_violation(message: str) -> tuple[Kind, str] | None:
    """``(kind, subject)`` of a server's permissions-violation error text (the subject as the
    client received it: nats-py lower-cases the text), or None for any other error."""
    match = _VIOLATION_RE.search(message)
    if match is None:
        return None
    return ("publish" if match.group(1).lower() == "publish" else "subscribe"), match.group(2)


def permission_violations(nc: NATS) -> PermissionViolations | None:
    """The permission refusals of a connection made by :func:`connect_nats` (None for another)."""
    return nc.violations if isinstance(nc, Connection) else None


class _Guard:
    """Fails the awaits inside it with :class:`PermissionDeniedError` when the server refuses
    a publish to its subject (see :meth:`PermissionViolations.guard`)."""

    __slots__ = ("_owner", "cancelled", "subject", "task", "tripped", "what")

    def __init__(self, owner: PermissionViolations, subject: str, what: str | None) -> None:
        self._owner = owner
        self.subject = subject
        self.what = what
        self.task: asyncio.Task[Any] | None = None
        self.tripped = False
        self.cancelled = False

    def __enter__(self) -> _Guard:
        self.task = asyncio.current_task()
        self._owner.guards[self] = None
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        self._owner.guards.pop(self, None)
        if not self.tripped:
            return False
        if self.cancelled:
            assert self.task is not None
            if self.task.uncancel() > 0:  # cancelled by someone else too: that cancellation goes on
                return False
            if typ is not asyncio.CancelledError:  # the await finished before the cancellation landed
                return False
        raise self._owner.error("publish", self.subject, self.what) from None

    def trip(self) -> None:
        """The server refused a publish to the subject: end the wait inside the guard."""
        if self.tripped:
            return
        self.tripped = True
        task = self.task
        if task is not None and task is not asyncio.current_task() and not task.done():
            self.cancelled = task.cancel()


class PermissionViolations:
    """The server's permission refusals on one connection, as they arrive.

    The server answers a publish or a subscription the identity holds no right
    for with an asynchronous ``-ERR`` (the message is dropped, no reply or ack
    ever comes; the connection stays up). The connection's error callback
    records each here; listeners (a publisher failing the writes it waits for)
    and guards (a request waiting for its reply) are told at once, and
    :meth:`refused` answers whether a subject was refused since a moment (a
    check after a timeout). Subjects are compared case-insensitively: the
    client receives the server's text lower-cased.
    """

    def __init__(self, principal: str | None = None) -> None:
        #: Who the connection is (None: no credential), for messages.
        self.principal = principal
        #: (kind, subject lower-cased) -> loop time of the last refusal.
        self._recent: collections.OrderedDict[tuple[Kind, str], float] = collections.OrderedDict()
        self._listeners: list[weakref.WeakMethod[Callable[[Kind, str], None]]] = []
        #: The guards open now (a dict as an ordered set).
        self.guards: dict[_Guard, None] = {}

    def record(self, kind: Kind, subject: str) -> bool:
        """Note a refusal and tell the listeners and guards; returns whether it is new."""
        key = (kind, subject.lower())
        new = key not in self._recent
        self._recent[key] = asyncio.get_running_loop().time()
        self._recent.move_to_end(key)
        while len(self._recent) > _REMEMBERED:
            self._recent.popitem(last=False)
        for ref in list(self._listeners):
            listener = ref()
            if listener is None:
                self._listeners.remove(ref)
            else:
                listener(kind, key[1])
        if kind == "publish" and self.guards:
            for guard in [g for g in self.guards if g.subject.lower() == key[1]]:
                guard.trip()
        return new

    def refused(self, kind: Kind, subject: str, since: float = float("-inf")) -> bool:
        """Whether the server refused ``kind`` on ``subject`` at or after loop time ``since``."""
        at = self._recent.get((kind, subject.lower()))
        return at is not None and at >= since

    def add_listener(self, listener: Callable[[Kind, str], None]) -> None:
        """Call the bound method ``listener(kind, subject_lower_cased)`` on each refusal
        (held weakly: a dropped object stops listening)."""
        self._listeners.append(weakref.WeakMethod(listener))

    def remove_listener(self, listener: Callable[[Kind, str], None]) -> None:
        self._listeners = [r for r in self._listeners if r() is not None and r() != listener]

    def guard(self, subject: str, what: str | None = None) -> _Guard:
        """``with violations.guard(subject, what): await ...``: when the server refuses a publish
        to ``subject`` meanwhile, the await ends and the block raises :class:`PermissionDeniedError`
        (the waiting task is cancelled and the cancellation turned into the error)."""
        return _Guard(self, subject, what)

    def error(self, kind: Kind, subject: str, what: str | None = None) -> PermissionDeniedError:
        """The typed error of a refusal."""
        who = f"{self.principal!r}" if self.principal else "this connection (no credential)"
        verb = "publish to" if kind == "publish" else "subscribe to"
        doing = f" ({what})" if what else ""
        return PermissionDeniedError(
            f"permission denied: the server refused to let {who} {verb} {subject}{doing}; "
            "the identity holds no right for it (docs/security.md)", operation=f"{verb} {subject}")


class Connection(NATS):
    """The nats-py client :func:`connect_nats` returns: its requests (the SDK's reads,
    nats-py's JetStream API calls) fail at once with :class:`PermissionDeniedError` when the
    server refuses their publish, instead of waiting out their timeout."""

    def __init__(self, violations: PermissionViolations) -> None:
        super().__init__()
        #: The server's permission refusals on this connection.
        self.violations = violations
        #: What it signs and verifies with (set by ``connect_nats``).
        self.signing = Signing.off()

    async def close(self) -> None:
        try:
            await self.signing.stop()
        finally:
            await super().close()

    async def drain(self) -> None:
        # nats-py's drain closes through its private ``_close``, not ``close``: without this, a
        # drained connection (``Agent.close``) left the key registry's revocation re-reads (a
        # task living up to 30 s) and the verifier's thread pool running.
        try:
            await self.signing.stop()
        finally:
            await super().drain()

    async def request(self, subject: str, payload: bytes = b"", timeout: float = 0.5, old_style: bool = False,
                      headers: dict[str, Any] | None = None) -> Msg:
        with self.violations.guard(subject, None):
            return await super().request(subject, payload, timeout=timeout, old_style=old_style, headers=headers)


# ------------------------------------------------------------ connecting
#: The server's refusals of a credential (lower-cased, as nats-py hands them over).
_AUTH_REFUSALS = ("authorization violation", "authentication expired", "authentication revoked",
                  "authentication timeout")


def _auth_refusal(exc: BaseException) -> str | None:
    """The server's words when ``exc`` is its refusal of the credential, else None."""
    if isinstance(exc, nats.errors.AuthorizationError):
        return "authorization violation"
    text = str(exc).lower()
    return next((words for words in _AUTH_REFUSALS if words in text), None)


def _authentication_error(settings: NatsSettings, found: FoundCredentials | None,
                          refusal: str) -> AuthenticationError:
    if found is None:
        return AuthenticationError(
            f"the NATS server at {settings.url} requires a credential ({refusal}) and none was given: "
            "nats.insecure_open_bus is set, but the server has authorization on; give the credential "
            "(credentials=, nats.creds_file or nats.credentials_dir; docs/security.md)")
    why = {"authentication expired": "the credential has expired",
           "authentication revoked": "the credential was revoked"}.get(refusal, "unknown, revoked or expired")
    return AuthenticationError(
        f"the NATS server at {settings.url} refused the credential of {found.principal!r} from "
        f"{found.origin} ({refusal}: {why}); issue a new one with `blackboard auth add "
        f"{found.principal}`", found.principal)


async def _unresolvable(servers: list[SplitResult]) -> list[str]:
    """The host names of ``servers`` that do not resolve (looked up after a failed connect)."""
    loop = asyncio.get_running_loop()
    bad: list[str] = []
    for server in servers:
        host = server.hostname or ""
        try:
            await loop.getaddrinfo(host, server.port or 4222, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):
            bad.append(host)
    return bad


async def _not_connected(settings: NatsSettings, servers: list[SplitResult],
                         errors: collections.deque[Exception], exc: Exception,
                         found: FoundCredentials | None, ca: str) -> NotConnectedError | AuthenticationError:
    """Why the first connect failed, named: the credential refused, the hosts that do not
    resolve, the server's certificate not verified, or the last error."""
    for err in (*errors, exc):
        refusal = _auth_refusal(err)
        if refusal is not None:
            return _authentication_error(settings, found, refusal)
    unresolved = await _unresolvable(servers)
    if unresolved and len(unresolved) == len(servers):
        hosts = ", ".join(repr(h) for h in unresolved)
        return NotConnectedError(f"cannot resolve the NATS host {hosts} (of {settings.url})")
    # The last error other than a failed lookup (named below), else the connect's own.
    last = next((e for e in reversed(errors) if not isinstance(e, socket.gaierror)), exc)
    cause = str(last)
    if isinstance(last, ssl.SSLCertVerificationError):
        cause = (f"the server's TLS certificate does not verify against {ca} ({last.verify_message}); "
                 "set nats.tls_ca_file (BLACKBOARD_NATS__TLS_CA_FILE) to the CA that signed it")
    elif not cause or isinstance(last, TimeoutError):
        cause = f"no answer within {settings.connect_timeout:g}s"
    also = f"; cannot resolve {', '.join(repr(h) for h in unresolved)}" if unresolved else ""
    return NotConnectedError(f"cannot connect to NATS at {settings.url}: {cause}{also}")


def _found(settings: NatsSettings, credentials: FoundCredentials | Credentials | None) -> FoundCredentials | None:
    if isinstance(credentials, FoundCredentials):
        return credentials
    if isinstance(credentials, Credentials):
        origin = "the credential given"
        return FoundCredentials(credentials, credential_principal(credentials, origin), origin)
    if settings.creds_file is not None:
        return load_credentials_file(settings.creds_file,
                                     f"nats.creds_file (BLACKBOARD_NATS__CREDS_FILE) ({settings.creds_file})")
    return None


async def _first_connect(nc: Connection, options: dict[str, Any], fatal: asyncio.Future[Exception]) -> None:
    """``nc.connect(**options)``, given up at once when ``fatal`` gets an error (raised)."""
    attempt = asyncio.ensure_future(nc.connect(**options))
    try:
        await asyncio.wait((attempt, fatal), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not attempt.done():
            attempt.cancel()
            with contextlib.suppress(asyncio.CancelledError, nats.errors.Error, OSError, TimeoutError):
                await attempt
    if attempt.cancelled():
        raise fatal.result()
    attempt.result()


def _credential_callbacks(creds: Credentials, origin: str) -> dict[str, Any]:
    """nats-py's ``user_jwt_cb`` and ``signature_cb`` for a credential held in memory
    (the seed is checked here, so a bad one fails before connecting)."""
    try:
        nkeys.from_seed(bytearray(creds.seed.encode("ascii"))).wipe()
    except (nkeys.NkeysError, ValueError, UnicodeEncodeError) as exc:
        raise AuthenticationError(f"{origin} holds no valid nkey seed: {exc}") from None
    user_jwt = creds.jwt.encode("ascii")

    def jwt_cb() -> bytearray:
        return bytearray(user_jwt)

    def sign_cb(nonce: str) -> bytes:
        pair = nkeys.from_seed(bytearray(creds.seed.encode("ascii")))
        try:
            return base64.b64encode(pair.sign(nonce.encode()))
        finally:
            pair.wipe()

    return {"user_jwt_cb": jwt_cb, "signature_cb": sign_cb}


async def connect_nats(settings: NatsSettings | Settings, *, name: str,
                       credentials: FoundCredentials | Credentials | None = None) -> NATS:
    """Open a NATS connection that reconnects by itself after outages.

    ``settings``: the whole :class:`Settings` (its ``security`` decides what the
    connection signs and verifies), or only the NATS part (the security defaults).

    ``credentials`` (what :func:`~blackboard.security.credentials.find_credentials`
    found, or a credential): the connection authenticates with it and takes
    its reply inboxes under ``_INBOX.<principal>``. None: ``nats.creds_file``
    if set, else no credential (an open bus). The server's certificate is
    verified (TLS) against ``nats.tls_ca_file``, else the ``ca.pem`` beside
    the credential, else the system's CAs; TLS is used for ``tls://`` URLs and
    whenever the server requires it. With a credential, the connection's
    :class:`~blackboard.client.signing.Signing` is started (``nc.signing``).

    Raises:
        ConfigurationError: the URL setting is malformed (an unknown scheme,
            no host, a bad port), found before connecting; the CA file cannot be read.
        AuthenticationError: the server refused the credential (unknown, revoked,
            expired), or requires one and none was given; the credential's seed is not valid.
        NotConnectedError: no server answered at start-up (the message names
            a host that does not resolve, a certificate that does not verify,
            or the last connection error).
    """
    full = settings if isinstance(settings, Settings) else None
    if isinstance(settings, Settings):
        settings = settings.nats
    servers = _server_urls(settings.url)
    found = _found(settings, credentials)
    violations = PermissionViolations(found.principal if found is not None else None)
    #: The errors of the first connect's attempts (the last few), to say why it failed.
    errors: collections.deque[Exception] = collections.deque(maxlen=4)
    #: The connection, once made (for the closed callback).
    opened: list[NATS] = []
    #: An error no further attempt can mend (the credential refused, the certificate not
    #: verified): the first connect stops at once (nats-py would also hang after a failed
    #: TLS handshake, waiting for the socket to close: nats-io/nats.py#718).
    fatal: asyncio.Future[Exception] = asyncio.get_running_loop().create_future()

    async def _disconnected() -> None:
        log.info("%s: disconnected from NATS", name)

    async def _reconnected() -> None:
        log.info("%s: reconnected to NATS", name)

    async def _closed() -> None:
        # The server ends the connection of a credential revoked or expired meanwhile
        # (nats-py closes it without calling the error callback, and does not reconnect).
        last = opened[0].last_error if opened else None
        if last is not None and _auth_refusal(last) is not None:
            log.error("%s: NATS closed the connection: %s (the credential%s is no longer accepted; "
                      "issue a new one with `blackboard auth add`)", name, last,
                      f" of {found.principal!r}" if found is not None else "")

    async def _error(exc: Exception) -> None:
        errors.append(exc)
        if not fatal.done() and (isinstance(exc, ssl.SSLCertVerificationError) or _auth_refusal(exc)):
            fatal.set_result(exc)
        violation = parse_violation(str(exc))
        if violation is not None:
            # INFO: the operation that was refused raises PermissionDeniedError to its caller.
            if violations.record(*violation):
                log.info("%s: NATS refused to let %s %s %s (no right for it)", name,
                            violations.principal or "this connection",
                            "publish to" if violation[0] == "publish" else "subscribe to", violation[1])
            return
        refusal = _auth_refusal(exc)
        if refusal is not None:
            log.error("%s: NATS refused the credential%s: %s", name,
                      f" of {found.principal!r}" if found is not None else "", exc)
            return
        log.debug("%s: NATS error: %r", name, exc)

    options: dict[str, Any] = {
        "servers": [u.strip() for u in settings.url.split(",") if u.strip()],  # checked by _server_urls
        "name": name,
        "connect_timeout": settings.connect_timeout,
        "reconnect_time_wait": settings.reconnect_time_wait,
        # The first connect gives up after a few attempts (nats-py would retry
        # forever with -1); once connected, reconnects follow the settings.
        "max_reconnect_attempts": settings.connect_attempts,
        "allow_reconnect": True,
        "disconnected_cb": _disconnected,
        "reconnected_cb": _reconnected,
        "closed_cb": _closed,
        "error_cb": _error,
        # Keep writes made during an outage in the client buffer (up to 64 MiB)
        # so they go out on reconnect; JetStream acks still decide success.
        "pending_size": 64 * 1024 * 1024,
        "ping_interval": 10,
        "max_outstanding_pings": 3,
    }
    if settings.user:
        options["user"] = settings.user
    if settings.password:
        options["password"] = settings.password.get_secret_value()
    if settings.token:
        options["token"] = settings.token.get_secret_value()
    if found is not None:
        options.update(_credential_callbacks(found.credentials, found.origin))
        # The only reply inboxes an agent may subscribe to: _INBOX.<principal>.>
        options["inbox_prefix"] = Grants.reply_prefix(found.principal)
    ca_file = settings.tls_ca_file or (found.ca_file if found is not None else None)
    if ca_file is not None or any(s.scheme.lower() in ("tls", "wss") for s in servers):
        options["tls"] = client_context(ca_file)
    ca = str(ca_file) if ca_file is not None else "the system's CAs"
    try:
        nc = Connection(violations)
        await _first_connect(nc, options, fatal)
    except (NoServersError, OSError, TimeoutError) as exc:
        raise await _not_connected(settings, servers, errors, exc, found, ca) from exc
    except nats.errors.Error as exc:
        refusal = _auth_refusal(exc)
        if refusal is not None:
            raise _authentication_error(settings, found, refusal) from exc
        raise NotConnectedError(f"cannot connect to NATS at {settings.url}: {exc}") from exc
    nc.options["max_reconnect_attempts"] = settings.max_reconnect_attempts
    opened.append(nc)
    if found is not None:
        try:
            nc.signing = await Signing.start(nc, full or Settings.model_construct(nats=settings),
                                             found.credentials)
        except BaseException:
            await nc.close()
            raise
    elif full is not None:
        nc.signing = Signing.off(full.security.unverified)
    return nc
