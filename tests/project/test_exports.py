"""The public names of the packages are pinned: changing them is a deliberate act."""

from __future__ import annotations

import agents_sdk
import agents_sdk.memory
import agents_sdk.messaging
import blackboard
import blackboard.protocol.errors
import blackboard.search

AGENTS_SDK = {
    "Agent", "AgentMemory", "AuthenticationError", "Ballot", "BallotReceipt", "BlackboardError", "Board", "BoardPipeline", "BudgetExceededError",
    "Change", "ConfigurationError", "ConflictError", "ConsumerLimitError", "DeadlinePassedError", "Entry", "EntryHit", "EntryRevision", "Handler", "Inbox",
    "InboxBusyError", "IneligibleVoterError", "InvalidBallotError", "InvalidKeyError", "InvalidPayloadError",
    "LLMError", "LayerHit", "LimitExceededError", "MemoryDetail", "MemoryHit", "MemoryInput", "MemorySource", "Message", "MessagingError", "Messenger", "NoHandlerError", "NoResponderError",
    "NotConnectedError", "NotFoundError", "NotSearchableError", "ObjectRef", "ObjectStore", "Operation",
    "OperationTimeoutError",
    "Outcome", "OutcomeTimeoutError", "PermissionDeniedError", "PayloadTooLargeError", "Policy", "Proposal", "ProposalClosedError",
    "ProposalHandle", "ProposalNotFoundError", "RemoteError", "RequestTimeoutError", "SearchClient",
    "SearchError", "SearchFilters", "Sent", "Settings", "Subscriptions", "TallyCounts", "TransportError", "UnverifiedRecordError", "Verdict", "View",
    "VoteError", "VoteEvent",
    "VoteWatch", "Voting", "Watch", "WriteOp",
}

BLACKBOARD = {
    "BlackboardError", "BoardStore", "Change", "ConflictError", "Entry", "InvalidKeyError",
    "InvalidPayloadError", "NotConnectedError", "NotFoundError", "Operation", "OperationTimeoutError",
    "PayloadTooLargeError", "Pipeline", "Settings", "Subjects", "Watch", "WriteOp", "__version__",
    "ensure_streams",
}

MESSAGING = {
    "Handler", "Inbox", "InboxConsumer", "Message", "MessageTrust", "Messenger", "Requester", "Responder", "Sender",
    "Sent", "Subscriptions", "decode_envelope", "encode_envelope", "envelope_wire", "error_body", "new_envelope",
    "reply_envelope",
}

SEARCH = {
    "AccessRecorder", "BoardStats", "EntryHistory", "Fused", "SearchEngine", "SearchService", "TermStats", "Upkeep", "board_rows",
    "candidate_lexemes", "cut", "exact_scan", "fuse_convex", "fuse_hybrid", "neighbour_map", "rrf",
    "search_messages", "smooth_neighbours", "Reranker", "LLMReranker", "CrossEncoderReranker",
    "reranker_from_settings",
}


def test_agents_sdk_exports() -> None:
    assert set(agents_sdk.__all__) == AGENTS_SDK
    for name in agents_sdk.__all__:
        assert hasattr(agents_sdk, name), name


def test_blackboard_exports() -> None:
    assert set(blackboard.__all__) == BLACKBOARD
    for name in blackboard.__all__:
        assert hasattr(blackboard, name), name


def test_every_error_has_one_root() -> None:
    for name in blackboard.protocol.errors.__all__:
        cls = getattr(blackboard.protocol.errors, name)
        assert issubclass(cls, blackboard.protocol.errors.BlackboardError), name
    for name in agents_sdk.__all__:
        obj = getattr(agents_sdk, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, blackboard.protocol.errors.BlackboardError), name


#: Errors only the server side raises (worker, migrations, the dev stack): an agent never meets them.
SERVER_ONLY_ERRORS = {
    "DevStackError", "EmbeddingError", "EmbeddingModelUnavailableError", "EmbeddingRequestError",
    "MigrationError", "StorageError",
}


def test_every_error_an_sdk_user_can_meet_is_exported_from_agents_sdk() -> None:
    # BudgetExceededError (a prompt over budget), ConfigurationError (a bad NATS URL at connect)
    # and TransportError (the bus refused an operation) reached SDK users but were not exported.
    errors = set(blackboard.protocol.errors.__all__)
    assert SERVER_ONLY_ERRORS <= errors
    missing = sorted(errors - SERVER_ONLY_ERRORS - set(agents_sdk.__all__))
    assert not missing, f"errors an SDK user can meet, not exported from agents_sdk: {missing}"
    for name in errors - SERVER_ONLY_ERRORS:
        assert getattr(agents_sdk, name) is getattr(blackboard.protocol.errors, name), name


def test_memory_package_exports_resolve() -> None:
    for name in agents_sdk.memory.__all__:
        assert hasattr(agents_sdk.memory, name), name


def test_messaging_package_exports() -> None:
    assert set(agents_sdk.messaging.__all__) == MESSAGING
    for name in agents_sdk.messaging.__all__:
        assert hasattr(agents_sdk.messaging, name), name
    for name in ("Handler", "Inbox", "Message", "Messenger", "Sent", "Subscriptions"):
        assert getattr(agents_sdk, name) is getattr(agents_sdk.messaging, name), name


def test_search_package_exports() -> None:
    assert set(blackboard.search.__all__) == SEARCH
    for name in blackboard.search.__all__:
        assert hasattr(blackboard.search, name), name


MCP = {"AgentSource", "BlackboardMCP", "SingleAgent", "create_server", "run_stdio"}


def test_mcp_package_exports() -> None:
    import blackboard.apps.mcp

    assert set(blackboard.apps.mcp.__all__) == MCP
    for name in blackboard.apps.mcp.__all__:
        assert hasattr(blackboard.apps.mcp, name), name


def test_langgraph_package_exports() -> None:
    import agents_sdk.langgraph

    assert set(agents_sdk.langgraph.__all__) == {"BlackboardSaver", "BlackboardStore"}
    for name in agents_sdk.langgraph.__all__:
        assert hasattr(agents_sdk.langgraph, name), name


def test_people_commands_package_exports() -> None:
    import blackboard.apps.people

    assert set(blackboard.apps.people.__all__) == {"PEOPLE_COMMANDS", "add_people_commands"}
    for name in blackboard.apps.people.__all__:
        assert hasattr(blackboard.apps.people, name), name
