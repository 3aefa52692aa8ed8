"""Faulty plugins installed for real (tests/dists/normandy-faulty-*, normandy-hook-raises).

Each runs in the ``third_party`` venv beside the other test distributions (and the
broken ones), inside real turns: ``run_turn`` with a :class:`ScriptedClient` and a tool
registry. Every boundary must come back as the error path naming the entry point and
the distribution, and every turn must answer with its conversation intact.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from reliability_counts import (
    BOUNDARIES_PER_TURN,
    FAULTY_COMPACTORS,
    FAULTY_TURNS,
    HOOK_RAISES_COMPACTIONS,
)

# Slow: scenarios run in the third-party venv (wheels built and installed) and the CLI.
pytestmark = pytest.mark.slow

if TYPE_CHECKING:
    from conftest import ThirdPartyVenv

#: (distribution, version, what the boundary's error says after the plugin's name)
EXPECTED = {
    "faulty_raises": ("normandy-faulty-raises", "1.0.1", "raised ZeroDivisionError"),
    "faulty_wrong_type": ("normandy-faulty-wrong-type", "1.0.2", "returned str, not (acc, meta)"),
    "faulty_no_compacted": (
        "normandy-faulty-no-compacted",
        "1.0.3",
        "returned meta without a boolean 'compacted'",
    ),
    "faulty_mutates": (
        "normandy-faulty-mutates",
        "1.0.4",
        "mutated the memory it was given (restored)",
    ),
    "faulty_slow": ("normandy-faulty-slow", "1.0.5", "did not return within 0.2 s"),
}

_TURN = """
from normandy_core import AgentConfig, TextBlock, ToolUseBlock, pairing_problems
from normandy_core.clients import ModelReply, ScriptedClient
from normandy_core.turn import run_turn

