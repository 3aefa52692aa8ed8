"""Numbers that cannot be written back as given are refused, naming the place (issue 13).

A non-finite float (what JSON's ``1e400``, ``NaN`` or ``Infinity`` read as) would come
back as ``Infinity`` or ``NaN``, which is not JSON; an integer with more decimal digits
than the interpreter converts (``sys.get_int_max_str_digits()``) cannot be written at
all. ``compact()`` refuses both as a :class:`TranscriptError` with the message index
and the field; numbers that round-trip, up to the limit exactly, come back unchanged.
The command line's reader is tested in ``tests/cli/test_cli_numbers.py``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from normandy_core import compact
from normandy_core.transcripts.formats import TranscriptError, value_problem

LIMIT = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0
needs_limit = pytest.mark.skipif(not LIMIT, reason="this interpreter converts any integer")


def _anthropic_call(value: Any) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"x": value}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}],
        },
    ]


def _refused(messages: Any, **kwargs: Any) -> TranscriptError:
    with pytest.raises(TranscriptError) as info:
        compact(messages, window=100_000, **kwargs)
    return info.value


@pytest.mark.parametrize("literal", ["1e400", "-1e400", "NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_read_from_json_are_refused(literal: str) -> None:
    messages = json.loads(f'[{{"role": "user", "content": "hi", "x": {literal}}}]')
    exc = _refused(messages)
    assert (exc.index, exc.field) == (0, "x")
    assert "non-finite number" in exc.problem
    assert str(exc).startswith("message 0, field 'x': ")


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_floats_in_a_tool_input_are_refused_with_the_path(value: float) -> None:
    exc = _refused(_anthropic_call({"a": [1, {"b": value}]}))
    assert (exc.index, exc.field) == (1, "content[0].input.x.a[1].b")
    assert repr(value) in exc.problem


def test_a_non_finite_number_in_openai_tool_arguments_is_refused() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"x": 1e400}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    exc = _refused(messages)
    assert exc.index == 1
    assert exc.field is not None and exc.field.startswith("tool_calls[0].function.arguments")
    assert "non-finite number" in exc.problem


def test_a_non_finite_number_in_a_normandy_dump_is_refused() -> None:
    from normandy_core import AgentMemory

    mem = AgentMemory()
    mem.add_message("user", "one")
    data = mem.dump()
    data["entries"][0]["metadata"] = {"score": float("nan")}
    exc = _refused(data)
    assert (exc.index, exc.field) == (0, "metadata.score")


@needs_limit
def test_an_integer_over_the_limit_is_a_transcript_error_not_a_bare_value_error() -> None:
    big = 7 * 10**4_999 + 123_456_789  # 5,000 digits
    exc = _refused([{"role": "user", "content": "hi", "n": big}])
    assert type(exc) is TranscriptError
    assert (exc.index, exc.field) == (0, "n")
    assert f"more than {LIMIT:,} decimal digits" in exc.problem
    exc = _refused(_anthropic_call([0, -big]))
    assert (exc.index, exc.field) == (1, "content[0].input.x[1]")


@needs_limit
@pytest.mark.parametrize("sign", [1, -1])
def test_integers_up_to_the_limit_round_trip_and_one_digit_more_is_refused(sign: int) -> None:
    widest = sign * (10**LIMIT - 1)  # LIMIT digits: the interpreter converts it
    messages = [{"role": "user", "content": "hi", "n": widest}]
    assert compact(messages, window=100_000).messages == messages
    assert json.loads(json.dumps(messages)) == messages
    exc = _refused([{"role": "user", "content": "hi", "n": sign * 10**LIMIT}])
    assert exc.field == "n"


@pytest.fixture
def int_limit() -> Iterator[None]:
    """Restore the interpreter's integer-conversion limit after the test changes it."""
    if not LIMIT:
        pytest.skip("this interpreter has no integer-conversion limit")
    try:
        yield
    finally:
        sys.set_int_max_str_digits(LIMIT)


def test_the_limit_is_the_interpreters_at_the_time_of_the_call(int_limit: None) -> None:
    sys.set_int_max_str_digits(640)  # the smallest limit Python allows
    assert value_problem({"n": 10**640 - 1}) is None
    bad = value_problem({"n": 10**640})
    assert bad is not None and bad[0] == "n" and "more than 640 decimal digits" in bad[1]
    sys.set_int_max_str_digits(0)  # no limit: every integer is written back
    messages = [{"role": "user", "content": "hi", "n": 10**5_000}]
    assert value_problem(messages) is None
    assert compact(messages, window=100_000).messages == messages


def test_numbers_that_round_trip_are_kept() -> None:
    values = [0, -0.0, 1e308, -1e308, 5e-324, 2**63, True, False, None, 0.1]
    messages = _anthropic_call({"values": values})
    assert value_problem(messages) is None
    result = compact(messages, window=100_000)
    assert result.messages == messages
    assert json.loads(json.dumps(result.messages, allow_nan=False)) == messages


def test_value_problem_names_the_path_and_checks_keys() -> None:
    message = {"role": "user", "content": [{"type": "x", "input": {"x": float("inf")}}]}
    assert value_problem(message) == (
        "content[0].input.x",
        "is a non-finite number (inf), which JSON cannot represent; "
        "it would not be written back as given",
    )
    bad = value_problem({"m": {float("nan"): 1}})
    assert bad is not None and bad[0] == "m" and bad[1].startswith("a key is a non-finite")
