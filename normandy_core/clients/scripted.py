"""A model client that replays recorded replies, for the demo and for tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from normandy_core.clients.base import (
    ModelClientError,
    ModelReply,
    ToolChoice,
    Usage,
    as_entries,
    thinking_plan,
)
from normandy_core.conversation.entries import (
    Block,
    Entry,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
)

__all__ = ["ScriptedClient", "ScriptedRequest"]


@dataclass(frozen=True)
class ScriptedRequest:
    """One request a :class:`ScriptedClient` received, as it was sent.

    ``thinking`` is what the caller asked for; ``effective_thinking`` what the request
    used after the provider's thinking rules (see :func:`.thinking_plan`).
    """

    system: str
    messages: tuple[Entry, ...]
    tools: tuple[Mapping[str, Any], ...]
    tool_choice: ToolChoice
    thinking: int | None
    effective_thinking: int | None
    max_tokens: int
    model: str | None


#: A scripted reply: a ready :class:`ModelReply`, or a function of the request.
Script = ModelReply | Callable[[ScriptedRequest], ModelReply]


class ScriptedClient:
    """Replays ``replies`` in order, one per request, and records every request.

    A reply may be a function of the :class:`ScriptedRequest` (to answer with the tool
    ids it was sent, say). As a provider would, a request with thinking off gets the
    reply without its thinking blocks, and a request with ``tool_choice="none"`` gets it
    without tool uses. With ``thinking_rules`` (default) the client applies Anthropic's
    rule for replayed thinking: the rest of an open round whose thinking was stripped is
    answered with thinking disabled, and the reply says so in its ``events``.
    ``input_tokens``, when given, computes the usage a provider would report for a
    request (to exercise calibration). Exhausting the script raises
    :class:`ModelClientError`. Thread-safe; both :meth:`complete` and :meth:`acomplete`.
    """

    def __init__(
        self,
        replies: Iterable[Script],
        *,
        thinking_rules: bool = True,
        input_tokens: Callable[[ScriptedRequest], int] | None = None,
        model: str = "scripted",
    ) -> None:
        self._replies = list(replies)
        self._next = 0
        self._lock = threading.Lock()
        self.thinking_rules = thinking_rules
        self.input_tokens = input_tokens
        self.model = model
        self.requests: list[ScriptedRequest] = []

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]], **kwargs: Any) -> ScriptedClient:
        """A client from JSON-ready records: ``{"content": [blocks], "stop_reason"?, "usage"?}``.

        Blocks are in Normandy's (Anthropic-shaped) form, such as
        ``{"type": "tool_use", "id": "t1", "name": "read", "input": {...}}``.
        """
        replies: list[Script] = []
        for record in records:
            entry = Entry.model_validate(
                {"id": "r", "role": "assistant", "content": list(record.get("content", []))}
            )
            usage = record.get("usage") or {}
            replies.append(
                ModelReply(
                    content=entry.blocks,
                    stop_reason=str(record.get("stop_reason", "end_turn")),
                    usage=Usage(
                        int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))
                    ),
                )
            )
        return cls(replies, **kwargs)

    @property
    def remaining(self) -> int:
        """How many scripted replies are left."""
        return len(self._replies) - self._next

    def complete(
        self,
        system: str,
        messages: Sequence[Entry] | str,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: ToolChoice = "auto",
        thinking: int | None = None,
        max_tokens: int = 4096,
        model: str | None = None,
    ) -> ModelReply:
        """Record the request and return the next scripted reply."""
        entries = as_entries(messages)
        effective, note = (
            thinking_plan(entries, thinking) if self.thinking_rules else (thinking, None)
        )
        request = ScriptedRequest(
            system=system,
            messages=tuple(entries),
            tools=tuple(tools or ()),
            tool_choice=tool_choice,
            thinking=thinking,
            effective_thinking=effective,
            max_tokens=max_tokens,
            model=model,
        )
        reply = self._next_reply(request)
        content = _as_sent(reply.content, request)
        usage = reply.usage
        if self.input_tokens is not None:
            usage = Usage(self.input_tokens(request), usage.output_tokens)
        uses = any(isinstance(block, ToolUseBlock) for block in content)
        stop = "tool_use" if uses else "end_turn"
        events = reply.events + ((note,) if note else ())
        return ModelReply(
            content=content,
            stop_reason=stop,
            usage=usage,
            model=model or self.model,
            events=events,
        )

    def _next_reply(self, request: ScriptedRequest) -> ModelReply:
        """Record ``request`` and take the next scripted reply for it."""
        with self._lock:
            self.requests.append(request)
            if self._next >= len(self._replies):
                raise ModelClientError(
                    f"scripted client: no reply left for request {len(self.requests)} "
                    f"(the script has {len(self._replies)})"
                )
            script = self._replies[self._next]
            self._next += 1
        return script(request) if callable(script) else script

    async def acomplete(
        self,
        system: str,
        messages: Sequence[Entry] | str,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: ToolChoice = "auto",
        thinking: int | None = None,
        max_tokens: int = 4096,
        model: str | None = None,
    ) -> ModelReply:
        """The same as :meth:`complete` (no I/O, so nothing to await)."""
        return self.complete(
            system,
            messages,
            tools=tools,
            tool_choice=tool_choice,
            thinking=thinking,
            max_tokens=max_tokens,
            model=model,
        )


def _as_sent(content: tuple[Block, ...], request: ScriptedRequest) -> tuple[Block, ...]:
    """A reply's blocks as a provider would answer ``request``: no thinking when it used
    none, no tool use when it asked for an answer (and then never an empty one)."""
    if request.effective_thinking is None:
        content = tuple(
            block
            for block in content
            if not isinstance(block, (ThinkingBlock, RedactedThinkingBlock))
        )
    if request.tool_choice == "none":
        content = tuple(block for block in content if not isinstance(block, ToolUseBlock))
        if not content:
            content = (TextBlock(text="(no answer)"),)
    return content
