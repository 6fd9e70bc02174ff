"""The inspector's live state of a board: its entries (a live :class:`agents_sdk.View`) and its
votes (every proposal's log, fed by one ordered follower of the board's vote subjects), and the
server-sent events the page listens to.

A :class:`BoardFeed` is opened on the first request for a board and kept while the inspector
runs (at most :data:`MAX_FEEDS`; the least recently used one without listeners is closed beyond
that). Entry pages are cut from its sorted keys (kept until a key is added or removed), so a
board of 10,000 entries answers a page in about a millisecond once its view holds the snapshot.

Until then (loading a view verifies every entry's signature: about 1.5 s for 10,000 entries), a
page is cut from a :class:`KeyListing` (the board's live keys, read from the stored messages'
headers only, without payloads) and only the page's entries are read, each verified as the view
would (:meth:`Feeds.listing_page`), while the view loads in the background.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from agents_sdk import Agent, View
from blackboard.client.consensus import VoteFollower
from blackboard.consensus.log import ProposalLog, VoteMessage, decode_ballot
from blackboard.protocol.entries import Change, Entry
from blackboard.protocol.errors import (
    InvalidPayloadError,
    NotConnectedError,
    NotFoundError,
    UnverifiedRecordError,
)
from blackboard.protocol.schemas import Proposal
from blackboard.protocol.subjects import Header, Subjects

__all__ = [
    "FIRST_PAGE_GRACE",
    "KEEPALIVE",
    "LISTING_TTL",
    "MAX_FEEDS",
    "MAX_QUEUE",
    "PAGE_READS",
    "BallotSeen",
    "BoardFeed",
    "Event",
    "Feeds",
    "KeyListing",
    "ProposalState",
    "cut",
    "list_keys",
    "page_of",
    "preview_of",
    "proposal_json",
    "sse",
]

log = logging.getLogger("blackboard.apps.inspect")

#: Boards whose live state is kept at once.
MAX_FEEDS = 32
#: Events a listener may fall behind before it is dropped (the page reconnects and reloads).
MAX_QUEUE = 10_000
#: Seconds between keep-alive comments on an idle event stream.
KEEPALIVE = 15.0
#: Seconds a board's key listing answers further pages while its view loads.
LISTING_TTL = 10.0
#: Entries of a listing's page read at once.
PAGE_READS = 50
#: Seconds an event stream of a board whose view is not loaded yet waits for the board's first
#: page (so that the view's load does not slow that page down) before it loads the view.
FIRST_PAGE_GRACE = 1.0

#: One server-sent event: its name and its JSON data (None: the stream ends).
Event = tuple[str, dict[str, Any]]


def sse(name: str, data: dict[str, Any]) -> bytes:
    """One server-sent event's bytes (``event:`` and one ``data:`` line of JSON)."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data, default=str) + b"\n\n"


@dataclass
class BallotSeen:
    """A ballot as stored: who, what, why, when, and whether the tally counted it."""

    sequence: int
    voter: str
    choice: Any
    reason: str | None
    at: datetime
    counted: bool | None = None
    rejected: str | None = None


@dataclass
class ProposalState:
    """One proposal's log and the ballots seen, in stream order."""

    log: ProposalLog
    ballots: list[BallotSeen] = field(default_factory=list)


