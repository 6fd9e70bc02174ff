"""Rerankers (blackboard/search/rerank.py): the pure parts, the LLM reranker against the local
OpenAI-compatible server, a local ONNX cross-encoder, and recall reranked end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agents_sdk import Agent
from blackboard.client.connection import connect_nats
from blackboard.client.streams import ensure_streams
from blackboard.devstack import EmbeddedPostgres
from blackboard.protocol.errors import ConfigurationError, SearchError
from blackboard.search.fusion import Fused
from blackboard.search.rerank import (
    CrossEncoderReranker,
    LLMReranker,
    Reranker,
    apply_rerank,
    parse_ranking,
    passage,
    ranking_scores,
    rerank_messages,
    reranker_from_settings,
)
from blackboard.settings import SearchSettings, Settings
from tests._worker_helpers import HashProvider, fresh_db, remember, running_worker, worker_settings
from tests.conftest import make_settings
from tests.fakes.openai_server import OpenAIFake

_PASSAGE = re.compile(r"^\[(\d+)\] (.*)$", re.M)
_WORD = re.compile(r"[a-z]+")


def _overlap_ranker(messages: list[dict[str, Any]]) -> str:
    """A chat model that ranks the passages by the query words they share (ties: later first)."""
    user = str(messages[-1]["content"])
    query = set(_WORD.findall(user.split("\n", 1)[0].lower()))
    passages = [(int(n), len(query & set(_WORD.findall(t.lower())))) for n, t in _PASSAGE.findall(user)]
    ranking = [n for n, _ in sorted(passages, key=lambda p: (-p[1], -p[0]))]
    return "Sure! Here it is:\n" + json.dumps({"ranking": ranking})


def _reverse_ranker(messages: list[dict[str, Any]]) -> str:
    """A chat model that ranks the passages last first."""
    n = len(_PASSAGE.findall(str(messages[-1]["content"])))
    return json.dumps({"ranking": list(range(n, 0, -1))})


def test_parse_ranking_is_tolerant() -> None:
    assert parse_ranking('{"ranking": [3, 1, 2]}', 3) == [2, 0, 1]
    assert parse_ranking('```json\n{"ranking": [2]}\n```', 3) == [1, 0, 2]  # the rest keep their order
    assert parse_ranking("[4, 4, 9, 1]", 4) == [3, 0, 1, 2]  # repeats and numbers out of range dropped
    assert parse_ranking("Passage 2 is best, then 1.", 3) == [1, 0, 2]
    with pytest.raises(SearchError):
        parse_ranking("I cannot help with that.", 3)


def test_ranking_scores_and_apply_rerank() -> None:
    assert ranking_scores([2, 0, 1], 4) == [0.75, 0.5, 1.0, 0.0]
    fused = [Fused(1, 0.9, {"keyword": 1.0}), Fused(2, 0.8, {}), Fused(3, 0.7, {}), Fused(4, 0.6, {})]
    out = apply_rerank(fused, [0.1, 0.2, 0.9])  # the first three reranked, the fourth after them
    assert [f.item for f in out] == [3, 2, 1, 4]
    assert out[0].score == 1.0 and out[0].parts["rerank"] == 0.9
    assert out[2].parts == {"keyword": 1.0, "rerank": 0.1}
    assert out[3].score <= out[2].score  # the tail never outranks the head
    # weight 0: the fused order stands
    assert [f.item for f in apply_rerank(fused, [0.1, 0.2, 0.9], weight=0.0)] == [1, 2, 3, 4]


def test_the_prompt_numbers_one_line_passages_and_a_passage_shows_short_metadata() -> None:
    messages = rerank_messages("where  did she go?", ["a\nb", "c" * 50], max_chars=10)
    user = messages[-1]["content"]
    assert user.startswith("Query: where did she go?")
    assert "[1] a b\n[2] cccccccccc\n" in user
    assert passage("hi", json.dumps({"speaker": "Ann", "n": 3, "deep": {"x": 1}, "flag": True})) == \
        "(speaker: Ann; n: 3) hi"
    assert passage("hi", None) == "hi"


def test_reranker_from_settings() -> None:
    assert reranker_from_settings(SearchSettings()) is None
    llm = reranker_from_settings(SearchSettings(rerank="llm", rerank_base_url="http://127.0.0.1:9/v1"))
    assert isinstance(llm, LLMReranker) and isinstance(llm, Reranker)
    with pytest.raises(ConfigurationError):
        reranker_from_settings(SearchSettings(rerank="cross-encoder"))


@pytest.mark.asyncio
async def test_the_llm_reranker_orders_by_the_models_answer_and_fails_as_a_search_error() -> None:
    with OpenAIFake(chat=_overlap_ranker) as fake:
        reranker = LLMReranker(model="ranker", base_url=fake.base_url, api_key="test")
        try:
            texts = ["we bought bread", "the falcon nests on the cliff", "where does the falcon nest: on the cliff"]
            scores = await reranker.scores("where does the falcon nest on the cliff", texts)
            assert scores.index(max(scores)) == 2 and scores.index(min(scores)) == 0
            request = fake.requests_to("/v1/chat/completions")[-1].body
            assert request["model"] == "ranker" and request["temperature"] == 0
            fake.fail_next(5, status=500)
            with pytest.raises(SearchError):
                await reranker.scores("falcon", texts)
        finally:
            await reranker.aclose()


def _length_cross_encoder(directory: Path) -> None:
    """An ONNX "cross-encoder" whose logit is the number of the text's tokens (segment 1),
    with the local model's WordPiece tokenizer beside it."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from blackboard.embeddings.local import packaged_model_files

    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["n", "t"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["n", "t"])
    types = helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["n", "t"])
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 1])
    nodes = [helper.make_node("Mul", ["token_type_ids", "attention_mask"], ["second"]),
             helper.make_node("Cast", ["second"], ["secondf"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["secondf", "axes"], ["logits"], keepdims=1)]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    graph = helper.make_graph(nodes, "length", [ids, mask, types], [out], initializer=[axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(directory / "model.onnx"))
    (directory / "tokenizer.json").write_bytes(packaged_model_files().tokenizer.read_bytes())


@pytest.mark.asyncio
async def test_a_local_cross_encoder_scores_each_pair_read_together(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    _length_cross_encoder(tmp_path)
    reranker = reranker_from_settings(SearchSettings(rerank="cross-encoder", rerank_model_path=tmp_path))
    assert isinstance(reranker, CrossEncoderReranker)
    texts = ["one two", "one", "one two three four", ""]
    scores = await reranker.scores("a query of several words", texts)
    # [SEP]-terminated second segments: the text's tokens + 1, padding not counted
    assert scores == [3.0, 2.0, 5.0, 1.0]
    assert np.argsort(scores).tolist() == [3, 1, 0, 2]
    missing = CrossEncoderReranker(tmp_path / "nowhere")
    with pytest.raises(ConfigurationError):
        await missing.scores("q", ["t"])
    await reranker.aclose()


@pytest.mark.asyncio
async def test_recall_is_reranked_by_the_configured_llm_and_falls_back_to_the_fused_order(
        pg_settings: Settings, postgres_server: EmbeddedPostgres, unique: str) -> None:
    base = make_settings(pg_settings.nats.url, fresh_db(postgres_server, unique))
    model = f"hash-rr-{unique}"
    nc = await connect_nats(base.nats, name="rerank")
    js = nc.jetstream()
    await ensure_streams(js, base)
    texts = {"a": "falcon falcon falcon falcon", "b": "a falcon nests high on the cliff at dawn",
             "c": "the falcon flew"}
    for key, text in texts.items():
        await remember(js, unique, "alice", f"{unique}-{key}", text)
    await nc.close()
    query = "where does the falcon nest at dawn"
    with OpenAIFake(chat=_reverse_ranker) as fake:
        for rerank in ("off", "llm"):
            own = base.model_copy(update={"search": base.search.model_copy(update={
                "rerank": rerank, "rerank_base_url": fake.base_url, "rerank_model": "ranker",
                "rerank_depth": 5, "neighbour_weight": 0.0})})
            async with running_worker(worker_settings(own, name=f"{rerank}{unique}"),
                                      provider=HashProvider(32, model)) as w:
                await w.wait_caught_up(30, embedded=True)
                async with Agent.connect(f"{unique}-r", settings=own) as agent:
                    hits = await agent.recall(query, mode="keyword", board=unique, top_k=5)
                    top2 = await agent.recall(query, mode="keyword", board=unique, top_k=2)
                    if rerank == "llm":
                        fake.fail_next(5, status=500)
                        fallback = await agent.recall(query, mode="keyword", board=unique, top_k=2)
            if rerank == "off":
                plain = [h.id for h in hits]
                assert len(plain) == 3 and not fake.requests_to("/v1/chat/completions")
            else:
                # the model read all three (depth 5) and put the last first; cut to top_k
                assert [h.id for h in hits] == plain[::-1]
                assert [h.id for h in top2] == plain[::-1][:2]
                assert "rerank" in hits[0].scores
                asked = fake.requests_to("/v1/chat/completions")[0].body["messages"][-1]["content"]
                assert len(_PASSAGE.findall(asked)) == 3
                assert [h.id for h in fallback] == plain[:2]  # the reranker failed: the fused order
