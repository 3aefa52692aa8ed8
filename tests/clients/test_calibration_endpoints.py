"""Calibration that can never make an over-window conversation look under its trigger
(issue 32, case 3).

The issue's scenario, end to end: the real ``OpenAIClient`` against a loopback server
speaking Chat Completions that reports ``prompt_tokens=10`` whatever it was sent, then a
fresh agent (another config) with 3,480 tokens in a 3,000-token window, which must
compact. Before, that one turn lowered the process-wide factor to 0.5 and the fresh agent
was not compacted. Factors are now kept per client endpoint and model, lowered only by
repeated consistent evidence and never below the floor, and the boundary never skips on
a calibrated count a conversation its own count puts over the level.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from reliability_counts import (
    CALIBRATION_SEQUENCES,
    UNDER_REPORTED_TOKENS,
    UNDER_REPORTING_TURNS,
)

from normandy_core import AgentConfig, AgentMemory, compact, get_counter, run_compaction
from normandy_core.clients import AnthropicClient, OpenAIClient, ScriptedClient
from normandy_core.conversation.calibration import (
    CalibratedCounter,
    Calibration,
    default_calibration,
)
from normandy_core.transcripts.chat import to_openai
from normandy_core.turn import run_turn

pytest.importorskip("openai", reason="needs the openai extra")
servers = sys.modules["normandy_client_test_servers"]  # loaded by conftest.py

MODEL = "gpt-4o"
COUNTER = "cl100k_base"
WINDOW = 3_000
FRESH_TOKENS = 3_480


class UnderReporting(servers.FakeProvider):
    """The Chat Completions loopback server, reporting ``prompt_tokens`` as
    :data:`UNDER_REPORTED_TOKENS` whatever the request held."""

    def handle(
        self, path: str, headers: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        status, answer = super().handle(path, headers, body)
        usage = answer.get("usage")
        if status == 200 and usage:
            usage["prompt_tokens"] = UNDER_REPORTED_TOKENS
            usage["total_tokens"] = UNDER_REPORTED_TOKENS + usage["completion_tokens"]
        return status, answer


@pytest.fixture(autouse=True)
def _fresh_calibration():
    """The shells feed the process-wide calibration: every test starts and ends without
    evidence in it."""
    default_calibration().reset()
    yield
    default_calibration().reset()


def _config(window: int, memory: AgentMemory | None = None) -> AgentConfig:
    acc = AgentConfig(
        model=MODEL,
        compactor="window_manager",
        compactor_opts={"context_window": window, "reserved_tokens": 0, "counter": COUNTER},
    )
    return acc if memory is None else acc.with_memory(memory)


def _history(tokens: int, tag: str) -> AgentMemory:
    """A conversation of user and assistant turns, ``tokens`` exact tokens or just over."""
    counter = get_counter(COUNTER)
    mem = AgentMemory()
    n = 0
    while mem.tokens(counter) < tokens:
        role = "user" if n % 2 == 0 else "assistant"
        mem.add_message(role, f"{tag} message {n}: " + "the build log says ok. " * 12)
        n += 1
    return mem


def _client(provider: Any) -> OpenAIClient:
    return OpenAIClient(MODEL, api_key="test-key", base_url=provider.base_url, max_retries=0)


def _under_reported_turns(provider: Any, turns: int) -> None:
    """An agent of its own (a 128k window, so it never compacts) runs ``turns`` turns
    against ``provider``, each request estimated at well over ``min_tokens``."""
    acc = _config(128_000, _history(600, "earlier agent"))
    for n in range(turns):
        acc = run_turn(acc, f"question {n}: " + "what next? " * 40, client=_client(provider)).acc


def test_one_under_reporting_provider_leaves_a_fresh_agent_compacting():
    """The issue's scenario: after one turn against a server reporting
    ``prompt_tokens=10``, a fresh agent with 3,480 tokens in a 3,000-token window is
    compacted, however it reaches its boundary: with no client, ``compact()``, a turn
    against the same server and a turn against an honest one."""
    with UnderReporting("openai", max_requests=500) as liar:
        _under_reported_turns(liar, 1)
        fresh = _config(WINDOW, _history(FRESH_TOKENS, "fresh agent"))
        exact = fresh.memory.tokens(get_counter(COUNTER))
        assert exact >= FRESH_TOKENS > WINDOW
        _, meta = run_compaction(fresh, mid_round=False)
        assert meta.compacted and meta.tokens_before >= exact > meta.tokens_after

        messages = to_openai(fresh.memory.entries())
        opts = {"counter": COUNTER, "reserved_tokens": 0}
        kept = compact(messages, window=WINDOW, model=MODEL, opts=opts)
        assert kept.compacted and len(kept.messages) < len(messages)

        result = run_turn(fresh, "and now?", client=_client(liar))
        assert result.boundaries[0]["compacted"]
        sent = liar.requests[-1]["messages"]
        assert _exact_tokens(sent) <= WINDOW
        with servers.FakeProvider("openai") as honest:
            result = run_turn(fresh, "and now?", client=_client(honest))
            assert result.boundaries[0]["compacted"]


def test_repeated_under_reporting_never_turns_compaction_off():
    """Turn after turn against the same under-reporting server (its evidence as
    repeated as it gets): a fresh agent against that very server still compacts."""
    with UnderReporting("openai", max_requests=500) as liar:
        _under_reported_turns(liar, UNDER_REPORTING_TURNS)
        calibration = default_calibration().for_endpoint(_client(liar).endpoint)
        assert calibration.factor(MODEL, get_counter(COUNTER).name) == 1.0
        fresh = _config(WINDOW, _history(FRESH_TOKENS, "fresh agent again"))
        result = run_turn(fresh, "and now?", client=_client(liar))
        assert result.boundaries[0]["compacted"]
        assert _exact_tokens(liar.requests[-1]["messages"]) <= WINDOW


def _exact_tokens(messages: list[dict[str, Any]]) -> int:
    """The messages of a Chat Completions request counted exactly (OpenAI's rules)."""
    from normandy_core.transcripts.chat import from_openai

    memory = AgentMemory.from_entries(from_openai(messages))
    return memory.tokens(get_counter(COUNTER))


# -- what the factor learns and what bounds it ---------------------------------------


def test_factors_are_kept_per_endpoint_and_model():
    cal = Calibration(min_tokens=100)
    a, b = cal.for_endpoint("openai:http://a"), cal.for_endpoint("openai:http://b")
    assert cal.for_endpoint("openai:http://a") is a  # one view per endpoint
    a.observe("m", "c", 1000, 1300)
    assert a.factor("m", "c") == 1.3
    assert b.factor("m", "c") == 1.0 and cal.factor("m", "c") == 1.0
    assert a.factor("other", "c") == 1.0 and a.factor("m", "other") == 1.0
    assert a.snapshot("m", "c")["endpoint"] == "openai:http://a"
    # what your own code observes without an endpoint stands for endpoints without evidence
    cal.observe("m", "c", 1000, 1200)
    assert cal.factor("m", "c") == b.factor("m", "c") == 1.2 and a.factor("m", "c") == 1.3
    cal.reset("m")
    assert a.factor("m", "c") == b.factor("m", "c") == 1.0


def test_a_factor_below_one_needs_repeated_consistent_evidence_above_the_floor():
    cal = Calibration(min_tokens=100)
    assert cal.floor == 0.75 and cal.agree == 3
    cal.observe("m", "c", 1000, 850)
    cal.observe("m", "c", 1000, 860)
    assert cal.factor("m", "c") == 1.0  # twice is not yet repeated
    cal.observe("m", "c", 1000, 840)
    assert cal.factor("m", "c") == 0.86  # three agreeing over-counts: the largest of them
    cal.observe("m", "c", 1000, 600)
    assert cal.factor("m", "c") == 1.0  # they no longer agree
    cal.reset()
    for estimated in (1000, 1100, 1200, 1300, 1400):
        cal.observe("m", "c", estimated, UNDER_REPORTED_TOKENS)
    assert cal.factor("m", "c") == 1.0  # below the floor is no evidence an estimate is high
    cal.reset()
    for _ in range(8):
        cal.observe("m", "c", 1000, 760)
    assert cal.factor("m", "c") == 0.76
    cal.observe("m", "c", 1000, 1100)
    assert cal.factor("m", "c") == 1.1  # one under-count raises it at once
    with pytest.raises(ValueError, match="agree"):
        Calibration(agree=0)


def test_the_client_names_its_endpoint():
    """An SDK client's endpoint is its provider and base URL; a client that names none is
    known by its class. The turn's boundary events show which evidence was used."""
    assert OpenAIClient(MODEL, base_url="http://127.0.0.1:9/v1/").endpoint == (
        "openai:http://127.0.0.1:9/v1"
    )
    assert OpenAIClient(MODEL, base_url="http://x/v1").endpoint != (
        OpenAIClient(MODEL, base_url="http://y/v1").endpoint
    )
    assert AnthropicClient(base_url="http://z").endpoint == "anthropic:http://z"
    with servers.FakeProvider("openai") as provider:
        result = run_turn(_config(128_000), "hi", client=_client(provider))
    assert _endpoints(result) == {_client(provider).endpoint}
    reply = {"content": [{"type": "text", "text": "ok"}], "usage": {"input_tokens": 7}}
    result = run_turn(_config(128_000), "hi", client=ScriptedClient.from_records([reply]))
    assert _endpoints(result) == {"normandy_core.clients.scripted.ScriptedClient"}
    # a calibration given already bound to an endpoint is kept as given
    mine = Calibration().for_endpoint("my proxy")
    client = ScriptedClient.from_records([reply])
    result = run_turn(_config(128_000), "hi", client=client, calibration=mine)
    assert _endpoints(result) == {"my proxy"}


def _endpoints(result: Any) -> set[str]:
    """The endpoints of the calibration snapshots in a turn's boundary events."""
    metas = [e["meta"] for e in result.events if e["type"] == "boundary"]
    return {meta["calibration"]["endpoint"] for meta in metas}


# -- the property ------------------------------------------------------------------

_BASE = get_counter(COUNTER)
_MEMORY = _history(2_000, "property")
_SIZES = [_MEMORY.derive(_MEMORY.entries()[:n]) for n in range(1, len(_MEMORY) + 1)]
_OBSERVATION = st.tuples(
    st.sampled_from([None, "openai:http://a", "openai:http://b"]),
    st.integers(1, 5_000),
    st.one_of(st.integers(0, 20_000), st.just(UNDER_REPORTED_TOKENS)),
    st.booleans(),
)


@settings(max_examples=CALIBRATION_SEQUENCES)
@given(
    observations=st.lists(_OBSERVATION, max_size=30),
    endpoint=st.sampled_from([None, "openai:http://a", "openai:http://b"]),
    size=st.integers(0, len(_SIZES) - 1),
    level=st.integers(0, 2_500),
)
def test_the_calibrated_decision_never_skips_an_over_trigger_conversation(
    observations, endpoint, size, level
):
    """Whatever was observed, on any endpoint: when the boundary's decision
    (``CalibratedCounter.at_most``) skips, the uncalibrated exact count is at or under
    the level."""
    cal = Calibration(min_tokens=1)
    for where, estimated, reported, proportional in observations:
        # a reported count that follows the estimate (consistent), or any number
        seen = math.ceil(estimated * reported / 10_000) if proportional else reported
        cal.for_endpoint(where).observe(MODEL, _BASE.name, estimated, seen)
    memory = _SIZES[size]
    counter = CalibratedCounter(_BASE, MODEL, cal.for_endpoint(endpoint))
    if counter.at_most(memory, level):
        assert memory.tokens(_BASE) <= level
    assert cal.for_endpoint(endpoint).factor(MODEL, _BASE.name) >= cal.floor
