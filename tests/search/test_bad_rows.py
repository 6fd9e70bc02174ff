"""Readers are isolated from bad rows: one stored item that cannot be read back (a timestamp past
Python's year 9999, JSON nested beyond the parser's depth, a value of the wrong shape, bytes that
are not msgpack) is skipped, logged and counted; it never fails the search, the history read or
the message search that meets it (issue 18, finding 3)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgpack
import psycopg
import pytest
import pytest_asyncio
from psycopg_pool import AsyncConnectionPool

from blackboard.db import migrate, open_pool
from blackboard.db.spaces import ensure_space
from blackboard.devstack import EmbeddedPostgres
from blackboard.protocol import codec
from blackboard.protocol.errors import SearchError
from blackboard.protocol.schemas.message_search import MessageSearchRequest, MessageSearchResponse
from blackboard.protocol.schemas.search import (
    AsOfRequest,
    EntrySearchRequest,
    HistoryRequest,
    MemorySearchRequest,
    MemorySearchResponse,
)
from blackboard.search.engine import SearchEngine
from blackboard.search.history import EntryHistory
from blackboard.search.messages import search_messages
from blackboard.search.rows import SkippedRows, encode_response
from tests._worker_helpers import HashProvider, drop_db, fresh_db

pytestmark = pytest.mark.asyncio

#: The finding's timestamp, ``9999-12-31T23:59:59-23:59``, as the worker's binary COPY stored it
#: (microseconds since 2000 in UTC: 10000-01-01T23:58:59Z, past the last datetime Python has;
#: PostgreSQL's own text input refuses offsets past 15:59).
FAR_FUTURE = "10000-01-01 23:58:59+00"
#: JSON nested deeper than Python's json parser goes (RecursionError).
DEEP = "[" * 5000 + "]" * 5000


@dataclass
class Db:
    dsn: str
    pool: AsyncConnectionPool
    provider: HashProvider


_MEMORIES: list[tuple[str, dict[str, Any]]] = [
    ("good1", {}),
    ("good2", {}),
    ("far_created", {"created_at": FAR_FUTURE}),
    ("far_updated", {"updated_at": FAR_FUTURE}),
    ("infinite_created", {"created_at": "infinity"}),
    ("before_year_one", {"created_at": "0001-01-01 00:00:00+15"}),
    ("deep_metadata", {"metadata": DEEP}),
    ("list_metadata", {"metadata": "[1, 2]"}),
]


@pytest_asyncio.fixture(scope="module")
async def db(postgres_server: EmbeddedPostgres) -> AsyncIterator[Db]:
    from tests.conftest import make_settings

    name = "badrows" + uuid.uuid4().hex[:10]
    dsn = fresh_db(postgres_server, name)
    s = make_settings("nats://127.0.0.1:1", dsn)
    await migrate(s)
    provider = HashProvider()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        space = await ensure_space(conn, provider.model, provider.dimensions)
    vector = provider.vector("zeppelin harbour").tolist()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i, (mid, bad) in enumerate(_MEMORIES, 1):
            cols = {"created_at": "2024-05-01T10:00:00Z", "updated_at": "2024-05-01T10:00:00Z", "metadata": "{}",
                    **bad}
            row = conn.execute(
                "INSERT INTO bb_memories (id, board, agent, kind, text, search_text, metadata, created_at, "
                "updated_at, stream, seq) VALUES (%s, 'b', 'a', 'episodic', %s, %s, %s::jsonb, %s::timestamptz, "
                "%s::timestamptz, 'BB_MEMORY', %s) RETURNING mid",
                (mid, f"zeppelin harbour {mid}", f"zeppelin harbour {mid}", cols["metadata"], cols["created_at"],
                 cols["updated_at"], i)).fetchone()
            assert row is not None
            conn.execute(f"INSERT INTO {space.table_name('memory')} (item, revision, board, embedding) "
                         "VALUES (%s, %s, 'b', %s::vector)", (row[0], i, str(vector)))
        entries: list[tuple[str, dict[str, Any]]] = [
            ("good", {}),
            ("far_updated", {"updated_at": FAR_FUTURE}),
            ("deep_value", {"value": DEEP}),
            ("not_msgpack", {"value": None, "value_raw": b"\xc1"}),
        ]
        for i, (key, bad) in enumerate(entries, 1):
            cols = {"value": '"zeppelin"', "value_raw": None, "updated_at": "2024-05-01T10:00:00Z", **bad}
            conn.execute(
                "INSERT INTO bb_entries (board, section, key, stream, revision, value, value_raw, search_text, "
                "created_at, updated_at) VALUES ('b', 's', %s, 'KV', %s, %s::jsonb, %s, %s, now(), "
                "%s::timestamptz)", (key, i, cols["value"], cols["value_raw"], f"zeppelin {key}", cols["updated_at"]))
        # Three revisions of one key, the middle one unreadable.
        for seq, created in ((1, "2024-05-01T10:00:00Z"), (2, FAR_FUTURE), (3, "2024-05-01T10:00:02Z")):
            conn.execute(
                "INSERT INTO bb_entry_revisions (stream, seq, board, section, key, op, value, created_at, stored_at) "
                "VALUES ('KV', %s, 'b', 's', 'k', 'PUT', '1', %s::timestamptz, %s::timestamptz)",
                (seq, created, f"2024-05-01T10:00:0{seq}Z"))
        for seq, created, body in ((1, "2024-05-01T10:00:00Z", '"zeppelin"'), (2, FAR_FUTURE, '"zeppelin"'),
                                   (3, "2024-05-01T10:00:00Z", DEEP), (4, "2024-05-01T10:00:00Z", '"zeppelin"')):
            conn.execute(
                "INSERT INTO bb_messages (stream, seq, id, sender, kind, board, body, subject, created_at, stored_at, "
                "search_text) VALUES ('BB_MSG', %s, %s, 'a', 'direct', 'b', %s::jsonb, 'bb.msg', %s::timestamptz, "
                "now(), 'zeppelin')", (seq, f"msg{seq}", body, created))
    async with open_pool(s.postgres, min_size=1, max_size=4, check=False, autocommit=True) as pool:
        yield Db(dsn, pool, provider)
    drop_db(postgres_server, name)


async def test_the_bad_rows_break_a_plain_read(db: Db) -> None:
    """The rows of this module are unreadable as they stand (what the searches below survive)."""
    async with db.pool.connection() as conn:
        for column in ("created_at", "updated_at"):
            with pytest.raises(psycopg.DataError, match=r"too (large|small)"):
                await (await conn.execute(f"SELECT {column} FROM bb_memories WHERE board = 'b'")).fetchall()
        with pytest.raises(RecursionError):
            await (await conn.execute("SELECT metadata FROM bb_memories WHERE id = 'deep_metadata'")).fetchall()


@pytest.mark.parametrize("mode", ["keyword", "semantic", "hybrid"])
async def test_a_memory_search_skips_the_rows_it_cannot_read(db: Db, mode: str) -> None:
    engine = SearchEngine(db.pool, db.provider, _settings())
    res = await engine.search_memories(MemorySearchRequest(query="zeppelin harbour", mode=mode, top_k=50))
    assert {h.id for h in res.hits} == {"good1", "good2"}
    assert engine.skipped.total >= len(_MEMORIES) - 2  # each bad row counted (once per statement it was in)
    assert set(engine.skipped.counts) == {"memory"}


@pytest.mark.parametrize("mode", ["keyword", "semantic", "hybrid"])
async def test_a_memory_search_without_a_board_filter_still_answers(db: Db, mode: str) -> None:
    engine = SearchEngine(db.pool, db.provider, _settings())
    res = await engine.search_memories(MemorySearchRequest(query="zeppelin", mode=mode, top_k=50))
    assert {h.id for h in res.hits} == {"good1", "good2"}


async def test_an_entry_search_skips_the_rows_it_cannot_read(db: Db) -> None:
    engine = SearchEngine(db.pool, db.provider, _settings())
    res = await engine.search_entries(EntrySearchRequest(query="zeppelin", mode="keyword", top_k=50))
    assert [h.key for h in res.hits] == ["good"]
    assert engine.skipped.counts["entry"] == 3


async def test_history_skips_an_unreadable_revision_and_as_of_names_it(db: Db) -> None:
    history = EntryHistory(db.pool)
    res = await history.history(HistoryRequest(board="b", section="s", key="k"))
    assert [r.revision for r in res.revisions] == [1, 3]
    assert history.skipped.counts["revision"] == 1
    assert (await history.as_of(AsOfRequest(board="b", section="s", key="k", revision=1))).revision == 1
    with pytest.raises(SearchError, match=r"revision 2 .* cannot be read"):
        await history.as_of(AsOfRequest(board="b", section="s", key="k", revision=2))


async def test_a_message_search_skips_the_rows_it_cannot_read(db: Db) -> None:
    skipped = SkippedRows()
    for query in ("zeppelin", None):
        res = await search_messages(db.pool, MessageSearchRequest(query=query, boards=["b"], top_k=50),
                                    skipped=skipped)
        assert sorted(h.seq for h in res.hits) == [1, 4]
    assert skipped.counts["message"] == 4


async def test_a_reply_drops_the_hits_its_encoding_cannot_carry() -> None:
    """A value the reply's encoding cannot carry (an integer past 64 bits in msgpack, nesting past
    either encoder's depth) costs its hit, not the reply."""
    from datetime import UTC, datetime

    from blackboard.protocol.schemas.search import MemoryHit

    def hit(mid: str, metadata: dict[str, Any]) -> MemoryHit:
        now = datetime.now(UTC)
        return MemoryHit(id=mid, board="b", agent="a", kind="episodic", text="t", tags=[], metadata=metadata,
                         importance=0.5, created_at=now, updated_at=now, revision=1, score=1.0)

    res = MemorySearchResponse(hits=[hit("good", {"n": 1}), hit("big", {"n": 2**70}), hit("deep", {"n": _nest(1500)})], took_ms=1.0)
    with pytest.raises(Exception):  # noqa: B017 - what the reply meets without the guard
        codec.encode(res.model_dump())
    skipped = SkippedRows()
    for encoding in ("msgpack", "json"):
        data = encode_response(res, encoding, skipped)
        decoded = msgpack.unpackb(data) if encoding == "msgpack" else __import__("json").loads(data)
        kept = [h["id"] for h in decoded["hits"]]
        # (JSON can carry the big integer; whether a reply may is the protocol's limits' call)
        assert kept == ["good"] if encoding == "msgpack" else kept[0] == "good" and "deep" not in kept
        assert decoded["took_ms"] == 1.0
    assert skipped.counts["hit"] >= 3  # big and deep in msgpack, deep (at least) in JSON
    ok = MessageSearchResponse(hits=[], took_ms=0.0)
    assert codec.decode(encode_response(ok, "msgpack", skipped)) == codec.decode(codec.encode(ok.model_dump()))


def _nest(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def _settings() -> Any:
    from blackboard.settings import SearchSettings

    return SearchSettings(exact_scan_max_rows=0)



