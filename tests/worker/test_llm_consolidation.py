"""The worker's chat model (worker/llm.py) and the memories it derives (worker/derived.py):
LLM merges of near-duplicates and atomic facts, published signed by the worker with the
provenance of the versions read, and stored by ingest only if those versions are current.

The chat model is the local OpenAI-compatible fake (tests/fakes/openai_server.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from nats.js import JetStreamContext

from agents_sdk import Agent, Verdict
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.devstack import EmbeddedPostgres
from blackboard.protocol import codec
from blackboard.protocol.errors import LLMError
from blackboard.protocol.schemas.provenance import SourceRef
from blackboard.protocol.subjects import MEMORY_STREAM, Subjects
from blackboard.settings import LLMSettings, Settings
from blackboard.worker import Worker
from blackboard.worker.consolidator import Merge
from blackboard.worker.derived import (
    EXTRACT_SOURCE,
    MERGE_SOURCE,
    MemoryVersion,
    fact_records,
    merge_record,
)
from blackboard.worker.llm import (
    EXTRACT_INSTRUCTIONS,
    MAX_FACTS,
    MAX_INPUT_CHARS,
    MERGE_INSTRUCTIONS,
    ChatModel,
    extract_messages,
    merge_messages,
    parse_facts,
    parse_json_answer,
    parse_merged,
)
from tests._worker_helpers import (
    HashProvider,
    StartWorker,
    board_memories_handler,
    dead_letters,
    fresh_db,
    publish_signed,
    remember,
    rows,
    wait_for,
    worker_settings,
)
from tests.conftest import make_settings, stored_memories
from tests.fakes.openai_server import OpenAIFake

_T0 = datetime.now(UTC) - timedelta(minutes=10)

# -- pure: prompts and the tolerant parser ---------------------------------------------------


def test_the_prompts_are_deterministic_and_bounded() -> None:
    assert merge_messages("a", "b") == merge_messages("a", "b")
    merge = merge_messages("x" * 10_000, "second")
    assert merge[0] == {"role": "system", "content": MERGE_INSTRUCTIONS}
    assert merge[1]["content"].count("x") == MAX_INPUT_CHARS and "Memory 2:\nsecond" in merge[1]["content"]
    extract = extract_messages("Alice moved to Paris")
    assert extract[0]["content"] == EXTRACT_INSTRUCTIONS and extract[1]["content"].endswith("Alice moved to Paris")


@pytest.mark.parametrize("answer", [
    '{"facts": ["a", "b"]}',
    'Sure, here they are:\n```json\n{"facts": ["a", "b"]}\n```\nAnything else?',
    'The facts are {"facts": ["a", "b"]} as asked.',
    '```\n["a", "b"]\n```',
    '["a", "b"]',
])
def test_the_parser_finds_the_json_wherever_the_model_put_it(answer: str) -> None:
    assert parse_facts(answer) == ["a", "b"]


def test_facts_are_cleaned_deduplicated_and_bounded() -> None:
    answer = json.dumps({"facts": ["  Alice   lives\nin Paris ", {"fact": "Bob is 30"}, "Alice lives in Paris",
                                   "", 42, None, *(f"f{i}" for i in range(40))]})
    facts = parse_facts(answer)
    assert facts[:3] == ["Alice lives in Paris", "Bob is 30", "f0"] and len(facts) == MAX_FACTS
    assert parse_facts('{"facts": []}') == []
    for bad in ("no json here", '{"other": 1}', '"just a string"'):
        with pytest.raises(LLMError):
            parse_facts(bad)


def test_a_merged_text_is_read_from_json_or_prose() -> None:
    assert parse_merged('{"text": "The cat sat on the mat."}') == "The cat sat on the mat."
    assert parse_merged('Here: ```json\n{"text": "one  text"}\n```') == "one text"
    assert parse_merged("The cat sat on the mat.") == "The cat sat on the mat."
    for bad in ("", "   ", '{"text": ""}', '{"text": 3}'):
        with pytest.raises(LLMError):
            parse_merged(bad)
    with pytest.raises(LLMError):
        parse_json_answer("[unbalanced")


def _version(mid: int, seq: int, text: str, **over: Any) -> MemoryVersion:
    values: dict[str, Any] = dict(mid=mid, id=f"m{mid}", seq=seq, stream=MEMORY_STREAM, board="b", agent="alice",
                                  kind="episodic", text=text, tags=["t1"], metadata={"k": "v"}, importance=0.5,
                                  subject_key=None, created_at=_T0, valid_from=_T0, verdict="verified",
                                  seen_count=1, hits=0,
                                  last_seen=_T0)
    values.update(over)
    return MemoryVersion(**values)


def test_derived_records_name_their_sources_and_have_stable_ids() -> None:
    kept, newer = _version(1, 10, "one"), _version(2, 20, "two", tags=["t2", "t1"], importance=0.9)
    refs = [SourceRef(stream=MEMORY_STREAM, seq=10, key="UKEY", sig="SIG"), SourceRef(stream=MEMORY_STREAM, seq=20)]
    rec = merge_record(kept, newer, "one and two", agent="worker", refs=refs)
    assert rec.v == 2 and rec.agent == "worker" and rec.source == MERGE_SOURCE and rec.provenance == refs
    assert rec.kind == "episodic" and rec.tags == ["t1", "t2"] and rec.importance == 0.9 and rec.metadata == {"k": "v"}
    assert rec.id == merge_record(kept, newer, "other words", agent="worker", refs=refs).id  # the versions decide
    assert rec.key is None and rec.occurred_at is None
    keyed = merge_record(_version(1, 10, "one", subject_key="k"), _version(2, 20, "two", valid_from=_T0 + timedelta(1)),
                         "both", agent="worker", refs=refs)
    assert keyed.key == "k" and keyed.occurred_at == _T0 + timedelta(1)
    facts = fact_records(kept, ["a", "b"], agent="worker", ref=refs[0])
    assert [f.kind for f in facts] == ["semantic", "semantic"] and {f.source for f in facts} == {EXTRACT_SOURCE}
    assert all(f.provenance == [refs[0]] for f in facts) and len({f.id for f in facts}) == 2
    assert [f.id for f in facts] == [f.id for f in fact_records(kept, ["a", "b"], agent="worker", ref=refs[0])]


# -- the chat model against the fake server ----------------------------------------------------------


def responder(merged: str = '{"text": "MERGED"}', facts: list[str] | None = None) -> Any:
    """The fake's chat answers: a merge or facts (in a code fence, among words), by the system prompt."""
    def chat(messages: list[dict[str, Any]]) -> str:
        system = messages[0]["content"]
        if system == MERGE_INSTRUCTIONS:
            return f"Here you go:\n```json\n{merged}\n```"
        if system == EXTRACT_INSTRUCTIONS:
            return "Facts: " + json.dumps({"facts": facts or []})
        return "?"
    return chat


