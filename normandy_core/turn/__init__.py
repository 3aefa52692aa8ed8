"""The turn loop: a pure state-machine core (:mod:`.core`) and the shells that run it.

:func:`run_turn` and :func:`arun_turn` run one agent turn with a model client and a
tool registry, resolving every boundary through :func:`normandy_core.run_compaction`.
"""

from __future__ import annotations

from normandy_core.turn.core import (
    AppendMessage,
    Budget,
    CallModel,
    CompactionDone,
    DispatchTools,
    Effect,
    Emit,
    Event,
    Finish,
    FinishReason,
    InvalidTransition,
    MaybeCompact,
    ModelReplied,
    Phase,
    ToolResults,
    TurnError,
    TurnState,
    UserInput,
    boundary_summary,
    start,
    step,
)
from normandy_core.turn.shell import Tool, TurnAborted, TurnResult, arun_turn, run_turn, tool_result
from normandy_core.turn.tools import (
    ToolDefinitionError,
    UndeclaredToolWarning,
    declare_tools,
    tool_definition,
)

__all__ = [
    "AppendMessage",
    "Budget",
    "CallModel",
    "CompactionDone",
    "DispatchTools",
    "Effect",
    "Emit",
    "Event",
    "Finish",
    "FinishReason",
    "InvalidTransition",
    "MaybeCompact",
    "ModelReplied",
    "Phase",
    "Tool",
    "ToolDefinitionError",
    "ToolResults",
    "TurnAborted",
    "TurnError",
    "TurnResult",
    "TurnState",
    "UndeclaredToolWarning",
    "UserInput",
    "arun_turn",
    "boundary_summary",
    "declare_tools",
    "run_turn",
    "start",
    "step",
    "tool_definition",
    "tool_result",
]
