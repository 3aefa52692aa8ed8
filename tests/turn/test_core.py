"""The pure turn core: exact effects in order, the iteration cap, the task budget, bad events."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from normandy_core import TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from normandy_core.turn import (
    AppendMessage,
    CallModel,
    CompactionDone,
    DispatchTools,
    Emit,
    Finish,
    InvalidTransition,
    MaybeCompact,
    ModelReplied,
    Phase,
    ToolResults,
    UserInput,
    start,
    step,
)


def use(i: str, name: str = "read") -> ToolUseBlock:
    return ToolUseBlock(id=i, name=name, input={"path": f"{i}.py"})


def result(i: str, text: str = "ok") -> ToolResultBlock:
    return ToolResultBlock(tool_use_id=i, content=text)


def kinds(effects):
    out = []
    for e in effects:
        if isinstance(e, Emit):
            out.append(("emit", e.event["type"]))
        else:
            out.append(type(e).__name__)
    return out


def test_multi_batch_turn_exact_effects():
    s = start("t1", max_iterations=5)
    s, fx = step(s, UserInput("fix the bug"))
    assert fx == (
        Emit({"type": "turn_started", "turn_id": "t1"}),
        AppendMessage("user", "fix the bug"),
        MaybeCompact(mid_round=False),
    )
    assert s.phase is Phase.STEERING
    assert not s.mid_round

    s, fx = step(s, CompactionDone({"compacted": False}))
    assert fx == (
        Emit(
            {
                "type": "boundary",
                "turn_id": "t1",
                "mid_round": False,
                "trigger": "scheduled",
                "batch": 0,
                "meta": {"compacted": False, "dropped_ids": [], "dropped_count": 0},
            }
        ),
        CallModel(final=False),
    )
    assert s.phase is Phase.AWAITING_MODEL
    assert s.iterations == 1

    reply1 = (ThinkingBlock(thinking="hm", signature="s"), use("a"), use("b"))
    s, fx = step(s, ModelReplied(reply1))
    assert fx == (
        AppendMessage("assistant", reply1),
        Emit(
            {
                "type": "tool_batch",
                "turn_id": "t1",
                "batch": 1,
                "calls": [{"id": "a", "name": "read"}, {"id": "b", "name": "read"}],
            }
        ),
        DispatchTools((use("a"), use("b"))),
    )
    assert s.phase is Phase.AWAITING_TOOLS
    assert s.pending == ("a", "b")

    # results arrive in any order; appended together in tool-use order
    s, fx = step(s, ToolResults((result("b"), result("a"))))
    assert fx == (AppendMessage("user", (result("a"), result("b"))), MaybeCompact(mid_round=True))
    assert s.phase is Phase.STEERING
    assert s.mid_round
    assert s.batches == 1

    dropped = [type("E", (), {"id": "old1"})(), type("E", (), {"id": "old2"})()]
    s, fx = step(s, CompactionDone({"compacted": True, "tokens_removed": 0, "dropped": dropped}))
    assert fx[0].event["meta"] == {
        "compacted": True,
        "tokens_removed": 0,
        "dropped_ids": ["old1", "old2"],
        "dropped_count": 2,
    }
    assert fx[0].event["mid_round"] is True
    assert fx[0].event["batch"] == 1
    assert fx[1] == CallModel(final=False)

    s, fx = step(s, ModelReplied((use("c", "write"),)))
    assert kinds(fx) == ["AppendMessage", ("emit", "tool_batch"), "DispatchTools"]
    s, fx = step(s, ToolResults((result("c"),)))
    assert kinds(fx) == ["AppendMessage", "MaybeCompact"]
    s, fx = step(s, CompactionDone({"compacted": False}))
    assert kinds(fx) == [("emit", "boundary"), "CallModel"]

    s, fx = step(s, ModelReplied((TextBlock(text="Fixed."),)))
    assert fx == (
        AppendMessage("assistant", (TextBlock(text="Fixed."),)),
        Emit(
            {
                "type": "turn_finished",
                "turn_id": "t1",
                "reason": "answer",
                "iterations": 3,
                "batches": 2,
            }
        ),
        Finish("Fixed.", "answer"),
    )
    assert s.phase is Phase.DONE
    assert s.text == "Fixed."
    assert s.finish_reason == "answer"


def test_iteration_cap_forces_a_final_call():
    s = start("t", max_iterations=2)
    s, _ = step(s, UserInput("go"))
    calls = []
    for i in range(2):
        s, fx = step(s, CompactionDone({"compacted": False}))
        calls.append(fx[-1])
        s, _ = step(s, ModelReplied((use(f"u{i}"),)))
        s, _ = step(s, ToolResults((result(f"u{i}"),)))
    s, fx = step(s, CompactionDone({"compacted": False}))
    assert kinds(fx) == [("emit", "boundary"), ("emit", "iteration_cap"), "CallModel"]
    assert fx[-1] == CallModel(final=True, reason="iteration_cap")
    assert calls == [CallModel(final=False)] * 2
    assert s.iterations == 2
    # the model calls a tool anyway: the tool use is dropped, the turn ends, nothing dangles
    s, fx = step(s, ModelReplied((TextBlock(text="Done so far."), use("late"))))
    assert fx == (
        AppendMessage("assistant", (TextBlock(text="Done so far."),)),
        Emit({"type": "tool_calls_ignored", "turn_id": "t", "ids": ["late"]}),
        Emit(
            {
                "type": "turn_finished",
                "turn_id": "t",
                "reason": "iteration_cap",
                "iterations": 2,
                "batches": 2,
            }
        ),
        Finish("Done so far.", "iteration_cap"),
    )


def test_budget_is_never_refunded_by_compaction():
    s = start("t", budget=100)
    s, _ = step(s, UserInput("go", tokens=10))
    s, fx = step(s, CompactionDone({"compacted": False}))
    assert fx[-1] == CallModel(final=False)
    s, _ = step(s, ModelReplied((use("a"),), tokens=20))
    s, _ = step(s, ToolResults((result("a"),), tokens=50))
    assert s.budget.spent == 80
    assert s.budget.remaining == 20
    # a compaction removes 60 of this turn's tokens: still spent
    s, fx = step(s, CompactionDone({"compacted": True, "tokens_removed": 60, "dropped": []}))
    assert s.budget.in_context == 20
    assert s.budget.removed == 60
    assert s.budget.remaining == 20
    assert fx[0].event["budget"] == {"total": 100, "spent": 80, "removed": 60, "remaining": 20}
    assert fx[-1] == CallModel(final=False)
    s, _ = step(s, ModelReplied((use("b"),), tokens=5))
    s, _ = step(s, ToolResults((result("b"),), tokens=30))
    assert s.budget.remaining == -15
    s, fx = step(s, CompactionDone({"compacted": False}))
    assert kinds(fx) == [("emit", "boundary"), ("emit", "budget"), "CallModel"]
    assert fx[-1] == CallModel(final=True, reason="budget")
    s, fx = step(s, ModelReplied((TextBlock(text="Out of budget: partial answer."),), tokens=8))
    assert fx[-1] == Finish("Out of budget: partial answer.", "budget")
    assert s.budget.spent == 123


@pytest.mark.parametrize(
    ("events", "message"),
    [
        (
            [CompactionDone({"compacted": False})],
            "event CompactionDone is not valid in state 'idle'",
        ),
        ([UserInput("x"), UserInput("y")], "event UserInput is not valid in state 'steering'"),
        (
            [UserInput("x"), CompactionDone({"compacted": False}), ToolResults(())],
            "event ToolResults is not valid in state 'awaiting_model'",
        ),
        (
            [
                UserInput("x"),
                CompactionDone({"compacted": False}),
                ModelReplied((use("a"),)),
                ToolResults((result("zz"),)),
            ],
            "missing ['a'], unexpected ['zz']",
        ),
        ([UserInput("x"), CompactionDone({})], "meta has no boolean 'compacted'"),
        (
            [
                UserInput("x"),
                CompactionDone({"compacted": False}),
                ModelReplied((use("a"), use("a"))),
            ],
            "repeats a tool-use id",
        ),
        (
            [
                UserInput("x"),
                CompactionDone({"compacted": False}),
                ModelReplied((TextBlock(text="bye"),)),
                UserInput("again"),
            ],
            "event UserInput is not valid in state 'done'",
        ),
    ],
)
def test_invalid_events_name_state_and_event(events, message):
    s = start("t9")
    for ev in events[:-1]:
        s, _ = step(s, ev)
    with pytest.raises(InvalidTransition) as info:
        step(s, events[-1])
    assert message in str(info.value)
    assert "turn 't9'" in str(info.value)


def test_boundary_summary_keeps_ids_not_contents():
    from normandy_core import Entry
    from normandy_core.turn import boundary_summary

    old = Entry(id="e1", role="user", content="secret text")
    meta = {"compacted": True, "dropped": [old], "shortened": [old], "strategy": "x"}
    assert boundary_summary(meta) == {
        "compacted": True,
        "strategy": "x",
        "dropped_ids": ["e1"],
        "dropped_count": 1,
        "shortened_ids": ["e1"],
        "shortened_count": 1,
    }
    assert "secret" not in repr(boundary_summary(meta))


def test_start_refuses_bad_limits():
    with pytest.raises(ValueError, match="max_iterations"):
        start("t", max_iterations=0)
    with pytest.raises(ValueError, match="budget"):
        start("t", budget=0)


# -- random event sequences never reach an invalid state ------------------------------

IDS = ["a", "b", "c"]
user_st = st.builds(UserInput, st.sampled_from(["hi", "do it"]), st.integers(0, 50))
reply_st = st.builds(
    ModelReplied,
    st.lists(st.sampled_from(IDS), max_size=3, unique=True).map(
        lambda ids: (TextBlock(text="t"), *(use(i) for i in ids))
    ),
    st.integers(0, 50),
)
results_st = st.builds(
    ToolResults,
    st.lists(st.sampled_from(IDS), max_size=3).map(lambda ids: tuple(result(i) for i in ids)),
    st.integers(0, 50),
)
done_st = st.builds(
    CompactionDone,
    st.fixed_dictionaries({"compacted": st.booleans(), "tokens_removed": st.integers(0, 40)}),
)
events_st = st.one_of(user_st, reply_st, results_st, done_st)


def check_invariants(s, fx, prev):
    assert (s.phase is Phase.AWAITING_TOOLS) == bool(s.pending)
    assert 0 <= s.iterations <= s.max_iterations
    assert (s.phase is Phase.DONE) == (s.text is not None)
    if s.budget is not None:
        assert s.budget.spent >= prev.budget.spent  # never refunded
        assert s.budget.in_context >= 0
    driving = [e for e in fx if isinstance(e, (MaybeCompact, CallModel, DispatchTools, Finish))]
    assert len(driving) == 1
    assert fx[-1] is driving[0]
    last = fx[-1]
    expected = {
        Phase.STEERING: MaybeCompact,
        Phase.AWAITING_MODEL: CallModel,
        Phase.AWAITING_TOOLS: DispatchTools,
        Phase.DONE: Finish,
    }[s.phase]
    assert isinstance(last, expected)
    if isinstance(last, MaybeCompact):
        assert last.mid_round == s.mid_round == (s.batches > 0)
    if isinstance(last, DispatchTools):
        assert tuple(c.id for c in last.calls) == s.pending
        assert s.final_reason is None
    if isinstance(last, CallModel):
        assert last.final == (s.final_reason is not None)


def valid_event(data, s):
    """A plausible event for ``s``'s phase (the pending ids sometimes answered wrongly)."""
    if s.phase is Phase.IDLE:
        return UserInput("go", data.draw(st.integers(0, 50)))
    if s.phase is Phase.STEERING:
        return data.draw(done_st)
    if s.phase is Phase.AWAITING_MODEL:
        return data.draw(reply_st)
    ids = list(s.pending)
    if data.draw(st.booleans()):
        ids = data.draw(st.permutations(ids))
    else:
        ids = data.draw(st.lists(st.sampled_from(IDS), max_size=3))
    return ToolResults(tuple(result(i) for i in ids), data.draw(st.integers(0, 50)))


@settings(max_examples=60)
@given(st.data(), st.integers(1, 4), st.one_of(st.none(), st.integers(1, 300)))
def test_random_event_sequences_never_reach_an_invalid_state(data, cap, budget):
    s = start("t", max_iterations=cap, budget=budget)
    for _ in range(data.draw(st.integers(1, 40))):
        anything = data.draw(st.integers(0, 4)) == 0  # mostly invalid here
        ev = data.draw(events_st) if anything else valid_event(data, s)
        try:
            new, fx = step(s, ev)
        except InvalidTransition as err:
            error = str(err)
        else:
            check_invariants(new, fx, s)
            s = new
            continue
        assert type(ev).__name__ in error
        assert s.phase.value in error