@pytest.mark.asyncio
async def test_the_chat_model_merges_and_extracts_through_an_openai_compatible_server() -> None:
    with OpenAIFake(chat=responder('{"text": "one cat, one mat"}', ["Alice lives in Paris"])) as fake:
        model = ChatModel.from_settings(LLMSettings(base_url=fake.base_url, model="fake-chat"))
        try:
            assert await model.merge("a cat", "a mat") == "one cat, one mat"
            assert await model.extract("Alice lives in Paris, she said") == ["Alice lives in Paris"]
            body = fake.requests_to("/v1/chat/completions")[0].body
            assert body["model"] == "fake-chat" and body["temperature"] == 0
            assert body["messages"] == merge_messages("a cat", "a mat")
            fake.fail_next(5, status=500)
            with pytest.raises(LLMError):
                await model.merge("a", "b")
        finally:
            await model.aclose()


# -- the worker: derived memories on real servers ----------------------------------------------------


@pytest.fixture
def fake_llm() -> Iterator[OpenAIFake]:
    with OpenAIFake(chat=responder('{"text": "A cat sat on a mat (merged)"}',
                                   ["Alice moved to Paris in 2020", "Alice works at Acme"])) as fake:
        yield fake


def llm_settings(pg_settings: Settings, server: EmbeddedPostgres, unique: str, fake: OpenAIFake,
                 **memory: Any) -> Settings:
    own = make_settings(pg_settings.nats.url, fresh_db(server, unique))
    mem = own.memory.model_copy(update={"consolidate_interval": 0.1, "dedup": False, "llm_merge": True, **memory})
    own = own.model_copy(update={"memory": mem, "llm": LLMSettings(base_url=fake.base_url, model="fake-chat")})
    return worker_settings(own, name=f"w{unique}", serve_search=False)


