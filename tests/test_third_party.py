"""Third-party distributions installed for real, exercised in their own interpreter.

Every scenario runs in the throwaway venv of the ``third_party`` fixture, where the
distributions under ``tests/dists/`` are installed as built wheels next to the project's
own (normandy-core, which ships noop, and normandy-window-manager).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

# Slow: scenarios run in the third-party venv (wheels built and installed), as subprocesses.
pytestmark = pytest.mark.slow

if TYPE_CHECKING:
    from conftest import ThirdPartyVenv

_CONVERSATION = """
from normandy_core import AgentConfig, ThinkingBlock, TextBlock, ToolResultBlock, ToolUseBlock


def conversation(acc):
    mem = acc.memory
    mem.add_message("user", "Task: fix the build.", id="task", pinned=True, turn_id="t1")
    mem.add_message("assistant", "Looking.", id="a1", turn_id="t1")
    mem.add_message("user", "Go on.", id="u1", turn_id="t1")
    mem.add_message(
        "assistant",
        (
            ThinkingBlock(thinking="which files?", signature="sig-1"),
            ToolUseBlock(id="call-1", name="read", input={"path": "a.py"}),
            ToolUseBlock(id="call-2", name="read", input={"path": "b.py"}),
        ),
        id="a2",
        turn_id="t1",
    )
    mem.add_message("user", (ToolResultBlock(tool_use_id="call-1", content="A"),), id="r1")
    mem.add_message("user", (ToolResultBlock(tool_use_id="call-2", content="B"),), id="r2")
    mem.add_message(
        "assistant",
        (ThinkingBlock(thinking="done", signature="sig-2"), TextBlock(text="Fixed.")),
        id="a3",
        turn_id="t1",
    )
    return acc
"""


def test_third_party_compactor_selected_by_name_compacts_and_reports(
    third_party: ThirdPartyVenv, tmp_path
):
    hook_log = tmp_path / "hooks.jsonl"
    out = third_party.run(
        _CONVERSATION
        + """
from normandy_core import resolve_compactor, run_compaction

# u1 opened the running turn: keep_current_request would keep it; let it go here
rules = {"keep_current_request": False}
acc = conversation(AgentConfig(compactor="tail", compactor_opts={"keep": 2}, survival=rules))
before = [e.id for e in acc.memory]
new, meta = run_compaction(acc, mid_round=True)
handle = resolve_compactor("tail")
emit({
    "meta": {k: v for k, v in meta.items() if k != "dropped"},
    "dropped": [e.id for e in meta["dropped"]],
    "kept": [e.id for e in new.memory],
    "kept_thinking": [e.id for e in new.memory if e.has_thinking],
    "input_after": [e.id for e in acc.memory],
    "input_thinking": [e.id for e in acc.memory if e.has_thinking],
    "before": before,
    "handle": [handle.name, handle.distribution, handle.version, handle.module],
})
""",
        env={"NORMANDY_TEST_HOOK_LOG": str(hook_log)},
    )
    d = out.data
    figures = {k: d["meta"].pop(k) for k in ("tokens_before", "tokens_after", "tokens_removed")}
    # the boundary's next-call estimate with prompt caching (docs/cost.md), for every compactor
    billing = {
        k: d["meta"].pop(k)
        for k in ("billed_next_without", "billed_next_with", "cache_kept_tokens")
    }
    assert all(isinstance(v, int) and v >= 0 for v in billing.values())
    # the workspace's archive hook (installed beside it) says where the dropped entries went
    (note,) = d["meta"].pop("hook_notes")
    assert note["hook"] == "normandy_core.hooks:archive" and note["note"]["entries"] == 2
    # a mid-round compaction strips the kept messages' thinking, and says so (issue 34)
    assert d["meta"] == {"compacted": True, "strategy": "tail", "thinking_stripped": True}
    # The boundary computes the token figures every compactor shares.
    assert figures["tokens_before"] > figures["tokens_after"] > 0
    # keep=2 units: the tool round (a2, r1, r2) is one unit, a3 the other; the pinned task stays.
    assert d["kept"] == ["task", "a2", "r1", "r2", "a3"]
    assert d["dropped"] == ["a1", "u1"]
    assert d["kept_thinking"] == []  # mid-round: kept messages lose their thinking
    assert d["input_after"] == d["before"]  # the caller's memory is untouched
    assert d["input_thinking"] == ["a2", "a3"]
    assert d["handle"] == ["tail", "normandy-tail", "1.2.3", "normandy_tail"]
    # The installed hook plugin saw the compaction, though another hook plugin is broken.
    calls = [json.loads(line) for line in hook_log.read_text().splitlines()]
    assert calls == [
        {
            "dropped": ["a1", "u1"],
            "strategy": "tail",
            "mid_round": True,
            "kept": ["task", "a2", "r1", "r2", "a3"],
        }
    ]
    assert "hook plugin 'broken_hook' (group normandy_core.hooks)" in out.stderr


def test_skip_path_runs_no_hook(third_party: ThirdPartyVenv, tmp_path):
    hook_log = tmp_path / "hooks.jsonl"
    out = third_party.run(
        _CONVERSATION
        + """
