"""The transcript file reader: one JSON document or JSON Lines, each message's line kept.

:func:`read_source` reads a file (or stdin) and refuses, naming the file, line and column,
what it could not write back as given: text that is not UTF-8 or not JSON, ``NaN`` and
``Infinity``, a float that overflows or underflows, an integer longer than the interpreter
converts (the numbers :func:`~normandy_core.transcripts.formats.number_literal_problem`
refuses), and JSON nested too deep to decode. A refusal is a :class:`JsonInputError`.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from normandy_core.errors import NormandyError
from normandy_core.transcripts.formats import number_literal_problem

__all__ = ["JsonInputError", "JsonSource", "read_source"]


class JsonInputError(NormandyError, ValueError):
    """A transcript file the reader refuses; the message names the file and, when it can,
    the line and column at fault."""


class JsonSource:
    """A transcript read from a file or stdin, remembering where each message was and
    the layout it was written in."""

    def __init__(
        self,
        name: str,
        data: Any,
        kind: str,
        lines: list[int] | None,
        indent: str | None = None,
    ) -> None:
        self.name = name
        self.data = data
        self.kind = kind  # "json" or "jsonl"
        self.lines = lines  # line number of each top-level message, when known
        #: A JSON document's indent unit (``None``: it was on one line).
        self.indent = indent

    def render(self, data: Any) -> str:
        """``data`` in the layout this source was read in: JSON Lines one message per
        line; a JSON document on one line, or indented with the same unit."""
        if self.kind == "jsonl":
            items = data if isinstance(data, list) else [data]
            return "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in items)
        return json.dumps(data, ensure_ascii=False, indent=self.indent) + "\n"

    def where(self, index: int | None) -> str:
        """``FILE: line L (message i)`` for a message index."""
        if index is None:
            return self.name
        if self.lines is not None and 0 <= index < len(self.lines):
            return f"{self.name}: line {self.lines[index]} (message {index})"
        return f"{self.name}: message {index}"


def read_source(path: str, *, max_nesting: int) -> JsonSource:
    """Read a JSON document or JSON Lines from ``path`` (``-``: stdin).

    ``max_nesting`` is the depth a refusal names when the text nests too deep to decode:
    the transcripts' own limit, so that both refusals speak of the same number.
    """
    name = "<stdin>" if path == "-" else path
    text = _read_text(path, name)
    try:
        data = _decode(text, name=name, line_offset=0, max_nesting=max_nesting)
    except json.JSONDecodeError as exc:
        first = text.lstrip().splitlines()[0] if text.strip() else ""
        if exc.msg == "Extra data" or (_is_object(first) and "\n" in text.strip()):
            return _read_jsonl(name, text, max_nesting)
        raise JsonInputError(
            f"{name}: line {exc.lineno}, column {exc.colno}: not valid JSON: {exc.msg}"
        ) from exc
    lines = _array_lines(text) if isinstance(data, list) else None
    return JsonSource(name, data, "json", lines, _indent_unit(text))


def _indent_unit(text: str) -> str | None:
    """The indent unit of a JSON document: ``None`` when it is on one line, else the
    leading whitespace of its second line (one level in; ``""`` for ``indent=0``)."""
    lines = text.strip().splitlines()
    if len(lines) < 2:
        return None
    second = lines[1]
    return second[: len(second) - len(second.lstrip())]


def _read_text(path: str, name: str) -> str:
    """The text at ``path`` (``-``: stdin), decoded from UTF-8 (a BOM dropped); not blank."""
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise JsonInputError(f"{name}: cannot read: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise JsonInputError(f"{name}: line {line}: not UTF-8 text") from exc
    if not text.strip():
        raise JsonInputError(f"{name}: empty input; expected a JSON array or JSON Lines")
    return text


def _read_jsonl(name: str, text: str, max_nesting: int) -> JsonSource:
    """``text`` as JSON Lines: one object per line, blank lines skipped."""
    items: list[Any] = []
    lines: list[int] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = _decode(line, name=name, line_offset=number - 1, max_nesting=max_nesting)
        except json.JSONDecodeError as exc:
            raise JsonInputError(
                f"{name}: line {number}, column {exc.colno}: not valid JSON Lines: {exc.msg}"
            ) from exc
        if not isinstance(item, dict):
            raise JsonInputError(
                f"{name}: line {number}: expected a JSON object per line, got {type(item).__name__}"
            )
        items.append(item)
        lines.append(number)
    if len(items) == 1 and items[0].get("format") == "normandy.memory":
        return JsonSource(name, items[0], "jsonl", None)
    return JsonSource(name, items, "jsonl", lines)


def _array_lines(text: str) -> list[int] | None:
    """Line numbers of the elements of a top-level JSON array (``None`` if not an array).

    One pass: the newlines are counted from the previous element's start, never from
    the top of the text again (counting from the top made reading quadratic).
    """
    decoder = json.JSONDecoder()
    position = len(text) - len(text.lstrip())
    if not text.startswith("[", position):
        return None
    position += 1
    lines: list[int] = []
    end = len(text)
    line, counted = 1, 0  # ``line`` is the line of position ``counted``
    while True:
        while position < end and text[position] in " \t\r\n,":
            position += 1
        if position >= end or text[position] == "]":
            return lines
        line += text.count("\n", counted, position)
        counted = position
        lines.append(line)
        try:
            _, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return None


# -- numbers the reader refuses -----------------------------------------------------


class _NumberRefused(Exception):
    """Raised by the reader's decoder on a number it will not read (see :data:`_DECODER`)."""


