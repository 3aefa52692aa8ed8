"""``normandy compact`` writes JSON in the layout it read (issue 33 item 8): single-line
JSON stays on one line, an indented document keeps its indent unit, JSON Lines stays
JSON Lines. It used to indent every JSON document by two spaces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from normandy_core.app.cli import EXIT_OK, main
from normandy_core.transcripts.formats import MAX_NESTING
from normandy_core.transcripts.jsonio import read_source

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
indents = st.sampled_from([None, 0, 1, 2, 4, "\t"])


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=json_values, indent=indents, trailing=st.booleans())
def test_any_json_value_is_written_back_in_the_layout_it_was_read_in(
    tmp_path: Path, value: Any, indent: int | str | None, trailing: bool
) -> None:
    path = tmp_path / "in.json"
    path.write_text(json.dumps(value, indent=indent) + ("\n" if trailing else ""), "utf-8")
    src = read_source(str(path), max_nesting=MAX_NESTING)
    assert src.kind == "json"
    written = src.render(src.data)
    assert written == json.dumps(value, indent=indent, ensure_ascii=False) + "\n"
    if indent is None:  # single-line in, single-line out
        assert written.count("\n") == 1


CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi."},
    {"role": "assistant", "content": "Hello."},
]


@pytest.mark.parametrize(
    "text",
    [
        json.dumps(CHAT) + "\n",
        json.dumps(CHAT, indent=4) + "\n",
        json.dumps(CHAT, indent="\t"),
        "".join(json.dumps(m) + "\n" for m in CHAT),
    ],
    ids=["single-line", "indent-4", "tabs", "jsonl"],
)
def test_normandy_compact_keeps_the_layout_of_its_input(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    src, out = tmp_path / "in.json", tmp_path / "out.json"
    src.write_text(text, "utf-8")
    status = main(["compact", str(src), "-o", str(out), "--compactor", "noop"])
    assert status == EXIT_OK, capsys.readouterr().err
    expected = text if text.endswith("\n") else text + "\n"
    assert out.read_text("utf-8") == expected
