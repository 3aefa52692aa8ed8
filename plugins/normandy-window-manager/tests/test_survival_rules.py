"""window_manager and the survival rules: kept units, the irreducible error naming each
rule's tokens, the marker after the task, and summary instructions in the model request."""

from __future__ import annotations

import re
from typing import Any

import pytest

from normandy_core import (
    AgentConfig,
    AgentMemory,
    Entry,
    OptionsError,
    SurvivalRules,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    get_counter,
    run_compaction,
)
from normandy_core.clients.base import ModelReply
from normandy_core.clients.scripted import ScriptedClient, ScriptedRequest
from normandy_core.turn import run_turn
from normandy_window_manager.compactor import MARKER_KEY
from normandy_window_manager.summarize import (
    INSTRUCTIONS_LEAD,
    SUMMARY_KEY,
    SUMMARY_SYSTEM_PROMPT,
)

COUNTER = "cl100k_base"


def _session(rounds: int, *, result_chars: int = 2_000, task: str = "Fix the parser.") -> Any:
    """A system prompt, the task, then ``rounds`` rounds alternating read_file and search."""
    mem = AgentMemory()
    mem.add_message("system", "You are a coding agent.", id="sys", turn_id="t0")
    mem.add_message("user", task, id="task", turn_id="t1")
    for r in range(rounds):
        name = "read_file" if r % 2 == 0 else "search"
        mem.add_message(
            "assistant",
            (ToolUseBlock(id=f"call_{r}", name=name, input={"n": r}),),
            id=f"a{r}",
            turn_id="t1",
        )
        mem.add_message(
            "user",
            (
                ToolResultBlock(
                    tool_use_id=f"call_{r}", content=f"{name} {r} " * (result_chars // 8)
                ),
            ),
            id=f"r{r}",
            turn_id="t1",
        )
    return mem


def _acc(window: int, strategy: str = "oldest_first", **kw: Any) -> AgentConfig:
    opts: dict[str, Any] = {
        "strategy": strategy,
        "context_window": window,
        "reserved_tokens": 0,
        "counter": COUNTER,
        **kw.pop("opts", {}),
    }
    return AgentConfig(model="gpt-4o", compactor="window_manager", compactor_opts=opts, **kw)


@pytest.mark.parametrize("strategy", ["oldest_first", "sliding_window", "summarize"])
def test_every_strategy_keeps_the_rules_units_whole_and_unshortened(strategy: str) -> None:
    mem = _session(12)
    opts = {"keep_last_turns": 1} if strategy == "sliding_window" else {}
    acc = _acc(10_000, strategy, opts=opts, survival={"keep_tools": ["read_file"]})
    new_acc, meta = run_compaction(acc.with_memory(mem), mid_round=False)
    assert meta.compacted, meta
    kept = {e.id: e for e in new_acc.memory.entries()}
    dropped = {e.id for e in meta.dropped}
    reads = [f"a{r}" for r in range(0, 12, 2)] + [f"r{r}" for r in range(0, 12, 2)]
    for eid in ["sys", "task", *reads]:
        assert eid in kept and eid not in dropped, eid
        assert kept[eid].content == mem.get(eid).content  # never shortened
    # only search rounds went (the newest unit aside), whole
    assert dropped and dropped <= {f"a{r}" for r in range(1, 11, 2)} | {
        f"r{r}" for r in range(1, 11, 2)
    }
    assert all((f"a{r}" in dropped) == (f"r{r}" in dropped) for r in range(12))
    if strategy == "summarize":
        summary = kept[meta["summary_id"]]
        assert set(summary.metadata["summarized_ids"]) == dropped
        order = [e.id for e in new_acc.memory.entries()]
        # where the first dropped entry was: after the kept read of round 0
        assert order[:5] == ["sys", "task", "a0", "r0", summary.id]


def _numbers(error: str) -> dict[str, int]:
    """The breakdown of an irreducible error: label -> tokens, and the total."""
    total = re.search(r"([\d,]+) tokens are irreducible", error)
    assert total, error
    inner = error[error.index("(") + 1 : error.index(") against")]
    parts: dict[str, int] = {"total": int(total.group(1).replace(",", ""))}
    for part in inner.split("; "):
        part = part.replace(", after shortening tool results", "")
        label, _, number = part.rpartition(" ")
        parts[label] = int(number.replace(",", ""))
    return parts


def test_the_irreducible_error_says_which_rule_holds_how_many_tokens() -> None:
    counter = get_counter(COUNTER)
    mem = _session(6, task="Fix the parser. " + "Context: " * 900)
    rules = SurvivalRules(keep_tools=("read_file",), keep_if=lambda e: e.id in ("a1", "r1"))
    acc = _acc(3_000, survival=rules).with_memory(mem)
    new_acc, meta = run_compaction(acc, mid_round=False)
    assert new_acc is acc and not meta.compacted
    error = meta.error or ""
    parts = _numbers(error)

    def tokens(*ids: str) -> int:
        return sum(counter.count_entry(mem.get(i)) for i in ids)

    assert parts["keep_first_user (the first user message)"] == tokens("task")
    assert parts["keep_tools ['read_file']"] == tokens("a0", "r0", "a2", "r2", "a4", "r4")
    # keep_if keeps the call and its result it accepts
    name = next(label for label in parts if label.startswith("keep_if ("))
    assert "<lambda>" in name and parts[name] == tokens("a1", "r1")
    assert parts["pinned entries"] == 0 and parts["system entries"] == tokens("sys")
    # the newest unit is kept by no rule: its result was shortened, what is left counts
    assert 0 < parts["newest unit and other kept entries"] < tokens("a5", "r5")
    labels = [k for k in parts if k != "total"]
    assert sum(parts[k] for k in labels) == parts["total"] == meta["irreducible_tokens"]
    assert parts["total"] > 3_000


def test_the_marker_goes_after_the_task_where_the_history_was_cut() -> None:
    mem = _session(10)
    acc = _acc(5_000).with_memory(mem)
    new_acc, meta = run_compaction(acc, mid_round=False)
    assert meta.compacted
    entries = new_acc.memory.entries()
    assert [e.id for e in entries[:2]] == ["sys", "task"]
    assert entries[2].metadata.get(MARKER_KEY) and entries[2].id == meta["marker_id"]
    assert entries[3].role == "assistant"
    # with the rules off (the task is also the current request), the history opens with
    # the marker, as before
    let_go = {"keep_first_user": False, "keep_current_request": False}
    off = _acc(5_000, survival=let_go).with_memory(mem)
    new_off, meta_off = run_compaction(off, mid_round=False)
    assert [e.metadata.get(MARKER_KEY) for e in new_off.memory.entries()[1:2]] == [True]
    assert "task" in {e.id for e in meta_off.dropped}


def test_a_cut_before_a_user_message_needs_no_marker() -> None:
    mem = _session(8)
    mem.add_message("assistant", "Read them all.", id="done", turn_id="t1")
    mem.add_message("user", "Now fix it.", id="next", turn_id="t2")
    mem.add_message("assistant", "Fixed.", id="fixed", turn_id="t2")
    acc = _acc(1_200, "sliding_window", opts={"keep_last_turns": 1}).with_memory(mem)
    new_acc, meta = run_compaction(acc, mid_round=False)
    assert meta.compacted and "marker_id" not in meta
    assert [e.id for e in new_acc.memory.entries()] == ["sys", "task", "next", "fixed"]


# -- summary instructions ---------------------------------------------------------------


def _summary_client(reply: str = "The agent read the parser.") -> ScriptedClient:
    return ScriptedClient([ModelReply(content=(TextBlock(text=reply),))] * 5)


def test_the_instructions_are_in_the_model_summarizers_request() -> None:
    instructions = "Keep every file path verbatim and list open questions last."
    client = _summary_client()
    acc = _acc(
        4_000,
        "summarize",
        opts={"summarizer": "model", "summary_max_tokens": 300},
        client=client,
        survival={"summary_instructions": instructions},
    ).with_memory(_session(10))
    new_acc, meta = run_compaction(acc, mid_round=False)
    assert meta.compacted and "summary_id" in meta, meta
    (request,) = client.requests
    assert request.system.startswith(SUMMARY_SYSTEM_PROMPT)
    assert request.system.endswith(f"{INSTRUCTIONS_LEAD}\n{instructions}")
    # the instructions are the operator's, in the system prompt, not in the transcript
    assert instructions not in request.messages[0].text()
    assert new_acc.memory.get(meta["summary_id"]).text().endswith("The agent read the parser.")


def test_without_instructions_the_request_is_unchanged() -> None:
    client = _summary_client()
    acc = _acc(4_000, "summarize", opts={"summarizer": "model"}, client=client).with_memory(
        _session(10)
    )
    _, meta = run_compaction(acc, mid_round=False)
    assert meta.compacted
    assert [r.system for r in client.requests] == [SUMMARY_SYSTEM_PROMPT]


def test_the_instructions_reach_the_summarizer_in_a_real_turn() -> None:
    """run_turn with the scripted client as the agent's and the summarizer's model: the
    boundary after the tool batch summarizes, and that request carries the instructions."""
    instructions = "Always keep the names of failing tests."

    def answer(req: ScriptedRequest) -> ModelReply:
        if req.system.startswith(SUMMARY_SYSTEM_PROMPT):
            return ModelReply(content=(TextBlock(text="Tests test_parse failed earlier."),))
        if any(e.tool_results for e in req.messages[-1:]):
            return ModelReply(content=(TextBlock(text="Done."),))
        use = ToolUseBlock(id="toolu_x", name="read_file", input={"path": "parser.py"})
        return ModelReply(content=(use,), stop_reason="tool_use")

    client = ScriptedClient([answer] * 6)
    acc = _acc(
        5_000,
        "summarize",
        opts={"summary_max_tokens": 300},  # summarizer 'auto': the config has a client
        client=client,
        survival={"summary_instructions": instructions},
    ).with_memory(_session(10))
    result = run_turn(
        acc, "Go on.", client=client, tools={"read_file": lambda path: "def parse(): ..." * 200}
    )
    summaries = [r for r in client.requests if r.system.startswith(SUMMARY_SYSTEM_PROMPT)]
    assert summaries and all(r.system.endswith(instructions) for r in summaries)
    assert result.text == "Done."
    kept = result.acc.memory.entries()
    assert any(e.metadata.get(SUMMARY_KEY) for e in kept)
    assert kept[1].id == "task"
    others = [r for r in client.requests if r not in summaries]
    assert all(instructions not in r.system for r in others)


@pytest.mark.parametrize(
    ("strategy", "opts", "says"),
    [
        ("oldest_first", {}, "strategy 'oldest_first' writes no summary"),
        ("sliding_window", {}, "strategy 'sliding_window' writes no summary"),
        ("summarize", {"summarizer": "extractive"}, "'extractive' summarizer writes its digest"),
    ],
)
def test_instructions_it_cannot_honour_are_refused_where_the_config_is_made(
    strategy: str, opts: dict[str, Any], says: str
) -> None:
    with pytest.raises(OptionsError) as err:
        _acc(4_000, strategy, opts=opts, survival={"summary_instructions": "Keep paths."})
    text = str(err.value)
    assert text.startswith("normandy_core.AgentConfig(): compactor 'window_manager' cannot")
    assert "survival rule 'summary_instructions'" in text and says in text


@pytest.mark.parametrize("summarizer", ["auto", "model"])
def test_instructions_are_accepted_where_a_model_may_summarize(summarizer: str) -> None:
    acc = _acc(
        4_000,
        "summarize",
        opts={"summarizer": summarizer},
        survival={"summary_instructions": "Keep paths."},
        client=ScriptedClient([]),
    )
    assert acc.rules.summary_instructions == "Keep paths."


def test_a_predicate_that_raises_is_the_error_path_naming_it() -> None:
    def broken(e: Entry) -> bool:
        raise ValueError("no such field")

    acc = _acc(2_000, survival={"keep_if": broken}).with_memory(_session(8))
    new_acc, meta = run_compaction(acc, mid_round=False)
    assert new_acc is acc and not meta.compacted
    assert "keep_if raised ValueError on entry 'sys': no such field" in (meta.error or "")
