"""The ``compact_context`` tool: settings, the limits, and a whole scripted turn.

The turn runs the real ``window_manager`` (installed distribution, real tiktoken) with
the model summarizer; two scripted clients stand in for the models: the agent's, which
calls the tool, and the summarizer's, whose requests show the focus. The limits are
also checked as a property over generated sequences of model calls and tool batches.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, strategies as st

from normandy_core import AgentConfig, CompactToolSettings, TextBlock, ToolUseBlock
from normandy_core.clients import ModelReply, ScriptedClient
from normandy_core.turn import arun_turn, run_turn
from normandy_core.turn.compact_tool import CompactLimits

FOCUS = "keep the parser's failing test ids and the plan for src/parser.py"
READ_FILE = {
    "name": "read_file",
    "description": "Read a file.",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
}


def _read_file(path: str) -> str:
    return f"# {path}\n" + "def f(x):\n    return x\n" * 20


def _calls(n: int, *pairs: tuple[str, dict[str, Any]]) -> ModelReply:
    return ModelReply(
        content=tuple(
            ToolUseBlock(id=f"call_{n}_{k}", name=name, input=args)
            for k, (name, args) in enumerate(pairs)
        )
    )


def _text(text: str) -> ModelReply:
    return ModelReply(content=(TextBlock(text=text),))


def _agent(summarizer: ScriptedClient, **changes: Any) -> AgentConfig:
    fields: dict[str, Any] = {
        "model": "gpt-4o",
        "system_prompt": "You are a careful coding agent.",
        "tools": [READ_FILE],
        "compactor": "window_manager",
        "compactor_opts": {
            "context_window": 100_000,
            "strategy": "summarize",
            "summarizer": "model",
        },
        "client": summarizer,
        "compact_tool": CompactToolSettings(min_calls_between=2),
    }
    fields.update(changes)
    acc = AgentConfig(**fields)
    for i in range(4):  # an earlier phase of the work, far under the trigger
        acc.memory.add_message("user", f"Read m{i}.py and tell me about it.", turn_id=f"old{i}")
        acc.memory.add_message("assistant", f"m{i}.py defines helper_{i}. " * 10, turn_id=f"old{i}")
    return acc


def _script() -> list[ModelReply]:
    """Ask (accepted), ask again at once (too soon), ask after the interval with nothing
    new (declined), read a file, ask (accepted), answer."""
    return [
        _calls(1, ("compact_context", {"focus": FOCUS})),
        _calls(2, ("compact_context", {"focus": "again"})),
        _calls(3, ("compact_context", {})),
        _calls(4, ("read_file", {"path": "src/parser.py"})),
        _calls(5, ("compact_context", {"focus": "phase two"})),
        _text("The parser is refactored."),
    ]


def _summaries() -> ScriptedClient:
    return ScriptedClient([_text("Phase one: m0-m3 read."), _text("Phase two: parser read.")])


def _tool_answers(result: Any) -> dict[str, str]:
    return {
        block.tool_use_id: block.text()
        for entry in result.acc.memory.entries()
        for block in entry.tool_results
    }


def test_the_model_asks_and_the_next_boundary_compacts_with_its_focus() -> None:
    summarizer = _summaries()
    client = ScriptedClient(_script(), model="gpt-4o")
    result = run_turn(
        _agent(summarizer), "Refactor the parser.", client=client, tools={"read_file": _read_file}
    )
    assert result.text == "The parser is refactored."
    # the tool is offered to the model with the agent's own tools
    assert [t["name"] for t in client.requests[0].tools] == ["read_file", "compact_context"]
    # each accepted call compacted at the next boundary, its focus in the summarizer's prompt
    first, second = summarizer.requests
    assert FOCUS in first.system and "phase two" in second.system
    forced = [e for e in result.events_of("boundary") if e["trigger"] == "forced"]
    assert [e["batch"] for e in forced] == [1, 5]
    assert all(e["meta"]["compacted"] for e in forced)
    # the limits held, and each declined call was answered with why
    answers = [(e["accepted"], e["reason"]) for e in result.events_of("compact_tool")]
    assert [accepted for accepted, _ in answers] == [True, False, False, True]
    assert "at most one compaction every 2 model calls" in answers[1][1]
    assert "nothing new" in answers[2][1]
    text = _tool_answers(result)
    assert text["call_5_0"].startswith("Compaction accepted")
    # the declined calls' answers were compacted away by the second compaction; the
    # request right after each shows what the model read
    after_second = [b.text() for e in client.requests[2].messages for b in e.tool_results]
    assert any("Not compacted: at most one compaction every 2" in t for t in after_second)
    # the model's request after a compaction holds the summary, not the earlier phase
    seen = "\n".join(e.text() for e in client.requests[1].messages)
    assert "Phase one: m0-m3 read." in seen and "m1.py defines helper_1" not in seen


def test_the_async_shell_answers_the_tool_the_same_way() -> None:
    import asyncio

    summarizer = _summaries()
    client = ScriptedClient(_script(), model="gpt-4o")
    result = asyncio.run(
        arun_turn(
            _agent(summarizer),
            "Refactor the parser.",
            client=client,
            tools={"read_file": _read_file},
        )
    )
    answers = [e["accepted"] for e in result.events_of("compact_tool")]
    assert answers == [True, False, False, True]
    assert FOCUS in summarizer.requests[0].system


def test_a_declined_forced_boundary_is_reported_and_the_turn_goes_on() -> None:
    # noop declines every request: the turn goes on, the boundary says why
    client = ScriptedClient(
        [_calls(1, ("compact_context", {"focus": FOCUS})), _text("done")], model="gpt-4o"
    )
    acc = AgentConfig(model="gpt-4o", compact_tool=True)
    result = run_turn(acc, "Go.", client=client)
    assert result.text == "done"
    forced = [e for e in result.events_of("boundary") if e["trigger"] == "forced"]
    assert forced[0]["meta"]["declined"] == "compactor 'noop' never compacts"


def test_compact_tool_true_means_the_default_settings() -> None:
    assert AgentConfig(compact_tool=True).compact_tool == CompactToolSettings()
    assert AgentConfig(compact_tool=False).compact_tool_settings is None
    acc = AgentConfig(compact_tool=CompactToolSettings(tool_name="fold"))
    assert [t["name"] for t in acc.tool_definitions] == ["fold"]
    assert "at most once every 4 of your requests" in acc.tool_definitions[0]["description"]
    assert acc.replace(compact_tool=False).tool_definitions == ()


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: CompactToolSettings(min_calls_between=0),
            ValueError,
            "CompactToolSettings: min_calls_between must be a whole number of model calls >= 1",
        ),
        (
            lambda: CompactToolSettings(min_calls_between=True),
            ValueError,
            "min_calls_between must be",
        ),
        (
            lambda: CompactToolSettings(tool_name="compact context"),
            ValueError,
            "CompactToolSettings: tool_name must be",
        ),
        (
            lambda: AgentConfig(compact_tool="yes"),
            TypeError,
            "compact_tool must be True, False, None or a CompactToolSettings",
        ),
        (
            lambda: AgentConfig(
                tools=[{**READ_FILE, "name": "compact_context"}], compact_tool=True
            ),
            ValueError,
            "compact_tool: tools already has a tool named 'compact_context'",
        ),
    ],
)
def test_bad_settings_are_refused_where_the_config_is_made(
    make: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        make()


# -- the limits as a property -------------------------------------------------------------

#: One tool batch: whether the model also calls another tool, and how many times it
#: calls compact_context in it.
_batches = st.lists(st.tuples(st.booleans(), st.integers(0, 2)), max_size=30)


@given(_batches, st.integers(1, 5))
def test_the_limits_hold_for_any_sequence_of_calls(
    batches: list[tuple[bool, int]], interval: int
) -> None:
    limits = CompactLimits(interval)
    accepted: list[int] = []  # the model call of each accepted request
    content_since = True  # the turn's user message is new content
    for call, (other_tool, asks) in enumerate(batches, start=1):
        limits.model_called()
        answers = [limits.ask(f"focus {k}") for k in range(asks)]
        if other_tool:
            limits.content_arrived()
        asked, focus = limits.take()
        took = [why is None for why in answers]
        assert took.count(True) <= 1  # at most one request per batch
        assert asked == (True in took)
        if asked:
            assert focus == f"focus {took.index(True)}"
            assert not accepted or call - accepted[-1] >= interval
            assert content_since  # never twice in a row without new content
            accepted.append(call)
            content_since = False
        if other_tool:
            content_since = content_since or not asked
        # a declined ask always says why
        assert all(why is None or why for why in answers)
    # the first ask of a turn is always accepted
    first = next((i for i, (_, asks) in enumerate(batches) if asks), None)
    if first is not None:
        assert accepted and accepted[0] == first + 1
