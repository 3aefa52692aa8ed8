"""Normandy compactors inside Strands Agents, chosen by name.

- :class:`NormandyConversationManager`: a Strands ``ConversationManager`` that compacts
  ``agent.messages`` in place before every model call, after each invocation and on a
  context-window overflow.
- :func:`compact_messages`: compact a list of Strands messages once;
  :class:`MessageCompactor` prepares a compactor once for repeated calls.

Kept messages come back as the same dicts (``tracking_id``, ``metadata`` and content
unchanged); a ``toolUse`` is never separated from its ``toolResult``; what is dropped
reaches the ``after_compact`` hooks.
"""

from __future__ import annotations

from normandy_strands.compaction import (
    FUNCTION_ENTRY,
    MessageCompactor,
    StrandsCompaction,
    compact_messages,
)
from normandy_strands.manager import MANAGER_ENTRY, NormandyConversationManager

__all__ = [
    "FUNCTION_ENTRY",
    "MANAGER_ENTRY",
    "MessageCompactor",
    "NormandyConversationManager",
    "StrandsCompaction",
    "compact_messages",
]
