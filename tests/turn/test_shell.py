"""The sync and async shells on a scripted multi-batch session with a small window."""

from __future__ import annotations

import asyncio
import math
import sys
import time

import pytest

from normandy_core import AgentConfig, TextBlock, ThinkingBlock, ToolUseBlock
from normandy_core.clients import ModelReply, ScriptedClient, Usage
from normandy_core.conversation.calibration import default_calibration
from normandy_core.turn import TurnAborted, arun_turn, run_turn
from normandy_core.turn.driver import client_endpoint

support = sys.modules["normandy_turn_test_support"]  # loaded by conftest.py

TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file of the repository.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
    {
        "name": "run_tests",
        "description": "Run the test suite.",
        "input_schema": {"type": "object", "properties": {}},
    },
]


def read_file(path: str) -> str:
    lines = [
        f"def {path.replace('.', '_')}_{k}(x):\n    return x * {k}  # {path}" for k in range(40)
    ]
    return "\n".join(lines)


def run_tests() -> str:
    raise RuntimeError("pytest crashed: ImportError in conftest")


INFLIGHT = {"now": 0, "max": 0}


async def aread_file(path: str) -> str:
    INFLIGHT["now"] += 1
    INFLIGHT["max"] = max(INFLIGHT["max"], INFLIGHT["now"])
    await asyncio.sleep(0.03)
    INFLIGHT["now"] -= 1
    return read_file(path)


def think(tag: str) -> ThinkingBlock:
    return ThinkingBlock(
        thinking=f"Reasoning {tag}: what do I know so far?", signature=f"sig-{tag}"
    )


def reply(tag: str, *blocks) -> ModelReply:
    return ModelReply(content=(think(tag), *blocks), usage=Usage(0, 30))


def read(call_id: str, path: str) -> ToolUseBlock:
    return ToolUseBlock(id=call_id, name="read_file", input={"path": path})


def session_script() -> list[ModelReply]:
    return [
        # turn 1: four tool batches (the first and third parallel), then the answer
        reply("1", TextBlock(text="Reading both."), read("c1", "a.py"), read("c2", "b.py")),
        reply("2", read("c3", "c.py")),
        reply("3", ToolUseBlock(id="c4", name="run_tests", input={}), read("c5", "d.py")),
        reply("4", read("c6", "e.py")),
        reply("5", TextBlock(text="The bug is in c.py.")),
        # turn 2
        reply("6", read("c7", "f.py")),
        reply("7", TextBlock(text="Done.")),
    ]


#: The counter Claude models count with before any usage (o200k_base times 1.30).
PRIOR = "claude:tiktoken:o200k_base*1.30"


def reported_input(req) -> int:
    """More than the Claude prior counts: the calibration has something to learn."""
    chars = len(req.system) + sum(len(e.text()) for e in req.messages)
    return math.ceil(chars / 1.4) + 40


def make_acc(compactor: str, window: int = 2600, **opts) -> AgentConfig:
    if compactor == "window_manager":
        opts = {"reserved_tokens": 300, "target": 0.5, **opts}
    return AgentConfig(
        model="claude-sonnet-4-5",
        system_prompt="You are a careful coding agent.",
        tools=TOOLS,
        compactor=compactor,
        compactor_opts={"context_window": window, **opts},
    )


