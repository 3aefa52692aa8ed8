"""The ``anthropic_native`` compactor: Anthropic's on-demand compaction, as hookimpls.

The provider is sent what :func:`normandy_native.common.plan` summarizes (through
``AnthropicClient.compact_conversation``); its one ``compaction`` block takes the place
of those entries, in a pinned assistant entry after a one-line user note (the history
must open with a user turn; the client leaves out everything before the block when it
sends the conversation, as the API ignores it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from normandy_core import Entry
from normandy_core.clients.base import ProviderCompaction
from normandy_native import ANTHROPIC_NATIVE
from normandy_native.common import (
    Cannot,
    NativeCompactor,
    Plan,
    ask_provider,
    client_of,
    marker,
)
from normandy_native.options import AnthropicNativeOptions

if TYPE_CHECKING:
    from normandy_core import AgentConfig, CompactionContext

__all__ = [
    "NAME",
    "AnthropicNative",
    "maybe_compact",
    "needs_window",
    "options_model",
    "requires_client",
    "validate_opts",
]

#: The name this compactor is registered under.
NAME = ANTHROPIC_NATIVE


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


class AnthropicNative(NativeCompactor[AnthropicNativeOptions]):
    """``anthropic_native``: Anthropic compacts, through the config's ``AnthropicClient``."""

    name = NAME
    provider = "anthropic"
    wire_format = "anthropic"
    options = AnthropicNativeOptions

    def ask(
        self,
        acc: AgentConfig,
        ctx: CompactionContext,
        opts: AnthropicNativeOptions,
        planned: Plan,
    ) -> ProviderCompaction:
        """The compaction of what ``planned`` sends, with the config's tools and the
        summary instructions (the option's, else the survival rule's), followed by the
        focus of a compaction on request (``ctx.focus``)."""
        messages = planned.sent()
        return ask_provider(
            _client(acc),
            acc.system_prompt,
            messages,
            opts.timeout,
            tools=_tools(acc, messages),
            model=ctx.model,
            instructions=_instructions(opts.instructions or ctx.rules.summary_instructions, ctx),
            max_tokens=opts.max_tokens,
        )

    def rebuild(
        self, planned: Plan, compaction: ProviderCompaction, turn: str
    ) -> tuple[list[Entry], list[Entry]]:
        """The user note and the pinned compaction block, in place of everything sent."""
        sent = planned.sent()
        return [marker(turn), self.compaction_entry(compaction, turn, sent)], sent


def _instructions(configured: str | None, ctx: CompactionContext) -> str | None:
    """The summary instructions sent: the configured ones, then ``ctx.focus``."""
    if ctx.focus is None:
        return configured
    focus = f"Focus of this compaction, asked for by the agent or its application: {ctx.focus}"
    return focus if configured is None else f"{configured}\n\n{focus}"


_COMPACTOR = AnthropicNative()
# The entry point names this module: pluggy registers the hookimpls it finds here.
options_model = _COMPACTOR.options_model
needs_window = _COMPACTOR.needs_window
validate_opts = _COMPACTOR.validate_opts
requires_client = _COMPACTOR.requires_client
maybe_compact = _COMPACTOR.maybe_compact
