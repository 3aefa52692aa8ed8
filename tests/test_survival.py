"""Survival rules in the core: validation where a config is made, what each rule keeps,
and the contract check that refuses a result dropping or rewriting a kept entry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from normandy_core import (
    AgentConfig,
    AgentMemory,
    CompactionContext,
    ContractViolation,
    Entry,
    OptionsError,
    SurvivalError,
    SurvivalRules,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    build_context,
    check_compaction,
    compact,
    first_user_entry,
    hookimpl,
    register_compactor,
    run_compaction,
    unregister_compactor,
)
from normandy_core.conversation.survival import survival_rules
from tests.cli.conftest import run_cli, write_json

# -- validation where the config is made ---------------------------------------------


def test_the_defaults_keep_pinned_entries_and_the_first_user_message() -> None:
    rules = AgentConfig().rules
    assert rules == SurvivalRules()
    assert rules.keep_first_user is True and rules.keep_tools == () and rules.keep_if is None
    assert rules.keep_current_request is True
    assert rules.active() == ("pinned", "keep_first_user", "keep_current_request")
    assert AgentConfig(survival=None).survival is AgentConfig().survival


def test_a_mapping_is_validated_and_reads_back_as_survival_rules() -> None:
    acc = AgentConfig(survival={"keep_tools": ["read_file"], "keep_first_user": False})
    assert isinstance(acc.survival, SurvivalRules)
    assert acc.rules.keep_tools == ("read_file",) and acc.rules.keep_first_user is False
    assert acc.prepared.rules is acc.rules
    assert build_context(acc, mid_round=False).rules is acc.rules
    # a copy with a new memory keeps them; replace() prepares them again
    assert acc.with_memory(AgentMemory()).rules is acc.rules
    changed = acc.replace(survival={"keep_tools": ["search"]})
    assert changed.rules.keep_tools == ("search",) and changed.prepared.rules is changed.rules


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"keep_tools": "read_file"}, "rule 'keep_tools': keep_tools must be a list of tool names"),
        ({"keep_tools": ["read_file", ""]}, "must hold non-empty tool names"),
        ({"keep_if": "lambda e: True"}, "a predicate can be set in code only"),
        ({"summary_instructions": "   "}, "summary_instructions must not be blank"),
        ({"summary_instructions": "x" * 4001}, "rule 'summary_instructions'"),
        ({"keep_first_user": "maybe"}, "rule 'keep_first_user'"),
        ({"keep_task": True}, "rule 'keep_task': unknown rule; allowed: keep_first_user"),
    ],
)
def test_bad_rules_are_refused_where_the_config_is_made(given: dict[str, Any], says: str) -> None:
    with pytest.raises(OptionsError) as err:
        AgentConfig(survival=given)
    text = str(err.value)
    assert text.startswith("normandy_core.AgentConfig(): survival rules refused:"), text
    assert says in text


def test_survival_of_another_type_is_refused_naming_the_entry_point() -> None:
    with pytest.raises(OptionsError, match=r"^normandy_core.compact\(\): survival must be"):
        compact([{"role": "user", "content": "hi"}], survival=["read_file"])  # type: ignore[arg-type]


def test_a_callable_keep_if_is_accepted_in_code() -> None:
    def decisions(e: Entry) -> bool:
        return "DECISION" in e.text()

    assert AgentConfig(survival={"keep_if": decisions}).rules.keep_if is decisions
    assert "keep_if (test_a_callable" in SurvivalRules(keep_if=decisions).describe("keep_if")


# -- what each rule keeps -----------------------------------------------------------


def _session() -> AgentMemory:
    mem = AgentMemory()
    mem.add_message("system", "You are a coding agent.", id="sys", turn_id="t0")
    mem.add_message("user", "Fix the parser.", id="task", turn_id="t1")
    mem.add_message(
        "assistant",
        (
            ToolUseBlock(id="r1", name="read_file", input={"path": "parser.py"}),
            ToolUseBlock(id="s1", name="search", input={"q": "parse"}),
        ),
        id="a1",
        turn_id="t1",
    )
    mem.add_message("tool", (ToolResultBlock(tool_use_id="r1", content="def parse"),), id="t-r1")
    mem.add_message("tool", (ToolResultBlock(tool_use_id="s1", content="3 hits"),), id="t-s1")
    mem.add_message("assistant", "DECISION: rewrite parse()", id="a2", turn_id="t1")
    mem.add_message("user", "Go on.", id="u2", turn_id="t2", pinned=True)
    mem.add_message(
        "assistant",
        (ToolUseBlock(id="r2", name="read_file", input={"path": "lexer.py"}),),
        id="a3",
        turn_id="t2",
    )
    mem.add_message("user", (ToolResultBlock(tool_use_id="r2", content="def lex"),), id="u-r2")
    return mem


def test_each_rule_keeps_what_it_says_and_is_attributed_in_order() -> None:
    entries = _session().entries()
    assert SurvivalRules().protected(entries) == {"u2": "pinned", "task": "keep_first_user"}
    assert SurvivalRules(keep_first_user=False).protected(entries) == {"u2": "pinned"}
    tools = SurvivalRules(keep_first_user=False, keep_tools=("read_file",)).protected(entries)
    # the calling entries and every entry carrying a result of a read_file call; not the
    # entry carrying only the search result
    assert tools == {"u2": "pinned", "a1": "keep_tools", "t-r1": "keep_tools"} | {
        "a3": "keep_tools",
        "u-r2": "keep_tools",
    }
    seen: list[str] = []

    def decisions(e: Entry) -> bool:
        seen.append(e.id)
        return e.text().startswith("DECISION") or e.id == "task"

    both = SurvivalRules(keep_if=decisions).protected(entries)
    assert both == {"u2": "pinned", "task": "keep_first_user", "a2": "keep_if"}
    assert "task" not in seen and "u2" not in seen  # asked only about entries not yet kept


def test_the_first_user_message_skips_results_markers_and_summaries() -> None:
    mem = AgentMemory()
    mem.add_message("system", "sys")
    mem.add_message("user", "[normandy:marker] Earlier messages were removed here.")
    mem.add_message("user", "digest", metadata={"normandy.summary": True})
    mem.add_message(
        "user", (ToolResultBlock(tool_use_id="x", content="orphan"), TextBlock(text="and text"))
    )
    # a text that opens with a tag is an inserted summary, whatever follows
    mem.add_message("user", (TextBlock(text="[normandy:summary]"), TextBlock(text="t")))
    assert first_user_entry(mem.entries()) is None
    real = mem.add_message("user", "The real task.")
    assert first_user_entry(mem.entries()) == real
    assert first_user_entry([]) is None


def test_a_raising_predicate_is_a_survival_error_naming_the_entry() -> None:
    def broken(e: Entry) -> bool:
        raise KeyError("path")

    with pytest.raises(SurvivalError, match=r"keep_if raised KeyError on entry 'sys'"):
        SurvivalRules(keep_if=broken).protected(_session().entries())


# -- the contract check ---------------------------------------------------------------


def _ctx(**rules: Any) -> CompactionContext:
    return CompactionContext(
        model=None, window=None, prompt_tokens=0, mid_round=True, rules=SurvivalRules(**rules)
    )


def _result(acc: AgentConfig, keep: list[str], rewrite: dict[str, Entry] | None = None) -> Any:
    entries = acc.memory.entries()
    rewrite = rewrite or {}
    kept = [rewrite.get(e.id, e).without_thinking() for e in entries if e.id in keep]
    dropped = [e for e in entries if e.id not in keep or e.id in rewrite]
    return acc.with_memory(acc.memory.derive(kept)), {"compacted": True, "dropped": dropped}


def test_the_check_refuses_dropping_a_kept_entry_naming_the_rule() -> None:
    acc = AgentConfig().with_memory(_session())
    everything = [e.id for e in acc.memory.entries()]
    # the oldest turn dropped, the task with it
    newest = ["sys", "u2", "a3", "u-r2"]
    with pytest.raises(ContractViolation) as err:
        check_compaction("probe", acc, _ctx(), _result(acc, newest))
    text = str(err.value)
    assert "dropped entry 'task' (user), which survival rule keep_first_user" in text
    assert "survival={'keep_first_user': False} lets the task go" in text
    # the same result is fine once the rule is off
    checked = check_compaction("probe", acc, _ctx(keep_first_user=False), _result(acc, newest))
    assert [e.id for e in checked.dropped] == ["task", "a1", "t-r1", "t-s1", "a2"]
    # dropping a read_file call with its results is refused under keep_tools
    no_a3 = [i for i in everything if i not in ("a3", "u-r2")]
    with pytest.raises(ContractViolation, match=r"dropped entry 'a3' .*keep_tools \['read_file'\]"):
        check_compaction("probe", acc, _ctx(keep_tools=("read_file",)), _result(acc, no_a3))
    # and a pinned entry is always kept
    with pytest.raises(ContractViolation, match=r"dropped entry 'u2' .*pinned entries"):
        check_compaction("probe", acc, _ctx(), _result(acc, [i for i in everything if i != "u2"]))


def test_the_check_refuses_rewriting_a_kept_entry_but_not_losing_its_thinking() -> None:
    mem = _session()
    mem.add_message(
        "assistant",
        (ThinkingBlock(thinking="hm", signature="s"), TextBlock(text="DECISION: keep lex")),
        id="a4",
    )
    acc = AgentConfig().with_memory(mem)
    everything = [e.id for e in mem.entries()]
    ctx = _ctx(keep_if=lambda e: e.text().startswith("DECISION"))
    # stripped of its thinking only: kept
    checked = check_compaction("probe", acc, ctx, _result(acc, everything))
    kept = checked.acc.memory.get("a4")
    assert kept is not None and not kept.has_thinking and checked.dropped == ()
    original = mem.get("t-r1")
    assert original is not None
    cleared = original.model_copy(
        update={"content": (ToolResultBlock(tool_use_id="r1", content="[cleared]"),)}
    )
    with pytest.raises(ContractViolation, match=r"rewrote entry 't-r1' .*keep_tools"):
        check_compaction(
            "probe",
            acc,
            _ctx(keep_tools=("read_file",)),
            _result(acc, everything, {"t-r1": cleared}),
        )


class _DropsOldest:
    """A compactor that knows nothing of the rules: keeps the newest ``keep`` entries."""

    def __init__(self, keep: int) -> None:
        self.keep = keep

    @hookimpl
    def needs_window(self, opts: Any) -> bool:
        return False

    @hookimpl
    def maybe_compact(self, acc: AgentConfig, ctx: Any, opts: Any) -> Any:
        entries = acc.memory.entries()
        kept = [e for e in entries if e.role == "system"] + entries[-self.keep :]
        dropped = [e for e in entries[: -self.keep] if e.role != "system"]
        return acc.with_memory(acc.memory.derive(kept)), {"compacted": True, "dropped": dropped}


def test_a_compactor_that_ignores_the_rules_gets_the_error_path_not_a_lost_task() -> None:
    register_compactor("drops_oldest", _DropsOldest(keep=2), replace=True)
    try:
        messages = [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "The task."},
            {"role": "assistant", "content": "step 0"},
            {"role": "user", "content": "next"},
            {"role": "assistant", "content": "step 1"},
            {"role": "user", "content": "more"},
            {"role": "assistant", "content": "done"},
        ]
        result = compact(messages, compactor="drops_oldest")
        assert not result.compacted and result.messages == messages
        assert "survival rule keep_first_user" in (result.error or "")
        # with the rule off it compacts, and says what it dropped
        off = compact(messages, compactor="drops_oldest", survival={"keep_first_user": False})
        assert off.compacted and off.dropped[0].text() == "The task."
        assert [m["content"] for m in off.messages] == ["sys", "more", "done"]
    finally:
        unregister_compactor("drops_oldest")


def test_a_pipeline_step_that_ignores_the_rules_fails_the_pipeline_naming_the_step() -> None:
    register_compactor("drops_oldest", _DropsOldest(keep=3), replace=True)
    try:
        mem = AgentMemory()
        mem.add_message("system", "You are a coding agent.", id="sys")
        mem.add_message("user", "Fix the parser.", id="task")
        for r in range(4):
            mem.add_message("assistant", f"step {r}", id=f"a{r}")
            mem.add_message("user", f"next {r}", id=f"u{r}")
        acc = AgentConfig(
            compactor="pipeline", compactor_opts={"steps": [{"compactor": "drops_oldest"}]}
        ).with_memory(mem)
        new_acc, meta = run_compaction(acc, mid_round=False)
        assert new_acc is acc and not meta.compacted
        error = meta.error or ""
        assert error.startswith("pipeline steps[0] ('drops_oldest') broke the contract:"), error
        assert "dropped entry 'task' (user), which survival rule keep_first_user" in error
    finally:
        unregister_compactor("drops_oldest")


def test_compact_remembers_continuations_per_rules() -> None:
    """A continuation is the same config: other rules take the full path."""
    from normandy_core.transcripts import continuation

    base = continuation.config_key("noop", {}, None, None, None, "openai")
    assert base == continuation.config_key("noop", {}, None, None, None, "openai", survival=None)
    other = continuation.config_key(
        "noop", {}, None, None, None, "openai", survival=SurvivalRules(keep_tools=("read",))
    )
    assert other is not None and other != base
    as_mapping = continuation.config_key(
        "noop", {}, None, None, None, "openai", survival={"keep_tools": ["read"]}
    )
    assert as_mapping is not None and as_mapping != base


def test_survival_rules_helper_keeps_an_instance_and_defaults_none() -> None:
    rules = SurvivalRules(keep_tools=("x",))
    assert survival_rules(rules, entry="e") is rules
    assert survival_rules(None, entry="e") == SurvivalRules()


# -- the command line -----------------------------------------------------------------


def _openai_session(rounds: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Find the bug in the parser."},
    ]
    for r in range(rounds):
        name = "read_file" if r % 2 == 0 else "search"
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{r}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps({"n": r})},
                    }
                ],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"call_{r}", "content": f"{name} {r} " * 300})
    msgs.append({"role": "assistant", "content": "Found it."})
    return msgs


@pytest.mark.slow
def test_the_command_line_sets_the_rules(tmp_path: Path) -> None:
    msgs = _openai_session(12)
    src = write_json(tmp_path / "in.json", msgs)
    out = tmp_path / "out.json"
    common = ["compact", str(src), "-o", str(out), "--window", "12000", "--model", "gpt-4o"]
    r = run_cli(*common, "--opt", "reserved_tokens=1000")
    assert r.code == 0, r
    kept = json.loads(out.read_text())
    assert kept[1] == msgs[1]  # the task, by default
    r = run_cli(*common, "--opt", "reserved_tokens=1000", "--keep-tool", "read_file")
    assert r.code == 0, r
    kept = json.loads(out.read_text())
    reads = [m for m in msgs if m.get("tool_calls") and "read_file" in json.dumps(m)]
    assert all(m in kept for m in reads)  # every read_file call, with its result
    assert all(any(k.get("tool_call_id") == m["tool_calls"][0]["id"] for k in kept) for m in reads)
    r = run_cli(*common, "--opt", "reserved_tokens=1000", "--no-keep-first-user")
    assert r.code == 0, r
    assert kept[1] == msgs[1]  # the only request is also the current one, kept by default
    let_go = ("--no-keep-first-user", "--no-keep-current-request")
    r = run_cli(*common, "--opt", "reserved_tokens=1000", *let_go)
    assert r.code == 0, r
    assert msgs[1] not in json.loads(out.read_text())
    r = run_cli(*common, "--summary-instructions", "Keep paths.")
    assert r.code != 0
    assert "cannot honour survival rule 'summary_instructions'" in r.err
    assert "strategy 'oldest_first' writes no summary" in r.err


# -- configuration files: the declarative rules only ----------------------------------


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A temporary working directory, nothing else configured, settings read afresh."""
    from normandy_core.contract.settings import ENV_COMPACTOR, ENV_CONFIG, ENV_OPTS, reload_settings
    from normandy_core.transcripts import continuation

    for var in (ENV_CONFIG, ENV_COMPACTOR, ENV_OPTS):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    reload_settings()
    yield tmp_path
    reload_settings()
    continuation.clear()