def check_session(client, results, drops, thinking):
    produced = {
        (b.thinking, b.signature)
        for r in session_script()
        for b in r.content
        if isinstance(b, ThinkingBlock)
    }
    disabled_turns = set()
    for n, req in enumerate(client.requests):
        on = req.effective_thinking is not None
        assert support.request_problems(list(req.messages), on) == [], f"request {n}"
        for e in req.messages:
            for b in e.blocks:
                if isinstance(b, ThinkingBlock):
                    assert (b.thinking, b.signature) in produced  # never altered
        if req.thinking and not on:
            disabled_turns.add(n)
    first, second = results
    # turn 1 compacted mid-round and finished its round without thinking
    mids = [e for e in first.events_of("boundary") if e["mid_round"] and e["meta"]["compacted"]]
    assert mids, "turn 1 should compact mid-round"
    assert first.events_of("thinking_disabled")
    assert disabled_turns
    # the result counts the calls sent with thinking disabled, one per such request
    assert first.thinking_disabled_calls + second.thinking_disabled_calls == len(disabled_turns)
    assert second.thinking_disabled_calls == 0
    # ...and turn 2 asks with thinking again from its first request
    t2_first = len(client.requests) - 2
    assert client.requests[t2_first].effective_thinking == thinking
    assert first.text == "The bug is in c.py."
    assert second.text == "Done."
    # the hook saw the dropped entries, with their ids and original content (thinking kept)
    seen = [e for call in drops.calls for e in call["dropped"]]
    reported = [
        i for r in results for b in r.events_of("boundary") for i in b["meta"]["dropped_ids"]
    ]
    assert [e.id for e in seen] == reported
    assert any(e.has_thinking for e in seen)
    assert any(call["mid_round"] for call in drops.calls)
    # boundary events carry ids and counts, never the dropped contents
    for r in results:
        for b in r.events_of("boundary"):
            assert "dropped" not in b["meta"]
            assert b["meta"]["dropped_count"] == len(b["meta"]["dropped_ids"])
    # the raising tool became an error result, answered in the same batch
    results_by_id = {
        blk.tool_use_id: blk
        for req in client.requests
        for e in req.messages
        for blk in e.tool_results
    }
    assert results_by_id["c4"].is_error
    assert "pytest crashed" in results_by_id["c4"].text()
    # calibration: the provider counts more than the raw estimate, so the factor rose
    cal = [b["meta"]["calibration"] for b in second.events_of("boundary")]
    assert cal[-1]["factor"] > 1.0
    assert cal[-1]["counter"] == PRIOR
    # budget: removed tokens stay spent
    removed = sum(b["meta"].get("tokens_removed", 0) for b in first.events_of("boundary"))
    assert first.budget.removed == removed > 0
    assert first.budget.spent >= removed
    assert first.usage.output_tokens == 5 * 30


@pytest.mark.parametrize("compactor", ["window_manager", "stand-in"])
def test_sync_shell_compacts_mid_round_with_valid_requests(compactor, keep_tail, drops):
    client = ScriptedClient(session_script(), input_tokens=reported_input)
    acc = make_acc(keep_tail if compactor == "stand-in" else compactor)
    tools = {"read_file": read_file, "run_tests": run_tests}
    first = run_turn(acc, "Find the bug.", client=client, tools=tools, thinking=2048, budget=50_000)
    second = run_turn(first.acc, "Now fix it.", client=client, tools=tools, thinking=2048)
    check_session(client, [first, second], drops, 2048)
    # parallel calls of one reply: one user entry with all results in tool-use order
    mem = second.acc.memory.entries()
    assert client.remaining == 0
    assert next(e.role for e in mem) == "user"
    batch = next(r for r in client.requests[1].messages if r.tool_results)
    assert [b.tool_use_id for b in batch.tool_results] == ["c1", "c2"]
    assert first.reason == "answer"


def test_async_shell_compacts_in_a_thread_and_batches_concurrently(keep_tail, drops):
    client = ScriptedClient(session_script(), input_tokens=reported_input)
    acc = make_acc(keep_tail, sleep=0.05)
    tools = {"read_file": aread_file, "run_tests": run_tests}
    support.SLEEPS.clear()
    INFLIGHT.update(now=0, max=0)

    async def main():
        ticks: list[float] = []
        stop = asyncio.Event()

        async def ticker():
            while not stop.is_set():
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.002)

        task = asyncio.create_task(ticker())
        first = await arun_turn(
            acc, "Find the bug.", client=client, tools=tools, thinking=2048, budget=50_000
        )
        second = await arun_turn(
            first.acc, "Now fix it.", client=client, tools=tools, thinking=2048
        )
        stop.set()
        await task
        return first, second, ticks

    first, second, ticks = asyncio.run(main())
    check_session(client, [first, second], drops, 2048)
    boundaries = len(first.events_of("boundary")) + len(second.events_of("boundary"))
    assert len(support.SLEEPS) == boundaries
    # the event loop kept running while each compaction blocked its worker thread
    for start, end in support.SLEEPS:
        assert any(start < t < end for t in ticks)
    # the two read_file calls of the first reply ran concurrently, as one batch
    assert INFLIGHT["max"] == 2


def test_iteration_cap_ends_with_a_final_call(keep_tail):
    script = [reply(str(i), read(f"x{i}", f"{i}.py")) for i in range(3)]
    client = ScriptedClient(script)
    result = run_turn(
        make_acc(keep_tail, window=200_000),
        "Loop forever.",
        client=client,
        tools={"read_file": read_file},
        max_iterations=2,
    )
    assert [r.tool_choice for r in client.requests] == ["auto", "auto", "none"]
    assert result.reason == "iteration_cap"
    assert result.events_of("iteration_cap")
    assert result.events_of("tool_calls_ignored") == []  # the client honoured tool_choice
    assert support.request_problems(result.acc.memory.entries(), thinking_on=False) == []


