"""clear_tool_results selected by name through the core, on realistic and hand-built sessions."""

from __future__ import annotations

import pytest

from normandy_core import (
    AgentConfig,
    AgentMemory,
    OptionsError,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    get_counter,
    pairing_problems,
    resolve_compactor,
    run_compaction,
)
from normandy_core.app.workload import SYSTEM_PROMPT, TOOLS, generate_session

NAME = "clear_tool_results"
PLACEHOLDER = "[cleared]"


def make_acc(memory: AgentMemory, **opts) -> AgentConfig:
    acc = AgentConfig(
        model="claude-sonnet-4-5",
        system_prompt=SYSTEM_PROMPT,
        tools=TOOLS,
        compactor=NAME,
        compactor_opts={"counter": "cl100k_base", "placeholder": PLACEHOLDER, **opts},
    )
    return acc.with_memory(memory)


def tool_uses(memory):
    return [(u.id, u.name) for e in memory for u in e.tool_uses]


def results(memory):
    return {r.tool_use_id: r for e in memory for r in e.tool_results}


def small_session() -> AgentMemory:
    """Six rounds of one tool each, with thinking, the last one open."""
    mem = AgentMemory()
    mem.add_message("system", "be careful", turn_id="t0")
    mem.add_message("user", "go", turn_id="t1")
    for i in range(6):
        name = "search" if i == 1 else "read_file"
        use = ToolUseBlock(id=f"u{i}", name=name, input={"path": f"src/m{i}.py" * 20})
        mem.add_message(
            "assistant",
            (ThinkingBlock(thinking=f"think {i}", signature=f"s{i}"), use),
            turn_id="t1",
        )
        body = f"def f{i}(x):\n    return x\n" * 200
        mem.add_message("user", (ToolResultBlock(tool_use_id=use.id, content=body),), turn_id="t1")
    return mem


def test_resolved_from_the_installed_distribution():
    comp = resolve_compactor(NAME)
    assert comp.distribution == "normandy-clear-tool-results"
    assert comp.module == "normandy_clear_tool_results.compactor"
    # sized to the window by default; by its own triggers alone it needs none
    assert comp.needs_window({}) is True
    assert comp.needs_window({"trigger_tokens": 20_000}) is False
    assert comp.needs_window({"trigger_tool_uses": 8, "trigger": 0.5}) is True


def test_clears_old_results_in_place_and_reports_the_originals():
    mem = generate_session(5, 200, end_mid_round=True)
    acc = make_acc(mem, trigger_tokens=20_000, keep=4)
    dump = mem.dump()
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert mem.dump() == dump
    assert meta["compacted"] is True
    assert meta["strategy"] == NAME
    kept = list(new_acc.memory)
    # same ids, same order, same roles: only contents changed
    assert [(e.id, e.role) for e in kept] == [(e.id, e.role) for e in mem]
    assert pairing_problems(kept) == []
    assert not any(e.has_thinking for e in kept)
    uses = tool_uses(mem)
    cleared = set(meta["cleared"])
    assert meta["cleared"] == [u for u, _ in uses if u in cleared]
    newest = {u for u, _ in uses[-4:]}
    assert not cleared & newest
    assert cleared == {u for u, _ in uses} - newest
    after = results(new_acc.memory)
    before = results(mem)
    for uid, _ in uses:
        if uid in cleared:
            assert after[uid].content == PLACEHOLDER
            assert after[uid].is_error == before[uid].is_error
        else:
            assert after[uid] == before[uid]
    # dropped: the original entries, oldest first, each under its id
    ids = [e.id for e in mem]
    assert [e.id for e in meta["dropped"]] == sorted((e.id for e in meta["dropped"]), key=ids.index)
    for e in meta["dropped"]:
        assert mem[e.id] == e
        assert any(r.tool_use_id in cleared for r in e.tool_results)
    counter = get_counter("cl100k_base")
    assert meta["tokens_before"] == mem.tokens(counter)
    assert meta["tokens_after"] == new_acc.memory.tokens(counter)
    assert meta["tokens_after"] < 20_000 < meta["tokens_before"]
    assert 0 < meta["tokens_cleared"] <= meta["tokens_before"] - meta["tokens_after"]
    # clearing again right away finds nothing new: the same acc
    again_acc, again = run_compaction(new_acc, mid_round=True)
    assert again == {"compacted": False}
    assert again_acc is new_acc


