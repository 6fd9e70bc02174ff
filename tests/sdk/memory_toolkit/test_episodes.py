"""Episodes scope agent.memory's local layers; ending one summarizes it into long-term memory
(extractive by default, LLM when configured), keeping chosen keys verbatim, then clears it."""

from __future__ import annotations

from typing import Any

import pytest

from agents_sdk import Agent
from agents_sdk.memory import EpisodeSummary, extractive_summary
from agents_sdk.memory.episodes import Episode
from agents_sdk.memory.summarize import kept_lines, llm_summary, sentences
from agents_sdk.memory.summarizer import OpenAISummarizer
from agents_sdk.memory.tokens import chars_counter
from blackboard.protocol.errors import InvalidKeyError, InvalidPayloadError, LLMError, NotFoundError
from blackboard.protocol.schemas import MemoryRecord, validate_wire
from blackboard.settings import AgentMemorySettings, LLMSettings, Settings
from tests.conftest import stored_memories
from tests.fakes.openai_server import OpenAIFake

TEXTS = [
    "The product page lists the price in span.price. The title is in h1.title.",
    "Page two lists the price in span.price as well. Reviews load late.",
    "The price in span.price includes tax. Shipping is extra.",
]


def test_extractive_summary_keeps_the_central_sentences_in_order_within_the_target() -> None:
    text = extractive_summary(TEXTS, target_tokens=30, count_tokens=chars_counter)
    lines = text.splitlines()
    assert lines[0] == "The product page lists the price in span.price."  # the most shared words
    assert chars_counter(text) <= 30 + len(lines)  # each line counted with its newline
    assert all(line in " ".join(TEXTS) for line in lines)
    # the chosen sentences keep their order in the texts
    order = [" ".join(TEXTS).index(line) for line in lines]
    assert order == sorted(order)
    # a bigger target takes more, the whole text at most; the same input, the same summary
    assert len(extractive_summary(TEXTS, target_tokens=500)) > len(text)
    assert extractive_summary(TEXTS, target_tokens=30) == extractive_summary(TEXTS, target_tokens=30)


def test_extractive_summary_drops_repeats_and_keeps_keys_verbatim_first() -> None:
    repeated = ["The price is in span.price.", "The price is in span.price.", "span.price has the price."]
    assert extractive_summary(repeated, target_tokens=100).splitlines() == ["The price is in span.price."]
    keep = {"selector": "span.price  (with two spaces, verbatim)", "sku": "SKU-12"}
    text = extractive_summary(TEXTS, target_tokens=40, keep=keep)
    assert text.splitlines()[:2] == ["selector: span.price  (with two spaces, verbatim)", "sku: SKU-12"]
    assert kept_lines(keep) == text.splitlines()[:2]
    # keys are kept even when they alone exceed the target
    assert extractive_summary(TEXTS, target_tokens=1, keep=keep).splitlines() == kept_lines(keep)
    assert extractive_summary([], target_tokens=10) == ""
    # one sentence longer than the target: cut at a word, not left out
    long = extractive_summary(["the price " * 100 + "is high."], target_tokens=20)
    assert long.startswith("the price the price") and long.endswith(" …") and chars_counter(long + "\n") <= 20
    assert sentences("One. Two!\nThree?  ") == ["One.", "Two!", "Three?"]


@pytest.mark.asyncio
async def test_llm_summary_puts_the_kept_keys_before_the_models_text() -> None:
    with OpenAIFake(chat=lambda messages: "Prices are in span.price.\nTitles in h1.") as fake:
        summarizer = OpenAISummarizer.from_settings(LLMSettings(base_url=fake.base_url, model="sum"))
        text = await llm_summary(summarizer, TEXTS, target_tokens=100, keep={"sku": "SKU-12"})
        assert text == "sku: SKU-12\nPrices are in span.price.\nTitles in h1."
        sent = fake.requests_to("/v1/chat/completions")[0].body["messages"][1]["content"]
        assert all(t in sent for t in TEXTS)
        short = await llm_summary(summarizer, TEXTS, target_tokens=8)
        assert short == "Prices are in span.price."  # cut by lines to the target
        await summarizer.aclose()


