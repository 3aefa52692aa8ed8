"""Compacting the output of ``compact()`` again with the same settings is a no-op (issue 12).

A framework user calls ``compact()`` before every request, on what the previous call
returned. The marker and the summary a compaction inserts must keep their identity through
the OpenAI and Anthropic formats: the second call must neither drop the old marker (and
report it as dropped content), nor insert a new one, nor summarise the summary.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, strategies as st

from normandy_core import AgentMemory, ToolResultBlock, ToolUseBlock, compact
from normandy_core.app.workload import generate_session
from normandy_core.transcripts.anthropic import from_anthropic, to_anthropic
from normandy_core.transcripts.chat import from_openai, to_openai
from normandy_core.transcripts.formats import INSERTED_TAGS

STRATEGIES = ["oldest_first", "sliding_window", "summarize"]
FORMATS = ["openai", "anthropic", "normandy"]


def render(memory: AgentMemory, fmt: str) -> Any:
    if fmt == "openai":
        return to_openai(memory)
    if fmt == "anthropic":
        system, messages = to_anthropic(memory)
        return {"system": system, "messages": messages}
    return memory.dump()


def tight_session() -> AgentMemory:
    """Small turns, then a newest tool round too big for the target: a compaction of it
    drops everything it may and still ends above the trigger (``target_met`` false)."""
    mem = AgentMemory()
    mem.add_message("system", "You are a careful coding agent.", turn_id=None)
    for t in range(6):
        mem.add_message("user", f"Step {t}: look at module m{t}.", turn_id=f"t{t}")
        use = ToolUseBlock(id=f"u{t}", name="read_file", input={"path": f"m{t}.py"})
        mem.add_message("assistant", (use,), turn_id=f"t{t}")
        body = f"def f{t}(x):\n    return x + {t}\n" * 12
        mem.add_message(
            "user", (ToolResultBlock(tool_use_id=use.id, content=body),), turn_id=f"t{t}"
        )
        mem.add_message("assistant", f"m{t}.py adds {t}.", turn_id=f"t{t}")
    mem.add_message("user", "Now read the big log.", turn_id="t9")
    use = ToolUseBlock(id="u9", name="read_file", input={"path": "big.log"})
    mem.add_message("assistant", (use,), turn_id="t9")
    body = "".join(f"line {k}: request served in {k % 97} ms\n" for k in range(260))
    mem.add_message("user", (ToolResultBlock(tool_use_id=use.id, content=body),), turn_id="t9")
    return mem


#: The tight session's newest request lets the cut fall after an assistant message (so a
#: marker goes in) only when it may go; kept, the cut falls before it and needs no marker.
LET_GO_REQUEST = {"keep_current_request": False}


def opts_for(strategy: str, **extra: Any) -> dict[str, Any]:
    opts: dict[str, Any] = {"strategy": strategy, "counter": "cl100k_base", **extra}
    if strategy == "summarize":
        opts["summarizer"] = "extractive"
    return opts


def twice(data: Any, **kwargs: Any) -> tuple[Any, Any]:
    first = compact(data, **kwargs)
    assert first.error is None, first.error
    assert first.compacted
    second = compact(first.messages, **kwargs)
    assert second.error is None, second.error
    return first, second


def check_no_op(first: Any, second: Any) -> None:
    assert not second.compacted, {k: v for k, v in second.meta.items() if k != "dropped"}
    assert second.dropped == []
    assert second.messages == first.messages


@pytest.mark.parametrize("mid_round", [False, True])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_compacting_the_output_again_is_a_no_op(fmt, strategy, mid_round):
    memory = generate_session(4, 80, end_mid_round=mid_round)
    first, second = twice(
        render(memory, fmt),
        window=14_000,
        opts=opts_for(strategy, reserved_tokens=1_000),
        mid_round=mid_round,
    )
    check_no_op(first, second)


@pytest.mark.parametrize("mid_round", [False, True])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_no_op_after_a_first_pass_that_ends_above_the_trigger(fmt, strategy, mid_round):
    """The case the fuzz campaign found: nothing more can go, the result is above the
    trigger, and the second pass swapped the old marker (or summary) for a new one."""
    memory = tight_session()
    opts = opts_for(strategy, reserved_tokens=0, trigger=0.9, target=0.5)
    if strategy == "sliding_window":
        opts["keep_last_turns"] = 1
    probe = compact(
        memory,
        window=10**6,
        opts={**opts, "target": 0.0001, "trigger": 0.0001},
        survival=LET_GO_REQUEST,
    )
    floor = probe.meta["tokens_after"]  # everything that cannot go, with the marker/summary
    window = int(floor / 0.95) + (120 if strategy == "summarize" else 0)
    first, second = twice(
        render(memory, fmt),
        window=window,
        opts=opts,
        mid_round=mid_round,
        survival=LET_GO_REQUEST,
    )
    meta = first.meta
    assert meta["target_met"] is False
    assert ("summary_id" if strategy == "summarize" else "marker_id") in meta
    assert "summary_fallback" not in meta
    if not mid_round:
        assert meta["tokens_after"] > 0.9 * window  # above the trigger
    check_no_op(first, second)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_pipeline_is_idempotent_too(fmt):
    steps = [
        {"compactor": "clear_tool_results", "opts": {"trigger_tokens": 8_000, "keep": 3}},
        {"compactor": "window_manager", "opts": opts_for("oldest_first", reserved_tokens=1_000)},
    ]
    memory = generate_session(6, 80)
    first, second = twice(
        render(memory, fmt), compactor="pipeline", window=14_000, opts={"steps": steps}
    )
    check_no_op(first, second)


@pytest.mark.parametrize("strategy", ["oldest_first", "summarize"])
def test_inserted_messages_are_recognised_in_both_formats(strategy):
    memory = tight_session()
    opts = opts_for(strategy, reserved_tokens=0)
    result = compact(memory, window=4_000, opts=opts, survival=LET_GO_REQUEST)
    key = "normandy.summary" if strategy == "summarize" else "normandy.compaction_marker"
    (inserted,) = [e for e in result.memory if e.metadata.get(key)]
    assert inserted.text().startswith(next(t for t, k in INSERTED_TAGS.items() if k == key))
    for parsed in (
        from_openai(to_openai(result.memory)),
        from_anthropic(*reversed(to_anthropic(result.memory))),
    ):
        again = [e for e in parsed if e.metadata.get(key)]
        assert [e.text() for e in again] == [inserted.text()]
        assert len(parsed) == len(result.memory)


def test_a_summary_merged_into_a_user_message_is_split_back_out():
    """Anthropic joins consecutive user messages: the summary stays an entry of its own."""
    mem = AgentMemory()
    mem.add_message("user", "[normandy:summary] Summary of earlier messages.\n- a", turn_id="s")
    mem.add_message("user", "And now the next request.", turn_id="t1")
    mem.add_message("assistant", "On it.", turn_id="t1")
    system, messages = to_anthropic(mem)
    assert len(messages) == 2  # merged on the wire
    parsed = from_anthropic(messages, system)
    assert [e.text() for e in parsed] == [e.text() for e in mem]
    assert [bool(e.metadata.get("normandy.summary")) for e in parsed] == [True, False, False]


# -- schedule="cost" (issue 17) ----------------------------------------------------------


@st.composite
def cost_cases(draw: st.DrawFn) -> tuple[Any, dict[str, Any]]:
    """A session in a format, and ``compact()`` arguments with ``schedule="cost"``: alone
    or after ``clear_tool_results`` in a pipeline, the window from 30 % to 130 % of it."""
    memory = generate_session(draw(st.integers(0, 10_000)), draw(st.integers(12, 90)))
    fmt = draw(st.sampled_from(FORMATS))
    size = compact(memory, window=10**7, opts=opts_for("oldest_first")).tokens_before
    window = max(int(size / draw(st.sampled_from([0.3, 0.6, 0.9, 1.1, 1.3]))), 1_500)
    strategy = draw(st.sampled_from(["oldest_first", "summarize"]))
    wm = opts_for(strategy, schedule="cost", reserved_tokens=0, horizon=draw(st.integers(1, 50)))
    if draw(st.booleans()):
        wm["target"] = draw(st.sampled_from([0.1, 0.25, 0.5]))
    kwargs: dict[str, Any] = {"window": window, "model": "claude-sonnet-4-5"}
    if draw(st.booleans()):
        clear = {
            "keep": draw(st.integers(0, 5)),
            "trigger_tokens": max(int(size * draw(st.floats(0.05, 1.5))), 1),
            "counter": "cl100k_base",
        }
        kwargs |= {
            "compactor": "pipeline",
            "opts": {
                "steps": [
                    {"compactor": "clear_tool_results", "opts": clear},
                    {"compactor": "window_manager", "opts": wm},
                ]
            },
        }
    else:
        kwargs["opts"] = wm
    return render(memory, fmt), kwargs


@given(cost_cases())
def test_the_cost_schedule_compacts_its_own_output_no_further(case: Any) -> None:
    """The campaign's open defect (seed 53: 13 cases in 75,899): the schedule's growth
    estimate and plans change once it has cut, and a cleared result lost its metadata in
    a wire format, so a second pass compacted again. It now weighs its result again
    until it waits, and recognises a cleared result by its placeholder's tag."""
    data, kwargs = case
    first = compact(data, **kwargs)
    if not first.compacted:
        return
    second = compact(first.messages, **kwargs)
    assert second.error is None, second.error
    check_no_op(first, second)