def test_under_the_trigger_mid_round_returns_the_same_memory():
    mem = small_session()
    acc = make_acc(mem, trigger_tokens=1_000_000)
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert meta == {"compacted": False}
    assert new_acc is acc and new_acc.memory is mem


def test_exclude_tools_and_pinned_entries_are_never_touched():
    mem = small_session()
    acc = make_acc(mem, trigger_tokens=100, keep=1, exclude_tools=["search"])
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert meta["compacted"] is True
    assert "u1" not in meta["cleared"]
    assert results(new_acc.memory)["u1"] == results(mem)["u1"]
    assert meta["cleared"] == ["u0", "u2", "u3", "u4"]


def test_the_unanswered_round_is_kept_even_with_keep_zero():
    mem = small_session()
    new_acc, meta = run_compaction(make_acc(mem, trigger_tokens=100, keep=0), mid_round=True)
    assert meta["cleared"] == ["u0", "u1", "u2", "u3", "u4"]
    assert results(new_acc.memory)["u5"] == results(mem)["u5"]


def test_clear_tool_inputs_clears_inputs_and_reports_the_assistant_entries():
    mem = small_session()
    acc = make_acc(mem, trigger_tokens=100, keep=2, clear_tool_inputs=True)
    new_acc, meta = run_compaction(acc, mid_round=False)
    assert meta["cleared"] == ["u0", "u1", "u2", "u3"]
    by_use = {u.id: u for e in new_acc.memory for u in e.tool_uses}
    assert [by_use[f"u{i}"].input for i in range(4)] == [{}] * 4
    assert by_use["u4"].input == {"path": "src/m4.py" * 20}
    roles = [e.role for e in meta["dropped"]]
    assert roles == ["assistant", "user"] * 4
    for e in meta["dropped"]:
        assert mem[e.id] == e  # thinking and inputs included


def test_clear_at_least_clears_that_much_or_nothing():
    mem = small_session()
    acc = make_acc(mem, trigger_tokens=100, keep=4, clear_at_least=100_000)
    new_acc, meta = run_compaction(acc, mid_round=False)
    assert meta == {"compacted": False}
    assert new_acc is acc
    acc = make_acc(mem, trigger_tokens=100, keep=4, clear_at_least=500)
    _, meta = run_compaction(acc, mid_round=False)
    assert meta["compacted"] is True and meta["tokens_cleared"] >= 500


def test_tool_use_trigger_counts_intact_tool_uses():
    mem = small_session()
    acc = make_acc(mem, trigger_tool_uses=5, keep=2)
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert meta["trigger"] == "tool_uses"
    assert meta["cleared"] == ["u0", "u1", "u2", "u3"]
    # two intact tool uses are left: under the trigger until three more arrive
    _, again = run_compaction(new_acc, mid_round=True)
    assert again == {"compacted": False}
    # below the tool-use trigger nothing happens even though results are large
    acc = make_acc(mem, trigger_tool_uses=6, keep=2)
    same, meta = run_compaction(acc, mid_round=True)
    assert meta == {"compacted": False} and same is acc


def test_tiny_results_are_not_replaced_by_a_longer_placeholder():
    mem = AgentMemory()
    mem.add_message("user", "go " * 400, turn_id="t1")
    for i in range(4):
        use = ToolUseBlock(id=f"u{i}", name="shell", input={})
        mem.add_message("assistant", (TextBlock(text="run"), use), turn_id="t1")
        mem.add_message("user", (ToolResultBlock(tool_use_id=use.id, content="ok"),), turn_id="t1")
    acc = make_acc(mem, trigger_tokens=100, keep=1, placeholder="a much longer placeholder " * 5)
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert meta == {"compacted": False} and new_acc is acc


