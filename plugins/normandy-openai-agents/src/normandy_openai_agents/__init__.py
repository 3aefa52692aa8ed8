"""Normandy compactors inside the OpenAI Agents SDK, chosen by name.

- :class:`NormandySession`: a ``Session`` wrapping any session (SQLite, in-memory...)
  that keeps its items within the model's window.
- :class:`NormandyInputFilter`: a ``call_model_input_filter`` that compacts the model's
  input before every call, for agents with or without a session.
- :class:`ItemCompactor`: a compactor prepared once for lists of Responses input items.

Kept items come back as the same objects (ids and every field unchanged); a
``function_call`` is never separated from its ``function_call_output``, a ``reasoning``
item stays with the calls it precedes; what is dropped reaches the ``after_compact``
hooks.
"""

from __future__ import annotations

from normandy_openai_agents.adapters import (
    FILTER_ENTRY,
    SESSION_ENTRY,
    SPAN,
    NormandyInputFilter,
    NormandySession,
)
from normandy_openai_agents.compaction import AgentsCompaction, ItemCompactor

__all__ = [
    "FILTER_ENTRY",
    "SESSION_ENTRY",
    "SPAN",
    "AgentsCompaction",
    "ItemCompactor",
    "NormandyInputFilter",
    "NormandySession",
]
