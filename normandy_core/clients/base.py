"""What every model client speaks: requests in, :class:`ModelReply` out."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from normandy_core.conversation.entries import (
    Block,
    Content,
    Entry,
    OpaqueBlock,
    TextBlock,
    ToolUseBlock,
)
from normandy_core.conversation.structure import open_round_start, starts_with_thinking

__all__ = [
    "AsyncModelClient",
    "CompactionFailure",
    "ContextOverflow",
    "ModelClient",
    "ModelClientError",
    "ModelReply",
    "OVERFLOW_MARGIN",
    "ProviderCompaction",
    "ProviderCompactionError",
    "ToolChoice",
    "Usage",
    "acomplete_text",
    "as_entries",
    "complete_text",
    "holds_provider_compaction",
    "newest_compaction",
    "open_round_start",
    "thinking_plan",
]

#: ``"auto"``: the model may call tools; ``"none"``: it must answer in text (the final call).
ToolChoice = Literal["auto", "none"]


class ModelClientError(RuntimeError):
    """A provider refused a request or could not be reached; the message names the provider."""


#: How far below a request refused as too long its recovery compacts, besides the
#: overshoot the provider reported: a share of the request's count.
OVERFLOW_MARGIN = 0.1


class ContextOverflow(ModelClientError):
    """A provider refused a request as longer than the model's context window.

    Raised by the SDK clients for Anthropic's ``prompt is too long: N tokens > M
    maximum`` (400 ``invalid_request_error``), its 413 ``request_too_large``, and
    OpenAI's ``context_length_exceeded`` (Chat Completions and the Responses API).
    ``size`` and ``limit`` are the input tokens the provider counted and its maximum,
    where its message gives them (``None`` otherwise: the Responses API and a 413 give
    neither); ``status`` the HTTP status, ``code`` the provider's code or error type.
    The turn loop recovers from it once per model call (compact, then retry).
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        status: int,
        code: str | None,
        size: int | None = None,
        limit: int | None = None,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.status = status
        self.code = code
        self.size = size
        self.limit = limit

    @property
    def figures(self) -> str:
        """``"210,000 tokens > 200,000 maximum"``, or what the provider did not say."""
        size = "?" if self.size is None else f"{self.size:,}"
        limit = "?" if self.limit is None else f"{self.limit:,}"
        if self.size is None and self.limit is None:
            return f"size not reported ({self.code or self.status})"
        return f"{size} tokens > {limit} maximum"

    def target(self, counted: int, margin: float = OVERFLOW_MARGIN) -> int:
        """The tokens to compact below, for a request Normandy counted at ``counted``:
        less the overshoot the provider reported (``size - limit``, scaled to Normandy's
        count) and ``margin`` of the request (at least 1)."""
        over = 0
        if self.size and self.limit is not None and self.size > self.limit:
            over = math.ceil((self.size - self.limit) * counted / self.size)
        return max(counted - over - math.ceil(counted * margin), 1)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view, for events."""
        return {
            "provider": self.provider,
            "status": self.status,
            "code": self.code,
            "size": self.size,
            "limit": self.limit,
        }


#: Why a provider's compaction did not happen: the provider could not be reached (or
#: failed on its side), refused the request, does not offer compaction for the model, or
#: answered with something other than one usable compaction.
CompactionFailure = Literal["unreachable", "refused", "unsupported", "failed"]


class ProviderCompactionError(ModelClientError):
    """A provider's own compaction did not happen; ``reason`` says why (:data:`CompactionFailure`).

    Raised by the clients' ``compact_conversation``; the ``anthropic_native`` and
    ``openai_native`` compactors fall back to a portable compactor on it.
    """

    def __init__(self, message: str, reason: CompactionFailure) -> None:
        super().__init__(message)
        self.reason: CompactionFailure = reason


@dataclass(frozen=True)
class Usage:
    """Tokens a provider reported for one call.

    ``input_tokens`` is the whole prompt the provider counted (for Anthropic, cached
    tokens included), so it can be compared with Normandy's estimate of the request.
    """

    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens
        )


@dataclass(frozen=True)
class ModelReply:
    """One model answer: its content blocks, why it stopped, and what it cost.

    ``events`` are notes the client adds about the request it sent (for example
    ``{"type": "thinking_disabled", ...}``); the turn shell copies them into the turn's
    events.
    """

    content: tuple[Block, ...]
    stop_reason: str = "end_turn"
    usage: Usage = field(default_factory=Usage)
    model: str | None = None
    events: tuple[dict[str, Any], ...] = ()

    @property
    def tool_uses(self) -> list[ToolUseBlock]:
        """The tool calls of the reply, in order."""
        return [block for block in self.content if isinstance(block, ToolUseBlock)]

    @property
    def text(self) -> str:
        """The reply's text blocks, joined by newlines."""
        return "\n".join(block.text for block in self.content if isinstance(block, TextBlock))


