"""The ``compact_context`` tool's settings and definition: compaction the model asks for.

:class:`CompactToolSettings` turn the tool on for an agent (``AgentConfig(compact_tool=True)``).
The model calls it, with an optional ``focus``, when it is about to start a new phase of
its work; the turn loop answers the call and compacts at the next boundary, forced
(:func:`~normandy_core.run_compaction`'s ``force``), with that focus. The limits it
answers under are :class:`~normandy_core.turn.compact_tool.CompactLimits`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_MIN_CALLS_BETWEEN", "CompactToolSettings", "check_compact_tool"]

#: The default of :attr:`CompactToolSettings.min_calls_between`.
DEFAULT_MIN_CALLS_BETWEEN = 4
#: Tool names both providers accept.
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "focus": {
            "type": "string",
            "description": (
                "What the summary of the earlier conversation must keep in detail for the "
                "work ahead (the task, files, ids, decisions); may be empty."
            ),
        }
    },
    "additionalProperties": False,
}


def _description(settings: CompactToolSettings) -> str:
    return (
        "Compact this conversation: the earlier messages are replaced by a summary before "
        "your next request, so the context window has room for what comes next. Call it "
        "when a phase of your work is done and the next one needs little of its detail; "
        "say in `focus` what the summary must keep. It is accepted at most once every "
        f"{settings.min_calls_between} of your requests, and only when something new "
        "(a tool result or a user message) arrived since the last compaction; otherwise "
        "its answer says why not."
    )


@dataclass(frozen=True)
class CompactToolSettings:
    """The ``compact_context`` tool of an agent (``AgentConfig(compact_tool=...)``).

    ``min_calls_between``: a compaction the tool asks for is accepted at most once every
    this many model calls of a turn (at least 1; the call that asked counts as the
    first), and never twice in a row without new content (a tool result of another tool
    or a user message) between them. ``tool_name`` is the name the model calls it by.

    :raises ValueError: naming the setting and what is allowed.
    """

    min_calls_between: int = DEFAULT_MIN_CALLS_BETWEEN
    tool_name: str = "compact_context"

    def __post_init__(self) -> None:
        n = self.min_calls_between
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(
                "CompactToolSettings: min_calls_between must be a whole number of model "
                f"calls >= 1, got {n!r}"
            )
        if not isinstance(self.tool_name, str) or not _TOOL_NAME.match(self.tool_name):
            raise ValueError(
                "CompactToolSettings: tool_name must be 1 to 64 letters, digits, '_' or '-' "
                f"(what both providers accept), got {self.tool_name!r}"
            )

    def definition(self) -> dict[str, Any]:
        """The tool's definition in the form ``AgentConfig.tools`` holds (``name``,
        ``description``, ``input_schema``); the clients render it for their provider."""
        schema = json.loads(json.dumps(_SCHEMA))  # a copy the caller may change
        return {"name": self.tool_name, "description": _description(self), "input_schema": schema}


def check_compact_tool(
    settings: CompactToolSettings, tools: Sequence[Mapping[str, Any]], *, entry: str
) -> None:
    """Refuse a ``compact_context`` tool whose name a tool of ``tools`` (the recall tool's
    included) already has."""
    for tool in tools:
        fn = tool.get("function")
        name = tool.get("name") or (fn.get("name") if isinstance(fn, Mapping) else None)
        if name == settings.tool_name:
            raise ValueError(
                f"{entry}: compact_tool: tools already has a tool named {name!r}; rename "
                "it, or name this tool otherwise (CompactToolSettings(tool_name=...))"
            )
