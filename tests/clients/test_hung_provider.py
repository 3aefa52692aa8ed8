"""A provider that never answers, through the real clients and the real compactors (issue 32, 2).

``window_manager`` in summarize mode (``summary_timeout``) and the native compactors
(their ``timeout``) wait for the provider in a thread of their own. Against a server that
accepts and never answers, each boundary left its thread alive until the SDK's own read
timeout (600 s) ran out, times its retries: 30 ``normandy-summarizer`` threads after 30
boundaries. Here every such thread is under the one cap of abandoned threads
(:data:`~normandy_core.contract.faults.MAX_ABANDONED`), and the time limit reaches the
SDK request itself (its ``timeout=``, no retry past it), so the hung request ends, from
the server's side, within about its limit, and its thread with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from reliability_counts import (
    HUNG_PROVIDER_BOUNDARIES,
    HUNG_PROVIDER_SEAMS,
    OVERLOADED_LIMITS,
)

from normandy_core import AgentConfig, abandoned_threads, reload_plugins, run_compaction
from normandy_core.app.workload import SYSTEM_PROMPT, TOOLS, generate_session
from normandy_core.clients import AnthropicClient, OpenAIClient
from normandy_core.contract.eventloop import bind_turn_loop
from normandy_core.contract.faults import MAX_ABANDONED

pytest.importorskip("anthropic", reason="needs the anthropic extra")
pytest.importorskip("openai", reason="needs the openai extra")


def _load(name: str, path: Path) -> Any:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


hung = _load("normandy_client_test_hung", Path(__file__).parent / "hung.py")
servers = sys.modules["normandy_client_test_servers"]  # loaded by conftest.py

#: The time limit of every wait for the provider here, in seconds.
LIMIT = 0.05
#: How much later than its limit a hung request may end, on a loaded machine: the
#: server notes the close when its selector wakes, the client when the GIL lets it.
SLACK = 1.5
MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-4o"}


def library_threads() -> list[str]:
    """The names of the threads the library started that are alive now."""
    return [t.name for t in threading.enumerate() if t.name.startswith("normandy-")]


def sdk_client(kind: str, provider: Any, *, api: str = "chat") -> Any:
    """The real client of ``kind`` on ``provider``, with the SDK's defaults (its 600 s
    timeout, two retries)."""
    if kind == "anthropic":
        return AnthropicClient(MODELS[kind], api_key="test-key", base_url=provider.base_url)
    return OpenAIClient(MODELS[kind], api_key="test-key", base_url=provider.base_url, api=api)


def over_window(client: Any, kind: str, compactor: str, **opts: Any) -> AgentConfig:
    """``compactor`` (with ``opts``) over a session far past its window, with ``client``."""
    acc = AgentConfig(
        model=MODELS[kind],
        system_prompt=SYSTEM_PROMPT,
        tools=TOOLS,
        compactor=compactor,
        compactor_opts={"context_window": 30_000, "counter": "cl100k_base", **opts},
        client=client,
    )
    return acc.with_memory(generate_session(7, 120, end_mid_round=False))


def summarizing(client: Any, kind: str) -> AgentConfig:
    """``window_manager`` summarizing with the model, under ``summary_timeout``."""
    return over_window(
        client,
        kind,
        "window_manager",
        strategy="summarize",
        summarizer="model",
        summary_timeout=LIMIT,
    )


def native(client: Any, kind: str, limit: float = LIMIT) -> AgentConfig:
    """The native compactor of ``kind``, ``limit`` its ``timeout``."""
    return over_window(client, kind, f"{kind}_native", timeout=limit)


@pytest.fixture
def turn_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread of its own, as ``arun_turn``'s loop runs."""
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, name="test-turn-loop", daemon=True)
    runner.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    runner.join(5)
    loop.close()


#: name -> (provider kind, how the config is made from the provider, whether a turn's
#: event loop is bound while the boundaries run, what each boundary's meta says)
SEAMS: dict[str, tuple[str, Callable[[Any], AgentConfig], bool, str]] = {
    "summarizer, OpenAIClient": (
        "openai",
        lambda p: summarizing(sdk_client("openai", p), "openai"),
        False,
        "did not answer within",
    ),
    "summarizer, AnthropicClient": (
        "anthropic",
        lambda p: summarizing(sdk_client("anthropic", p), "anthropic"),
        False,
        "did not answer within",
    ),
    "summarizer, async-only client on a loop of its thread": (
        "openai",
        lambda p: summarizing(servers.AsyncOnly(sdk_client("openai", p)), "openai"),
        False,
        "did not answer within",
    ),
    "summarizer, async-only client on the turn's loop": (
        "anthropic",
        lambda p: summarizing(servers.AsyncOnly(sdk_client("anthropic", p)), "anthropic"),
        True,
        "did not answer within",
    ),
    "anthropic_native": (
        "anthropic",
        lambda p: native(sdk_client("anthropic", p), "anthropic"),
        False,
        "did not answer within",
    ),
    "openai_native": (
        "openai",
        lambda p: native(sdk_client("openai", p, api="responses"), "openai"),
        False,
        "did not answer within",
    ),
}
assert len(SEAMS) == HUNG_PROVIDER_SEAMS


