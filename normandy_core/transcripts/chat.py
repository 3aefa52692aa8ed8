"""The OpenAI Chat Completions format, read and written: ``system``, ``developer``,
``user``, ``assistant`` with ``tool_calls`` (of type ``function`` or ``custom``), and one
``tool`` message per result.

:func:`from_openai` folds consecutive ``tool`` messages into one entry holding their
results in order (Normandy's canonical shape, Anthropic's) and :func:`to_openai` unfolds
it again, so tool pairs round-trip both ways. What the format cannot carry is dropped by
:func:`to_openai` and documented there: thinking blocks, the ``is_error`` flag of a tool
result (the text is kept), and images inside tool results (sent in a user message right
after the tool messages).

An assistant message's Anthropic thinking parts, as LangChain's
``convert_to_openai_messages`` leaves them for a Claude conversation, are read and
carried through. :func:`read_chat` and :func:`rebuild_chat` serve
:func:`~normandy_core.transcripts.transcript.read` and ``write``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

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
from normandy_core.conversation.tokens import NAME_KEY
from normandy_core.transcripts.anthropic import anthropic_block, block_to_anthropic
from normandy_core.transcripts.formats import TranscriptError, as_mapping, inserted_key
from normandy_core.transcripts.staging import (
    Matched,
    Source,
    Staged,
    Transcript,
    build,
    custom_input,
    custom_text,
    entry_list,
    json_dict,
    keep_arguments,
    message_list,
    nonempty_id,
    parse_arguments,
    source_from_url,
    string_field,
)

__all__ = [
    "CHAT_THINKING",
    "from_openai",
    "read_chat",
    "rebuild_chat",
    "stage_chat",
    "to_openai",
]

_CHAT_TEXTS = frozenset({"text", "input_text", "output_text"})

#: Anthropic thinking parts in an assistant message's content, as LangChain's
#: ``convert_to_openai_messages`` leaves them for a Claude conversation: carried through.
CHAT_THINKING = frozenset({"thinking", "redacted_thinking"})


# -- writing whole conversations ------------------------------------------------------------


def _image_url(source: Mapping[str, Any]) -> str:
    if source.get("type") == "base64":
        return f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    return str(source.get("url", ""))


def _openai_part(block: Block) -> dict[str, Any] | None:
    """A user-side block as a Chat content part (``None``: not representable)."""
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


def _openai_call(use: ToolUseBlock) -> dict[str, Any]:
    return {
        "id": use.id,
        "type": "function",
        "function": {"name": use.name, "arguments": json.dumps(use.input, ensure_ascii=False)},
    }


def _assistant_message(entry: Entry) -> dict[str, Any]:
    """An assistant entry of blocks: its texts as ``content``, its uses as ``tool_calls``."""
    texts = [b.text for b in entry.content if isinstance(b, TextBlock) and b.text]
    # Several text blocks stay several parts: joined, they would not count (or read) the
    # same after a round trip.
    content: Any = (
        [{"type": "text", "text": t} for t in texts]
        if len(texts) > 1
        else (texts[0] if texts else None)
    )
    message: dict[str, Any] = {"role": "assistant", "content": content}
    uses = entry.tool_uses
    if uses:
        message["tool_calls"] = [_openai_call(u) for u in uses]
    if message["content"] is None and not uses:
        message["content"] = ""
    return message


def _tool_messages(
    blocks: Sequence[Block], out: list[dict[str, Any]], held: list[dict[str, Any]]
) -> None:
    """A results entry's ``blocks`` as ``tool`` messages in ``out``; what a ``tool``
    message cannot hold (images, files; other blocks of the entry) waits in ``held``."""
    for block in blocks:
        if isinstance(block, ToolResultBlock):
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()})
            if not isinstance(block.content, str):
                inner = (_openai_part(p) for p in block.content if not isinstance(p, TextBlock))
                held.extend(part for part in inner if part is not None)
        else:
            part = _openai_part(block)
            if part is not None:
                held.append(part)


def _flush_held(out: list[dict[str, Any]], held: list[dict[str, Any]]) -> None:
    """Send the parts waiting in ``held`` as one user message."""
    if not held:
        return
    if all(p["type"] == "text" for p in held):
        out.append({"role": "user", "content": "\n".join(p["text"] for p in held)})
    else:
        out.append({"role": "user", "content": list(held)})
    held.clear()


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
    for entry in entry_list(entries):
        content = entry.content
        if isinstance(content, str) or not entry.tool_results or entry.role == "assistant":
            _flush_held(out, held)
        if entry.role == "system":
            out.append({"role": "system", "content": entry.text()})
        elif isinstance(content, str):
            role = "assistant" if entry.role == "assistant" else "user"
            out.append({"role": role, "content": content})
        elif entry.role == "assistant":
            out.append(_assistant_message(entry))
        elif not entry.tool_results:
            # A user message given as parts comes back as the same parts.
            parts = [p for p in (_openai_part(b) for b in content) if p is not None]
            out.append({"role": "user", "content": parts or ""})
        else:
            _tool_messages(content, out, held)
    _flush_held(out, held)
    return out


# -- reading --------------------------------------------------------------------------------


def from_openai(messages: Sequence[Any], *, allow_pending: bool = True) -> AgentMemory:
    """A memory from OpenAI Chat Completions ``messages``.

    ``system`` and ``developer`` messages become ``system`` entries; an assistant message
    becomes one entry with its text and one :class:`ToolUseBlock` per tool call (the
    arguments must be a JSON object; a custom tool's text input is ``{"input": text}``);
    consecutive ``tool`` messages become one ``user`` entry holding their
    :class:`ToolResultBlock` s in order. A user message whose text opens with an
    :data:`~normandy_core.transcripts.formats.INSERTED_TAGS` tag gets the tag's metadata
    key. Pairing is checked as in
    :func:`~normandy_core.transcripts.anthropic.from_anthropic`. Raises
    :class:`~normandy_core.TranscriptError` naming the index and field.
    """
    return read_chat(message_list(messages), messages, allow_pending=allow_pending).memory


def read_chat(items: Sequence[Any], container: Any, *, allow_pending: bool = True) -> Transcript:
    """The Chat Completions ``items`` (read from ``container``) as a transcript."""
    return build("openai", list(stage_chat(items)), container, allow_pending)


def _chat_text_parts(
    content: Any, index: int, role: str
) -> str | list[tuple[str | Block, Any, int]]:
    """A Chat content as its text: a string, or ``(text, raw part, position)`` per part
    (an assistant's thinking part as its block instead of a text)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        raise TranscriptError(
            index, "content", f"expected a string or a list of parts, got {type(content).__name__}"
        )
    out: list[tuple[str | Block, Any, int]] = []
    for j, raw in enumerate(content):
        part = as_mapping(raw, index, f"content[{j}]")
        kind = part.get("type")
        if kind in _CHAT_TEXTS:
            out.append((string_field(part, "text", index, f"content[{j}].text"), raw, j))
        elif kind == "refusal" and role == "assistant":
            out.append((string_field(part, "refusal", index, f"content[{j}].refusal"), raw, j))
        elif kind in CHAT_THINKING and role == "assistant":
            out.append((anthropic_block(part, index, f"content[{j}]", role), raw, j))
        else:
            allowed = "text, refusal or thinking" if role == "assistant" else "text"
            raise TranscriptError(
                index, f"content[{j}].type", f"expected a {allowed} part, got {kind!r}"
            )
    return out


def _chat_file(part: Mapping[str, Any], index: int, where: str) -> DocumentBlock:
    file = part.get("file")
    if not isinstance(file, Mapping):
        raise TranscriptError(index, f"{where}.file", "missing or not an object")
    title = file.get("filename")
    title = title if isinstance(title, str) else None
    if isinstance(file.get("file_data"), str):
        src = source_from_url(file["file_data"], index, f"{where}.file.file_data")
    elif isinstance(file.get("file_id"), str) and file["file_id"]:
        src = {"type": "file", "file_id": file["file_id"]}
    else:
        raise TranscriptError(
            index, f"{where}.file", "expected 'file_data' or 'file_id' (a string)"
        )
    return DocumentBlock(source=src, title=title)


def _chat_user_part(raw: Any, index: int, j: int) -> Block:
    part = as_mapping(raw, index, f"content[{j}]")
    kind = part.get("type")
    where = f"content[{j}]"
    if kind in _CHAT_TEXTS:
        return TextBlock(text=string_field(part, "text", index, f"{where}.text"))
    if kind == "image_url":
        img = part.get("image_url")
        url = img.get("url") if isinstance(img, Mapping) else img
        if not isinstance(url, str) or not url:
            raise TranscriptError(index, f"{where}.image_url.url", "missing or not a string")
        return ImageBlock(source=source_from_url(url, index, f"{where}.image_url.url"))
    if kind == "file":
        return _chat_file(part, index, where)
    if kind == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, Mapping) or not isinstance(audio.get("data"), str):
            raise TranscriptError(index, f"{where}.input_audio.data", "missing or not a string")
        return OpaqueBlock(format="openai", kind="input_audio", data=dict(part))
    raise TranscriptError(
        index,
        f"{where}.type",
        f"unsupported content part {kind!r}; expected text, image_url, input_audio or file",
    )


