"""A client for the Anthropic Messages API over the official ``anthropic`` SDK.

Install with ``pip install normandy-core[anthropic]``; the SDK is imported when a client
is made. Requests are built by
:func:`normandy_core.transcripts.anthropic.to_anthropic`, replies read back into
Normandy's blocks, thinking signatures included, so they can be replayed unchanged within
a tool round.

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

Provider compaction (see :mod:`normandy_core.contract.edits` and the ``anthropic_native``
compactor):

- a ``compaction`` block is a summary of everything before it, and the API ignores what
  precedes it: every request starts at the newest one (an assistant message opening with
  it, as the API's own tool runner sends it), and it is sent back exactly as received;
- ``context_management`` edits, given when the client is made, go with every request,
  with their beta headers; what the API cleared comes back as a ``context_management``
  event of the reply, and a compaction it made as a ``provider_compaction`` event;
- with ``pause_after_compaction`` the API stops after the compaction block; the client
  sends the request again at once (the block in place) and returns one reply holding
  the block and the model's answer;
- :meth:`AnthropicClient.compact_conversation` asks for an on-demand compaction
  (``"compaction": {"type": "summarize"}``), which returns one compaction block.

Replies are read from the response's JSON as sent, so opaque blocks keep exactly the
fields the API gave them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

from normandy_core.clients.base import (
    ContextOverflow,
    ModelClientError,
    ModelReply,
    ProviderCompaction,
    ProviderCompactionError,
    ToolChoice,
    Usage,
    as_entries,
    thinking_plan,
)
from normandy_core.clients.exchange import adrive, drive
from normandy_core.clients.sdk import (
    CompletionRequest,
    Pause,
    SdkClient,
    error_object,
    sdk_options,
)
from normandy_core.contract.edits import (
    COMPACT_BETA,
    ON_DEMAND_COMPACTION_BETA,
    ContextManagement,
    context_management as _checked_edits,
)
from normandy_core.conversation.entries import Entry
from normandy_core.transcripts.anthropic import from_anthropic, to_anthropic
from normandy_core.transcripts.formats import TranscriptError

__all__ = [
    "CONTINUATION",
    "MIN_THINKING_BUDGET",
    "AnthropicClient",
    "anthropic_overflow",
    "anthropic_request",
    "compaction_request",
    "from_newest_compaction",
]

#: The smallest extended-thinking budget the API accepts.
MIN_THINKING_BUDGET = 1024
_THINKING_TYPES = ("thinking", "redacted_thinking")
#: The user turn put before a history that opens with an assistant message.
CONTINUATION = "(The earlier part of this conversation was compacted.)"


def _tool_param(tool: Mapping[str, Any]) -> dict[str, Any]:
    if "input_schema" in tool or "function" not in tool:
        out = {key: tool[key] for key in ("name", "description", "input_schema") if key in tool}
        out.setdefault("input_schema", {"type": "object", "properties": {}})
        return out
    fn = tool["function"]  # an OpenAI-style definition
    out = {"name": fn["name"], "input_schema": fn.get("parameters") or {"type": "object"}}
    if fn.get("description"):
        out["description"] = fn["description"]
    return out


def _is_compaction(block: Mapping[str, Any]) -> bool:
    return block.get("type") == "compaction"


def _thinking_at(content: list[dict[str, Any]]) -> int:
    """Where the blocks that the thinking rules judge start: after a leading compaction."""
    at = 0
    while at < len(content) and _is_compaction(content[at]):
        at += 1
    return at


def from_newest_compaction(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``msgs`` from the newest compaction block on (the API ignores what precedes it).

    The message holding it keeps the blocks from it on; it becomes the first message.
    """
    for i in range(len(msgs) - 1, -1, -1):
        content = msgs[i]["content"]
        if isinstance(content, str):
            continue
        for j in range(len(content) - 1, -1, -1):
            if _is_compaction(content[j]):
                if i == 0 and j == 0:
                    return msgs
                return [{**msgs[i], "content": list(content[j:])}, *msgs[i + 1 :]]
    return msgs


def _holds_compaction(msgs: list[dict[str, Any]]) -> bool:
    return any(
        not isinstance(message["content"], str)
        and any(_is_compaction(block) for block in message["content"])
        for message in msgs
    )


