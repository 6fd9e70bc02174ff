"""agents_sdk: the agent-side SDK of the blackboard."""

from agents_sdk.agent import Agent
from agents_sdk.board import Board, BoardPipeline
from agents_sdk.consensus import BallotReceipt, ProposalHandle, VoteEvent, VoteWatch, Voting
from agents_sdk.memory.longterm import MemoryInput
from agents_sdk.messaging import Handler, Inbox, Message, Messenger, Sent, Subscriptions
from agents_sdk.objects import ObjectRef, ObjectStore
from agents_sdk.search import SearchClient
from agents_sdk.view import View
from blackboard.client.board_store import Watch, WriteOp
from blackboard.protocol.entries import Change, Entry, Operation
from blackboard.protocol.errors import (
    BlackboardError,
    ConflictError,
    DeadlinePassedError,
    InboxBusyError,
    IneligibleVoterError,
    InvalidBallotError,
    InvalidKeyError,
    InvalidPayloadError,
    MessagingError,
    NoHandlerError,
    NoResponderError,
    NotConnectedError,
    NotFoundError,
    OperationTimeoutError,
    OutcomeTimeoutError,
    PayloadTooLargeError,
    ProposalClosedError,
    ProposalNotFoundError,
    RemoteError,
    RequestTimeoutError,
    SearchError,
    VoteError,
)
from blackboard.protocol.schemas import Ballot, Outcome, Policy, Proposal, TallyCounts
from blackboard.protocol.schemas.search import EntryHit, EntryRevision, MemoryHit, SearchFilters
from blackboard.settings import Settings

__all__ = [
    "Agent",
    "Ballot",
    "BallotReceipt",
    "BlackboardError",
    "Board",
    "BoardPipeline",
    "Change",
    "ConflictError",
    "DeadlinePassedError",
    "Entry",
    "EntryHit",
    "EntryRevision",
    "Handler",
    "Inbox",
    "InboxBusyError",
    "IneligibleVoterError",
    "InvalidBallotError",
    "InvalidKeyError",
    "InvalidPayloadError",
    "MemoryHit",
    "MemoryInput",
    "Message",
    "MessagingError",
    "Messenger",
    "NoHandlerError",
    "NoResponderError",
    "NotConnectedError",
    "NotFoundError",
    "ObjectRef",
    "ObjectStore",
    "Operation",
    "OperationTimeoutError",
    "Outcome",
    "OutcomeTimeoutError",
    "PayloadTooLargeError",
    "Policy",
    "Proposal",
    "ProposalClosedError",
    "ProposalHandle",
    "ProposalNotFoundError",
    "RemoteError",
    "RequestTimeoutError",
    "SearchClient",
    "SearchError",
    "SearchFilters",
    "Sent",
    "Settings",
    "Subscriptions",
    "TallyCounts",
    "View",
    "VoteError",
    "VoteEvent",
    "VoteWatch",
    "Voting",
    "Watch",
    "WriteOp",
]
