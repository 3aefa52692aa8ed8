"""The Anthropic Messages format, read and written: ``system`` apart, ``messages`` of
``user`` and ``assistant`` turns with typed blocks.

Normandy's canonical shape is Anthropic's: an assistant entry holds its tool uses, and the
results of one batch are one ``user`` entry holding every :class:`ToolResultBlock` in
tool-use order. Every block type is read: the ones the conversation interprets (text,
thinking, tool use and result, image, document) and the ones it carries as
:class:`~normandy_core.OpaqueBlock` (server tools and their results, MCP tool use and
result, search results, container uploads, ``compaction``, any future type).

:func:`to_anthropic` and :func:`from_anthropic` convert whole conversations (the model
clients use them); :func:`read_anthropic` and :func:`rebuild_anthropic` serve
:func:`~normandy_core.transcripts.transcript.read` and ``write``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

from pydantic import BaseModel, ValidationError

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
from normandy_core.conversation.keys import PROVIDER_COMPACTION_KEY
from normandy_core.conversation.memory import AgentMemory
from normandy_core.transcripts.formats import TranscriptError, as_mapping, inserted_key
from normandy_core.transcripts.staging import (
    Matched,
    Source,
    Staged,
    Transcript,
    build,
    entry_list,
    json_dict,
    message_list,
)

__all__ = [
    "ANTHROPIC_ONLY",
    "anthropic_block",
    "block_to_anthropic",
    "from_anthropic",
    "read_anthropic",
    "rebuild_anthropic",
    "stage_anthropic",
    "system_text",
    "to_anthropic",
]

_ANTHROPIC_TYPED: dict[str, type[BaseModel]] = {
    "text": TextBlock,
    "thinking": ThinkingBlock,
    "redacted_thinking": RedactedThinkingBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
    "image": ImageBlock,
    "document": DocumentBlock,
}
_ANTHROPIC_KEYS = {
    "text": ("type", "text"),
    "thinking": ("type", "thinking", "signature"),
    "redacted_thinking": ("type", "data"),
    "tool_use": ("type", "id", "name", "input"),
    "tool_result": ("type", "tool_use_id", "content", "is_error"),
    "image": ("type", "source"),
    "document": ("type", "source", "title"),
}
# Blocks an assistant message may hold that are only carried (server-side tool rounds:
# the use and its result sit in the same message).
_ANTHROPIC_ASSISTANT_OPAQUE = frozenset(
    {
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "compaction",
    }
)
#: Block types only Anthropic defines (evidence of the format).
ANTHROPIC_ONLY = (
    frozenset(_ANTHROPIC_TYPED) - {"text"}
    | _ANTHROPIC_ASSISTANT_OPAQUE
    | {"container_upload", "search_result"}
)
_ANTHROPIC_SERVER_USES = frozenset({"server_tool_use", "mcp_tool_use"})


# -- writing whole conversations ------------------------------------------------------------


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


def _entry_blocks(entry: Entry, strip_thinking: bool) -> list[dict[str, Any]]:
    """The blocks ``entry`` is sent as, empty text left out."""
    if isinstance(entry.content, str):
        return [{"type": "text", "text": entry.content}] if entry.content else []
    blocks = [
        block_to_anthropic(b)
        for b in entry.content
        if not (strip_thinking and isinstance(b, (ThinkingBlock, RedactedThinkingBlock)))
    ]
    return [b for b in blocks if _nonempty(b)]


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
    for entry in entry_list(entries):
        if entry.role == "system":
            text = entry.text()
            if text:
                system_parts.append(text)
            continue
        role = "assistant" if entry.role == "assistant" else "user"
        blocks = _entry_blocks(entry, strip_thinking)
        if not blocks:
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    for message in messages:
        parts = message["content"]
        if message["role"] == "user" and any(b["type"] == "tool_result" for b in parts):
            parts.sort(key=lambda b: b["type"] != "tool_result")  # stable
        if len(parts) == 1 and parts[0]["type"] == "text":
            message["content"] = parts[0]["text"]
    return ("\n\n".join(system_parts) if system_parts else None), messages


# -- reading --------------------------------------------------------------------------------


def from_anthropic(
    messages: Sequence[Any],
    system: str | Sequence[Any] | None = None,
    *,
    allow_pending: bool = True,
) -> AgentMemory:
    """A memory from Anthropic Messages ``messages`` (and ``system``, text or text blocks).

    Each message becomes one entry (text content stays text), except that a text block
    opening with an :data:`~normandy_core.transcripts.formats.INSERTED_TAGS` tag in a user
    message (a marker or summary the API would have joined with its neighbours) becomes an
    entry of its own, with the tag's metadata key set; the system prompt, when given,
    becomes a leading ``system`` entry. Blocks the conversation does not interpret (server
    tools, MCP, search results, ``compaction``...) are carried as
    :class:`~normandy_core.OpaqueBlock`. Tool pairing is checked: a tool result must
    answer a tool use of the message before it, and every tool use needs its results in
    the next message (``allow_pending`` accepts unanswered uses in the last message).
    Raises :class:`~normandy_core.TranscriptError` naming the message index and field at
    fault.
    """
    items = message_list(messages)
    return read_anthropic(items, messages, system=system, allow_pending=allow_pending).memory


def read_anthropic(
    items: Sequence[Any], container: Any, *, system: Any = None, allow_pending: bool = True
) -> Transcript:
    """The Anthropic ``items`` (read from ``container``) as a transcript, with ``system``
    (a request's system prompt) as a leading system entry."""
    staged = list(stage_anthropic(items))
    text = system_text(system) if system is not None else ""
    return build("anthropic", staged, container, allow_pending, system=system, system_text=text)


def _tool_result_fields(fields: dict[str, Any], index: int, where: str, role: str) -> None:
    """A tool result's ``content`` as blocks: text, images and documents read, any other
    part (search results, tool references...) counted and carried as its JSON text."""
    content = fields.get("content", "")
    if content is None:
        fields["content"] = ""
        return
    if not isinstance(content, list):
        return
    parts: list[Block] = []
    for j, raw in enumerate(content):
        sub = f"{where}.content[{j}]"
        part = as_mapping(raw, index, sub)
        kind = part.get("type")
        if kind in ("text", "image", "document"):
            parts.append(anthropic_block(part, index, sub, role))
        elif isinstance(kind, str) and kind:
            parts.append(TextBlock(text=json.dumps(dict(part), ensure_ascii=False)))
        else:
            raise TranscriptError(index, f"{sub}.type", "missing or not a string")
    fields["content"] = tuple(parts)


def anthropic_block(raw: Any, index: int, where: str, role: str) -> Block:
    """The Anthropic block ``raw`` (at ``where`` of message ``index``, of ``role``) as a
    block: typed where the conversation interprets it, else opaque."""
    data = as_mapping(raw, index, where)
    kind = data.get("type")
    if not isinstance(kind, str) or not kind:
        raise TranscriptError(index, f"{where}.type", "missing or not a string")
    cls = _ANTHROPIC_TYPED.get(kind)
    if cls is None:
        if role == "user" and kind in _ANTHROPIC_ASSISTANT_OPAQUE - {"compaction"}:
            raise TranscriptError(
                index, f"{where}.type", f"a {kind!r} block belongs in an assistant message"
            )
        return OpaqueBlock(format="anthropic", kind=kind, data=dict(data))
    fields = {k: data[k] for k in _ANTHROPIC_KEYS[kind] if k in data}
    if kind == "tool_result":
        _tool_result_fields(fields, index, where, role)
    try:
        return cast("Block", cls.model_validate(fields))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise TranscriptError(index, f"{where}.{loc}" if loc else where, err["msg"]) from exc


def system_text(system: Any) -> str:
    """An Anthropic request's ``system`` (a string or text blocks) as its text."""
    if isinstance(system, str):
        return system
    if isinstance(system, (list, tuple)):
        texts: list[str] = []
        for j, raw in enumerate(system):
            block = as_mapping(raw, None, f"system[{j}]")
            if block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise TranscriptError(None, f"system[{j}]", "expected a text block")
            texts.append(block["text"])
        return "\n".join(texts)
    raise TranscriptError(
        None, "system", f"expected a string or a list of text blocks, got {type(system).__name__}"
    )


def stage_anthropic(messages: Sequence[Any], start: int = 0) -> Iterator[Staged]:
    """The Anthropic ``messages`` (positions from ``start``) as staged entries."""
    for i, raw in enumerate(messages, start):
        message = as_mapping(raw, i, None)
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise TranscriptError(i, "role", f"expected 'user' or 'assistant', got {role!r}")
        content = message.get("content")
        st = Staged(role=role, index=i, raws=[raw])
        if isinstance(content, str):
            st.text = content
            key = inserted_key(content) if role == "user" else None
            if key:
                st.meta[key] = True
            yield st
            continue
        if not isinstance(content, (list, tuple)):
            raise TranscriptError(
                i, "content", f"expected a string or a list of blocks, got {type(content).__name__}"
            )
        _stage_blocks(st, content, i, role)
        yield from _split_tagged(st)


def _stage_blocks(st: Staged, content: Sequence[Any], i: int, role: str) -> None:
    """Add the blocks of message ``i`` to ``st``, refusing those its role cannot hold."""
    open_server: dict[str, int] = {}
    for j, raw in enumerate(content):
        where = f"content[{j}]"
        block = anthropic_block(raw, i, where, role)
        if role == "user" and isinstance(
            block, (ThinkingBlock, RedactedThinkingBlock, ToolUseBlock)
        ):
            raise TranscriptError(
                i, f"{where}.type", f"a user message cannot hold a {block.type!r} block"
            )
        if role == "assistant" and isinstance(block, ToolResultBlock):
            raise TranscriptError(
                i, f"{where}.type", "an assistant message cannot hold tool results"
            )
        if isinstance(block, OpaqueBlock):
            _check_server_pair(block, open_server, i, j)
            if block.kind == "compaction":
                st.meta[PROVIDER_COMPACTION_KEY] = True
        at = (i, f"{where}.tool_use_id" if isinstance(block, ToolResultBlock) else where)
        if isinstance(block, ToolUseBlock):
            at = (i, f"{where}.id")
        st.add(block, 0, raw, at)
    if open_server:
        uid, j = next(iter(open_server.items()))
        raise TranscriptError(
            i,
            f"content[{j}].id",
            f"server tool use {uid!r} has no result block after it in the same message",
        )


def _check_server_pair(block: OpaqueBlock, open_: dict[str, int], index: int, j: int) -> None:
    """A server or MCP tool use is answered by a result block later in the same message."""
    data = block.data
    where = f"content[{j}]"
    if block.kind in _ANTHROPIC_SERVER_USES:
        uid = data.get("id")
        if not isinstance(uid, str) or not uid:
            raise TranscriptError(index, f"{where}.id", "missing or not a string")
        open_[uid] = j
    elif block.kind.endswith("_tool_result"):
        rid = data.get("tool_use_id")
        if not isinstance(rid, str) or rid not in open_:
            raise TranscriptError(
                index,
                f"{where}.tool_use_id",
                f"{rid!r} answers no server or MCP tool use earlier in this message",
            )
        del open_[rid]


def _split_tagged(st: Staged) -> Iterator[Staged]:
    """A user message whose text blocks open with a marker or summary tag, as entries."""
    if st.role != "user" or not any(
        isinstance(b, TextBlock) and inserted_key(b.text) for b, _, _ in st.parts
    ):
        yield st
        return
    pieces: list[Staged] = []
    run = Staged(role="user", index=st.index, raws=st.raws)
    for (block, pos, raw), at in zip(st.parts, st.where, strict=True):
        key = inserted_key(block.text) if isinstance(block, TextBlock) else None
        if key is None:
            run.add(block, pos, raw, at)
            continue
        if run.parts:
            pieces.append(run)
            run = Staged(role="user", index=st.index, raws=st.raws)
        tagged = Staged(role="user", index=st.index, raws=st.raws, meta={key: True})
        tagged.add(block, pos, raw, at)
        pieces.append(tagged)
    if run.parts:
        pieces.append(run)
    if len(pieces) == 1:
        pieces[0].meta.update(st.meta)
        yield pieces[0]
        return
    for piece in pieces:
        piece.group = (st.index, len(pieces))
        yield piece


# -- writing a changed entry ----------------------------------------------------------------


def rebuild_anthropic(entry: Entry, src: Source | None, matched: Matched) -> list[Any]:
    """A changed or new ``entry`` as Anthropic messages, each block ``matched`` to the raw
    part it came from kept as given, or merged over it where it changed."""
    role = "assistant" if entry.role == "assistant" else "user"
    blocks: list[Any] = []
    for block, origin, same in matched:
        if origin is not None and same:
            blocks.append(origin[1])
        elif origin is not None:
            blocks.append({**json_dict(origin[1]), **block_to_anthropic(block)})
        else:
            fresh = block_to_anthropic(block)
            if _nonempty(fresh):
                blocks.append(fresh)
    if role == "user":
        blocks.sort(key=lambda part: as_mapping(part, None, None).get("type") != "tool_result")
    base = json_dict(src.raws[0]) if src is not None and src.raws else {}
    if isinstance(entry.content, str):
        return [{**base, "role": role, "content": entry.content}]
    return [{**base, "role": role, "content": blocks}] if blocks or base else []
