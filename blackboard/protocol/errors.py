"""The one error tree. Every error the server side or the SDK raises is a
``BlackboardError``; NATS and psycopg errors are wrapped with ``raise ... from``.

::

    BlackboardError
    ├── ConfigurationError
    ├── AuthenticationError              (principal: no credential, a credential for another id, or refused by the server)
    ├── PermissionDeniedError            (operation: the server or the system service refused a right the identity lacks)
    ├── InvalidKeyError                  (key, reason)
    ├── InvalidPayloadError              (reason)
    │   ├── PayloadTooLargeError         (size, limit)
    │   ├── LimitExceededError           (limit, reason: beyond a protocol limit, docs/protocol.md "Limits")
    │   └── BudgetExceededError          (cost, budget, unit: prompt parts that must fit do not)
    ├── NotFoundError                    (key)
    ├── ConflictError                    (key, expected_revision, current_revision)
    ├── UnverifiedRecordError            (verdict, subject, revision, sequence, signer, record: its signature does not verify)
    ├── TransportError
    │   ├── NotConnectedError
    │   ├── OperationTimeoutError
    │   │   └── NotSearchableError       (unstored, unembedded, timeout: remember's wait="searchable" ran out)
    │   └── ConsumerLimitError           (stream, limit, setting: a view, watch or inbox found no consumer left)
    ├── MessagingError
    │   ├── NoResponderError             (to)
    │   │   └── NoHandlerError           (to, type: the agent listens, not for this type)
    │   ├── RequestTimeoutError          (to, timeout)
    │   ├── RemoteError                  (to, type, error, message: the handler raised)
    │   └── InboxBusyError               (agent: an inbox reader is already open)
    ├── VoteError
    │   ├── ProposalNotFoundError        (proposal_id)
    │   ├── ProposalClosedError          (proposal_id)
    │   ├── IneligibleVoterError         (proposal_id, voter)
    │   ├── DeadlinePassedError          (proposal_id)
    │   ├── InvalidBallotError           (proposal_id, reason)
    │   └── OutcomeTimeoutError          (proposal_id, timeout: not decided in time)
    ├── SearchError
    ├── EmbeddingError
    │   ├── EmbeddingModelUnavailableError (model, reason)
    │   └── EmbeddingRequestError        (status, attempts)
    ├── LLMError                         (chat model call failed)
    ├── StorageError                     (Postgres side)
    │   └── MigrationError               (version)
    └── DevStackError                    (embedded servers: port taken, binary missing)
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "BlackboardError",
    "BudgetExceededError",
    "ConfigurationError",
    "ConflictError",
    "ConsumerLimitError",
    "DeadlinePassedError",
    "DevStackError",
    "EmbeddingError",
    "EmbeddingModelUnavailableError",
    "EmbeddingRequestError",
    "InboxBusyError",
    "IneligibleVoterError",
    "InvalidBallotError",
    "InvalidKeyError",
    "InvalidPayloadError",
    "LLMError",
    "LimitExceededError",
    "MessagingError",
    "MigrationError",
    "NoHandlerError",
    "NoResponderError",
    "NotConnectedError",
    "NotFoundError",
    "NotSearchableError",
    "OperationTimeoutError",
    "OutcomeTimeoutError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "ProposalClosedError",
    "ProposalNotFoundError",
    "RemoteError",
    "RequestTimeoutError",
    "SearchError",
    "StorageError",
    "TransportError",
    "UnverifiedRecordError",
    "VoteError",
]


class BlackboardError(Exception):
    """Root of every error raised by blackboard and agents_sdk."""


class ConfigurationError(BlackboardError):
    """Settings are missing or inconsistent."""


class AuthenticationError(BlackboardError):
    """An identity could not be established: no credential was found for the agent id,
    the credential names another id, or the server refused it (unknown, expired or revoked).

    ``principal`` is the id that was asked for (None when not known).
    """

    def __init__(self, message: str, principal: str | None = None) -> None:
        self.principal = principal
        super().__init__(message)


class PermissionDeniedError(BlackboardError):
    """The server (or the system service) refused an operation the identity holds no right for.

    ``operation`` names what was refused, e.g. ``publish to bb.vote.b1.p1.outcome``.
    """

    def __init__(self, message: str, operation: str | None = None) -> None:
        self.operation = operation
        super().__init__(message)


class InvalidKeyError(BlackboardError, ValueError):
    """A board, section, key, agent id or subject token is not acceptable."""

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"invalid key {key!r}: {reason}")


class InvalidPayloadError(BlackboardError, ValueError):
    """A value or wire message cannot be encoded or decoded."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class PayloadTooLargeError(InvalidPayloadError):
    """An encoded entry is larger than the bucket's ``max_value_size``."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"payload of {size} bytes exceeds the limit of {limit} bytes")


class LimitExceededError(InvalidPayloadError):
    """A payload, or a value to be sent, goes beyond one of the protocol's limits
    (nesting depth, integer range, string or collection size, timestamp range
    or offset; ``docs/protocol.md``, "Limits").

    ``limit`` is the name of the limit in :mod:`blackboard.protocol.limits`
    (``MAX_DEPTH``, ``MAX_INT``, ``MAX_TIMESTAMP``, ...).
    """

    def __init__(self, limit: str, reason: str) -> None:
        self.limit = limit
        super().__init__(reason)


class BudgetExceededError(InvalidPayloadError):
    """The parts of a prompt that must be included cost more than its budget."""

    def __init__(self, cost: int, budget: int, unit: str) -> None:
        self.cost = cost
        self.budget = budget
        self.unit = unit
        super().__init__(f"required prompt parts cost {cost} {unit}, over the budget of {budget}")


class NotFoundError(BlackboardError, LookupError):
    """The key (or revision, object, proposal) does not exist or was deleted."""

    def __init__(self, key: str, message: str | None = None) -> None:
        self.key = key
        super().__init__(message or f"{key!r} not found")


class ConflictError(BlackboardError):
    """A compare-and-set failed: the key is not at the expected revision.

    ``current_revision`` is the key's latest revision (0 when absent), so a
    caller can re-read and retry.
    """

    def __init__(self, key: str, expected_revision: int | None, current_revision: int) -> None:
        self.key = key
        self.expected_revision = expected_revision
        self.current_revision = current_revision
        super().__init__(
            f"conflict on {key!r}: expected revision {expected_revision}, "
            f"current revision is {current_revision}"
        )


class UnverifiedRecordError(BlackboardError):
    """A record read strictly does not carry a valid signature (docs/security.md, "Signatures").

    ``verdict`` is why (a ``blackboard.protocol.signing.Verdict``: ``unsigned``,
    ``unknown_key``, ``bad_signature``, ``wrong_author``, ``stale``, ``revoked``,
    ``malformed``); ``subject`` the record's subject; ``revision`` (a board
    entry) or ``sequence`` (another stream's message) where it is stored;
    ``signer`` the principal of the signing key when known; ``record`` the
    decoded record (an ``Entry``, a message...) when it could be decoded.
    """

    def __init__(self, verdict: str, subject: str, *, revision: int | None = None,
                 sequence: int | None = None, signer: str | None = None, record: object = None) -> None:
        self.verdict = verdict
        self.subject = subject
        self.revision = revision
        self.sequence = sequence
        self.signer = signer
        self.record = record
        where = f" (revision {revision})" if revision is not None else \
            f" (sequence {sequence})" if sequence is not None else ""
        by = f" signed by {signer!r}" if signer else ""
        super().__init__(f"{subject}{where}{by} does not verify: {verdict}")


class TransportError(BlackboardError):
    """The message bus could not carry out the operation."""


class NotConnectedError(TransportError, ConnectionError):
    """Not connected to NATS (within the configured write timeout)."""


class OperationTimeoutError(TransportError, TimeoutError):
    """The server did not answer in time; the operation may or may not have happened."""


class NotSearchableError(OperationTimeoutError):
    """Memories were not searchable by every mode within the time waited for them
    (``remember(..., wait="searchable")``, ``wait_searchable``). The memories themselves are
    durably written; ``unstored`` lists the ids no worker had stored yet, ``unembedded`` those
    stored but without their vector yet (keyword search finds them, semantic search does not)."""

    def __init__(self, unstored: list[str], unembedded: list[str], timeout: float) -> None:
        self.unstored = unstored
        self.unembedded = unembedded
        self.timeout = timeout
        parts = []
        if unstored:
            parts.append(f"{len(unstored)} not stored by a worker yet ({_some(unstored)})")
        if unembedded:
            parts.append(f"{len(unembedded)} stored but not embedded yet ({_some(unembedded)})")
        super().__init__(f"memories not searchable after {timeout:g}s: {'; '.join(parts) or 'unknown'}")


def _some(ids: list[str], n: int = 3) -> str:
    shown = ", ".join(repr(i) for i in ids[:n])
    return shown + (f", ... {len(ids) - n} more" if len(ids) > n else "")


class ConsumerLimitError(TransportError):
    """The server refused a consumer: its consumer limit is reached (JetStream error 10026).

    Every live view, watch and inbox holds one consumer: a board's on the
    board bucket's stream (shared by every board), an inbox on the message
    stream (shared by every agent). ``limit`` is the number of consumers
    allowed when it is known (the account's; None for the stream's, which an
    agent may not read, or when nothing said), ``setting`` names what raises
    it: the stream's ``max_consumers``, or the account's JetStream
    ``max_consumers``. A closed view or watch does not free its consumer at
    once: the server removes it once it has been inactive for its inactive
    threshold (about 5 s; an agent may not delete consumers), so a new one
    may fit only then. An inbox's consumer is durable: closing it frees nothing.
    """

    def __init__(self, stream: str, limit: int | None, setting: str, what: str = "create a consumer") -> None:
        self.stream = stream
        self.limit = limit
        self.setting = setting
        count = f"{limit} consumers" if limit is not None else "consumers"
        super().__init__(f"cannot {what}: the server's limit of {count} on stream {stream} is reached "
                         f"(raise {setting}; each open view and watch, a closed one for ~5 s more, and each agent's "
                         "inbox hold one)")


class MessagingError(BlackboardError):
    """Base of agent-to-agent messaging errors."""


class NoResponderError(MessagingError):
    """A request found no agent listening for it."""

    def __init__(self, to: str) -> None:
        self.to = to
        super().__init__(f"no responder for requests to {to!r}")


class RequestTimeoutError(MessagingError, TimeoutError):
    """A request got no reply within its timeout."""

    def __init__(self, to: str, timeout: float) -> None:
        self.to = to
        self.timeout = timeout
        super().__init__(f"request to {to!r} got no reply within {timeout:g}s")


class NoHandlerError(NoResponderError):
    """The agent answers requests, but has no handler for this request type."""

    def __init__(self, to: str, type: str) -> None:
        self.to = to
        self.type = type
        MessagingError.__init__(self, f"agent {to!r} has no handler for requests of type {type!r}")


class RemoteError(MessagingError):
    """The request handler of the other agent raised; ``error`` is its class name."""

    def __init__(self, to: str, type: str, error: str, message: str) -> None:
        self.to = to
        self.type = type
        self.error = error
        self.message = message
        super().__init__(f"handler of {type!r} at {to!r} failed: {error}: {message}")


class InboxBusyError(MessagingError):
    """An inbox reader of this agent is already open in this process (one reader at a time)."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        super().__init__(f"the inbox of {agent!r} is already being read")


class VoteError(BlackboardError):
    """Base of consensus voting errors."""


class ProposalNotFoundError(VoteError, LookupError):
    def __init__(self, proposal_id: str) -> None:
        self.proposal_id = proposal_id
        super().__init__(f"unknown proposal {proposal_id!r}")


class ProposalClosedError(VoteError):
    def __init__(self, proposal_id: str) -> None:
        self.proposal_id = proposal_id
        super().__init__(f"proposal {proposal_id!r} is closed")


class IneligibleVoterError(VoteError):
    def __init__(self, proposal_id: str, voter: str) -> None:
        self.proposal_id = proposal_id
        self.voter = voter
        super().__init__(f"agent {voter!r} is not eligible to vote on {proposal_id!r}")


class DeadlinePassedError(VoteError):
    def __init__(self, proposal_id: str) -> None:
        self.proposal_id = proposal_id
        super().__init__(f"the deadline of proposal {proposal_id!r} has passed")


class InvalidBallotError(VoteError, ValueError):
    def __init__(self, proposal_id: str, reason: str) -> None:
        self.proposal_id = proposal_id
        self.reason = reason
        super().__init__(f"invalid ballot for {proposal_id!r}: {reason}")


class OutcomeTimeoutError(VoteError, TimeoutError):
    """A proposal had no committed outcome within the time waited for it."""

    def __init__(self, proposal_id: str, timeout: float) -> None:
        self.proposal_id = proposal_id
        self.timeout = timeout
        super().__init__(f"proposal {proposal_id!r} has no outcome after {timeout:g}s")


class SearchError(BlackboardError):
    """The search service failed or is not reachable."""


class EmbeddingError(BlackboardError):
    """An embedding provider failed (after its retries)."""


class EmbeddingModelUnavailableError(EmbeddingError):
    """The local model's files are not installed, or not the expected files."""

    def __init__(self, model: str, reason: str) -> None:
        self.model = model
        self.reason = reason
        super().__init__(f"embedding model {model!r} is unavailable: {reason}")


class EmbeddingRequestError(EmbeddingError):
    """An embeddings API request failed: not retryable, or out of retries.

    ``status`` is the last HTTP status (None when no response came back);
    ``attempts`` counts the requests made.
    """

    def __init__(self, message: str, *, status: int | None, attempts: int) -> None:
        self.status = status
        self.attempts = attempts
        super().__init__(f"{message} (status {status}, after {attempts} attempt(s))")


class LLMError(BlackboardError):
    """An OpenAI-compatible chat model call failed (after the client's retries)."""


class StorageError(BlackboardError):
    """PostgreSQL failed or is not reachable."""


class MigrationError(StorageError):
    """A schema migration failed, or an applied migration file has changed."""

    def __init__(self, version: int, reason: str) -> None:
        self.version = version
        self.reason = reason
        super().__init__(reason)


class DevStackError(BlackboardError):
    """The embedded dev servers could not be started (port taken, binary missing...)."""
