"""Deleting, copying and pruning threads: :class:`CheckpointBoard`, the
:class:`~agents_sdk.langgraph._checkpoint_store.CheckpointStore` the saver uses.

Deletes purge keys (pipelined); channel values that no remaining checkpoint uses, and
objects that no remaining entry references, are swept after a checkpoint is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from agents_sdk.langgraph._checkpoint_layout import (
    FORMAT,
    THREADS_SECTION,
    Page,
    ThreadSections,
    blob_key,
    head_key,
    ns_token,
    page_key,
    record_key,
    writes_key,
)
from agents_sdk.langgraph._checkpoint_store import CheckpointStore
from agents_sdk.objects import OBJECT_REF_KEY, ObjectRef
from blackboard.protocol.errors import NotFoundError

__all__ = ["CheckpointBoard"]


def _object_names(value: Any) -> Iterator[str]:
    """The object names a stored value references."""
    if isinstance(value, Mapping):
        ref = value.get("o")
        if isinstance(ref, Mapping) and isinstance(ref.get("name"), str):
            yield ref["name"]
        for v in value.values():
            yield from _object_names(v)
    elif isinstance(value, list):
        for v in value:
            yield from _object_names(v)


class CheckpointBoard(CheckpointStore):
    """A :class:`CheckpointStore` that also deletes, copies and prunes threads."""

    async def _purge(self, section: str, keys: Sequence[str]) -> None:
        if not keys:
            return
        async with self.board.pipeline() as pipe:
            for key in keys:
                await pipe.delete(section, key, purge=True)

    async def _delete_objects(self, th: ThreadSections, *, unless_used: bool) -> None:
        """Delete the objects registered for a thread (with ``unless_used``: only those no
        entry references any more)."""
        gone: list[str] = []
        for name in await self.board.keys(th.objects):
            if unless_used:
                entry = await self._get(th.objects, name)
                ref = entry.value if entry is not None and isinstance(entry.value, Mapping) else {}
                section, key = ref.get("section"), ref.get("key")
                if isinstance(section, str) and isinstance(key, str):
                    user = await self._get(section, key)
                    if user is not None and name in set(_object_names(user.value)):
                        continue
            try:
                await self.agent.objects.delete(name)
            except NotFoundError:
                pass
            gone.append(name)
        await self._purge(th.objects, gone)

    async def delete_thread(self, thread_id: str) -> None:
        th = ThreadSections.of(thread_id)
        await self._delete_objects(th, unless_used=False)
        for section in (th.index, th.checkpoints, th.writes, th.blobs):
            await self._purge(section, await self.board.keys(section))
        await self._purge(THREADS_SECTION, [th.token] if await self._get(THREADS_SECTION, th.token) else [])

    async def _all_ids(self, th: ThreadSections, ns: str) -> list[tuple[str, str | None]]:
        return [(checkpoint_id, run_id) async for _, _, checkpoint_id, run_id in self._newest_first(th, ns, None)]

    async def _sweep_blobs(self, th: ThreadSections, ns: str) -> None:
        """Delete the namespace's channel values that no remaining checkpoint uses."""
        used: set[str] = set()
        for checkpoint_id, _ in await self._all_ids(th, ns):
            record = await self._record_of(th, ns, checkpoint_id)
            if record is not None:
                checkpoint = await self._load(record.get("checkpoint"), f"checkpoint {checkpoint_id!r}")
                used.update(blob_key(ns, c, v) for c, v in (checkpoint.get("channel_versions") or {}).items())
        prefix = ns_token(ns) + "-"
        await self._purge(th.blobs, [k for k in await self.board.keys(th.blobs)
                                     if k.startswith(prefix) and k not in used])

    async def _drop(self, th: ThreadSections, ns: str, checkpoint_ids: Sequence[str]) -> None:
        await self._purge(th.checkpoints, [record_key(ns, i) for i in checkpoint_ids])
        await self._purge(th.writes, [writes_key(ns, i) for i in checkpoint_ids])

    async def delete_for_runs(self, run_ids: set[str]) -> None:
        if not run_ids:
            return
        for th in await self._threads():
            touched = False
            for ns in await self._namespaces(th):
                newest, _ = await self._head(th, ns)
                for number in range(newest + 1):
                    found = await self._page(th, ns, number)
                    if found is None:
                        continue
                    page = found[0]
                    doomed = [i for i, r in page.ids if r in run_ids]
                    if not doomed:
                        continue
                    touched = True
                    await self._drop(th, ns, doomed)

                    await self.board.modify(th.index, page_key(ns, number),
                                            _without(th.thread_id, ns, number, set(doomed)))
                if touched:
                    await self._sweep_blobs(th, ns)
            if touched:
                await self._delete_objects(th, unless_used=True)

    async def copy_thread(self, source: str, target: str) -> None:
        src, dst = ThreadSections.of(source), ThreadSections.of(target)
        if src.token == dst.token:
            return
        namespaces = await self._namespaces(src)
        if not namespaces:
            return
        await self._register(dst)
        merge_index = bool(await self.board.keys(dst.index))
        for from_section, to_section in ((src.blobs, dst.blobs), (src.writes, dst.writes),
                                         (src.checkpoints, dst.checkpoints)):
            for key in await self.board.keys(from_section):
                entry = await self._get(from_section, key)
                if entry is None or not isinstance(entry.value, Mapping):
                    continue
                value = await self._relocate(dst, to_section, key, entry.value)
                await self.board.put(to_section, key, {**value, "thread": target})
        for ns in namespaces:
            if merge_index:
                for checkpoint_id, run_id in reversed(await self._all_ids(src, ns)):
                    await self._append(dst, ns, checkpoint_id, run_id)
                continue
            newest, _ = await self._head(src, ns)
            for number in range(newest + 1):
                found = await self._page(src, ns, number)
                if found is not None:
                    page = found[0]
                    page.thread_id = target
                    await self.board.put(dst.index, page_key(ns, number), page.to_value())
            if newest:
                await self.board.put(dst.index, head_key(ns), {"v": FORMAT, "thread": target, "ns": ns,
                                                               "page": newest})

    async def _relocate(self, dst: ThreadSections, section: str, key: str, value: Any) -> Any:
        """A stored value for another thread: objects it references are stored again under
        the target's names (deleting one thread leaves the other's intact)."""
        if isinstance(value, Mapping):
            if isinstance(value.get("t"), str) and isinstance(value.get("o"), Mapping):
                ref = ObjectRef.from_value({OBJECT_REF_KEY: value["o"]})
                assert ref is not None
                data = await self.agent.objects.fetch(ref)
                return await self._payload(dst, section, key, (value["t"], data), to_object=True)
            return {k: await self._relocate(dst, section, key, v) for k, v in value.items()}
        if isinstance(value, list):
            return [await self._relocate(dst, section, key, v) for v in value]
        return value

    async def prune(self, thread_ids: Sequence[str], strategy: str) -> None:
        for thread_id in thread_ids:
            if strategy == "delete":
                await self.delete_thread(thread_id)
                continue
            th = ThreadSections.of(thread_id)
            for ns in await self._namespaces(th):
                ids = await self._all_ids(th, ns)
                kept = None
                for checkpoint_id, run_id in ids:
                    if await self._record_of(th, ns, checkpoint_id) is not None:
                        kept = (checkpoint_id, run_id)
                        break
                if kept is not None:
                    record = await self._record_of(th, ns, kept[0])
                    assert record is not None
                    metadata = await self._load(record.get("metadata"), f"checkpoint {kept[0]!r}")
                    if "counters_since_delta_snapshot" in metadata or "delta_writes_versioned" in metadata:
                        raise NotImplementedError(f"keep_latest can't prune thread {thread_id!r}: its graph uses "
                                                  "a DeltaChannel, whose state needs the older checkpoints")
                await self._drop(th, ns, [i for i, _ in ids if kept is None or i != kept[0]])
                newest, _ = await self._head(th, ns)
                await self._purge(th.index, [page_key(ns, n) for n in range(1, newest + 1)] +
                                  ([head_key(ns)] if newest else []))
                if kept is None:
                    await self._purge(th.index, [page_key(ns, 0)])
                else:
                    await self.board.put(th.index, page_key(ns, 0), Page(thread_id, ns, 0, None, [kept]).to_value())
                await self._sweep_blobs(th, ns)
            await self._delete_objects(th, unless_used=True)


def _without(thread_id: str, ns: str, number: int, doomed: set[str]) -> Callable[[Any], dict[str, Any]]:
    """An index page's ``modify`` function dropping the ``doomed`` ids."""
    def without(current: Any) -> dict[str, Any]:
        kept = Page.from_value(current, thread_id=thread_id, checkpoint_ns=ns, number=number)
        kept.ids = [(i, r) for i, r in kept.ids if i not in doomed]
        return kept.to_value()
    return without