class BoardFeed:
    """A board's live entries and votes, and the listeners of its changes."""

    def __init__(self, agent: Agent, board: str) -> None:
        self.agent = agent
        self.board = board
        self.view: View = agent.board(board).view()
        self.proposals: dict[str, ProposalState] = {}
        self.votes_ready = asyncio.Event()
        self._order: list[tuple[str, str]] | None = None
        self._listeners: set[asyncio.Queue[Event | None]] = set()
        self._follower: VoteFollower | None = None
        self._started = False
        self._lock = asyncio.Lock()
        self.used = 0.0
        self.view.on_change(self._on_change)

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> BoardFeed:
        """Load the board's snapshot and start following it (idempotent).

        Raises:
            NotConnectedError: NATS is unreachable.
            PermissionDeniedError: the identity may not read the board.
        """
        async with self._lock:
            if self._started:
                return self
            await self.view.start()
            self._started = True
        return self

    async def start_votes(self) -> None:
        """Follow the board's vote subjects from the first stored message (idempotent); returns
        once what was stored has been read."""
        async with self._lock:
            follower = self._follower
            if follower is None:
                follower = VoteFollower(self.agent.voting.store, Subjects.vote_filter(self.board),
                                        self._on_vote, start="all")
                await follower.start()  # kept only once started: a failed start is tried again
                self._follower = follower
        await follower.ready.wait()
        self.votes_ready.set()

    async def close(self) -> None:
        """Stop following; listeners' streams end."""
        follower, self._follower = self._follower, None
        try:
            if follower is not None:
                await follower.stop()
        finally:
            await self.view.close()
            for q in list(self._listeners):
                q.put_nowait(None)

    # ------------------------------------------------------------------- entries
    def ordered(self) -> list[tuple[str, str]]:
        """The live keys, sorted by (section, key)."""
        if self._order is None:
            self._order = self.view.keys()
        return self._order

    def page(self, *, section: str | None, prefix: str | None, after: tuple[str, str] | None,
             limit: int) -> tuple[list[Entry], tuple[str, str] | None, int]:
        """A page of the live entries (see :func:`page_of`)."""
        return page_of(self.ordered(), self.view.get, section=section, prefix=prefix, after=after, limit=limit)

    def sections(self) -> list[str]:
        """The sections holding a live key, sorted."""
        return sorted({s for s, _ in self.ordered()})

    def _on_change(self, change: Change) -> None:
        entry = change.entry
        k = (entry.section, entry.key)
        order = self._order
        if order is not None:
            i = bisect.bisect_left(order, k)
            present = i < len(order) and order[i] == k
            if entry.deleted and present:
                del order[i]
            elif not entry.deleted and not present:
                order.insert(i, k)
        if not self._listeners:  # the snapshot, or nobody listening: no event to shape
            return
        self._publish("entry", {"board": self.board, "op": entry.operation.value, "section": entry.section,
                                "key": entry.key, "revision": entry.revision, "author": entry.author,
                                "created_at": entry.created_at, "stored_at": entry.stored_at,
                                "preview": None if entry.deleted else preview_of(entry)})

    # --------------------------------------------------------------------- votes
    def _on_vote(self, msg: VoteMessage) -> None:
        state = self.proposals.get(msg.proposal_id)
        if state is None:
            state = self.proposals[msg.proposal_id] = ProposalState(ProposalLog(self.board, msg.proposal_id))
        plog = state.log
        plog.feed(msg)
        if msg.kind == "ballot" and msg.trusted:
            try:
                ballot = decode_ballot(msg.data, msg.headers)
            except InvalidPayloadError:
                ballot = None
            if ballot is not None and ballot.voter == msg.voter:
                state.ballots.append(BallotSeen(msg.sequence, ballot.voter, ballot.choice, ballot.reason,
                                                msg.timestamp))
        for seen in state.ballots:
            if seen.sequence in plog.fates:
                fate = plog.fates[seen.sequence]
                seen.counted = fate is None
                seen.rejected = fate.reason if fate is not None else None
        follower = self._follower
        if self._listeners and follower is not None and follower.ready.is_set():  # not the replay
            self._publish("vote", proposal_json(state))

    # ----------------------------------------------------------------- listeners
    @contextlib.asynccontextmanager
    async def listen(self) -> AsyncIterator[asyncio.Queue[Event | None]]:
        """A queue of this board's events from now on (None: the feed closed or the listener fell
        :data:`MAX_QUEUE` events behind)."""
        q: asyncio.Queue[Event | None] = asyncio.Queue()
        self._listeners.add(q)
        try:
            yield q
        finally:
            self._listeners.discard(q)

    @property
    def listening(self) -> int:
        return len(self._listeners)

    def _publish(self, name: str, data: dict[str, Any]) -> None:
        for q in list(self._listeners):
            if q.qsize() >= MAX_QUEUE:
                self._listeners.discard(q)
                q.put_nowait(None)
            else:
                q.put_nowait((name, data))


def cut(order: list[tuple[str, str]], *, section: str | None, prefix: str | None, after: tuple[str, str] | None,
        limit: int) -> tuple[list[tuple[str, str]], tuple[str, str] | None, int]:
    """The keys of a page after ``after`` in (section, key) order (``order``: the keys, sorted),
    filtered by section (exact) and key prefix: the page's keys, the cursor of the next page
    (None: the last page) and how many match in all. A section is cut by bisection: a page costs
    the page, not the board (a key prefix scans the section)."""
    if section is not None:
        lo = bisect.bisect_left(order, (section, ""))
        hi = bisect.bisect_left(order, (section + "\x00", ""))
        order = order[lo:hi]
    if prefix:
        order = [k for k in order if k[1].startswith(prefix)]
    start = bisect.bisect_right(order, after) if after is not None else 0
    chosen = order[start:start + limit]
    more = start + limit < len(order)
    return chosen, (chosen[-1] if more and chosen else None), len(order)