from normandy_core import run_compaction

acc = conversation(AgentConfig(compactor="tail", compactor_opts={"keep": 50}))
new, meta = run_compaction(acc, mid_round=False)
emit({"meta": meta, "same": new is acc})
""",
        env={"NORMANDY_TEST_HOOK_LOG": str(hook_log)},
    )
    assert out.data == {"meta": {"compacted": False}, "same": True}
    assert not hook_log.exists()


def test_broken_plugins_are_named_and_isolated(third_party: ThirdPartyVenv):
    out = third_party.run("""
from normandy_core import (
    PluginConflictError, PluginLoadError, hook_manager, list_plugins, resolve_compactor,
)

errors = {}
for name in ["broken_import", "bad_signature", "no_entry", "keep_last"]:
    try:
        resolve_compactor(name)
    except (PluginLoadError, PluginConflictError) as exc:
        cause = exc.__cause__
        errors[name] = {
            "type": type(exc).__name__,
            "msg": str(exc),
            "cause": type(cause).__name__ if cause is not None else None,
        }
# A second look-up gives the same answer without importing again.
try:
    resolve_compactor("broken_import")
except PluginLoadError as exc:
    errors["again"] = str(exc)
tail = resolve_compactor("tail")
rows = {(r.group, r.name, r.distribution): r.as_dict() for r in list_plugins()}
emit({
    "errors": errors,
    "tail": tail.describe(),
    "rows": [dict(v) for v in rows.values()],
    "hook_plugins": sorted(n for n, _ in hook_manager().list_name_plugin()),
})
""")
    d = out.data
    e = d["errors"]
    imp = e["broken_import"]
    assert imp["type"] == "PluginLoadError"
    assert imp["msg"] == (
        "compactor 'broken_import' (group normandy_core.compactors) from "
        "normandy-broken-import 0.3.1 failed to import: ModuleNotFoundError: "
        "No module named 'normandy_missing_dependency'"
    )
    assert imp["cause"] == "ModuleNotFoundError"
    assert e["again"] == imp["msg"]

    sig = e["bad_signature"]
    assert sig["type"] == "PluginLoadError"
    assert sig["msg"].startswith(
        "compactor 'bad_signature' (group normandy_core.compactors) from "
        "normandy-bad-signature 0.2.0 has a hook that does not match its hookspec"
    )
    assert "maybe_compact" in sig["msg"]
    assert "budget" in sig["msg"]
    assert sig["cause"] == "PluginValidationError"

    # validate_opts without `entry` is accepted (pluggy's convention); see below.
    assert "no_entry" not in e

    conflict = e["keep_last"]
    assert conflict["type"] == "PluginConflictError"
    assert "normandy-tail 1.2.3" in conflict["msg"]
    assert "normandy-tail-fork 0.9.0" in conflict["msg"]

    assert d["tail"] == "compactor 'tail' (group normandy_core.compactors) from normandy-tail 1.2.3"

    rows = {(r["kind"], r["name"], r["distribution"]): r for r in d["rows"]}
    status = {k: (r["status"], r["version"]) for k, r in rows.items()}
    assert status[("compactor", "tail", "normandy-tail")] == ("loaded", "1.2.3")
    assert status[("compactor", "noop", "normandy-core")][0] == "not loaded"
    assert status[("compactor", "broken_import", "normandy-broken-import")] == ("error", "0.3.1")
    assert status[("compactor", "bad_signature", "normandy-bad-signature")] == ("error", "0.2.0")
    assert status[("compactor", "no_entry", "normandy-no-entry")] == ("loaded", "0.4.0")
    assert status[("compactor", "keep_last", "normandy-tail")][0] == "conflict"
    assert status[("compactor", "keep_last", "normandy-tail-fork")][0] == "conflict"
    assert status[("hook", "recorder", "normandy-hook-recorder")] == ("loaded", "2.0.0")
    broken_hook = rows[("hook", "broken_hook", "normandy-hook-broken")]
    assert broken_hook["status"] == "error"
    assert broken_hook["error"] == (
        "hook plugin 'broken_hook' (group normandy_core.hooks) from normandy-hook-broken 0.0.1 "
        "failed to import: RuntimeError: normandy-hook-broken refuses to import"
    )
    assert rows[("compactor", "broken_import", "normandy-broken-import")]["error"] == imp["msg"]
    assert rows[("compactor", "tail", "normandy-tail")]["module"] == "normandy_tail"
    # Registration names are qualified by group; the broken hook plugin is not registered.
    # (the workspace's own archive hook is installed beside them and loads too)
    assert "normandy_core.hooks:recorder" in d["hook_plugins"]
    assert all(n.startswith("normandy_core.hooks:") for n in d["hook_plugins"])
    assert "normandy_core.hooks:broken_hook" not in d["hook_plugins"]


def test_validate_opts_errors_name_the_entry_point_at_config_time(third_party: ThirdPartyVenv):
    out = third_party.run("""
