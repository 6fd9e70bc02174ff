"""The embedding provider Protocol (the swap point) and the pure helpers the
providers share: batch planning, mean pooling, L2 normalisation, and the
retry delay of an API call.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "EmbeddingProvider",
    "l2_normalize",
    "mean_pool",
    "parse_retry_after",
    "plan_batches",
    "retry_delay",
]


@runtime_checkable
class EmbeddingProvider(Protocol):
    """A sentence-embedding model, local or behind an API.

    ``model`` and ``dimensions`` name the vector space: vectors of different
    (model, dimensions) pairs are never compared. Use as ``async with`` (or
    call :meth:`aclose`) to release the model or the HTTP connections.
    """

    @property
    def model(self) -> str:
        """The model's name, e.g. ``all-MiniLM-L6-v2``."""
        ...

    @property
    def dimensions(self) -> int:
        """Width of every vector."""
        ...

    async def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        """Embed ``texts``.

        Returns:
            float32 array of shape ``(len(texts), dimensions)``, rows L2-normalised,
            in the order of ``texts`` (``(0, dimensions)`` for no texts).

        Raises:
            EmbeddingError: the model or the API failed (after any retries).
        """
        ...

    async def aclose(self) -> None:
        """Release the model or the connections (idempotent)."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


def l2_normalize(vectors: NDArray[np.floating]) -> NDArray[np.float32]:
    """Rows scaled to unit length (all-zero rows stay zero), as float32."""
    v = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    out: NDArray[np.float32] = (v / np.maximum(norms, np.float32(1e-12))).astype(np.float32, copy=False)
    return out


def mean_pool(hidden: NDArray[np.floating], mask: NDArray[np.integer]) -> NDArray[np.float32]:
    """Mean of the token vectors that ``mask`` marks as real (sentence-transformers' mean pooling).

    Args:
        hidden: ``(batch, tokens, dims)`` token embeddings.
        mask: ``(batch, tokens)`` attention mask, 1 for real tokens, 0 for padding.
    """
    weights = mask.astype(np.float32)[:, :, None]
    summed = (np.asarray(hidden, dtype=np.float32) * weights).sum(axis=1)
    counts = np.maximum(weights.sum(axis=1), np.float32(1e-9))
    out: NDArray[np.float32] = (summed / counts).astype(np.float32, copy=False)
    return out


def plan_batches(
    lengths: Sequence[int] | NDArray[np.integer], batch_size: int, max_tokens: int | None = None
) -> list[NDArray[np.intp]]:
    """Group texts into model calls, shortest first, so that padding stays small.

    A batch is padded to its longest text, so mixing a 100-token text with
    ten 8-token ones costs as much as eleven 100-token texts: sorting by length
    before cutting batches removes most of that waste.

    Args:
        lengths: token count of each text.
        batch_size: most texts per batch.
        max_tokens: most padded tokens (rows × longest row) per batch; a single
            text longer than this still gets a batch of its own. None: no limit.

    Returns:
        Index arrays into ``lengths``; together they cover every index once.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    lens = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(lens, kind="stable")
    batches: list[NDArray[np.intp]] = []
    start = 0
    n = len(order)
    while start < n:
        end = min(start + batch_size, n)
        if max_tokens is not None:
            # Sorted ascending: the last row of a batch is its longest.
            while end - start > 1 and (end - start) * int(lens[order[end - 1]]) > max_tokens:
                end -= 1
        batches.append(order[start:end].astype(np.intp))
        start = end
    return batches


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date).

    Returns None when the header is missing or unreadable.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def retry_delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> float:
    """Seconds to sleep before retry number ``attempt`` (0 for the first retry).

    The server's ``Retry-After`` wins when given (bounded by ``cap``);
    otherwise exponential back-off ``base * 2**attempt`` capped at ``cap``,
    with jitter in its upper half so that many clients do not retry in step.
    """
    if retry_after is not None:
        return min(max(retry_after, 0.0), cap)
    ceiling = min(cap, base * (2.0**attempt))
    return ceiling * (0.5 + 0.5 * (rng or random).random())
