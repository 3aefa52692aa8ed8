"""Normandy compactors inside Pydantic AI, chosen by name.

- :class:`NormandyHistoryProcessor` (and :class:`AsyncNormandyHistoryProcessor`): a
  history processor for Pydantic AI agents (``ProcessHistory`` capability) that compacts
  the history before every model request.
- :func:`compact_history`: compact a ``ModelMessage`` list once;
  :class:`HistoryCompactor` prepares a compactor once for repeated calls.

Kept messages come back as the same objects (parts, timestamps, usage, provider ids and
metadata unchanged); a ``ToolCallPart`` is never separated from its ``ToolReturnPart``,
thinking stays with its response; what is dropped reaches the ``after_compact`` hooks.
"""

from __future__ import annotations

from normandy_pydantic_ai.history import (
    FUNCTION_ENTRY,
    HistoryCompactor,
    PydanticAICompaction,
    compact_history,
    read_history,
)
from normandy_pydantic_ai.processor import (
    ASYNC_PROCESSOR_ENTRY,
    PROCESSOR_ENTRY,
    AsyncNormandyHistoryProcessor,
    NormandyHistoryProcessor,
)

__all__ = [
    "ASYNC_PROCESSOR_ENTRY",
    "FUNCTION_ENTRY",
    "PROCESSOR_ENTRY",
    "AsyncNormandyHistoryProcessor",
    "HistoryCompactor",
    "NormandyHistoryProcessor",
    "PydanticAICompaction",
    "compact_history",
    "read_history",
]
