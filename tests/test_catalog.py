"""The model catalog: dated ids match their family, overrides win, unknown is None."""

from __future__ import annotations

import datetime

import pytest

from normandy_core import ModelCatalog, StaticCatalog, default_catalog
from normandy_core.conversation.catalog import CATALOG_CHECKED, DEFAULT_WINDOWS


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("claude-sonnet-4-5", 200_000),
        ("claude-sonnet-4-5-20250929", 200_000),
        ("claude-3-5-sonnet-20241022", 200_000),
        ("claude-3-5-sonnet@20240620", 200_000),  # Vertex AI style
        ("openrouter/anthropic/claude-opus-4-1", 200_000),
        ("gpt-4o-2024-08-06", 128_000),
        ("gpt-4o-mini-2024-07-18", 128_000),
        ("gpt-4.1-mini-2025-04-14", 1_047_576),
        ("gpt-4-0613", 8_192),
        ("gpt-4-turbo-2024-04-09", 128_000),
        ("gpt-5-mini-2025-08-07", 400_000),
        ("o1-mini-2024-09-12", 128_000),
        ("o1-2024-12-17", 200_000),
        ("gemini-2.5-pro-preview-06-05", 1_048_576),
        ("qwen3-coder:30b", 262_144),
    ],
)
def test_dated_and_tagged_ids_match_their_longest_prefix(model, window):
    assert default_catalog().window(model) == window


@pytest.mark.parametrize(
    "model", ["", "totally-unknown", "claude", "gpt-4oxyz", "gpt4o", "Claude-Sonnet-4-5"]
)
def test_unknown_models_are_none(model):
    assert default_catalog().window(model) is None


def test_overrides_add_and_win():
    cat = StaticCatalog(overrides={"my-model": 32_000, "gpt-4o": 64_000})
    assert cat.window("my-model") == 32_000
    assert cat.window("my-model-2025-01-01") == 32_000
    assert cat.window("gpt-4o-2024-08-06") == 64_000
    assert cat.window("gpt-4o-mini") == 128_000  # a longer default prefix still wins
    assert cat.window("claude-sonnet-4-5") == 200_000
    dated = StaticCatalog(overrides={"claude-sonnet-4-5-20250929": 1_000_000})
    assert dated.window("claude-sonnet-4-5-20250929") == 1_000_000
    assert dated.window("claude-sonnet-4-5") == 200_000
    only = StaticCatalog({"a": 1_000}, include_defaults=False)
    assert only.window("a-1") == 1_000
    assert only.window("claude-sonnet-4-5") is None
    assert only.models() == ["a"]
    assert default_catalog().window("my-model") is None  # overrides never leak


@pytest.mark.parametrize("bad", [0, -1, True, "8k", 1.5])
def test_bad_override_windows_are_refused(bad):
    with pytest.raises(ValueError, match="must be a positive int"):
        StaticCatalog(overrides={"m": bad})


def test_default_table_is_sane_and_dated():
    assert default_catalog() is default_catalog()
    assert isinstance(default_catalog(), ModelCatalog)
    datetime.date.fromisoformat(CATALOG_CHECKED)
    assert all(isinstance(w, int) and w > 0 for w in DEFAULT_WINDOWS.values())
    providers = ("claude-", "gpt-", "gemini-", "llama-")
    for prefix in providers:
        assert any(m.startswith(prefix) for m in DEFAULT_WINDOWS), prefix
