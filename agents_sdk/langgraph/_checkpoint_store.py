"""The board side of :class:`~agents_sdk.langgraph.BlackboardSaver`: writing and reading
checkpoints, their values and pending writes, and the index, on the agent's event loop (the
saver's async and sync methods call these; deleting, copying and pruning are in
:mod:`agents_sdk.langgraph._checkpoint_admin`). Layout: :mod:`agents_sdk.langgraph._checkpoint_layout`.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import random
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from agents_sdk.agent import Agent
from agents_sdk.board import Board
from agents_sdk.langgraph._checkpoint_layout import (
    FORMAT,
    THREADS_SECTION,
    Descending,
    NewestFirst,
    Page,
    StoredWrite,
    ThreadSections,
    blob_key,
    head_key,
    merge_writes,
    page_key,
    parse_page_key,
    record_key,
    thread_id_of,
    write_index,
    writes_key,
)
from agents_sdk.objects import OBJECT_REF_KEY, ObjectRef, object_name
from blackboard.protocol.entries import Entry
from blackboard.protocol.errors import (
    BlackboardError,
    ConflictError,
    InvalidKeyError,
    InvalidPayloadError,
    NotFoundError,
    PayloadTooLargeError,
)

__all__ = ["CheckpointStore", "thread_of"]

#: Compare-and-set attempts of one index append (or merge of writes) before giving up.
_APPEND_RETRIES = 1000
#: Index pages remembered for the next put of their thread (the threads this saver writes at once).
_WRITTEN_PAGES = 1024
#: Checkpoints a listing reads at once: first (or the limit, if smaller), then doubling up to the most.
_FIRST_BATCH = 4
_MAX_BATCH = 32
#: A stored write's bytes besides its value (ids, channel, task path), as counted for the budget.
_WRITE_OVERHEAD = 512

_MISSING: Any = object()
_Item = tuple[str, str, str, str | None]  # thread id, namespace, checkpoint id, run id


def _configurable(config: Any) -> Mapping[str, Any]:
    configurable = config.get("configurable") if isinstance(config, Mapping) else None
    if not isinstance(configurable, Mapping):
        raise InvalidKeyError(repr(config)[:64], "a checkpoint config needs a 'configurable' mapping")
    return configurable


def thread_of(config: Any) -> tuple[str, str | None, str | None]:
    """``(thread_id, checkpoint_ns or None, checkpoint_id or None)`` of a config.

    Raises:
        InvalidKeyError: no thread id, or a namespace or checkpoint id that is not a string.
    """
    conf = _configurable(config)
    if "thread_id" not in conf:
        raise InvalidKeyError(repr(config)[:64], "a checkpoint config needs configurable.thread_id")
    ns = conf.get("checkpoint_ns")
    if ns is not None and not isinstance(ns, str):
        raise InvalidKeyError(repr(ns)[:64], "checkpoint_ns must be a string")
    checkpoint_id = conf.get("checkpoint_id")
    if checkpoint_id is not None and not isinstance(checkpoint_id, str):
        raise InvalidKeyError(repr(checkpoint_id)[:64], "checkpoint_id must be a string")
    return thread_id_of(conf["thread_id"]), ns, checkpoint_id or None


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}


class CheckpointStore:
    """Checkpoints of LangGraph threads on one board, through one agent (async, on its loop):
    writing and reading them (:class:`~agents_sdk.langgraph._checkpoint_admin.CheckpointBoard`
    adds deleting, copying and pruning).

    Args:
        agent: the connected agent.
        board: the board.
        serde: the saver's serializer.
        inline_limit: serialised values larger than this go to the object store.
        budget: the bytes a checkpoint's writes may take in one entry.
    """

    def __init__(self, agent: Agent, board: Board, serde: SerializerProtocol, inline_limit: int,
                 budget: int) -> None:
        self.agent = agent
        self.board = board
        self.serde = serde
        self.inline_limit = inline_limit
        self.budget = budget
        #: The newest index page last seen per (thread token, namespace): read with the head.
        self._newest_page: dict[tuple[str, str], int] = {}
        #: The index page this saver last wrote per (thread token, namespace), with its
        #: revision: the next put appends to it by compare-and-set without reading it
        #: again (one round trip instead of two); a conflict means another writer (or a
        #: delete) came in between, and the put reads the index as it is.
        self._written_pages: OrderedDict[tuple[str, str], tuple[Page, int]] = OrderedDict()

    # ------------------------------------------------------------ values
    async def _get(self, section: str, key: str) -> Entry | None:
        try:
            return await self.board.get(section, key)
        except NotFoundError:
            return None

    async def _payload(self, th: ThreadSections, section: str, key: str, typed: tuple[str, Any], *,
                       to_object: bool = False) -> dict[str, Any]:
        """A serialised value as stored: inline, or in the object store when large."""
        kind, data = typed
        data = b"" if data is None else bytes(data)
        if len(data) <= self.inline_limit and not to_object:
            return {"t": kind, "d": data}
        name = object_name(self.board.name, section, key, hashlib.sha256(data).hexdigest())
        ref = await self.agent.objects.put(name, data, content_type="application/x-langgraph-" + kind)
        await self.board.put(th.objects, name, {"v": FORMAT, "thread": th.thread_id, "section": section,
                                                "key": key})
        return {"t": kind, "o": ref.to_value()[OBJECT_REF_KEY]}

    async def _load(self, payload: Any, what: str) -> Any:
        if not isinstance(payload, Mapping) or not isinstance(payload.get("t"), str):
            raise InvalidPayloadError(f"{what}: not a stored value")
        if "o" in payload:
            ref = ObjectRef.from_value({OBJECT_REF_KEY: payload["o"]})
            assert ref is not None
            data = await self.agent.objects.fetch(ref)
        elif isinstance(payload.get("d"), bytes):
            data = payload["d"]
        else:
            raise InvalidPayloadError(f"{what}: a stored value holds no bytes")
        return self.serde.loads_typed((payload["t"], data))

    def _record(self, entry: Entry, thread_id: str, ns: str, checkpoint_id: str | None) -> Mapping[str, Any]:
        value = entry.value
        if (not isinstance(value, Mapping) or value.get("thread") != thread_id or value.get("ns") != ns
                or not isinstance(value.get("id"), str) or (checkpoint_id is not None and value["id"] != checkpoint_id)):
            raise InvalidPayloadError(f"{entry.section}/{entry.key} is not the checkpoint record it should be "
                                      f"(thread {thread_id!r}, namespace {ns!r}, id {checkpoint_id!r})")
        return value

    # ------------------------------------------------------------ put
    async def _register(self, th: ThreadSections) -> None:
        """Enter the thread in the registry (``list(None)`` and ``delete_for_runs`` walk it)."""
        try:
            await self.board.create(THREADS_SECTION, th.token, {"v": FORMAT, "thread": th.thread_id})
        except ConflictError:
            pass

    async def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        thread_id, ns, parent_id = thread_of(config)
        ns = ns or ""
        if not isinstance(checkpoint, Mapping) or not isinstance(checkpoint.get("id"), str) or not checkpoint["id"]:
            raise InvalidPayloadError("a checkpoint needs a non-empty string 'id'")
        checkpoint_id = checkpoint["id"]
        th = ThreadSections.of(thread_id)
        stripped = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        values = checkpoint.get("channel_values") or {}

        meta = get_serializable_checkpoint_metadata(config, metadata)
        run_id = str(meta["run_id"]) if meta.get("run_id") is not None else None
        key = record_key(ns, checkpoint_id)

        async def blob(channel: str, version: Any) -> tuple[str, dict[str, Any]]:
            typed = self.serde.dumps_typed(values[channel]) if channel in values else ("empty", b"")
            stored = await self._payload(th, th.blobs, blob_key(ns, channel, version), typed)
            return blob_key(ns, channel, version), {"v": FORMAT, "thread": thread_id, "ns": ns, "channel": channel,
                                                    "version": version, "value": stored}

        # Serialised first (large values go to the object store), then written in one pipeline,
        # in order: the values, the record that names them, and (when this saver wrote the
        # index's newest page and it has room) the id appended to that page by compare-and-set.
        # One stream and one connection keep that order, so the record is found by id only
        # after its values, and through the index only after the record.
        blobs, checkpoint_payload, meta_payload = await asyncio.gather(
            asyncio.gather(*(blob(channel, version) for channel, version in new_versions.items())),
            self._payload(th, th.checkpoints, key, self.serde.dumps_typed(stripped)),
            self._payload(th, th.checkpoints, key, self.serde.dumps_typed(meta)))
        record = {"v": FORMAT, "thread": thread_id, "ns": ns, "id": checkpoint_id, "parent": parent_id,
                  "run_id": run_id, "checkpoint": checkpoint_payload, "metadata": meta_payload}
        grown = self._grown_written_page(th, ns, checkpoint_id, run_id)
        pipe = self.board.pipeline()
        writes = [await pipe.put(th.blobs, blob_key_, value) for blob_key_, value in blobs]
        writes.append(await pipe.put(th.checkpoints, key, record))
        appended = (await pipe.put(th.index, page_key(ns, grown[0].number), grown[0].to_value(),
                                   expected_revision=grown[1]) if grown is not None else None)
        try:
            await pipe.flush()
        except BlackboardError:
            if not all(f.done() for f in writes) or (appended is not None and not appended.done()):
                raise
        for f in writes:
            f.result()  # the values' and the record's own errors
        if grown is not None and appended is not None:
            failed = appended.exception()
            if failed is None:
                self._wrote_page(th, grown[0], appended.result())
                return _config(thread_id, ns, checkpoint_id)
            if not isinstance(failed, ConflictError):
                raise failed
            # another writer (or a delete) came in between: read the index as it is
        await self._append(th, ns, checkpoint_id, run_id)
        return _config(thread_id, ns, checkpoint_id)

    async def _page(self, th: ThreadSections, ns: str, number: int) -> tuple[Page, int] | None:
        entry = await self._get(th.index, page_key(ns, number))
        if entry is None:
            return None
        return Page.from_value(entry.value, thread_id=th.thread_id, checkpoint_ns=ns, number=number), entry.revision

    async def _head(self, th: ThreadSections, ns: str) -> tuple[int, int | None]:
        """The newest page number and the head's revision (0 and None: no head yet)."""
        entry = await self._get(th.index, head_key(ns))
        if entry is None:
            return 0, None
        page = entry.value.get("page") if isinstance(entry.value, Mapping) else None
        if not isinstance(page, int) or page < 0:
            raise InvalidPayloadError(f"malformed index head {th.index}/{head_key(ns)}")
        return page, entry.revision

    async def _floor_below(self, th: ThreadSections, ns: str, number: int) -> str | None:
        for q in range(number - 1, -1, -1):
            found = await self._page(th, ns, q)
            if found is not None:
                return found[0].top()
        return None

    def _wrote_page(self, th: ThreadSections, page: Page, revision: int) -> None:
        slot = (th.token, page.checkpoint_ns)
        self._written_pages[slot] = (page, revision)
        self._written_pages.move_to_end(slot)
        while len(self._written_pages) > _WRITTEN_PAGES:
            self._written_pages.popitem(last=False)

    def _grown_written_page(self, th: ThreadSections, ns: str, checkpoint_id: str,
                            run_id: str | None) -> tuple[Page, int] | None:
        """The page this saver last wrote with ``checkpoint_id`` appended, and the revision it
        wrote (to append at by compare-and-set), or None: no such page, full, or holding it."""
        cached = self._written_pages.pop((th.token, ns), None)
        if cached is None or cached[0].full or cached[0].holds(checkpoint_id):
            return None
        page, rev = cached
        return Page(page.thread_id, page.checkpoint_ns, page.number, page.floor,
                    [*page.ids, (checkpoint_id, run_id)]), rev

    async def _append(self, th: ThreadSections, ns: str, checkpoint_id: str, run_id: str | None) -> None:
        """Add a checkpoint id to the namespace's newest index page, by compare-and-set."""
        last: ConflictError | None = None
        for attempt in range(_APPEND_RETRIES):
            hint = self._newest_page.get((th.token, ns), 0)
            (number, head_rev), found = await asyncio.gather(self._head(th, ns), self._page(th, ns, hint))
            if number != hint:
                found = await self._page(th, ns, number)
                self._newest_page[(th.token, ns)] = number
            try:
                if found is None:
                    if number == 0:
                        await self._register(th)
                    page = Page(th.thread_id, ns, number, await self._floor_below(th, ns, number),
                                [(checkpoint_id, run_id)])
                    self._wrote_page(th, page, await self.board.create(th.index, page_key(ns, number),
                                                                       page.to_value()))
                    return
                page, rev = found
                if page.holds(checkpoint_id):
                    return
                if not page.full:
                    page.ids.append((checkpoint_id, run_id))
                    self._wrote_page(th, page, await self.board.update(th.index, page_key(ns, number),
                                                                       page.to_value(), expected_revision=rev))
                    return
                head = {"v": FORMAT, "thread": th.thread_id, "ns": ns, "page": number + 1}
                if head_rev is None:
                    await self.board.create(th.index, head_key(ns), head)
                else:
                    await self.board.update(th.index, head_key(ns), head, expected_revision=head_rev)
            except ConflictError as exc:
                last = exc
                await asyncio.sleep(random.uniform(0, min(0.001 * (attempt + 1), 0.05)))
        assert last is not None
        raise last

    async def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str) -> None:
        thread_id, ns, checkpoint_id = thread_of(config)
        ns = ns or ""
        if checkpoint_id is None:
            raise InvalidKeyError(repr(config)[:64], "put_writes needs the config of a checkpoint (checkpoint_id)")
        if not isinstance(task_id, str) or not isinstance(task_path, str):
            raise InvalidKeyError(repr(task_id)[:64], "task_id and task_path must be strings")
        th = ThreadSections.of(thread_id)
        key = writes_key(ns, checkpoint_id)
        new: list[StoredWrite] = []
        for position, (channel, value) in enumerate(writes):
            if not isinstance(channel, str):
                raise InvalidKeyError(repr(channel)[:64], "a write's channel must be a string")
            payload = await self._payload(th, th.writes, key, self.serde.dumps_typed(value))
            new.append(StoredWrite(task_id, write_index(channel, position), channel, task_path, payload))

        async def merge(current: Any) -> dict[str, Any]:
            existing: list[StoredWrite] = [] if current is None else [StoredWrite.from_value(w) for w in current.get("writes", ())]
            merged = merge_writes(existing, new)
            if _size(merged) > self.budget:
                for i, w in enumerate(new):  # this task's values move to the object store
                    if "d" in w.value:
                        moved = await self._payload(th, th.writes, key, (w.value["t"], w.value["d"]), to_object=True)
                        new[i] = StoredWrite(w.task_id, w.idx, w.channel, w.task_path, moved)
                merged = merge_writes(existing, new)
                if _size(merged) > self.budget:
                    raise PayloadTooLargeError(_size(merged), self.budget)
            return {"v": FORMAT, "thread": thread_id, "ns": ns, "id": checkpoint_id,
                    "writes": [w.to_value() for w in merged]}

        await self.board.modify(th.writes, key, merge, retries=_APPEND_RETRIES)

    # ------------------------------------------------------------ get / list
    async def _load_tuple(self, th: ThreadSections, ns: str, record: Mapping[str, Any]) -> CheckpointTuple:
        checkpoint_id = record["id"]
        what = f"checkpoint {checkpoint_id!r} of thread {th.thread_id!r}"
        checkpoint = await self._load(record.get("checkpoint"), what)
        metadata = await self._load(record.get("metadata"), what)
        versions = checkpoint.get("channel_versions") or {}

        async def value(channel: str, version: Any) -> tuple[str, Any]:
            entry = await self._get(th.blobs, blob_key(ns, channel, version))
            if entry is None or not isinstance(entry.value, Mapping):
                return channel, _MISSING
            stored = entry.value.get("value")
            if isinstance(stored, Mapping) and stored.get("t") == "empty":
                return channel, _MISSING
            return channel, await self._load(stored, f"channel {channel!r} of {what}")

        loaded, writes = await asyncio.gather(asyncio.gather(*(value(c, v) for c, v in versions.items())),
                                              self._pending_writes(th, ns, checkpoint_id))
        parent = record.get("parent")
        full = cast(Checkpoint, {**checkpoint, "channel_values": {c: v for c, v in loaded if v is not _MISSING}})
        return CheckpointTuple(
            config=_config(th.thread_id, ns, checkpoint_id),
            checkpoint=full,
            metadata=metadata,
            parent_config=_config(th.thread_id, ns, parent) if isinstance(parent, str) and parent else None,
            pending_writes=writes,
        )

    async def _pending_writes(self, th: ThreadSections, ns: str, checkpoint_id: str) -> list[tuple[str, str, Any]]:
        entry = await self._get(th.writes, writes_key(ns, checkpoint_id))
        if entry is None:
            return []
        if not isinstance(entry.value, Mapping) or entry.value.get("id") != checkpoint_id:
            raise InvalidPayloadError(f"{entry.section}/{entry.key} is not the writes of checkpoint {checkpoint_id!r}")
        stored = sorted((StoredWrite.from_value(w) for w in entry.value.get("writes", ())), key=StoredWrite.sort_key)
        return [(w.task_id, w.channel, await self._load(w.value, f"a write of checkpoint {checkpoint_id!r}"))
                for w in stored]

    async def _record_of(self, th: ThreadSections, ns: str, checkpoint_id: str) -> Mapping[str, Any] | None:
        entry = await self._get(th.checkpoints, record_key(ns, checkpoint_id))
        return None if entry is None else self._record(entry, th.thread_id, ns, checkpoint_id)

    async def _record_entry(self, config: RunnableConfig) -> tuple[ThreadSections, str, Entry] | None:
        """The record entry of the config's checkpoint (by id, else the namespace's newest)."""
        thread_id, ns, checkpoint_id = thread_of(config)
        ns = ns or ""
        th = ThreadSections.of(thread_id)
        candidates: AsyncIterator[_Item] = (_one(thread_id, ns, checkpoint_id, None) if checkpoint_id is not None
                                            else self._newest_first(th, ns, None))
        async for _, _, candidate, _ in candidates:
            entry = await self._get(th.checkpoints, record_key(ns, candidate))
            if entry is not None:
                self._record(entry, thread_id, ns, candidate)
                return th, ns, entry
        return None

    async def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found = await self._record_entry(config)
        if found is None:
            return None
        th, ns, entry = found
        return await self._load_tuple(th, ns, entry.value)

    async def author(self, config: RunnableConfig) -> str | None:
        found = await self._record_entry(config)
        return None if found is None else found[2].author

    async def _newest_first(self, th: ThreadSections, ns: str, before: str | None) -> AsyncIterator[_Item]:
        """The namespace's checkpoint ids from its index, newest first (the head and the newest
        page last seen are read at once: one round trip for a thread of one page)."""
        hint = self._newest_page.get((th.token, ns), 0)
        (newest, _), hinted = await asyncio.gather(self._head(th, ns), self._page(th, ns, hint))
        self._newest_page[(th.token, ns)] = newest
        order = NewestFirst(before)
        for number in range(newest, -1, -1):
            found = hinted if number == hint else await self._page(th, ns, number)
            order.add(None if found is None else found[0])
            for checkpoint_id, run_id in order.ready():
                yield th.thread_id, ns, checkpoint_id, run_id
        for checkpoint_id, run_id in order.rest():
            yield th.thread_id, ns, checkpoint_id, run_id

    async def _namespaces(self, th: ThreadSections) -> list[str]:
        """The namespaces of a thread (those with an index)."""
        lowest: dict[str, int] = {}
        for key in await self.board.keys(th.index):
            parsed = parse_page_key(key)
            if parsed is not None:
                token, number = parsed
                lowest[token] = min(number, lowest.get(token, number))
        names: list[str] = []
        for token, number in lowest.items():
            key = f"p-{token}-{number}"
            entry = await self._get(th.index, key)
            ns = entry.value.get("ns") if entry is not None and isinstance(entry.value, Mapping) else None
            if isinstance(ns, str) and page_key(ns, number) == key:
                names.append(ns)
        return sorted(names)

    async def _threads(self) -> list[ThreadSections]:
        threads: list[ThreadSections] = []
        for token in await self.board.keys(THREADS_SECTION):
            entry = await self._get(THREADS_SECTION, token)
            thread_id = entry.value.get("thread") if entry is not None and isinstance(entry.value, Mapping) else None
            if isinstance(thread_id, str) and ThreadSections.of(thread_id).token == token:
                threads.append(ThreadSections.of(thread_id))
        return threads

    async def list_tuples(self, config: RunnableConfig | None, filter: Mapping[str, Any] | None,
                          before: RunnableConfig | None, limit: int | None) -> AsyncGenerator[CheckpointTuple, None]:
        if limit is not None and limit <= 0:
            return
        before_id = thread_of(before)[2] if before is not None else None
        if config is None:
            threads, ns_wanted, exact = await self._threads(), None, None
        else:
            thread_id, ns_wanted, exact = thread_of(config)
            threads = [ThreadSections.of(thread_id)]
        streams: list[AsyncIterator[_Item]] = []
        for th in threads:
            for ns in [ns_wanted] if ns_wanted is not None else await self._namespaces(th):
                if exact is not None:
                    streams.append(_one(th.thread_id, ns, exact, before_id))
                else:
                    streams.append(self._newest_first(th, ns, before_id))
        by_token = {th.thread_id: th for th in threads}
        wanted = limit
        batch: list[_Item] = []
        size = min(limit or _FIRST_BATCH, _FIRST_BATCH)
        merged = _merge(streams)
        while wanted is None or wanted > 0:
            # The next few checkpoints are read at once (records, then values and writes).
            batch = [item async for item in _take(merged, size)]
            if not batch:
                return
            size = min(size * 2, _MAX_BATCH)
            kept = await asyncio.gather(*(self._listed(by_token[t], ns, i, filter) for t, ns, i, _ in batch))
            chosen = [(by_token[t], ns, record) for (t, ns, _, _), record in zip(batch, kept, strict=True)
                      if record is not None][:wanted]
            for tup in await asyncio.gather(*(self._load_tuple(th, ns, record) for th, ns, record in chosen)):
                yield tup
            if wanted is not None:
                wanted -= len(chosen)

    async def _listed(self, th: ThreadSections, ns: str, checkpoint_id: str,
                      filter: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """A checkpoint's record if it exists and its metadata holds every filter item."""
        record = await self._record_of(th, ns, checkpoint_id)
        if record is None or not filter:
            return record
        metadata = await self._load(record.get("metadata"), f"checkpoint {checkpoint_id!r}")
        return record if all(metadata.get(k) == v for k, v in filter.items()) else None


def _size(writes: Sequence[StoredWrite]) -> int:
    """What a checkpoint's writes take in an entry, roughly (inline values and overhead)."""
    return sum(len(w.value.get("d") or b"") + _WRITE_OVERHEAD for w in writes)


async def _one(thread_id: str, ns: str, checkpoint_id: str, before: str | None) -> AsyncIterator[_Item]:
    if before is None or checkpoint_id < before:
        yield thread_id, ns, checkpoint_id, None


async def _take(stream: AsyncIterator[_Item], n: int) -> AsyncIterator[_Item]:
    for _ in range(n):
        item = await anext(stream, None)
        if item is None:
            return
        yield item


async def _merge(streams: Sequence[AsyncIterator[_Item]]) -> AsyncIterator[_Item]:
    """Several newest-first streams as one, newest first."""
    heap: list[tuple[Descending, int, _Item]] = []
    for i, stream in enumerate(streams):
        item = await anext(stream, None)
        if item is not None:
            heapq.heappush(heap, (Descending(item[2]), i, item))
    while heap:
        _, i, item = heapq.heappop(heap)
        yield item
        following = await anext(streams[i], None)
        if following is not None:
            heapq.heappush(heap, (Descending(following[2]), i, following))
