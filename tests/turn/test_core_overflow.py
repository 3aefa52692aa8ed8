"""The pure core's recovery from a too-long refusal: one overflow boundary per call, then
the same call again; a second refusal, or a boundary that compacted nothing, fails."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from normandy_core import TextBlock, ToolResultBlock, ToolUseBlock
from normandy_core.turn import (
    CallModel,
    CompactionDone,
    ContextOverflowed,
    Emit,
    Fail,
    Finish,
    MaybeCompact,
    ModelReplied,
    Phase,
    ToolResults,
    UserInput,
    start,
    step,
)

_REFUSED = ContextOverflowed({"size": 210_000, "limit": 200_000}, target=170_000)


def _steered(s, compacted=False):
    return step(s, CompactionDone({"compacted": compacted}))


def test_a_refusal_steers_at_an_overflow_boundary_then_calls_again():
    s, _ = step(start("t", max_iterations=3), UserInput("hi"))
    s, fx = _steered(s)
    assert s.iterations == 1
    s, fx = step(s, _REFUSED)
    assert s.phase is Phase.STEERING and s.trigger == "overflow"
    assert fx[0] == Emit(
        {
            "type": "context_overflow",
            "turn_id": "t",
            "size": 210_000,
            "limit": 200_000,
            "recovery": "compact_and_retry",
        }
    )
    assert fx[1] == MaybeCompact(mid_round=False, trigger="overflow", target=170_000)
    s, fx = _steered(s, compacted=True)
    assert fx[0].event["trigger"] == "overflow"  # type: ignore[union-attr]
    assert fx[1] == CallModel(final=False)
    assert s.iterations == 1  # the same call: no iteration counted
    s, fx = step(s, _REFUSED)
    assert s.phase is Phase.DONE and isinstance(fx[-1], Fail)


def test_an_overflow_boundary_that_compacted_nothing_fails():
    s, _ = step(start("t"), UserInput("hi"))
    s, _ = _steered(s)
    s, _ = step(s, _REFUSED)
    s, fx = _steered(s, compacted=False)
    assert s.phase is Phase.DONE
    assert fx[-1] == Fail("the compactor compacted nothing at the overflow boundary (skipped)")


_USE = ToolUseBlock(id="u1", name="t", input={})


@settings(max_examples=200)
@given(
    replies=st.lists(st.sampled_from(["tools", "answer", "refused"]), max_size=30),
    compacts=st.lists(st.booleans(), max_size=30),
)
def test_no_sequence_of_refusals_calls_a_model_more_than_twice(replies, compacts):
    """Fed any sequence of replies and refusals (each overflow boundary compacting or
    not), the core asks for each call at most twice, and ends on the second refusal."""
    s, fx = step(start("t", max_iterations=50), UserInput("hi"))
    compacts = list(compacts)
    pending = list(replies)
    sent_for_call = 0
    while s.phase is not Phase.DONE:
        if s.phase is Phase.STEERING:
            done = compacts.pop(0) if compacts else True
            s, fx = _steered(s, compacted=done and s.trigger == "overflow")
        elif s.phase is Phase.AWAITING_TOOLS:
            s, fx = step(s, ToolResults((ToolResultBlock(tool_use_id="u1", content="ok"),)))
        else:
            assert any(isinstance(f, CallModel) for f in fx)
            sent_for_call += 1
            assert sent_for_call <= 2
            kind = pending.pop(0) if pending else "answer"
            if kind == "refused":
                s, fx = step(s, _REFUSED)
                if sent_for_call == 2:
                    assert s.phase is Phase.DONE and isinstance(fx[-1], Fail)
                continue
            sent_for_call = 0
            content = (_USE,) if kind == "tools" else (TextBlock(text="done"),)
            s, fx = step(s, ModelReplied(content))
    assert isinstance(fx[-1], (Fail, Finish))