def anthropic_request(
    system: str,
    messages: Sequence[Entry] | str,
    *,
    model: str,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: ToolChoice = "auto",
    thinking: int | None = None,
    max_tokens: int = 4096,
    context_management: ContextManagement | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The keyword arguments of ``messages.create`` for a request, and the thinking event.

    Pure; :class:`AnthropicClient` sends what it returns. ``thinking`` is raised to
    :data:`MIN_THINKING_BUDGET` when smaller, and ``max_tokens`` to more than it, as the
    API requires. ``tool_choice="none"`` keeps the tool definitions (the history may
    hold tool blocks) and forbids new calls. The messages start at the newest
    ``compaction`` block (:func:`from_newest_compaction`). ``context_management`` adds
    its edits; the beta headers needed (by the edits, or by a compaction block sent
    back) are under ``betas``, and such a request goes to ``beta.messages.create``.
    """
    entries = as_entries(messages)
    effective, note = thinking_plan(entries, thinking)
    sys_text, msgs = to_anthropic(entries, system=system or None, strip_thinking=effective is None)
    msgs = from_newest_compaction(msgs)
    if effective is not None:
        for message in msgs:
            content = message["content"]
            if message["role"] != "assistant" or isinstance(content, str):
                continue
            has = any(block["type"] in _THINKING_TYPES for block in content)
            at = _thinking_at(content)
            if has and (at >= len(content) or content[at]["type"] not in _THINKING_TYPES):
                message["content"] = [
                    block for block in content if block["type"] not in _THINKING_TYPES
                ]
        effective = max(effective, MIN_THINKING_BUDGET)
        max_tokens = max(max_tokens, effective + 1024)
    opens_with_compaction = bool(msgs) and not isinstance(msgs[0]["content"], str)
    opens_with_compaction = opens_with_compaction and _is_compaction(msgs[0]["content"][0])
    if msgs and msgs[0]["role"] == "assistant" and not opens_with_compaction:
        # a compacted history may open with the model's turn; the API wants a user turn first
        msgs.insert(0, {"role": "user", "content": CONTINUATION})
    kwargs: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": msgs}
    if sys_text:
        kwargs["system"] = sys_text
    if tools:
        kwargs["tools"] = [_tool_param(tool) for tool in tools]
        kwargs["tool_choice"] = {"type": tool_choice}
    if effective is not None:
        kwargs["thinking"] = {"type": "enabled", "budget_tokens": effective}
    betas: list[str] = []
    if context_management is not None:
        kwargs["context_management"] = {"edits": context_management.edits()}
        betas.extend(context_management.betas())
    if COMPACT_BETA not in betas and _holds_compaction(msgs):
        betas.append(ON_DEMAND_COMPACTION_BETA)
    if betas:
        kwargs["betas"] = betas
    return kwargs, note


def compaction_request(
    system: str,
    messages: Sequence[Entry],
    *,
    model: str,
    tools: Sequence[Mapping[str, Any]] | None = None,
    instructions: str | None = None,
    max_tokens: int = 4096,
) -> dict[str, Any]:
    """The keyword arguments of an on-demand compaction request (pure).

    The conversation goes as a normal request would carry it (from its newest compaction
    block, thinking left out, tool definitions kept since the history holds tool
    blocks), with ``"compaction": {"type": "summarize"}`` and the on-demand compaction
    beta header, and without ``tool_choice`` or ``context_management``, which the API
    does not take with it. ``instructions`` replace the API's summarization prompt.
    """
    kwargs, _ = anthropic_request(
        system, messages, model=model, tools=tools, thinking=None, max_tokens=max_tokens
    )
    kwargs.pop("tool_choice", None)
    compaction: dict[str, Any] = {"type": "summarize"}
    if instructions is not None and instructions.strip():
        compaction["instructions"] = instructions
    kwargs["compaction"] = compaction
    kwargs["betas"] = [ON_DEMAND_COMPACTION_BETA]
    return kwargs


def _as_data(message: Any) -> dict[str, Any]:
    if isinstance(message, Mapping):
        return dict(message)
    dump = getattr(message, "to_dict", None)
    if callable(dump):
        return dict(dump())
    return dict(message.model_dump(mode="json", exclude_unset=True))


def _usage(data: Mapping[str, Any]) -> Usage:
    usage = data.get("usage") or {}
    return Usage(
        input_tokens=int(usage.get("input_tokens") or 0)
        + int(usage.get("cache_creation_input_tokens") or 0)
        + int(usage.get("cache_read_input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
    )


def _total(items: Sequence[Mapping[str, Any]], key: str) -> int:
    """The sum of ``key`` over ``items`` (a missing or null one counts 0)."""
    return sum(int(item.get(key) or 0) for item in items)


def _reply_events(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``context_management`` and ``provider_compaction`` events of one response."""
    events: list[dict[str, Any]] = []
    applied = list((data.get("context_management") or {}).get("applied_edits") or [])
    if applied:
        events.append(
            {
                "type": "context_management",
                "provider": "anthropic",
                "applied_edits": applied,
                "cleared_tool_uses": _total(applied, "cleared_tool_uses"),
                "cleared_thinking_turns": _total(applied, "cleared_thinking_turns"),
                "cleared_input_tokens": _total(applied, "cleared_input_tokens"),
            }
        )
    if any(_is_compaction(block) for block in data.get("content") or []):
        iterations = (data.get("usage") or {}).get("iterations") or []
        spent = [iteration for iteration in iterations if iteration.get("type") == "compaction"]
        events.append(
            {
                "type": "provider_compaction",
                "provider": "anthropic",
                "paused": data.get("stop_reason") == "compaction",
                "usage": {
                    "input_tokens": _total(spent, "input_tokens"),
                    "output_tokens": _total(spent, "output_tokens"),
                },
            }
        )
    return events


def _reply(datas: Sequence[Mapping[str, Any]], note: dict[str, Any] | None) -> ModelReply:
    """One reply from one response, or from a paused one and its continuation."""
    content: list[Any] = [block for data in datas for block in data.get("content") or []]
    try:
        read = from_anthropic([{"role": "assistant", "content": content}])
    except TranscriptError as exc:
        raise ModelClientError(f"anthropic: unexpected reply content: {exc}") from exc
    blocks = read.entries()[0].blocks if len(read) else ()
    usage = Usage()
    events: list[dict[str, Any]] = [note] if note else []
    for data in datas:
        usage = usage + _usage(data)
        events.extend(_reply_events(data))
    last = datas[-1]
    return ModelReply(
        content=tuple(blocks),
        stop_reason=str(last.get("stop_reason") or "end_turn"),
        usage=usage,
        model=last.get("model"),
        events=tuple(events),
    )


def _paused(data: Mapping[str, Any], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The request continuing a reply paused after server compaction, else ``None``."""
    if data.get("stop_reason") != "compaction" or "compaction" in kwargs:
        return None
    turn = {"role": "assistant", "content": list(data.get("content") or [])}
    return {**kwargs, "messages": from_newest_compaction([*kwargs["messages"], turn])}


def _compaction(data: Mapping[str, Any]) -> ProviderCompaction:
    """The one compaction block an on-demand compaction returned, as returned."""
    content = list(data.get("content") or [])
    if data.get("stop_reason") != "compaction" or len(content) != 1:
        raise ProviderCompactionError(
            "anthropic: the compaction request returned "
            f"stop_reason {data.get('stop_reason')!r} with {len(content)} blocks, not one "
            "compaction block",
            "failed",
        )
    block = content[0]
    if not isinstance(block, Mapping) or not _is_compaction(block):
        kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
        raise ProviderCompactionError(
            f"anthropic: the compaction request returned a {kind!r} block, not a compaction",
            "failed",
        )
    text = block.get("content")
    if not isinstance(text, str) or not text.strip():
        raise ProviderCompactionError(
            "anthropic: the compaction block holds no summary (the API could not summarize)",
            "failed",
        )
    return ProviderCompaction(
        provider="anthropic", item=dict(block), usage=_usage(data), model=data.get("model")
    )


#: The Messages API's refusal of a prompt over the window, and of one that leaves the
#: reply's ``max_tokens`` no room (input + max_tokens > window).
_TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")
_NO_ROOM = re.compile(r"exceed context limit: (\d+) \+ (\d+) > (\d+)")


def anthropic_overflow(sdk: Any, exc: Exception) -> ContextOverflow | None:
    """The SDK error ``exc`` as a :class:`~normandy_core.clients.ContextOverflow` when the
    Messages API refused the request as too long, else ``None``.

    A 413 ``request_too_large`` (the request's bytes) gives no figures. A 400
    ``invalid_request_error`` has no code of its own, so its message says which refusal
    it is: ``prompt is too long: N tokens > M maximum``, or ``input length and
    `max_tokens` exceed context limit: N + R > W`` (then the limit is ``W - R``, the
    room the reply's ``max_tokens`` leaves).
    """
    if not isinstance(exc, sdk.APIStatusError):
        return None
    status = int(exc.status_code)
    error = error_object(exc)
    kind = error.get("type")
    message = str(error.get("message") or "")
    size = limit = None
    if status == 413 and kind == "request_too_large":
        pass
    elif status == 400 and kind == "invalid_request_error":
        long, room = _TOO_LONG.search(message), _NO_ROOM.search(message)
        if long is not None:
            size, limit = int(long[1]), int(long[2])
        elif room is not None:
            size, limit = int(room[1]), int(room[3]) - int(room[2])
        else:
            return None
    else:
        return None
    return ContextOverflow(
        f"anthropic: {type(exc).__name__} {status} {kind}: {message}",
        provider="anthropic",
        status=status,
        code=str(kind),
        size=size,
        limit=limit,
    )


def _create(sdk_client: Any, kwargs: Mapping[str, Any]) -> tuple[Callable[..., Any], bool]:
    """The SDK's ``create`` for a request (on ``beta.messages`` when it needs beta headers),
    in its raw-response form where the SDK client has one, and whether it is."""
    resource = sdk_client.beta.messages if "betas" in kwargs else sdk_client.messages
    raw = getattr(resource, "with_raw_response", None)
    if raw is None:  # a stand-in SDK client without raw responses
        return resource.create, False
    return raw.create, True


class AnthropicClient(SdkClient[dict[str, Any], dict[str, Any]]):
    """:class:`~normandy_core.clients.ModelClient` and ``AsyncModelClient`` for Anthropic.

    ``model`` is the default model (a request's ``model`` wins). ``api_key``,
    ``base_url``, ``max_retries`` and ``timeout`` go to the SDK clients, made on first
    use; ready SDK clients can be passed as ``client`` and ``async_client``. Refusals
    raise :class:`~normandy_core.clients.ModelClientError` with the API's message.
    ``context_management`` asks for server-side edits on every request (a
    :class:`~normandy_core.contract.edits.ContextManagement` or its mapping, checked
    here: a bad one raises :class:`~normandy_core.OptionsError`); a request's own
    ``context_management`` (an agent config's, sent by the turn shells) wins over it.
    """

    #: The provider whose compaction :meth:`compact_conversation` asks for.
    provider = "anthropic"
    _sdk_classes = ("Anthropic", "AsyncAnthropic")
    #: The server-side edits this client can send (see
    #: :func:`~normandy_core.contract.edits.client_edits`).
    server_edits = frozenset({"clear_tool_uses", "clear_thinking", "compact"})

    def __init__(
        self,
        model: str | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = 2,
        timeout: float | None = None,
        context_management: ContextManagement | Mapping[str, Any] | None = None,
        client: Any = None,
        async_client: Any = None,
    ) -> None:
        self.context_management = _checked_edits(context_management, entry="AnthropicClient()")
        options = sdk_options(
            api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout
        )
        super().__init__(model, options, client=client, async_client=async_client)

    def _overflow(self, exc: Exception) -> ContextOverflow | None:
        return anthropic_overflow(self._sdk, exc)

    def _send(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        create, raw = _create(self._within_limit(self._sync()), kwargs)
        response = create(**kwargs)
        return dict(response.json()) if raw else _as_data(response)

    async def _asend(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        create, raw = _create(self._within_limit(self._async()), kwargs)
        response = await create(**kwargs)
        return dict(await response.json()) if raw else _as_data(response)

    def _completion(
        self, request: CompletionRequest, entry: str
    ) -> Generator[dict[str, Any] | Pause, Any, ModelReply]:
        """A Messages API request, and the request continuing it when the API paused after
        compacting; one reply from both."""
        edits = _checked_edits(request.context_management, entry=entry)
        kwargs, note = anthropic_request(
            request.system,
            request.messages,
            model=self._model(request.model),
            tools=request.tools,
            tool_choice=request.tool_choice,
            thinking=request.thinking,
            max_tokens=request.max_tokens,
            context_management=edits if edits is not None else self.context_management,
        )
        datas = [(yield from self._ask(kwargs))]
        follow = _paused(datas[0], kwargs)
        if follow is not None:
            datas.append((yield from self._ask(follow)))
        return _reply(datas, note)

    def _compaction(
        self,
        system: str,
        messages: Sequence[Entry],
        tools: Sequence[Mapping[str, Any]] | None,
        model: str | None,
        instructions: str | None,
        max_tokens: int,
    ) -> Generator[dict[str, Any] | Pause, Any, ProviderCompaction]:
        """An on-demand compaction request and the one compaction block it returned."""
        kwargs = compaction_request(
            system,
            messages,
            model=self._model(model),
            tools=tools,
            instructions=instructions,
            max_tokens=max_tokens,
        )
        data = yield from self._ask(kwargs, self._compaction_failure)
        return _compaction(data)

    def compact_conversation(
        self,
        system: str,
        messages: Sequence[Entry],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        model: str | None = None,
        instructions: str | None = None,
        max_tokens: int = 4096,
    ) -> ProviderCompaction:
        """Ask the API to summarize ``messages`` now (on-demand compaction).

        Returns the one ``compaction`` block it made, exactly as returned, to be sent
        back in place of the messages it summarizes. Raises
        :class:`~normandy_core.clients.ProviderCompactionError` saying whether the API
        was unreachable, refused, does not support it for the model, or failed.
        """
        steps = self._compaction(system, messages, tools, model, instructions, max_tokens)
        return drive(steps, self._perform)

    async def acompact_conversation(
        self,
        system: str,
        messages: Sequence[Entry],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        model: str | None = None,
        instructions: str | None = None,
        max_tokens: int = 4096,
    ) -> ProviderCompaction:
        """:meth:`compact_conversation` without blocking the event loop."""
        steps = self._compaction(system, messages, tools, model, instructions, max_tokens)
        return await adrive(steps, self._aperform)
