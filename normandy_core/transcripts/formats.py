"""What every wire format shares: its name, the error a bad transcript raises, the values
no message may hold, and the tags that mark what a compactor inserted.

The formats themselves live one module each, reader and writer together:
:mod:`~normandy_core.transcripts.chat` (OpenAI Chat Completions),
:mod:`~normandy_core.transcripts.responses` (the OpenAI Responses API) and
:mod:`~normandy_core.transcripts.anthropic` (Anthropic Messages);
:mod:`~normandy_core.transcripts.detection` tells them apart and
:mod:`~normandy_core.transcripts.transcript` reads and writes any of them.

Bad input raises :class:`TranscriptError` naming the message index and the field.

What a compactor inserted (a marker where history was cut, a summary) opens with a tag of
:data:`INSERTED_TAGS` (``[normandy:marker]``, ``[normandy:summary]``); the readers turn it
back into the entry's metadata, so its identity survives a round trip through a format.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from normandy_core.conversation.keys import MARKER_KEY, SUMMARY_KEY

__all__ = [
    "FORMAT_NAMES",
    "INSERTED_TAGS",
    "MAX_NESTING",
    "Format",
    "TranscriptError",
    "WireFormat",
    "as_mapping",
    "dumped",
    "UnderflowedFloat",
    "check_values",
    "inserted_key",
    "number_literal_problem",
    "read_json_float",
    "value_problem",
]

#: The provider formats a transcript is read from and written back in.
WireFormat = Literal["openai", "anthropic", "responses"]
#: What :func:`~normandy_core.transcripts.detection.detect_format` reports: a provider
#: format, or Normandy's own memory dump.
Format = Literal["anthropic", "openai", "responses", "normandy"]

#: Each provider format by the name its errors give.
FORMAT_NAMES: dict[str, str] = {
    "openai": "OpenAI Chat Completions",
    "anthropic": "Anthropic Messages",
    "responses": "OpenAI Responses",
}


class TranscriptError(ValueError):
    """A transcript that cannot be read; the message names the message index and field.

    ``index`` is the position of the message at fault (``None`` for the whole input) and
    ``field`` the path inside it in the input's own vocabulary, such as
    ``content[2].tool_use_id`` (Anthropic), ``tool_calls[0].id`` (Chat Completions) or
    ``call_id`` (Responses).
    """

    def __init__(self, index: int | None, field: str | None, problem: str) -> None:
        self.index = index
        self.field = field
        self.problem = problem
        where = "transcript" if index is None else f"message {index}"
        if field:
            where += f", field {field!r}"
        super().__init__(f"{where}: {problem}")


def dumped(obj: Any) -> Any:
    """``obj``, or an SDK object's JSON dump: one conversion a caller can share between
    the checks that only read a message."""
    if isinstance(obj, Mapping):
        return obj
    dump = getattr(obj, "model_dump", None)  # SDK objects (pydantic models)
    if callable(dump):
        data = dump(mode="json", exclude_none=True)
        if isinstance(data, Mapping):
            return data
    return obj


def as_mapping(obj: Any, index: int | None, field: str | None) -> Mapping[str, Any]:
    """``obj`` as a mapping: itself, or an SDK object's JSON dump."""
    data = dumped(obj)
    if isinstance(data, Mapping):
        return data
    raise TranscriptError(index, field, f"expected an object, got {type(obj).__name__}")


# -- the tags of inserted entries --------------------------------------------------------

#: Tags opening the text of a message a compactor inserted, and the metadata key of each.
INSERTED_TAGS: dict[str, str] = {
    "[normandy:marker]": MARKER_KEY,
    "[normandy:summary]": SUMMARY_KEY,
}


def inserted_key(text: str) -> str | None:
    """The metadata key of the :data:`INSERTED_TAGS` tag ``text`` opens with, or ``None``."""
    if not text.startswith("[normandy:"):
        return None
    for tag, key in INSERTED_TAGS.items():
        if text.startswith(tag):
            return key
    return None


# -- values no transcript may hold -------------------------------------------------------

#: How deeply a message's values may nest (objects and arrays). Real transcripts stay far
#: below; deeper input is refused rather than risking a RecursionError while counting
#: tokens or writing the result.
MAX_NESTING = 200

_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate_problem(text: str) -> str | None:
    found = _SURROGATE.search(text)
    if found is None:
        return None
    return (
        f"holds a lone surrogate (U+{ord(found.group()):04X} at character {found.start()}), "
        "which is not Unicode text and cannot be written as UTF-8 or sent to a provider"
    )


#: Integers of at most this many bits convert to text under any limit the interpreter
#: allows (at least 640 digits, ``sys.int_info.str_digits_check_threshold``; and
#: 2**(3d) < 10**d), so only wider ones are looked at closely.
_ALWAYS_CONVERTED_BITS = 3 * getattr(sys.int_info, "str_digits_check_threshold", 640)


def _number_problem(value: int | float) -> str | None:
    """Why ``value`` cannot be written back as the same JSON number, or ``None``.

    A non-finite float has no JSON form (``json.dumps`` writes ``Infinity``, ``NaN``), and
    an integer with more decimal digits than the interpreter converts
    (``sys.get_int_max_str_digits()``) cannot be written at all. The digits are judged
    from ``bit_length`` (and one comparison near the limit), never by ``str()``.
    """
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return (
            f"is a non-finite number ({value!r}), which JSON cannot represent; "
            "it would not be written back as given"
        )
    max_digits = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0
    bits = value.bit_length()
    # 2**(3d) < 10**d <= 2**(4d - 1): up to 3d bits an integer has at most d digits, past
    # 4d bits more; in between, one comparison decides.
    if max_digits <= 0 or bits <= 3 * max_digits:
        return None
    if bits <= 4 * max_digits and abs(value) < 10**max_digits:
        return None
    return (
        f"is an integer of more than {max_digits:,} decimal digits (about "
        f"{int(bits * math.log10(2)):,}), over this interpreter's limit "
        "(sys.get_int_max_str_digits()); it cannot be written back"
    )