def _refuse_constant(literal: str) -> Any:
    raise _NumberRefused(literal)


def _exact_float(literal: str) -> float:
    if number_literal_problem(literal) is not None:
        raise _NumberRefused(literal)
    return float(literal)


#: The reader's JSON decoder: ``NaN``, ``Infinity`` and ``-Infinity`` (which ``json``
#: accepts though they are not JSON) and numbers that overflow a float (``1e400``) or
#: underflow it (``1e-400``) are refused, since they would be written back as
#: ``Infinity``, ``NaN`` or ``0.0``; an integer with more digits than
#: ``sys.get_int_max_str_digits()`` makes the decoder itself raise ``ValueError``.
#: :func:`_bad_number` then finds the literal's line and column.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_exact_float)


def _decode(text: str, *, name: str, line_offset: int, max_nesting: int) -> Any:
    """``text`` decoded by :data:`_DECODER`.

    A refused number or a nesting too deep to decode is a :class:`JsonInputError`
    naming its line (``line_offset`` lines into the file) and column; a syntax error
    stays a ``json.JSONDecodeError``, for the caller to word (JSON or JSON Lines).
    """
    try:
        return _DECODER.decode(text)
    except RecursionError:
        raise JsonInputError(_too_deep(name, text, line_offset, max_nesting)) from None
    except json.JSONDecodeError:
        raise
    except (_NumberRefused, ValueError) as exc:
        raise JsonInputError(_bad_number(name, text, line_offset, exc)) from None


def _is_object(line: str) -> bool:
    try:
        return isinstance(_DECODER.decode(line), dict)
    except (ValueError, RecursionError, _NumberRefused):
        return False


def _line_and_column(text: str, position: int) -> tuple[int, int]:
    """The 1-based line and column of ``position`` in ``text``."""
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    return line, column


_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _too_deep(name: str, text: str, line_offset: int, max_nesting: int) -> str:
    """``FILE: line L, column C: ...`` where ``text`` first nests past ``max_nesting``."""
    depth = 0
    for match in _JSON_TOKEN.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > max_nesting:
                line, column = _line_and_column(text, match.start())
                return (
                    f"{name}: line {line + line_offset}, column {column}: JSON nested deeper "
                    f"than {max_nesting} levels (objects and arrays); refused"
                )
        elif token in "]}":
            depth -= 1
    return f"{name}: JSON nested too deeply to read; refused"


#: A JSON string (skipped whole, so digits inside strings are never taken for numbers)
#: or a number, including the non-JSON constants the ``json`` module reads.
_JSON_NUMBER = re.compile(
    r'"[^"\\]*(?:\\.[^"\\]*)*"'
    r"|-?Infinity|NaN|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
)


def _bad_number(name: str, text: str, line_offset: int, exc: Exception) -> str:
    """``FILE: line L, column C: ...`` for the first number in ``text`` the reader refuses.

    Called once the decoder refused a number: everything before it is valid JSON, so the
    first refused literal found scanning from the top is the one.
    """
    for match in _JSON_NUMBER.finditer(text):
        literal = match.group()
        if literal.startswith('"'):
            continue
        problem = number_literal_problem(literal)
        if problem is not None:
            line, column = _line_and_column(text, match.start())
            return f"{name}: line {line + line_offset}, column {column}: {problem}"
    return f"{name}: not readable as JSON: {exc}"
