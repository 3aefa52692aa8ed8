"""Recovery from a provider's too-long refusal (issue 36, item 1), against the loopback
servers with the real SDK clients.

The servers refuse an over-long request exactly as each provider does (status, error
type, code, the message with both numbers where the API gives them). A turn whose
request the provider refuses is calibrated from the provider's figure, compacted at an
overflow boundary and sent again, once; a second refusal ends it with both counts.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from normandy_core import (
    AgentConfig,
    AgentMemory,
    BoundaryInfo,
    get_counter,
    hookimpl,
    register_hook,
)
from normandy_core.clients import AnthropicClient, ContextOverflow, OpenAIClient
from normandy_core.conversation.calibration import Calibration, default_calibration
from normandy_core.turn import TurnAborted, arun_turn, run_turn

pytest.importorskip("openai", reason="needs the openai extra")
pytest.importorskip("anthropic", reason="needs the anthropic extra")
servers = sys.modules["normandy_client_test_servers"]  # loaded by conftest.py

#: The provider's window, in its own count (:func:`servers.count_tokens`).
LIMIT = 3_000
#: What the agent's config believes the window is: far larger, so no scheduled
#: boundary compacts and only the provider's refusal can tell.
BELIEVED = 50_000
MODELS = {"anthropic": "claude-sonnet-4-5", "chat": "gpt-4o", "responses": "gpt-4o"}


@pytest.fixture(autouse=True)
def _fresh_calibration():
    """The shells feed the process-wide calibration: every test starts and ends without
    evidence in it."""
    default_calibration().reset()
    yield
    default_calibration().reset()


def _provider(api: str, **kwargs: Any) -> Any:
    return servers.FakeProvider("anthropic" if api == "anthropic" else "openai", **kwargs)


def _client(api: str, provider: Any) -> Any:
    if api == "anthropic":
        return AnthropicClient(
            MODELS[api], api_key="test-key", base_url=provider.base_url, max_retries=0
        )
    return OpenAIClient(
        MODELS[api], api=api, api_key="test-key", base_url=provider.base_url, max_retries=0
    )


def _config(api: str, tokens: int, compactor: str = "window_manager") -> AgentConfig:
    """An agent whose history is about ``tokens`` of the provider's count."""
    opts: dict[str, Any] = {}
    if compactor == "window_manager":
        opts = {"context_window": BELIEVED, "reserved_tokens": 0, "counter": "cl100k_base"}
    acc = AgentConfig(model=MODELS[api], compactor=compactor, compactor_opts=opts)
    memory = AgentMemory()
    n = 0
    while servers.count_tokens({"messages": [m.content for m in memory.entries()]}) < tokens:
        role = "user" if n % 2 == 0 else "assistant"
        memory.add_message(role, f"note {n}: the deploy of service {n} finished; " * 6)
        n += 1
    return acc.with_memory(memory)


@pytest.mark.parametrize("api", ["anthropic", "chat", "responses"])
def test_a_refused_turn_compacts_and_succeeds_on_the_retry(api):
    """The provider refuses the request over its window; the turn compacts at an
    overflow boundary and the retry, now under the provider's window, is answered."""
    acc = _config(api, LIMIT + 600)
    with _provider(api, window=LIMIT, script=[{"text": "Done."}]) as provider:
        result = run_turn(acc, "What is the status?", client=_client(api, provider))
    assert result.text == "Done."
    assert len(provider.refusals) == 1 and len(provider.requests) == 2
    (refused,) = result.events_of("context_overflow")
    assert refused["recovery"] == "compact_and_retry"
    if api == "responses":  # the Responses API names no figures
        assert refused["size"] is None and refused["limit"] is None
    else:
        assert refused["limit"] == LIMIT and refused["size"] > LIMIT
    overflow = [b for b in result.events_of("boundary") if b["trigger"] == "overflow"]
    assert len(overflow) == 1 and overflow[0]["meta"]["compacted"]
    assert not overflow[0]["mid_round"]  # it replaces the turn start's boundary
    assert result.compacted and len(result.acc.memory) < len(acc.memory) + 2