async def start(start_worker: StartWorker, s: Settings, board: str) -> Worker:
    return await start_worker(s, provider=HashProvider(64, f"hash-{board}"),
                              handlers=[board_memories_handler(s, board)])


async def settle(worker: Worker) -> None:
    for _ in range(4):  # derived memories are published, stored, embedded and consolidated in turn
        await worker.wait_caught_up(30, embedded=True, consolidated=True)


@pytest_asyncio.fixture
async def js(pg_settings: Settings) -> AsyncIterator[JetStreamContext]:
    nc = await connect_nats(pg_settings.nats, name="test-llm-consolidation")
    js = nc.jetstream()
    await ensure_streams(js, pg_settings)
    yield js
    await nc.close()


_COLS = ("mid", "id", "seq", "agent", "kind", "text", "source", "verdict", "archived_at", "archive_reason",
         "merged_into", "seen_count")


def memories(s: Settings) -> dict[str, dict[str, Any]]:
    return {r[1]: dict(zip(_COLS, r, strict=True))
            for r in rows(s, f"SELECT {', '.join(_COLS)} FROM bb_memories ORDER BY mid")}


@pytest.mark.asyncio
@pytest.mark.parametrize("dedup", [False, True])
async def test_an_llm_merge_is_a_worker_signed_memory_that_takes_its_sources_place(
        pg_settings: Settings, postgres_server: EmbeddedPostgres, js: JetStreamContext, unique: str,
        start_worker: StartWorker, fake_llm: OpenAIFake, dedup: bool) -> None:
    s = llm_settings(pg_settings, postgres_server, unique, fake_llm, dedup=dedup)
    worker = await start(start_worker, s, unique)
    seq_a = await remember(js, unique, "alice", f"{unique}-a", "the cat sat on the mat", created_at=_T0)
    seq_b = await remember(js, unique, "bob", f"{unique}-b", "On the mat the cat sat!",
                           created_at=_T0 + timedelta(seconds=5))
    await settle(worker)

    rows_ = memories(s)
    [derived] = [r for r in rows_.values() if r["source"] == MERGE_SOURCE]
    assert derived["agent"] == "worker" and derived["verdict"] == "verified"  # signed by the worker identity
    assert derived["text"] == "A cat sat on a mat (merged)" and derived["kind"] == "episodic"
    assert derived["archived_at"] is None and derived["seen_count"] == 2
    for mid in (f"{unique}-a", f"{unique}-b"):
        assert rows_[mid]["archive_reason"] == "merged" and rows_[mid]["merged_into"] == derived["id"]
    srcs = rows(s, "SELECT id, seq, how, sig_key, sig FROM bb_memory_sources WHERE mid = %s ORDER BY seq",
                derived["mid"])
    assert [(i, q, how) for i, q, how, _, _ in srcs] == [(f"{unique}-a", seq_a, "llm"), (f"{unique}-b", seq_b, "llm")]
    assert all(k and sig for *_, k, sig in srcs)
    # the record in the stream names the exact versions read, with the signatures they carried
    [record] = [m for m in await stored_memories(s.nats.url, unique) if m.get("source") == MERGE_SOURCE]
    refs = {p["seq"]: p for p in record["provenance"]}
    assert record["v"] == 2 and set(refs) == {seq_a, seq_b}
    assert [(refs[q]["key"], refs[q]["sig"]) for q in (seq_a, seq_b)] == [(k, sig) for *_, k, sig in srcs]
    assert worker.consolidator is not None and worker.consolidator.stats.llm_merges == 1
    assert worker.consolidator.stats.merged == 0