from normandy_core import AgentConfig, OptionsError, PluginLoadError

made = {
    "create": lambda: AgentConfig(compactor="tail", compactor_opts={"keep": 0}),
    "replace": lambda: AgentConfig(compactor="tail").replace(compactor_opts={"kep": 3}),
    "with_compactor": lambda: AgentConfig().with_compactor("tail", {"keep": "many"}),
    "no_entry": lambda: AgentConfig(compactor="no_entry", compactor_opts={"x": 1}),
}
out = {}
for key, make in made.items():
    try:
        make()
        out[key] = None
    except (OptionsError, PluginLoadError) as exc:
        out[key] = [type(exc).__name__, isinstance(exc, ValueError), str(exc)]
emit(out)
""")
    d = out.data
    assert d["create"][:2] == ["OptionsError", True]
    assert d["create"][2].startswith("normandy_core.AgentConfig(): compactor 'tail'")
    assert "option 'keep'" in d["create"][2]
    assert "greater than or equal to 1" in d["create"][2]

    assert d["replace"][2].startswith("normandy_core.AgentConfig.replace(): compactor 'tail'")
    unknown = "option 'kep': unknown option; did you mean 'keep'? allowed options: keep"
    assert unknown in d["replace"][2]

    assert d["with_compactor"][2].startswith(
        "normandy_core.AgentConfig.with_compactor(): compactor 'tail'"
    )
    assert "option 'keep'" in d["with_compactor"][2]
    assert "'many'" in d["with_compactor"][2]

    # validate_opts without `entry` is accepted; the core names the entry point itself.
    assert d["no_entry"] == [
        "OptionsError",
        True,
        "normandy_core.AgentConfig(): compactor 'no_entry' refused its options: "
        "ValueError: no options allowed",
    ]


def test_unknown_name_lists_installed_and_suggests_closest(third_party: ThirdPartyVenv):
    out = third_party.run("""
from normandy_core import AgentConfig, UnknownCompactorError

try:
    AgentConfig(compactor="tial")
