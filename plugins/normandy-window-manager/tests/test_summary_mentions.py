"""The extractive digest lists the first 200 distinct mentions, in the order found."""

from __future__ import annotations

import json

from normandy_core import Entry, ToolResultBlock, ToolUseBlock, get_counter
from normandy_window_manager.summarize import extractive_summary


def _round(i: int) -> list[Entry]:
    use = ToolUseBlock(id=f"toolu_{i}", name="read_file", input={"path": f"src/in_{i}.py"})
    result = ToolResultBlock(
        tool_use_id=f"toolu_{i}", content=f"see src/out_{i}.py and helper_fn_{i} here"
    )
    return [
        Entry(id=f"a{i}", role="assistant", content=(use,)),
        Entry(id=f"r{i}", role="user", content=(result,)),
    ]


def _mentioned(digest: str) -> list[str]:
    lines = digest.splitlines()
    at = lines.index("Files and identifiers mentioned:")
    listed = json.loads(f"[{lines[at + 1].removeprefix('- ')}]")  # quoted: JSON strings
    assert all(isinstance(name, str) for name in listed)
    return listed


def test_first_200_mentions_in_order_when_more_are_present() -> None:
    dropped = [e for i in range(150) for e in _round(i)]
    digest = extractive_summary(dropped, 1_000_000, get_counter("estimate"))
    expected: list[str] = []
    for i in range(150):  # tool input path, then result path, then identifiers
        expected += [f"src/in_{i}.py", f"src/out_{i}.py", f"out_{i}", f"helper_fn_{i}"]
    assert _mentioned(digest) == expected[:200]


def test_all_mentions_listed_below_the_cap() -> None:
    dropped = [e for i in range(10) for e in _round(i)]
    digest = extractive_summary(dropped, 1_000_000, get_counter("estimate"))
    assert len(_mentioned(digest)) == 40
    assert _mentioned(digest)[:4] == ["src/in_0.py", "src/out_0.py", "out_0", "helper_fn_0"]