def stage_chat(messages: Sequence[Any], start: int = 0) -> Iterator[Staged]:
    """The Chat Completions ``messages`` (positions from ``start``) as staged entries."""
    tools: Staged | None = None  # the run of tool messages being read: one entry
    for i, raw in enumerate(messages, start):
        message = as_mapping(raw, i, None)
        if message.get("role") == "tool":
            tools = _add_tool_message(tools, message, raw, i)
            continue
        if tools is not None:
            yield tools
            tools = None
        yield _stage_chat_message(message, raw, i)
    if tools is not None:
        yield tools


def _add_tool_message(tools: Staged | None, message: Mapping[str, Any], raw: Any, i: int) -> Staged:
    """``tools`` (a new entry when ``None``) with the result of the tool message ``i``."""
    tid = nonempty_id(message, "tool_call_id", i, "tool_call_id")
    text = _chat_text_parts(message.get("content"), i, "tool")
    body = text if isinstance(text, str) else "\n".join(t for t, _, _ in text if isinstance(t, str))
    if tools is None:
        tools = Staged(role="tool", index=i)
    tools.raws.append(raw)
    tools.add(
        ToolResultBlock(tool_use_id=tid, content=body),
        len(tools.raws) - 1,
        raw,
        (i, "tool_call_id"),
    )
    return tools


