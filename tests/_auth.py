"""The test suite's identity authority: every test server runs with authorization and TLS.

One authority per session (``tests/conftest.py`` makes it) declares, by glob,
who may be issued a credential: any agent id gets the member role (every
board), and a few prefixes narrow that for the tests of refusals:

* ``outsider-*``: declared, but with no right on any board;
* ``reader-*``: read every board, nothing else;
* ``solo-*``: read, write and vote on the board ``solo-board`` only, topics
  ``solo.>``;
* ``admin-*``: a member with ``admin`` on every board (prune or archive every
  author's memories: docs/security.md, "Who may prune").

The SDK finds credentials through ``security.authority_dir`` (the settings of
:func:`auth_settings`), which issues a declared id its credential on first
use, as an operator's host would. Raw nats-py connections (what an attacker
uses) take :func:`raw_connect`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS

from blackboard.protocol.subjects import Grants
from blackboard.security.authority import Authority, LocalAuth
from blackboard.security.policy import STANDARD_ROLES
from blackboard.security.tls import client_context

__all__ = ["SESSION", "TEST_POLICY", "SystemService", "TestAuth", "make_test_auth", "operator_nats", "raw_connect", "setup_streams"]

TEST_POLICY = "version = 1\n\n" + STANDARD_ROLES + """
[agents."*"]
roles = ["member"]

[agents."outsider-*"]

[agents."reader-*"]
roles = ["reader"]

[agents."solo-*"]
boards = { "solo-board" = ["read", "write", "vote"] }
topics = ["solo.>"]

[agents."admin-*"]
roles = ["member"]
boards = { "*" = ["admin"] }

[workers.worker]

[operators.operator]
"""


class TestAuth(LocalAuth):
    """The session's authority and TLS files (the servers' auth, as ``blackboard dev`` has it)."""

    __test__ = False  # not a test class


#: The session's TestAuth (made once by tests/conftest.py).
SESSION: TestAuth | None = None


def make_test_auth(directory: Path) -> TestAuth:
    global SESSION
    authority = Authority(directory, Grants())
    authority.init(policy=TEST_POLICY)
    local = LocalAuth.prepare(authority)
    SESSION = TestAuth(local.authority, local.tls)
    return SESSION


async def operator_nats(url: str, principal: str = "operator", **options: Any) -> NATS:
    """A raw nats-py connection to a test server as ``principal`` (default the operator)."""
    return await raw_connect(url, SESSION, principal=principal, **options)


async def raw_connect(url: str, auth: TestAuth | None, principal: str | None = "operator",
                      **options: Any) -> NATS:
    """A plain nats-py connection, the way an attacker or another language's client makes one:
    with ``principal``'s credential (None: no credential at all) and the test CA."""
    opts: dict[str, Any] = {"allow_reconnect": False, "connect_timeout": 2, "max_reconnect_attempts": 0}
    if auth is not None:
        opts["tls"] = client_context(auth.tls.ca)
        if principal is not None:
            opts["user_credentials"] = str(auth.creds(principal))
            opts["inbox_prefix"] = Grants.reply_prefix(principal)
    opts.update(options)
    return await nats.connect(url, **opts)


def setup_streams(url: str, auth: TestAuth) -> None:
    """Create the JetStream assets on a fresh server as the operator (agents hold no right to)."""
    import asyncio

    from blackboard.client.connection import connect_nats
    from blackboard.client.streams import ensure_streams
    from blackboard.settings import NatsSettings, Settings

    async def run() -> None:
        settings = Settings().model_copy(update={"nats": NatsSettings(
            url=url, creds_file=auth.creds("operator"), tls_ca_file=auth.tls.ca)})
        nc = await connect_nats(settings.nats, name="test-setup")
        try:
            await ensure_streams(nc.jetstream(), settings, update=True)
        finally:
            await nc.close()

    # On a thread of its own: callers may be inside a running event loop (a private server
    # started from an async test).
    import threading

    errors: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(run())
        except BaseException as exc:  # re-raised in the caller
            errors.append(exc)

    thread = threading.Thread(target=target, name="test-setup-streams")
    thread.start()
    thread.join(60)
    if errors:
        raise errors[0]


class SystemService:
    """The worker's bus-only system service (inbox administration) for one test server, run
    on a thread of its own for the whole session, as a worker would run it. Tests that need the
    vote committer or search start those themselves."""

    def __init__(self, settings: Any) -> None:
        import threading

        self._settings = settings
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: Any = None
        self._loop: Any = None
        self._thread = threading.Thread(target=self._run, name="test-system-service", daemon=True)

    def _run(self) -> None:
        import asyncio

        async def main() -> None:
            from blackboard.client.connection import connect_nats
            from blackboard.security.source import RightsSource
            from blackboard.worker.inbox_admin import InboxAdmin

            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            nc = await connect_nats(self._settings.nats, name="test-system-service")
            try:
                async with InboxAdmin(nc, self._settings, rights=RightsSource.from_settings(self._settings)):
                    self._ready.set()
                    await self._stop.wait()
            finally:
                await nc.close()

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._ready.set()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise RuntimeError("the test system service did not start") from self._error

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)
