"""The ingest -> embedding hand-off: inbox rows become per-item queue rows, once each, under concurrent movers."""

from __future__ import annotations

import asyncio
import random

import pytest

from blackboard.db import migrate, open_pool
from blackboard.settings import Settings
from blackboard.worker.embed_inbox import EmbedInbox

pytestmark = pytest.mark.asyncio


async def test_concurrent_movers_queue_every_item_once_and_requeue_leased_ones(pg_settings: Settings) -> None:
    await migrate(pg_settings)
    rng = random.Random(7)
    base = rng.randrange(10**12, 2 * 10**12)  # item ids no other test uses
    universe = list(range(base, base + 300))
    batches = [rng.sample(universe, 50) for _ in range(40)]
    batches.append(universe[:150])
    batches.append(universe[150:])  # every id at least once
    leased = universe[0]
    async with open_pool(pg_settings.postgres) as pool:
        async with pool.connection() as conn, conn.transaction():
            # One item is being embedded (leased, enqueued an hour ago) when it changes again.
            await conn.execute(
                "INSERT INTO bb_embed_queue (item_type, item, enqueued_at, lease_until, attempts) "
                "VALUES ('memory', %s, now() - interval '1 hour', now() + interval '1 hour', 1)", (leased,))
            for items in batches:
                await conn.execute("INSERT INTO bb_embed_inbox (item_type, items) VALUES ('memory', %s)", (items,))
        woken = 0

        def on_moved() -> None:
            nonlocal woken
            woken += 1

        movers = [EmbedInbox(pool, pg_settings, on_moved=on_moved) for _ in range(3)]

        async def drain(m: EmbedInbox) -> None:
            # Until the inbox is empty: a step moving 0 items while rows remain
            # means another mover holds them (SKIP LOCKED); ask again.
            for _ in range(10_000):
                if not await m.move_once() and not await m.size():
                    return
            raise AssertionError("the inbox did not drain")

        await asyncio.gather(*(drain(m) for m in movers))
        assert await movers[0].size() == 0
        assert woken >= 1 and sum(m.moved for m in movers) >= len(universe)
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT item, lease_until IS NULL, enqueued_at > now() - interval '1 minute' FROM bb_embed_queue "
                "WHERE item_type = 'memory' AND item BETWEEN %s AND %s ORDER BY item", (base, base + 299))
            rows = await cur.fetchall()
            assert [r[0] for r in rows] == universe  # each item exactly once (and nothing else)
            assert rows[0][1:] == (True, True)  # the leased item is free again, with a new enqueue time
            await conn.execute("DELETE FROM bb_embed_queue WHERE item_type = 'memory' AND item BETWEEN %s AND %s",
                               (base, base + 299))
            await conn.commit()


async def test_an_empty_inbox_moves_nothing(pg_settings: Settings) -> None:
    await migrate(pg_settings)
    async with open_pool(pg_settings.postgres) as pool:
        mover = EmbedInbox(pool, pg_settings)
        while await mover.move_once():  # whatever other tests left behind
            pass
        assert await mover.move_once() == 0 and await mover.size() == 0