@pytest.mark.asyncio
async def test_memories_of_the_extract_kinds_become_worker_signed_facts(
        pg_settings: Settings, postgres_server: EmbeddedPostgres, js: JetStreamContext, unique: str,
        start_worker: StartWorker, fake_llm: OpenAIFake) -> None:
    s = llm_settings(pg_settings, postgres_server, unique, fake_llm, llm_merge=False, llm_extract_kinds=["episodic"])
    worker = await start(start_worker, s, unique)
    seq = await remember(js, unique, "alice", f"{unique}-turn", "I moved to Paris in 2020, and I work at Acme now")
    await remember(js, unique, "alice", f"{unique}-note", "how to brew tea", kind="procedural")
    await settle(worker)
    facts = [r for r in memories(s).values() if r["source"] == EXTRACT_SOURCE]
    assert sorted(r["text"] for r in facts) == ["Alice moved to Paris in 2020", "Alice works at Acme"]
    assert all(r["agent"] == "worker" and r["kind"] == "semantic" and r["verdict"] == "verified"
               and r["archived_at"] is None for r in facts)
    records = [m for m in await stored_memories(s.nats.url, unique) if m.get("source") == EXTRACT_SOURCE]
    assert len(records) == 2 and all([p["seq"] for p in m["provenance"]] == [seq] for m in records)
    assert len(fake_llm.requests_to("/v1/chat/completions")) == 1  # not the procedural note, not the facts
    assert worker.consolidator is not None and worker.consolidator.stats.facts == 2


@pytest.mark.asyncio
async def test_an_llm_merge_of_versions_changed_meanwhile_is_stored_as_a_conflict(
        pg_settings: Settings, postgres_server: EmbeddedPostgres, js: JetStreamContext, unique: str,
        start_worker: StartWorker, fake_llm: OpenAIFake) -> None:
    s = llm_settings(pg_settings, postgres_server, unique, fake_llm)
    worker = await start(start_worker, s, unique)
    assert worker.consolidator is not None
    paused, release = asyncio.Event(), asyncio.Event()

    async def slow(merge: Merge) -> None:
        if not paused.is_set():
            paused.set()
            await release.wait()

    worker.consolidator.before_write = slow
    await remember(js, unique, "alice", f"{unique}-a", "the cat sat on the mat", created_at=_T0)
    await remember(js, unique, "alice", f"{unique}-b", "On the mat the cat sat!", created_at=_T0 + timedelta(seconds=5))
    await asyncio.wait_for(paused.wait(), 30)
    new_seq = await remember(js, unique, "alice", f"{unique}-b", "birds sing at dawn in spring",
                             created_at=_T0 + timedelta(seconds=30))
    await wait_for(lambda: memories(s)[f"{unique}-b"]["seq"] == new_seq, 20, "the new version stored")
    release.set()
    await settle(worker)
    rows_ = memories(s)
    [derived] = [r for r in rows_.values() if r["source"] == MERGE_SOURCE]
    assert derived["archived_at"] is not None and derived["archive_reason"] == "conflict"
    assert derived["verdict"] == "verified"
    for mid in (f"{unique}-a", f"{unique}-b"):
        assert rows_[mid]["archived_at"] is None and rows_[mid]["seen_count"] == 1
    assert rows_[f"{unique}-b"]["text"] == "birds sing at dawn in spring"
    assert rows(s, "SELECT count(*) FROM bb_memory_sources") == [(0,)]


