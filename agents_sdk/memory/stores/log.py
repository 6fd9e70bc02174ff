"""The ``log`` store: an append-only log on a board, trimmed by age and count, read newest first.

Each write is a new board entry in the store's section (``log-<name>`` by
default) of its board, created under a fresh key that starts with the write
time (``<ms since the epoch, 13 digits>-<random>``), never overwriting one
(``board.create``): the log is shared by every agent attached to it and held
by JetStream like any board entry (the agents' rights on the board apply).
Its value is ``{"text", "metadata"}``.

Trimming: with ``max_age`` each entry is written with that time-to-live (the
server removes it) and older entries are left out of reads; with ``max_count``
each write then deletes the oldest keys beyond that many.

Retrieval is by recency only, without embeddings: a search returns the newest
entries, whatever the query, scored ``0.5 ** (age / half_life)`` (1.0 just
written, 0.5 after ``half_life`` seconds), so that ``similarity_threshold``
leaves out entries older than a chosen age and a log's hits rank against the
other stores' by freshness.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import Field

from agents_sdk.memory.layers import LayerHit
from agents_sdk.memory.stores.base import StoreOptions, StoreSpec, store_layer, validate_store_name
from blackboard.protocol.errors import NotFoundError

if TYPE_CHECKING:
    from agents_sdk.agent import Agent
    from blackboard.protocol.entries import Entry

__all__ = ["LogOptions", "LogStore", "make_store"]


class LogOptions(StoreOptions):
    """Options of a ``log`` store."""

    #: The board holding the log (default: ``agent_memory.long_term_board``).
    board: str | None = None
    #: Its section (default ``log-<store name>``).
    section: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    #: Seconds an entry is kept (None: no limit by age).
    max_age: float | None = Field(None, ge=1)
    #: Most entries kept (None: no limit by count).
    max_count: int | None = Field(None, ge=1)
    #: Seconds after which an entry's recency score halves.
    half_life: float = Field(3600.0, gt=0)


class LogStore:
    """An append-only log on a board (see the module doc)."""

    kind = "log"
    writable = True

    def __init__(self, agent: Agent, name: str, options: LogOptions | None = None) -> None:
        self.name = validate_store_name(name)
        self.options = options or LogOptions()
        self.agent = agent
        self.board = agent.board(self.options.board or agent.settings.agent_memory.long_term_board)
        self.section = self.options.section or f"log-{self.name}"
        self._size = 0

    def __repr__(self) -> str:
        return f"LogStore({self.name!r}, board={self.board.name!r}, section={self.section!r})"

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def write(self, text: str, metadata: Mapping[str, Any] | None = None) -> str:
        """Append ``text``; returns its key. Then trims the log to ``max_count``.

        Raises:
            InvalidPayloadError, PayloadTooLargeError: bad input.
            NotConnectedError, OperationTimeoutError: not acknowledged in time.
        """
        key = f"{time.time_ns() // 1_000_000:013d}-{secrets.token_hex(6)}"
        await self.board.create(self.section, key, {"text": text, "metadata": dict(metadata or {})},
                                ttl=self.options.max_age)
        await self.trim()
        return key

    async def trim(self) -> int:
        """Delete the oldest entries beyond ``max_count`` and those older than ``max_age``;
        returns how many were deleted."""
        keys = await self.board.keys(self.section)
        drop = set(keys[:-self.options.max_count] if self.options.max_count else ())
        if self.options.max_age is not None:
            cutoff = self._cutoff_key()
            drop.update(k for k in keys if k < cutoff)
        for key in sorted(drop):
            try:
                await self.board.delete(self.section, key)
            except NotFoundError:  # another writer trimmed it first
                continue
        self._size = len(keys) - len(drop)
        return len(drop)

    def _cutoff_key(self) -> str:
        assert self.options.max_age is not None
        return f"{int((time.time() - self.options.max_age) * 1000):013d}"

    async def entries(self) -> list[Entry]:
        """The log's live entries, newest first (those older than ``max_age`` left out)."""
        entries = await self.board.entries(self.section)
        if self.options.max_age is not None:
            cutoff = self._cutoff_key()
            entries = [e for e in entries if e.key >= cutoff]
        entries.sort(key=lambda e: e.revision, reverse=True)
        if self.options.max_count is not None:
            entries = entries[:self.options.max_count]
        self._size = len(entries)
        return entries

    async def search(self, query: str, top_k: int, threshold: float) -> list[LayerHit]:
        """The newest entries (the query is not read), scored by age (see the module doc)."""
        now = time.time()
        out: list[LayerHit] = []
        for entry in await self.entries():
            value = entry.value if isinstance(entry.value, Mapping) else {"text": str(entry.value)}
            written = int(entry.key.split("-", 1)[0]) / 1000 if entry.key[:13].isdigit() else now
            score = 0.5 ** (max(0.0, now - written) / self.options.half_life)
            if score < threshold:
                continue
            meta = value.get("metadata")
            out.append(LayerHit(
                layer=store_layer(self.name), id=entry.key, text=str(value.get("text", "")), score=score,
                kind="log", source=self.name,
                provenance={"agent": entry.author, "board": entry.board, "section": entry.section,
                            "revision": entry.revision},
                created_at=datetime.fromtimestamp(written, UTC),
                metadata=dict(meta) if isinstance(meta, Mapping) else {}))
            if len(out) >= top_k:
                break
        return out

    def size(self) -> int:
        """The entries the last read or trim found."""
        return self._size


def make_store(spec: StoreSpec, agent: Agent) -> LogStore:
    """The registry's factory of ``log`` stores."""
    return LogStore(agent, spec.name, LogOptions.model_validate(dict(spec.options)))
