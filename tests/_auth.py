"""The test suite's identity authority: every test server runs with authorization and TLS.

One authority per session (``tests/conftest.py`` makes it) declares, by glob,
who may be issued a credential: any agent id gets the member role (every
board), and a few prefixes narrow that for the tests of refusals:

* ``outsider-*``: declared, but with no right on any board;
* ``reader-*``: read every board, nothing else;
* ``solo-*``: read, write and vote on the board ``solo-board`` only, topics
  ``solo.>``.

The SDK finds credentials through ``security.authority_dir`` (the settings of
:func:`auth_settings`), which issues a declared id its credential on first
use, as an operator's host would. Raw nats-py connections (what an attacker
uses) take :func:`raw_connect`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS

from blackboard.protocol.subjects import Grants
from blackboard.security.authority import Authority
from blackboard.security.tls import TlsFiles, client_context, ensure_dev_certificates, server_hosts

__all__ = ["TEST_POLICY", "TestAuth", "make_test_auth", "raw_connect", "setup_streams"]

TEST_POLICY = """\
version = 1

[roles.member]
boards = { "*" = ["read", "write", "vote"] }
topics = [">"]
objects = "write"

[roles.reader]
boards = { "*" = ["read"] }
topics = [">"]
objects = "read"

[agents."*"]
roles = ["member"]

[agents."outsider-*"]

[agents."reader-*"]
roles = ["reader"]

[agents."solo-*"]
boards = { "solo-board" = ["read", "write", "vote"] }
topics = ["solo.>"]

[workers.worker]

[operators.operator]
"""


@dataclass(frozen=True)
class TestAuth:
    """The session's authority and TLS files."""

    __test__ = False  # not a test class

    authority: Authority
    tls: TlsFiles

    @property
    def config(self) -> Path:
        return self.authority.config_file

    def creds(self, principal: str) -> Path:
        """``principal``'s ``.creds`` file (issued now if it has none)."""
        self.authority.credentials_for(principal)
        return self.authority.credentials_path(principal)


def make_test_auth(directory: Path) -> TestAuth:
    authority = Authority(directory, Grants())
    authority.init(policy=TEST_POLICY)
    for principal in ("operator", "worker"):
        authority.credentials_for(principal)
    authority.write_server_config()
    tls = ensure_dev_certificates(directory / "tls", server_hosts("127.0.0.1"))
    return TestAuth(authority, tls)


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

    asyncio.run(run())
