"""Token counters (agents_sdk.memory.tokens): characters / 4, the local model's tokenizer
(offline), tiktoken only from a local cache (a ConfigurationError before any download)."""

from __future__ import annotations

import builtins
import hashlib
from pathlib import Path
from typing import Any

import pytest

from agents_sdk.memory.tokens import (
    TIKTOKEN_ENCODINGS,
    ModelTokenCounter,
    TiktokenCounter,
    chars_counter,
    packaged_tokenizer_path,
    tiktoken_cache_file,
    token_counter,
)
from blackboard.protocol.errors import ConfigurationError
from blackboard.settings import AgentMemorySettings


def test_chars_counter_is_characters_over_four_rounded_up() -> None:
    assert [chars_counter(t) for t in ("", "a", "abcd", "abcde", "x" * 400)] == [0, 1, 1, 2, 100]


def test_the_model_counter_reads_the_packaged_tokenizer_and_counts_wordpieces() -> None:
    path = packaged_tokenizer_path()
    assert path.name == "tokenizer.json" and path.parent.name == "data" and path.is_file()
    count = ModelTokenCounter()
    # WordPiece, uncased, without [CLS]/[SEP]: punctuation is one token each, a rare word several.
    assert count("") == 0
    assert count("hello world") == 2
    assert count("Hello, World!") == 4
    assert count("tokenization") > 1
    # what the embedder counts (blackboard.embeddings.local.count_tokens) is this plus [CLS] and [SEP]
    from blackboard.embeddings.local import count_tokens

    for text in ("hello world", "The quick brown fox; jumps over 13 lazy dogs.", "ünïcödé and 漢字"):
        assert count(text) + 2 == count_tokens(text)


def test_the_model_counter_differs_from_the_characters_estimate() -> None:
    count = ModelTokenCounter()
    digits = "1234567890 " * 20  # WordPiece cuts numbers into pieces: more tokens than chars/4
    words = "information international communication " * 20  # long common words, one token each: fewer
    assert count(digits) > chars_counter(digits)
    assert count(words) == 60 < chars_counter(words)


def test_the_model_counter_refuses_a_missing_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no tokenizer file"):
        ModelTokenCounter(tmp_path / "absent.json")
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigurationError, match="is not a tokenizer"):
        ModelTokenCounter(broken)


def test_the_model_counter_without_tokenizers_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_tokenizers(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "tokenizers":
            raise ImportError("no tokenizers")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tokenizers)
    with pytest.raises(ConfigurationError, match=r"blackboard\[local\]"):
        ModelTokenCounter()


def test_tiktoken_needs_a_cache_folder_holding_the_encoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Any attempt to import tiktoken (which would download) fails the test: the checks come first.
    real_import = builtins.__import__

    def guarded(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("tiktoken"):
            raise AssertionError("tiktoken imported before the cache was checked")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", guarded)
    with pytest.raises(ConfigurationError, match="needs a cache folder"):
        TiktokenCounter("cl100k_base", None)
    with pytest.raises(ConfigurationError, match=r"lacks the file of encoding 'cl100k_base'"):
        TiktokenCounter("cl100k_base", tmp_path)
    with pytest.raises(ConfigurationError, match="unknown tiktoken encoding"):
        TiktokenCounter("no_such_base", tmp_path)
    with pytest.raises(ConfigurationError, match="lacks the file"):
        token_counter(AgentMemorySettings(tokenizer="tiktoken", tiktoken_cache_dir=tmp_path))


def test_the_tiktoken_cache_file_is_named_as_tiktoken_names_it(tmp_path: Path) -> None:
    url = TIKTOKEN_ENCODINGS["o200k_base"]
    assert url.endswith("/o200k_base.tiktoken")
    assert tiktoken_cache_file("o200k_base", tmp_path) == tmp_path / hashlib.sha1(url.encode()).hexdigest()
    # p50k_edit reads p50k_base's file
    assert tiktoken_cache_file("p50k_edit", tmp_path) == tiktoken_cache_file("p50k_base", tmp_path)


def test_tiktoken_with_the_file_cached_but_the_package_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiktoken_cache_file("cl100k_base", tmp_path).write_bytes(b"")
    real_import = builtins.__import__

    def no_tiktoken(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "tiktoken":
            raise ImportError("no tiktoken")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tiktoken)
    with pytest.raises(ConfigurationError, match=r"blackboard\[tiktoken\]"):
        TiktokenCounter("cl100k_base", tmp_path)


def test_token_counter_follows_the_settings() -> None:
    assert token_counter(AgentMemorySettings()) is chars_counter
    model = token_counter(AgentMemorySettings(tokenizer="model"))
    assert isinstance(model, ModelTokenCounter) and model("hello world") == 2


def test_tiktoken_loads_from_the_cache_folder_only_while_loading(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for the tiktoken package (not installed here; its real files cannot be
    # downloaded offline): it records where tiktoken would have looked for its cache.
    import os
    import sys
    import types

    seen: list[str | None] = []

    class _Encoding:
        def encode(self, text: str, disallowed_special: Any = ()) -> list[int]:
            return [0] * len(text.split())

    def get_encoding(name: str) -> _Encoding:
        seen.append(os.environ.get("TIKTOKEN_CACHE_DIR"))
        if name != "cl100k_base":
            raise ValueError("unknown")
        return _Encoding()

    fake = types.ModuleType("tiktoken")
    fake.get_encoding = get_encoding  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tiktoken", fake)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "/elsewhere")
    tiktoken_cache_file("cl100k_base", tmp_path).write_bytes(b"ranks")
    count = token_counter(AgentMemorySettings(tokenizer="tiktoken", tiktoken_cache_dir=tmp_path))
    assert isinstance(count, TiktokenCounter) and count("three words here") == 3
    assert seen == [str(tmp_path)] and os.environ["TIKTOKEN_CACHE_DIR"] == "/elsewhere"  # restored
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    tiktoken_cache_file("o200k_base", tmp_path).write_bytes(b"ranks")
    with pytest.raises(ConfigurationError, match="could not load 'o200k_base'"):
        TiktokenCounter("o200k_base", tmp_path)
    assert "TIKTOKEN_CACHE_DIR" not in os.environ
