"""An OpenAI-compatible embeddings API, through the ``openai`` package.

Texts go out in batches of ``batch_size`` (a few batches in flight at once).
The retry loop is ours, not the client's (the client runs with
``max_retries=0``): 408, 409, 429 and 5xx answers and connection failures are
retried up to ``max_retries`` times, waiting for the server's ``Retry-After``
when it sends one and with capped exponential back-off with jitter otherwise.
Any other error fails at once.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from types import TracebackType
from typing import Final, Self

import numpy as np
import openai
from numpy.typing import NDArray

from blackboard.embeddings.base import l2_normalize, parse_retry_after, retry_delay
from blackboard.protocol.errors import ConfigurationError, EmbeddingError, EmbeddingRequestError

__all__ = ["OPENAI_BASE_URL", "OpenAIProvider"]

OPENAI_BASE_URL: Final = "https://api.openai.com/v1"
_RETRY_STATUSES: Final = frozenset({408, 409, 429})
# The API rejects empty strings; a space embeds as "nothing" just as well.
_EMPTY_STAND_IN: Final = " "


def _retry_after_seconds(exc: openai.APIStatusError) -> float | None:
    headers = exc.response.headers
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    return parse_retry_after(headers.get("retry-after"))


class OpenAIProvider:
    """Embeddings from an OpenAI-compatible ``/embeddings`` endpoint.

    Args:
        model: model name sent with each request.
        dimensions: width of the vectors; sent as ``dimensions`` unless
            ``send_dimensions`` is false, and checked on every answer.
        api_key: the key; may be None only with a ``base_url`` (local servers).
        base_url: API root (default: OpenAI's).
        batch_size: most texts per request.
        max_retries: retries of one request after a retryable failure.
        timeout: seconds one request may take.
        send_dimensions: send ``dimensions`` (turn off for servers that reject it).
        max_concurrency: most requests in flight for one :meth:`embed` call.
        backoff_base: first back-off in seconds (doubles on each retry).
        backoff_max: longest wait between attempts, ``Retry-After`` included.

    Raises:
        ConfigurationError: no key for OpenAI's own API.
    """

    def __init__(
        self,
        *,
        model: str,
        dimensions: int,
        api_key: str | None = None,
        base_url: str | None = None,
        batch_size: int = 64,
        max_retries: int = 5,
        timeout: float = 30.0,
        send_dimensions: bool = True,
        max_concurrency: int = 4,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
    ) -> None:
        if batch_size < 1 or dimensions < 1 or max_concurrency < 1 or max_retries < 0:
            raise ValueError("batch_size, dimensions and max_concurrency must be >= 1, max_retries >= 0")
        if api_key is None and base_url is None:
            raise ConfigurationError(
                "the openai embedding provider needs an API key "
                "(BLACKBOARD_EMBEDDING__API_KEY) or a base_url of a server that needs none"
            )
        self._model = model
        self._dimensions = dimensions
        self.batch_size = batch_size
        self.max_retries = max_retries
        self.send_dimensions = send_dimensions
        self.max_concurrency = max_concurrency
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self._rng = random.Random()
        # Key and URL passed explicitly, so the client reads no environment
        # for them; max_retries=0 because retrying is this class's job.
        self._client = openai.AsyncOpenAI(
            api_key=api_key or "unused",
            base_url=base_url or OPENAI_BASE_URL,
            max_retries=0,
            timeout=timeout,
        )

    @property
    def model(self) -> str:
        """The model name sent with each request."""
        return self._model

    @property
    def dimensions(self) -> int:
        """Width of the vectors."""
        return self._dimensions

    async def aclose(self) -> None:
        """Close the HTTP connections (idempotent)."""
        await self._client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        """Embed ``texts`` in batches of ``batch_size``.

        Returns:
            float32 ``(len(texts), dimensions)``, rows L2-normalised, in input order.

        Raises:
            EmbeddingRequestError: a request failed and is not retryable, or ran out of retries.
            EmbeddingError: the answer does not fit the request (count or width).
        """
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not one string")
        out = np.empty((len(texts), self._dimensions), dtype=np.float32)
        if not texts:
            return out
        inputs = [t if t else _EMPTY_STAND_IN for t in texts]
        gate = asyncio.Semaphore(self.max_concurrency)

        async def one(start: int) -> None:
            async with gate:
                out[start : start + self.batch_size] = await self._embed_batch(
                    inputs[start : start + self.batch_size]
                )

        tasks = [asyncio.create_task(one(s)) for s in range(0, len(inputs), self.batch_size)]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return out

    async def _embed_batch(self, batch: list[str]) -> NDArray[np.float32]:
        attempt = 0
        while True:
            try:
                if self.send_dimensions:
                    response = await self._client.embeddings.create(
                        model=self._model, input=batch, dimensions=self._dimensions
                    )
                else:
                    response = await self._client.embeddings.create(model=self._model, input=batch)
                return self._vectors(response, len(batch))
            except openai.APIStatusError as exc:
                status = exc.status_code
                retryable = status in _RETRY_STATUSES or status >= 500
                if not retryable or attempt >= self.max_retries:
                    raise EmbeddingRequestError(
                        f"embeddings request to {self._client.base_url} failed: {exc.message}",
                        status=status,
                        attempts=attempt + 1,
                    ) from exc
                delay = retry_delay(
                    attempt,
                    base=self.backoff_base,
                    cap=self.backoff_max,
                    retry_after=_retry_after_seconds(exc),
                    rng=self._rng,
                )
            except openai.APIConnectionError as exc:  # includes timeouts
                if attempt >= self.max_retries:
                    raise EmbeddingRequestError(
                        f"embeddings request to {self._client.base_url} failed: {exc}",
                        status=None,
                        attempts=attempt + 1,
                    ) from exc
                delay = retry_delay(attempt, base=self.backoff_base, cap=self.backoff_max, rng=self._rng)
            except openai.OpenAIError as exc:
                raise EmbeddingRequestError(
                    f"embeddings request to {self._client.base_url} failed: {exc}",
                    status=None,
                    attempts=attempt + 1,
                ) from exc
            attempt += 1
            await asyncio.sleep(delay)

    def _vectors(self, response: openai.types.CreateEmbeddingResponse, expected: int) -> NDArray[np.float32]:
        data = sorted(response.data, key=lambda d: d.index)
        if len(data) != expected:
            raise EmbeddingError(f"asked for {expected} embeddings, got {len(data)}")
        vectors = np.asarray([d.embedding for d in data], dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self._dimensions:
            got = vectors.shape[1] if vectors.ndim == 2 else "ragged"
            raise EmbeddingError(
                f"model {self._model!r} returned {got}-d vectors, expected {self._dimensions} "
                "(set BLACKBOARD_EMBEDDING__DIMENSIONS to the model's width)"
            )
        return l2_normalize(vectors)