def test_a_settings_file_sets_the_declarative_rules(here: Path) -> None:
    from normandy_core.contract.settings import current_settings

    (here / "normandy.toml").write_text(
        'compactor = "window_manager"\nwindow = 12000\n\n'
        "[opts]\nreserved_tokens = 1000\n\n"
        "[survival]\nkeep_first_user = false\nkeep_current_request = false\n"
        'keep_tools = ["read_file"]\n',
        encoding="utf-8",
    )
    resolved = current_settings().resolve("window_manager")
    assert resolved.survival == {
        "keep_first_user": False,
        "keep_current_request": False,
        "keep_tools": ["read_file"],
    }
    assert resolved.origins["survival"].endswith("normandy.toml: line 7: key 'survival'")
    msgs = _openai_session(12)
    result = compact(msgs, model="gpt-4o")
    assert result.compacted
    assert msgs[1] not in result.messages  # the task may go, as configured
    reads = [m for m in msgs if m.get("tool_calls") and "read_file" in json.dumps(m)]
    assert all(m in result.messages for m in reads)
    agent = AgentConfig.from_env()
    assert agent.rules == SurvivalRules(
        keep_first_user=False, keep_current_request=False, keep_tools=("read_file",)
    )
    # rules given in code replace the file's whole: the task is kept again
    again = compact(msgs, model="gpt-4o", survival={"keep_tools": ["search"]})
    assert again.messages[1] == msgs[1]
    assert AgentConfig.from_env(survival={}).rules == SurvivalRules()