@pytest.mark.asyncio
async def test_a_failing_model_leaves_a_plain_merge(
        pg_settings: Settings, postgres_server: EmbeddedPostgres, js: JetStreamContext, unique: str,
        start_worker: StartWorker, fake_llm: OpenAIFake) -> None:
    s = llm_settings(pg_settings, postgres_server, unique, fake_llm)
    worker = await start(start_worker, s, unique)
    fake_llm.fail_next(100, status=500)
    await remember(js, unique, "alice", f"{unique}-a", "the cat sat on the mat", created_at=_T0)
    await remember(js, unique, "alice", f"{unique}-b", "On the mat the cat sat!", created_at=_T0 + timedelta(seconds=5))
    await settle(worker)
    rows_ = memories(s)
    assert rows_[f"{unique}-a"]["archived_at"] is None and rows_[f"{unique}-a"]["seen_count"] == 2
    assert rows_[f"{unique}-b"]["merged_into"] == f"{unique}-a"
    assert worker.consolidator is not None
    assert worker.consolidator.stats.llm_failures == 1 and worker.consolidator.stats.merged == 1


@pytest.mark.asyncio
async def test_a_memory_with_provenance_not_signed_by_a_worker_is_a_dead_letter(
        pg_settings: Settings, postgres_server: EmbeddedPostgres, js: JetStreamContext, unique: str,
        start_worker: StartWorker, fake_llm: OpenAIFake) -> None:
    s = llm_settings(pg_settings, postgres_server, unique, fake_llm)
    worker = await start(start_worker, s, unique)
    subject = Subjects.memory(unique, "mallory")
    payload = codec.encode({"v": 2, "id": f"{unique}-forged", "board": unique, "agent": "mallory",
                            "text": "a merge nobody asked for", "source": MERGE_SOURCE,
                            "created_at": datetime.now(UTC),
                            "provenance": [{"stream": MEMORY_STREAM, "seq": 1}, {"stream": MEMORY_STREAM, "seq": 2}]})
    seq = await publish_signed(js, "mallory", subject, payload)
    await settle(worker)
    assert "wrong_author" in dead_letters(s, subject)[seq]
    assert f"{unique}-forged" not in memories(s)


@pytest.mark.asyncio
async def test_through_the_sdk_both_merged_ids_answer_with_the_derived_memory(
        pg_settings: Settings, start_worker: StartWorker, unique: str, fake_llm: OpenAIFake) -> None:
    """End to end: two agents remember near-duplicates; the worker's LLM merge is what recall
    returns, and either merged id answers with it, its two sources and their signatures."""
    mem = pg_settings.memory.model_copy(update={"consolidate_interval": 0.1, "llm_merge": True})
    s = pg_settings.model_copy(update={"memory": mem, "llm": LLMSettings(base_url=fake_llm.base_url, model="fake")})
    model = f"h-{unique}"
    await start_worker(s, name=f"w{unique}", provider=HashProvider(32, model), query_provider=HashProvider(32, model))
    async with Agent.connect(f"{unique}-a", settings=s) as alice, Agent.connect(f"{unique}-b", settings=s) as bob:
        first = await alice.remember(f"the {unique} cat sat on the mat", board=unique, wait="searchable", timeout=30)
        second = await bob.remember(f"On the mat, the {unique} cat sat!", board=unique, wait="searchable", timeout=30)
        deadline = asyncio.get_running_loop().time() + 30
        while (detail := await alice.memory(second, board=unique)).memory.id == second or not detail.sources:
            assert asyncio.get_running_loop().time() < deadline, "not merged in time"
            await asyncio.sleep(0.1)
        derived = detail.memory
        assert derived.id.startswith("merge-") and derived.agent == "worker" and derived.verdict == Verdict.VERIFIED
        assert derived.text == "A cat sat on a mat (merged)" and derived.seen_count == 2
        assert {(src.id, src.how) for src in detail.sources} == {(first, "llm"), (second, "llm")}
        assert all(src.sig_key and src.sig and src.verdict == Verdict.VERIFIED for src in detail.sources)
        assert (await alice.memory(first, board=unique)).memory.id == derived.id
        hits = await alice.recall("cat sat on the mat merged", board=unique, mode="keyword")
        assert [h.id for h in hits] == [derived.id]