TOOLS = [{"name": "read_file", "description": "Read a file.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]


def read_file(path):
    return f"contents of {path}"


def script(tag, turns):
    out = []
    for t in range(turns):
        for k in ("a", "b"):
            use = ToolUseBlock(id=f"{tag}-{t}-{k}", name="read_file", input={"path": k + ".py"})
            out.append(ModelReply(content=(use,)))
        out.append(ModelReply(content=(TextBlock(text=f"answer {t}"),)))
    return out


def run_turns(name, turns, **opts):
    client = ScriptedClient(script(name, turns))
    acc = AgentConfig(
        system_prompt="You are careful.", tools=TOOLS, compactor=name, compactor_opts=opts,
        compaction_timeout=0.2,
    )
    answers, boundaries = [], []
    for t in range(turns):
        result = run_turn(acc, f"task {t}", client=client, tools={"read_file": read_file})
        acc = result.acc
        answers.append(result.text)
        boundaries += [b["meta"] for b in result.events_of("boundary")]
    entries = acc.memory.entries()
    return {
        "answers": answers,
        "boundaries": boundaries,
        "roles": [e.role for e in entries],
        "texts": [e.text() for e in entries],
        "pairing": pairing_problems(entries),
        "requests": len(client.requests),
    }
"""


def test_faulty_compactors_never_break_a_real_turn(third_party: ThirdPartyVenv, tmp_path):
    out = third_party.run(
        _TURN
        + f"""
from normandy_core import resolve_compactor

report = {{}}
for name in {list(FAULTY_COMPACTORS)!r}:
    report[name] = run_turns(name, {FAULTY_TURNS})
# isolation: after all of them, in the same process, a good compactor still compacts
report["tail"] = run_turns("tail", {FAULTY_TURNS}, keep=1)
emit(report)
""",
        env={"NORMANDY_ARCHIVE_PATH": str(tmp_path / "archive.sqlite3")},
    )
    d = out.data
    tried = survived = 0
    per_turn = ["user", "assistant", "user", "assistant", "user", "assistant"]
    for name in FAULTY_COMPACTORS:
        dist, version, problem = EXPECTED[name]
        r = d[name]
        who = f"compactor {name!r} (group normandy_core.compactors) from {dist} {version}"
        assert len(r["boundaries"]) == FAULTY_TURNS * BOUNDARIES_PER_TURN, name
        for meta in r["boundaries"]:
            tried += 1
            assert meta["compacted"] is False, (name, meta)
            assert meta["error"].startswith(who), meta["error"]
            assert problem in meta["error"], meta["error"]
            survived += 1
        assert r["answers"] == [f"answer {t}" for t in range(FAULTY_TURNS)]
        # the whole conversation is there, nothing injected, every tool use answered
        assert r["roles"] == per_turn * FAULTY_TURNS, name
        assert not any("pwned" in t for t in r["texts"]), name
        assert r["pairing"] == []
        assert r["requests"] == 3 * FAULTY_TURNS
        assert who in out.stderr  # logged too
    assert tried == survived == len(FAULTY_COMPACTORS) * FAULTY_TURNS * BOUNDARIES_PER_TURN
    assert "Traceback" in out.stderr  # the library logs the exception for applications
    good = d["tail"]
    assert any(m["compacted"] for m in good["boundaries"])
    assert good["answers"] == [f"answer {t}" for t in range(FAULTY_TURNS)]
    assert good["pairing"] == []


def test_a_raising_hook_is_named_and_the_others_run(third_party: ThirdPartyVenv, tmp_path):
    hook_log = tmp_path / "hooks.jsonl"
    out = third_party.run(
        f"""
from normandy_core import AgentConfig, run_compaction

metas = []
for n in range({HOOK_RAISES_COMPACTIONS}):
    acc = AgentConfig(compactor="tail", compactor_opts={{"keep": 1}})
    for i in range(4):
        acc.memory.add_message("user" if i % 2 == 0 else "assistant", f"m{{n}}-{{i}}")
    before = [e.id for e in acc.memory]
    new, meta = run_compaction(acc, mid_round=False)
    metas.append({{
        "compacted": meta["compacted"],
        "hook_errors": meta.get("hook_errors"),
        "dropped": [e.id for e in meta["dropped"]],
        "input_intact": [e.id for e in acc.memory] == before,
    }})
emit(metas)
""",
        env={
            "NORMANDY_TEST_HOOK_LOG": str(hook_log),
            "NORMANDY_TEST_HOOK_RAISES": "1",
            "NORMANDY_ARCHIVE_PATH": str(tmp_path / "archive.sqlite3"),
        },
    )
    assert len(out.data) == HOOK_RAISES_COMPACTIONS
    recorded = [json.loads(line) for line in hook_log.read_text().splitlines()]
    assert len(recorded) == HOOK_RAISES_COMPACTIONS  # the recorder ran every time
    who = "hook plugin 'raising_hook' (group normandy_core.hooks) from normandy-hook-raises 1.0.6"
    for meta, rec in zip(out.data, recorded, strict=True):
        assert meta["compacted"] is True and meta["input_intact"] is True
        assert meta["hook_errors"] == [
            {
                "hook": "normandy_core.hooks:raising_hook",
                "plugin": who,
                "error": "ConnectionError: raising_hook: backend unreachable",
            }
        ]
        assert rec["dropped"] == meta["dropped"]
    assert f"after_compact of {who} raised ConnectionError" in out.stderr
    # the broken-import hook plugin of another distribution is named at load time
    assert "hook plugin 'broken_hook' (group normandy_core.hooks)" in out.stderr


def test_faulty_compactors_on_the_command_line(third_party: ThirdPartyVenv, tmp_path):
    src = tmp_path / "in.json"
    src.write_text(
        json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    )
    results = third_party.run(
        f"""
import subprocess, sys
procs = {{
    name: subprocess.Popen(
        [sys.executable, "-m", "normandy_core.app.cli", "compact", {str(src)!r}, "--compactor",
        name,
         "--timeout", "0.2", "-o", {str(tmp_path / "out.json")!r}],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    for name in {list(FAULTY_COMPACTORS)!r}
}}
runs = {{}}
for name, p in procs.items():
    out, err = p.communicate(timeout=60)
    runs[name] = [p.returncode, out, err]
emit(runs)
"""
    ).data
    for name in FAULTY_COMPACTORS:
        code, stdout, stderr = results[name]
        dist, version, problem = EXPECTED[name]
        assert code == 1, (name, stderr)
        assert stdout == ""
        assert f"from {dist} {version}" in stderr and problem in stderr, stderr
        assert "Traceback" not in stderr, stderr
        assert "nothing written" in stderr
    assert not (tmp_path / "out.json").exists()
