"""normandy-otel, installed for real: spans and metrics of real boundaries.

Every test drives real compactions (``compact()`` with the window manager, the turn loop
with the scripted client) through the entry point the distribution registers, and reads
what the SDK recorded with its in-memory span exporter and metric reader.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from opentelemetry.trace import SpanKind, StatusCode

import normandy_otel
from normandy_core import (
    AgentConfig,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    compact,
    hookimpl,
    list_plugins,
    register_compactor,
    run_compaction,
    unregister_compactor,
)
from normandy_core.clients import ModelReply, ScriptedClient
from normandy_core.turn import arun_turn, run_turn
from normandy_otel import (
    BOUNDARY_SPAN,
    COMPACTION_SPAN,
    METRIC_BOUNDARIES,
    METRIC_COMPACTIONS,
    METRIC_DURATION,
    METRIC_THINKING_DISABLED,
    METRIC_THINKING_STRIPPED,
    METRIC_TOKENS_REMOVED,
)


def _messages(n: int = 30) -> list[dict[str, str]]:
    msgs = []
    for i in range(n):
        msgs.append({"role": "user", "content": f"question {i} " + "q" * 400})
        msgs.append({"role": "assistant", "content": f"answer {i} " + "a" * 400})
    return msgs


def _agent(**config: Any) -> AgentConfig:
    """A window_manager agent whose history (about 8,000 tokens) overflows its window."""
    acc = AgentConfig(
        model="gpt-4o",
        compactor="window_manager",
        compactor_opts={"context_window": 8000, "reserved_tokens": 500},
        **config,
    )
    for m in _messages():
        acc.memory.add_message(m["role"], m["content"], turn_id="earlier")
    return acc


def test_the_distribution_registers_the_hook_plugin_through_its_entry_point():
    rows = [r for r in list_plugins() if r.kind == "hook" and r.name == "otel"]
    assert [(r.distribution, r.module, r.status) for r in rows] == [
        ("normandy-otel", "normandy_otel.hooks", "loaded")
    ]


def test_compact_emits_a_boundary_span_per_call_and_a_compaction_span_when_it_compacts(
    telemetry,
):
    small = compact(_messages(1), model="gpt-4o", window=8000, fresh=True)
    big = compact(_messages(), model="gpt-4o", window=8000, opts={"reserved_tokens": 500})
    assert not small.compacted and big.compacted

    skipped, compacted = telemetry.spans(BOUNDARY_SPAN)
    (compaction,) = telemetry.spans(COMPACTION_SPAN)
    assert skipped.kind is SpanKind.INTERNAL and skipped.status.status_code is StatusCode.UNSET
    assert skipped.attributes["normandy.outcome"] == "skipped"
    assert skipped.attributes["normandy.compacted"] is False
    assert "normandy.tokens.before" not in skipped.attributes

    meta = big.meta
    attrs = compacted.attributes
    assert attrs["gen_ai.request.model"] == "gpt-4o"
    assert attrs["normandy.compactor"] == "window_manager"
    assert attrs["normandy.compactor.distribution"] == "normandy-window-manager"
    assert attrs["normandy.compactor.version"] == "0.1.0"
    assert attrs["normandy.outcome"] == "compacted" and attrs["normandy.compacted"] is True
    assert attrs["normandy.tokens.before"] == meta["tokens_before"]
    assert attrs["normandy.tokens.after"] == meta["tokens_after"]
    assert attrs["normandy.tokens.removed"] == meta["tokens_before"] - meta["tokens_after"] > 0
    assert attrs["normandy.tokens.turn_removed"] == meta["tokens_removed"]
    assert attrs["normandy.strategy"] == meta["strategy"]
    assert attrs["normandy.dropped.count"] == len(big.dropped) > 20
    assert attrs["normandy.context_window"] == 8000
    assert attrs["normandy.mid_round"] is False
    assert "gen_ai.provider.name" not in attrs  # compact() has no client: not known
    assert "error.type" not in attrs

    # the compaction is the compactor's call, inside its boundary
    assert compaction.parent is not None
    assert compaction.parent.span_id == compacted.context.span_id
    assert compaction.context.trace_id == compacted.context.trace_id
    assert compacted.start_time <= compaction.start_time <= compaction.end_time
    assert compaction.end_time <= compacted.end_time
    assert compaction.attributes["normandy.tokens.before"] == meta["tokens_before"]


def test_compact_records_the_metrics(telemetry):
    compact(_messages(1), model="gpt-4o", window=8000, fresh=True)
    big = compact(_messages(), model="gpt-4o", window=8000, opts={"reserved_tokens": 500})
    meta = big.meta

    assert telemetry.value(METRIC_BOUNDARIES, **{"normandy.outcome": "skipped"}) == 1
    assert telemetry.value(METRIC_BOUNDARIES, **{"normandy.outcome": "compacted"}) == 1
    (point,) = telemetry.points(METRIC_COMPACTIONS)
    assert point.value == 1
    assert point.attributes == {
        "normandy.compactor": "window_manager",
        "gen_ai.request.model": "gpt-4o",
        "normandy.strategy": meta["strategy"],
    }
    assert telemetry.value(METRIC_TOKENS_REMOVED) == meta["tokens_before"] - meta["tokens_after"]
    (histogram,) = telemetry.points(METRIC_DURATION)  # the skip is not a compaction
    assert histogram.count == 1
    assert histogram.attributes["normandy.outcome"] == "compacted"
    (span,) = [s for s in telemetry.spans(BOUNDARY_SPAN) if s.attributes["normandy.compacted"]]
    assert histogram.sum == pytest.approx((span.end_time - span.start_time) / 1e9, abs=1e-6)
    assert tuple(histogram.explicit_bounds) == normandy_otel.DURATION_BUCKETS


def test_a_compaction_that_cannot_fit_is_an_error_span_and_a_failed_boundary(telemetry):
    result = compact(
        [{"role": "user", "content": "x " * 20_000}],
        model="gpt-4o",
        window=8000,
        opts={"reserved_tokens": 500},
        fresh=True,
    )
    assert "cannot fit" in result.error
    (boundary,) = telemetry.spans(BOUNDARY_SPAN)
    (compaction,) = telemetry.spans(COMPACTION_SPAN)
    for span in (boundary, compaction):
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == result.error
        assert span.attributes["error.type"] == "reported"
        assert span.attributes["normandy.error"] == result.error
        assert span.attributes["normandy.outcome"] == "failed"
    assert telemetry.value(METRIC_BOUNDARIES, **{"error.type": "reported"}) == 1
    assert telemetry.points(METRIC_COMPACTIONS) == []
    (histogram,) = telemetry.points(METRIC_DURATION)
    assert histogram.count == 1 and histogram.attributes["normandy.outcome"] == "failed"


class _Raises:
    @hookimpl
    def needs_window(self) -> bool:
        return False

    @hookimpl
    def maybe_compact(self, acc: AgentConfig) -> Any:
        raise TimeoutError("the summarizer hung up")


def test_a_compactor_that_raises_is_named_by_its_exception_type(telemetry):
    register_compactor("otel_raises", _Raises())
    try:
        acc = AgentConfig(model="gpt-4o", compactor="otel_raises")
        acc.memory.add_message("user", "hello")
        _, meta = run_compaction(acc, mid_round=False)
    finally:
        unregister_compactor("otel_raises")
    assert "TimeoutError: the summarizer hung up" in meta["error"]
    (span,) = telemetry.spans(BOUNDARY_SPAN)
    assert span.attributes["error.type"] == "TimeoutError"
    assert span.attributes["normandy.compactor.distribution"] == "<registered in code>"
    assert telemetry.value(METRIC_BOUNDARIES, **{"error.type": "TimeoutError"}) == 1


def _tool_round() -> list[ModelReply]:
    return [
        ModelReply(
            content=(ToolUseBlock(id="call_1", name="read", input={"path": "a.py"}),),
            stop_reason="tool_use",
        ),
        ModelReply(content=(TextBlock(text="The bug is on line 3."),)),
    ]


def _read(path: str) -> str:
    return f"contents of {path}"


def test_every_boundary_of_a_turn_is_a_span_under_the_applications_span(telemetry):
    tracer = telemetry.tracer_provider.get_tracer("the-app")
    acc = _agent()
    client = ScriptedClient(_tool_round())
    with tracer.start_as_current_span("invoke_agent") as app:
        result = run_turn(acc, "Find the bug.", client=client, tools={"read": _read})
    boundaries = result.events_of("boundary")
    spans = telemetry.spans(BOUNDARY_SPAN)
    assert len(spans) == len(boundaries) == 2
    first, second = spans
    assert all(s.parent is not None and s.parent.span_id == app.context.span_id for s in spans)
    assert first.attributes["normandy.outcome"] == "compacted"
    assert first.attributes["normandy.mid_round"] is False
    assert second.attributes["normandy.outcome"] == "skipped"
    assert second.attributes["normandy.mid_round"] is True
    for span in spans:
        assert span.attributes["normandy.turn_id"] == result.turn_id
        assert span.attributes["gen_ai.conversation.id"] == acc.session_id
        assert span.attributes["gen_ai.request.model"] == "gpt-4o"
        assert "gen_ai.provider.name" not in span.attributes  # a scripted client
    (compaction,) = telemetry.spans(COMPACTION_SPAN)
    assert compaction.parent.span_id == first.context.span_id
    assert telemetry.value(METRIC_COMPACTIONS) == 1
    assert telemetry.value(METRIC_BOUNDARIES) == 2
    summary = boundaries[0]["meta"]
    assert first.attributes["normandy.tokens.before"] == summary["tokens_before"]
    assert first.attributes["normandy.tokens.after"] == summary["tokens_after"]
    assert first.attributes["normandy.dropped.count"] == summary["dropped_count"] > 0


def _thinking_round(reads: int = 6) -> list[ModelReply]:
    """A round of ``reads`` tool calls, each reply opening with its thinking, then the answer."""

    def thought(n: int) -> ThinkingBlock:
        return ThinkingBlock(thinking=f"Step {n}: what next?", signature=f"sig-{n}")

    calls = [
        ModelReply(
            content=(thought(n), ToolUseBlock(id=f"c{n}", name="read", input={"path": f"{n}"})),
            stop_reason="tool_use",
        )
        for n in range(reads)
    ]
    return [*calls, ModelReply(content=(thought(reads), TextBlock(text="Line 3.")))]


def _long_read(path: str) -> str:
    return "\n".join(f"def f_{k}(x):\n    return x * {k}  # {path}" for k in range(60))


def test_stripped_thinking_and_the_calls_without_it_are_recorded(telemetry):
    acc = AgentConfig(
        model="claude-sonnet-4-5",
        compactor="window_manager",
        compactor_opts={
            "context_window": 2600,
            "reserved_tokens": 300,
            "target": 0.5,
            "round_aware": False,
        },
    )
    client = ScriptedClient(_thinking_round())
    result = run_turn(
        acc, "Find the bug.", client=client, tools={"read": _long_read}, thinking=2048
    )
    disabled = [req.effective_thinking is None for req in client.requests]
    assert result.thinking_disabled_calls == sum(disabled) > 0
    spans = telemetry.spans(BOUNDARY_SPAN)
    # one boundary before each call; each says whether that call goes without thinking
    assert [s.attributes["normandy.thinking_disabled"] for s in spans] == disabled
    compacted = [s for s in spans if s.attributes["normandy.compacted"]]
    stripped = [m["thinking_stripped"] for m in result.boundaries if m["compacted"]]
    assert [s.attributes["normandy.thinking_stripped"] for s in compacted] == stripped
    assert any(stripped)
    assert all(
        "normandy.thinking_stripped" not in s.attributes for s in spans if s not in compacted
    )
    measure = {"normandy.compactor": "window_manager", "gen_ai.request.model": acc.model}
    assert telemetry.value(METRIC_THINKING_DISABLED, **measure) == sum(disabled)
    assert telemetry.value(METRIC_THINKING_STRIPPED) == sum(stripped)
    (point,) = telemetry.points(METRIC_THINKING_STRIPPED)
    assert point.attributes == {**measure, "normandy.strategy": "oldest_first"}


def test_outside_a_turn_no_call_is_said_to_go_without_thinking(telemetry):
    compact(_messages(), model="gpt-4o", window=8000, opts={"reserved_tokens": 500})
    (span,) = telemetry.spans(BOUNDARY_SPAN)
    assert "normandy.thinking_disabled" not in span.attributes  # no turn, no next call
    assert span.attributes["normandy.thinking_stripped"] is False
    assert telemetry.points(METRIC_THINKING_DISABLED) == []


def test_the_async_turn_keeps_the_applications_span_as_parent(telemetry):
    tracer = telemetry.tracer_provider.get_tracer("the-app")

    async def main() -> Any:
        with tracer.start_as_current_span("invoke_agent") as app:
            result = await arun_turn(
                _agent(),
                "Find the bug.",
                client=ScriptedClient(_tool_round()),
                tools={"read": _read},
            )
        return app, result

    app, result = asyncio.run(main())
    spans = telemetry.spans(BOUNDARY_SPAN)
    assert len(spans) == len(result.events_of("boundary")) == 2
    assert all(s.parent is not None and s.parent.span_id == app.context.span_id for s in spans)


def test_the_provider_is_named_when_the_agents_client_says_which():
    pytest.importorskip("openai")
    pytest.importorskip("anthropic")
    from normandy_core.clients import AnthropicClient, OpenAIClient

    assert normandy_otel.provider_name(OpenAIClient("gpt-4o", api_key="sk-test")) == "openai"
    assert normandy_otel.provider_name(AnthropicClient("claude", api_key="t")) == "anthropic"
    assert normandy_otel.provider_name(ScriptedClient([])) is None
    assert normandy_otel.provider_name(None) is None


def test_a_boundary_of_an_openai_agent_carries_the_provider(telemetry):
    pytest.importorskip("openai")
    from normandy_core.clients import OpenAIClient

    acc = _agent(client=OpenAIClient("gpt-4o", api_key="sk-test"))
    _, meta = run_compaction(acc, mid_round=False)
    assert meta["compacted"]
    (span,) = telemetry.spans(BOUNDARY_SPAN)
    assert span.attributes["gen_ai.provider.name"] == "openai"
    assert span.attributes["gen_ai.system"] == "openai"
    (point,) = telemetry.points(METRIC_COMPACTIONS)
    assert point.attributes["gen_ai.provider.name"] == "openai"


def test_disabled_by_the_deny_list(telemetry, monkeypatch):
    from normandy_core import reload_plugins

    monkeypatch.setenv("NORMANDY_DISABLE_PLUGINS", "otel")
    reload_plugins()
    try:
        compact(_messages(1), model="gpt-4o", window=8000, fresh=True)
        assert telemetry.spans() == []
        rows = [r for r in list_plugins() if r.kind == "hook" and r.name == "otel"]
        assert [r.status for r in rows] == ["disabled"]
    finally:
        monkeypatch.delenv("NORMANDY_DISABLE_PLUGINS")
        reload_plugins()


_GLOBAL = """
import json
import sys