def _stage_chat_message(message: Mapping[str, Any], raw: Any, i: int) -> Staged:
    """A system, developer, user or assistant message as a staged entry."""
    role = message.get("role")
    st = Staged(role="user", index=i, raws=[raw])
    name = message.get("name")
    if isinstance(name, str) and name:
        st.meta[NAME_KEY] = name  # counted: the provider bills a message's name
    if role in ("system", "developer"):
        st.role = "system"
        text = _chat_text_parts(message.get("content"), i, role)
        if isinstance(text, str):
            st.text = text
        else:
            for part_text, part, _ in text:
                if isinstance(part_text, str):  # only an assistant's content holds thinking
                    st.add(TextBlock(text=part_text), 0, part, (i, "content"))
    elif role == "user":
        _stage_chat_user(st, message.get("content"), i)
    elif role == "assistant":
        st.role = "assistant"
        if message.get("function_call") is not None:
            raise TranscriptError(
                i, "function_call", "legacy function_call is not supported; use tool_calls"
            )
        _stage_chat_assistant(message, st, i)
    else:
        raise TranscriptError(
            i, "role", f"expected system, developer, user, assistant or tool, got {role!r}"
        )
    return st


def _stage_chat_user(st: Staged, content: Any, i: int) -> None:
    if isinstance(content, str):
        st.text = content
        key = inserted_key(content)
        if key:
            st.meta[key] = True
    elif isinstance(content, (list, tuple)):
        for j, part in enumerate(content):
            st.add(_chat_user_part(part, i, j), 0, part, (i, f"content[{j}]"))
    else:
        raise TranscriptError(
            i, "content", f"expected a string or a list of parts, got {type(content).__name__}"
        )