@pytest.mark.slow
def test_a_pyproject_table_sets_them_and_the_command_line_replaces_them(here: Path) -> None:
    (here / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.normandy]\nwindow = 12000\n\n'
        "[tool.normandy.opts]\nreserved_tokens = 1000\n\n"
        "[tool.normandy.survival]\nkeep_first_user = false\nkeep_current_request = false\n",
        encoding="utf-8",
    )
    msgs = _openai_session(12)
    src = write_json(here / "in.json", msgs)
    out = here / "out.json"
    r = run_cli("compact", str(src), "-o", str(out), "--model", "gpt-4o", env={})
    assert r.code == 0, r
    assert "survival from" in r.err and "[tool.normandy] key 'survival'" in r.err
    assert msgs[1] not in json.loads(out.read_text())
    r = run_cli("compact", str(src), "-o", str(out), "--model", "gpt-4o", "--keep-tool", "x")
    assert r.code == 0, r
    assert json.loads(out.read_text())[1] == msgs[1]  # the flags replace the table whole


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ('keep_if = "lambda e: True"', "a predicate can be set in code only"),
        ("keep_task = true", "rule 'keep_task': unknown rule"),
        ('keep_tools = "read_file"', "keep_tools must be a list of tool names"),
    ],
)
def test_a_file_with_bad_rules_is_refused_naming_file_line_and_key(
    here: Path, table: str, says: str
) -> None:
    from normandy_core.contract.settings import current_settings
    from normandy_core.errors import SettingsError

    (here / "normandy.toml").write_text(f"window = 9000\n\n[survival]\n{table}\n", "utf-8")
    with pytest.raises(SettingsError) as err:
        current_settings()
    text = str(err.value)
    assert text.startswith(f"{here / 'normandy.toml'}: line 3: key 'survival': survival rules")
    assert says in text


