"""Attachments (agents_sdk.memory.attachments): stores read by stage, hits merged and rendered as
a '## Related memories' block within the token budget (characters and the model's tokenizer),
after-turn writes; through agent.memory on a real server too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from agents_sdk import Agent
from agents_sdk.memory.attachments import (
    CONTEXT_HEADER,
    Attachments,
    RenderedContext,
    merge_store_hits,
    render_related,
)
from agents_sdk.memory.layers import LayerHit
from agents_sdk.memory.stores import (
    LogStore,
    StoreOptions,
    StoreSpec,
    parse_config,
    register_store_type,
)
from agents_sdk.memory.tokens import ModelTokenCounter, chars_counter
from blackboard.protocol.errors import ConfigurationError, InvalidPayloadError, SearchError
from blackboard.settings import AgentMemorySettings, Settings


class FakeStore:
    """A store of fixed hits (its texts, scores descending from 0.9), recording searches and writes."""

    writable = True

    def __init__(self, name: str, texts: Sequence[str] = (), *, kind: str = "fake", writable: bool = True,
                 fail: bool = False) -> None:
        self.name, self.kind, self.writable, self.fail = name, kind, writable, fail
        self.hits = [LayerHit(f"store:{name}", f"{name}-{i}", text, round(0.9 - i * 0.1, 3), "note", name, {})
                     for i, text in enumerate(texts)]
        self.searches: list[tuple[str, int, float]] = []
        self.written: list[tuple[str, dict[str, Any]]] = []
        self.started = self.closed = 0

    async def start(self) -> None:
        self.started += 1

    async def close(self) -> None:
        self.closed += 1

    async def search(self, query: str, top_k: int, threshold: float) -> list[LayerHit]:
        self.searches.append((query, top_k, threshold))
        if self.fail:
            raise SearchError("no worker serves search")
        return list(self.hits)  # ignores top_k and threshold: the attachment enforces them

    async def write(self, text: str, metadata: Mapping[str, Any] | None = None) -> str:
        self.written.append((text, dict(metadata or {})))
        return f"{self.name}-w{len(self.written)}"

    def size(self) -> int:
        return len(self.hits) + len(self.written)


def _attachments(**settings: Any) -> Attachments:
    return Attachments(agent_id="a1", settings=AgentMemorySettings(**settings))


def _hit(i: int, text: str, score: float = 0.5, source: str = "s") -> LayerHit:
    return LayerHit(f"store:{source}", f"h{i}", text, score, "note", source, {})


# -- rendering (pure) ---------------------------------------------------------------------


def test_the_block_keeps_the_best_hits_that_fit_the_character_budget() -> None:
    hits = [_hit(i, f"memory number {i} " + "x" * (200 if i == 1 else 8)) for i in range(5)]
    full = render_related(hits, budget=10_000)
    assert full.text.splitlines() == [CONTEXT_HEADER, *(f"- [s] {h.text}" for h in hits)]
    assert full.messages == [{"role": "user", "content": full.text}]
    assert (full.dropped, full.tokens) == (0, chars_counter(full.text))
    budget = full.tokens - 30  # the long second hit no longer fits; the shorter ones after it do
    ctx = render_related(hits, budget=budget)
    assert [h.id for h in ctx.hits] == ["h0", "h2", "h3", "h4"]
    assert ctx.dropped == 1 and ctx.tokens == chars_counter(ctx.text) <= budget
    for budget in range(1, full.tokens + 1):
        ctx = render_related(hits, budget=budget)
        assert ctx.tokens == (chars_counter(ctx.text) if ctx.text else 0) <= budget
        assert len(ctx.hits) + ctx.dropped == len(hits)


def test_a_budget_too_small_for_the_header_and_one_hit_gives_nothing() -> None:
    ctx = render_related([_hit(0, "a fact worth knowing")], budget=3)
    assert ctx == RenderedContext([], "", [], 0, 1)
    assert render_related([], budget=100) == RenderedContext([], "", [], 0, 0)
    with pytest.raises(InvalidPayloadError):
        render_related([], budget=0)


def test_the_budget_with_the_model_tokenizer_counter() -> None:
    model = ModelTokenCounter()
    # numbers cost the model more tokens than chars/4 says; plain words fewer
    hits = [_hit(0, "the invoice 4417-2209-8812 was paid on 2024-03-05 by 7781-22"),
            _hit(1, "information about international communication"),
            _hit(2, "the shipping address changed to 221B Baker Street")]
    for budget in (10, 20, 30, 40, 60):
        ctx = render_related(hits, budget=budget, counter=model)
        assert ctx.tokens == (model(ctx.text) if ctx.text else 0) <= budget
    by_model = render_related(hits, budget=30, counter=model)
    by_chars = render_related(hits, budget=30, counter=chars_counter)
    assert [h.id for h in by_model.hits] != [h.id for h in by_chars.hits]  # the counter decides what fits
    assert model(CONTEXT_HEADER + "\n" + "- [s] " + hits[1].text) <= 30 < chars_counter(
        CONTEXT_HEADER + "\n" + "- [s] " + hits[1].text) + chars_counter("\n- [s] " + hits[0].text)


def test_long_texts_are_cut_and_kept_on_one_line() -> None:
    ctx = render_related([_hit(0, "line one\nline two  " + "y" * 5000)], budget=10_000, max_item_chars=100)
    line = ctx.text.splitlines()[1]
    assert line.startswith("- [s] line one line two") and len(line) <= len("- [s] ") + 100 and "chars]" in line


def test_merged_hits_are_best_first_and_unique() -> None:
    a = [_hit(1, "alpha", 0.9, "a"), _hit(2, "Beta  fact", 0.4, "a")]
    b = [_hit(3, "gamma", 0.9, "b"), _hit(4, "beta fact", 0.8, "b"), _hit(1, "alpha", 0.3, "a")]
    merged = merge_store_hits([a, b])
    assert [(h.source, h.id) for h in merged] == [("a", "h1"), ("b", "h3"), ("b", "h4")]


# -- attachments by stage -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_each_stage_reads_the_stores_attached_for_it() -> None:
    att = _attachments()
    plans = FakeStore("plans", ["plan: scrape the catalogue first"])
    facts = FakeStore("facts", ["the price is in span.price", "titles are h1"])
    critic = FakeStore("critic", ["check every price has a currency"])
    muted = FakeStore("muted", ["never read"])
    att.attach(plans, stages=["plan"])
    att.attach(facts, stages=("pre", "gen"), top_k=1)
    att.attach(critic, stages=["critique"], similarity_threshold=0.5)
    att.attach(muted, read=False, write=True)
    assert list(att) == ["plans", "facts", "critic", "muted"] and att["facts"].top_k == 1

    seen = {stage: await att.context(stage, "where is the price?") for stage in ("pre", "plan", "gen", "critique")}
    assert [h.text for h in seen["pre"].hits] == ["the price is in span.price"]  # top_k 1
    assert [h.text for h in seen["plan"].hits] == ["plan: scrape the catalogue first"]
    assert [h.text for h in seen["gen"].hits] == ["the price is in span.price"]
    assert [h.text for h in seen["critique"].hits] == ["check every price has a currency"]
    assert seen["plan"].text == f"{CONTEXT_HEADER}\n- [plans] plan: scrape the catalogue first"
    assert muted.searches == [] and len(facts.searches) == 2 and plans.searches == [("where is the price?", 5, 0.0)]
    assert (plans.started, facts.started, muted.started) == (1, 1, 0)  # started once, on first use

    critic.hits.append(LayerHit("store:critic", "weak", "a weak hint", 0.2, "note", "critic", {}))
    assert [h.id for h in (await att.context("critique", "q")).hits] == ["critic-0"]  # below the threshold
    with pytest.raises(InvalidPayloadError, match="unknown stage"):
        await att.context("lunch", "q")  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_after_turn_writes_to_the_write_attachments_only() -> None:
    att = _attachments()
    log, notes, docs = FakeStore("log"), FakeStore("notes"), FakeStore("docs", writable=False)
    att.attach(log, write=True, stages=["pre"])
    att.attach(notes, write=True, read=False)
    att.attach(docs)
    ids = await att.after_turn("the run finished: 12 products", stage="gen", metadata={"step": 3})
    assert ids == ["log-w1", "notes-w1"]
    assert log.written == notes.written == [("the run finished: 12 products", {"step": 3, "stage": "gen"})]
    assert docs.written == []
    assert att.sizes() == {"log": 1, "notes": 1, "docs": 0}
    with pytest.raises(InvalidPayloadError):
        await att.after_turn("  ")


@pytest.mark.asyncio
async def test_a_failing_store_is_named_and_the_others_still_render() -> None:
    att = _attachments()
    att.attach(FakeStore("down", ["x"], fail=True))
    att.attach(FakeStore("up", ["the selector is .price"]))
    ctx = await att.context("pre", "selector")
    assert ctx.failed == ("down",) and [h.text for h in ctx.hits] == ["the selector is .price"]


class _FlakyStart(FakeStore):
    """Its first start fails (a worker not up yet)."""

    async def start(self) -> None:
        self.started += 1
        if self.started == 1:
            raise SearchError("no worker serves search yet")


@pytest.mark.asyncio
async def test_a_store_whose_start_failed_is_started_again_next_time() -> None:
    att = _attachments()
    flaky = _FlakyStart("flaky", ["found at last"])
    att.attach(flaky)
    first = await att.context("pre", "q")
    assert first.failed == ("flaky",) and first.hits == [] and flaky.searches == []
    second = await att.context("pre", "q")
    assert second.failed == () and [h.text for h in second.hits] == ["found at last"]
    await att.context("pre", "q")
    assert flaky.started == 2  # started once it worked, not again
    await att.close()
    assert flaky.closed == 1


@pytest.mark.asyncio
async def test_the_default_budget_comes_from_the_settings() -> None:
    att = _attachments(context_budget=20)
    att.attach(FakeStore("s", [f"fact {i} about the shop's catalogue" for i in range(10)]), top_k=10)
    ctx = await att.context("pre", "q")
    assert 0 < ctx.tokens <= 20 and ctx.dropped > 0
    wide = await att.context("pre", "q", budget=1000)
    assert wide.dropped == 0 and len(wide.hits) == 10
    model = Attachments(agent_id="a1", settings=AgentMemorySettings(context_budget=20), counter=ModelTokenCounter())
    model.attach(FakeStore("s", [f"fact {i} about the shop's catalogue" for i in range(10)]), top_k=10)
    by_model = await model.context("pre", "q")
    assert 0 < by_model.tokens <= 20 and by_model.tokens == ModelTokenCounter()(by_model.text)


def test_attach_checks_its_arguments() -> None:
    att = _attachments()
    with pytest.raises(ConfigurationError, match="read-only"):
        att.attach(FakeStore("docs", writable=False), write=True)
    with pytest.raises(ConfigurationError, match="unknown stage"):
        att.attach(FakeStore("a"), stages=["pre", "later"])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="at least one stage"):
        att.attach(FakeStore("a"), stages=[])
    with pytest.raises(ConfigurationError, match="top_k"):
        att.attach(FakeStore("a"), top_k=0)
    with pytest.raises(ConfigurationError, match="similarity_threshold"):
        att.attach(FakeStore("a"), similarity_threshold=1.5)
    with pytest.raises(ConfigurationError, match="no store named 'ghost'"):
        att.attach("ghost")
    att.attach(FakeStore("same"))
    with pytest.raises(ConfigurationError, match="duplicate store name 'same'"):
        att.attach(FakeStore("same"))
    first = att["same"].store
    assert att.attach(first, top_k=2).top_k == 2  # the same store again: its attachment replaced
    att.detach("same")
    assert "same" not in att


class _FakeOptions(StoreOptions):
    texts: tuple[str, ...] = ()


_FAKE_TYPE = "fake-attach-test"


def _register_fake() -> None:
    from agents_sdk.memory.stores import store_types

    if _FAKE_TYPE not in store_types():
        register_store_type(_FAKE_TYPE, lambda spec, agent: FakeStore(
            spec.name, _FakeOptions.model_validate(dict(spec.options)).texts), options=_FakeOptions)


@pytest.mark.asyncio
async def test_the_config_file_attaches_the_agents_stores(tmp_path: Path) -> None:
    _register_fake()
    path = tmp_path / "memory.toml"
    path.write_text(f"""