def _stage_chat_assistant(message: Mapping[str, Any], st: Staged, i: int) -> None:
    text = _chat_text_parts(message.get("content"), i, "assistant")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, (list, tuple)):
        raise TranscriptError(i, "tool_calls", "expected a list")
    refusal = message.get("refusal")
    audio = message.get("audio")
    if isinstance(text, str) and not calls and refusal is None and audio is None:
        st.text = text
        return
    if isinstance(text, str):
        if text:
            st.add(TextBlock(text=text), 0, ("content", None), (i, "content"))
    else:
        for part_text, _part, j in text:
            block = TextBlock(text=part_text) if isinstance(part_text, str) else part_text
            st.add(block, 0, ("content", j), (i, f"content[{j}]"))
    if isinstance(refusal, str) and refusal:
        st.add(TextBlock(text=refusal), 0, ("refusal", None), (i, "refusal"))
    if isinstance(audio, Mapping):
        st.add(
            OpaqueBlock(format="openai", kind="audio", data=dict(audio)),
            0,
            ("audio", None),
            (i, "audio"),
        )
    for j, raw_call in enumerate(calls):
        use = _chat_tool_use(st, raw_call, i, j)
        st.add(use, 0, ("tool_calls", j), (i, f"tool_calls[{j}].id"))


def _chat_tool_use(st: Staged, raw_call: Any, i: int, j: int) -> ToolUseBlock:
    """The tool call ``j`` of message ``i`` as a tool use (its own arguments string kept
    in ``st`` where it is longer than ours)."""
    call = as_mapping(raw_call, i, f"tool_calls[{j}]")
    cid = nonempty_id(call, "id", i, f"tool_calls[{j}].id")
    kind = call.get("type", "function")
    if kind == "custom":
        custom = call.get("custom")
        if not isinstance(custom, Mapping) or not isinstance(custom.get("name"), str):
            raise TranscriptError(i, f"tool_calls[{j}].custom.name", "missing or not a string")
        raw_input = custom.get("input", "")
        if not isinstance(raw_input, str):
            raise TranscriptError(i, f"tool_calls[{j}].custom.input", "not a string")
        return ToolUseBlock(id=cid, name=custom["name"], input=custom_input(raw_input))
    if kind == "function":
        fn = call.get("function")
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise TranscriptError(i, f"tool_calls[{j}].function.name", "missing or not a string")
        args = parse_arguments(
            fn.get("arguments"),
            i,
            f"tool_calls[{j}].function.arguments",
            vocabulary="Chat Completions sends arguments as a string",
        )
        use = ToolUseBlock(id=cid, name=fn["name"], input=args)
        keep_arguments(st, cid, fn.get("arguments"), args)
        return use
    raise TranscriptError(
        i, f"tool_calls[{j}].type", f"expected 'function' or 'custom', got {kind!r}"
    )


# -- writing a changed entry ----------------------------------------------------------------


def _chat_call(raw: Any, use: ToolUseBlock) -> dict[str, Any]:
    """The tool call ``use`` over its raw call (``None``: a new one)."""
    base: dict[str, Any] = json_dict(raw) if raw is not None else {"id": use.id, "type": "function"}
    if base.get("type") == "custom":
        custom = dict(base.get("custom") or {})
        custom["input"] = custom_text(use)
        return {**base, "custom": custom}
    fn = dict(base.get("function") or {"name": use.name})
    fn["arguments"] = json.dumps(use.input, ensure_ascii=False)
    return {**base, "function": fn}


def _kept_call(raw_calls: list[Any], use: ToolUseBlock, tag: Any, same: bool) -> Any:
    """The call ``use`` came from (``tag``: ``("tool_calls", j)``), as given when
    unchanged, else rendered over it."""
    if tag is not None and same:
        return raw_calls[tag[1]]
    return _chat_call(raw_calls[tag[1]] if tag is not None else None, use)


def _set_calls(message: dict[str, Any], calls: list[Any]) -> dict[str, Any]:
    """``message`` with ``calls`` as its ``tool_calls`` (none: the field left out)."""
    if calls:
        message["tool_calls"] = calls
    else:
        message.pop("tool_calls", None)
    return message


