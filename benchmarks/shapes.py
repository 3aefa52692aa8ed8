"""One generated coding session in every input shape :func:`normandy_core.compact` reads.

Section 8's shape axis (:mod:`benchmarks.compact_shapes`) and the continuation tests
(``tests/test_continuation_shapes.py``) grow these lists one tool batch per call. Each
shape holds the same conversation: the Chat Completions list, the Anthropic Messages
list and request (``system`` beside ``messages``), the Responses API item list and
request (``instructions`` beside ``input``), and the same lists holding the official
SDKs' objects where a program using the SDK would hold them (the replies it appended).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from normandy_core.app.workload import generate_session
from normandy_core.clients.openai import responses_input
from normandy_core.conversation.memory import AgentMemory
from normandy_core.transcripts.anthropic import to_anthropic
from normandy_core.transcripts.chat import to_openai

__all__ = ["SHAPES", "Shape", "ShapedSession", "shaped_session", "sized_session"]

Message = Any


@dataclass(frozen=True)
class Shape:
    """An input shape: its wire format, the container around the list (``None``: the
    list itself; else the request's list key) and whether replies are SDK objects."""

    name: str
    format: str
    list_key: str | None
    system_key: str | None
    sdk: bool = False


#: Every shape, the plain list of each format first.
SHAPES: tuple[Shape, ...] = (
    Shape("Chat Completions list", "openai", None, None),
    Shape("Chat Completions {messages}", "openai", "messages", None),
    Shape("Chat Completions list, SDK replies", "openai", None, None, sdk=True),
    Shape("Anthropic list", "anthropic", None, None),
    Shape("Anthropic request {system, messages}", "anthropic", "messages", "system"),
    Shape("Anthropic request, SDK blocks", "anthropic", "messages", "system", sdk=True),
    Shape("Responses list", "responses", None, None),
    Shape("Responses request {instructions, input}", "responses", "input", "instructions"),
    Shape("Responses request, SDK items", "responses", "input", "instructions", sdk=True),
)


@dataclass
class ShapedSession:
    """One conversation in one shape: every message, where each tool batch ends, and the
    request's other keys (system prompt included) when the shape is a request."""

    shape: Shape
    messages: list[Message]
    ends: list[int]  # the list's length after each tool batch
    template: dict[str, Any]  # the request's other keys; empty for a bare list

    def request(self, messages: list[Message], **changes: Any) -> Any:
        """``messages`` in this shape: the list itself, or a request holding it."""
        if self.shape.list_key is None:
            return messages
        return {**self.template, **changes, self.shape.list_key: messages}

    def system(self) -> Any:
        """The request's system prompt (``None`` for a bare list)."""
        key = self.shape.system_key
        return None if key is None else self.template.get(key)


def _ends(messages: Sequence[Mapping[str, Any]], is_result: Callable[[Any], bool]) -> list[int]:
    """Lengths of ``messages`` after each run of tool results."""
    last = len(messages) - 1
    return [
        i + 1
        for i, m in enumerate(messages)
        if is_result(m) and (i == last or not is_result(messages[i + 1]))
    ]


def _anthropic_result(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(b.get("type") == "tool_result" for b in content)


def _chat(memory: AgentMemory, shape: Shape) -> ShapedSession:
    from openai.types.chat import ChatCompletionMessage

    messages: list[Message] = to_openai(memory)
    ends = _ends(messages, lambda m: m["role"] == "tool")
    if shape.sdk:  # the replies as the SDK returned them (choices[0].message)
        messages = [
            ChatCompletionMessage.model_validate(m) if m["role"] == "assistant" else m
            for m in messages
        ]
    template = {"model": "gpt-4o"} if shape.list_key else {}
    return ShapedSession(shape, messages, ends, template)


def _anthropic(memory: AgentMemory, shape: Shape) -> ShapedSession:
    from anthropic.types import ContentBlock
    from pydantic import TypeAdapter

    system, messages = to_anthropic(memory)
    ends = _ends(messages, _anthropic_result)
    template: dict[str, Any] = {}
    if shape.list_key:
        template = {"model": "claude-sonnet-4-5", "max_tokens": 4096, "system": system}
    if shape.sdk:  # {"role": "assistant", "content": response.content}, a cached system
        block = TypeAdapter(ContentBlock)
        for m in messages:
            if m["role"] == "assistant" and isinstance(m["content"], list):
                m["content"] = [block.validate_python(b) for b in m["content"]]
        template["system"] = [
            {"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}
        ]
    return ShapedSession(shape, messages, ends, template)


def _responses_sdk(item: dict[str, Any], n: int) -> Any:
    """A model-side item as the SDK returned it (``response.output``), else ``item``."""
    from openai.types.responses import ResponseOutputItem
    from pydantic import TypeAdapter

    if item.get("type") == "function_call":
        return TypeAdapter(ResponseOutputItem).validate_python(item)
    if item.get("role") == "assistant" and isinstance(item.get("content"), str):
        return TypeAdapter(ResponseOutputItem).validate_python(
            {
                "type": "message",
                "id": f"msg_{n}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": item["content"], "annotations": []}],
            }
        )
    return item


def _responses(memory: AgentMemory, shape: Shape) -> ShapedSession:
    items: list[Message] = responses_input(memory.entries())
    template: dict[str, Any] = {}
    if shape.list_key:  # the system message goes as the request's instructions
        template = {"model": "gpt-4o", "instructions": items[0]["content"]}
        items = items[1:]
    ends = _ends(items, lambda m: m.get("type") == "function_call_output")
    if shape.sdk:
        items = [_responses_sdk(item, n) for n, item in enumerate(items)]
    return ShapedSession(shape, items, ends, template)


def shaped_session(shape: Shape, seed: int, entries: int) -> ShapedSession:
    """The session ``generate_session(seed, entries)`` (ending after a tool batch) in
    ``shape``."""
    memory = generate_session(seed, entries, end_mid_round=True)
    if shape.format == "openai":
        return _chat(memory, shape)
    if shape.format == "anthropic":
        return _anthropic(memory, shape)
    return _responses(memory, shape)


def sized_session(shape: Shape, size: int, calls: int, seed: int) -> tuple[ShapedSession, int]:
    """A session in ``shape`` whose list holds at least ``size`` messages after some tool
    batch, with ``calls`` batches after that one; and that batch's position in ``ends``."""
    entries = size + 8 * calls + 64
    while True:
        session = shaped_session(shape, seed, entries)
        first = next((k for k, end in enumerate(session.ends) if end >= size), None)
        if first is not None and len(session.ends) - first > calls:
            return session, first
        entries = entries * 5 // 4 + 64