def page_of(order: list[tuple[str, str]], get: Callable[[str, str], Entry | None], *, section: str | None,
            prefix: str | None, after: tuple[str, str] | None,
            limit: int) -> tuple[list[Entry], tuple[str, str] | None, int]:
    """A page of entries (:func:`cut`, each read by ``get``): the entries, the cursor of the next
    page (None: the last page) and how many match in all."""
    chosen, after, total = cut(order, section=section, prefix=prefix, after=after, limit=limit)
    return [e for e in (get(s, k) for s, k in chosen) if e is not None], after, total


@dataclass(frozen=True)
class KeyListing:
    """A board's live keys (its keys whose latest revision is a put), sorted, and the highest
    revision among the keys' latest (the revision a view of the board holds once loaded)."""

    board: str
    order: list[tuple[str, str]]
    revision: int
    at: float

    def sections(self) -> list[str]:
        """The sections holding a live key, sorted."""
        return sorted({s for s, _ in self.order})


async def list_keys(agent: Agent, board: str, *, timeout: float = 30.0) -> KeyListing:
    """The live keys of ``board``, read from the latest revision of each key with its headers
    only (one ordered consumer, no payload: nothing to decode or verify). A key whose latest
    revision is a delete or purge is not live; one whose latest put does not verify is listed
    here (its payload is not read) and left out when its entry is read (:meth:`Feeds.listing_page`).

    Raises:
        NotConnectedError: NATS is unreachable, or the listing did not end within ``timeout``.
        PermissionDeniedError: the identity may not read the board.
    """
    store = agent.context.store
    subjects = store.subjects
    live: dict[tuple[str, str], None] = {}

    def on_message(msg: Any) -> None:
        parts = subjects.parse_entry(msg.subject)
        k = (parts.section, parts.key)
        if (msg.headers or {}).get(Header.KV_OPERATION.value) in ("DEL", "PURGE"):
            live.pop(k, None)
        else:
            live[k] = None

    follower = store.follow(subjects.entry_filter(board), on_message, start="current", headers_only=True,
                            what=f"list the keys of board {board!r}")
    await follower.start()
    try:
        try:
            await asyncio.wait_for(follower.ready.wait(), timeout)
        except TimeoutError:
            raise NotConnectedError(f"the keys of board {board!r} were not listed within {timeout:g} s") from None
    finally:
        await follower.stop()
    # Delivered in stream order: the last one is the highest of the keys' latest revisions.
    return KeyListing(board, sorted(live), follower.last_sequence, time.monotonic())


def preview_of(entry: Entry, limit: int = 120) -> str:
    """A one-line preview of an entry's value (at most ``limit`` characters)."""
    value = entry.value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value)} bytes {entry.content_type}>"
    if isinstance(value, str):
        text = value
    else:
        try:
            text = orjson.dumps(value, default=str).decode()
        except TypeError:
            text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


