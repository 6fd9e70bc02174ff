"""Summaries of memory layers: extractive (pure, offline) or by an LLM (docs/memory.md, "Episodes").

Both keep the ``keep`` keys verbatim: their ``key: value`` lines open the summary as they
are, and the rest of the token budget goes to the summary proper.

:func:`extractive_summary` scores each sentence by the document frequency of its words (a
sentence saying what many items say is central), drops near-repeats, and keeps the best in
their original order within ``target_tokens``. :func:`llm_summary` asks an
:class:`~agents_sdk.memory.summarizer.OpenAISummarizer`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Final

from agents_sdk.memory.items import Summary
from agents_sdk.memory.layers import query_terms
from agents_sdk.memory.prompt import TokenCounter, approx_tokens
from agents_sdk.memory.summarizer import OpenAISummarizer

__all__ = ["extractive_summary", "kept_lines", "llm_summary", "sentences"]

_SENTENCE: Final = re.compile(r"(?<=[.!?])\s+|\n+")


def sentences(text: str) -> list[str]:
    """The sentences (and lines) of ``text``, stripped, empty ones left out."""
    return [s.strip() for s in _SENTENCE.split(text) if s.strip()]


def kept_lines(keep: Mapping[str, str]) -> list[str]:
    """The verbatim ``key: value`` lines of the kept keys, in the given order."""
    return [f"{key}: {value}" for key, value in keep.items()]


def _fit(lines: Sequence[str], budget: int, count: TokenCounter) -> list[str]:
    out: list[str] = []
    used = 0
    for line in lines:
        cost = count(line + "\n")
        if used + cost > budget:
            continue  # a shorter later line may still fit
        out.append(line)
        used += cost
    return out


def extractive_summary(texts: Sequence[str], *, target_tokens: int, keep: Mapping[str, str] | None = None,
                       count_tokens: TokenCounter = approx_tokens) -> str:
    """A summary of ``texts`` made of their most central sentences, within ``target_tokens``
    (counted by ``count_tokens``) beside the kept keys' lines, which come first and verbatim
    (they are kept even when they alone exceed the target).

    A sentence's score is the mean, over its distinct words, of the share of texts holding the
    word; a sentence whose words are all in a chosen one is a repeat and left out. Ties go to
    the earlier sentence. Pure and deterministic.
    """
    head = kept_lines(keep or {})
    budget = max(0, target_tokens - sum(count_tokens(line + "\n") for line in head))
    candidates: list[tuple[int, str, frozenset[str]]] = []
    df: Counter[str] = Counter()
    for text in texts:
        words: set[str] = set()
        for sentence in sentences(text):
            terms = query_terms(sentence)
            candidates.append((len(candidates), sentence, terms))
            words |= terms
        df.update(words)
    n = max(1, len(texts))
    scored = sorted(candidates, key=lambda c: (-(sum(df[w] for w in c[2]) / (n * len(c[2])) if c[2] else 0.0), c[0]))
    chosen: list[tuple[int, str]] = []
    covered: list[frozenset[str]] = []
    used = 0
    for index, sentence, terms in scored:
        if any(terms <= seen for seen in covered) or (not terms and any(s == sentence for _, s in chosen)):
            continue
        cost = count_tokens(sentence + "\n")
        if used + cost > budget:
            continue
        chosen.append((index, sentence))
        covered.append(terms)
        used += cost
    body = [s for _, s in sorted(chosen)]
    if not body and scored and budget > 0:  # no whole sentence fits: the best one, cut to the budget
        body = [_cut(scored[0][1], budget, count_tokens)]
    return "\n".join(head + [line for line in body if line])


def _cut(sentence: str, budget: int, count: TokenCounter) -> str:
    """The longest word prefix of ``sentence`` (with an ellipsis) that fits ``budget``."""
    words = sentence.split()
    lo, hi = 0, len(words)
    while lo < hi:  # the most words whose line fits
        mid = (lo + hi + 1) // 2
        if count(" ".join(words[:mid]) + " …\n") <= budget:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo]) + " …" if lo else ""


async def llm_summary(summarizer: OpenAISummarizer, texts: Sequence[str], *, target_tokens: int,
                      keep: Mapping[str, str] | None = None,
                      count_tokens: TokenCounter = approx_tokens) -> str:
    """A summary of ``texts`` by ``summarizer``'s model, after the kept keys' verbatim lines;
    cut to ``target_tokens`` by lines if the model wrote more.

    Raises:
        LLMError: the request failed or the answer was empty.
    """
    head = kept_lines(keep or {})
    items = [Summary(id=f"m{i}", text=text, count=1) for i, text in enumerate(texts)]
    text = await summarizer.summarize(items)
    budget = max(0, target_tokens - sum(count_tokens(line + "\n") for line in head))
    lines = [line for line in text.splitlines() if line.strip()]
    body: list[str] = []
    used = 0
    for line in lines:  # in order: a model's summary reads top down
        cost = count_tokens(line + "\n")
        if used + cost > budget:
            break
        body.append(line)
        used += cost
    return "\n".join(head + (body or _fit(lines[:1], budget, count_tokens)))
