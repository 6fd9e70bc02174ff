"""Signing the messages an agent sends and verifying those it receives.

One :class:`MessageTrust` per agent's messaging, on its connection's
:class:`~blackboard.client.signing.Signing` (docs/security.md, "Signatures"):

* **sending**: every envelope (direct copy, broadcast, topic message, request,
  reply) is published as its canonical encoding (msgpack; a JSON envelope
  stays JSON and is signed over its canonical bytes) and signed for the subject
  it is published on, with its ``Nats-Msg-Id``; stored sends are signed again
  before each (re)send by the publisher;
* **receiving**: inbox deliveries (direct, broadcast, topic), requests and
  replies are verified with the connection's verifier: the signer's principal
  must be the envelope's ``sender``. What does not verify is hidden (counted in
  :attr:`MessageTrust.hidden`) or, with ``security.unverified = "flag"``,
  passed on with its verdict (``Message.verdict``). A connection that does not
  verify (an open bus) passes everything as ``unsigned``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from blackboard.client.publisher import Sign
from blackboard.client.signing import Signing
from blackboard.protocol.schemas import MessageEnvelope
from blackboard.protocol.signing import Verdict
from blackboard.protocol.subjects import MESSAGE_STREAM
from blackboard.security.verifier import Signed

__all__ = ["MessageTrust"]


class MessageTrust:
    """What one agent's messaging signs its sends with and verifies its deliveries with.

    Args:
        signing: the connection's signing (``signing_of(nc)``).
    """

    def __init__(self, signing: Signing) -> None:
        self.signing = signing
        self._signer = signing.signer
        self._verifier = signing.verifier
        self._flag = signing.unverified == "flag"
        #: Messages (inbox deliveries, requests, replies) hidden because they did not verify.
        self.hidden = 0

    @property
    def principal(self) -> str | None:
        """Who this connection signs as (None: it signs nothing)."""
        return None if self._signer is None else self._signer.principal

    def sign_now(self, subject: str, headers: dict[str, str], record: bytes) -> None:
        """Sign ``headers`` in place for a publish of ``record`` on ``subject`` (no-op when
        the connection does not sign). ``headers`` holds the ``Nats-Msg-Id``."""
        if self._signer is not None:
            self._signer.sign(subject, headers, record)

    def signer_of(self, subject: str, headers: dict[str, str], record: bytes) -> Sign | None:
        """What the publisher calls before each (re)send to sign ``headers`` afresh (None:
        the connection does not sign)."""
        return self.signing.sign_before_send(subject, headers, record)

    async def verdict(self, subject: str, headers: Mapping[str, str] | None, payload: bytes,
                      env: MessageEnvelope, *, stored_at: datetime | None = None,
                      sequence: int | None = None) -> Verdict:
        """The verdict on a received envelope (``unsigned`` when this connection does not
        verify): signed by its ``sender``, over ``subject``, in time.

        ``stored_at`` is the server's timestamp of a stored message (None: a request or
        reply, judged by this machine's clock); ``sequence`` its ``BB_MSG`` sequence (its
        verdict is then kept).
        """
        verifier = self._verifier
        if verifier is None:
            return Verdict.UNSIGNED
        return await verifier.verify(Signed(
            subject, headers, payload, stored_at=stored_at, author=env.sender, canonical=env.canonical_bytes,
            cache_key=None if sequence is None else (MESSAGE_STREAM, sequence)))

    def signer_principal(self, headers: Mapping[str, str] | None) -> str | None:
        """The principal of the key that signed a message, when known (for error reports)."""
        return None if self._verifier is None else self._verifier.signer_of(headers)

    def shows(self, verdict: Verdict) -> bool:
        """Whether a reader passes on a message of this verdict (else it hides it and counts it)."""
        if verdict is Verdict.VERIFIED or self._verifier is None or self._flag:
            return True
        self.hidden += 1
        return False
