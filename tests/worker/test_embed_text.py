"""What the worker embeds for a memory: short metadata lines in the writer's key order, ids left out;
a threaded memory with the text of the one before it in its thread (contextual indexing)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np
import psycopg
import pytest

from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.devstack import EmbeddedPostgres
from blackboard.settings import Settings
from blackboard.worker.embed_text import (
    MAX_CONTEXT_CHARS,
    MAX_EMBED_CHARS,
    is_identifier_like,
    memory_embed_lines,
    memory_embed_text,
)
from blackboard.worker.reindex import reindex
from tests._worker_helpers import (
    HashProvider,
    board_memories_handler,
    fresh_db,
    remember,
    running_worker,
    worker_settings,
)
from tests.conftest import make_settings

_IDS = [
    "550e8400-e29b-41d4-a716-446655440000",  # UUID
    "550E8400E29B41D4A716446655440000",  # UUID without hyphens
    "d41d8cd98f00b204e9800998ecf8427e",  # md5
    "0x1a2b3c4d5e6f7a8b",  # hex with 0x
    "9fceb02d0ae598e95dc970b74767f19372d61af8",  # commit id
    "eyJhbGciOiJIUzI1NiJ9",  # base64 (a JWT header)
    "01HZX3K9Q8W7E6R5T4Y3U2I1O0",  # ULID
    "usr_8f3a92b1",  # prefixed id
    "run-20240611",  # prefixed, mostly digits
    "  msg_01H8XYZABCDEF  ",  # surrounding spaces do not hide it
]
_WORDS = [
    "Caroline", "San Francisco", "project-phoenix", "42", "3.14", "2024-06-11", "2024-06-11T10:00:00Z",
    "2024-06-11 10:00:00.5+02:00", "deadbeef", "session_3", "conversation-7", "user_profile_settings",
    "https://example.com/a/b", "D1:3", "", "   ", "a long phrase with 1234567890abcdef in it",
]


@pytest.mark.parametrize("value", _IDS)
def test_identifier_like_values_are_recognised(value: str) -> None:
    assert is_identifier_like(value)


@pytest.mark.parametrize("value", _WORDS)
def test_words_numbers_and_dates_are_not_identifiers(value: str) -> None:
    assert not is_identifier_like(value)


def test_embed_lines_keep_the_mapping_order_and_leave_ids_and_non_text_out() -> None:
    meta = {"speaker": "Caroline", "trace": "550e8400-e29b-41d4-a716-446655440000", "session": 3,
            "flag": True, "nested": {"x": 1}, "long": "y" * 201, "a": "first"}
    assert memory_embed_lines(meta) == "speaker: Caroline\nsession: 3\na: first"
    assert memory_embed_text("hi", meta) == "speaker: Caroline\nsession: 3\na: first\nhi"
    # the lines stored at ingest win over the metadata (whose stored order is jsonb's)
    assert memory_embed_text("hi", {"b": "x"}, lines="z: 1") == "z: 1\nhi"
    assert memory_embed_text("hi", {"b": "x"}, lines="") == "hi"
    assert memory_embed_text("plain") == "plain"
    assert len(memory_embed_text("y" * 5000, lines="k: v")) == 2000


class _Recorder(HashProvider):
    """A hash provider that keeps every text it embeds."""

    def __init__(self, dims: int, model: str) -> None:
        super().__init__(dims, model)
        self.texts: list[str] = []

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.texts.extend(texts)
        return await super().embed(texts)


#: Keys whose writer's order is not jsonb's (jsonb puts shorter keys first).
_META = {"speaker_name": "Caroline", "topic": "hiking", "msg": "msg_01H8XYZABCDEF",
         "sha": "9fceb02d0ae598e95dc970b74767f19372d61af8", "at": "2024-06-11"}
_EXPECTED = "speaker_name: Caroline\ntopic: hiking\nat: 2024-06-11\nwe went hiking at dawn"


@pytest.mark.asyncio
async def test_the_worker_embeds_metadata_in_the_writers_order_without_ids_and_reindex_agrees(
        pg_settings: Settings, postgres_server: EmbeddedPostgres, unique: str) -> None:
    own = make_settings(pg_settings.nats.url, fresh_db(postgres_server, unique))
    s = worker_settings(own, name=f"w{unique}", serve_search=False)
    nc = await connect_nats(s.nats, name="embed-text")
    js = nc.jetstream()
    await ensure_streams(js, s)
    await remember(js, unique, "alice", f"{unique}-1", "we went hiking at dawn", metadata=_META)
    await remember(js, unique, "alice", f"{unique}-2", "no metadata at all")
    await nc.close()
    live = _Recorder(32, f"rec-a-{unique}")
    # Only this board's memories: the session's server holds other tests' entries and memories,
    # which a worker of the default handlers would embed too (and this recorder would keep).
    async with running_worker(s, provider=live, handlers=[board_memories_handler(s, unique)]) as w:
        await w.wait_caught_up(30, embedded=True)
    assert sorted(live.texts) == sorted([_EXPECTED, "no metadata at all"])
    with psycopg.connect(s.postgres.dsn.get_secret_value()) as conn:
        keys = conn.execute("SELECT array(SELECT jsonb_object_keys(metadata)) FROM bb_memories WHERE id = %s",
                            (f"{unique}-1",)).fetchone()
    assert keys is not None and list(keys[0]) != list(_META)  # jsonb's own order: the reason for embed_meta
    # reindex embeds the same text; a row stored before migration 0014 (no embed_meta) falls back to the
    # stored metadata, ids still left out
    again = _Recorder(32, f"rec-b-{unique}")
    await reindex(s, progress=False, provider=again)
    assert sorted(again.texts) == sorted([_EXPECTED, "no metadata at all"])
    with psycopg.connect(s.postgres.dsn.get_secret_value(), autocommit=True) as conn:
        conn.execute("UPDATE bb_memories SET embed_meta = NULL WHERE id = %s", (f"{unique}-1",))
    old = _Recorder(32, f"rec-c-{unique}")
    await reindex(s, progress=False, provider=old)
    fallback = next(t for t in old.texts if t.endswith("dawn"))
    assert sorted(fallback.splitlines()[:-1]) == sorted(_EXPECTED.splitlines()[:-1])
    assert "msg_" not in fallback and "9fceb02d" not in fallback


@pytest.mark.asyncio
async def test_an_sdk_memory_keeps_its_writers_metadata_order_through_the_canonical_encoding(
        pg_settings: Settings, postgres_server: EmbeddedPostgres, unique: str) -> None:
    """The SDK publishes the canonical encoding, whose maps are sorted; the record's
    ``metadata_order`` carries the writer's order to the worker's embedded lines. Metadata
    already in the canonical order adds nothing (a version-1 record)."""
    from agents_sdk import Agent
    from blackboard.protocol.canonical import canonical_key_order
    from tests.conftest import stored_memories

    own = make_settings(pg_settings.nats.url, fresh_db(postgres_server, unique))
    s = worker_settings(own, name=f"w{unique}", serve_search=False)
    sorted_meta = {k: _META[k] for k in canonical_key_order(list(_META))}
    async with Agent.connect(f"{unique}-a", settings=s) as agent:
        first = await agent.remember("we went hiking at dawn", board=unique, metadata=_META)
        second = await agent.remember("we went hiking at dusk", board=unique, metadata=sorted_meta)
    stored = {r["id"]: r for r in await stored_memories(s.nats.url, unique)}
    assert stored[first]["v"] == 2 and stored[first]["metadata_order"] == list(_META)
    assert stored[second]["v"] == 1 and "metadata_order" not in stored[second]
    live = _Recorder(32, f"rec-o-{unique}")
    async with running_worker(s, provider=live, handlers=[board_memories_handler(s, unique)]) as w:
        await w.wait_caught_up(30, embedded=True)
    canonical_lines = "\n".join(line for line in (f"{k}: {v}" for k, v in sorted_meta.items())
                                 if line.split(": ")[0] in ("speaker_name", "topic", "at"))
    assert sorted(live.texts) == sorted([_EXPECTED, canonical_lines + "\nwe went hiking at dusk"])


def test_a_threaded_memory_is_embedded_with_the_previous_text_after_its_own() -> None:
    meta = {"speaker": "Caroline", "thread": "session-3"}
    # the thread links, it is not a line
    assert memory_embed_lines(meta) == "speaker: Caroline"
    assert memory_embed_text("Yes, twice!", meta, context="Have you been to Paris?") == (
        "speaker: Caroline\nYes, twice!\nHave you been to Paris?")
    assert memory_embed_text("Yes", meta, context="  ") == "speaker: Caroline\nYes"
    # the context is bounded and never displaces the memory's own text
    long = memory_embed_text("own", None, context="c" * 5000)
    assert long == "own\n" + "c" * MAX_CONTEXT_CHARS
    assert memory_embed_text("y" * 5000, None, context="ctx") == "y" * MAX_EMBED_CHARS


@pytest.mark.asyncio
async def test_the_worker_embeds_a_threaded_memory_with_the_one_before_it_and_reindex_agrees(
        pg_settings: Settings, postgres_server: EmbeddedPostgres, unique: str) -> None:
    own = make_settings(pg_settings.nats.url, fresh_db(postgres_server, unique))
    s = worker_settings(own, name=f"w{unique}", serve_search=False)
    nc = await connect_nats(s.nats, name="embed-context")
    js = nc.jetstream()
    await ensure_streams(js, s)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    written = [  # (id, text, thread, created_at offset): stored out of thread order on purpose
        ("a2", "Yes, twice last summer!", "t1", 2),
        ("a1", "Have you been to Paris?", "t1", 1),
        ("b1", "Shall we plan the release?", "t2", 3),
        ("n1", "no thread here", None, 4),
        ("a3", "The museums were the best part.", "t1", 5),
    ]
    for mid, text, thread, dt in written:
        await remember(js, unique, "alice", f"{unique}-{mid}", text, created_at=t0 + timedelta(seconds=dt),
                       metadata={"thread": thread} if thread else {})
    await nc.close()
    expected = sorted(["Have you been to Paris?", "Yes, twice last summer!\nHave you been to Paris?",
                       "Shall we plan the release?", "no thread here",
                       "The museums were the best part.\nYes, twice last summer!"])
    live = _Recorder(32, f"rec-ctx-a-{unique}")
    async with running_worker(s, provider=live, handlers=[board_memories_handler(s, unique)]) as w:
        await w.wait_caught_up(30, embedded=True)
    assert sorted(live.texts) == expected
    again = _Recorder(32, f"rec-ctx-b-{unique}")
    await reindex(s, progress=False, provider=again)
    assert sorted(again.texts) == expected
