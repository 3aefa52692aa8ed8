"""Conversions between Normandy's conversation and the providers' message formats.

Pure functions, no I/O, used by the model clients and by the ``normandy`` command for
transcripts:

- :func:`to_anthropic` / :func:`from_anthropic`: the Anthropic Messages API
  (``system`` apart, ``messages`` of ``user`` and ``assistant`` turns with typed blocks).
- :func:`to_openai` / :func:`from_openai`: the OpenAI Chat Completions API (``system``,
  ``user``, ``assistant`` with ``tool_calls``, and one ``tool`` message per result).
- :func:`detect_format`: tells the two (and Normandy's own dump) apart.

Normandy's canonical shape is Anthropic's: an assistant entry holds its tool uses, and
the results of one batch are one ``user`` entry holding every :class:`ToolResultBlock`
in tool-use order. :func:`from_openai` folds consecutive ``tool`` messages into such an
entry and :func:`to_openai` unfolds it again, so tool pairs round-trip both ways.

Imported transcripts get turn ids: a new turn starts at every user message that is not
only tool results (``turn-1``, ``turn-2``, ...), so turn-aware compactors can tell turns
apart. Bad input raises :class:`TranscriptError` naming the message index and the field.

What a compactor inserted (a marker where history was cut, a summary) opens with a tag of
:data:`INSERTED_TAGS` (``[normandy:marker]``, ``[normandy:summary]``); the readers turn it
back into the entry's metadata, so its identity survives a round trip through a format.

What the OpenAI format cannot carry is dropped by :func:`to_openai` and documented
there: thinking blocks, the ``is_error`` flag of a tool result (the text is kept), and
images inside tool results (sent in a user message right after the tool messages).
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from normandy_core.conversation.entries import (
    Block,
    DocumentBlock,
    Entry,
    ImageBlock,
    OpaqueBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from normandy_core.conversation.memory import AgentMemory
from normandy_core.transcripts.transcript import INSERTED_TAGS, TranscriptError, detect, read

__all__ = [
    "INSERTED_TAGS",
    "MAX_NESTING",
    "TranscriptError",
    "block_to_anthropic",
    "detect_format",
    "from_anthropic",
    "from_openai",
    "to_anthropic",
    "to_openai",
    "value_problem",
]

Format = Literal["anthropic", "openai", "responses", "normandy"]


# -- shared helpers -------------------------------------------------------------------

#: How deeply a message's values may nest (objects and arrays). Real transcripts stay far
#: below; deeper input is refused rather than risking a RecursionError while counting
#: tokens or writing the result.
MAX_NESTING = 200

_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate_problem(text: str) -> str | None:
    m = _SURROGATE.search(text)
    if m is None:
        return None
    return (
        f"holds a lone surrogate (U+{ord(m.group()):04X} at character {m.start()}), which is "
        "not Unicode text and cannot be written as UTF-8 or sent to a provider"
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


def value_problem(value: Any, limit: int = MAX_NESTING) -> tuple[str, str] | None:
    """``(field, problem)`` for the first part of ``value`` no transcript may hold, or ``None``.

    Refused: nesting deeper than ``limit`` (objects and arrays), strings (or object
    keys) with a lone surrogate, as a ``\\udXXX`` JSON escape gives, and numbers that
    cannot be written back as given: non-finite floats (``inf``, ``nan``; what JSON's
    ``1e400`` or ``NaN`` read as) and integers with more digits than the interpreter
    converts. Iterative, so deep input cannot exhaust the stack; ``field`` is a path such
    as ``content[0].input``.
    """
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        v, path, depth = stack.pop()
        if isinstance(v, str):
            problem = _surrogate_problem(v)
            if problem is not None:
                return path, problem
            continue
        children: list[tuple[str, Any]]
        if isinstance(v, Mapping):
            children = []
            for k, x in v.items():
                if isinstance(k, str) and (problem := _surrogate_problem(k)) is not None:
                    return path, f"a key {problem}"
                if isinstance(k, (int, float)) and (problem := _number_problem(k)) is not None:
                    return path, f"a key {problem}"
                children.append((f"{path}.{k}" if path else str(k), x))
        elif isinstance(v, (list, tuple)):
            children = [(f"{path}[{i}]", x) for i, x in enumerate(v)]
        else:
            if (
                (isinstance(v, float) and not math.isfinite(v))
                or (isinstance(v, int) and v.bit_length() > _ALWAYS_CONVERTED_BITS)
            ) and (problem := _number_problem(v)) is not None:
                return path, problem
            continue
        if depth >= limit and children:
            where = re.match(r"[^\[.]*(?:[.\[][^\[.]*){0,2}", path)
            short = where.group() if where else path
            return short, f"nested deeper than {limit} levels (objects and arrays)"
        stack.extend((x, p, depth + 1) for p, x in reversed(children))
    return None


def _entries(entries: Iterable[Entry] | AgentMemory) -> list[Entry]:
    return entries.entries() if isinstance(entries, AgentMemory) else list(entries)


# -- Anthropic ------------------------------------------------------------------------


def block_to_anthropic(block: Block) -> dict[str, Any]:
    """One content block in the Anthropic Messages wire format."""
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ThinkingBlock):
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    if isinstance(block, RedactedThinkingBlock):
        return {"type": "redacted_thinking", "data": block.data}
    if isinstance(block, ToolUseBlock):
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": dict(block.input)}
    if isinstance(block, ToolResultBlock):
        out: dict[str, Any] = {"type": "tool_result", "tool_use_id": block.tool_use_id}
        if isinstance(block.content, str):
            out["content"] = block.content
        else:
            out["content"] = [block_to_anthropic(p) for p in block.content]
        if block.is_error:
            out["is_error"] = True
        return out
    if isinstance(block, ImageBlock):
        return {"type": "image", "source": dict(block.source)}
    if isinstance(block, OpaqueBlock):
        return dict(block.data)
    doc: dict[str, Any] = {"type": "document", "source": dict(block.source)}
    if block.title is not None:
        doc["title"] = block.title
    return doc


def _nonempty(block: dict[str, Any]) -> bool:
    return not (block["type"] == "text" and not block["text"])


def to_anthropic(
    entries: Iterable[Entry] | AgentMemory,
    *,
    system: str | None = None,
    strip_thinking: bool = False,
) -> tuple[str | None, list[dict[str, Any]]]:
    """The entries as Anthropic ``(system, messages)``.

    ``system`` entries (and the ``system`` argument, first) are joined into the system
    text; ``None`` when there is none. Consecutive messages of one role are merged into
    one message (the API would merge them anyway), with tool results first in a user
    message, as the API requires. ``tool`` entries are sent as user messages. Empty text
    blocks are left out. Thinking blocks are replayed with their signatures exactly as
    stored unless ``strip_thinking`` is set (for a request with thinking disabled).
    """
    system_parts = [system] if system else []
    messages: list[dict[str, Any]] = []
    for e in _entries(entries):
        if e.role == "system":
            text = e.text()
            if text:
                system_parts.append(text)
            continue
        role = "assistant" if e.role == "assistant" else "user"
        if isinstance(e.content, str):
            blocks = [{"type": "text", "text": e.content}] if e.content else []
        else:
            blocks = [
                block_to_anthropic(b)
                for b in e.content
                if not (strip_thinking and isinstance(b, (ThinkingBlock, RedactedThinkingBlock)))
            ]
            blocks = [b for b in blocks if _nonempty(b)]
        if not blocks:
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    for m in messages:
        if m["role"] == "user" and any(b["type"] == "tool_result" for b in m["content"]):
            m["content"].sort(key=lambda b: b["type"] != "tool_result")  # stable
        if len(m["content"]) == 1 and m["content"][0]["type"] == "text":
            m["content"] = m["content"][0]["text"]
    return ("\n\n".join(system_parts) if system_parts else None), messages


def from_anthropic(
    messages: Sequence[Any],
    system: str | Sequence[Any] | None = None,
    *,
    allow_pending: bool = True,
) -> AgentMemory:
    """A memory from Anthropic Messages ``messages`` (and ``system``, text or text blocks).

    Each message becomes one entry (text content stays text), except that a text block
    opening with an :data:`INSERTED_TAGS` tag in a user message (a marker or summary the
    API would have joined with its neighbours) becomes an entry of its own, with the
    tag's metadata key set; the system prompt, when given, becomes a leading ``system``
    entry. Blocks the conversation does not interpret (server tools, MCP, search
    results, ``compaction``...) are carried as :class:`~normandy_core.OpaqueBlock`.
    Tool pairing is checked: a tool result must answer a tool use of the message before
    it, and every tool use needs its results in the next message (``allow_pending``
    accepts unanswered uses in the last message). Raises :class:`TranscriptError`
    naming the message index and field at fault. See :mod:`normandy_core.transcripts.transcript`.
    """
    return read(messages, "anthropic", system=system, allow_pending=allow_pending).memory


# -- OpenAI ---------------------------------------------------------------------------


def _image_url(source: Mapping[str, Any]) -> str:
    if source.get("type") == "base64":
        return f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    return str(source.get("url", ""))


def _openai_part(block: Block) -> dict[str, Any] | None:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text} if block.text else None
    if isinstance(block, ImageBlock):
        return {"type": "image_url", "image_url": {"url": _image_url(block.source)}}
    if isinstance(block, DocumentBlock):
        src = block.source
        if src.get("type") == "text":
            return {"type": "text", "text": str(src.get("data", ""))}
        file: dict[str, Any] = {
            "file_data": f"data:{src.get('media_type', 'application/pdf')};base64,"
            f"{src.get('data', '')}"
        }
        if src.get("type") == "url":
            file = {"file_data": str(src.get("url", ""))}
        file["filename"] = block.title or "document.pdf"
        return {"type": "file", "file": file}
    return None


def to_openai(
    entries: Iterable[Entry] | AgentMemory, *, system: str | None = None
) -> list[dict[str, Any]]:
    """The entries as OpenAI Chat Completions ``messages``.

    ``system`` (when given) and ``system`` entries become system messages. An assistant
    entry becomes one message with its text as ``content`` and its tool uses as
    ``tool_calls`` (arguments JSON-encoded). Each tool result becomes a ``tool`` message,
    in order, before any other content of its entry, which follows as a user message.
    Not representable, hence dropped: thinking blocks (Chat Completions does not replay
    reasoning), ``is_error`` (the result text is kept), opaque blocks of another format
    (an Anthropic server tool round, a Responses item), and images or files inside tool
    results, which are sent in a user message right after the tool messages.
    """
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    # Non-text parts of tool-result entries wait until the run of tool messages ends: a
    # user message between two tool messages would cut the batch from its assistant.
    held: list[dict[str, Any]] = []

    def flush() -> None:
        if held:
            if all(p["type"] == "text" for p in held):
                out.append({"role": "user", "content": "\n".join(p["text"] for p in held)})
            else:
                out.append({"role": "user", "content": list(held)})
            held.clear()

    for e in _entries(entries):
        if isinstance(e.content, str) or not e.tool_results or e.role == "assistant":
            flush()
        if e.role == "system":
            out.append({"role": "system", "content": e.text()})
            continue
        if isinstance(e.content, str):
            if e.role == "assistant":
                out.append({"role": "assistant", "content": e.content})
            else:
                out.append({"role": "user", "content": e.content})
            continue
        if e.role == "assistant":
            texts = [b.text for b in e.content if isinstance(b, TextBlock) and b.text]
            # Several text blocks stay several parts: joined, they would not count (or read)
            # the same after a round trip.
            content: Any = (
                [{"type": "text", "text": t} for t in texts]
                if len(texts) > 1
                else (texts[0] if texts else None)
            )
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            uses = e.tool_uses
            if uses:
                msg["tool_calls"] = [
                    {
                        "id": u.id,
                        "type": "function",
                        "function": {
                            "name": u.name,
                            "arguments": json.dumps(u.input, ensure_ascii=False),
                        },
                    }
                    for u in uses
                ]
            if msg["content"] is None and not uses:
                msg["content"] = ""
            out.append(msg)
            continue
        if not e.tool_results:
            # A user message given as parts comes back as the same parts.
            parts = [p for p in (_openai_part(b) for b in e.content) if p is not None]
            out.append({"role": "user", "content": parts or ""})
            continue
        for b in e.content:
            if isinstance(b, ToolResultBlock):
                out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()})
                if not isinstance(b.content, str):
                    for p in b.content:
                        if not isinstance(p, TextBlock):
                            part = _openai_part(p)
                            if part is not None:
                                held.append(part)
            else:
                part = _openai_part(b)
                if part is not None:
                    held.append(part)
        if not e.tool_results:
            flush()
    flush()
    return out


def from_openai(messages: Sequence[Any], *, allow_pending: bool = True) -> AgentMemory:
    """A memory from OpenAI Chat Completions ``messages``.

    ``system`` and ``developer`` messages become ``system`` entries; an assistant message
    becomes one entry with its text and one :class:`ToolUseBlock` per tool call (the
    arguments must be a JSON object; a custom tool's text input is ``{"input": text}``);
    consecutive ``tool`` messages become one ``user`` entry holding their
    :class:`ToolResultBlock` s in order. A user message whose text opens with an
    :data:`INSERTED_TAGS` tag gets the tag's metadata key. Pairing is checked as in
    :func:`from_anthropic`. Raises :class:`TranscriptError` naming the index and field.
    """
    return read(messages, "openai", allow_pending=allow_pending).memory


# -- detection ------------------------------------------------------------------------


def detect_format(data: Any) -> Format:
    """Which format ``data`` is in: ``"normandy"`` (a memory dump), ``"openai"`` (Chat
    Completions), ``"anthropic"`` or ``"responses"`` (the OpenAI Responses API).

    A dict with ``format: normandy.memory`` is a Normandy dump; a dict with ``messages``
    is looked into (with ``system`` beside it, Anthropic). A list is judged by evidence
    anywhere in it (:func:`normandy_core.transcripts.transcript.detect`); plain text-only lists read
    the same in every format and are reported as ``"openai"``. Raises
    :class:`TranscriptError` otherwise.
    """
    if isinstance(data, Mapping):
        if data.get("format") == "normandy.memory":
            return "normandy"
        if "messages" in data:
            if "system" in data:
                return "anthropic"
            return detect_format(data["messages"])
        raise TranscriptError(None, None, "an object must be a Normandy dump or hold 'messages'")
    if isinstance(data, (str, bytes)) or not isinstance(data, (list, tuple)):
        raise TranscriptError(None, None, f"expected a list of messages, got {type(data).__name__}")
    return detect(data)
