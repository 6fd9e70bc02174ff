"""What the ingest loop consumes: a :class:`StreamHandler` says how one stream is persisted.

Each stream has its own persistence module holding its decoder, its rows and
its writer (:mod:`.entries`, :mod:`.memories`, :mod:`.messages`,
:mod:`.votes`); :mod:`.handlers` assembles the table the worker runs. This
module is beneath all of them, so none imports another.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from blackboard.security.verifier import Signed
from blackboard.worker.decode import RawMessage

__all__ = ["Conn", "StreamHandler"]

Conn = psycopg.AsyncConnection[Any]


@dataclass(frozen=True)
class StreamHandler:
    """How one stream is persisted.

    Attributes:
        name: consumer suffix (the durable is ``<worker.group>-<name>``).
        stream: JetStream stream name.
        filter_subject: subjects of the stream to consume.
        decode: pure decoder; raises ``InvalidPayloadError`` for a dead letter.
        write: stores decoded rows in the caller's transaction (idempotent on
            the stream sequence: ``ON CONFLICT DO NOTHING`` or forward-only upserts).
        embeds: the writer queues items for embedding (wakes the embedder).
        concurrent_writes: batches may be written by concurrent transactions
            (the writer converges whatever order they commit in); otherwise
            one batch at a time.
        signed: what a decoded row's signature must prove (pure): the record's
            author (or the kind of identity that writes it) and its canonical
            bytes for the verifier (:class:`~blackboard.security.verifier.Signed`);
            None for a message no identity writes (a delete marker the server
            wrote), stored unsigned. A handler without it is not verified.
    """

    name: str
    stream: str
    filter_subject: str
    decode: Callable[[RawMessage], Any]
    write: Callable[[Conn, Sequence[Any]], Awaitable[None]]
    embeds: bool = False
    concurrent_writes: bool = False
    signed: Callable[[RawMessage, Any], Signed | None] | None = None
