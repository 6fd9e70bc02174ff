"""Token counters: how ``agent.memory`` measures its prompt context budget.

A counter is any ``Callable[[str], int]``
(:data:`~agents_sdk.memory.prompt.TokenCounter`). Three are built in, chosen by
``settings.agent_memory.tokenizer`` through :func:`token_counter`:

* ``chars``: :func:`chars_counter`, characters / 4 rounded up (the estimate
  :func:`~agents_sdk.memory.prompt.approx_tokens` of the prompt renderer);
  costs nothing, needs nothing.
* ``model``: :class:`ModelTokenCounter`, the WordPiece tokenizer of the local
  embedding model (all-MiniLM-L6-v2), offline and exact for that model. Its
  ``tokenizer.json`` ships with blackboard as package data
  (``blackboard/embeddings/data/``, where the embedder reads it and checks its
  digest); the SDK may not import the embeddings package (the import rules of
  docs/architecture.md), so it reads the same file as package data of the
  ``blackboard`` distribution (:func:`packaged_tokenizer_path`). Needs the
  ``tokenizers`` package (the ``local`` extra).
* ``tiktoken``: :class:`TiktokenCounter`, an OpenAI encoding (``cl100k_base``,
  ``o200k_base``...) through the optional ``tiktoken`` package (the
  ``tiktoken`` extra). tiktoken downloads an encoding's file on first use and
  keeps it in a cache folder; offline that download fails, so the counter must
  be given ``cache_dir``, a folder that already holds the file, and raises
  :class:`~blackboard.protocol.errors.ConfigurationError` before anything is
  downloaded when it does not.

The model and tiktoken counters count a text's tokens without special tokens
(no ``[CLS]``/``[SEP]``): what the text adds to a prompt.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import os
import threading
from pathlib import Path
from typing import Any, Final

from agents_sdk.memory.prompt import TokenCounter, approx_tokens
from blackboard.protocol.errors import ConfigurationError
from blackboard.settings import AgentMemorySettings

__all__ = ["TIKTOKEN_ENCODINGS", "ModelTokenCounter", "TiktokenCounter", "chars_counter",
           "packaged_tokenizer_path", "tiktoken_cache_file", "token_counter"]

#: Where the local embedding model's tokenizer is, inside the ``blackboard`` package.
_TOKENIZER_RESOURCE: Final = "embeddings/data/tokenizer.json"
_BLOB: Final = "https://openaipublic.blob.core.windows.net/encodings/"
#: The tiktoken encodings :class:`TiktokenCounter` knows, with the address tiktoken
#: downloads each one's file from (its cache names the file by the SHA-1 of it).
TIKTOKEN_ENCODINGS: Final = {name: f"{_BLOB}{name}.tiktoken"
                             for name in ("r50k_base", "p50k_base", "p50k_edit", "cl100k_base", "o200k_base")}
_TIKTOKEN_FILE: Final = {"p50k_edit": "p50k_base"}  # p50k_edit reads p50k_base's ranks


def chars_counter(text: str) -> int:
    """Characters / 4, rounded up (:func:`~agents_sdk.memory.prompt.approx_tokens`)."""
    return approx_tokens(text)


def packaged_tokenizer_path() -> Path:
    """The local embedding model's ``tokenizer.json``, shipped as package data of blackboard.

    Raises:
        ConfigurationError: the file is missing (a broken install).
    """
    resource = importlib.resources.files("blackboard").joinpath(_TOKENIZER_RESOURCE)
    path = Path(str(resource))
    if not path.is_file():
        raise ConfigurationError(f"the local model's tokenizer is missing ({path}); reinstall blackboard")
    return path


class ModelTokenCounter:
    """Counts tokens as the local embedding model's WordPiece tokenizer makes them,
    without ``[CLS]``/``[SEP]`` and without truncation. Offline; thread-safe.

    Args:
        path: A ``tokenizer.json`` (default: :func:`packaged_tokenizer_path`).

    Raises:
        ConfigurationError: ``tokenizers`` is not installed, or the file is missing or
            not a tokenizer.
    """

    name: Final = "model"

    def __init__(self, path: Path | None = None) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ConfigurationError("tokenizer 'model' needs the tokenizers package: "
                                     "pip install 'blackboard[local]'") from exc
        self.path = path or packaged_tokenizer_path()
        if not self.path.is_file():
            raise ConfigurationError(f"no tokenizer file at {self.path}")
        try:
            tokenizer = Tokenizer.from_file(str(self.path))
        except Exception as exc:  # tokenizers raises plain Exceptions
            raise ConfigurationError(f"{self.path} is not a tokenizer: {exc}") from exc
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> int:
        if not text:
            return 0
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def __repr__(self) -> str:
        return f"ModelTokenCounter({str(self.path)!r})"


def tiktoken_cache_file(encoding: str, cache_dir: Path) -> Path:
    """The file tiktoken's cache keeps ``encoding``'s ranks in: ``cache_dir`` / the SHA-1 of
    the address it downloads them from.

    Raises:
        ConfigurationError: an encoding :data:`TIKTOKEN_ENCODINGS` does not list.
    """
    if encoding not in TIKTOKEN_ENCODINGS:
        raise ConfigurationError(f"unknown tiktoken encoding {encoding!r}; known: {', '.join(TIKTOKEN_ENCODINGS)}")
    url = TIKTOKEN_ENCODINGS[_TIKTOKEN_FILE.get(encoding, encoding)]
    return cache_dir / hashlib.sha1(url.encode()).hexdigest()


#: tiktoken reads its cache folder from the environment only: the variable is set
#: around the one call that loads an encoding, under this lock.
_env_lock = threading.Lock()


class TiktokenCounter:
    """Counts tokens with a tiktoken encoding loaded from a local cache, never downloading.

    ``cache_dir`` must already hold the encoding's file under tiktoken's cache name
    (:func:`tiktoken_cache_file`; tiktoken writes it there when run once online with
    ``TIKTOKEN_CACHE_DIR`` pointing at the folder).

    Args:
        encoding: The encoding (:data:`TIKTOKEN_ENCODINGS`).
        cache_dir: The folder holding its file.

    Raises:
        ConfigurationError: no ``cache_dir``, the file is not in it (checked before
            tiktoken is imported, so nothing is downloaded), ``tiktoken`` is not installed,
            or it could not load the file.
    """

    name: Final = "tiktoken"

    def __init__(self, encoding: str = "cl100k_base", cache_dir: Path | None = None) -> None:
        if cache_dir is None:
            raise ConfigurationError("tokenizer 'tiktoken' needs a cache folder holding the encoding's file "
                                     "(agent_memory.tiktoken_cache_dir): tiktoken downloads it otherwise")
        cache_dir = Path(cache_dir)
        file = tiktoken_cache_file(encoding, cache_dir)
        if not file.is_file():
            raise ConfigurationError(f"the tiktoken cache {cache_dir} lacks the file of encoding {encoding!r} "
                                     f"({file.name}); fill it once online with TIKTOKEN_CACHE_DIR={cache_dir}")
        try:
            import tiktoken
        except ImportError as exc:
            raise ConfigurationError("tokenizer 'tiktoken' needs the tiktoken package: "
                                     "pip install 'blackboard[tiktoken]'") from exc
        self.encoding_name = encoding
        self.cache_dir = cache_dir
        with _env_lock:
            before = os.environ.get("TIKTOKEN_CACHE_DIR")
            os.environ["TIKTOKEN_CACHE_DIR"] = str(cache_dir)
            try:
                self._encoding: Any = tiktoken.get_encoding(encoding)
            except Exception as exc:  # a corrupt file makes tiktoken try the network, which fails
                raise ConfigurationError(f"tiktoken could not load {encoding!r} from {cache_dir}: {exc}") from exc
            finally:
                if before is None:
                    os.environ.pop("TIKTOKEN_CACHE_DIR", None)
                else:
                    os.environ["TIKTOKEN_CACHE_DIR"] = before

    def __call__(self, text: str) -> int:
        return len(self._encoding.encode(text, disallowed_special=()))

    def __repr__(self) -> str:
        return f"TiktokenCounter({self.encoding_name!r}, cache_dir={str(self.cache_dir)!r})"


def token_counter(settings: AgentMemorySettings) -> TokenCounter:
    """The counter ``settings.tokenizer`` names (see the module doc).

    Raises:
        ConfigurationError: the counter cannot be set up (a missing package or file).
    """
    if settings.tokenizer == "model":
        return ModelTokenCounter()
    if settings.tokenizer == "tiktoken":
        return TiktokenCounter(settings.tiktoken_encoding, settings.tiktoken_cache_dir)
    return chars_counter
