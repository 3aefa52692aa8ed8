"""A client for the Anthropic Messages API over the official ``anthropic`` SDK.

Install with ``pip install normandy-core[anthropic]``; the SDK is imported when a client
is made. Requests are built by :func:`normandy_core.formats.to_anthropic`, replies read
back into Normandy's blocks, thinking signatures included, so they can be replayed
unchanged within a tool round.

Extended thinking follows the API's rules so that no request is one it rejects:

- with thinking on, the final assistant message of an open tool round must start with
  its thinking block. When a mid-round compaction has stripped it (the contract's
  documented recovery), the rest of that round is sent with thinking disabled and the
  reply carries a ``thinking_disabled`` event; the next turn starts with a user
  message, so thinking is on again there (:func:`~normandy_core.clients.thinking_plan`);
- with thinking off, no thinking block is sent at all;
- an earlier assistant message whose thinking is not its first block (a hand-built
  history) has its thinking left out rather than sent in a shape the API refuses.

A history that opens with an assistant message (possible after a compaction) is sent
after a one-line user turn, :data:`CONTINUATION`, since the API wants a user turn first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from normandy_core.clients.base import (
    ModelClientError,
    ModelReply,
    ToolChoice,
    Usage,
    as_entries,
    sdk_options,
    thinking_plan,
)
from normandy_core.formats import TranscriptError, from_anthropic, to_anthropic
from normandy_core.memory import Entry

__all__ = ["CONTINUATION", "MIN_THINKING_BUDGET", "AnthropicClient", "anthropic_request"]

#: The smallest extended-thinking budget the API accepts.
MIN_THINKING_BUDGET = 1024
_THINKING_TYPES = ("thinking", "redacted_thinking")
#: The user turn put before a history that opens with an assistant message.
CONTINUATION = "(The earlier part of this conversation was compacted.)"


def _import_sdk() -> Any:
    try:
        import anthropic
    except ImportError as exc:  # pragma: no cover - the extra is installed in tests
        raise ModelClientError(
            "AnthropicClient needs the anthropic SDK: pip install 'normandy-core[anthropic]'"
        ) from exc
    return anthropic


def _tool_param(tool: Mapping[str, Any]) -> dict[str, Any]:
    if "input_schema" in tool or "function" not in tool:
        out = {k: tool[k] for k in ("name", "description", "input_schema") if k in tool}
        out.setdefault("input_schema", {"type": "object", "properties": {}})
        return out
    fn = tool["function"]  # an OpenAI-style definition
    out = {"name": fn["name"], "input_schema": fn.get("parameters") or {"type": "object"}}
    if fn.get("description"):
        out["description"] = fn["description"]
    return out


def anthropic_request(
    system: str,
    messages: Sequence[Entry] | str,
    *,
    model: str,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: ToolChoice = "auto",
    thinking: int | None = None,
    max_tokens: int = 4096,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The keyword arguments of ``messages.create`` for a request, and the thinking event.

    Pure; :class:`AnthropicClient` sends what it returns. ``thinking`` is raised to
    :data:`MIN_THINKING_BUDGET` when smaller, and ``max_tokens`` to more than it, as the
    API requires. ``tool_choice="none"`` keeps the tool definitions (the history may
    hold tool blocks) and forbids new calls.
    """
    entries = as_entries(messages)
    effective, note = thinking_plan(entries, thinking)
    sys_text, msgs = to_anthropic(entries, system=system or None, strip_thinking=effective is None)
    if effective is not None:
        for m in msgs:
            content = m["content"]
            if m["role"] != "assistant" or isinstance(content, str):
                continue
            has = any(b["type"] in _THINKING_TYPES for b in content)
            if has and content[0]["type"] not in _THINKING_TYPES:
                m["content"] = [b for b in content if b["type"] not in _THINKING_TYPES]
        effective = max(effective, MIN_THINKING_BUDGET)
        max_tokens = max(max_tokens, effective + 1024)
    if msgs and msgs[0]["role"] == "assistant":
        # a compacted history may open with the model's turn; the API wants a user turn first
        msgs.insert(0, {"role": "user", "content": CONTINUATION})
    kwargs: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": msgs}
    if sys_text:
        kwargs["system"] = sys_text
    if tools:
        kwargs["tools"] = [_tool_param(t) for t in tools]
        kwargs["tool_choice"] = {"type": tool_choice}
    if effective is not None:
        kwargs["thinking"] = {"type": "enabled", "budget_tokens": effective}
    return kwargs, note