@dataclass(frozen=True)
class ProviderCompaction:
    """What a provider's on-demand compaction returned, exactly as it returned it.

    ``item`` is the compaction block (Anthropic) or item (OpenAI Responses) as JSON: the
    provider's summary, readable only by that provider, to be sent back unaltered.
    ``kept`` are the items the provider returned before it (the Responses API's
    ``/responses/compact`` gives the conversation's user messages back; Anthropic
    returns none). ``usage`` is what the compaction request cost.
    """

    provider: Literal["anthropic", "openai"]
    item: dict[str, Any]
    kept: tuple[dict[str, Any], ...] = ()
    usage: Usage = field(default_factory=Usage)
    model: str | None = None


def holds_provider_compaction(content: Content) -> bool:
    """Whether ``content`` holds a provider's compaction (Anthropic's ``compaction`` block or
    the Responses API's ``compaction`` item), a summary of everything before it."""
    if isinstance(content, str):
        return False
    return any(isinstance(block, OpaqueBlock) and block.kind == "compaction" for block in content)


def newest_compaction(entries: Sequence[Entry]) -> int | None:
    """Index of the newest entry holding a provider compaction, or ``None``."""
    for i in range(len(entries) - 1, -1, -1):
        if holds_provider_compaction(entries[i].content):
            return i
    return None


def as_entries(messages: Sequence[Entry] | str) -> list[Entry]:
    """``messages`` as entries; a plain string is one user message (for simple prompts)."""
    if isinstance(messages, str):
        return [Entry(id="prompt", role="user", content=messages)]
    return list(messages)


@runtime_checkable
class ModelClient(Protocol):
    """A synchronous model client: one request, one :class:`ModelReply`.

    ``messages`` is the conversation (entries, or a plain prompt string); ``tools`` the
    tool definitions (``name``, ``description``, ``input_schema``); ``tool_choice``
    ``"none"`` asks for a final text answer with tools disabled; ``thinking`` the
    extended-thinking budget in tokens (``None``: off), honoured where the provider has it.
    Raises :class:`ModelClientError` when the provider refuses the request.
    """

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
        """Send one request and return the reply."""
        ...


@runtime_checkable
class AsyncModelClient(Protocol):
    """The asynchronous form of :class:`ModelClient` (same arguments, awaited)."""

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
        """Send one request and return the reply."""
        ...


def thinking_plan(
    entries: Sequence[Entry], thinking: int | None
) -> tuple[int | None, dict[str, Any] | None]:
    """The thinking budget a request over ``entries`` may use, and the event when it cannot.

    With thinking asked for, the final assistant entry of an open tool round must start
    with its thinking block (the provider checks replayed thinking there). When a
    mid-round compaction stripped it (the contract's recovery), the rest of the round is
    sent with thinking disabled: returns ``(None, {"type": "thinking_disabled", ...})``.
    Otherwise returns ``(thinking, None)``. The next turn starts with a user message,
    so thinking is enabled again there.
    """
    if thinking is None:
        return None, None
    at = open_round_start(entries)
    if at is None or starts_with_thinking(entries[at]):
        return thinking, None
    return None, {
        "type": "thinking_disabled",
        "reason": "the open tool round's last assistant message has no thinking block "
        "(stripped by a mid-round compaction); the round finishes without thinking",
        "entry_id": entries[at].id,
    }


def complete_text(
    client: ModelClient,
    prompt: str,
    *,
    system: str = "",
    max_tokens: int = 1024,
    model: str | None = None,
) -> str:
    """A plain completion: send ``prompt`` as one user message, return the reply's text.

    For callers that need text, not a conversation (the summarize strategy). Tools and
    thinking are off.
    """
    reply = client.complete(system, prompt, max_tokens=max_tokens, model=model)
    return reply.text


async def acomplete_text(
    client: AsyncModelClient,
    prompt: str,
    *,
    system: str = "",
    max_tokens: int = 1024,
    model: str | None = None,
) -> str:
    """The asynchronous form of :func:`complete_text`."""
    reply = await client.acomplete(system, prompt, max_tokens=max_tokens, model=model)
    return reply.text
