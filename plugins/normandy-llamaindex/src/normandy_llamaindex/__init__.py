"""Normandy compactors inside LlamaIndex agents, chosen by name.

- :class:`NormandyMemory`: a chat memory for LlamaIndex agents (``FunctionAgent``,
  ``ReActAgent``, ``AgentWorkflow``: ``agent.run(msg, memory=...)``) whose ``get`` and
  ``aget`` return the stored history compacted by a named compactor.
- :func:`compact_chat_history`: compact a ``ChatMessage`` list once;
  :class:`ChatCompactor` prepares a compactor once for repeated calls.

Kept messages come back as the same objects; a tool call is never separated from its
result, thinking stays with its message; what is dropped reaches the ``after_compact``
hooks.
"""

from __future__ import annotations

from normandy_llamaindex.compaction import (
    FUNCTION_ENTRY,
    ChatCompactor,
    LlamaIndexCompaction,
    compact_chat_history,
)
from normandy_llamaindex.memory import MEMORY_ENTRY, NormandyMemory

__all__ = [
    "FUNCTION_ENTRY",
    "MEMORY_ENTRY",
    "ChatCompactor",
    "LlamaIndexCompaction",
    "NormandyMemory",
    "compact_chat_history",
]
