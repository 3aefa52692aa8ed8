"""The ``clear_tool_results`` compactor: clear old tool results in place, keep the structure.

Select it by name: ``AgentConfig(compactor="clear_tool_results", compactor_opts={...})``.
Its options are :class:`~normandy_clear_tool_results.options.ClearToolResultsOptions`;
``offload_tokens`` offloads large results at arrival (:mod:`normandy_clear_tool_results.offload`).
"""

from __future__ import annotations

from normandy_clear_tool_results.options import (
    DEFAULT_OFFLOAD_PREVIEW,
    DEFAULT_PLACEHOLDER,
    RECALL_PLACEHOLDER,
    ClearToolResultsOptions,
)
from normandy_core.conversation import keys

__all__ = [
    "CLEARED_KEY",
    "DEFAULT_OFFLOAD_PREVIEW",
    "DEFAULT_PLACEHOLDER",
    "NAME",
    "RECALL_PLACEHOLDER",
    "ClearToolResultsOptions",
]

#: The name this compactor is registered under.
NAME = "clear_tool_results"
#: Entry metadata key listing the tool-use ids whose content this compactor cleared.
CLEARED_KEY = keys.CLEARED_KEY
