"""A client for the OpenAI Chat Completions and Responses APIs over the official ``openai`` SDK.

Install with ``pip install normandy-core[openai]``; the SDK is imported when a client is
made. ``OpenAIClient(api="chat")`` (the default) speaks Chat Completions: requests are
built by :func:`normandy_core.transcripts.chat.to_openai` (tool uses become ``tool_calls``, the
results of a batch one ``tool`` message each, in order), replies read back into
Normandy's blocks. Chat Completions does not replay reasoning, so thinking blocks are
never sent and the ``thinking`` argument is not used; set ``reasoning_effort`` on the
client for reasoning models.

``OpenAIClient(api="responses")`` speaks the Responses API, statelessly (``store``
false, the whole conversation as ``input`` items, :func:`responses_input`): items in,
items out. A reply's ``reasoning`` items stay in the assistant entry, before the calls
they led to, and go back verbatim with them (their encrypted content is asked for when
``reasoning_effort`` is set); items the conversation does not interpret travel as
opaque blocks, unaltered. ``compact_threshold`` turns on the API's own compaction
(``context_management=[{"type": "compaction", "compact_threshold": N}]``): a reply
may then hold a ``compaction`` item, and every later request starts at the newest one,
keeping the user messages before it (as ``/responses/compact`` does).
:meth:`OpenAIClient.compact_conversation` calls ``POST /v1/responses/compact``.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, Literal, NamedTuple

from normandy_core.clients.base import (
    ContextOverflow,
    ModelClientError,
    ModelReply,
    ProviderCompaction,
    ProviderCompactionError,
    ToolChoice,
    Usage,
    as_entries,
)
from normandy_core.clients.exchange import adrive, drive
from normandy_core.clients.sdk import (
    CompletionRequest,
    Pause,
    SdkClient,
    error_object,
    sdk_options,
)
from normandy_core.conversation.entries import (
    Block,
    DocumentBlock,
    Entry,
    ImageBlock,
    OpaqueBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from normandy_core.errors import OptionsError
from normandy_core.transcripts.chat import to_openai

__all__ = [
    "OpenAIClient",
    "compact_request",
    "from_newest_compaction_item",
    "openai_overflow",
    "openai_request",
    "responses_input",
    "responses_request",
]

#: Which OpenAI API a client speaks.
Api = Literal["chat", "responses"]
#: Opaque Responses parts that sit inside a message's content, not as items of their own.
_PART_KINDS = frozenset({"input_audio"})

_STOP = {"tool_calls": "tool_use", "stop": "end_turn", "length": "max_tokens"}


def _function(tool: Mapping[str, Any]) -> tuple[str, dict[str, Any], Any]:
    """The name, parameters schema and description of a Chat Completions or a Normandy
    (Anthropic-style) tool definition."""
    if tool.get("type") == "function" and "function" in tool:
        fn = tool["function"]
        return fn["name"], fn.get("parameters") or _no_parameters(), fn.get("description")
    return tool["name"], tool.get("input_schema") or _no_parameters(), tool.get("description")


def _no_parameters() -> dict[str, Any]:
    return {"type": "object", "properties": {}}


def _tool_param(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A tool definition for Chat Completions."""
    if tool.get("type") == "function" and "function" in tool:
        return dict(tool)
    name, parameters, description = _function(tool)
    fn: dict[str, Any] = {"name": name, "parameters": parameters}
    if description:
        fn["description"] = description
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
        kwargs["tools"] = [_tool_param(tool) for tool in tools]
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
    message = choice.get("message") or {}
    blocks: list[Block] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        blocks.append(TextBlock(text=text))
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal and not text:
        blocks.append(TextBlock(text=refusal))
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        raw = fn.get("arguments") or "{}"
        try:
            args = json.loads(raw)
        except json.JSONDecodeError:
            args = None
        if not isinstance(args, dict):  # keep the call answerable: the tool will refuse it
            args = {"_invalid_arguments": raw}
        blocks.append(ToolUseBlock(id=call["id"], name=fn.get("name", ""), input=args))
    usage = data.get("usage") or {}
    finish = str(choice.get("finish_reason") or "stop")
    return ModelReply(
        content=tuple(blocks),
        stop_reason=_STOP.get(finish, finish),
        usage=Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)),
        model=data.get("model"),
    )


# -- the Responses API ----------------------------------------------------------------


