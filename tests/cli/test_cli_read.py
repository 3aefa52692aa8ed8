"""The command's reader on large input: every message, and the line each one starts on.

No timing is asserted (the machines are shared); ``benchmarks/cli_read.py`` measures how
reading scales. These tests check what the linear reader returns on a 20,000-message
array laid out irregularly: the same values as ``json.loads`` and the right line for
every message, so an error late in a long file names the right line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from normandy_core.app.cli import read_source

COUNT = 20_000


def _message(i: int) -> dict[str, Any]:
    if i % 3 == 0:
        return {
            "role": "user",
            "content": f"question {i}\nwith an escaped newline, é, [not, an] {{x}}",
        }
    if i % 3 == 1:
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": "read", "arguments": json.dumps({"n": i, "f": 0.5})},
                }
            ],
        }
    return {"role": "tool", "tool_call_id": f"call_{i - 1}", "content": "ok, ]\n" * (i % 5)}


def _irregular_array(messages: list[dict[str, Any]]) -> tuple[str, list[int]]:
    """JSON text laid out unevenly, and the line each element starts on (counted as built)."""
    parts = ["[\n"]
    line = 2
    starts: list[int] = []
    for i, m in enumerate(messages):
        if i:
            sep = ", " if i % 7 == 0 else ",\n" + "\n" * (i % 4 == 0)  # same line, or blank lines
            parts.append(sep)
            line += sep.count("\n")
        body = json.dumps(m) if i % 2 else json.dumps(m, indent=i % 3 + 1, ensure_ascii=False)
        starts.append(line)
        parts.append(body)
        line += body.count("\n")
    parts.append("\n]\n")
    return "".join(parts), starts


def test_a_large_array_is_read_whole_with_the_line_of_each_message(tmp_path: Path) -> None:
    messages = [_message(i) for i in range(COUNT)]
    text, starts = _irregular_array(messages)
    path = tmp_path / "large.json"
    path.write_text(text, encoding="utf-8")
    src = read_source(str(path))
    assert src.kind == "json"
    assert src.data == json.loads(text) == messages
    assert src.lines == starts
    last = COUNT - 1
    assert src.where(last) == f"{path}: line {starts[last]} (message {last})"


def test_a_large_array_on_one_line_and_with_a_bom(tmp_path: Path) -> None:
    messages = [_message(i) for i in range(COUNT)]
    path = tmp_path / "one-line.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(messages).encode("utf-8"))
    src = read_source(str(path))
    assert src.data == messages
    assert src.lines == [1] * COUNT


def test_large_json_lines_keep_their_line_numbers(tmp_path: Path) -> None:
    messages = [_message(i) for i in range(COUNT)]
    path = tmp_path / "large.jsonl"
    path.write_text("".join(json.dumps(m) + "\n\n" for m in messages), encoding="utf-8")
    src = read_source(str(path))
    assert src.kind == "jsonl"
    assert src.data == messages
    assert src.lines == list(range(1, 2 * COUNT, 2))
