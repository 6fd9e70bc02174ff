"""Connecting to NATS: a wrong URL and an unreachable server are told apart, each naming its cause."""

from __future__ import annotations

import socket

import pytest

from agents_sdk import Agent
from blackboard.client.connection import connect_nats
from blackboard.client.signing import signing_of
from blackboard.devstack import EmbeddedNats
from blackboard.protocol.errors import ConfigurationError, NotConnectedError
from blackboard.settings import NatsSettings, Settings
from tests.conftest import make_settings


def _settings(url: str) -> NatsSettings:
    return NatsSettings(url=url, connect_attempts=1, connect_timeout=1.0, reconnect_time_wait=0.05)


@pytest.mark.asyncio
@pytest.mark.parametrize("url", ["htp://127.0.0.1:4222", "nats://127.0.0.1:4222,http://127.0.0.1:4223"])
@pytest.mark.usefixtures("no_connect")
async def test_an_unknown_scheme_is_a_configuration_error_naming_the_url_and_the_schemes(url: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        await connect_nats(_settings(url), name="test")
    bad = url.split(",")[-1]
    assert repr(bad) in str(err.value)
    for scheme in ("nats://", "tls://", "ws://", "wss://"):
        assert scheme in str(err.value)
    assert "no servers available" not in str(err.value)


@pytest.mark.asyncio
@pytest.mark.parametrize(("url", "says"), [
    ("nats://127.0.0.1:port", "port"),
    ("nats://[::1", "malformed"),
    ("nats://:4222", "host"),
    ("nats://127.0.0.1:4222,ws://127.0.0.1:8080", "websocket"),
    (" , ", "no server"),
])
@pytest.mark.usefixtures("no_connect")
async def test_a_malformed_url_is_a_configuration_error(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        await connect_nats(_settings(url), name="test")


@pytest.mark.asyncio
async def test_an_unresolvable_host_names_the_host() -> None:
    # .invalid never resolves (RFC 2606): nothing leaves the machine but a resolver query.
    with pytest.raises(NotConnectedError) as err:
        await connect_nats(_settings("nats://nohost.invalid:4222"), name="test")
    assert "cannot resolve" in str(err.value) and "'nohost.invalid'" in str(err.value)
    assert "no servers available" not in str(err.value)


@pytest.mark.asyncio
async def test_a_refused_connection_says_so_rather_than_no_servers_available() -> None:
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"nats://127.0.0.1:{port}"
    with pytest.raises(NotConnectedError) as err:
        await connect_nats(_settings(url), name="test")
    assert url in str(err.value) and "resolve" not in str(err.value)
    assert "no servers available" not in str(err.value)


@pytest.mark.asyncio
async def test_agent_connect_meets_the_same_errors() -> None:
    with pytest.raises(ConfigurationError, match="htp://"):
        await Agent.connect("a", nats_url="htp://127.0.0.1:4222")


@pytest.mark.asyncio
async def test_urls_nats_py_accepts_still_connect(nats_server: EmbeddedNats) -> None:
    # The test server requires TLS and a credential: the settings' CA and the worker's creds.
    secure = make_settings(nats_server.url).nats
    host_port = nats_server.url.split("://", 1)[1]
    for url in (nats_server.url, host_port, f"nats://{host_port}",
                f"nats://nohost.invalid:4222,{nats_server.url}"):
        settings = _settings(url).model_copy(update={
            "connect_attempts": 2, "creds_file": secure.creds_file, "tls_ca_file": secure.tls_ca_file})
        nc = await connect_nats(settings, name="test")
        try:
            assert nc.is_connected, url
        finally:
            await nc.close()


@pytest.mark.asyncio
async def test_a_drained_connection_stops_its_signing(settings: Settings, unique: str) -> None:
    """``Agent.close`` drains: the key registry's revocation re-reads and the verifier's threads stop
    with it, as with ``close`` (nats-py's drain closes without calling ``close``)."""
    agent = await Agent.connect(f"{unique}-a", settings=settings)
    registry = signing_of(agent.nc).registry
    assert registry is not None
    rereads = registry._reread
    assert rereads is not None and not rereads.done()
    await agent.close()
    assert agent.nc.is_closed and rereads.done() and registry._reread is None and registry._sub is None