def _responses_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A tool definition for the Responses API."""
    if tool.get("type") == "function" and "function" not in tool:  # already Responses style
        return dict(tool)
    name, parameters, description = _function(tool)
    out: dict[str, Any] = {
        "type": "function",
        "name": name,
        "parameters": parameters,
        "strict": False,
    }
    if description:
        out["description"] = description
    return out


def _data_url(source: Mapping[str, Any], default: str) -> str:
    if source.get("type") == "base64":
        return f"data:{source.get('media_type', default)};base64,{source.get('data', '')}"
    return str(source.get("url", ""))


def _input_part(block: Block) -> dict[str, Any] | None:
    """A user-side block as a Responses input content part (``None``: not representable)."""
    if isinstance(block, TextBlock):
        return {"type": "input_text", "text": block.text} if block.text else None
    if isinstance(block, ImageBlock):
        source = block.source
        if source.get("type") == "file":
            return {"type": "input_image", "file_id": source.get("file_id"), "detail": "auto"}
        return {
            "type": "input_image",
            "image_url": _data_url(source, "image/png"),
            "detail": "auto",
        }
    if isinstance(block, DocumentBlock):
        source = block.source
        if source.get("type") == "text":
            return {"type": "input_text", "text": str(source.get("data", ""))}
        if source.get("type") == "file":
            return {"type": "input_file", "file_id": source.get("file_id")}
        if source.get("type") == "url":
            return {"type": "input_file", "file_url": str(source.get("url", ""))}
        return {
            "type": "input_file",
            "filename": block.title or "document.pdf",
            "file_data": _data_url(source, "application/pdf"),
        }
    if isinstance(block, OpaqueBlock) and block.format == "responses" and block.kind in _PART_KINDS:
        return dict(block.data)
    return None


def _output_of(result: ToolResultBlock) -> str | list[dict[str, Any]]:
    if isinstance(result.content, str):
        return result.content
    if all(isinstance(part, TextBlock) for part in result.content):
        return result.text()
    parts = (_input_part(block) for block in result.content)
    return [part for part in parts if part is not None]


def _assistant_items(entry: Entry) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            items.append({"role": "assistant", "content": "\n\n".join(texts)})
            texts.clear()

    for block in entry.blocks:
        if isinstance(block, TextBlock):
            if block.text:
                texts.append(block.text)
            continue
        flush()
        if isinstance(block, ToolUseBlock):
            items.append(
                {
                    "type": "function_call",
                    "call_id": block.id,
                    "name": block.name,
                    "arguments": json.dumps(block.input, ensure_ascii=False),
                }
            )
        elif isinstance(block, OpaqueBlock) and block.format == "responses":
            items.append(dict(block.data))  # reasoning, compaction, server tool calls: verbatim
        # thinking and other providers' opaque blocks cannot be read by this API: left out
    flush()
    return items


def _user_items(entry: Entry) -> list[dict[str, Any]]:
    role = "system" if entry.role == "system" else "user"
    if isinstance(entry.content, str):
        return [{"role": role, "content": entry.content}] if entry.content else []
    items: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in entry.content:
        if isinstance(block, ToolResultBlock):
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": block.tool_use_id,
                    "output": _output_of(block),
                }
            )
        elif (
            isinstance(block, OpaqueBlock)
            and block.format == "responses"
            and block.kind not in _PART_KINDS
        ):
            items.append(dict(block.data))  # an output item of a server or computer call, verbatim
        else:
            part = _input_part(block)
            if part is not None:
                parts.append(part)
    if parts:
        items.append({"role": role, "content": parts})
    return items


def responses_input(entries: Sequence[Entry]) -> list[dict[str, Any]]:
    """The entries as Responses API ``input`` items (pure).

    User and system entries become messages (tool results ``function_call_output``
    items, in order, first); an assistant entry becomes its items in order: text as an
    assistant message, tool uses as ``function_call`` items, and the Responses items it
    carries (``reasoning``, ``compaction``, server tool calls) exactly as received.
    Thinking blocks and other providers' opaque blocks are left out (this API cannot
    read them).
    """
    items: list[dict[str, Any]] = []
    for entry in entries:
        items.extend(_assistant_items(entry) if entry.role == "assistant" else _user_items(entry))
    return items


def _is_user_message(item: Mapping[str, Any]) -> bool:
    return item.get("role") == "user" and item.get("type", "message") == "message"


def from_newest_compaction_item(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` from the newest ``compaction`` item on, with the user messages before it.

    What the compaction summarizes need not be sent again (stateless chaining); the user
    messages before it are kept, as ``/responses/compact`` itself returns them.
    """
    at = next(
        (i for i in range(len(items) - 1, -1, -1) if items[i].get("type") == "compaction"), None
    )
    if at is None:
        return items
    return [*(item for item in items[:at] if _is_user_message(item)), *items[at:]]


