"""Normandy compactors inside Google ADK, chosen by name.

- :class:`NormandyPlugin`: an ADK plugin whose ``before_model_callback`` compacts every
  model request's contents, continuing each session's last compaction.
- :class:`ContentsCompactor`: a compactor prepared once for lists of ``google.genai``
  ``Content``, remembering each session's last compaction.

Kept contents come back as the same objects; a ``function_call`` is never separated from
its ``function_response``, thinking stays with its content; what is dropped reaches the
``after_compact`` hooks, once.
"""

from __future__ import annotations

from normandy_adk.compaction import (
    COMPACTOR_ENTRY,
    MAX_SESSIONS,
    ADKCompaction,
    ContentsCompactor,
    Prompt,
)
from normandy_adk.plugin import PLUGIN_ENTRY, PLUGIN_NAME, NormandyPlugin, session_key

__all__ = [
    "COMPACTOR_ENTRY",
    "MAX_SESSIONS",
    "PLUGIN_ENTRY",
    "PLUGIN_NAME",
    "ADKCompaction",
    "ContentsCompactor",
    "NormandyPlugin",
    "Prompt",
    "session_key",
]
