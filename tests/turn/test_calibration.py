"""Calibrated counting, the scripted client, and tool-result conversion."""

from __future__ import annotations

import pytest

from normandy_core import AgentMemory, ImageBlock, TextBlock, ToolResultBlock, ToolUseBlock
from normandy_core.clients import ModelClientError, ScriptedClient, complete_text
from normandy_core.conversation.calibration import CalibratedCounter, Calibration
from normandy_core.conversation.tokens import get_counter
from normandy_core.turn import tool_result


def test_factor_is_the_largest_recent_ratio_rounded_up():
    cal = Calibration(window=3, min_tokens=100)
    assert cal.factor("m", "c") == 1.0  # no evidence
    cal.observe("m", "c", 1000, 1201)
    cal.observe("m", "c", 1000, 1100)
    assert cal.factor("m", "c") == 1.21  # never below what any recent request showed
    assert cal.factor("m", "other") == 1.0  # per counter
    assert cal.factor("other", "c") == 1.0  # per model
    for _ in range(3):
        cal.observe("m", "c", 1000, 900)
    # every recent request over-counted by 10 %: lowered by exactly that much, no more
    assert cal.factor("m", "c") == 0.9
    cal.observe("m", "c", 50, 5000)  # too small to be evidence
    assert cal.factor("m", "c") == 0.9
    cal.observe("m", "c", 1000, 1)
    # a report below the floor says the provider under-reports, not that the count is high:
    # it lowers nothing, and blocks lowering while it is among the recent ones
    assert cal.factor("m", "c") == 1.0
    snap = cal.snapshot("m", "c")
    assert snap["observations"] == 6
    assert snap["recent_ratios"] == [0.9, 0.9, 0.001]


def test_floor_and_reset():
    cal = Calibration(floor=0.5, min_tokens=1, agree=2)
    for _ in range(2):
        cal.observe("m", "c", 1000, 500)
    assert cal.factor("m", "c") == 0.5
    cal.observe("m", "c", 1000, 10)
    assert cal.factor("m", "c") == 1.0  # never below the floor: not evidence at all
    cal.reset("m")
    assert cal.factor("m", "c") == 1.0
    with pytest.raises(ValueError, match="floor"):
        Calibration(floor=0)


def test_a_factor_is_never_above_the_ceiling():
    """However far above the count a provider reports (a proxy, a bad figure), the
    factor stops at ``ceiling``; at or under it the largest ratio stands."""
    cal = Calibration(min_tokens=1)
    cal.observe("m", "c", 1000, 3_990)
    assert cal.factor("m", "c") == 3.99
    cal.observe("m", "c", 1000, 50_000)
    assert cal.factor("m", "c") == cal.ceiling == 4.0
    tight = Calibration(min_tokens=1, ceiling=1.2)
    tight.observe("m", "c", 1000, 1_500)
    assert tight.factor("m", "c") == 1.2
    with pytest.raises(ValueError, match="ceiling"):
        Calibration(ceiling=0.9)


def test_calibrated_counter_scales_and_renames():
    cal = Calibration(min_tokens=1)
    base = get_counter("conservative")
    counter = CalibratedCounter(base, "m", cal)
    mem = AgentMemory()
    mem.add_message("user", "x" * 3000)
    raw = mem.tokens(base)
    assert counter.name == base.name
    assert mem.tokens(counter) == raw
    cal.observe("m", base.name, 1000, 1500)
    assert counter.name == "conservative*1.50"
    assert mem.tokens(counter) == -(-raw * 3 // 2)
    assert counter.count_text("abc" * 100) == 150
    assert counter.memory_tokens(mem) == -(-raw * 3 // 2)
    assert counter.entry_tokens(mem, mem.last()) == -(-raw * 3 // 2)


def test_scripted_client_records_and_runs_out():
    client = ScriptedClient.from_records(
        [{"content": [{"type": "text", "text": "A summary."}], "usage": {"input_tokens": 7}}]
    )
    assert complete_text(client, "Summarize this.", system="Be brief.") == "A summary."
    req = client.requests[0]
    assert req.system == "Be brief."
    assert req.messages[0].content == "Summarize this."
    assert req.tool_choice == "auto"
    with pytest.raises(ModelClientError, match="no reply left for request 2"):
        client.complete("", "again")


def test_tool_result_conversion():
    call = ToolUseBlock(id="u1", name="t", input={})
    assert tool_result(call, "text").content == "text"
    assert tool_result(call, {"a": [1, 2]}).content == '{"a": [1, 2]}'
    img = ImageBlock(source={"type": "url", "url": "https://x/y.png"})
    assert tool_result(call, [TextBlock(text="see"), img]).content == (TextBlock(text="see"), img)
    done = tool_result(call, ToolResultBlock(tool_use_id="other", content="no", is_error=True))
    assert done.tool_use_id == "u1"
    assert done.is_error