def test_configured_instructions_the_compactor_cannot_use_name_their_source(here: Path) -> None:
    (here / "normandy.toml").write_text(
        '[survival]\nsummary_instructions = "Keep paths."\n', encoding="utf-8"
    )
    with pytest.raises(OptionsError) as err:
        compact([{"role": "user", "content": "hi"}], window=9_000)
    text = str(err.value)
    assert "cannot honour survival rule 'summary_instructions'" in text
    assert "(settings: survival from" in text and "key 'survival'" in text


# -- provider compactions (the normandy-native compactors) ------------------------------


def _with_provider_compaction() -> AgentMemory:
    from normandy_core import OpaqueBlock
    from normandy_core.conversation.keys import PROVIDER_COMPACTION_KEY

    mem = AgentMemory()
    mem.add_message("system", "You are a coding agent.", id="sys", turn_id="t0")
    mem.add_message("user", "[normandy:marker] compacted here", id="m1", turn_id="c1")
    block = OpaqueBlock(format="anthropic", kind="compaction", data={"type": "compaction"})
    mem.add_message(
        "assistant",
        (block,),
        id="c1",
        turn_id="c1",
        pinned=True,
        metadata={PROVIDER_COMPACTION_KEY: True},
    )
    mem.add_message("user", "Fix the parser.", id="task", turn_id="t1")
    mem.add_message("assistant", "Looking.", id="a1", turn_id="t1")
    mem.add_message("user", "And now?", id="u2", turn_id="t2")
    return mem


