"""clear_tool_results and the survival rules: a kept entry is never rewritten, so its tool
uses are never cleared; keep_tools calls do not count toward trigger_tool_uses."""

from __future__ import annotations

from normandy_core import (
    AgentConfig,
    AgentMemory,
    Entry,
    ToolResultBlock,
    ToolUseBlock,
    run_compaction,
)

PLACEHOLDER = "[cleared]"


def _session(rounds: int) -> AgentMemory:
    """The task, then rounds alternating read_file and search; the last round is parallel,
    its two results in one entry."""
    mem = AgentMemory()
    mem.add_message("user", "Fix the parser.", id="task", turn_id="t1")
    for r in range(rounds):
        name = "read_file" if r % 2 == 0 else "search"
        use = ToolUseBlock(id=f"u{r}", name=name, input={"path": f"src/m{r}.py"})
        mem.add_message("assistant", (use,), id=f"a{r}", turn_id="t1")
        body = f"def f{r}(x):\n    return x\n" * 100
        mem.add_message("user", (ToolResultBlock(tool_use_id=use.id, content=body),), id=f"r{r}")
    mem.add_message(
        "assistant",
        (
            ToolUseBlock(id="p1", name="read_file", input={"path": "a.py"}),
            ToolUseBlock(id="p2", name="search", input={"q": "b"}),
        ),
        id="ap",
    )
    mem.add_message(
        "user",
        (
            ToolResultBlock(tool_use_id="p1", content="a " * 400),
            ToolResultBlock(tool_use_id="p2", content="b " * 400),
        ),
        id="rp",
    )
    mem.add_message("assistant", "Read them.", id="done")
    return mem


def _acc(**kw: object) -> AgentConfig:
    opts = {"counter": "cl100k_base", "placeholder": PLACEHOLDER, "keep": 0}
    opts.update(kw.pop("opts", {}))  # type: ignore[arg-type]
    return AgentConfig(compactor="clear_tool_results", compactor_opts=opts, **kw)  # type: ignore[arg-type]


def _cleared(before: AgentMemory, after: AgentMemory) -> set[str]:
    old = {r.tool_use_id: r for e in before for r in e.tool_results}
    return {
        r.tool_use_id
        for e in after
        for r in e.tool_results
        if r.content != old[r.tool_use_id].content
    }


def test_keep_tools_calls_and_their_batch_mates_are_never_cleared() -> None:
    mem = _session(8)
    acc = _acc(opts={"trigger_tokens": 500}, survival={"keep_tools": ["read_file"]})
    new_acc, meta = run_compaction(acc.with_memory(mem), mid_round=False)
    assert meta.compacted
    cleared = _cleared(mem, new_acc.memory)
    # every search round is cleared; no read_file round; the search of the parallel round
    # shares its entry with a kept read_file result, so that entry is not rewritten either
    assert cleared == {"u1", "u3", "u5", "u7"}
    assert {e.id for e in meta.dropped} == {"r1", "r3", "r5", "r7"}
    assert new_acc.memory.get("rp") == mem.get("rp")
    # without the rule, every round is cleared
    plain_acc = _acc(opts={"trigger_tokens": 500}).with_memory(mem)
    plain, _ = run_compaction(plain_acc, mid_round=False)
    assert _cleared(mem, plain.memory) == {f"u{r}" for r in range(8)} | {"p1", "p2"}


def test_entries_kept_by_keep_if_are_never_rewritten() -> None:
    mem = _session(6)

    def first_two_results(e: Entry) -> bool:
        return e.id in ("r0", "r1")

    acc = _acc(opts={"trigger_tokens": 500}, survival={"keep_if": first_two_results})
    new_acc, meta = run_compaction(acc.with_memory(mem), mid_round=False)
    assert meta.compacted
    assert {"u0", "u1"}.isdisjoint(_cleared(mem, new_acc.memory))
    assert {"u2", "u3"} <= _cleared(mem, new_acc.memory)
    assert new_acc.memory.get("task") == mem.get("task")


def test_keep_tools_calls_do_not_count_toward_the_tool_use_trigger() -> None:
    mem = _session(5)  # read_file: u0, u2, u4, p1; search: u1, u3, p2
    opts = {"trigger_tool_uses": 3, "keep": 0}
    _, counted = run_compaction(_acc(opts=opts).with_memory(mem), mid_round=False)
    assert counted.compacted  # seven intact uses, over three
    rules = {"keep_tools": ["read_file"]}
    _, meta = run_compaction(_acc(opts=opts, survival=rules).with_memory(mem), mid_round=False)
    assert meta == {"compacted": False}  # three search uses are not over three
