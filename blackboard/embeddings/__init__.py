"""Embedding providers: the Protocol, the offline MiniLM model, an OpenAI-compatible API.

::

    async with provider_from_settings(settings.embedding) as provider:
        vectors = await provider.embed(["first text", "second text"])  # (2, dims) float32
"""

from __future__ import annotations

from blackboard.embeddings.base import (
    EmbeddingProvider,
    l2_normalize,
    mean_pool,
    parse_retry_after,
    plan_batches,
    retry_delay,
)
from blackboard.embeddings.local import (
    LOCAL_DIMENSIONS,
    LOCAL_MODEL,
    LOCAL_MODEL_ALIASES,
    LocalModelFiles,
    LocalProvider,
    packaged_model_files,
)
from blackboard.embeddings.openai import OpenAIProvider
from blackboard.protocol.errors import ConfigurationError
from blackboard.settings import EmbeddingSettings

__all__ = [
    "LOCAL_DIMENSIONS",
    "LOCAL_MODEL",
    "LOCAL_MODEL_ALIASES",
    "EmbeddingProvider",
    "LocalModelFiles",
    "LocalProvider",
    "OpenAIProvider",
    "l2_normalize",
    "mean_pool",
    "packaged_model_files",
    "parse_retry_after",
    "plan_batches",
    "provider_from_settings",
    "retry_delay",
]


def provider_from_settings(settings: EmbeddingSettings, *, queries: bool = False) -> EmbeddingProvider:
    """The provider ``settings`` describe (no IO: the model loads on first use).

    ``queries``: the instance embeds search queries, one at a time (the local
    provider then runs its quantised copy, one thread, if
    ``settings.quantized_queries``).

    Raises:
        ConfigurationError: the local provider is asked for another model or
            width than all-MiniLM-L6-v2's 384, or the openai provider has no key
            and no base_url.
    """
    if settings.provider == "local":
        if settings.model not in LOCAL_MODEL_ALIASES:
            raise ConfigurationError(
                f"the local embedding provider runs {LOCAL_MODEL} only, not {settings.model!r}"
            )
        if settings.dimensions != LOCAL_DIMENSIONS:
            raise ConfigurationError(
                f"{LOCAL_MODEL} has {LOCAL_DIMENSIONS} dimensions, not {settings.dimensions}"
            )
        # settings.batch_size is the size of the callers' batches (and of API
        # requests); the model's own batches are smaller (see LocalProvider).
        if queries and settings.quantized_queries:
            return LocalProvider(quantized=True, threads=1)
        return LocalProvider(threads=settings.threads, parallel=settings.parallel)
    return OpenAIProvider(
        model=settings.model,
        dimensions=settings.dimensions,
        api_key=settings.api_key.get_secret_value() if settings.api_key else None,
        base_url=settings.base_url,
        batch_size=settings.batch_size,
        max_retries=settings.max_retries,
        timeout=settings.timeout,
        send_dimensions=settings.send_dimensions,
    )
