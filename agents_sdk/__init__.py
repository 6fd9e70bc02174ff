"""agents_sdk: the agent-side SDK of the blackboard."""

from agents_sdk.agent import Agent
from agents_sdk.board import Board, BoardPipeline
from agents_sdk.longterm import MemoryInput
from agents_sdk.objects import ObjectRef, ObjectStore
from agents_sdk.view import View
from blackboard.entries import Change, Entry, Operation
from blackboard.errors import (
    BlackboardError,
    ConflictError,
    InvalidKeyError,
    InvalidPayloadError,
    NotConnectedError,
    NotFoundError,
    OperationTimeoutError,
    PayloadTooLargeError,
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
    "InvalidKeyError",
    "InvalidPayloadError",
    "MemoryInput",
    "NotConnectedError",
    "NotFoundError",
    "ObjectRef",
    "ObjectStore",
    "Operation",
    "OperationTimeoutError",
    "PayloadTooLargeError",
    "Settings",
    "View",
    "Watch",
    "WriteOp",
]