def rebuild_chat(entry: Entry, src: Source | None, matched: Matched) -> list[Any]:
    """A changed or new ``entry`` as Chat messages, each message and part ``matched`` to
    what it came from kept as given."""
    if src is None or entry.role != src.role:
        return list(to_openai([entry]))
    if src.role == "user" and any(isinstance(b, ToolResultBlock) for b, _, _ in matched):
        return _rebuild_results(entry, src, matched)
    base = json_dict(src.raws[0])
    if src.role == "assistant" and any(
        isinstance(b, (ThinkingBlock, RedactedThinkingBlock))
        for b in (*(original for original, _, _ in src.parts), *(b for b, _, _ in matched))
    ):
        return [_rebuild_thinking_assistant(base, matched)]
    if src.role == "assistant":
        return [_rebuild_assistant(base, src, matched)]
    if isinstance(entry.content, str):
        return [{**base, "content": entry.content}]
    parts: list[Any] = []
    for block, origin, same in matched:
        if origin is not None and same:
            parts.append(origin[1])
        elif isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        else:
            parts.extend(to_openai([entry.model_copy(update={"content": (block,)})])[0]["content"])
    return [{**base, "content": parts}]


def _rebuild_results(entry: Entry, src: Source, matched: Matched) -> list[Any]:
    """A changed results entry: a ``tool`` message per result, unchanged ones as given."""
    out: list[Any] = []
    for block, origin, same in matched:
        if origin is not None and same:
            out.append(src.raws[origin[0]])
        elif isinstance(block, ToolResultBlock):
            base = json_dict(src.raws[origin[0]]) if origin is not None else {}
            out.append(
                {**base, "role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()}
            )
        else:
            out.extend(to_openai([entry.model_copy(update={"content": (block,)})]))
    return out


def _rebuild_assistant(base: dict[str, Any], src: Source, matched: Matched) -> dict[str, Any]:
    """A changed assistant message: its ``content`` kept as given while its texts are,
    each call as given while unchanged."""
    raw_calls = list(base.get("tool_calls") or [])
    texts: list[str] = []
    calls: list[Any] = []
    content_same = True
    for block, origin, same in matched:
        tag = origin[1] if origin is not None else None
        if isinstance(block, ToolUseBlock):
            calls.append(_kept_call(raw_calls, block, tag, same))
        elif isinstance(block, TextBlock) and (tag is None or tag[0] == "content"):
            texts.append(block.text)
            content_same = content_same and same
        # audio (an opaque block) stays in base
    expected = sum(
        1
        for original, _, raw in src.parts
        if isinstance(original, TextBlock) and raw[0] == "content"
    )
    message = dict(base)
    if not (content_same and len(texts) == expected):
        message["content"] = "\n".join(texts) if texts else ("" if not calls else None)
    return _set_calls(message, calls)


def _rebuild_thinking_assistant(base: dict[str, Any], matched: Matched) -> dict[str, Any]:
    """A changed Chat assistant message that held (Anthropic) thinking parts: its content
    stays a list of parts in order, each unchanged part as it was given."""
    raw_parts = base.get("content")
    raw_calls = list(base.get("tool_calls") or [])
    parts: list[Any] = []
    calls: list[Any] = []
    for block, origin, same in matched:
        tag = origin[1] if origin is not None else None
        if isinstance(block, ToolUseBlock):
            calls.append(_kept_call(raw_calls, block, tag, same))
        elif isinstance(block, OpaqueBlock):
            continue  # audio stays in base
        elif same and tag is not None and tag[0] == "content" and isinstance(raw_parts, list):
            parts.append(raw_parts[tag[1]])
        elif isinstance(block, (ThinkingBlock, RedactedThinkingBlock)):
            parts.append(block_to_anthropic(block))
        elif isinstance(block, TextBlock) and (tag is None or tag[0] == "content"):
            parts.append({"type": "text", "text": block.text})
    message = dict(base)
    message["content"] = parts if parts else ("" if not calls else None)
    return _set_calls(message, calls)
