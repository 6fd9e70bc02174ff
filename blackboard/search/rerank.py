"""Rerankers: a second, closer look at a memory search's leading candidates.

Retrieval (keyword, semantic, their fusion) scores each memory on its own
against the query, with cheap models; a reranker reads the query and each
of the leading candidates together and orders them again. On LoCoMo the
right turns are among the first 50 fused candidates for ~0.9 of the
evidence, against ~0.77 among the first 10: a good reranker has room.

* :class:`Reranker`: the protocol (the swap point): ``scores(query, texts)``,
  one relevance score per text, higher is more relevant; ``aclose()``.
* :class:`LLMReranker`: an OpenAI-compatible chat model
  (``search.rerank = "llm"``) is shown the query and the numbered passages
  and answers with their numbers, most relevant first
  (:func:`rerank_messages`, :func:`parse_ranking`, :func:`ranking_scores`).
* :class:`CrossEncoderReranker`: a local cross-encoder in ONNX
  (``search.rerank = "cross-encoder"``, ``search.rerank_model_path``: a
  directory with ``model.onnx`` and its ``tokenizer.json``, e.g. an export of
  ``cross-encoder/ms-marco-MiniLM-L-6-v2``), run with onnxruntime in a
  worker thread; nothing is downloaded.
* :func:`apply_rerank`: the reranked head of the fused list, its scores
  blended with the fused ones (``search.rerank_weight``), the tail after it.
* :func:`reranker_from_settings`: the configured one (no IO), or None.

The engine reranks memory searches of every mode when one is configured: it
asks retrieval for ``max(top_k, search.rerank_depth)`` results, reranks
them, and cuts to ``top_k``. A reranker that fails (an API error, a bad
answer) is logged and the fused order stands: a recall never fails because
of it. The default offline setup has none (``search.rerank = "off"``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from blackboard.protocol.errors import ConfigurationError, SearchError
from blackboard.search.fusion import Fused
from blackboard.settings import SearchSettings

__all__ = ["CrossEncoderReranker", "LLMReranker", "Reranker", "apply_rerank", "parse_ranking", "passage",
           "ranking_scores", "rerank_messages", "reranker_from_settings"]

log = logging.getLogger("blackboard.search.rerank")

_INT_RE = re.compile(r"\d+")
_SYSTEM = ("You rank passages by how well they help answer a query. Reply with JSON only: "
           '{"ranking": [passage numbers, most relevant first]}. Include every passage number once.')


@runtime_checkable
class Reranker(Protocol):
    """Scores candidates against a query, reading both together."""

    async def scores(self, query: str, texts: Sequence[str]) -> list[float]:
        """One relevance score per text (higher: more relevant), in the texts' order.

        Raises:
            SearchError: the reranker failed.
        """
        ...

    async def aclose(self) -> None:
        """Release what the reranker holds (a client, a model session)."""
        ...


#: Metadata values longer than this are left out of a reranked passage.
_MAX_PASSAGE_META = 100


def passage(text: str, metadata: str | dict[str, Any] | None) -> str:
    """What a reranker reads of a memory: its short scalar metadata as ``key: value`` (who said
    it, when), then its text. ``metadata``: the stored JSON text or the parsed object."""
    meta: Any = metadata
    if isinstance(metadata, str):
        try:
            meta = json.loads(metadata)
        except ValueError:
            meta = None
    pairs = [f"{k}: {v}" for k, v in (meta.items() if isinstance(meta, dict) else ())
             if isinstance(v, str | int | float) and not isinstance(v, bool) and 0 < len(str(v)) <= _MAX_PASSAGE_META]
    return f"({'; '.join(pairs)}) {text}" if pairs else text


def rerank_messages(query: str, texts: Sequence[str], *, max_chars: int = 1000) -> list[dict[str, str]]:
    """The chat messages asking a model to rank ``texts`` (numbered from 1) for ``query``;
    each text cut to ``max_chars`` and put on one line."""
    passages = "\n".join(f"[{i}] {' '.join(t[:max_chars].split())}" for i, t in enumerate(texts, 1))
    return [{"role": "system", "content": _SYSTEM},
            {"role": "user", "content": f"Query: {' '.join(query.split())}\n\nPassages:\n{passages}\n\n"
                                        f"Rank all {len(texts)} passages."}]


def parse_ranking(answer: str, n: int) -> list[int]:
    """The passage indexes (0-based) of a model's ranking answer, most relevant first.

    Tolerant: the JSON object ``{"ranking": [...]}`` (or a bare JSON list), else
    the integers of the text in order; numbers outside 1..n and repeats are
    dropped, and passages the answer leaves out follow in their own order.

    Raises:
        SearchError: the answer names no passage at all.
    """
    numbers: list[Any] = []
    start, end = answer.find("{"), answer.rfind("}")
    parsed: Any = None
    if 0 <= start < end:
        try:
            parsed = json.loads(answer[start:end + 1])
        except ValueError:
            parsed = None
    if isinstance(parsed, dict):
        found = parsed.get("ranking")
        numbers = found if isinstance(found, list) else []
    if not numbers:
        lo, hi = answer.find("["), answer.rfind("]")
        if 0 <= lo < hi:
            try:
                got = json.loads(answer[lo:hi + 1])
                numbers = got if isinstance(got, list) else []
            except ValueError:
                numbers = []
    if not numbers:
        numbers = [int(m) for m in _INT_RE.findall(answer)]
    order: list[int] = []
    seen: set[int] = set()
    for x in numbers:
        try:
            i = int(x) - 1
        except (TypeError, ValueError):
            continue
        if 0 <= i < n and i not in seen:
            seen.add(i)
            order.append(i)
    if not order:
        raise SearchError(f"the reranker's answer ranks no passage: {answer[:200]!r}")
    return order + [i for i in range(n) if i not in seen]


def ranking_scores(order: Sequence[int], n: int) -> list[float]:
    """Scores in 0..1 from a ranking (the first 1.0, then evenly lower), in passage order."""
    out = [0.0] * n
    for pos, i in enumerate(order):
        out[i] = 1.0 - pos / n if n else 0.0
    return out


def apply_rerank(fused: Sequence[Fused], scores: Sequence[float], *, weight: float = 1.0) -> list[Fused]:
    """The head of ``fused`` (as many as ``scores``) ordered by ``weight`` x the reranker's
    score (min-max normalised over the head) + (1 - weight) x the fused score, then the
    rest in its order, scored no higher than the head's last. Each reranked result's
    ``parts`` gains ``"rerank"`` (the reranker's raw score)."""
    head, tail = list(fused[:len(scores)]), list(fused[len(scores):])
    if not head:
        return list(fused)
    raw = np.asarray(scores, dtype=np.float64)
    lo, hi = float(raw.min()), float(raw.max())
    norm = (raw - lo) / (hi - lo) if hi > lo else np.ones_like(raw)
    blended = [Fused(f.item, weight * float(r) + (1 - weight) * f.score, {**f.parts, "rerank": float(s)})
               for f, r, s in zip(head, norm, raw, strict=True)]
    order = sorted(range(len(blended)), key=lambda i: -blended[i].score)  # stable: ties keep fused order
    out = [blended[i] for i in order]
    floor = out[-1].score
    out.extend(Fused(f.item, min(f.score, floor), f.parts) for f in tail)
    return out


class LLMReranker:
    """Ranks with an OpenAI-compatible chat model (one request per search).

    Args:
        model: the chat model.
        base_url: the API's base URL (None: api.openai.com).
        api_key: its key (a local server may take any).
        timeout: seconds one request may take.
        max_chars: characters of each passage shown.
    """

    def __init__(self, *, model: str, base_url: str | None = None, api_key: str | None = None,
                 timeout: float = 10.0, max_chars: int = 1000) -> None:
        from openai import AsyncOpenAI

        self.model = model
        self.max_chars = max_chars
        self._client = AsyncOpenAI(base_url=base_url, api_key=api_key or "none", timeout=timeout, max_retries=1)

    async def scores(self, query: str, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        import openai

        try:
            reply = await self._client.chat.completions.create(
                model=self.model, temperature=0,
                messages=rerank_messages(query, texts, max_chars=self.max_chars))  # type: ignore[arg-type]
        except openai.OpenAIError as exc:
            raise SearchError(f"the LLM reranker failed: {exc}") from exc
        answer = reply.choices[0].message.content if reply.choices else None
        return ranking_scores(parse_ranking(answer or "", len(texts)), len(texts))

    async def aclose(self) -> None:
        await self._client.close()


class CrossEncoderReranker:
    """A local cross-encoder in ONNX: each (query, text) pair read together, one logit out.

    Args:
        path: a directory holding ``model.onnx`` and ``tokenizer.json``, or the ``.onnx``
            file with ``tokenizer.json`` beside it. The model takes ``input_ids``,
            ``attention_mask`` (and ``token_type_ids`` if it declares them) and gives
            logits of shape (n, 1) (the score) or (n, 2) (the second column's log-odds).
        max_length: tokens of a pair at most (the text is cut, not the query).
        threads: onnxruntime intra-op threads.

    Raises:
        ConfigurationError: (on first use) the files are missing or onnxruntime/tokenizers
            are not installed (``pip install blackboard[local]``).
    """

    def __init__(self, path: str | Path, *, max_length: int = 512, threads: int = 1) -> None:
        p = Path(path)
        self.model_file = p / "model.onnx" if p.is_dir() else p
        self.tokenizer_file = self.model_file.parent / "tokenizer.json"
        self.max_length = max_length
        self.threads = threads
        self._session: Any = None
        self._tokenizer: Any = None
        self._inputs: set[str] = set()
        self._lock = asyncio.Lock()

    def _load(self) -> None:
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ConfigurationError("the cross-encoder reranker needs onnxruntime and tokenizers "
                                     "(pip install blackboard[local])") from exc
        for f in (self.model_file, self.tokenizer_file):
            if not f.is_file():
                raise ConfigurationError(f"cross-encoder reranker: {f} not found")
        tokenizer = Tokenizer.from_file(str(self.tokenizer_file))
        tokenizer.enable_truncation(max_length=self.max_length, strategy="only_second")
        tokenizer.enable_padding()
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        session = ort.InferenceSession(str(self.model_file), sess_options=options,
                                       providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in session.get_inputs()}
        self._tokenizer, self._session = tokenizer, session

    def _run(self, query: str, texts: Sequence[str]) -> list[float]:
        if self._session is None:
            self._load()
        encodings = self._tokenizer.encode_batch([(query, t) for t in texts])
        feeds = {"input_ids": np.asarray([e.ids for e in encodings], dtype=np.int64),
                 "attention_mask": np.asarray([e.attention_mask for e in encodings], dtype=np.int64)}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.asarray([e.type_ids for e in encodings], dtype=np.int64)
        logits = np.asarray(self._session.run(None, feeds)[0], dtype=np.float64)
        if logits.ndim == 1:
            return [float(x) for x in logits]
        if logits.shape[1] == 1:
            return [float(x) for x in logits[:, 0]]
        return [float(x) for x in logits[:, -1] - logits[:, 0]]

    async def scores(self, query: str, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        async with self._lock:  # one session, one call at a time
            try:
                return await asyncio.to_thread(self._run, query, list(texts))
            except ConfigurationError:
                raise
            except Exception as exc:  # onnxruntime raises its own untyped errors
                raise SearchError(f"the cross-encoder reranker failed: {exc}") from exc

    async def aclose(self) -> None:
        self._session = None


def reranker_from_settings(settings: SearchSettings) -> Reranker | None:
    """The reranker ``settings.rerank`` names (no IO: a model loads on first use), or None.

    Raises:
        ConfigurationError: ``cross-encoder`` without ``rerank_model_path``.
    """
    if settings.rerank == "llm":
        key = settings.rerank_api_key.get_secret_value() if settings.rerank_api_key else None
        return LLMReranker(model=settings.rerank_model, base_url=settings.rerank_base_url, api_key=key,
                           timeout=settings.rerank_timeout, max_chars=settings.rerank_max_chars)
    if settings.rerank == "cross-encoder":
        if settings.rerank_model_path is None:
            raise ConfigurationError("search.rerank = 'cross-encoder' needs search.rerank_model_path")
        return CrossEncoderReranker(settings.rerank_model_path)
    return None
