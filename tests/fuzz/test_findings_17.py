"""What the fuzz campaign found once the native compactors joined it (issue 17): a
minimal reproducer each, now a regression test (the campaign case that found each is
named in its docstring; reproduce it with ``scripts/fuzz.py --seed S --start I
--max-cases 1``)."""

from __future__ import annotations

from typing import Any

import pytest

from fuzz.campaign import case_rng, run_case
from fuzz.provider import FuzzProvider
from normandy_core import compact

SYSTEM = "You review pull requests. " * 25


def _items() -> list[dict[str, Any]]:
    """A Responses conversation whose newest unit is large, its tool round open."""
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Review the parser change."},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "def parse(x): return x\n" * 4},
        {"role": "assistant", "content": "The parser looks fine so far."},
        {"role": "user", "content": "Now check the tests in tests/test_parser.py, please. " * 3},
        {"role": "assistant", "content": "Reading the three test modules now. " * 12},
        {"type": "function_call", "call_id": "c2", "name": "read", "arguments": '{"p": "a"}'},
        {"type": "function_call", "call_id": "c3", "name": "read", "arguments": '{"p": "b"}'},
    ]


def test_a_compaction_that_leaves_no_room_is_discarded_for_a_cut_that_fits() -> None:
    """Campaign: seed 11, index 1585 (openai_native, Responses, mid-round; check
    ``needless_error``). The provider's compaction item (pinned, as a provider summary
    must stay) and the user message it returns left no room: the fallback, cutting
    after them, could not fit, and the boundary failed where cutting the originals
    fits. The fallback now compacts the originals, and meta says the provider's
    compaction was discarded."""
    provider = FuzzProvider("openai", "ok")
    result = compact(
        _items(),
        compactor="openai_native",
        client=provider,
        window=350,
        opts={"reserved_tokens": 30, "counter": "cl100k_base"},
        mid_round=True,
        format="responses",
        model="gpt-4o",
        # the finding predates the rule; with the request kept the window is too small
        survival={"keep_current_request": False},
    )
    assert result.error is None, result.error
    assert result.compacted and len(provider.calls) == 1
    assert result.meta["provider_compaction_discarded"] is True
    assert result.meta["native"] is False and result.meta["fallback_cause"] == "too_large"
    assert result.meta["provider_usage"]["output_tokens"] == 60  # the call still cost
    assert result.tokens_after <= 350 - 30
    assert not any(m.get("type") == "compaction" for m in result.messages)


def test_nothing_left_to_summarize_within_the_window_is_no_error() -> None:
    """Campaign: seed 12, index 2336 (openai_native without a fallback, a trigger far
    below the window; check ``idempotence``). Compacted once, the conversation was still
    over the trigger, within the window, with only the user messages the provider
    returns before its compaction: the next boundary has nothing to summarize, and
    without a fallback it reported an error. It now skips, saying why."""
    provider = FuzzProvider("openai", "ok")
    settings: dict[str, Any] = {
        "compactor": "openai_native",
        "client": provider,
        "window": 4_000,
        "opts": {"trigger_tokens": 150, "reserved_tokens": 95, "fallback": None},
        "mid_round": False,
        "format": "responses",
        "model": "gpt-4o",
    }
    items = [*_items(), {"type": "function_call_output", "call_id": "c2", "output": "a"}]
    items.append({"type": "function_call_output", "call_id": "c3", "output": "b"})
    first = compact(items, **settings)
    assert first.compacted and first.error is None and first.meta["native"] is True
    assert first.tokens_after > 150  # still over the trigger
    second = compact(list(first.messages), **settings)
    assert second.error is None, second.error
    assert not second.compacted and "nothing before the newest" in second.meta["skipped_because"]
    assert len(provider.calls) == 1


#: The campaign cases of the cost schedule's idempotence defect: seed 53 (31 minutes at
#: b953ae8: all 13 of its findings) and seed 47 (the pipelines among its later findings).
COST_IDEMPOTENCE_CASES = (
    [(53, i) for i in (5484, 7910, 20947, 24765, 28701, 30026, 36752, 48724, 50623, 52503, 55832)]
    + [(53, 70765), (53, 76880)]
    + [(47, i) for i in (24119, 28069, 36404, 38139, 40383, 49059)]
)


