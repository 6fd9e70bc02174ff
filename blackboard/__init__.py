"""blackboard: the server side of the distributed blackboard.

Wire schemas, subjects, stream setup, the board store, the worker and the CLI.
Agents use :mod:`agents_sdk`.
"""

from blackboard.client.board_store import BoardStore, Pipeline, Watch, WriteOp
from blackboard.client.streams import ensure_streams
from blackboard.protocol.entries import Change, Entry, Operation
from blackboard.protocol.errors import (
    BlackboardError,
    ConflictError,
    InvalidKeyError,
    InvalidPayloadError,
    NotConnectedError,
    NotFoundError,
    OperationTimeoutError,
    PayloadTooLargeError,
)
from blackboard.protocol.subjects import Subjects
from blackboard.settings import Settings

__version__ = "0.1.0"

__all__ = [
    "BlackboardError",
    "BoardStore",
    "Change",
    "ConflictError",
    "Entry",
    "InvalidKeyError",
    "InvalidPayloadError",
    "NotConnectedError",
    "NotFoundError",
    "Operation",
    "OperationTimeoutError",
    "PayloadTooLargeError",
    "Pipeline",
    "Settings",
    "Subjects",
    "Watch",
    "WriteOp",
    "__version__",
    "ensure_streams",
]
