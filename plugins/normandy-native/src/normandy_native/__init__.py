"""Provider-native compaction: the provider summarizes, Normandy keeps the originals.

Two compactors, selected by name:

- ``anthropic_native``: Anthropic's on-demand compaction (``"compaction": {"type":
  "summarize"}``, beta ``compact-2026-09-04``) through the agent's
  :class:`~normandy_core.clients.AnthropicClient`;
- ``openai_native``: OpenAI's ``POST /v1/responses/compact`` through the agent's
  :class:`~normandy_core.clients.OpenAIClient` speaking the Responses API.

Over their trigger they replace what the provider summarized by its compaction block or
item (pinned, never altered), keep what the survival rules protect unchanged after it,
report every replaced entry in ``dropped`` (so the archive keeps readable originals),
and fall back to a portable compactor (``window_manager``
with ``strategy="summarize"`` by default) when the provider cannot compact, saying so in
meta. Options: :class:`~normandy_native.options.AnthropicNativeOptions` and
:class:`~normandy_native.options.OpenAINativeOptions`.
"""

from __future__ import annotations

from normandy_native.options import AnthropicNativeOptions, NativeOptions, OpenAINativeOptions

__all__ = [
    "ANTHROPIC_NATIVE",
    "OPENAI_NATIVE",
    "AnthropicNativeOptions",
    "NativeOptions",
    "OpenAINativeOptions",
]

#: The name Anthropic's on-demand compaction is registered under.
ANTHROPIC_NATIVE = "anthropic_native"
#: The name OpenAI's ``/responses/compact`` is registered under.
OPENAI_NATIVE = "openai_native"