except UnknownCompactorError as exc:
    emit({
        "msg": str(exc), "lookup": isinstance(exc, LookupError),
        "installed": exc.installed, "suggestion": exc.suggestion,
    })
""")
    d = out.data
    assert d["lookup"] is True
    assert d["suggestion"] == "tail"
    for name in ("tail", "noop", "window_manager", "broken_import", "no_entry", "keep_last"):
        assert name in d["installed"]
        assert repr(name) in d["msg"]
    assert "did you mean 'tail'?" in d["msg"]
    assert d["msg"].startswith("unknown compactor 'tial'")


def test_load_plugins_empty_means_none(third_party: ThirdPartyVenv, tmp_path):
    hook_log = tmp_path / "hooks.jsonl"
    out = third_party.run(
        """
from normandy_core import PluginDisabledError, hook_manager, list_plugins, resolve_compactor

try:
    resolve_compactor("tail")
    refused = None
except PluginDisabledError as exc:
    refused = [str(exc), isinstance(exc, LookupError)]
emit({
    "refused": refused,
    "statuses": sorted({r.status for r in list_plugins()}),
    "hooks": [n for n, p in hook_manager().list_name_plugin() if p is not None],
    "blocked": sorted(n for n, p in hook_manager().list_name_plugin() if p is None),
})
""",
        env={"NORMANDY_LOAD_PLUGINS": "", "NORMANDY_TEST_HOOK_LOG": str(hook_log)},
    )
    d = out.data
    assert d["refused"] == [
        "compactor 'tail' (group normandy_core.compactors) from normandy-tail 1.2.3 is "
        "not in NORMANDY_LOAD_PLUGINS",
        True,
    ]
    assert d["statuses"] == ["conflict", "disabled"]  # keep_last is reported as a conflict
    assert d["hooks"] == []
    assert "normandy_core.hooks:recorder" in d["blocked"]  # pluggy's set_blocked


def test_load_plugins_allow_list(third_party: ThirdPartyVenv, tmp_path):
    hook_log = tmp_path / "hooks.jsonl"
    out = third_party.run(
        _CONVERSATION
        + """
from normandy_core import PluginDisabledError, UnknownCompactorError, list_plugins
from normandy_core import run_compaction

acc = conversation(AgentConfig(compactor="tail", compactor_opts={"keep": 1}))
new, meta = run_compaction(acc, mid_round=False)
try:
    AgentConfig(compactor="noop")
    noop = None
except PluginDisabledError as exc:
    noop = str(exc)
try:
    AgentConfig(compactor="tial")
except UnknownCompactorError as exc:
    installed = exc.installed
emit({
    "compacted": meta["compacted"],
    "noop": noop,
    "installed": installed,
    "rows": {f"{r.kind}:{r.name}": r.status for r in list_plugins()},
})
""",
        env={"NORMANDY_LOAD_PLUGINS": "tail, recorder", "NORMANDY_TEST_HOOK_LOG": str(hook_log)},
    )
    d = out.data
    assert d["compacted"] is True
    assert d["noop"].endswith("is not in NORMANDY_LOAD_PLUGINS")
    assert d["installed"] == ["tail"]
    assert d["rows"]["compactor:tail"] == "loaded"
    assert d["rows"]["compactor:noop"] == "disabled"
    assert d["rows"]["hook:recorder"] == "loaded"
    assert d["rows"]["hook:broken_hook"] == "disabled"  # never imported, so no error
    assert len(hook_log.read_text().splitlines()) == 1


def test_disable_plugins_deny_list(third_party: ThirdPartyVenv, tmp_path):
    hook_log = tmp_path / "hooks.jsonl"
    out = third_party.run(
        """
from normandy_core import AgentConfig, PluginDisabledError, list_plugins

try:
    AgentConfig(compactor="tail")
    tail = None
except PluginDisabledError as exc:
    tail = str(exc)
