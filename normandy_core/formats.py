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

import base64
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, cast

from pydantic import BaseModel, ValidationError

from normandy_core.memory import (
    AgentMemory,
    Block,
    DocumentBlock,
    Entry,
    ImageBlock,
    OpaqueBlock,
    RedactedThinkingBlock,
    Role,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

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

Format = Literal["anthropic", "openai", "normandy"]


class TranscriptError(ValueError):
    """A transcript that cannot be converted; the message names the message index and field.

    ``index`` is the position of the message at fault (``None`` for the whole input) and
    ``field`` the path inside it, such as ``content[2].tool_use_id``.
    """

    def __init__(self, index: int | None, field: str | None, problem: str) -> None:
        self.index = index
        self.field = field
        self.problem = problem
        where = "transcript" if index is None else f"message {index}"
        if field:
            where += f", field {field!r}"
        super().__init__(f"{where}: {problem}")


# -- shared helpers -------------------------------------------------------------------

#: The tags that open the text of a message a compactor inserted, and the metadata key
#: each stands for. A user message (or, where Anthropic joined user messages, a text
#: block) opening with one is read back as an entry of its own with that key set, so a
#: cut's marker or a summary keeps its identity through every format and compacting a
#: compacted transcript again does not take it for conversation.
INSERTED_TAGS: dict[str, str] = {
    "[normandy:marker]": "normandy.compaction_marker",
    "[normandy:summary]": "normandy.summary",
}


def _inserted_key(text: str) -> str | None:
    for tag, key in INSERTED_TAGS.items():
        if text.startswith(tag):
            return key
    return None


def _tagged_parts(
    role: str, content: str | tuple[Block, ...]
) -> list[tuple[str | tuple[Block, ...], dict[str, Any]]]:
    """``content`` as the entries it stands for, each with its metadata.

    A user text opening with an :data:`INSERTED_TAGS` tag is an entry of its own with the
    tag's key set; the blocks around it (a message Anthropic joined) are entries too.
    """
    if role != "user":
        return [(content, {})]
    if isinstance(content, str):
        key = _inserted_key(content)
        return [(content, {key: True} if key else {})]
    parts: list[tuple[str | tuple[Block, ...], dict[str, Any]]] = []
    run: list[Block] = []
    for b in content:
        key = _inserted_key(b.text) if isinstance(b, TextBlock) else None
        if key is None or not isinstance(b, TextBlock):
            run.append(b)
            continue
        if run:
            parts.append((tuple(run), {}))
            run = []
        parts.append((b.text, {key: True}))
    if run or not parts:
        parts.append((tuple(run), {}))
    return parts


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


def _as_mapping(obj: Any, index: int | None, field: str | None) -> Mapping[str, Any]:
    if isinstance(obj, Mapping):
        return obj
    dump = getattr(obj, "model_dump", None)  # SDK objects (pydantic models)
    if callable(dump):
        data = dump(mode="json", exclude_none=True)
        if isinstance(data, Mapping):
            return data
    raise TranscriptError(index, field, f"expected an object, got {type(obj).__name__}")


def _text_of(content: Any, index: int | None, field: str) -> str:
    """Text of a content that is a string or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for j, part in enumerate(content):
            p = _as_mapping(part, index, f"{field}[{j}]")
            if p.get("type") not in ("text", "input_text", "output_text", "refusal"):
                raise TranscriptError(
                    index, f"{field}[{j}].type", f"expected a text part, got {p.get('type')!r}"
                )
            text = p.get("text", p.get("refusal"))
            if not isinstance(text, str):
                raise TranscriptError(index, f"{field}[{j}].text", "missing or not a string")
            parts.append(text)
        return "\n".join(parts)
    raise TranscriptError(
        index, field, f"expected a string or a list, got {type(content).__name__}"
    )


class _Turns:
    """Assigns ``turn-N`` ids: a new turn at every user message that is not only results."""

    def __init__(self) -> None:
        self.n = 0

    def for_entry(self, role: str, content: Any) -> str:
        """The turn id of the next entry."""
        results_only = (
            role in ("user", "tool")
            and isinstance(content, tuple)
            and bool(content)
            and all(isinstance(b, ToolResultBlock) for b in content)
        )
        if (role == "user" and not results_only) or self.n == 0:
            self.n += 1
        return f"turn-{self.n}"


def _check_pairing(memory: AgentMemory, allow_pending: bool) -> None:
    """Raise for a tool result without its use or a tool use without its results."""
    entries = memory.entries()
    pending: dict[str, int] = {}
    for idx, e in enumerate(entries):
        results = e.tool_results
        if results and e.role in ("user", "tool"):
            for j, r in enumerate(results):
                if r.tool_use_id not in pending:
                    raise TranscriptError(
                        e.metadata.get("index", idx),
                        f"tool_result[{j}].tool_use_id",
                        f"{r.tool_use_id!r} answers no tool use of the assistant message before it",
                    )
                del pending[r.tool_use_id]
            continue
        if pending:
            uid, at = next(iter(pending.items()))
            raise TranscriptError(at, "tool_use", f"tool use {uid!r} has no result after it")
        if e.role == "assistant":
            pending = {u.id: e.metadata.get("index", idx) for u in e.tool_uses}
    if pending and not allow_pending:
        uid, at = next(iter(pending.items()))
        raise TranscriptError(at, "tool_use", f"tool use {uid!r} has no result after it")


def _strip_index(memory: AgentMemory) -> AgentMemory:
    out: list[Entry] = []
    for e in memory.entries():
        meta = {k: v for k, v in e.metadata.items() if k != "index"}
        out.append(e.model_copy(update={"metadata": meta}))
    return AgentMemory.from_entries(out)


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


_ANTHROPIC_BLOCKS: dict[str, type[BaseModel]] = {
    "text": TextBlock,
    "thinking": ThinkingBlock,
    "redacted_thinking": RedactedThinkingBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
    "image": ImageBlock,
    "document": DocumentBlock,
}
_BLOCK_KEYS = {
    "text": ("type", "text"),
    "thinking": ("type", "thinking", "signature"),
    "redacted_thinking": ("type", "data"),
    "tool_use": ("type", "id", "name", "input"),
    "tool_result": ("type", "tool_use_id", "content", "is_error"),
    "image": ("type", "source"),
    "document": ("type", "source", "title"),
}


def _anthropic_block(raw: Any, index: int, field: str) -> Block:
    data = _as_mapping(raw, index, field)
    kind = data.get("type")
    cls = _ANTHROPIC_BLOCKS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise TranscriptError(
            index,
            f"{field}.type",
            f"unsupported block type {kind!r}; expected one of {', '.join(_ANTHROPIC_BLOCKS)}",
        )
    assert isinstance(kind, str)
    fields = {k: data[k] for k in _BLOCK_KEYS[kind] if k in data}  # cache_control etc. dropped
    if kind == "tool_result":
        content = fields.get("content", "")
        if isinstance(content, list):
            parts: list[Block] = []
            for j, p in enumerate(content):
                part = _anthropic_block(p, index, f"{field}.content[{j}]")
                if not isinstance(part, (TextBlock, ImageBlock, DocumentBlock)):
                    raise TranscriptError(
                        index,
                        f"{field}.content[{j}].type",
                        f"a tool result may hold text, image or document, not {part.type!r}",
                    )
                parts.append(part)
            fields["content"] = tuple(parts)
        elif content is None:
            fields["content"] = ""
    try:
        block = cast("Block", cls.model_validate(fields))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise TranscriptError(index, f"{field}.{loc}" if loc else field, err["msg"]) from exc
    return block


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
    entry. Tool pairing is checked: a tool result must
    answer a tool use of the message before it, and every tool use needs its results in
    the next message (``allow_pending`` accepts unanswered uses in the last message).
    Raises :class:`TranscriptError` naming the message index and field at fault.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TranscriptError(None, "messages", "expected a list of messages")
    mem = AgentMemory()
    turns = _Turns()
    if system is not None:
        text = system if isinstance(system, str) else _text_of(list(system), None, "system")
        if text:
            mem.add_message("system", text, turn_id=None)
    for i, raw in enumerate(messages):
        m = _as_mapping(raw, i, None)
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise TranscriptError(i, "role", f"expected 'user' or 'assistant', got {role!r}")
        content = m.get("content")
        parsed: str | tuple[Block, ...]
        if isinstance(content, str):
            parsed = content
        elif isinstance(content, list):
            parsed = tuple(_anthropic_block(b, i, f"content[{j}]") for j, b in enumerate(content))
        else:
            raise TranscriptError(
                i, "content", f"expected a string or a list of blocks, got {type(content).__name__}"
            )
        if role == "user" and any(
            isinstance(b, (ThinkingBlock, RedactedThinkingBlock, ToolUseBlock)) for b in parsed
        ):
            raise TranscriptError(i, "content", "a user message cannot hold thinking or tool use")
        if role == "assistant" and any(isinstance(b, ToolResultBlock) for b in parsed):
            raise TranscriptError(i, "content", "an assistant message cannot hold tool results")
        for part, tagged in _tagged_parts(role, parsed):
            turn = turns.for_entry(role, part)
            mem.add_message(role, part, turn_id=turn, metadata={"index": i, **tagged})
    _check_pairing(mem, allow_pending)
    return _strip_index(mem)


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
    reasoning), ``is_error`` (the result text is kept), and images or files inside tool
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


def _openai_user_parts(content: Any, index: int) -> str | tuple[Block, ...]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TranscriptError(
            index, "content", f"expected a string or a list of parts, got {type(content).__name__}"
        )
    blocks: list[Block] = []
    for j, raw in enumerate(content):
        p = _as_mapping(raw, index, f"content[{j}]")
        kind = p.get("type")
        field = f"content[{j}]"
        if kind in ("text", "input_text"):
            text = p.get("text")
            if not isinstance(text, str):
                raise TranscriptError(index, f"{field}.text", "missing or not a string")
            blocks.append(TextBlock(text=text))
        elif kind == "image_url":
            img = p.get("image_url")
            url = img.get("url") if isinstance(img, Mapping) else img
            if not isinstance(url, str) or not url:
                raise TranscriptError(index, f"{field}.image_url.url", "missing or not a string")
            blocks.append(ImageBlock(source=_source_from_url(url, index, f"{field}.image_url.url")))
        elif kind == "file":
            f = p.get("file")
            if not isinstance(f, Mapping) or not isinstance(f.get("file_data"), str):
                raise TranscriptError(index, f"{field}.file.file_data", "missing or not a string")
            src = _source_from_url(f["file_data"], index, f"{field}.file.file_data")
            title = f.get("filename")
            blocks.append(
                DocumentBlock(source=src, title=title if isinstance(title, str) else None)
            )
        else:
            raise TranscriptError(index, f"{field}.type", f"unsupported content part {kind!r}")
    return tuple(blocks)


def _source_from_url(url: str, index: int, field: str) -> dict[str, Any]:
    if url.startswith("data:"):
        head, sep, data = url.partition(",")
        if not sep or not head.endswith(";base64"):
            raise TranscriptError(index, field, "a data URL must be base64 encoded")
        try:
            base64.b64decode(data, validate=True)
        except ValueError as exc:
            raise TranscriptError(index, field, "the data URL is not valid base64") from exc
        return {"type": "base64", "media_type": head[5:-7], "data": data}
    return {"type": "url", "url": url}


def from_openai(messages: Sequence[Any], *, allow_pending: bool = True) -> AgentMemory:
    """A memory from OpenAI Chat Completions ``messages``.

    ``system`` and ``developer`` messages become ``system`` entries; an assistant message
    becomes one entry with its text and one :class:`ToolUseBlock` per tool call (the
    arguments must be a JSON object); consecutive ``tool`` messages become one ``user``
    entry holding their :class:`ToolResultBlock` s in order. A user message whose text
    opens with an :data:`INSERTED_TAGS` tag gets the tag's metadata key. Pairing is
    checked as in :func:`from_anthropic`. Raises :class:`TranscriptError` naming the
    index and field.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TranscriptError(None, "messages", "expected a list of messages")
    staged: list[tuple[str, str | tuple[Block, ...], int]] = []
    for i, raw in enumerate(messages):
        m = _as_mapping(raw, i, None)
        role = m.get("role")
        if role in ("system", "developer"):
            staged.append(("system", _text_of(m.get("content"), i, "content"), i))
        elif role == "user":
            staged.append(("user", _openai_user_parts(m.get("content"), i), i))
        elif role == "assistant":
            if m.get("function_call") is not None:
                raise TranscriptError(
                    i, "function_call", "legacy function_call is not supported; use tool_calls"
                )
            text = _text_of(m.get("content"), i, "content")
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list):
                raise TranscriptError(i, "tool_calls", "expected a list")
            blocks: list[Block] = [TextBlock(text=text)] if text else []
            for j, rc in enumerate(calls):
                c = _as_mapping(rc, i, f"tool_calls[{j}]")
                fn = c.get("function")
                if not isinstance(c.get("id"), str) or not c["id"]:
                    raise TranscriptError(i, f"tool_calls[{j}].id", "missing or not a string")
                if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                    raise TranscriptError(
                        i, f"tool_calls[{j}].function.name", "missing or not a string"
                    )
                args = fn.get("arguments") or "{}"
                where = f"tool_calls[{j}].function.arguments"
                try:
                    parsed = json.loads(args) if isinstance(args, str) else args
                except json.JSONDecodeError as exc:
                    raise TranscriptError(i, where, f"not valid JSON: {exc.msg}") from exc
                except RecursionError as exc:
                    raise TranscriptError(
                        i, where, f"nested deeper than {MAX_NESTING} levels (objects and arrays)"
                    ) from exc
                bad = value_problem(parsed)
                if bad is not None:
                    raise TranscriptError(i, where + (f" {bad[0]}" if bad[0] else ""), bad[1])
                if not isinstance(parsed, dict):
                    raise TranscriptError(
                        i, f"tool_calls[{j}].function.arguments", "must encode a JSON object"
                    )
                blocks.append(ToolUseBlock(id=c["id"], name=fn["name"], input=parsed))
            content: str | tuple[Block, ...] = tuple(blocks) if calls else text
            staged.append(("assistant", content, i))
        elif role == "tool":
            tid = m.get("tool_call_id")
            if not isinstance(tid, str) or not tid:
                raise TranscriptError(i, "tool_call_id", "missing or not a string")
            result = ToolResultBlock(
                tool_use_id=tid, content=_text_of(m.get("content"), i, "content")
            )
            if staged and staged[-1][0] == "tool":
                prev = staged[-1]
                assert isinstance(prev[1], tuple)
                staged[-1] = ("tool", (*prev[1], result), prev[2])
            else:
                staged.append(("tool", (result,), i))
        else:
            raise TranscriptError(
                i, "role", f"expected system, developer, user, assistant or tool, got {role!r}"
            )
    mem = AgentMemory()
    turns = _Turns()
    for role, content, i in staged:
        r = "user" if role == "tool" else role
        tid = None if r == "system" else turns.for_entry(r, content)
        parts = _tagged_parts(role, content)
        tagged = parts[0][1] if len(parts) == 1 else {}
        mem.add_message(cast("Role", r), content, turn_id=tid, metadata={"index": i, **tagged})
    _check_pairing(mem, allow_pending)
    return _strip_index(mem)


