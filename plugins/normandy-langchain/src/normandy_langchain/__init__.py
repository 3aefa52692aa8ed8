"""Normandy compactors inside LangChain, chosen by name.

- :class:`NormandyMiddleware`: an agent middleware for ``langchain.agents.create_agent``
  that compacts the state's messages before every model call.
- :func:`compact_messages`: a ``trim_messages``-style function on ``BaseMessage`` lists;
  :class:`MessageCompactor` prepares a compactor once for repeated calls.

Kept messages come back as the same objects (ids, ``additional_kwargs``,
``response_metadata``, tool-call ids unchanged); a tool call is never separated from its
results; what is dropped reaches the ``after_compact`` hooks.
"""

from __future__ import annotations

from normandy_langchain.compaction import (
    FUNCTION_ENTRY,
    LangChainCompaction,
    MessageCompactor,
    compact_messages,
)
from normandy_langchain.middleware import EVENT, MIDDLEWARE_ENTRY, NormandyMiddleware

__all__ = [
    "EVENT",
    "FUNCTION_ENTRY",
    "MIDDLEWARE_ENTRY",
    "LangChainCompaction",
    "MessageCompactor",
    "NormandyMiddleware",
    "compact_messages",
]
