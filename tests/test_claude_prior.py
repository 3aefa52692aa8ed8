"""The first count for Claude models: o200k_base's exact count times a documented factor.

Anthropic publishes no tokenizer for Claude 3 and later. The reference this repository
can hold for the demo session is what the published sources support, since the session
is synthetic and no Anthropic reply ever counted it: Claude's tokenizer (Claude 3 to
Opus 4.6) makes 1.16 to 1.30 times o200k_base's tokens by content (English articles to
Python code; :data:`~normandy_core.conversation.tokens.CLAUDE_O200K_FACTOR`), and the
tokenizer of Claude Opus 4.7 and later 1.0 to 1.35 times that (Anthropic's documentation;
:data:`~normandy_core.conversation.tokens.CLAUDE_4_7_O200K_FACTOR`). The documented
error of each prior is its distance to the ends of that range.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from normandy_core import (
    AgentMemory,
    CalibratedCounter,
    Calibration,
    default_counter_for,
    get_counter,
)
from normandy_core.app.demo import DEMO_MODEL, load_session
from normandy_core.conversation.tokens import (
    CLAUDE_4_7_O200K_FACTOR,
    CLAUDE_O200K_FACTOR,
    ScaledCounter,
)
from normandy_core.transcripts.anthropic import from_anthropic

#: Claude (3 to Opus 4.6) tokens per o200k token, lowest and highest published by content.
LOW, HIGH = 1.16, 1.30
#: The range of the Opus 4.7 tokenizer against the previous one, as Anthropic states it.
NEW_LOW, NEW_HIGH = 1.0, 1.35
#: The documented error of each prior against the ends of its range (docs/concepts.md):
#: 1.30 / 1.16 and 1.76 / 1.16, less one.
PRIOR_OVER, PRIOR_4_7_OVER = 0.121, 0.518


def _demo_messages() -> tuple[str, list[dict[str, Any]]]:
    """The bundled demo session as one Anthropic transcript, every turn in order."""
    session = load_session()
    messages: list[dict[str, Any]] = []
    for turn in session.turns:
        messages.append({"role": "user", "content": turn.user})
        outputs = list(turn.outputs)
        for reply in turn.replies:
            messages.append({"role": "assistant", "content": list(reply["content"])})
            uses = [b for b in reply["content"] if b.get("type") == "tool_use"]
            if uses:
                results = [outputs.pop(0) for _ in uses]
                messages.append(
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": r["tool_use_id"], **r}
                            for r in results
                        ],
                    }
                )
    return session.system, messages


@pytest.fixture(scope="module")
def demo() -> AgentMemory:
    system, messages = _demo_messages()
    return from_anthropic(messages, system=system)


def test_the_demo_models_first_count_is_within_the_documented_error(demo: AgentMemory):
    spec = default_counter_for(DEMO_MODEL)  # claude-sonnet-4-5
    assert spec == "claude"
    reference = demo.tokens(get_counter("o200k_base"))
    prior = demo.tokens(get_counter(spec))
    entries = len(demo)
    # each entry's count is rounded up once
    assert reference * CLAUDE_O200K_FACTOR <= prior <= reference * CLAUDE_O200K_FACTOR + entries
    low, high = reference * LOW, reference * HIGH
    assert prior >= high - 1  # never below the range (the count that overflows)
    # at most 12.1 % over its lowest end (1.30 / 1.16), rounding aside
    assert prior <= low * (1 + PRIOR_OVER) + entries
    # the previous first count, three characters a token, rests on no published ratio
    assert get_counter("conservative").name != get_counter(spec).name


def test_the_newer_tokenizers_prior_is_within_its_documented_error(demo: AgentMemory):
    assert default_counter_for("claude-opus-4-7") == "claude-4.7"
    reference = demo.tokens(get_counter("o200k_base"))
    prior = demo.tokens(get_counter("claude-4.7"))
    low, high = reference * LOW * NEW_LOW, reference * HIGH * NEW_HIGH
    assert high - 1 <= prior <= low * (1 + PRIOR_4_7_OVER) + len(demo)
    assert round(HIGH * NEW_HIGH, 2) <= CLAUDE_4_7_O200K_FACTOR


@settings(max_examples=60, deadline=None)
@given(text=st.text(min_size=1, max_size=400))
def test_a_claude_count_is_o200ks_times_the_factor_whatever_the_text(text: str):
    """Three characters a token is wrong both ways (Japanese under, English prose over);
    the prior follows a real tokenizer on any text."""
    prior = get_counter(default_counter_for("claude-haiku-4-5"))
    exact = get_counter("o200k_base").count_text(text)
    assert prior.count_text(text) == -(-exact * CLAUDE_O200K_FACTOR // 1)


@pytest.mark.parametrize(
    ("model", "spec"),
    [
        ("claude-3-5-sonnet-20241022", "claude"),
        ("anthropic.claude-3-haiku-20240307-v1:0", "claude"),
        ("claude-opus-4-20250514", "claude"),
        ("claude-sonnet-4-5-20250929", "claude"),
        ("openrouter/anthropic/claude-opus-4.6", "claude"),
        ("claude-opus-4-7", "claude-4.7"),
        ("claude-opus-4.7", "claude-4.7"),
        ("claude-sonnet-5", "claude-4.7"),
        ("claude-next", "claude-4.7"),  # unknown: the larger count
        ("mystery", "conservative"),
        ("gpt-4o", "o200k_base"),
    ],
)
def test_which_prior_a_model_gets(model: str, spec: str):
    assert default_counter_for(model) == spec


def test_calibration_still_learns_from_usage(demo: AgentMemory):
    calibration = Calibration()
    counter = CalibratedCounter(None, DEMO_MODEL, calibration)
    assert isinstance(counter.base, ScaledCounter)
    raw = counter.memory_tokens(demo)
    assert raw == demo.tokens(get_counter("claude"))
    # a provider that counts 10 % more than the prior: the factor follows at once
    assert calibration.observe(DEMO_MODEL, counter.base.name, 10_000, 11_000) == 1.1
    assert counter.memory_tokens(demo) == -(-raw * 11 // 10)
    assert counter.name == f"{counter.base.name}*1.10"
    # and lower, on consistent evidence
    fresh = Calibration()
    for _ in range(3):
        fresh.observe(DEMO_MODEL, counter.base.name, 10_000, 9_000)
    assert CalibratedCounter(None, DEMO_MODEL, fresh).factor == 0.9


def test_the_prior_is_named_after_what_it_counts():
    prior = get_counter("claude")
    assert prior.name == "claude:tiktoken:o200k_base*1.30"
    assert get_counter("claude-4.7").name == "claude-4.7:tiktoken:o200k_base*1.76"
    with pytest.raises(ValueError, match="positive and finite"):
        ScaledCounter(get_counter("o200k_base"), 0.0, "x")


@pytest.mark.slow
def test_a_claude_conversation_far_below_its_window_loads_no_encoding(tmp_path):
    """The UTF-8 bound times the factor still bounds the prior: a fresh process's first
    compact() far below the window decides without loading o200k's vocabulary."""
    script = """
import json
import normandy_core
from normandy_core.conversation import encodings
msgs = [{"role": "user", "content": "Read the parser."}, {"role": "assistant", "content": "ok"}]
r = normandy_core.compact(msgs, compactor="window_manager", window=100_000,
                          model="claude-sonnet-4-5")
loaded = encodings.ENCODINGS.names()
before = r.tokens_before  # a figure asked for: exact, so it loads now
print(json.dumps({"compacted": r.compacted, "loaded": loaded,
                  "after": encodings.ENCODINGS.names()}))
"""
    env = {**os.environ, "NORMANDY_ARCHIVE_PATH": str(tmp_path / "a.sqlite3")}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["compacted"] is False and out["loaded"] == []
    assert out["after"] == ["o200k_base"]