def _settled(seconds: float) -> None:
    """Wait up to ``seconds`` for every abandoned thread to end."""
    end = time.monotonic() + seconds
    while abandoned_threads() and time.monotonic() < end:
        time.sleep(0.01)


@pytest.mark.parametrize("seam", list(SEAMS))
def test_a_provider_that_never_answers_leaves_no_threads_piling_up(seam, turn_loop, monkeypatch):
    # the native compactors' fallback compacts: the archive would start its own writer
    # thread for what it drops, a thread that lives as long as the process, not a wait
    monkeypatch.setenv("NORMANDY_DISABLE_PLUGINS", "archive")
    reload_plugins()
    kind, make, on_turn_loop, says = SEAMS[seam]
    _settled(10)
    before = abandoned_threads()
    alive_before = len(library_threads())
    with hung.HungProvider(kind) as provider:
        acc = make(provider)
        most_alive = 0
        errors = []
        for _ in range(HUNG_PROVIDER_BOUNDARIES):
            with bind_turn_loop(turn_loop) if on_turn_loop else contextlib.nullcontext():
                meta = run_compaction(acc, mid_round=False).meta
            errors.append(str(meta.get("error") or meta.get("fallback_reason") or ""))
            most_alive = max(most_alive, len(library_threads()) - alive_before)
        closed = provider.wait_all_closed(LIMIT + SLACK + 2)
        requests = provider.requests()
    # more requests hung than the cap allows threads, none was sent twice (no retry past
    # its limit: a boundary that was too slow to send one before its limit sends none)
    assert MAX_ABANDONED < len(requests) <= HUNG_PROVIDER_BOUNDARIES
    assert all(says in error for error in errors), errors[:3]
    # the threads waiting for it never outnumbered the cap ...
    assert most_alive <= MAX_ABANDONED
    # ... and each hung request was closed by the client about its limit after it opened
    assert closed, f"{sum(c.closed is None for c in requests)} requests still open"
    lived = [c.lived() for c in requests]
    assert max(lived) <= LIMIT + SLACK, sorted(lived)[-3:]
    _settled(LIMIT + SLACK)
    assert abandoned_threads() == before
    assert len(library_threads()) <= alive_before


@pytest.mark.parametrize(("limit", "sent"), OVERLOADED_LIMITS)
def test_an_overloaded_provider_is_retried_only_within_the_limit(limit, sent, monkeypatch):
    """A provider answering 529 is retried as the SDK retries (0.5 s, then 1 s later, two
    retries by default), but only while the pause leaves the retry as much time again:
    under a 0.3 s limit the one request is all (the SDK retried past it, three requests
    over about 1.5 s, from a thread already abandoned); under 6 s all three are sent."""
    monkeypatch.setenv("NORMANDY_DISABLE_PLUGINS", "archive")
    reload_plugins()
    with servers.FakeProvider("anthropic", compaction="overloaded") as provider:
        acc = native(sdk_client("anthropic", provider), "anthropic", limit)
        t0 = time.monotonic()
        meta = run_compaction(acc, mid_round=False).meta
        took = time.monotonic() - t0
        time.sleep(2.0)  # a retry past the limit, from the abandoned thread, arrives by now
        sent_to_provider = len(provider.paths)
    assert sent_to_provider == sent
    assert meta.get("fallback_cause") == "unreachable", meta.get("fallback_reason")
    assert "529" in str(meta.get("fallback_reason")), meta.get("fallback_reason")
    assert took < limit + SLACK


class Blocking:
    """A model client of ``provider`` whose every call blocks until released, as a client
    without a timeout of its own would on a provider that never answers."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.release = threading.Event()
        self.calls = 0

    def _block(self) -> Any:
        self.calls += 1
        self.release.wait(60)
        raise RuntimeError("released")

    def complete(self, *args: Any, **kwargs: Any) -> Any:
        return self._block()

    def compact_conversation(self, *args: Any, **kwargs: Any) -> Any:
        return self._block()


@pytest.mark.parametrize("make", [summarizing, native], ids=["window_manager", "anthropic_native"])
def test_the_threads_left_waiting_are_counted_and_capped(make, monkeypatch):
    """With a client that has no timeout to be given, the threads left waiting are the
    library's abandoned threads: counted by abandoned_threads(), never more than the cap;
    past it the provider is not asked at all."""
    monkeypatch.setenv("NORMANDY_DISABLE_PLUGINS", "archive")
    reload_plugins()
    _settled(10)
    before = abandoned_threads()
    client = Blocking("anthropic")
    acc = make(client, "anthropic")
    free = MAX_ABANDONED - before
    try:
        reasons = []
        for _ in range(2 * MAX_ABANDONED):
            meta = run_compaction(acc, mid_round=False).meta
            reasons.append(str(meta.get("error") or meta.get("fallback_reason")))
            assert abandoned_threads() <= MAX_ABANDONED
        assert abandoned_threads() == MAX_ABANDONED
        assert client.calls == free
        assert all("did not answer within" in r for r in reasons[:free])
        assert all("not starting another" in r for r in reasons[free:])
    finally:
        client.release.set()
    _settled(10)
    assert abandoned_threads() == before