def responses_request(
    system: str,
    messages: Sequence[Entry] | str,
    *,
    model: str,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: ToolChoice = "auto",
    max_tokens: int = 4096,
    reasoning_effort: str | None = None,
    compact_threshold: int | None = None,
) -> dict[str, Any]:
    """The keyword arguments of ``responses.create`` for a stateless request (pure)."""
    kwargs: dict[str, Any] = {
        "model": model,
        "input": from_newest_compaction_item(responses_input(as_entries(messages))),
        "max_output_tokens": max_tokens,
        "store": False,
    }
    if system:
        kwargs["instructions"] = system
    if tools:
        kwargs["tools"] = [_responses_tool(tool) for tool in tools]
        kwargs["tool_choice"] = tool_choice
    if reasoning_effort is not None:
        kwargs["reasoning"] = {"effort": reasoning_effort}
        kwargs["include"] = ["reasoning.encrypted_content"]
    if compact_threshold is not None:
        kwargs["context_management"] = [
            {"type": "compaction", "compact_threshold": compact_threshold}
        ]
    return kwargs


def compact_request(
    system: str,
    messages: Sequence[Entry],
    *,
    model: str,
    previous_response_id: str | None = None,
) -> dict[str, Any]:
    """The keyword arguments of ``responses.compact`` (``POST /v1/responses/compact``).

    ``system`` goes as ``instructions``; the conversation as ``input`` items, from its
    newest compaction item on.
    """
    kwargs: dict[str, Any] = {
        "model": model,
        "input": from_newest_compaction_item(responses_input(messages)),
    }
    if system:
        kwargs["instructions"] = system
    if previous_response_id is not None:
        kwargs["previous_response_id"] = previous_response_id
    return kwargs


def _arguments(raw: Any) -> dict[str, Any]:
    try:
        args = json.loads(raw or "{}")
    except (TypeError, json.JSONDecodeError):
        args = None
    if not isinstance(args, dict):  # keep the call answerable: the tool will refuse it
        args = {"_invalid_arguments": raw}
    return args


def _responses_reply(data: Mapping[str, Any]) -> ModelReply:
    blocks: list[Block] = []
    for item in data.get("output") or []:
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or []:
                if part.get("type") == "output_text" and part.get("text"):
                    blocks.append(TextBlock(text=part["text"]))
                elif part.get("type") == "refusal" and part.get("refusal"):
                    blocks.append(TextBlock(text=part["refusal"]))
        elif kind == "function_call":
            blocks.append(
                ToolUseBlock(
                    id=item["call_id"],
                    name=item.get("name", ""),
                    input=_arguments(item.get("arguments")),
                )
            )
        elif isinstance(kind, str) and kind:
            blocks.append(
                OpaqueBlock(
                    format="responses", kind=kind, data=dict(item), reasoning=kind == "reasoning"
                )
            )
    events: list[dict[str, Any]] = []
    if any(isinstance(block, OpaqueBlock) and block.kind == "compaction" for block in blocks):
        events.append({"type": "provider_compaction", "provider": "openai", "paused": False})
    details = data.get("incomplete_details") or {}
    if data.get("status") == "incomplete" and details.get("reason") == "max_output_tokens":
        stop = "max_tokens"
    elif any(isinstance(block, ToolUseBlock) for block in blocks):
        stop = "tool_use"
    else:
        stop = "end_turn"
    return ModelReply(
        content=tuple(blocks),
        stop_reason=stop,
        usage=_responses_usage(data),
        model=data.get("model"),
        events=tuple(events),
    )


def _responses_usage(data: Mapping[str, Any]) -> Usage:
    """The usage a Responses API response reports."""
    usage = data.get("usage") or {}
    return Usage(int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0))


def _compacted(data: Mapping[str, Any]) -> ProviderCompaction:
    """The compaction item ``/responses/compact`` returned, and the items before it."""
    output = list(data.get("output") or [])
    if data.get("object") != "response.compaction" or not output:
        raise ProviderCompactionError(
            f"openai: /responses/compact returned object {data.get('object')!r} with "
            f"{len(output)} output items, not a compaction",
            "failed",
        )
    item = output[-1]
    if not isinstance(item, Mapping) or item.get("type") != "compaction":
        raise ProviderCompactionError(
            "openai: /responses/compact did not end its output with a compaction item", "failed"
        )
    if not isinstance(item.get("encrypted_content"), str) or not item["encrypted_content"]:
        raise ProviderCompactionError(
            "openai: the compaction item has no encrypted_content", "failed"
        )
    return ProviderCompaction(
        provider="openai",
        item=dict(item),
        kept=tuple(dict(kept) for kept in output[:-1]),
        usage=_responses_usage(data),
        model=data.get("model"),
    )