def test_budget_asks_for_a_final_answer(keep_tail):
    script = [reply(str(i), read(f"x{i}", f"{i}.py")) for i in range(5)]
    client = ScriptedClient(script)
    result = run_turn(
        make_acc(keep_tail, window=200_000),
        "Read everything.",
        client=client,
        tools={"read_file": read_file},
        budget=900,
    )
    assert result.reason == "budget"
    assert client.requests[-1].tool_choice == "none"
    assert result.budget.remaining <= 0
    assert len(client.requests) < 5


def test_unknown_tool_and_client_failure(keep_tail):
    script = [reply("1", ToolUseBlock(id="u1", name="nope", input={}))]
    client = ScriptedClient(script)
    with pytest.raises(TurnAborted, match="no reply left") as info:
        run_turn(make_acc(keep_tail, window=200_000), "Go.", client=client, tools={})
    mem = info.value.acc.memory.entries()
    assert mem[-1].tool_results[0].is_error
    assert "unknown tool 'nope'" in mem[-1].tool_results[0].text()
    assert info.value.events[-1]["type"] == "turn_aborted"


def test_noop_compactor_turn_changes_nothing_and_calibration_is_conservative():
    default_calibration().reset()
    client = ScriptedClient(
        [reply("1", TextBlock(text="Hi."))],
        input_tokens=lambda req: 1,  # a provider reporting far fewer tokens than estimated
    )
    acc = AgentConfig(model="claude-sonnet-4-5", system_prompt="x" * 3000)
    result = run_turn(acc, "Hello", client=client)
    assert result.text == "Hi."
    # noop changed nothing, so nothing was prepared again; the caller's config is untouched
    assert result.acc.prepared is acc.prepared and result.acc.session_id == acc.session_id
    assert len(acc.memory) == 0 and [e.role for e in result.acc.memory] == ["user", "assistant"]
    boundary = result.events_of("boundary")[0]["meta"]
    assert boundary["compacted"] is False
    # one report far below the estimate lowers nothing (issue 32): it says the provider
    # under-reports, and a factor below 1 needs repeated consistent evidence above the floor
    scripted = default_calibration().for_endpoint(client_endpoint(client))
    assert scripted.snapshot("claude-sonnet-4-5", PRIOR)["observations"] == 1
    assert scripted.factor("claude-sonnet-4-5", PRIOR) == 1.0
    default_calibration().reset()


def test_a_custom_calibration_given_to_run_turn_reaches_the_compactor():
    """Issue 11: run_turn(..., calibration=Calibration()) never reached window_manager,
    which read the process-wide default, while the shell's events reported the custom
    factor. Now the compactor sizes with ctx.counter, calibrated by the turn's own."""
    from normandy_core import Calibration

    mine = Calibration(min_tokens=1)
    # evidence is kept per client endpoint (issue 32): the scripted client's, factor 3.0
    scripted = client_endpoint(ScriptedClient([]))
    mine.for_endpoint(scripted).observe("claude-sonnet-4-5", PRIOR, 100, 300)
    from normandy_core import get_counter

    tools = {"read_file": read_file, "run_tests": run_tests}
    probe = run_turn(
        make_acc("window_manager", window=10**7),
        "Find the bug.",
        client=ScriptedClient(session_script(), input_tokens=reported_input),
        tools=tools,
        calibration=Calibration(),
    )
    size = probe.acc.memory.tokens(get_counter("claude")) + probe.acc.prompt_tokens
    window = 2 * size + 300  # the session fits at factor 1, not at factor 3
    plain = run_turn(
        make_acc("window_manager", window=window),
        "Find the bug.",
        client=ScriptedClient(session_script(), input_tokens=reported_input),
        tools=tools,
        calibration=Calibration(),
    )
    assert not any(b["meta"]["compacted"] for b in plain.events_of("boundary"))
    client = ScriptedClient(session_script(), input_tokens=reported_input)
    acc = make_acc("window_manager", window=window)
    result = run_turn(acc, "Find the bug.", client=client, tools=tools, calibration=mine)
    compactions = [b["meta"] for b in result.events_of("boundary") if b["meta"]["compacted"]]
    assert compactions, "tripled counts put the same session over the window"
    assert compactions[0]["calibration"]["factor"] >= 3.0