@pytest.mark.parametrize(
    ("api", "status", "code", "words"),
    [
        ("anthropic", 400, "invalid_request_error", "prompt is too long"),
        ("chat", 400, "context_length_exceeded", "maximum context length is 3000 tokens"),
        ("responses", 400, "context_length_exceeded", "exceeds the context window"),
    ],
)
def test_each_refusal_is_a_typed_context_overflow(api, status, code, words):
    """Without recovery the turn aborts, caused by a ``ContextOverflow`` read from the
    SDK's own error (status, code or type) carrying the figures the provider gave."""
    acc = _config(api, LIMIT + 600)
    with _provider(api, window=LIMIT) as provider, pytest.raises(TurnAborted) as caught:
        run_turn(acc, "Status?", client=_client(api, provider), recover_overflow=False)
    cause = caught.value.__cause__
    assert isinstance(cause, ContextOverflow)
    assert (cause.status, cause.code) == (status, code)
    assert words in str(cause)
    if api == "responses":
        assert cause.size is None and cause.limit is None
    else:
        assert cause.limit == LIMIT
        assert cause.size == servers.count_tokens(provider.requests[0]) > LIMIT


def test_a_413_request_too_large_is_recovered_from():
    """Anthropic's 413 ``request_too_large`` (the body's bytes) gives no figures; the
    overflow boundary still compacts below the refused request and the retry passes."""
    acc = _config("anthropic", 2_000)
    size = len(str([m.content for m in acc.memory.entries()]).encode())
    with _provider("anthropic", max_bytes=size, script=[{"text": "Fine."}]) as provider:
        result = run_turn(acc, "Status?", client=_client("anthropic", provider))
    assert result.text == "Fine."
    (refused,) = result.events_of("context_overflow")
    assert (refused["status"], refused["code"]) == (413, "request_too_large")


@pytest.mark.parametrize("api", ["anthropic", "chat"])
def test_a_second_refusal_fails_the_turn_with_both_counts(api):
    """Refused again after compacting: the turn fails, its error giving the provider's
    figures of both refusals and Normandy's counts; two requests, no third."""
    acc = _config(api, 1_500)
    with (
        _provider(api, overflows=[True, True, True]) as provider,
        pytest.raises(TurnAborted) as caught,
    ):
        run_turn(acc, "Status?", client=_client(api, provider))
    assert len(provider.requests) == 2
    message = str(caught.value)
    sizes = [servers.count_tokens(body) for body in provider.requests]
    for size in sizes:
        assert f"{size:,} tokens > {int(size * 0.9):,} maximum" in message
    assert "refused again after the overflow compaction" in message
    assert message.count("Normandy counted") == 2
    assert isinstance(caught.value.__cause__, ContextOverflow)
    events = [e["recovery"] for e in caught.value.events if e["type"] == "context_overflow"]
    assert events == ["compact_and_retry", "failed"]


def test_an_overflow_boundary_that_compacts_nothing_fails_at_once():
    """With a compactor that compacts nothing (``noop``) the request would be the same:
    the turn fails after the one refusal, saying why, without sending it again."""
    acc = _config("chat", LIMIT + 600, compactor="noop")
    with (
        _provider("chat", window=LIMIT) as provider,
        pytest.raises(TurnAborted, match="compacted nothing at the overflow boundary"),
    ):
        run_turn(acc, "Status?", client=_client("chat", provider))
    assert len(provider.requests) == 1