#: A digit that makes a number's digits (before any exponent) not all zero.
_NONZERO_DIGIT = re.compile("[1-9]")


def _float_literal_problem(literal: str, value: float) -> str | None:
    """Why the float literal ``literal``, read as ``value``, cannot be written back as a
    number of the same value: it overflows (infinity), or underflows (zero from digits
    that are not all zero). ``None`` when it can."""
    if math.isfinite(value) and (value != 0 or not _NONZERO_DIGIT.search(_mantissa(literal))):
        return None
    shown = literal if len(literal) <= 24 else f"{literal[:12]}...{literal[-6:]}"
    if value != 0:
        return (
            f"the number {shown} is too large for a float (it would be written back as "
            "Infinity, which is not JSON); refused"
        )
    return (
        f"the number {shown} is too small for a float (it would be written back as "
        f"{value!r}); refused"
    )


def _mantissa(literal: str) -> str:
    """A number literal's digits before its exponent."""
    return literal.lower().partition("e")[0]


def number_literal_problem(literal: str) -> str | None:
    """Why a JSON number ``literal`` cannot be written back as given, or ``None``.

    Refused: ``NaN``, ``Infinity`` and ``-Infinity`` (which Python's ``json`` reads though
    they are not JSON), a float that overflows (``1e400``, read as infinity) or
    underflows (``1e-400``, whose digits are not all zero, read as zero), and an integer
    with more digits than the interpreter converts (``sys.get_int_max_str_digits()``).
    """
    if literal in ("NaN", "Infinity", "-Infinity"):
        return f"{literal} is not a JSON number (it would not be written back as given); refused"
    if any(c in literal for c in ".eE"):
        return _float_literal_problem(literal, float(literal))
    limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0
    digits = len(literal.lstrip("-"))
    if not limit or digits <= limit:
        return None
    return (
        f"an integer of {digits:,} digits, more than this interpreter converts "
        f"(sys.get_int_max_str_digits() is {limit:,}); refused"
    )


class UnderflowedFloat(float):
    """Zero read from a JSON number whose digits are not all zero (``1e-400``), by
    :func:`read_json_float`: it remembers its ``literal``, so that :func:`value_problem`
    refuses it where it sits, as it refuses the infinity ``1e400`` reads as."""

    literal: str

    def problem(self) -> str:
        """Why it is refused, naming the number as it was written."""
        return _float_literal_problem(self.literal, float(self)) or "underflowed"


def read_json_float(literal: str) -> float:
    """The float a JSON number ``literal`` spells, for ``json.loads(parse_float=...)``; an
    :class:`UnderflowedFloat` when a float reads it as zero though its digits are not all
    zero (what the decoder would otherwise turn into ``0.0`` without a word)."""
    value = float(literal)
    if value != 0 or not _NONZERO_DIGIT.search(_mantissa(literal)):
        return value
    zero = UnderflowedFloat(value)
    zero.literal = literal
    return zero


def value_problem(value: Any, limit: int = MAX_NESTING) -> tuple[str, str] | None:
    """``(field, problem)`` for the first part of ``value`` no transcript may hold, or ``None``.

    Refused: nesting deeper than ``limit`` (objects and arrays), strings (or object
    keys) with a lone surrogate, as a ``\\udXXX`` JSON escape gives, and numbers that
    cannot be written back as given: non-finite floats (``inf``, ``nan``; what JSON's
    ``1e400`` or ``NaN`` read as), zeros that :func:`read_json_float` read from digits
    that are not all zero (``1e-400``; a float made any other way cannot be told from
    zero) and integers with more digits than the interpreter converts. Iterative, so
    deep input cannot exhaust the stack; ``field`` is a path such as
    ``content[0].input``.
    """
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, str):
            problem = _surrogate_problem(node)
            if problem is not None:
                return path, problem
            continue
        children: list[tuple[str, Any]]
        if isinstance(node, Mapping):
            children = []
            for key, child in node.items():
                if isinstance(key, str) and (problem := _surrogate_problem(key)) is not None:
                    return path, f"a key {problem}"
                if isinstance(key, (int, float)) and (problem := _number_problem(key)) is not None:
                    return path, f"a key {problem}"
                children.append((f"{path}.{key}" if path else str(key), child))
        elif isinstance(node, (list, tuple)):
            children = [(f"{path}[{i}]", child) for i, child in enumerate(node)]
        else:
            if isinstance(node, UnderflowedFloat):
                return path, node.problem()
            if (
                (isinstance(node, float) and not math.isfinite(node))
                or (isinstance(node, int) and node.bit_length() > _ALWAYS_CONVERTED_BITS)
            ) and (problem := _number_problem(node)) is not None:
                return path, problem
            continue
        if depth >= limit and children:
            where = re.match(r"[^\[.]*(?:[.\[][^\[.]*){0,2}", path)
            short = where.group() if where else path
            return short, f"nested deeper than {limit} levels (objects and arrays)"
        stack.extend((child, child_path, depth + 1) for child_path, child in reversed(children))
    return None


def check_values(messages: Sequence[Any], start: int = 0) -> None:
    """Refuse deep nesting, lone surrogates and numbers that cannot be written back,
    naming the message (numbered from ``start``) and the field."""
    for i, raw in enumerate(messages, start):
        bad = value_problem(dumped(raw))  # not an object: the readers name what is wrong
        if bad is not None:
            raise TranscriptError(i, bad[0] or None, bad[1])
