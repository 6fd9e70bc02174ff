"""Where :class:`~agents_sdk.langgraph.BlackboardSaver` keeps a thread on its board (pure: no IO).

One thread ``T`` of a graph lives in five sections of the saver's board, named
from a token of the thread id (:func:`thread_token`: the id itself when it is a
plain token of at most 126 characters, else ``h`` and a digest), plus one entry
in the ``threads`` section (the registry that ``list(None)`` and
``delete_for_runs`` walk)::

    threads / <token>                  {"thread": T}
    c_<token> / <ns>-<checkpoint id>   the checkpoint (without channel values) and its metadata
    b_<token> / <ns>-<digest>          one channel value at one version (channel, version inside)
    w_<token> / <ns>-<checkpoint id>   the checkpoint's pending writes (merged by compare-and-set)
    x_<token> / p-<ns>-<n>             index page n of the namespace: checkpoint ids (with run ids)
    x_<token> / h-<ns>                 the namespace's newest page number (once it has two pages)
    o_<token> / <object name>          an object-store object a value of the thread was moved to

``<ns>`` is :func:`ns_token` of the checkpoint namespace (``r`` for the root
namespace ``""``, ``n`` and a digest otherwise); every value also carries the
thread id and namespace in full.

The index (``x_``) makes the newest checkpoints cheap to find in a thread of
any length. Ids are appended to the newest page, at most :data:`PAGE_SIZE` a
page, by compare-and-set; a full page never changes again (except that pruning
removes ids). Each page records ``floor``, the greatest id of all older pages,
so that a listing that reads pages from the newest can yield an id as soon as
it is greater than the floor of the pages not read yet: newest first, even
when ids do not arrive in order (writers with skewed clocks), reading one or
two pages for the latest checkpoint (:class:`NewestFirst`).
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.base import WRITES_IDX_MAP, writes_sort_key

from blackboard.protocol.errors import InvalidKeyError, InvalidPayloadError

__all__ = [
    "FORMAT",
    "PAGE_SIZE",
    "THREADS_SECTION",
    "Descending",
    "NewestFirst",
    "Page",
    "StoredWrite",
    "ThreadSections",
    "blob_key",
    "head_key",
    "merge_writes",
    "ns_token",
    "page_key",
    "parse_page_key",
    "record_key",
    "thread_id_of",
    "thread_token",
    "write_index",
    "writes_key",
]

#: The format version every value carries (``v``).
FORMAT = 1
#: Checkpoint ids per index page.
PAGE_SIZE = 32
#: The registry of threads: one key per thread (its token), value ``{"thread": id}``.
THREADS_SECTION = "threads"

_PLAIN_THREAD = re.compile(r"[A-Za-z0-9_-]{1,126}")
_PAGE_KEY = re.compile(r"p-(r|n[a-z2-7]{26})-(\d{1,9})")


def _digest(text: str, chars: int) -> str:
    raw = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    return base64.b32encode(raw).decode("ascii").lower()[:chars]


def thread_id_of(config_value: Any) -> str:
    """A thread id as stored: a string (an int or a UUID is taken as its text).

    Raises:
        InvalidKeyError: not a string, an int or a UUID.
    """
    if isinstance(config_value, str):
        return config_value
    if isinstance(config_value, int) and not isinstance(config_value, bool):
        return str(config_value)
    if type(config_value).__name__ == "UUID":
        return str(config_value)
    raise InvalidKeyError(repr(config_value)[:64], "a thread_id must be a string")


def thread_token(thread_id: str) -> str:
    """The token naming a thread's sections: the id itself (``[A-Za-z0-9_-]``, at most 126
    characters) or ``h`` and 32 base32 characters of its SHA-256. The two forms never meet:
    a section is ``<kind>_<id>`` for the first, ``<kind>h<digest>`` for the second."""
    if _PLAIN_THREAD.fullmatch(thread_id):
        return "_" + thread_id
    return "h" + _digest(thread_id, 32)


def ns_token(checkpoint_ns: str) -> str:
    """``r`` for the root namespace ``""``, else ``n`` and 26 base32 characters of its SHA-256."""
    if checkpoint_ns == "":
        return "r"
    return "n" + _digest(checkpoint_ns, 26)


@dataclass(frozen=True, slots=True)
class ThreadSections:
    """The sections of one thread (see the module docstring)."""

    thread_id: str
    token: str

    @classmethod
    def of(cls, thread_id: str) -> ThreadSections:
        return cls(thread_id, thread_token(thread_id))

    @property
    def checkpoints(self) -> str:
        return "c" + self.token

    @property
    def blobs(self) -> str:
        return "b" + self.token

    @property
    def writes(self) -> str:
        return "w" + self.token

    @property
    def index(self) -> str:
        return "x" + self.token

    @property
    def objects(self) -> str:
        return "o" + self.token

    @property
    def all(self) -> tuple[str, ...]:
        return (self.checkpoints, self.blobs, self.writes, self.index, self.objects)


def record_key(checkpoint_ns: str, checkpoint_id: str) -> str:
    """The key of a checkpoint record in ``c_<token>``."""
    return f"{ns_token(checkpoint_ns)}-{checkpoint_id}"


def writes_key(checkpoint_ns: str, checkpoint_id: str) -> str:
    """The key of a checkpoint's pending writes in ``w_<token>``."""
    return f"{ns_token(checkpoint_ns)}-{checkpoint_id}"


