"""The ``anthropic_native`` compactor: Anthropic's on-demand compaction, as hookimpls.

The provider is sent what :func:`normandy_native.common.plan` summarizes (through
``AnthropicClient.compact_conversation``); its one ``compaction`` block takes the place
of those entries, in a pinned assistant entry after a one-line user note (the history
must open with a user turn; the client leaves out everything before the block when it
sends the conversation, as the API ignores it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from normandy_core import Entry, OpaqueBlock, hookimpl
from normandy_core.clients.base import ProviderCompaction
from normandy_core.conversation.keys import PROVIDER_COMPACTION_KEY
from normandy_native import ANTHROPIC_NATIVE
from normandy_native.common import (
    NATIVE_KEY,
    Cannot,
    Plan,
    ask_provider,
    check_reserve,
    client_of,
    compact_with_provider,
    marker,
    prepare_fallback,
)
from normandy_native.options import AnthropicNativeOptions

if TYPE_CHECKING:
    from normandy_core import AgentConfig, CompactionContext, SurvivalRules

__all__ = ["NAME", "maybe_compact", "needs_window", "options_model", "validate_opts"]

#: The name this compactor is registered under.
NAME = ANTHROPIC_NATIVE


@hookimpl
def options_model() -> type[AnthropicNativeOptions]:
    """The options are :class:`~normandy_native.options.AnthropicNativeOptions`."""
    return AnthropicNativeOptions


@hookimpl
def needs_window(opts: AnthropicNativeOptions) -> bool:
    """Sizes against the window: it caps the trigger and decides mid-round."""
    return True


@hookimpl
def validate_opts(
    opts: AnthropicNativeOptions, entry: str, window: int | None, rules: SurvivalRules
) -> None:
    """Refuse a window the reserve fills, and prepare the fallback with the same window
    and survival rules."""
    check_reserve(opts, window)
    prepare_fallback(opts, NAME, entry, window, rules)


def _client(acc: AgentConfig) -> Any:
    client = client_of(acc, "anthropic", "AnthropicClient(...)")
    edits = getattr(client, "context_management", None)
    if edits is not None and getattr(edits, "compact", None) is not None:
        raise Cannot(
            "the client asks for server compaction (context_management compact), which "
            "the API does not take together with on-demand compaction blocks",
            "unsupported",
        )
    return client


def _tools(acc: AgentConfig, messages: list[Entry]) -> list[dict[str, Any]] | None:
    """The config's tool definitions, plus a bare one for every tool the history calls
    that they lack: the API refuses tool blocks in a request that defines no such tool."""
    tools = [dict(t) for t in acc.tools]
    known = {t.get("name") or (t.get("function") or {}).get("name") for t in tools}
    for e in messages:
        for use in e.tool_uses:
            if use.name not in known:
                known.add(use.name)
                tools.append({"name": use.name, "input_schema": {"type": "object"}})
    return tools or None


def _ask(
    acc: AgentConfig, ctx: CompactionContext, opts: AnthropicNativeOptions, p: Plan
) -> ProviderCompaction:
    messages = p.sent()
    return ask_provider(
        _client(acc),
        acc.system_prompt,
        messages,
        opts.timeout,
        tools=_tools(acc, messages),
        model=ctx.model,
        instructions=opts.instructions or ctx.rules.summary_instructions,
        max_tokens=opts.max_tokens,
    )


def _rebuild(p: Plan, compaction: ProviderCompaction, turn: str) -> tuple[list[Entry], list[Entry]]:
    sent = p.sent()
    block = OpaqueBlock(format="anthropic", kind="compaction", data=dict(compaction.item))
    entry = Entry(
        id=f"cmp_{turn.split('-', 1)[-1]}",
        turn_id=turn,
        role="assistant",
        content=(block,),
        pinned=True,
        metadata={
            PROVIDER_COMPACTION_KEY: True,
            NATIVE_KEY: {"provider": "anthropic", "replaced_ids": [e.id for e in sent]},
        },
    )
    return [marker(turn), entry], sent


@hookimpl
def maybe_compact(
    acc: AgentConfig, ctx: CompactionContext, opts: AnthropicNativeOptions
) -> tuple[AgentConfig, dict[str, Any]]:
    """Over the trigger, have Anthropic compact the conversation; see the module docs."""
    return compact_with_provider(
        acc,
        ctx,
        opts,
        NAME,
        "anthropic",
        lambda p: _ask(acc, ctx, opts, p),
        _rebuild,
    )