AgentConfig(compactor="noop")
emit({"tail": tail, "rows": {f"{r.kind}:{r.name}": r.status for r in list_plugins()}})
""",
        env={
            "NORMANDY_DISABLE_PLUGINS": "tail,broken_hook",
            "NORMANDY_TEST_HOOK_LOG": str(hook_log),
        },
    )
    d = out.data
    assert d["tail"] == (
        "compactor 'tail' (group normandy_core.compactors) from normandy-tail 1.2.3 is "
        "disabled by NORMANDY_DISABLE_PLUGINS"
    )
    assert d["rows"]["compactor:tail"] == "disabled"
    assert d["rows"]["compactor:noop"] == "loaded"
    assert d["rows"]["hook:broken_hook"] == "disabled"
    assert d["rows"]["hook:recorder"] == "loaded"
    assert "broken_hook" not in out.stderr  # disabled, so never imported


def test_compactor_nobody_selected_is_never_imported(third_party: ThirdPartyVenv, tmp_path):
    imports = tmp_path / "imports.txt"
    out = third_party.run(
        _CONVERSATION
        + """
import sys
from normandy_core import list_plugins, run_compaction

acc = conversation(AgentConfig(compactor="tail", compactor_opts={"keep": 1}))
new, meta = run_compaction(acc, mid_round=False)
rows = list_plugins()
modules = ["normandy_broken_import", "normandy_bad_signature", "normandy_no_entry",
           "normandy_tail_fork", "normandy_window_manager", "normandy_core.contract.noop"]
before = [m for m in modules if m in sys.modules]
list_plugins(load=True)  # the positive control: now everything is imported
after = [m for m in modules if m in sys.modules]
emit({"compacted": meta["compacted"], "before": before, "after": after})
""",
        env={"NORMANDY_TEST_IMPORT_LOG": str(imports), "NORMANDY_TEST_HOOK_LOG": "/dev/null"},
    )
    assert out.data["compacted"] is True
    assert out.data["before"] == []
    assert set(out.data["after"]) == {
        "normandy_bad_signature",
        "normandy_no_entry",
        "normandy_window_manager",
        "normandy_core.contract.noop",
    }
    # broken_import ran only under list_plugins(load=True) (a failed import leaves no module).
    assert imports.read_text().splitlines() == ["normandy_broken_import"]


def test_entry_points_are_not_discovered_from_the_current_directory(
    third_party: ThirdPartyVenv, tmp_path
):
    info = tmp_path / "rogue_plugin-6.6.6.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: rogue-plugin\nVersion: 6.6.6\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(
        "[normandy_core.compactors]\nrogue = rogue_mod\n\n"
        "[normandy_core.hooks]\nrogue_hook = rogue_mod\n",
        encoding="utf-8",
    )
    (tmp_path / "rogue_mod.py").write_text("raise SystemExit('rogue code ran')\n")
    out = third_party.run(
        """
import importlib.metadata as md
from normandy_core import UnknownCompactorError, hook_manager, list_plugins, resolve_compactor

# Control: importlib.metadata on its own does see the dist-info in the current directory.
visible = any(d.metadata["Name"] == "rogue-plugin" for d in md.distributions())
hook_manager()
try:
    resolve_compactor("rogue")
    found = True
except UnknownCompactorError:
    found = False
emit({"visible": visible, "found": found, "names": sorted(r.name for r in list_plugins())})
""",
        cwd=tmp_path,
    )
    assert out.data["visible"] is True
    assert out.data["found"] is False
    assert "rogue" not in out.data["names"]
    assert "rogue_hook" not in out.data["names"]
    assert "tail" in out.data["names"]


@pytest.mark.parametrize("keep", [1, 3])
def test_tail_never_separates_a_tool_use_from_its_results(third_party: ThirdPartyVenv, keep):
    out = third_party.run(
        _CONVERSATION
        + f"""
from normandy_core import pairing_problems, run_compaction

acc = conversation(AgentConfig(compactor="tail", compactor_opts={{"keep": {keep}}}))
new, meta = run_compaction(acc, mid_round=False)
emit({{"problems": pairing_problems(new.memory.entries()), "kept": [e.id for e in new.memory]}})
"""
    )
    assert out.data["problems"] == []
    assert out.data["kept"][0] == "task"


def test_a_plugin_class_that_cannot_be_instantiated_is_named_and_isolated(
    third_party: ThirdPartyVenv, tmp_path
):
    hook_log = tmp_path / "hooks.jsonl"
    out = third_party.run(
        _CONVERSATION
        + """
