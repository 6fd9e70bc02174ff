"""The ``file`` store: local text files, chunked and indexed on a board, read-only.

``paths`` (files, or folders read recursively for the ``suffixes``) are chunked
with the knowledge chunker (:func:`~agents_sdk.memory.chunking.chunk_text`) and
stored as read-only ``knowledge`` memories on the store's board (tagged
``store:<name>``, ``metadata.store = <name>``, with the file's ``path``,
``sha256`` and the chunk's span and heading), so that the search service finds
them by keyword and by meaning. A search is ``agent.recall`` in that scope.

Re-indexing: :meth:`FileStore.refresh` compares the files with the index (size
and modification time, then content digest): a new file is chunked and stored,
a changed one re-chunked (its chunks are rewritten in place, those past its new
end forgotten), a deleted one forgotten. :meth:`FileStore.start` indexes the
files, then re-checks them every ``interval`` seconds in a background task
until :meth:`FileStore.close`. Chunk ids derive from the store, the path and
the chunk index. Searches answer only from the chunks of the files as
indexed now (their path and digest), so a chunk whose forget the worker has
not applied yet is never returned.

The index is kept on the board too, one manifest entry per file (section
``_files-<store name>``, key the path: its digest and chunk count), so that a
store started again (another run of the agent) re-sends only the files that
changed while it was stopped, and forgets the chunks of those deleted
meanwhile. It reads back only the manifest entries this agent wrote for paths
under its ``paths``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from agents_sdk.memory.chunking import TEXT_SUFFIXES, chunk_text
from agents_sdk.memory.layers import LayerHit, hit_of_memory, normalise_scores
from agents_sdk.memory.longterm import MemoryInput
from agents_sdk.memory.stores.base import StoreOptions, StoreSpec, store_layer, validate_store_name
from blackboard.protocol.errors import BlackboardError, NotFoundError, PermissionDeniedError
from blackboard.protocol.schemas.search import SearchMode

if TYPE_CHECKING:
    from agents_sdk.agent import Agent

__all__ = ["FileIndexReport", "FileOptions", "FileStore", "make_store"]

log = logging.getLogger("agents_sdk.memory.stores")


class FileOptions(StoreOptions):
    """Options of a ``file`` store."""

    #: Files and folders to index (relative ones from the config file's folder).
    paths: list[Path] = Field(min_length=1)
    #: Suffixes of the files indexed in folders (a file named in ``paths`` is always indexed).
    suffixes: list[str] = Field(default_factory=lambda: sorted(TEXT_SUFFIXES))
    #: The board holding the chunks.
    board: str = "knowledge"
    #: Chunk size in characters, and the overlap of consecutive chunks.
    chunk_size: int = Field(1200, ge=16)
    overlap: int = Field(200, ge=0)
    #: Most tokens of a chunk (the embedding model's window; None: characters only).
    max_tokens: int | None = Field(None, ge=16)
    #: Seconds between checks of the files (0: only at start and on refresh()).
    interval: float = Field(5.0, ge=0)
    #: How it searches.
    mode: SearchMode = "hybrid"
    #: Return from a refresh only once the worker has embedded the new chunks.
    wait_searchable: bool = True

    @model_validator(mode="after")
    def _overlap_fits(self) -> FileOptions:
        if self.overlap >= self.chunk_size:
            raise ValueError("overlap must be smaller than chunk_size")
        return self


@dataclass(frozen=True, slots=True)
class _Indexed:
    mtime_ns: int
    size: int
    sha256: str
    chunks: int


@dataclass
class FileIndexReport:
    """What a :meth:`FileStore.refresh` did (paths as indexed: absolute)."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # not UTF-8 text
    unchanged: int = 0
    chunks_written: int = 0
    chunks_forgotten: int = 0

    @property
    def changes(self) -> int:
        """Files added, changed or deleted."""
        return len(self.added) + len(self.changed) + len(self.deleted)


@dataclass(frozen=True, slots=True)
class _Read:
    path: str
    mtime_ns: int
    size: int
    data: bytes | None  # None: unchanged by size and time