@pytest.mark.parametrize(("seed", "index"), COST_IDEMPOTENCE_CASES)
def test_the_cost_schedule_is_idempotent_on_the_campaign_cases(seed: int, index: int) -> None:
    """Campaign: the cases above (``window_manager`` with ``schedule="cost"``, mostly after
    ``clear_tool_results`` in a pipeline, in every format; check ``idempotence``). Two
    causes: the growth per call and the plans are estimated from the history, which the
    compaction changes (the cleared results end the intact part), so the schedule weighed
    on its own output found another plan paying and compacted again; and a result one
    step cleared lost its metadata in a wire format, so the next cleared it again. The
    schedule now weighs its result again until it waits (``cost_rounds``), and a cleared
    result is recognised by its placeholder's tag
    (``normandy_core.conversation.keys.CLEARED_TAG``)."""
    findings = run_case(case_rng(seed, index), seed=seed, index=index)
    assert not findings, [f.message for f in findings]


def test_a_cleared_custom_call_reads_back_as_it_was_written() -> None:
    """Campaign: seed 79, index 9672 (``clear_tool_results`` with ``clear_tool_inputs``
    before ``window_manager`` in a pipeline, Chat Completions; check ``idempotence``). A
    custom tool call (free-form input) whose input was cleared is written with an empty
    input, which read back as ``{"input": ""}``, not the cleared ``{}``: the output counted
    4 tokens more than the compaction had, over the window, and was compacted again. An
    empty custom input now reads as no input, in both wire formats."""
    findings = run_case(case_rng(79, 9672), seed=79, index=9672)
    assert not findings, [f.message for f in findings]


@pytest.mark.parametrize("fmt", ["openai", "responses"])
def test_a_custom_call_reads_its_input_and_its_cleared_input_back(fmt: str) -> None:
    """A custom tool call's input reads as ``{"input": text}``, an empty one as no input;
    cleared by a compaction, it is written empty and reads back as the compaction left
    it: compacting the output again changes nothing."""
    from normandy_core import ToolUseBlock
    from normandy_core.transcripts.facade import parse_transcript

    if fmt == "openai":
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": "Patch it. " * 40},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"c{k}", "type": "custom", "custom": {"name": "apply", "input": text}}
                    for k, text in enumerate(("*** patch " * 30, ""))
                ],
            },
            *({"role": "tool", "tool_call_id": f"c{k}", "content": "ok " * 30} for k in range(2)),
            {"role": "assistant", "content": "Patched."},
        ]
    else:
        messages = [
            {"role": "user", "content": "Patch it. " * 40},
            *(
                {"type": "custom_tool_call", "call_id": f"c{k}", "name": "apply", "input": text}
                for k, text in enumerate(("*** patch " * 30, ""))
            ),
            *(
                {"type": "custom_tool_call_output", "call_id": f"c{k}", "output": "ok " * 30}
                for k in range(2)
            ),
            {"role": "assistant", "content": "Patched."},
        ]

    def inputs(data: Any) -> list[dict[str, Any]]:
        memory = parse_transcript(data, format=fmt)[1]
        return [b.input for e in memory.entries() for b in e.blocks if isinstance(b, ToolUseBlock)]

    assert inputs(messages) == [{"input": "*** patch " * 30}, {}]
    settings: dict[str, Any] = {
        "compactor": "clear_tool_results",
        "opts": {"keep": 0, "clear_tool_inputs": True, "trigger_tokens": 1},
        "window": 100_000,
        "format": fmt,
        "mid_round": True,
    }
    first = compact(messages, **settings)
    assert first.compacted and first.error is None, first.error
    assert inputs(first.messages) == [{}, {}]
    again = compact(first.messages, **settings)
    assert not again.compacted and again.tokens_before == first.tokens_after