def test_calibration_moves_toward_the_provider_figure_within_its_bounds():
    """The refusal's figure is evidence like any reported usage: the factor rises toward
    ``size / estimate`` and never above the calibration's ``ceiling``."""
    acc = _config("chat", LIMIT + 600)
    counter = get_counter("cl100k_base").name
    free = Calibration()
    with _provider("chat", window=LIMIT, script=[{"text": "ok"}]) as provider:
        result = run_turn(acc, "Status?", client=_client("chat", provider), calibration=free)
    (refused,) = result.events_of("context_overflow")
    ratio = refused["size"] / refused["estimated_input_tokens"]
    assert ratio > 1.1
    assert refused["factor_before"] == 1.0 and refused["factor_after"] >= ratio
    assert refused["factor_after"] <= free.ceiling
    bounded = Calibration(ceiling=1.05)
    with _provider("chat", window=LIMIT, script=[{"text": "ok"}]) as provider:
        run_turn(acc, "Status?", client=_client("chat", provider), calibration=bounded)
        endpoint = _client("chat", provider).endpoint
    assert bounded.for_endpoint(endpoint).factor(MODELS["chat"], counter) == 1.05


class _Observer:
    """An ``on_boundary`` hook plugin that keeps what each boundary reports."""

    def __init__(self) -> None:
        self.infos: list[BoundaryInfo] = []

    @hookimpl
    def on_boundary(self, acc: Any, ctx: Any, meta: Any, info: BoundaryInfo) -> None:
        self.infos.append(info)


def test_on_boundary_hooks_see_the_overflow_trigger():
    """The ``on_boundary`` hooks get the overflow boundary with ``trigger="overflow"``
    (compacted), after the turn start's scheduled one (skipped)."""
    observer = _Observer()
    register_hook(observer, name="observer")
    acc = _config("chat", LIMIT + 600)
    with _provider("chat", window=LIMIT, script=[{"text": "ok"}]) as provider:
        run_turn(acc, "Status?", client=_client("chat", provider))
    seen = [(info.trigger, info.outcome) for info in observer.infos]
    assert seen == [("scheduled", "skipped"), ("overflow", "compacted")]


def test_the_async_shell_recovers_the_same_way():
    """``arun_turn`` runs the same driver: refused, compacted, answered on the retry."""
    acc = _config("anthropic", LIMIT + 600)
    with _provider("anthropic", window=LIMIT, script=[{"text": "Done."}]) as provider:
        result = asyncio.run(arun_turn(acc, "Status?", client=_client("anthropic", provider)))
    assert result.text == "Done."
    assert [b["trigger"] for b in result.events_of("boundary")] == ["scheduled", "overflow"]


_TOOL_ROUND = {"tools": [("lookup", {"key": "k"})]}


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(refusals=st.lists(st.booleans(), max_size=12), rounds=st.integers(0, 3))
def test_no_sequence_of_refusals_makes_a_retry_loop(refusals, rounds):
    """Whatever the provider refuses, each model call is sent at most twice: a call
    refused twice ends the turn at once; a call refused once is sent again unless its
    overflow boundary compacted nothing; a turn that is not refused twice finishes."""
    acc = _config("chat", 800)
    script = [_TOOL_ROUND] * rounds + [{"text": "Done."}]
    tools = {"lookup": lambda key: "value " * 40}
    aborted: TurnAborted | None = None
    with _provider("chat", script=script, overflows=list(refusals)) as provider:
        try:
            result = run_turn(acc, "Go.", client=_client("chat", provider), tools=tools)
        except TurnAborted as exc:
            result, aborted = None, exc
    sent = len(provider.requests)
    outcome = [i < len(refusals) and refusals[i] for i in range(sent)]
    answered = outcome.count(False)
    assert sent <= 2 * (answered + 1)
    for i in range(sent - 2):  # a call refused twice is the turn's last
        assert not (outcome[i] and outcome[i + 1]), "a twice-refused call was sent again"
    if aborted is not None:  # only by a refusal the one recovery did not help
        assert outcome and outcome[-1]
        if not (sent >= 2 and outcome[-2]):
            last = [e for e in aborted.events if e["type"] == "boundary"][-1]
            assert last["trigger"] == "overflow" and not last["meta"]["compacted"]
    else:
        assert result.text == "Done." and answered == rounds + 1
