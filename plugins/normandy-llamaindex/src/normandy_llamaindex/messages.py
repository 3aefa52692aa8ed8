"""LlamaIndex ``ChatMessage`` objects as OpenAI Chat Completions dicts, and back.

The core compacts Chat dicts (:func:`normandy_core.compact`'s ``openai`` format); this
module is the translation both ways:

- ``system``/``developer``/``user`` messages: their text blocks joined; an assistant
  message (``chatbot`` and ``model`` too): its text, its ``ThinkingBlock`` parts as
  thinking (kept with the message, signature included), and its calls, whether
  ``ToolCallBlock`` blocks or entries of ``additional_kwargs["tool_calls"]`` (a
  ``ToolSelection``, an OpenAI call object or dict);
- a ``tool`` (or legacy ``function``) message: the result of the call named by
  ``additional_kwargs["tool_call_id"]``;
- any other block (an image, audio, a document) is carried as its JSON text, so it is
  counted by that form and moves with its message unaltered.

Each dict carries an ``id`` naming its message, so a message the compactor changed (a
shortened result, thinking stripped) leads back to the original it came from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)

from normandy_core.transcripts.formats import TranscriptError

__all__ = ["ASSISTANT_ROLES", "changed_message", "created_message", "to_chat_dict"]

#: The roles LlamaIndex gives a model's own messages.
ASSISTANT_ROLES = frozenset({MessageRole.ASSISTANT, MessageRole.CHATBOT, MessageRole.MODEL})
_TOOL_ROLES = frozenset({MessageRole.TOOL, MessageRole.FUNCTION})


def _text(msg: ChatMessage) -> str:
    """The message's text blocks joined, and any other block (not a call, not thinking)
    as its JSON form."""
    parts: list[str] = []
    for block in msg.blocks:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif not isinstance(block, (ToolCallBlock, ThinkingBlock)):
            parts.append(block.model_dump_json())
    return "\n".join(parts)


def _arguments(kwargs: Any) -> str:
    """A call's arguments as the JSON string Chat Completions sends."""
    return kwargs if isinstance(kwargs, str) else json.dumps(kwargs, ensure_ascii=False)


def _call(cid: str | None, name: str, kwargs: Any, index: int, j: int) -> dict[str, Any]:
    if not cid:
        raise TranscriptError(index, f"tool_calls[{j}]", "a tool call without an id")
    return {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": _arguments(kwargs)},
    }


def _kwargs_call(raw: Any, index: int, j: int) -> dict[str, Any]:
    """A call listed in ``additional_kwargs["tool_calls"]`` as a Chat call."""
    if hasattr(raw, "tool_id") and hasattr(raw, "tool_name"):  # a ToolSelection
        return _call(raw.tool_id, raw.tool_name, raw.tool_kwargs, index, j)
    data = raw.model_dump() if hasattr(raw, "model_dump") else raw
    if not isinstance(data, Mapping) or not isinstance(data.get("function"), Mapping):
        raise TranscriptError(index, f"tool_calls[{j}]", "not a ToolSelection or a Chat call")
    fn = data["function"]
    return _call(data.get("id"), str(fn.get("name", "")), fn.get("arguments") or {}, index, j)


def _calls(msg: ChatMessage, index: int) -> list[dict[str, Any]]:
    """Every tool call of an assistant message, blocks first."""
    calls = [
        _call(b.tool_call_id, b.tool_name, b.tool_kwargs, index, j)
        for j, b in enumerate(b for b in msg.blocks if isinstance(b, ToolCallBlock))
    ]
    listed = msg.additional_kwargs.get("tool_calls") or []
    seen = {c["id"] for c in calls}
    for j, raw in enumerate(listed, start=len(calls)):
        call = _kwargs_call(raw, index, j)
        if call["id"] not in seen:  # an integration may list a call in both places
            calls.append(call)
    return calls