@pytest.mark.parametrize(
    ("opts", "fragment"),
    [
        ({"keep": -1}, "option 'keep'"),
        ({"trigger_tokens": 0}, "option 'trigger_tokens'"),
        ({"trigger_tool_uses": 3, "keep": 3}, "keep (3) must be below trigger_tool_uses (3)"),
        ({"clear_at_least": -5}, "option 'clear_at_least'"),
        ({"exclude_tools": "search"}, "option 'exclude_tools'"),
        ({"placeholder": ""}, "option 'placeholder'"),
        ({"counter": "no-such-encoding"}, "option 'counter'"),
        ({"clear_inputs": True}, "did you mean 'clear_tool_inputs'? allowed options:"),
    ],
)
def test_bad_options_are_refused_at_config_time(opts, fragment):
    with pytest.raises(OptionsError) as err:
        AgentConfig(model="claude-sonnet-4-5", compactor=NAME, compactor_opts=opts)
    message = str(err.value)
    assert message.startswith("normandy_core.AgentConfig(): compactor 'clear_tool_results'")
    assert fragment in message


def test_a_tool_use_whose_input_is_already_empty_is_not_reported_as_dropped():
    """Found by the fuzz campaign: with clear_tool_inputs, a call whose arguments were
    already ``{}`` was rewritten to itself and reported as dropped, so the boundary
    refused the whole compaction (an unchanged entry listed in ``dropped``)."""
    from normandy_core import compact

    messages = [
        {"role": "user", "content": "look"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "x" * 4000},
        {"role": "assistant", "content": "done"},
    ]
    result = compact(
        messages,
        compactor="clear_tool_results",
        opts={"keep": 0, "trigger_tokens": 10, "clear_tool_inputs": True},
        model="gpt-4o",
    )
    assert result.error is None and result.compacted
    assert [e.role for e in result.dropped] == ["user"]  # only the result's entry changed
    assert result.messages[1] == messages[1]


@pytest.mark.parametrize("keep", [2, 3, 4, 10])
def test_keep_above_the_number_of_tool_uses_keeps_them_all(keep):
    """Issue 12: two tool uses with keep=3 cleared the first one (a negative slice start)."""
    mem = AgentMemory()
    mem.add_message("user", "go", turn_id="t1")
    for i in range(2):
        use = ToolUseBlock(id=f"u{i}", name="read_file", input={"path": f"m{i}.py"})
        mem.add_message("assistant", (use,), turn_id="t1")
        body = f"def f{i}(x):\n    return x\n" * 200
        mem.add_message("user", (ToolResultBlock(tool_use_id=use.id, content=body),), turn_id="t1")
    mem.add_message("assistant", "done", turn_id="t1")
    acc = make_acc(mem, trigger_tokens=100, keep=keep)
    new_acc, meta = run_compaction(acc, mid_round=False)
    assert meta == {"compacted": False}
    assert new_acc is acc


@pytest.mark.parametrize("tool_name", ["recall", "look_back"])
def test_with_recall_on_the_default_placeholder_names_the_tool(tool_name):
    from normandy_clear_tool_results import DEFAULT_PLACEHOLDER, RECALL_PLACEHOLDER
    from normandy_core import RecallSettings

    def run(**kw):
        acc = AgentConfig(
            model="claude-sonnet-4-5",
            compactor=NAME,
            compactor_opts={"counter": "cl100k_base", "trigger_tokens": 100, "keep": 1, **kw},
            recall=RecallSettings(tool_name=tool_name),
        ).with_memory(small_session())
        new_acc, meta = run_compaction(acc, mid_round=False)
        assert meta["compacted"] is True and meta["cleared"]
        got = results(new_acc.memory)
        return {got[u].content for u in meta["cleared"]}

    named = RECALL_PLACEHOLDER.format(tool=tool_name)
    assert run() == {named} and f"`{tool_name}` tool" in named
    assert named != DEFAULT_PLACEHOLDER
    # a placeholder the user chose is theirs, recall or not
    assert run(placeholder=PLACEHOLDER) == {PLACEHOLDER}
    # with recall off the default is the plain one
    acc = make_acc(small_session(), trigger_tokens=100, keep=1)
    acc = acc.replace(compactor_opts={"counter": "cl100k_base", "trigger_tokens": 100, "keep": 1})
    new_acc, meta = run_compaction(acc, mid_round=False)
    got = results(new_acc.memory)
    assert {got[u].content for u in meta["cleared"]} == {DEFAULT_PLACEHOLDER}