def test_the_pin_of_a_superseded_provider_compaction_moves_to_the_new_one() -> None:
    from normandy_core import OpaqueBlock
    from normandy_core.conversation.keys import PROVIDER_COMPACTION_KEY

    acc = AgentConfig().with_memory(_with_provider_compaction())
    old = {e.id: e for e in acc.memory.entries()}
    newer = Entry(
        id="c2",
        turn_id="c2",
        role="assistant",
        content=(OpaqueBlock(format="anthropic", kind="compaction", data={"n": 2}),),
        pinned=True,
        metadata={PROVIDER_COMPACTION_KEY: True},
    )
    marker = Entry(id="m2", turn_id="c2", role="user", content="[normandy:marker] here")
    kept = [old["sys"], marker, newer, old["task"], old["u2"]]
    dropped = [old["m1"], old["c1"], old["a1"]]
    result = (acc.with_memory(acc.memory.derive(kept)), {"compacted": True, "dropped": dropped})
    checked = check_compaction("native", acc, _ctx(), result)
    assert checked.meta.compacted
    # without a newer provider compaction the pinned one is kept like any pinned entry
    without = [old["sys"], old["task"], old["u2"]]
    gone = [old["m1"], old["c1"], old["a1"]]
    plain = (acc.with_memory(acc.memory.derive(without)), {"compacted": True, "dropped": gone})
    with pytest.raises(ContractViolation, match=r"dropped entry 'c1'.*pinned entries"):
        check_compaction("probe", acc, _ctx(), plain)


def test_a_returned_copy_of_a_user_message_is_never_the_task() -> None:
    from normandy_core.conversation.keys import PROVIDER_REBUILT_KEY
    from normandy_core.conversation.survival import is_inserted

    copy = Entry(id="x", role="user", content="Fix it.", metadata={PROVIDER_REBUILT_KEY: True})
    task = Entry(id="task", role="user", content="Fix it.")
    assert is_inserted(copy) and not is_inserted(task)
    assert first_user_entry([copy, task]) is task