def test_an_episode_is_bounded_by_the_settings_and_validates_its_ids() -> None:
    settings = AgentMemorySettings(short_term_max_items=2, working_ttl=5.0)
    episode = Episode.new("task-1", "ep-1", settings)
    for i in range(3):
        episode.short_term.add(note=f"n{i}")
    assert [i.extra["note"] for i in episode.short_term] == ["n1", "n2"]
    assert episode.working.set("k", "v").expires_at is not None
    assert episode.texts() == ["n1", "n2", "k: v"] and episode.keyed() == {"k": "v"}
    with pytest.raises(InvalidKeyError):
        Episode.new("task 1", "ep", settings)
    with pytest.raises(InvalidKeyError):
        Episode.new("task", "", settings)


async def _summaries(settings: Settings, board: str) -> list[MemoryRecord]:
    return [validate_wire(MemoryRecord, raw, strict=True) for raw in await stored_memories(settings.nats.url, board)]


def with_memory(settings: Settings, **fields: Any) -> Settings:
    return settings.model_copy(update={"agent_memory": settings.agent_memory.model_copy(update=fields)})


@pytest.mark.asyncio
async def test_episodes_scope_the_local_layers(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=with_memory(settings, auto_summarize=False)) as agent:
        memory = agent.memory
        await memory.write("in the default episode")
        first = memory.begin_episode("scrape", "ep-1")
        assert memory.episode is first and (first.task_id, first.episode_id) == ("scrape", "ep-1")
        assert len(memory.short_term) == 0  # a fresh episode's memory
        st = await memory.write("in episode one", key="where")
        await memory.write("goal of one", layer="working", key="goal")
        assert st.startswith("st:ep-1:")
        nested = memory.begin_episode("scrape")  # a new id; ends nothing
        assert len(nested.episode_id) == 16 and memory.episode is nested and not first.ended
        assert (await memory.read(st)).text == "in episode one"  # an open episode's item, by id
        with pytest.raises(InvalidPayloadError, match="open already"):
            memory.begin_episode("scrape", "ep-1")
        assert await memory.end_episode() is None  # auto_summarize off
        assert nested.ended and memory.episode is first and memory.working.get("goal") == "goal of one"
        assert await memory.end_episode() is None
        assert first.ended and len(first.short_term) == 0  # cleared
        assert memory.episode.episode_id == "default"
        assert [h.text for h in await memory.search("episode", layers=["short_term"])] == ["in the default episode"]
        # ending the default episode clears it and keeps it
        await memory.end_episode()
        assert memory.episode.episode_id == "default" and len(memory.short_term) == 0
        async with memory.episode_scope("t2", "scoped") as scoped:
            assert memory.episode is scoped
            await memory.write("inside")
        assert scoped.ended and memory.episode.episode_id == "default"
        with pytest.raises(RuntimeError):
            async with memory.episode_scope("t3") as failing:
                await memory.write("before the error")
                raise RuntimeError("boom")
        assert failing.ended  # ended on the error too


@pytest.mark.asyncio
async def test_ending_an_episode_summarizes_it_into_long_term_memory(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=with_memory(settings, long_term_board=unique,
                                                                  summary_tokens=40)) as agent:
        memory = agent.memory
        async with memory.episode_scope("scrape-shop", "ep-7"):
            for text in TEXTS:
                await memory.write(text)
            await memory.write("span.price", layer="working", key="price_selector")
            summary = await memory.end_episode(keep_keys=["price_selector", "absent"])
        records = await _summaries(settings, unique)
    assert summary is not None and summary.kept == {"price_selector": "span.price"}
    assert len(records) == 1
    rec = records[0]
    assert (rec.kind, rec.tags, rec.source, rec.agent) == ("summary", ["episode-summary"], "episode", agent.id)
    assert rec.metadata == {"task_id": "scrape-shop", "episode_id": "ep-7", "items": 4}
    assert rec.text.splitlines()[0] == "price_selector: span.price"
    assert "span.price" in rec.text.splitlines()[1]
    assert (rec.id, rec.text, summary.tokens) == (summary.memory_id, summary.text, agent.memory.counter(rec.text))
    assert summary.tokens <= 40 + len(rec.text.splitlines())