class Feeds:
    """The open :class:`BoardFeed` of each board, at most :data:`MAX_FEEDS`."""

    def __init__(self, agent: Agent, *, limit: int = MAX_FEEDS) -> None:
        self.agent = agent
        self.limit = limit
        self._feeds: collections.OrderedDict[str, BoardFeed] = collections.OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self._listings: dict[str, KeyListing] = {}
        self._listing_locks: dict[str, asyncio.Lock] = {}
        self._loading: dict[str, asyncio.Task[BoardFeed]] = {}
        self._paged: dict[str, asyncio.Event] = {}

    async def feed(self, board: str) -> BoardFeed:
        """The started feed of ``board`` (started now if it is not yet).

        Raises:
            NotConnectedError, PermissionDeniedError: as :meth:`BoardFeed.start`.
        """
        feed = self._feeds.get(board)
        if feed is None:
            lock = self._locks.setdefault(board, asyncio.Lock())
            async with lock:
                feed = self._feeds.get(board)
                if feed is None:
                    feed = BoardFeed(self.agent, board)
                    await feed.start()
                    self._feeds[board] = feed
                    self._listings.pop(board, None)  # pages come from the view from now on
                    await self._evict(keep=board)
        self._feeds.move_to_end(board)
        feed.used = time.monotonic()
        return feed

    def opened(self, board: str) -> BoardFeed | None:
        """The feed of ``board`` if it is open (never opens one)."""
        return self._feeds.get(board)

    def open_soon(self, board: str) -> None:
        """Open the feed of ``board`` in the background (unless it is open or opening); a
        failure is logged (the next request that needs the feed says why)."""
        if board in self._feeds or board in self._loading:
            return
        task = asyncio.create_task(self.feed(board), name=f"inspect:open:{board}")
        self._loading[board] = task

        def done(t: asyncio.Task[BoardFeed]) -> None:
            self._loading.pop(board, None)
            if not t.cancelled() and t.exception() is not None:
                log.info("inspector: the live state of board %r was not opened: %s", board, t.exception())

        task.add_done_callback(done)

    async def feed_after_first_page(self, board: str) -> BoardFeed:
        """:meth:`feed`, but when the board's feed is not open, first waiting up to
        :data:`FIRST_PAGE_GRACE` s for its first page to be cut from a listing (an event stream
        and the first page are asked for together: the page first)."""
        if board not in self._feeds:
            paged = self._paged.setdefault(board, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(paged.wait(), FIRST_PAGE_GRACE)
        return await self.feed(board)

    async def listing(self, board: str) -> KeyListing:
        """The key listing of ``board`` (:func:`list_keys`), kept :data:`LISTING_TTL` s."""
        lock = self._listing_locks.setdefault(board, asyncio.Lock())
        async with lock:
            kept = self._listings.get(board)
            if kept is None or time.monotonic() - kept.at > LISTING_TTL:
                kept = self._listings[board] = await list_keys(self.agent, board)
            return kept

    async def listing_page(self, listing: KeyListing, *, section: str | None, prefix: str | None,
                           after: tuple[str, str] | None,
                           limit: int) -> tuple[list[Entry], tuple[str, str] | None, int]:
        """A page cut from ``listing`` (see :func:`page_of`), its entries read now (at most
        :data:`PAGE_READS` at once), each verified as a view verifies it: a key deleted since
        the listing, or whose latest revision does not verify, is left out (it reads as absent,
        as in a view); ``total`` counts the listing's keys."""
        chosen, cursor, total = cut(listing.order, section=section, prefix=prefix, after=after, limit=limit)
        handle = self.agent.board(listing.board)
        gate = asyncio.Semaphore(PAGE_READS)

        async def read(section: str, key: str) -> Entry | None:
            async with gate:
                try:
                    return await handle.get(section, key)
                except (NotFoundError, UnverifiedRecordError):
                    return None

        found = await asyncio.gather(*(read(s, k) for s, k in chosen))
        paged = self._paged.setdefault(listing.board, asyncio.Event())
        paged.set()
        return [e for e in found if e is not None], cursor, total

    async def _evict(self, keep: str) -> None:
        for name in list(self._feeds):
            if len(self._feeds) <= self.limit:
                return
            feed = self._feeds[name]
            if name != keep and not feed.listening:
                del self._feeds[name]
                await feed.close()

    async def aclose(self) -> None:
        """Close every feed (each even when another fails to)."""
        loading, self._loading = list(self._loading.values()), {}
        for task in loading:
            task.cancel()
        for task in loading:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._listings.clear()
        feeds, self._feeds = list(self._feeds.values()), collections.OrderedDict()
        for feed in feeds:
            try:
                await feed.close()
            except Exception as exc:  # closing the others matters more
                log.warning("closing the feed of board %r: %s", feed.board, exc)


def _dump(model: Any) -> Any:
    return None if model is None else model.model_dump(mode="json")


def proposal_json(state: ProposalState) -> dict[str, Any]:
    """A proposal as the API shows it: the question, candidates, policy and deadline, the live
    tally, every ballot with its reason and fate, the outcome (committed, else the one the tally
    reached) and the entry an accepted outcome wrote."""
    plog = state.log
    p: Proposal | None = plog.proposal
    outcome = plog.committed or (plog.recorded.outcome if plog.recorded is not None else None) or plog.decided
    applied = plog.applied
    return {
        "id": plog.proposal_id, "proposal_id": plog.proposal_id, "board": plog.board,
        "section": p.section if p else None, "key": p.key if p else None,
        "question": p.question if p else "", "options": list(p.candidates) if p else [],
        "policy": _dump(p.policy) if p else None, "voters": p.voters if p else None,
        "proposer": p.proposer if p else None, "created_at": p.created_at if p else None,
        "deadline": p.deadline if p else None, "open": plog.is_open,
        "tally": _dump(plog.tally.counts()) if plog.tally is not None else None,
        "ballots": [{"sequence": b.sequence, "voter": b.voter, "choice": b.choice, "reason": b.reason,
                     "at": b.at, "counted": b.counted, "rejected": b.rejected} for b in state.ballots],
        "outcome": _dump(outcome),
        "committed_entry": ({"section": applied.section, "key": applied.key, "revision": applied.revision}
                            if applied is not None else None),
    }
