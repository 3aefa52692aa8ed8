"""``normandy compact`` refuses numbers it could not write back as read (issue 13).

``NaN``, ``Infinity`` and ``-Infinity`` (which Python's ``json`` reads though they are
not JSON), numbers that overflow a float (``1e400``, read as infinity and written back as
``Infinity``) and integers with more digits than the interpreter converts are refused
with exit 2 and one line naming the file, the line and the column; a number inside a
tool call's JSON arguments is refused by ``compact()`` naming the message and the field.
The same text inside a string is only text. The installed script runs in subprocesses
(in parallel); the reader's messages are checked in process too.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from normandy_core.app.cli import CliError, read_source
from tests.cli.conftest import Run, run_cli

LIMIT = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0
#: An integer literal one digit over the limit (5,000 digits where there is no limit).
LONG_INT = "9" * ((LIMIT or 4_999) + 1)

USER = '{"role": "user", "content": "hi"}'


def _array(literal: str) -> str:
    return f'[{USER},\n {{"role": "user", "content": "x", "n": [1, 2.5, {literal}]}}]\n'


def _lines(literal: str) -> str:
    return f'{USER}\n{{"role": "assistant", "content": "ok", "n": {literal}}}\n'


def _tool_arguments(arguments: str) -> str:
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    return json.dumps(messages, indent=1)


def _where(text: str, literal: str) -> str:
    """``line L, column C`` of the last occurrence of ``literal`` in ``text``."""
    pos = text.rindex(literal)
    line = text.count("\n", 0, pos) + 1
    return f"line {line}, column {pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"


def _case(text: str, literal: str, problem: str) -> tuple[str, list[str]]:
    return text, [f"{_where(text, literal)}: {problem}"]


#: name -> (file content, what the one line on stderr must contain besides the file name)
REFUSED: dict[str, tuple[str, list[str]]] = {
    "1e400 in an array": _case(_array("1e400"), "1e400", "the number 1e400 is too large"),
    "-1e400 in an array": _case(_array("-1e400"), "-1e400", "the number -1e400 is too large"),
    "NaN in an array": _case(_array("NaN"), "NaN", "NaN is not a JSON number"),
    "Infinity in an array": _case(_array("Infinity"), "Infinity", "Infinity is not a JSON"),
    "-Infinity in JSON Lines": _case(_lines("-Infinity"), "-Infinity", "-Infinity is not a"),
    "1e999 in JSON Lines": _case(_lines("1e999"), "1e999", "the number 1e999 is too large"),
    "a long integer in an array": _case(
        _array(LONG_INT), LONG_INT, f"an integer of {len(LONG_INT):,} digits, more than"
    ),
    "a long negative integer in JSON Lines": _case(
        _lines("-" + LONG_INT), "-" + LONG_INT, f"an integer of {len(LONG_INT):,} digits"
    ),
    "1e400 in a tool call's arguments": (
        _tool_arguments('{"path": "a", "size": 1e400}'),
        ["line 6 (message 1), field 'tool_calls[0].function.arguments size'", "non-finite"],
    ),
    "NaN in a tool call's arguments": (
        _tool_arguments('{"x": [NaN]}'),
        ["(message 1), field 'tool_calls[0].function.arguments x[0]'", "non-finite number (nan)"],
    ),
}


def _compact(tmp: Path, name: str, content: str) -> tuple[Path, Run]:
    path = tmp / (name.replace(" ", "_").replace("'", "") + ".json")
    path.write_text(content, encoding="utf-8")
    out = tmp / (path.name + ".out")
    return path, run_cli("compact", str(path), "--window", "9000", "-o", str(out))


@pytest.mark.slow
def test_numbers_that_cannot_be_written_back_exit_2_naming_the_place(tmp_path: Path) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = dict(
            zip(
                REFUSED,
                pool.map(lambda n: _compact(tmp_path, n, REFUSED[n][0]), REFUSED),
                strict=True,
            )
        )
    for name, (path, r) in runs.items():
        assert r.code == 2, (name, r)
        assert r.err.startswith(f"normandy compact: {path}: "), (name, r.err)
        assert r.err.count("\n") == 1, (name, r.err)  # one line, no traceback
        for needle in REFUSED[name][1]:
            assert needle in r.err, (name, needle, r.err)
        assert "internal error" not in r.err, name
        assert not Path(str(path) + ".out").exists(), name  # nothing written


@pytest.mark.slow
def test_the_same_text_in_strings_and_numbers_that_round_trip_are_kept(tmp_path: Path) -> None:
    messages = [
        {"role": "user", "content": "NaN, Infinity, -Infinity, 1e400 and " + LONG_INT},
        {"role": "assistant", "content": "ok", "n": [0, -0.0, 1e308, 5e-324, 2**63, 0.1]},
    ]
    if LIMIT:
        messages[1]["widest"] = -(10**LIMIT - 1)  # LIMIT digits: converts, so it is kept
    path = tmp_path / "fine.json"
    path.write_text(json.dumps(messages, indent=2), encoding="utf-8")
    out = tmp_path / "fine.out.json"
    r = run_cli("compact", str(path), "--window", "50000", "-o", str(out))
    assert r.code == 0, r
    assert json.loads(out.read_text(encoding="utf-8")) == messages


@pytest.mark.slow
def test_stdin_is_named_too() -> None:
    text = _lines("NaN")
    r = run_cli("compact", "-", "--window", "9000", stdin=text)
    assert r.code == 2, r
    assert r.err == (
        f"normandy compact: <stdin>: {_where(text, 'NaN')}: NaN is not a JSON number "
        "(it would not be written back as given); refused\n"
    )


# -- the reader in process ------------------------------------------------------------


def _refusal(tmp_path: Path, text: str) -> str:
    path = tmp_path / "in.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CliError) as info:
        read_source(str(path))
    assert info.value.status == 2
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    return message[len(f"{path}: ") :]


@pytest.mark.parametrize("literal", ["1e400", "-1E+400", "1" * 400 + ".5", "NaN", "-Infinity"])
def test_the_reader_names_line_and_column(tmp_path: Path, literal: str) -> None:
    text = (
        '[\n  {"role": "user", "content": "1e400 NaN \\" Infinity"},\n'
        f'  {{"role": "user", "content": "a", "x": {{"y": [0.5, {literal}]}}}}\n]'
    )
    assert _refusal(tmp_path, text).startswith(f"{_where(text, literal)}: ")


def test_the_reader_reports_the_first_refused_number(tmp_path: Path) -> None:
    text = _array("1e400").replace('"hi"', '"hi", "z": -Infinity')
    assert _refusal(tmp_path, text).startswith("line 1, column 41: -Infinity is not")


def test_a_long_integer_is_named_without_printing_it(tmp_path: Path) -> None:
    message = _refusal(tmp_path, _lines(LONG_INT))
    assert LONG_INT[:30] not in message
    assert len(message) < 200


@pytest.fixture
def int_limit() -> Iterator[None]:
    """Restore the interpreter's integer-conversion limit after the test changes it."""
    if not LIMIT:
        pytest.skip("this interpreter has no integer-conversion limit")
    try:
        yield
    finally:
        sys.set_int_max_str_digits(LIMIT)


def test_the_reader_applies_the_interpreters_limit_at_the_time(
    tmp_path: Path, int_limit: None
) -> None:
    sys.set_int_max_str_digits(640)
    message = _refusal(tmp_path, _array("7" * 641))
    assert message.startswith("line 2, column 49: an integer of 641 digits")
    assert "is 640" in message
    path = tmp_path / "ok.json"
    path.write_text(_array("-" + "7" * 640), encoding="utf-8")
    assert read_source(str(path)).data[1]["n"][2] == -int("7" * 640)