def _json(raw: Any) -> dict[str, Any]:
    """The JSON body of an SDK raw response (or a parsed object's dump)."""
    text = getattr(raw, "text", None)
    if isinstance(text, str):
        return dict(json.loads(text))
    if isinstance(raw, Mapping):
        return dict(raw)
    return dict(raw.model_dump(mode="json", exclude_unset=True))


def _threshold(edits: Any, api: str, entry: str) -> int | None:
    """The compaction threshold a request's ``context_management`` asks for (``None``: no
    ``compact``); what the Responses API cannot send is refused, naming it."""
    from normandy_core.contract.edits import context_management

    checked = context_management(edits, entry=entry)
    if checked is None:
        return None
    other = sorted(checked.names() - {"compact"})
    if other or api != "responses":
        what = ", ".join(other) if other else "compact"
        raise OptionsError(
            f"{entry}: context_management asks for {what}, which OpenAI's "
            f"{'Chat Completions' if api == 'chat' else 'Responses'} API does not have"
        )
    compact = checked.compact
    assert compact is not None
    if compact.pause_after_compaction or compact.instructions is not None:
        raise OptionsError(
            f"{entry}: context_management.compact: the Responses API's compaction takes "
            "only a trigger (no pause_after_compaction, no instructions)"
        )
    return compact.trigger


#: Chat Completions' figures: the window, then what the request came to (with the
#: completion's share when the message splits it).
_SIZES = re.compile(
    r"maximum context length is (\d+) tokens\. However, (?:your messages resulted in|"
    r"you requested) (\d+) tokens(?: \((\d+) in the messages, (\d+) in the completion\))?"
)


def openai_overflow(sdk: Any, exc: Exception) -> ContextOverflow | None:
    """The SDK error ``exc`` as a :class:`~normandy_core.clients.ContextOverflow` when the
    API refused the request with code ``context_length_exceeded`` (a ``BadRequestError``),
    else ``None``.

    Chat Completions' message gives the window and the request's tokens (``This model's
    maximum context length is M tokens. However, your messages resulted in N tokens``;
    when it splits the request into messages and completion, the size is the messages'
    and the limit what the completion leaves). The Responses API's (``Your input exceeds
    the context window of this model``) gives neither.
    """
    if not isinstance(exc, sdk.BadRequestError) or exc.code != "context_length_exceeded":
        return None
    message = str(error_object(exc).get("message") or exc.message)
    found = _SIZES.search(message)
    size = limit = None
    if found is not None:
        limit, size = int(found[1]), int(found[2])
        if found[3] is not None:
            size, limit = int(found[3]), limit - int(found[4])
    return ContextOverflow(
        f"openai: {type(exc).__name__} {exc.status_code} context_length_exceeded: {message}",
        provider="openai",
        status=int(exc.status_code),
        code="context_length_exceeded",
        size=size,
        limit=limit,
    )


class SdkCall(NamedTuple):
    """One request to the OpenAI SDK: the method it goes to, found on a sync or an async
    SDK client alike, and its keyword arguments."""

    method: Callable[[Any], Callable[..., Any]]
    kwargs: dict[str, Any]


_CHAT = operator.attrgetter("chat.completions.create")
_RESPONSES = operator.attrgetter("responses.with_raw_response.create")
_COMPACT = operator.attrgetter("responses.with_raw_response.compact")


