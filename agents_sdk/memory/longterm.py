"""Long-term memory, agent side: ``remember`` publishes to JetStream; the worker
persists and embeds; ``recall`` asks the search service.

``remember`` returns as soon as JetStream has acknowledged the memory: no
embedding or LLM call on the write path. With ``wait="searchable"`` it returns
only once a worker has stored and embedded it, so that every search mode finds
it (:mod:`agents_sdk.memory.searchable`). Memories and forgets are published
as their canonical encoding and signed by the agent's key (afresh before each
send); the worker verifies them at ingest (docs/security.md, "Signatures").
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from agents_sdk._args import sequence_arg
from agents_sdk.memory.searchable import DEFAULT_SEARCHABLE_TIMEOUT, WaitFor, wait_searchable
from agents_sdk.search import SearchClient
from blackboard.client.publisher import RETRYABLE, Ack
from blackboard.client.signing import signing_of
from blackboard.observability import tracing
from blackboard.protocol import codec
from blackboard.protocol.errors import InvalidPayloadError, PayloadTooLargeError
from blackboard.protocol.records import decode_memory, memory_wire, metadata_order_of
from blackboard.protocol.schemas import MemoryForget, validate_wire
from blackboard.protocol.schemas.memory import MemoryKind
from blackboard.protocol.subjects import Header, Subjects

if TYPE_CHECKING:
    from agents_sdk.context import AgentContext

__all__ = ["DEFAULT_MEMORY_BOARD", "LongTermMemory", "MemoryInput"]

DEFAULT_MEMORY_BOARD = "default"


@dataclass(frozen=True, slots=True)
class MemoryInput:
    """One memory for :meth:`LongTermMemory.remember_many`."""

    text: str
    kind: MemoryKind = "episodic"
    tags: Sequence[str] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    importance: float = 0.5
    board: str | None = None
    source: str | None = None
    read_only: bool = False
    id: str | None = None
    #: The subject key (what it is about); a newer memory on the same key of the board supersedes it.
    key: str | None = None
    #: When what it says happened (timezone-aware); its write time when None.
    occurred_at: datetime | None = None
    #: The writer's confidence in it, 0 to 1.
    confidence: float | None = None


class LongTermMemory:
    """Publishes :class:`~blackboard.protocol.schemas.MemoryRecord` messages for one agent."""

    def __init__(self, context: AgentContext) -> None:
        self._context = context
        self._agent_id = context.agent_id
        self._publisher = context.publisher
        self._max = context.settings.board.max_value_size
        #: What the publisher calls before each send to sign a memory's headers afresh.
        self._sign = signing_of(context.nc).sign_before_send
        self._search: SearchClient | None = None

    def _span(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """A remember's span attributes: the gen_ai memory conventions (docs/observability.md)."""
        return {"gen_ai.operation.name": "create_memory", "gen_ai.memory.id": kwargs.get("id"),
                "gen_ai.memory.store.id": kwargs.get("board") or DEFAULT_MEMORY_BOARD,
                "gen_ai.memory.type": kwargs.get("kind", "episodic"), "blackboard.agent": self._agent_id}

    def _searcher(self) -> SearchClient:
        if self._search is None:
            self._search = SearchClient(self._context.nc, self._context.settings, self._agent_id)
        return self._search

    async def wait_searchable(self, ids: Sequence[str], *, board: str | None = None,
                              timeout: float = DEFAULT_SEARCHABLE_TIMEOUT) -> None:
        """Return once a worker has stored and embedded every memory ``ids`` of ``board``
        (any version), so that every search mode finds them.

        Raises:
            NotSearchableError: some were not stored or not embedded after ``timeout`` seconds.
            PermissionDeniedError: this agent may not read the board.
            SearchError: no worker serves search, or it embeds nothing.
        """
        ids = [str(i) for i in sequence_arg(ids, "ids")]
        board = board or DEFAULT_MEMORY_BOARD
        await wait_searchable(self._searcher(), [(board, i, 0) for i in ids], timeout=timeout)

    @staticmethod
    def _check_wait(wait: WaitFor | None) -> None:
        if wait not in (None, "stored", "searchable"):
            raise InvalidPayloadError(f"wait must be 'stored', 'searchable' or None, not {wait!r}")

    async def _wait(self, wait: WaitFor | None, written: list[tuple[str, str, int]], timeout: float | None) -> None:
        if wait != "searchable":
            return
        await wait_searchable(self._searcher(), written,
                              timeout=DEFAULT_SEARCHABLE_TIMEOUT if timeout is None else timeout)

    def _prepare(self, m: MemoryInput) -> tuple[str, str, bytes, dict[str, str]]:
        if not isinstance(m.text, str) or not m.text.strip():
            raise InvalidPayloadError("a memory needs non-empty text")
        board = m.board or DEFAULT_MEMORY_BOARD
        subject = Subjects.memory(board, self._agent_id)
        memory_id = m.id or f"{self._agent_id}-{self._publisher.msg_id()}"
        # Through the schema's fast path (blackboard.protocol.records), which refuses what
        # MemoryRecord refuses: the worker reads exactly what is written here.
        record = memory_wire(
            id=memory_id, board=board, agent=self._agent_id, kind=m.kind, text=m.text, tags=m.tags,
            metadata=m.metadata, importance=m.importance, source=m.source, read_only=m.read_only,
            created_at=datetime.now(UTC), key=m.key, occurred_at=m.occurred_at, confidence=m.confidence,
            # the writer's key order, which the canonical encoding (sorted) would lose: the worker
            # embeds the metadata lines in it (docs/search.md, "What is embedded")
            metadata_order=metadata_order_of(m.metadata) if isinstance(m.metadata, Mapping) else None)
        memory_id = record["id"]  # as the schema made it (bytes given as the id are text now)
        # The canonical encoding (what the signature covers) is the payload; the record the
        # schema's fast path reads back from the map is equal to the schema's own
        # (tests/protocol/test_records.py), so these are the schema's canonical bytes.
        payload = decode_memory(record).canonical_bytes()
        if len(payload) > self._max:
            raise PayloadTooLargeError(len(payload), self._max)
        # The Msg-Id is the memory id and a digest of what it says (the record but its write
        # time): a re-send of this write, or the same memory remembered again, is deduplicated
        # within the duplicate window, while a new version written under the same id (a changed
        # knowledge chunk re-ingested, a rewrite) is not taken for a repeat and dropped.
        content = codec.encode({k: v for k, v in record.items() if k != "created_at"})
        digest = hashlib.sha256(content).hexdigest()[:16]
        return memory_id, subject, payload, {Header.MSG_ID.value: f"{memory_id}.{digest}"}

    @tracing.traced("remember", attributes=lambda self, text, **kw: self._span(kw))
    async def remember(self, text: str, *, kind: MemoryKind = "episodic", tags: Sequence[str] = (),
                       metadata: Mapping[str, Any] | None = None, importance: float = 0.5,
                       board: str | None = None, source: str | None = None, read_only: bool = False,
                       id: str | None = None, wait: WaitFor | None = None, timeout: float | None = None,
                       key: str | None = None, occurred_at: datetime | None = None,
                       confidence: float | None = None) -> str:
        """Store a long-term memory; returns its id once JetStream has it durably, or with
        ``wait="searchable"`` once a worker has also stored and embedded it (``timeout``
        seconds at most, default :data:`DEFAULT_SEARCHABLE_TIMEOUT`).

        ``key`` (what the memory is about), ``occurred_at`` (event time) and ``confidence``
        (0 to 1) make it a version-2 record (docs/memory-lifecycle.md).

        Raises:
            InvalidPayloadError, PayloadTooLargeError, InvalidKeyError: bad input.
            NotConnectedError, OperationTimeoutError: not acknowledged in time.
            NotSearchableError: (``wait="searchable"``) not stored or embedded in time; the
                memory is written all the same.
            PermissionDeniedError, SearchError: (``wait="searchable"``) the agent may not read
                the board, or no worker serves search or embeds.
        """
        self._check_wait(wait)
        memory_id, subject, payload, headers = self._prepare(MemoryInput(
            text, kind, tags, metadata or {}, importance, board, source, read_only, id, key, occurred_at,
            confidence))
        ack = await self._publisher.publish(subject, payload, headers, what=f"memory {memory_id!r}",
                                            sign=self._sign(subject, headers, payload))
        await self._wait(wait, [(board or DEFAULT_MEMORY_BOARD, memory_id, ack.seq)], timeout)
        return memory_id

    async def forget(self, ids: Sequence[str], *, board: str | None = None) -> None:
        """Ask the workers to delete memories (by id) of ``board``; returns once acknowledged.

        Raises:
            InvalidPayloadError: no ids.
        """
        ids = [str(i) for i in sequence_arg(ids, "ids")]
        if not ids:
            raise InvalidPayloadError("forget needs at least one memory id")
        board = board or DEFAULT_MEMORY_BOARD
        subject = Subjects.memory(board, self._agent_id)
        msg_id = self._publisher.msg_id()
        for start in range(0, len(ids), 1000):
            record = validate_wire(MemoryForget, {"board": board, "agent": self._agent_id,
                                                  "ids": ids[start:start + 1000], "created_at": datetime.now(UTC)})
            payload = record.canonical_bytes()
            headers = {Header.MSG_ID.value: f"{msg_id}-{start}"}
            await self._publisher.publish(subject, payload, headers, what=f"forget of {len(ids)} memories",
                                          sign=self._sign(subject, headers, payload))

    async def remember_many(self, memories: Iterable[MemoryInput], *, wait: WaitFor | None = None,
                            timeout: float | None = None) -> list[str]:
        """Store many memories pipelined (each acknowledged); returns their ids in order, with
        ``wait="searchable"`` once a worker has stored and embedded every one (see :meth:`remember`).

        Raises:
            the first error of :meth:`remember` (the other memories are still stored).
        """
        self._check_wait(wait)
        sent: list[tuple[str, str, bytes, dict[str, str], asyncio.Future[Ack] | None]] = []
        boards: list[str] = []
        for m in memories:
            memory_id, subject, payload, headers = self._prepare(m)
            boards.append(m.board or DEFAULT_MEMORY_BOARD)
            fut: asyncio.Future[Ack] | None
            try:
                fut = await self._publisher.send(subject, payload, headers, sign=self._sign(subject, headers, payload))
            except RETRYABLE:
                fut = None  # re-sent below through the retrying path
            sent.append((memory_id, subject, payload, headers, fut))
        # until every ack is in, or the rest should be sent again (silence, a reconnect)
        await self._publisher.wait_acks(f for *_, f in sent if f is not None)
        ids: list[str] = []
        written: list[tuple[str, str, int]] = []
        for (memory_id, subject, payload, headers, fut), board in zip(sent, boards, strict=True):
            if fut is None or not fut.done() or fut.cancelled() or fut.exception() is not None:
                if fut is not None and not fut.done():
                    self._publisher.forget(fut)
                # same Msg-Id (the memory id): deduplicated if the first copy landed
                ack = await self._publisher.publish(subject, payload, headers, what=f"memory {memory_id!r}",
                                                    sign=self._sign(subject, headers, payload))
            else:
                ack = fut.result()
            ids.append(memory_id)
            written.append((board, memory_id, ack.seq))
        await self._wait(wait, written, timeout)
        return ids