@pytest.mark.asyncio
async def test_the_summary_returned_and_the_llm_strategy(settings: Settings, unique: str) -> None:
    with OpenAIFake(chat=lambda messages: "The shop's prices are in span.price.") as fake:
        llm = settings.llm.model_copy(update={"base_url": fake.base_url, "model": "sum"})
        configured = with_memory(settings, long_term_board=unique, summarize_strategy="llm")
        configured = configured.model_copy(update={"llm": llm})
        async with Agent.connect(f"{unique}-a", settings=configured) as agent:
            memory = agent.memory
            memory.begin_episode("t", "e1")
            await memory.write("SKU-1 costs 3 euros", key="sku")
            summary = await memory.end_episode(keep_keys=["sku"])
            assert isinstance(summary, EpisodeSummary)
            assert (summary.task_id, summary.episode_id, summary.strategy, summary.board, summary.items) == (
                "t", "e1", "llm", unique, 1)
            assert summary.text == "sku: SKU-1 costs 3 euros\nThe shop's prices are in span.price."
            assert summary.kept == {"sku": "SKU-1 costs 3 euros"} and summary.tokens == memory.counter(summary.text)
            # the model fails: nothing is cleared, the episode stays current
            memory.begin_episode("t", "e2")
            await memory.write("kept on failure")
            fake.fail_next(3, status=500)  # the first try and the client's two retries
            with pytest.raises(LLMError):
                await memory.end_episode()
            assert memory.episode.episode_id == "e2" and len(memory.short_term) == 1
            # summarize=False: cleared without a summary
            assert await memory.end_episode(summarize=False) is None
            # an empty episode writes nothing
            memory.begin_episode("t", "e3")
            assert await memory.end_episode() is None
            records = await _summaries(settings, unique)
        assert [r.id for r in records] == [summary.memory_id]


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_an_episodes_local_operations_with_its_clocks() -> None:
    wall, mono = _Clock(1_000_000.0), _Clock(50.0)
    episode = Episode.new("t", "e", AgentMemorySettings(working_ttl=None), agent="me", clock=wall, monotonic=mono)
    old = episode.short_term.add(note="an old price note", tags=("price",), confidence=0.2)
    wall.now += 100
    new = episode.short_term.add(note="a new price note", key="latest")
    first = episode.working.set("a", "alpha price")
    mono.now += 100
    episode.working.set("b", "beta")
    mono.now += 5
    episode.working.touch("a")
    # search: lexical score, newest first on ties, filters
    hits = episode.search("short_term", "price note", {}, 10)
    assert [h.id for h in hits] == [episode.item_id(new), episode.item_id(old)] and hits[0].score == 1.0
    assert [h.provenance["agent"] for h in hits] == ["me", "me"]
    assert [h.id for h in episode.search("short_term", "price", {"tags_all": ["price"]}, 10)] == [
        episode.item_id(old)]
    assert episode.search("short_term", "price", {"author": "other"}, 10) == []
    assert [h.id for h in episode.search("working", "price", {}, 10)] == ["wm:a"]
    assert episode.search("working", "price", {"tags_any": ["x"]}, 10) == []
    # find and select
    assert episode.find_item("latest") is new and episode.find_item(str(old.id)) is old
    assert episode.find_note("wm:b").value == "beta" and first.key == "a"
    with pytest.raises(NotFoundError):
        episode.find_item("nothing")
    assert [h.id for h in episode.select("short_term", "old", ())] == [episode.item_id(old)]
    assert [h.id for h in episode.select("working", None, ["b"])] == ["wm:b"]
    # prune by the episode's clocks: short-term by write time, working lru by the last write
    assert episode.prune("short_term", "old_age", 50, dry_run=True) == [episode.item_id(old)]
    assert episode.prune("working", "lru", 50, dry_run=True) == []  # a was touched 5 s ago, b written 5 s ago
    assert episode.prune("working", "old_age", 50, dry_run=True) == ["wm:a"]  # a was first written 105 s ago
    assert episode.prune("short_term", "low_confidence", 0.5) == [episode.item_id(old)]
    assert len(episode.short_term) == 1
    # replace by a summary
    written = episode.replace("working", episode.select("working", None, ()), "a and b")
    assert written == "wm:summary" and [n.key for n in episode.working.live()] == ["summary"]
