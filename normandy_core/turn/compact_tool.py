"""The ``compact_context`` tool in the turn loop: the model asks for a compaction.

With ``AgentConfig(compact_tool=True)`` (:class:`~normandy_core.CompactToolSettings`) the
turn loop offers the tool and answers its calls here. An accepted call makes the
boundary after its tool batch forced (``trigger="forced"``), with the call's ``focus``
for the summarizer; :class:`CompactLimits` decides, and a declined call is answered with
why. The limits hold within a turn (a turn starts with the user's message, which is new
content).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from normandy_core.contract.compact_tool_settings import CompactToolSettings

__all__ = ["CompactLimits", "compact_tool"]


@dataclass
class CompactLimits:
    """The limits of the ``compact_context`` tool over one turn, and its request.

    A call is accepted when no compaction is already asked for in this batch, at least
    ``min_calls_between`` model calls have been made since the call that asked for the
    last accepted one (that call counted), and new content (a result of another tool, or
    the user's message that started the turn) arrived since that compaction. The loop
    tells it of each model call (:meth:`model_called`), of new content
    (:meth:`content_arrived`) and takes the request at the end of each batch
    (:meth:`take`).
    """

    min_calls_between: int
    calls: int = 0
    last: int | None = None
    new_content: bool = True
    requested: bool = False
    focus: str | None = None
    answers: list[dict[str, Any]] = field(default_factory=list)

    def model_called(self) -> None:
        """A model call was answered."""
        self.calls += 1

    def content_arrived(self) -> None:
        """Something the model did not write (another tool's result) joined the conversation."""
        self.new_content = True

    def ask(self, focus: object) -> str | None:
        """A call of the tool with ``focus``: ``None`` when accepted, else why not."""
        why = self._refusal(focus)
        self.answers.append({"accepted": why is None, "reason": why})
        if why is not None:
            return why
        self.requested = True
        self.focus = (focus.strip() or None) if isinstance(focus, str) else None
        self.last = self.calls
        return None

    def _refusal(self, focus: object) -> str | None:
        if focus is not None and not isinstance(focus, str):
            return f"focus must be a string, got {type(focus).__name__}"
        if self.requested:
            return "a compaction is already asked for in this tool batch"
        if self.last is not None and self.calls - self.last < self.min_calls_between:
            since = self.calls - self.last
            return (
                f"at most one compaction every {self.min_calls_between} model calls: the "
                f"last was asked {since} call(s) ago"
            )
        if not self.new_content:
            return "nothing new (no tool result or user message) arrived since the last compaction"
        return None

    def take(self) -> tuple[bool, str | None]:
        """The batch's request (whether a compaction was asked for, its focus), cleared;
        the compaction that follows covers all content so far."""
        asked, focus = self.requested, self.focus
        if asked:
            self.new_content = False
        self.requested, self.focus = False, None
        return asked, focus


def compact_tool(settings: CompactToolSettings, limits: CompactLimits) -> Callable[..., str]:
    """The tool the model calls (``settings.tool_name``), answering under ``limits``."""

    def compact_context(focus: str = "") -> str:
        why = limits.ask(focus)
        if why is not None:
            return f"Not compacted: {why}. Go on with your work."
        said = f" with the focus you gave ({focus.strip()})" if focus.strip() else ""
        return (
            "Compaction accepted: before your next request the earlier conversation is "
            f"replaced by a summary{said}. Go on with your work."
        )

    compact_context.__name__ = settings.tool_name
    return compact_context