[stores.hints]
type = "{_FAKE_TYPE}"
texts = ["retry on 503"]

[stores.facts]
type = "{_FAKE_TYPE}"
texts = ["prices are in EUR"]

[agents.a1.attach.hints]
stages = ["plan"]

[agents.a1.attach.facts]
write = true
top_k = 1

[agents.a2.attach.hints]
stages = ["gen"]
""")

    class _Agent:  # what a factory of the fake type reads: nothing but being passed along
        id = "a1"

    settings = AgentMemorySettings(stores_file=path)
    att = Attachments(_Agent(), settings=settings)  # type: ignore[arg-type]
    assert [(a.name, a.stages, a.write) for a in att.attached] == [
        ("hints", ("plan",), False), ("facts", ("pre", "plan", "gen", "critique"), True)]
    assert [h.text for h in (await att.context("plan", "q")).hits] == ["retry on 503", "prices are in EUR"]
    assert [h.text for h in (await att.context("gen", "q")).hits] == ["prices are in EUR"]
    # a store declared in code under a name the file took
    with pytest.raises(ConfigurationError, match=rf"duplicate store name 'facts' \(already declared at {path}:6\)"):
        att.declare("facts", _FAKE_TYPE)
    extra = att.declare("extra", _FAKE_TYPE, texts=["declared in code"])
    att.attach("extra", stages=["critique"])
    assert [h.text for h in (await att.context("critique", "q")).hits] == ["prices are in EUR", "declared in code"]
    assert att["extra"].store is extra
    # an agent the file attaches nothing to
    other = Attachments(agent_id="nobody", settings=settings)
    assert other.attached == []
    with pytest.raises(ConfigurationError, match="needs the agent"):
        other.attach("hints")
    # a config given as an object, parsed from text
    config = parse_config(f'[stores.h]\ntype = "{_FAKE_TYPE}"\n[agents.a1.attach.h]\n', format="toml")
    assert [a.name for a in Attachments(_Agent(), settings=AgentMemorySettings(), config=config).attached] == ["h"]  # type: ignore[arg-type]
    assert StoreSpec("x", "log").origin == "code"


# -- through agent.memory, on a real server ------------------------------------------------


@pytest.mark.asyncio
async def test_agent_memory_context_by_stage_with_a_log_store(settings: Settings, unique: str) -> None:
    async with Agent.connect(f"{unique}-a", settings=settings) as agent:
        journal = LogStore(agent, "journal")
        agent.memory.attach(journal, write=True, stages=["pre", "critique"], top_k=2)
        written = await agent.memory.after_turn(f"{unique}: fetched page 1 of the catalogue", stage="gen")
        await agent.memory.after_turn(f"{unique}: page 2 had no prices")
        assert len(written) == 1
        pre = await agent.memory.context("pre", "what happened?")
        assert [h.text for h in pre.hits] == [f"{unique}: page 2 had no prices",
                                              f"{unique}: fetched page 1 of the catalogue"]
        assert pre.text.startswith(CONTEXT_HEADER + "\n- [journal] ") and pre.tokens <= 1500
        assert pre.hits[1].metadata == {"stage": "gen"} and pre.hits[0].layer == "store:journal"
        assert (await agent.memory.context("gen", "what happened?")).hits == []  # not attached for gen
        tight = await agent.memory.context("critique", "what happened?", budget=20)
        assert [h.text for h in tight.hits] == [f"{unique}: page 2 had no prices"] and tight.dropped == 1
        assert agent.memory.metrics().sizes.get("store:journal") == 2