class FileStore:
    """Local files indexed on a board (see the module doc)."""

    kind = "file"
    writable = False

    def __init__(self, agent: Agent, name: str, options: FileOptions, *, base_dir: Path | None = None) -> None:
        self.name = validate_store_name(name)
        self.options = options
        self.agent = agent
        base = base_dir or Path.cwd()
        self.paths = [(p if p.is_absolute() else base / p).resolve() for p in options.paths]
        self.suffixes = frozenset(s.lower() if s.startswith(".") else f".{s.lower()}" for s in options.suffixes)
        self._index: dict[str, _Indexed] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self._seeded = False
        #: What the last refresh did (None before the first).
        self.last_report: FileIndexReport | None = None
        #: The board section of the store's manifest entries.
        self.manifest_section = f"_files-{self.name}"

    def __repr__(self) -> str:
        return f"FileStore({self.name!r}, paths={[str(p) for p in self.paths]!r})"

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Index the files, then watch them every ``interval`` seconds (idempotent).

        Raises:
            the errors of :meth:`refresh` (the store is then not started).
        """
        if self._started:
            return
        if not self._seeded:
            await self._seed()
        await self.refresh()  # a failure leaves the store unstarted: the next start tries again
        self._started = True
        if self.options.interval > 0:
            self._task = asyncio.create_task(self._watch(), name=f"file-store-{self.name}")

    async def close(self) -> None:
        """Stop watching the files."""
        task, self._task = self._task, None
        self._started = False
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self) -> None:
        # close() clears _started before its cancel: a cancel lost in a refresh (Python 3.11's
        # wait_for returns a ready result instead of raising it) ends the loop at its next turn.
        while self._started:
            await asyncio.sleep(self.options.interval)
            try:
                await self.refresh()
            except BlackboardError as exc:  # the next round tries again
                log.warning("file store %s: re-indexing failed: %s", self.name, exc)

    # ------------------------------------------------------------------ indexing
    def _files(self) -> list[Path]:
        seen: dict[str, Path] = {}
        for path in self.paths:
            if path.is_dir():
                for p in path.rglob("*"):
                    if p.is_file() and p.suffix.lower() in self.suffixes:
                        seen.setdefault(str(p), p)
            elif path.is_file():
                seen.setdefault(str(path), path)
        return [seen[k] for k in sorted(seen)]

    def _scan(self) -> list[_Read]:
        """The files now, read where their size or time changed (runs in a thread)."""
        out = []
        for path in self._files():
            try:
                stat = path.stat()
                known = self._index.get(str(path))
                if known is not None and (known.mtime_ns, known.size) == (stat.st_mtime_ns, stat.st_size):
                    out.append(_Read(str(path), stat.st_mtime_ns, stat.st_size, None))
                else:
                    out.append(_Read(str(path), stat.st_mtime_ns, stat.st_size, path.read_bytes()))
            except FileNotFoundError:  # deleted while scanning: as if never seen
                continue
        return out

    def _under_paths(self, path: str) -> bool:
        file = Path(path)
        return any(file == root or file.is_relative_to(root) for root in self.paths)

    async def _seed(self) -> None:
        """The index as the board's manifest entries left it (times unknown: each file's
        digest is compared at the next refresh)."""
        board = self.agent.board(self.options.board)
        for entry in await board.entries(self.manifest_section):
            value = entry.value
            if entry.author != self.agent.id or not isinstance(value, Mapping) or not self._under_paths(entry.key):
                continue
            sha, chunks = value.get("sha256"), value.get("chunks")
            if isinstance(sha, str) and isinstance(chunks, int) and chunks >= 0:
                self._index.setdefault(entry.key, _Indexed(-1, -1, sha, chunks))
        self._seeded = True

    def chunk_id(self, path: str, index: int) -> str:
        """The memory id of chunk ``index`` of file ``path``."""
        digest = hashlib.sha1(f"{self.name}\0{path}".encode()).hexdigest()[:16]
        return f"fs-{digest}-{index}"

    async def refresh(self) -> FileIndexReport:
        """Bring the index up to date with the files (see the module doc).

        Raises:
            NotConnectedError, OperationTimeoutError: a write was not acknowledged.
            NotSearchableError: (``wait_searchable``) the chunks were not embedded in time.
        """
        async with self._lock:
            return await self._refresh()

    async def _refresh(self) -> FileIndexReport:
        report = FileIndexReport()
        files = await asyncio.to_thread(self._scan)
        board = self.options.board
        memories: list[MemoryInput] = []
        stale: list[str] = []
        updates: dict[str, _Indexed] = {}
        for read in files:
            known = self._index.get(read.path)
            if read.data is None:
                report.unchanged += 1
                continue
            digest = hashlib.sha256(read.data).hexdigest()
            if known is not None and known.sha256 == digest:
                updates[read.path] = replace(known, mtime_ns=read.mtime_ns, size=read.size)
                report.unchanged += 1
                continue
            try:
                text = read.data.decode("utf-8")
            except UnicodeDecodeError:  # not text (any more): as if it were not there
                report.skipped.append(read.path)
                continue
            chunks = chunk_text(text, self.options.chunk_size, self.options.overlap,
                                max_tokens=self.options.max_tokens)
            suffix = Path(read.path).suffix.lstrip(".").lower() or "text"
            for c in chunks:
                memories.append(MemoryInput(
                    text=c.text, kind="knowledge", read_only=True, board=board, source=read.path,
                    tags=(f"store:{self.name}", "file", suffix),
                    metadata={"store": self.name, "path": read.path, "chunk": c.index, "chunks": len(chunks),
                              "start": c.start, "end": c.end, "heading": c.heading, "sha256": digest},
                    id=self.chunk_id(read.path, c.index)))
            old = known.chunks if known is not None else 0
            stale.extend(self.chunk_id(read.path, i) for i in range(len(chunks), old))
            (report.changed if known is not None else report.added).append(read.path)
            report.chunks_written += len(chunks)
            updates[read.path] = _Indexed(read.mtime_ns, read.size, digest, len(chunks))
        present = {r.path for r in files} - set(report.skipped)
        for path, known in self._index.items():
            if path not in present:
                stale.extend(self.chunk_id(path, i) for i in range(known.chunks))
                report.deleted.append(path)
        if memories:
            await self.agent.remember_many(memories, wait="searchable" if self.options.wait_searchable else None)
        if stale:
            await self.agent.forget(stale, board=board)
            report.chunks_forgotten = len(stale)
        manifest = self.agent.board(board)
        written = set(report.added) | set(report.changed)
        for path in sorted(written):
            known = updates[path]
            await manifest.put(self.manifest_section, path, {"sha256": known.sha256, "chunks": known.chunks})
        for path in report.deleted:
            del self._index[path]
            with contextlib.suppress(NotFoundError):
                await manifest.delete(self.manifest_section, path)
        self._index.update(updates)
        self.last_report = report
        if report.changes:
            log.info("file store %s: %d added, %d changed, %d deleted", self.name, len(report.added),
                     len(report.changed), len(report.deleted))
        return report

    # ------------------------------------------------------------------ reads
    async def search(self, query: str, top_k: int, threshold: float) -> list[LayerHit]:
        """The chunks of the indexed files that best match ``query``.

        Raises:
            SearchError: no worker serves search. PermissionDeniedError: the board is not readable.
        """
        if not self._index:
            return []
        # Chunks of older versions may still be on the board for a moment: ask for a few more.
        hits = await self.agent.recall(query, board=self.options.board, metadata={"store": self.name},
                                       top_k=min(1000, top_k * 2 + 4), mode=self.options.mode)
        current = [h for h in hits if self._current(h.metadata)]
        scores = normalise_scores(current, self.options.mode)
        out = []
        for hit, score in zip(current, scores, strict=True):
            if score < threshold:
                continue
            layered = hit_of_memory(hit, layer=store_layer(self.name), score=score)
            out.append(replace(layered, kind="file", source=self.name,
                               provenance={**layered.provenance, "path": hit.metadata.get("path")}))
        return out[:top_k]

    def _current(self, metadata: Mapping[str, Any]) -> bool:
        known = self._index.get(str(metadata.get("path")))
        return known is not None and metadata.get("sha256") == known.sha256

    async def write(self, text: str, metadata: Mapping[str, Any] | None = None) -> str:
        """A file store is read-only.

        Raises:
            PermissionDeniedError: always.
        """
        raise PermissionDeniedError(f"file store {self.name!r} is read-only", f"write to store {self.name}")

    def size(self) -> int:
        """The chunks indexed."""
        return sum(known.chunks for known in self._index.values())

    @property
    def files(self) -> Sequence[str]:
        """The indexed files (absolute paths), sorted."""
        return sorted(self._index)


def make_store(spec: StoreSpec, agent: Agent) -> FileStore:
    """The registry's factory of ``file`` stores."""
    return FileStore(agent, spec.name, FileOptions.model_validate(dict(spec.options)), base_dir=spec.base_dir)