from normandy_core import compact, hook_manager, list_plugins

# pluggy's hook-call monitoring: which on_boundary implementations were called.
observed = []
hook_manager().add_hookcall_monitoring(
    lambda name, impls, kwargs: observed.extend(
        i.plugin_name for i in impls if name == "on_boundary"
    ),
    lambda outcome, name, impls, kwargs: None,
)

msgs = []
for i in range(30):
    msgs.append({"role": "user", "content": f"question {i} " + "q" * 400})
    msgs.append({"role": "assistant", "content": f"answer {i} " + "a" * 400})

# Before the application sets up OpenTelemetry: the plugin runs, and leaves it unimported.
compact(msgs, model="gpt-4o", window=8000, fresh=True)
loaded = [r.status for r in list_plugins() if r.kind == "hook" and r.name == "otel"]
untouched = not any(m.startswith("opentelemetry") for m in sys.modules)
called_before = list(observed)

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
tracer_provider = TracerProvider()
tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(tracer_provider)
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

result = compact(msgs, model="gpt-4o", window=8000, fresh=True)
counts = {}
for rm in reader.get_metrics_data().resource_metrics:
    for sm in rm.scope_metrics:
        for m in sm.metrics:
            counts[m.name] = sum(getattr(p, "value", getattr(p, "count", 0))
                                 for p in m.data.data_points)