def _reply(message: Any, note: dict[str, Any] | None) -> ModelReply:
    data = message.model_dump(mode="json") if hasattr(message, "model_dump") else dict(message)
    try:
        entry = from_anthropic([{"role": "assistant", "content": data.get("content") or []}])
    except TranscriptError as exc:
        raise ModelClientError(f"anthropic: unexpected reply content: {exc}") from exc
    blocks = entry.entries()[0].blocks if len(entry) else ()
    u = data.get("usage") or {}
    usage = Usage(
        input_tokens=int(u.get("input_tokens") or 0)
        + int(u.get("cache_creation_input_tokens") or 0)
        + int(u.get("cache_read_input_tokens") or 0),
        output_tokens=int(u.get("output_tokens") or 0),
    )
    return ModelReply(
        content=tuple(blocks),
        stop_reason=str(data.get("stop_reason") or "end_turn"),
        usage=usage,
        model=data.get("model"),
        events=(note,) if note else (),
    )


class AnthropicClient:
    """:class:`~normandy_core.clients.ModelClient` and ``AsyncModelClient`` for Anthropic.

    ``model`` is the default model (a request's ``model`` wins). ``api_key``,
    ``base_url``, ``max_retries`` and ``timeout`` go to the SDK clients, made on first
    use; ready SDK clients can be passed as ``client`` and ``async_client``. Refusals
    raise :class:`~normandy_core.clients.ModelClientError` with the API's message.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = 2,
        timeout: float | None = None,
        client: Any = None,
        async_client: Any = None,
    ) -> None:
        self._sdk = _import_sdk()
        self.model = model
        self._options = sdk_options(
            api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout
        )
        self._client = client
        self._async_client = async_client

    def _kwargs(
        self,
        system: str,
        messages: Sequence[Entry] | str,
        tools: Sequence[Mapping[str, Any]] | None,
        tool_choice: ToolChoice,
        thinking: int | None,
        max_tokens: int,
        model: str | None,
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        name = model or self.model
        if not name:
            raise ModelClientError("anthropic: no model given (AnthropicClient(model=...))")
        return anthropic_request(
            system,
            messages,
            model=name,
            tools=tools,
            tool_choice=tool_choice,
            thinking=thinking,
            max_tokens=max_tokens,
        )

    def _error(self, exc: Exception) -> ModelClientError:
        return ModelClientError(f"anthropic: {type(exc).__name__}: {exc}")

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
        """Send one Messages API request and return the reply."""
        kwargs, note = self._kwargs(
            system, messages, tools, tool_choice, thinking, max_tokens, model
        )
        if self._client is None:
            self._client = self._sdk.Anthropic(**self._options)
        try:
            message = self._client.messages.create(**kwargs)
        except self._sdk.APIError as exc:
            raise self._error(exc) from exc
        return _reply(message, note)

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
        """Send one Messages API request without blocking the event loop."""
        kwargs, note = self._kwargs(
            system, messages, tools, tool_choice, thinking, max_tokens, model
        )
        if self._async_client is None:
            self._async_client = self._sdk.AsyncAnthropic(**self._options)
        try:
            message = await self._async_client.messages.create(**kwargs)
        except self._sdk.APIError as exc:
            raise self._error(exc) from exc
        return _reply(message, note)
