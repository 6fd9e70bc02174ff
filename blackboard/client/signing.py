"""What a connection signs and verifies with (docs/security.md, "Signatures").

:func:`~blackboard.client.connection.connect_nats` starts a :class:`Signing` for a
connection made with a credential (``security.sign`` / ``security.verify``),
publishing the credential's certificate to the key registry, and attaches it
as ``nc.signing``; anything holding the client gets it with :func:`signing_of`.
A connection without a credential (an open bus) has :meth:`Signing.off`: it
signs nothing and verifies nothing (every record's verdict is ``unsigned``).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, MutableMapping
from dataclasses import dataclass
from typing import Any, Literal

from nats.aio.client import Client as NATS

from blackboard.client.keys import KeyRegistry
from blackboard.security.jwt import Credentials
from blackboard.security.signer import Signer
from blackboard.security.verifier import Verifier
from blackboard.settings import Settings

__all__ = ["Signing", "signing_of"]


@dataclass(eq=False, slots=True)
class Signing:
    """A connection's signer (None: it signs nothing), verifier (None: it verifies nothing),
    key registry, and what its reads do with a record that does not verify."""

    signer: Signer | None = None
    verifier: Verifier | None = None
    registry: KeyRegistry | None = None
    unverified: Literal["hide", "flag"] = "hide"

    @classmethod
    def off(cls, unverified: Literal["hide", "flag"] = "hide") -> Signing:
        """Sign nothing, verify nothing (an open bus, or no credential)."""
        return cls(unverified=unverified)

    @property
    def signs(self) -> bool:
        return self.signer is not None

    @property
    def verifies(self) -> bool:
        return self.verifier is not None

    def sign_before_send(self, subject: str, headers: MutableMapping[str, str],
                         record: bytes) -> Callable[[], None] | None:
        """What a publisher calls right before each (re)send of ``record`` on ``subject``
        to sign ``headers`` afresh (None: this connection signs nothing)."""
        signer = self.signer
        return None if signer is None else functools.partial(signer.sign, subject, headers, record)

    @classmethod
    async def start(cls, nc: NATS, settings: Settings, credentials: Credentials | None) -> Signing:
        """The signing of a connection made with ``credentials`` (None: :meth:`off`).

        Publishes the credential's certificate (when it signs) and follows the key
        revocations (when it verifies). Trusted account keys: the issuer of
        ``credentials`` and ``security.trusted_accounts``.

        Raises:
            AuthenticationError: the credential's seed is not a user nkey seed.
        """
        sec = settings.security
        if credentials is None or not (sec.sign or sec.verify):
            return cls.off(sec.unverified)
        signer = Signer(credentials)
        issuer = credentials.claims.get("iss")
        trusted = {*sec.trusted_accounts, *([issuer] if isinstance(issuer, str) else [])}
        registry = KeyRegistry(nc, settings, trusted)
        verifier: Verifier | None = None
        try:
            steps: list[Coroutine[Any, Any, object]] = []
            if sec.sign:
                steps.append(registry.publish_own(signer))
            if sec.verify:
                steps.append(registry.start())
            await asyncio.gather(*steps)
            if sec.verify:
                verifier = Verifier(registry, max_skew=sec.max_clock_skew, cache_size=sec.verified_cache)
                registry.add_listener(verifier.forget)
        except BaseException:
            await registry.stop()
            raise
        return cls(signer if sec.sign else None, verifier, registry, sec.unverified)

    async def stop(self) -> None:
        """Stop following the revocations and the verifier's threads."""
        if self.verifier is not None:
            self.verifier.close()
        if self.registry is not None:
            await self.registry.stop()


def signing_of(nc: object) -> Signing:
    """The :class:`Signing` of a connection made by ``connect_nats`` (:meth:`Signing.off`
    for any other client)."""
    signing = getattr(nc, "signing", None)
    return signing if isinstance(signing, Signing) else Signing.off()