# -- detection ------------------------------------------------------------------------


def detect_format(data: Any) -> Format:
    """Which format ``data`` is in: ``"normandy"`` (a memory dump), ``"openai"`` or ``"anthropic"``.

    A dict with ``format: normandy.memory`` is a Normandy dump; a dict with ``messages``
    is looked into. A list is OpenAI when any message has role ``system``, ``developer``
    or ``tool``, ``tool_calls``, or an ``image_url`` part; otherwise Anthropic when any
    message holds a typed block only Anthropic uses; plain text-only lists read the same
    in both and are reported as ``"openai"``. Raises :class:`TranscriptError` otherwise.
    """
    if isinstance(data, Mapping):
        if data.get("format") == "normandy.memory":
            return "normandy"
        if "messages" in data:
            if "system" in data:
                return "anthropic"
            return detect_format(data["messages"])
        raise TranscriptError(None, None, "an object must be a Normandy dump or hold 'messages'")
    if not isinstance(data, list):
        raise TranscriptError(None, None, f"expected a list of messages, got {type(data).__name__}")
    anthropic_types = {"tool_use", "tool_result", "thinking", "redacted_thinking", "image"}
    anthropic = False
    for i, m in enumerate(data):
        if not isinstance(m, Mapping):
            raise TranscriptError(i, None, f"expected an object, got {type(m).__name__}")
        if m.get("role") in ("system", "developer", "tool") or "tool_calls" in m:
            return "openai"
        content = m.get("content")
        if isinstance(content, list):
            for p in content:
                if isinstance(p, Mapping):
                    if p.get("type") in ("image_url", "file", "input_text"):
                        return "openai"
                    if p.get("type") in anthropic_types or p.get("type") == "document":
                        anthropic = True
    return "anthropic" if anthropic else "openai"