print(json.dumps({
    "loaded": loaded,
    "untouched": untouched,
    "called_before": called_before,
    "called_after": observed[len(called_before):],
    "spans": [[s.name, s.instrumentation_scope.name, dict(s.attributes)]
              for s in exporter.get_finished_spans()],
    "metrics": counts,
    "compacted": result.compacted,
}))
"""


@pytest.mark.slow
def test_the_global_providers_are_used_once_the_application_sets_them(tmp_path):
    """A fresh interpreter: the plugin is found through its entry point, leaves
    OpenTelemetry alone until the application sets it up, then follows the global
    providers although it was loaded before they were set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NORMANDY_")}
    env["NORMANDY_ARCHIVE_PATH"] = str(tmp_path / "archive.sqlite3")
    env["NORMANDY_CACHE_DIR"] = str(tmp_path / "cache")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_GLOBAL)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["loaded"] == ["loaded"]
    assert out["untouched"] is True  # no OpenTelemetry import before the application's
    # Until then the hook is not even called (its active_when gate), then it is, once.
    assert out["called_before"] == []
    assert out["called_after"] == ["normandy_core.hooks:otel"]
    assert out["compacted"] is True
    names = [(name, scope) for name, scope, _ in out["spans"]]
    assert names == [(COMPACTION_SPAN, "normandy_otel"), (BOUNDARY_SPAN, "normandy_otel")]
    attrs = out["spans"][1][2]
    assert attrs["normandy.compactor"] == "window_manager"
    assert attrs["gen_ai.request.model"] == "gpt-4o"
    assert out["metrics"][METRIC_BOUNDARIES] == 1  # only the boundary after set-up
    assert out["metrics"][METRIC_COMPACTIONS] == 1
    assert out["metrics"][METRIC_DURATION] == 1
    assert out["metrics"][METRIC_TOKENS_REMOVED] > 0
