"""A client for the OpenAI Chat Completions API over the official ``openai`` SDK.

Install with ``pip install normandy-core[openai]``; the SDK is imported when a client is
made. Requests are built by :func:`normandy_core.formats.to_openai` (tool uses become
``tool_calls``, the results of a batch one ``tool`` message each, in order), replies
read back into Normandy's blocks. Chat Completions does not replay reasoning, so
thinking blocks are never sent and the ``thinking`` argument is not used; set
``reasoning_effort`` on the client for reasoning models.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from normandy_core.clients.base import (
    ModelClientError,
    ModelReply,
    ToolChoice,
    Usage,
    as_entries,
    sdk_options,
)
from normandy_core.formats import to_openai
from normandy_core.memory import Block, Entry, TextBlock, ToolUseBlock

__all__ = ["OpenAIClient", "openai_request"]

_STOP = {"tool_calls": "tool_use", "stop": "end_turn", "length": "max_tokens"}


def _import_sdk() -> Any:
    try:
        import openai
    except ImportError as exc:  # pragma: no cover - the extra is installed in tests
        raise ModelClientError(
            "OpenAIClient needs the openai SDK: pip install 'normandy-core[openai]'"
        ) from exc
    return openai


def _tool_param(tool: Mapping[str, Any]) -> dict[str, Any]:
    if tool.get("type") == "function" and "function" in tool:
        return dict(tool)
    fn: dict[str, Any] = {
        "name": tool["name"],
        "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
    }
    if tool.get("description"):
        fn["description"] = tool["description"]
    return {"type": "function", "function": fn}


def openai_request(
    system: str,
    messages: Sequence[Entry] | str,
    *,
    model: str,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: ToolChoice = "auto",
    max_tokens: int = 4096,
    reasoning_effort: str | None = None,
) -> dict[str, Any]:
    """The keyword arguments of ``chat.completions.create`` for a request (pure).

    Tool definitions may be Anthropic-style (``name``, ``description``,
    ``input_schema``) or already OpenAI-style.
    """
    kwargs: dict[str, Any] = {
        "model": model,
        "messages": to_openai(as_entries(messages), system=system or None),
        "max_completion_tokens": max_tokens,
    }
    if tools:
        kwargs["tools"] = [_tool_param(t) for t in tools]
        kwargs["tool_choice"] = tool_choice
    if reasoning_effort is not None:
        kwargs["reasoning_effort"] = reasoning_effort
    return kwargs


def _reply(completion: Any) -> ModelReply:
    data = completion.model_dump(mode="json") if hasattr(completion, "model_dump") else completion
    choices = data.get("choices") or []
    if not choices:
        raise ModelClientError("openai: the reply has no choices")
    choice = choices[0]
    msg = choice.get("message") or {}
    blocks: list[Block] = []
    text = msg.get("content")
    if isinstance(text, str) and text:
        blocks.append(TextBlock(text=text))
    refusal = msg.get("refusal")
    if isinstance(refusal, str) and refusal and not text:
        blocks.append(TextBlock(text=refusal))
    for call in msg.get("tool_calls") or []:
        fn = call.get("function") or {}
        raw = fn.get("arguments") or "{}"
        try:
            args = json.loads(raw)
        except json.JSONDecodeError:
            args = None
        if not isinstance(args, dict):  # keep the call answerable: the tool will refuse it
            args = {"_invalid_arguments": raw}
        blocks.append(ToolUseBlock(id=call["id"], name=fn.get("name", ""), input=args))
    u = data.get("usage") or {}
    finish = str(choice.get("finish_reason") or "stop")
    return ModelReply(
        content=tuple(blocks),
        stop_reason=_STOP.get(finish, finish),
        usage=Usage(int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)),
        model=data.get("model"),
    )


class OpenAIClient:
    """:class:`~normandy_core.clients.ModelClient` and ``AsyncModelClient`` for OpenAI.

    ``model`` is the default model (a request's ``model`` wins); ``reasoning_effort`` is
    sent when set. ``api_key``, ``base_url``, ``max_retries`` and ``timeout`` go to the
    SDK clients, made on first use; ready ones can be passed as ``client`` and
    ``async_client``. Refusals raise :class:`~normandy_core.clients.ModelClientError`.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = 2,
        timeout: float | None = None,
        reasoning_effort: str | None = None,
        client: Any = None,
        async_client: Any = None,
    ) -> None:
        self._sdk = _import_sdk()
        self.model = model
        self.reasoning_effort = reasoning_effort
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
        max_tokens: int,
        model: str | None,
    ) -> dict[str, Any]:
        name = model or self.model
        if not name:
            raise ModelClientError("openai: no model given (OpenAIClient(model=...))")
        return openai_request(
            system,
            messages,
            model=name,
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            reasoning_effort=self.reasoning_effort,
        )

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
        """Send one Chat Completions request and return the reply (``thinking`` unused)."""
        kwargs = self._kwargs(system, messages, tools, tool_choice, max_tokens, model)
        if self._client is None:
            self._client = self._sdk.OpenAI(**self._options)
        try:
            completion = self._client.chat.completions.create(**kwargs)
        except self._sdk.APIError as exc:
            raise ModelClientError(f"openai: {type(exc).__name__}: {exc}") from exc
        return _reply(completion)

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
        """Send one Chat Completions request without blocking the event loop."""
        kwargs = self._kwargs(system, messages, tools, tool_choice, max_tokens, model)
        if self._async_client is None:
            self._async_client = self._sdk.AsyncOpenAI(**self._options)
        try:
            completion = await self._async_client.chat.completions.create(**kwargs)
        except self._sdk.APIError as exc:
            raise ModelClientError(f"openai: {type(exc).__name__}: {exc}") from exc
        return _reply(completion)
