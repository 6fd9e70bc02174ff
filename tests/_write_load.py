"""A write load for failover tests: plain puts and compare-and-set increments through the SDK,
kept going while servers die, then checked for nothing lost and nothing applied twice."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from nats.js import JetStreamContext

from agents_sdk import Board
from blackboard.protocol.subjects import Subjects

#: Revisions of one key the board's KV bucket keeps (its history depth).
KV_HISTORY = 64


@dataclass
class WriteLoad:
    """Writers on one board's section ``s``; each keeps writing until ``stop`` is set, then
    ``settle`` more writes (so some writes land on the recovered cluster), ``pause`` apart."""

    board: Board
    stop: asyncio.Event
    settle: int = 20
    pause: float = 0.0
    #: key -> (revision, value) of each acknowledged plain put
    plain: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: key -> the revisions of its acknowledged increments (the first is a plain put of 0)
    cas: dict[str, list[int]] = field(default_factory=dict)

    async def put_writer(self, w: int) -> None:
        i = after = 0
        while after < self.settle:
            key = f"p{w}-{i}"
            self.plain[key] = (await self.board.put("s", key, i), i)
            i += 1
            after += self.stop.is_set()
            await asyncio.sleep(self.pause)

    async def cas_writer(self, w: int) -> None:
        key = f"c{w}"
        revs = self.cas[key] = [await self.board.put("s", key, 0)]
        after = 0
        while after < self.settle:
            revs.append(await self.board.update("s", key, len(revs), expected_revision=revs[-1]))
            after += self.stop.is_set()
            await asyncio.sleep(self.pause)

    async def run(self, *others: Awaitable[Any], puts: int, cas: int) -> None:
        """Run ``puts`` plain writers and ``cas`` increment writers beside ``others`` (what sets ``stop``)."""
        await asyncio.gather(*others, *(self.put_writer(w) for w in range(puts)),
                             *(self.cas_writer(w) for w in range(cas)))

    async def check(self, js: JetStreamContext, subjects: Subjects) -> dict[str, int]:
        """Assert nothing was lost and no plain put was applied twice; the stream's message count per subject."""
        board = self.board
        # Nothing lost: every acknowledged write is there, at its revision.
        for key, (rev, value) in self.plain.items():
            entry = await board.get("s", key)
            assert (entry.revision, entry.value) == (rev, value)
        for key, revs in self.cas.items():
            assert revs == sorted(set(revs))
            entry = await board.get("s", key)
            assert (entry.revision, entry.value) == (revs[-1], len(revs) - 1)
            history = await board.history("s", key)  # the last KV_HISTORY revisions: consecutive increments
            assert [e.value for e in history] == list(range(len(revs) - len(history), len(revs)))
        # Nothing applied twice: one message per plain key on the stream.
        info = await js.stream_info(subjects.kv_stream, subjects_filter=subjects.entry_filter(board.name, "s"))
        counts: dict[str, int] = info.state.subjects or {}
        assert [counts.get(subjects.entry(board.name, "s", key)) for key in self.plain] == [1] * len(self.plain)
        return counts
