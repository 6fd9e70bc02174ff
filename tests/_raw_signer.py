"""A plain nats-py client that signs what it publishes, the way another language's client does.

``raw_signer(url, principal)`` connects as ``principal`` (its test credential),
publishes its certificate to the key registry and returns the connection with a
:class:`~blackboard.security.signer.Signer` of the same key: tests publish
records signed by that key with any content (another agent's sender, a tampered
payload), which is what an attacker with write rights can do.
"""

from __future__ import annotations

from nats.aio.client import Client as NATS

from blackboard.client.keys import publish_certificate
from blackboard.security.jwt import Credentials
from blackboard.security.signer import Signer
from tests import _auth

__all__ = ["raw_signer"]


async def raw_signer(url: str, principal: str) -> tuple[NATS, Signer]:
    """A raw connection as ``principal`` and its signer (its certificate published)."""
    auth = _auth.SESSION
    assert auth is not None, "the test session's authority is made by tests/conftest.py"
    signer = Signer(Credentials.parse(auth.creds(principal).read_text()))
    nc = await _auth.operator_nats(url, principal)
    try:
        await publish_certificate(nc, signer.public_key, signer.certificate, 5.0)
    except BaseException:
        await nc.close()
        raise
    return nc, signer