class OpenAIClient(SdkClient[SdkCall, Any]):
    """:class:`~normandy_core.clients.ModelClient` and ``AsyncModelClient`` for OpenAI.

    ``model`` is the default model (a request's ``model`` wins); ``reasoning_effort`` is
    sent when set. ``api`` chooses Chat Completions (``"chat"``) or the Responses API
    (``"responses"``); ``compact_threshold`` (Responses only) turns on the API's own
    compaction above that many tokens. ``api_key``, ``base_url``, ``max_retries`` and
    ``timeout`` go to the SDK clients, made on first use; ready ones can be passed as
    ``client`` and ``async_client``. Refusals raise
    :class:`~normandy_core.clients.ModelClientError`; a bad ``api`` or
    ``compact_threshold`` raises :class:`~normandy_core.OptionsError` here. On the
    Responses API a request's ``context_management`` (an agent config's, sent by the turn
    shells) may ask for ``compact``: its ``trigger`` is sent as the compaction threshold,
    instead of ``compact_threshold``.
    """

    #: The provider whose compaction :meth:`compact_conversation` asks for.
    provider = "openai"
    _sdk_classes = ("OpenAI", "AsyncOpenAI")

    @property
    def server_edits(self) -> frozenset[str]:
        """The server-side edits this client can send: ``compact`` on the Responses API,
        none on Chat Completions (see :func:`~normandy_core.contract.edits.client_edits`)."""
        return frozenset({"compact"}) if self.api == "responses" else frozenset()

    def __init__(
        self,
        model: str | None = None,
        *,
        api: Api = "chat",
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = 2,
        timeout: float | None = None,
        reasoning_effort: str | None = None,
        compact_threshold: int | None = None,
        client: Any = None,
        async_client: Any = None,
    ) -> None:
        if api not in ("chat", "responses"):
            raise OptionsError(f"OpenAIClient(): api must be 'chat' or 'responses', got {api!r}")
        if compact_threshold is not None:
            if api != "responses":
                raise OptionsError(
                    "OpenAIClient(): compact_threshold needs the Responses API (api='responses')"
                )
            if (
                isinstance(compact_threshold, bool)
                or not isinstance(compact_threshold, int)
                or compact_threshold <= 0
            ):
                raise OptionsError(
                    "OpenAIClient(): compact_threshold must be a positive whole number of "
                    f"tokens, got {compact_threshold!r}"
                )
        self.api: Api = api
        self.compact_threshold = compact_threshold
        self.reasoning_effort = reasoning_effort
        options = sdk_options(
            api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout
        )
        super().__init__(model, options, client=client, async_client=async_client)

    def _overflow(self, exc: Exception) -> ContextOverflow | None:
        return openai_overflow(self._sdk, exc)

    def _send(self, call: SdkCall) -> Any:
        return call.method(self._within_limit(self._sync()))(**call.kwargs)

    async def _asend(self, call: SdkCall) -> Any:
        return await call.method(self._within_limit(self._async()))(**call.kwargs)

    def _kwargs(self, request: CompletionRequest, entry: str) -> dict[str, Any]:
        """The request's keyword arguments for the API the client speaks."""
        threshold = self.compact_threshold
        if request.context_management is not None:
            threshold = _threshold(request.context_management, self.api, entry) or threshold
        options: dict[str, Any] = {
            "model": self._model(request.model),
            "tools": request.tools,
            "tool_choice": request.tool_choice,
            "max_tokens": request.max_tokens,
            "reasoning_effort": self.reasoning_effort,
        }
        if self.api == "responses":
            return responses_request(
                request.system, request.messages, compact_threshold=threshold, **options
            )
        return openai_request(request.system, request.messages, **options)

    def _completion(
        self, request: CompletionRequest, entry: str
    ) -> Generator[SdkCall | Pause, Any, ModelReply]:
        """A Chat Completions or Responses request and its reply (``thinking`` unused;
        ``context_management`` may ask for ``compact`` only, on the Responses API)."""
        kwargs = self._kwargs(request, entry)
        if self.api == "responses":
            raw = yield from self._ask(SdkCall(_RESPONSES, kwargs))
            return _responses_reply(_json(raw))
        completion = yield from self._ask(SdkCall(_CHAT, kwargs))
        return _reply(completion)

    def _compaction(
        self, system: str, messages: Sequence[Entry], model: str | None, previous: str | None
    ) -> Generator[SdkCall | Pause, Any, ProviderCompaction]:
        """A ``/responses/compact`` request and the compaction it returned."""
        kwargs = compact_request(
            system, messages, model=self._model(model), previous_response_id=previous
        )
        raw = yield from self._ask(SdkCall(_COMPACT, kwargs), self._compaction_failure)
        return _compacted(_json(raw))

    def compact_conversation(
        self,
        system: str,
        messages: Sequence[Entry],
        *,
        model: str | None = None,
        previous_response_id: str | None = None,
    ) -> ProviderCompaction:
        """``POST /v1/responses/compact``: the conversation as the API compacts it.

        Returns the compaction item and the user messages the API keeps before it, as
        returned. Raises :class:`~normandy_core.clients.ProviderCompactionError` saying
        whether the API was unreachable, refused, does not support it, or failed.
        """
        steps = self._compaction(system, messages, model, previous_response_id)
        return drive(steps, self._perform)

    async def acompact_conversation(
        self,
        system: str,
        messages: Sequence[Entry],
        *,
        model: str | None = None,
        previous_response_id: str | None = None,
    ) -> ProviderCompaction:
        """:meth:`compact_conversation` without blocking the event loop."""
        steps = self._compaction(system, messages, model, previous_response_id)
        return await adrive(steps, self._aperform)