from normandy_core import PluginLoadError, list_plugins, resolve_compactor, run_compaction

errors = []
for _ in range(2):
    try:
        resolve_compactor("bad_init")
    except PluginLoadError as exc:
        errors.append([str(exc), type(exc.__cause__).__name__])
acc = conversation(AgentConfig(compactor="tail", compactor_opts={"keep": 1}))
new, meta = run_compaction(acc, mid_round=False)
rows = {f"{r.kind}:{r.name}": [r.status, r.error] for r in list_plugins()}
emit({"errors": errors, "compacted": meta["compacted"], "rows": rows})
""",
        env={"NORMANDY_TEST_HOOK_LOG": str(hook_log)},
    )
    d = out.data
    prefix = "compactor 'bad_init' (group normandy_core.compactors) from normandy-bad-init 0.5.0"
    assert len(d["errors"]) == 2
    assert d["errors"][0] == d["errors"][1]
    msg, cause = d["errors"][0]
    assert msg.startswith(prefix + " could not be instantiated: KeyError: 'BAD_INIT_TOKEN'")
    assert cause == "KeyError"
    assert d["rows"]["compactor:bad_init"] == ["error", msg]
    status, error = d["rows"]["hook:bad_init_hook"]
    assert status == "error"
    assert error == (
        "hook plugin 'bad_init_hook' (group normandy_core.hooks) from normandy-bad-init 0.5.0 "
        "could not be instantiated: KeyError: 'BAD_INIT_TOKEN'"
    )
    assert d["compacted"] is True
    assert len(hook_log.read_text().splitlines()) == 1  # the good hook plugin still ran


def test_a_third_party_embedder_is_found_by_name_and_recall_finds_by_meaning(
    third_party: ThirdPartyVenv, tmp_path
):
    """normandy-embed-concepts (tests/dists) registers the embedder ``concepts``; recall
    configured with it by name (the environment) finds a fact that shares no word with
    the query, which the keyword ranking alone cannot; its vectors stay in the archive."""
    db = str(tmp_path / "a.sqlite3")
    out = third_party.run(
        f"path = {db!r}\n"
        + """
import sqlite3
from normandy_archive import Archive
from normandy_core import Entry, recall
from normandy_core.contract.embedders import installed_embedders, resolve_embedder
import normandy_embed_concepts

fact = "INV-204: the card was declined when we charged the invoice"
archive = Archive(path)
archive.record(
    [
        Entry(id="u1", role="user", content="Please tidy the README headings."),
        Entry(id="a1", role="assistant", content=fact),
    ],
    session_id="s1",
)
archive.close()
lexical = recall("money trouble", session="s1", embedder="off")
by_meaning = recall("money trouble", session="s1")
made = resolve_embedder("concepts", {"scale": 2})
with sqlite3.connect(path) as conn:
    kept = conn.execute("SELECT embedder, count(*) FROM vectors GROUP BY 1").fetchall()
emit({
    "installed": "concepts" in installed_embedders(),
    "lexical": [h.entry.id for h in lexical.hits],
    "meaning": [h.entry.id for h in by_meaning.hits],
    "embedded": normandy_embed_concepts.CALLS,
    "kept": kept,
    "key": made.key,
})
""",
        env={
            "NORMANDY_ARCHIVE_PATH": db,
            "NORMANDY_RECALL_EMBEDDER": "concepts",
            "NORMANDY_RECALL_EMBEDDER_OPTS": '{"scale": 1}',
            "NORMANDY_CONFIG": "off",
        },
    )
    d = out.data
    assert d["installed"]
    assert d["lexical"] == []
    assert d["meaning"][0] == "a1"
    assert d["embedded"] == [2, 1]  # both entries, then the query
    assert d["kept"] == [["concepts:1 parts<=600", 2]]  # the key names the part size
    assert d["key"] == "concepts:2"
