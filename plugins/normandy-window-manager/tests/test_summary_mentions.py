"""The extractive digest lists the first 200 distinct paths, ids and URLs of each kind,
in the order found, as evidence quoted verbatim."""

from __future__ import annotations

import json

from normandy_core import Entry, ToolResultBlock, ToolUseBlock, get_counter
from normandy_window_manager.summarize import extractive_summary


def _round(i: int) -> list[Entry]:
    use = ToolUseBlock(id=f"toolu_{i}", name="read_file", input={"path": f"src/in_{i}.py"})
    result = ToolResultBlock(
        tool_use_id=f"toolu_{i}",
        content=f"see src/out_{i}.py and helper_fn_{i} at https://docs.example/p{i}.",
    )
    return [
        Entry(id=f"a{i}", role="assistant", content=(use,)),
        Entry(id=f"r{i}", role="user", content=(result,)),
    ]


def _listed(digest: str, label: str) -> list[str]:
    """The items of the digest's ``- label: "...", "..."`` line (JSON strings: quoted)."""
    (line,) = [ln for ln in digest.splitlines() if ln.startswith(f"- {label}: ")]
    listed = json.loads(f"[{line.removeprefix(f'- {label}: ')}]")
    assert all(isinstance(name, str) for name in listed)
    return listed


def test_first_200_of_each_kind_in_order_when_more_are_present() -> None:
    dropped = [e for i in range(150) for e in _round(i)]
    digest = extractive_summary(dropped, 1_000_000, get_counter("estimate"))
    paths = [p for i in range(150) for p in (f"src/in_{i}.py", f"src/out_{i}.py")]
    assert _listed(digest, "paths") == paths[:200]
    # the tool input's path stem, then the output's, then the helper
    ids = [n for i in range(150) for n in (f"in_{i}", f"out_{i}", f"helper_fn_{i}")]
    assert _listed(digest, "ids") == ids[:200]
    # a sentence's full stop is not part of its URL
    assert _listed(digest, "URLs") == [f"https://docs.example/p{i}" for i in range(150)]


def test_all_listed_below_the_cap() -> None:
    dropped = [e for i in range(10) for e in _round(i)]
    digest = extractive_summary(dropped, 1_000_000, get_counter("estimate"))
    assert len(_listed(digest, "paths")) == 20
    assert _listed(digest, "paths")[:2] == ["src/in_0.py", "src/out_0.py"]
    assert _listed(digest, "ids")[:3] == ["in_0", "out_0", "helper_fn_0"]
