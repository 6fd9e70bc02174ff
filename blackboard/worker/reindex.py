"""``blackboard reindex``: embed everything again with the configured model and dimension.

The new vectors go into fresh tables (``<space table>_new``) without an index,
written with binary COPY in big batches (bound by the model, not by HNSW
inserts); the HNSW index is then built once over the full table (with a large
``maintenance_work_mem``), as is the covering board index, and the new tables
replace the space's tables in one transaction. Searches keep using the old
tables (or find none, for a new model) until the swap. Items stored while
reindexing are queued as usual and embedded by the workers after the swap.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from psycopg import sql

from blackboard.db import embed_sql, migrate
from blackboard.db.pool import connect
from blackboard.db.spaces import (
    ItemType,
    Space,
    create_space_indexes,
    create_space_tables,
    drop_space_tables,
    ensure_space,
)
from blackboard.embeddings import EmbeddingProvider
from blackboard.settings import Settings
from blackboard.worker.embed_text import MAX_EMBED_CHARS, memory_embed_text
from blackboard.worker.embedder import load_provider, storable_vectors

__all__ = ["reindex"]

log = logging.getLogger("blackboard.reindex")

_SELECT: dict[str, str] = {
    "memory": (f"SELECT m.mid, m.seq, m.text, m.metadata, m.board, m.embed_meta, {embed_sql.CONTEXT} "
               "FROM bb_memories m WHERE m.mid > %s ORDER BY m.mid LIMIT %s"),
    "entry": ("SELECT eid, revision, search_text, NULL, board FROM bb_entries WHERE eid > %s AND NOT deleted "
              "AND search_text <> '' ORDER BY eid LIMIT %s"),
}
_COUNT: dict[str, str] = {"memory": "SELECT count(*) FROM bb_memories",
          "entry": "SELECT count(*) FROM bb_entries WHERE NOT deleted AND search_text <> ''"}
_NEW = "_new"
_TYPES: tuple[ItemType, ...] = ("memory", "entry")


def _progress_bar(total: int, enabled: bool) -> Callable[[int], None]:
    """A bar on stderr when ``enabled`` (the CLI: on a terminal, ``observability.progress``);
    otherwise a log line at INFO every tenth of the way (a log gets no bar redraws)."""
    if not enabled:
        done = [0, 0]  # items, the last tenth logged

        def log_step(n: int) -> None:
            done[0] += n
            tenth = done[0] * 10 // total if total else 10
            if tenth > done[1]:
                done[1] = tenth
                log.info("reindex: %d of %d items (%d%%)", done[0], total, done[0] * 100 // total if total else 100)

        return log_step
    from tqdm import tqdm

    bar = tqdm(total=total, unit="item", desc="reindex", file=sys.stderr)
    return lambda n: bar.update(n)


async def reindex(settings: Settings, *, progress: bool = True, provider: EmbeddingProvider | None = None,
                  batch_size: int = 256) -> dict[str, Any]:
    """Re-embed every memory and entry into the space of the configured model.

    Returns:
        Counts and timings: ``{"space", "model", "dims", "memories", "entries", "seconds", ...}``.

    Raises:
        StorageError: PostgreSQL unreachable. EmbeddingError: the model failed.
    """
    await migrate(settings)
    owned = provider is None
    prov = provider or load_provider(settings)
    conn = await connect(settings.postgres, autocommit=True, name="blackboard-reindex")
    t0 = time.perf_counter()
    stats: dict[str, Any] = {}
    try:
        space = await ensure_space(conn, prov.model, prov.dimensions)
        async with conn.transaction():
            await drop_space_tables(conn, space, suffix=_NEW)
            await create_space_tables(conn, space, suffix=_NEW, index=False)
        totals = {t: int(((await (await conn.execute(_COUNT[t])).fetchone()) or (0,))[0])
                  for t in _TYPES}
        step = _progress_bar(sum(totals.values()), progress)
        model_s = 0.0
        for item_type in _TYPES:
            last, n = 0, 0
            while True:
                rows = await (await conn.execute(_SELECT[item_type], (last, batch_size))).fetchall()
                if not rows:
                    break
                texts = [memory_embed_text(r[2], r[3], lines=r[5], context=r[6]) if item_type == "memory" else str(r[2])[:MAX_EMBED_CHARS]
                         for r in rows]
                t1 = time.perf_counter()
                vectors, ok = storable_vectors(await prov.embed(texts), len(texts), prov.dimensions)
                model_s += time.perf_counter() - t1
                if not ok.all():
                    log.error("reindex: the model gave %d %s vectors holding NaN or infinity; those items get none",
                              int((~ok).sum()), item_type)
                await _copy(conn, space, item_type,
                            [(int(r[0]), int(r[1]), str(r[4])) for r, keep in zip(rows, ok, strict=True) if keep],
                            vectors)
                last = int(rows[-1][0])
                n += len(rows)
                step(len(rows))
            stats["memories" if item_type == "memory" else "entries"] = n
        t_index = time.perf_counter()
        await conn.execute("SELECT set_config('maintenance_work_mem', %s, false)",
                           (settings.worker.index_build_memory,))
        await create_space_indexes(conn, space, suffix=_NEW)
        stats["index_seconds"] = time.perf_counter() - t_index
        async with conn.transaction():
            await drop_space_tables(conn, space)
            for item_type in _TYPES:
                await _rename(conn, space, item_type)
        stats.update(space=space.id, model=space.model, dims=space.dims, model_seconds=model_s,
                     seconds=time.perf_counter() - t0)
        log.info("reindex done: %s", stats)
        return stats
    finally:
        await conn.close()
        if owned:
            await prov.aclose()


async def _copy(conn: Any, space: Space, item_type: ItemType, ids: list[tuple[int, int, str]],
                vectors: Any) -> None:
    async with conn.cursor() as cur, cur.copy(
            sql.SQL("COPY {} (item, revision, board, embedding) FROM STDIN WITH (FORMAT BINARY)").format(
                space.table(item_type, _NEW))) as copy:
        copy.set_types(["int8", "int8", "text", "vector"])
        for (item, rev, board), vec in zip(ids, vectors, strict=True):
            await copy.write_row((item, rev, board, vec))


async def _rename(conn: Any, space: Space, item_type: ItemType) -> None:
    new, final = space.table_name(item_type, _NEW), space.table_name(item_type)
    await conn.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(sql.Identifier(new), sql.Identifier(final)))
    for index in ("hnsw", "pkey", "board"):
        await conn.execute(sql.SQL("ALTER INDEX {} RENAME TO {}").format(
            sql.Identifier(f"{new}_{index}"), sql.Identifier(f"{final}_{index}")))