def _assistant(msg: ChatMessage, key: str, index: int) -> dict[str, Any]:
    calls = _calls(msg, index)
    text = _text(msg)
    thinking = [b for b in msg.blocks if isinstance(b, ThinkingBlock)]
    content: Any = text if text or not calls else None
    if thinking:
        content = [
            {
                "type": "thinking",
                "thinking": b.content or "",
                "signature": str(b.additional_information.get("signature", "")),
            }
            for b in thinking
        ]
        if text:
            content.append({"type": "text", "text": text})
    out: dict[str, Any] = {"id": key, "role": "assistant", "content": content}
    if calls:
        out["tool_calls"] = calls
    return out


def to_chat_dict(msg: ChatMessage, key: str, index: int) -> dict[str, Any]:
    """``msg`` (message ``index`` of its list) as a Chat dict whose ``id`` is ``key``.

    Raises :class:`~normandy_core.TranscriptError` naming the index for a tool message
    without ``additional_kwargs["tool_call_id"]`` or a call without an id.
    """
    if msg.role in ASSISTANT_ROLES:
        return _assistant(msg, key, index)
    if msg.role in _TOOL_ROLES:
        cid = msg.additional_kwargs.get("tool_call_id")
        if not isinstance(cid, str) or not cid:
            raise TranscriptError(
                index, "additional_kwargs.tool_call_id", "a tool message without its call id"
            )
        return {"id": key, "role": "tool", "tool_call_id": cid, "content": _text(msg)}
    role = "system" if msg.role in (MessageRole.SYSTEM, MessageRole.DEVELOPER) else "user"
    return {"id": key, "role": role, "content": _text(msg)}


def _dict_text(content: Any) -> str:
    """The text of a Chat ``content`` (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text"
        )
    return ""


def _new_blocks(source: ChatMessage, d: Mapping[str, Any]) -> list[Any]:
    """The blocks of ``source`` as the compactor left it in ``d``: thinking and calls it
    kept are the original blocks, text is the new text."""
    content = d.get("content")
    kept_thinking = {
        p.get("thinking")
        for p in (content if isinstance(content, list) else [])
        if isinstance(p, Mapping) and p.get("type") == "thinking"
    }
    blocks: list[Any] = [
        b for b in source.blocks if isinstance(b, ThinkingBlock) and b.content in kept_thinking
    ]
    text = _dict_text(content)
    if text:
        blocks.append(TextBlock(text=text))
    by_id = {b.tool_call_id: b for b in source.blocks if isinstance(b, ToolCallBlock)}
    for call in d.get("tool_calls") or []:
        fn = call.get("function", {})
        original = by_id.get(call.get("id"))
        args = json.loads(fn.get("arguments") or "{}")
        if original is not None and original.tool_kwargs == args:
            blocks.append(original)
        elif original is not None:
            blocks.append(original.model_copy(update={"tool_kwargs": args}))
    return blocks


def changed_message(source: ChatMessage, d: Mapping[str, Any]) -> ChatMessage:
    """``source`` with the content the compactor gave it (``d``); its role and
    ``additional_kwargs`` kept, except calls listed there that the compactor removed."""
    if source.role in _TOOL_ROLES:
        return source.model_copy(update={"blocks": [TextBlock(text=_dict_text(d.get("content")))]})
    update: dict[str, Any] = {"blocks": _new_blocks(source, d)}
    listed = source.additional_kwargs.get("tool_calls")
    if listed:
        still = {c.get("id") for c in d.get("tool_calls") or []}
        kept = [c for j, c in enumerate(listed) if _kwargs_call(c, 0, j)["id"] in still]
        update["additional_kwargs"] = {**source.additional_kwargs, "tool_calls": kept}
    return source.model_copy(update=update)


def created_message(d: Mapping[str, Any]) -> ChatMessage:
    """A message for one the compactor created (a marker or a summary)."""
    role = MessageRole.ASSISTANT if d.get("role") == "assistant" else MessageRole.USER
    return ChatMessage(role=role, content=_dict_text(d.get("content")))
