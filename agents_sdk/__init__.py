"""agents_sdk: the agent-side SDK of the blackboard."""

from agents_sdk.agent import Agent
from agents_sdk.board import Board, BoardPipeline
from agents_sdk.inbox import Inbox, Message
from agents_sdk.longterm import MemoryInput
from agents_sdk.messaging import Handler, Messenger, Sent, Subscriptions
from agents_sdk.objects import ObjectRef, ObjectStore
from agents_sdk.view import View
from blackboard.entries import Change, Entry, Operation
from blackboard.errors import (
    BlackboardError,
    ConflictError,
    InboxBusyError,
    InvalidKeyError,
    InvalidPayloadError,
    MessagingError,
    NoHandlerError,
    NoResponderError,
    NotConnectedError,
    NotFoundError,
    OperationTimeoutError,
    PayloadTooLargeError,
    RemoteError,
    RequestTimeoutError,
)
from blackboard.kv import Watch, WriteOp
from blackboard.settings import Settings

__all__ = [
    "Agent",
    "BlackboardError",
    "Board",
    "BoardPipeline",
    "Change",
    "ConflictError",
    "Entry",
    "Handler",
    "Inbox",
    "InboxBusyError",
    "InvalidKeyError",
    "InvalidPayloadError",
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
    "PayloadTooLargeError",
    "RemoteError",
    "RequestTimeoutError",
    "Sent",
    "Settings",
    "Subscriptions",
    "View",
    "Watch",
    "WriteOp",
]