def blob_key(checkpoint_ns: str, channel: str, version: str | int | float) -> str:
    """The key of one channel value at one version in ``b_<token>`` (the version's JSON type
    counts: ``1`` and ``"1"`` are two versions)."""
    return f"{ns_token(checkpoint_ns)}-{_digest(json.dumps([channel, version]), 32)}"


def head_key(checkpoint_ns: str) -> str:
    return f"h-{ns_token(checkpoint_ns)}"


def page_key(checkpoint_ns: str, page: int) -> str:
    return f"p-{ns_token(checkpoint_ns)}-{page}"


def parse_page_key(key: str) -> tuple[str, int] | None:
    """``(ns token, page number)`` of an index page key, None for any other key."""
    m = _PAGE_KEY.fullmatch(key)
    return (m.group(1), int(m.group(2))) if m else None


# ------------------------------------------------------------------ index pages
@dataclass(slots=True)
class Page:
    """One index page: checkpoint ids ``[id, run_id]`` in the order they were appended."""

    thread_id: str
    checkpoint_ns: str
    number: int
    floor: str | None = None
    ids: list[tuple[str, str | None]] = field(default_factory=list)

    def to_value(self) -> dict[str, Any]:
        return {"v": FORMAT, "thread": self.thread_id, "ns": self.checkpoint_ns, "page": self.number,
                "floor": self.floor, "ids": [[i, r] for i, r in self.ids]}

    @classmethod
    def from_value(cls, value: Any, *, thread_id: str, checkpoint_ns: str, number: int) -> Page:
        """Raises:
            InvalidPayloadError: not an index page of that thread, namespace and number."""
        try:
            if (value["thread"], value["ns"], value["page"]) != (thread_id, checkpoint_ns, number):
                raise InvalidPayloadError(f"index page {number} of thread {thread_id!r} "
                                          f"(namespace {checkpoint_ns!r}) names another page")
            floor = value["floor"]
            ids = [(str(i), None if r is None else str(r)) for i, r in value["ids"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidPayloadError(f"malformed index page {number} of thread {thread_id!r}: {exc!r}") from exc
        if floor is not None and not isinstance(floor, str):
            raise InvalidPayloadError(f"malformed index page {number} of thread {thread_id!r}: floor {floor!r}")
        return cls(thread_id, checkpoint_ns, number, floor, ids)

    @property
    def full(self) -> bool:
        return len(self.ids) >= PAGE_SIZE

    def top(self) -> str | None:
        """The greatest id of this page and every older one."""
        return max([i for i, _ in self.ids] + ([self.floor] if self.floor is not None else []), default=None)

    def holds(self, checkpoint_id: str) -> bool:
        return any(i == checkpoint_id for i, _ in self.ids)


class NewestFirst:
    """Ids of one namespace, newest first, from its index pages read newest to oldest.

    Feed pages with :meth:`add` (``None`` for a page that is missing) and take what can
    be yielded with :meth:`ready`; :meth:`rest` gives what remains once every page was read.
    An id is ready once it is greater than the floor of the last page added (no older
    page holds a greater one). Ids at or after ``before`` are left out; an id seen twice
    (one re-put) is yielded once.
    """

    def __init__(self, before: str | None = None) -> None:
        self._before = before
        self._heap: list[tuple[Descending, str | None]] = []
        self._seen: set[str] = set()
        self._floor: str | None = None
        self._bounded = False  # whether the floor of the last page added is known

    def add(self, page: Page | None) -> None:
        if page is None:  # a gap: older pages may hold anything
            self._bounded = False
            return
        for checkpoint_id, run_id in page.ids:
            if checkpoint_id in self._seen or (self._before is not None and checkpoint_id >= self._before):
                continue
            self._seen.add(checkpoint_id)
            heapq.heappush(self._heap, (Descending(checkpoint_id), run_id))
        self._floor = page.floor
        self._bounded = True

    def ready(self) -> list[tuple[str, str | None]]:
        out: list[tuple[str, str | None]] = []
        if not self._bounded:
            return out
        while self._heap and (self._floor is None or self._heap[0][0].value > self._floor):
            item, run_id = heapq.heappop(self._heap)
            out.append((item.value, run_id))
        return out

    def rest(self) -> list[tuple[str, str | None]]:
        out = [(item.value, run_id) for item, run_id in sorted(self._heap)]
        self._heap.clear()
        return out


class Descending:
    """A checkpoint id ordered backwards (newest first from heapq's min-heap)."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __lt__(self, other: Descending) -> bool:
        return self.value > other.value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Descending) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


# ------------------------------------------------------------------ pending writes
@dataclass(frozen=True, slots=True)
class StoredWrite:
    """One pending write as stored: the value is a stored payload (see checkpoint.py)."""

    task_id: str
    idx: int
    channel: str
    task_path: str
    value: Mapping[str, Any]

    def to_value(self) -> list[Any]:
        return [self.task_id, self.idx, self.channel, self.task_path, dict(self.value)]

    @classmethod
    def from_value(cls, value: Any) -> StoredWrite:
        """Raises:
            InvalidPayloadError: not a stored write."""
        try:
            task_id, idx, channel, task_path, payload = value
            if not (isinstance(task_id, str) and isinstance(idx, int) and isinstance(channel, str)
                    and isinstance(task_path, str) and isinstance(payload, Mapping)):
                raise TypeError(f"unexpected types {[type(v).__name__ for v in value]}")
        except (TypeError, ValueError) as exc:
            raise InvalidPayloadError(f"malformed pending write: {exc}") from exc
        return cls(task_id, idx, channel, task_path, payload)

    def sort_key(self) -> tuple[str, str, int]:
        return writes_sort_key(self.task_path, self.task_id, self.idx)


def write_index(channel: str, position: int) -> int:
    """The index a write is stored under: LangGraph's negative index of a special channel
    (errors, interrupts, resumes, scheduled), else its position in the task's writes."""
    return WRITES_IDX_MAP.get(channel, position)


def merge_writes(existing: Iterable[StoredWrite], new: Sequence[StoredWrite]) -> list[StoredWrite]:
    """The writes of a checkpoint after one task's ``put_writes``, sorted by ``writes_sort_key``.

    As LangGraph's savers: a regular write already stored under the same ``(task_id, idx)``
    is kept (a retried ``put_writes`` changes nothing); a special write (negative index)
    replaces the stored one.
    """
    merged = {(w.task_id, w.idx): w for w in existing}
    for w in new:
        if w.idx >= 0 and (w.task_id, w.idx) in merged:
            continue
        merged[(w.task_id, w.idx)] = w
    return sorted(merged.values(), key=StoredWrite.sort_key)
