"""Model clients: the protocols the turn shells use, a scripted client, real providers.

:class:`ModelClient` and :class:`AsyncModelClient` are what the shells (and the
summarize strategy) call. :class:`ScriptedClient` replays recorded replies. The real
clients, :class:`AnthropicClient` (Messages API) and :class:`OpenAIClient` (Chat
Completions or the Responses API), need the extras ``normandy-core[anthropic]`` and
``normandy-core[openai]``; their SDKs are imported only when a client is made.
Provider compaction: :class:`ContextManagement` (Anthropic's server-side edits, given to
``AnthropicClient``), and both clients' ``compact_conversation``, returning a
:class:`ProviderCompaction` or raising :class:`ProviderCompactionError`.

It imports :mod:`normandy_core.transcripts` (the wire formats) and what lies below it.
Inside, the order is: base, exchange; sdk (what the two SDK clients share, their sync and
async calls written once as exchanges); anthropic, openai, scripted; overflow (an SDK's
too-long refusal read from its exception, for code that calls an SDK itself).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from normandy_core.clients.base import (
    OVERFLOW_MARGIN,
    AsyncModelClient,
    ContextOverflow,
    ModelClient,
    ModelClientError,
    ModelReply,
    ProviderCompaction,
    ProviderCompactionError,
    ToolChoice,
    Usage,
    acomplete_text,
    as_entries,
    complete_text,
    open_round_start,
    thinking_plan,
)
from normandy_core.clients.scripted import ScriptedClient, ScriptedRequest
from normandy_core.contract.edits import ContextManagement

__all__ = [
    "AnthropicClient",
    "AsyncModelClient",
    "ContextManagement",
    "ContextOverflow",
    "ModelClient",
    "ModelClientError",
    "ModelReply",
    "OVERFLOW_MARGIN",
    "OpenAIClient",
    "ProviderCompaction",
    "ProviderCompactionError",
    "ScriptedClient",
    "ScriptedRequest",
    "ToolChoice",
    "Usage",
    "acomplete_text",
    "as_entries",
    "complete_text",
    "context_overflow",
    "open_round_start",
    "thinking_plan",
]

_LAZY = {
    "AnthropicClient": "anthropic",
    "OpenAIClient": "openai",
    "context_overflow": "overflow",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'normandy_core.clients' has no attribute {name!r}")
    return getattr(importlib.import_module(f"normandy_core.clients.{module}"), name)


if TYPE_CHECKING:
    from normandy_core.clients.anthropic import AnthropicClient
    from normandy_core.clients.openai import OpenAIClient
    from normandy_core.clients.overflow import context_overflow
