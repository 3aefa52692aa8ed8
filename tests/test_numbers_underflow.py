"""Numbers that underflow a float are refused as those that overflow are (issue 32, case 9b).

``1e400`` was refused, naming the line and column, but ``1e-400`` was read as ``0.0`` and
written back so, silently. A number whose digits are not all zero and that a float
reads as zero is now refused by the file reader naming its line and column, and by
``compact()`` inside a tool call's JSON arguments naming the message and the field, as
an overflowing one is. Every other number is read as the float it spells.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from reliability_counts import UNDERFLOW_LITERALS, UNDERFLOW_PROPERTY

from normandy_core import compact
from normandy_core.app.cli import CliError, read_source
from normandy_core.transcripts.formats import TranscriptError

#: Literals a float reads as zero though they are not: refused.
UNDERFLOWS = UNDERFLOW_LITERALS
#: Literals near the bottom of the float range that a float holds: kept.
KEPT = ("0e-400", "-0.0", "0.000", "5e-324", "1e-320", "4.9e-324", "2.5e-308")


USER = '{"role": "user", "content": "1e-400"}'


def _array(literal: str) -> str:
    return f'[{USER},\n {{"role": "user", "content": "x", "n": [1, {literal}]}}]\n'


def _lines(literal: str) -> str:
    return f'{USER}\n{{"role": "user", "content": "a", "n": {literal}}}\n'


def _where(text: str, literal: str) -> str:
    pos = text.rindex(literal)
    column = pos - text.rfind("\n", 0, pos)
    return f"line {text.count(chr(10), 0, pos) + 1}, column {column}"


def _read(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "in.json"
    path.write_text(text, encoding="utf-8")
    return read_source(str(path))


@pytest.mark.parametrize("literal", KEPT)
def test_numbers_a_float_holds_are_read_as_they_are(tmp_path, literal):
    assert _read(tmp_path, _array(literal)).data[1]["n"][1] == float(literal)


def _chat(arguments: str) -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]


def _responses(arguments: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": arguments},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]


def _refused_by_the_reader(tmp_path: Path, text: str, literal: str) -> None:
    with pytest.raises(CliError) as info:
        _read(tmp_path, text)
    assert info.value.status == 2
    message = str(info.value).split(": ", 1)[1]
    assert message.startswith(f"{_where(text, literal)}: the number ")
    assert "is too small for a float" in message


def _refused_by_compact(messages: list[dict[str, Any]], field: str) -> None:
    with pytest.raises(TranscriptError) as info:
        compact(messages, window=100_000)
    assert (info.value.index, info.value.field) == (1, field)
    assert info.value.problem.startswith("the number ")
    assert "is too small for a float" in info.value.problem


def test_an_underflow_is_refused_where_it_sits(tmp_path):
    """Each underflowing literal in a file's array and JSON Lines (line and column), and in
    the tool arguments of Chat Completions and Responses given to ``compact()`` (message
    and field, where ``1e400`` is refused too)."""
    refused = 0
    for literal in UNDERFLOWS:
        _refused_by_the_reader(tmp_path, _array(literal), literal)
        _refused_by_the_reader(tmp_path, _lines(literal), literal)
        arguments = f'{{"a": {{"b": [0.5, {literal}]}}}}'
        _refused_by_compact(_chat(arguments), "tool_calls[0].function.arguments a.b[1]")
        _refused_by_compact(_responses(arguments), "arguments a.b[1]")
        refused += 4
    assert refused == 4 * len(UNDERFLOW_LITERALS)
    for shape, field in (
        (_chat, "tool_calls[0].function.arguments a.b[1]"),
        (_responses, "arguments a.b[1]"),
    ):
        with pytest.raises(TranscriptError) as over:  # as an overflow is, at the same place
            compact(shape('{"a": {"b": [0.5, 1e400]}}'), window=100_000)
        assert (over.value.index, over.value.field) == (1, field)


@pytest.mark.parametrize("literal", KEPT)
def test_compact_keeps_arguments_a_float_holds(literal):
    result = compact(_chat(f'{{"x": {literal}}}'), window=100_000)
    arguments = result.messages[1]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments)["x"] == float(literal)


_LITERALS = st.builds(
    lambda sign, whole, zeros, digits, exponent: (
        f"{sign}{whole}.{'0' * zeros}{digits}" + (f"e{exponent}" if exponent is not None else "")
    ),
    st.sampled_from(["", "-"]),
    st.sampled_from(["0", "1", "9"]),
    st.integers(0, 400),
    st.from_regex(r"[0-9]{1,6}", fullmatch=True),
    st.none() | st.integers(-700, 400),
)


def test_any_number_is_refused_exactly_when_it_cannot_be_read_as_it_spells(tmp_path):
    tried: list[str] = []

    @settings(max_examples=UNDERFLOW_PROPERTY)
    @given(literal=_LITERALS)
    def read(literal: str) -> None:
        tried.append(literal)
        value = float(literal)
        mantissa = literal.lower().partition("e")[0]
        lost = math.isinf(value) or (value == 0 and any(c in "123456789" for c in mantissa))
        if lost:
            with pytest.raises(CliError, match=re.escape(_where(_array(literal), literal))):
                _read(tmp_path, _array(literal))
            return
        got = _read(tmp_path, _array(literal)).data[1]["n"][1]
        assert got == value and json.loads(json.dumps(got)) == value

    read()
    assert len(tried) >= UNDERFLOW_PROPERTY
