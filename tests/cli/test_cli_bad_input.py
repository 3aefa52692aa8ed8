"""Bad transcripts given to the installed ``normandy compact`` script (one process each).

Every case exits 2 naming the file, the line (and the field) at fault, or is handled by
the documented rule; none prints a traceback (``run_cli`` checks stderr). The runs go in
parallel to keep the suite fast.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from reliability_counts import CLI_BAD_CASES

from tests.cli.conftest import Run, run_cli

# Slow: every test runs the installed console script in a subprocess.
pytestmark = pytest.mark.slow

PLANES = "".join(chr(p * 0x10000 + (0x4E2D if p == 0 else 0x41)) for p in range(17))
ODD = f"a\x00b \u202eevil\u202c \U0001f469\u200d\U0001f4bb {PLANES}"
USE = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
RESULT = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}


def _deep_object(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def _dup_dump() -> str:
    from normandy_core import AgentMemory

    mem = AgentMemory()
    mem.add_message("user", "one", id="same")
    data = mem.dump()
    data["entries"].append({**data["entries"][0], "content": "two", "parent_id": "same"})
    return json.dumps(data)


#: name -> (file content, extra arguments, exit status, what stderr must contain)
CASES: dict[str, tuple[str | bytes, list[str], int, list[str]]] = {
    "10,000 nested arrays": (
        "[" * 10_000 + "]" * 10_000,
        [],
        2,
        ["line 1, column 201", "nested deeper than 200 levels"],
    ),
    "JSON Lines, line 2 nested 10,000 deep": (
        '{"role": "user", "content": "hi"}\n{"role": "user", "content": '
        + "[" * 10_000
        + "]" * 10_000
        + "}\n",
        [],
        2,
        ["line 2, column", "nested deeper than 200"],
    ),
    "300 nested objects inside a message": (
        '[{"role": "user", "content": "hi"},\n {"role": "assistant", "content": "x", "n": '
        + _deep_object(300)
        + "}]",
        [],
        2,
        ["line 2 (message 1), field 'n", "nested deeper than 200"],
    ),
    "lone surrogate escape": (
        '[{"role": "user", "content": "bad \\ud800 text"}]',
        [],
        2,
        ["line 1 (message 0), field 'content'", "lone surrogate (U+D800"],
    ),
    "lone surrogate, JSON Lines line 3": (
        '{"role": "user", "content": "a"}\n{"role": "assistant", "content": "b"}\n'
        '{"role": "user", "content": "\\udfff"}\n',
        [],
        2,
        ["line 3 (message 2)", "lone surrogate"],
    ),
    "block without a type": (
        json.dumps([{"role": "user", "content": [{"text": "a block with no type"}]}]),
        ["--format", "anthropic"],
        2,
        ["(message 0), field 'content[0].type'", "missing or not a string"],
    ),
    "tool result whose tool use is missing": (
        json.dumps([{"role": "user", "content": "go"}, {"role": "user", "content": [RESULT]}]),
        [],
        2,
        ["(message 1)", "'t1' answers no call"],
    ),
    "duplicate message ids": (_dup_dump(), [], 2, ["field 'entries'", "same"]),
    "not UTF-8": (b'[{"role": "user", "content": "caf\xe9"}]', [], 2, ["line 1: not UTF-8"]),
    "truncated in a string": ('[{"role": "user", "content": "hal', [], 2, ["not valid JSON"]),
    "JSON Lines with an array line": (
        '{"role": "user", "content": "a"}\n[1, 2]\n',
        [],
        2,
        ["line 2: expected a JSON object per line"],
    ),
    "NUL, RTL, emoji and every plane": (
        json.dumps([{"role": "user", "content": ODD}], ensure_ascii=False),
        [],
        0,
        ["not compacted"],
    ),
    "a 6 MB single message": (
        json.dumps([{"role": "user", "content": "log line 42: ok\n" * 400_000}]),
        [],
        1,
        ["cannot fit the context window", "nothing written"],
    ),
    "empty transcript": ("[]", [], 0, ["0 entries", "not compacted"]),
}


def _run(tmp: Path, name: str) -> tuple[str, Path, Run]:
    content, extra, _, _ = CASES[name]
    path = tmp / (name.replace(" ", "_").replace(",", "") + ".json")
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    out = tmp / (path.name + ".out")
    return name, path, run_cli("compact", str(path), "--window", "9000", "-o", str(out), *extra)


def test_bad_transcripts_exit_2_without_traceback(tmp_path: Path) -> None:
    assert len(CASES) == CLI_BAD_CASES
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = list(pool.map(lambda n: _run(tmp_path, n), CASES))
    survived = 0
    for name, path, r in runs:
        _, _, code, needles = CASES[name]
        assert r.code == code, (name, r)
        for needle in needles:
            assert needle in r.err, (name, needle, r.err)
        assert r.err.startswith("normandy compact: "), (name, r.err)
        assert r.err.count("\n") == 1, (name, r.err)  # one line, no traceback
        out = Path(str(path) + ".out")
        if code == 0:
            data: Any = json.loads(out.read_text(encoding="utf-8"))
            assert data == json.loads(path.read_text(encoding="utf-8")), name
        else:
            assert not out.exists(), name  # nothing written on failure
        if code == 2:
            assert str(path) in r.err, name
        survived += 1
    assert survived == CLI_BAD_CASES
