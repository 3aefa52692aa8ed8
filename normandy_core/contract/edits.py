"""Anthropic's server-side context editing, as :class:`AnthropicClient` sends it.

:class:`ContextManagement` says which edits the Messages API applies on its side before
the model reads a request (the ``context_management`` request field):

- ``clear_tool_uses`` (``clear_tool_uses_20250919``): above a trigger, the API clears
  the oldest tool results (and optionally inputs) from what the model sees, keeping the
  newest ``keep`` tool uses;
- ``clear_thinking`` (``clear_thinking_20251015``): the API keeps the thinking of only
  the newest ``keep`` assistant turns (or ``"all"``);
- ``compact`` (``compact_20260112``): above ``trigger`` input tokens the API summarizes
  the conversation into a ``compaction`` block at the start of its reply, and ignores
  everything before that block on later calls.

The edits change only what the model reads: the conversation the client holds is never
altered by them, and the API reports what it cleared in the reply (the client turns it
into a ``context_management`` event). Options are checked where the client is made,
against the limits the API documents (a compaction trigger of at least 50,000 tokens).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from normandy_core.errors import OptionsError

__all__ = [
    "COMPACT_BETA",
    "COMPACT_MIN_TRIGGER",
    "CONTEXT_MANAGEMENT_BETA",
    "ON_DEMAND_COMPACTION_BETA",
    "ClearThinking",
    "ClearToolUses",
    "Compact",
    "ContextManagement",
    "client_edits",
    "context_management",
]

#: The beta header of context editing (``clear_tool_uses``, ``clear_thinking``).
CONTEXT_MANAGEMENT_BETA = "context-management-2025-06-27"
#: The beta header of server compaction (the ``compact_20260112`` edit).
COMPACT_BETA = "compact-2026-01-12"
#: The beta header of on-demand compaction (``"compaction": {"type": "summarize"}``).
ON_DEMAND_COMPACTION_BETA = "compact-2026-09-04"
#: The smallest input-token trigger the API accepts for server compaction.
COMPACT_MIN_TRIGGER = 50_000
#: The API's default trigger of server compaction, in input tokens.
COMPACT_DEFAULT_TRIGGER = 150_000


class _Edit(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _tokens(value: int) -> dict[str, Any]:
    return {"type": "input_tokens", "value": value}


class ClearToolUses(_Edit):
    """``clear_tool_uses_20250919``: clear old tool results on the API's side.

    Unset fields are left to the API's defaults (a trigger of 100,000 input tokens,
    ``keep`` 3 tool uses).
    """

    trigger: int | None = Field(default=None, gt=0)
    """Act above this many input tokens."""
    trigger_tool_uses: int | None = Field(default=None, gt=0)
    """Act above this many tool uses instead (not with ``trigger``)."""
    keep: int | None = Field(default=None, ge=0)
    """How many of the newest tool uses keep their results."""
    clear_at_least: int | None = Field(default=None, gt=0)
    """Clear at least this many input tokens or nothing (a cache rewrite must pay)."""
    exclude_tools: tuple[str, ...] = ()
    """Tools whose uses are never cleared."""
    clear_tool_inputs: bool | tuple[str, ...] = False
    """Also clear the inputs of cleared tool uses (``True``), or of these tools only."""

    @field_validator("exclude_tools", "clear_tool_inputs", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        if isinstance(value, str):
            raise ValueError("expected a list of tool names, not one string")
        return value

    @model_validator(mode="after")
    def _one_trigger(self) -> ClearToolUses:
        if self.trigger is not None and self.trigger_tool_uses is not None:
            raise ValueError("give trigger (input tokens) or trigger_tool_uses, not both")
        return self

    def to_api(self) -> dict[str, Any]:
        """The edit as the API reads it."""
        edit: dict[str, Any] = {"type": "clear_tool_uses_20250919"}
        if self.trigger is not None:
            edit["trigger"] = _tokens(self.trigger)
        elif self.trigger_tool_uses is not None:
            edit["trigger"] = {"type": "tool_uses", "value": self.trigger_tool_uses}
        if self.keep is not None:
            edit["keep"] = {"type": "tool_uses", "value": self.keep}
        if self.clear_at_least is not None:
            edit["clear_at_least"] = _tokens(self.clear_at_least)
        if self.exclude_tools:
            edit["exclude_tools"] = list(self.exclude_tools)
        if self.clear_tool_inputs:
            inputs = self.clear_tool_inputs
            edit["clear_tool_inputs"] = inputs if isinstance(inputs, bool) else list(inputs)
        return edit


class ClearThinking(_Edit):
    """``clear_thinking_20251015``: keep the thinking of the newest ``keep`` assistant
    turns only (``"all"`` keeps all of it; unset: the API's default)."""

    keep: int | Literal["all"] | None = None
    """Assistant turns whose thinking is kept, newest first, or ``"all"``."""

    @field_validator("keep")
    @classmethod
    def _positive(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and (isinstance(value, bool) or value < 1):
            raise ValueError("keep must be a whole number of turns >= 1, or 'all'")
        return value

    def to_api(self) -> dict[str, Any]:
        """The edit as the API reads it."""
        edit: dict[str, Any] = {"type": "clear_thinking_20251015"}
        if self.keep == "all":
            edit["keep"] = "all"
        elif self.keep is not None:
            edit["keep"] = {"type": "thinking_turns", "value": self.keep}
        return edit


class Compact(_Edit):
    """``compact_20260112``: server compaction above ``trigger`` input tokens."""

    trigger: int = Field(default=COMPACT_DEFAULT_TRIGGER, ge=COMPACT_MIN_TRIGGER)
    """Compact above this many input tokens (the API's minimum is 50,000)."""
    pause_after_compaction: bool = False
    """Have the API stop right after the compaction block; the client then sends the
    request again at once, so the reply still holds the model's answer."""
    instructions: str | None = Field(default=None, min_length=1)
    """Replaces the API's summarization prompt."""

    @field_validator("instructions")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("instructions must not be blank (leave them out instead)")
        return value

    def to_api(self) -> dict[str, Any]:
        """The edit as the API reads it."""
        edit: dict[str, Any] = {"type": "compact_20260112", "trigger": _tokens(self.trigger)}
        if self.pause_after_compaction:
            edit["pause_after_compaction"] = True
        if self.instructions is not None:
            edit["instructions"] = self.instructions
        return edit


class ContextManagement(_Edit):
    """The server-side edits an :class:`~normandy_core.clients.AnthropicClient` asks for.

    Each field enables one edit; ``{}`` as its value takes the API's defaults::

        AnthropicClient("claude-sonnet-4-5", context_management={
            "clear_tool_uses": {"trigger": 100_000, "keep": 3},
            "compact": {"trigger": 150_000},
        })
    """

    clear_tool_uses: ClearToolUses | None = None
    """See :class:`ClearToolUses`."""
    clear_thinking: ClearThinking | None = None
    """See :class:`ClearThinking`."""
    compact: Compact | None = None
    """See :class:`Compact`."""

    @property
    def enabled(self) -> bool:
        """Whether any edit is asked for."""
        return any(e is not None for e in (self.clear_tool_uses, self.clear_thinking, self.compact))

    def edits(self) -> list[dict[str, Any]]:
        """The ``context_management.edits`` list (thinking first, as the API asks)."""
        out: list[dict[str, Any]] = []
        if self.clear_thinking is not None:
            out.append(self.clear_thinking.to_api())
        if self.clear_tool_uses is not None:
            out.append(self.clear_tool_uses.to_api())
        if self.compact is not None:
            out.append(self.compact.to_api())
        return out

    def names(self) -> frozenset[str]:
        """The names of the edits asked for (``clear_tool_uses``, ``clear_thinking``,
        ``compact``)."""
        return frozenset(
            name
            for name in ("clear_tool_uses", "clear_thinking", "compact")
            if getattr(self, name) is not None
        )

    def betas(self) -> list[str]:
        """The beta headers the edits need."""
        out: list[str] = []
        if self.clear_tool_uses is not None or self.clear_thinking is not None:
            out.append(CONTEXT_MANAGEMENT_BETA)
        if self.compact is not None:
            out.append(COMPACT_BETA)
        return out


def context_management(
    value: ContextManagement | Mapping[str, Any] | None, *, entry: str
) -> ContextManagement | None:
    """``value`` as a checked :class:`ContextManagement` (``None`` when no edit is asked for).

    :raises OptionsError: naming ``entry`` and the option at fault.
    """
    if value is None or isinstance(value, ContextManagement):
        return value if value is not None and value.enabled else None
    if not isinstance(value, Mapping):
        raise OptionsError(
            f"{entry}: context_management must be a mapping of edits, got {type(value).__name__}"
        )
    try:
        parsed = ContextManagement.model_validate(dict(value))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise OptionsError(f"{entry}: option 'context_management.{where}': {err['msg']}") from exc
    return parsed if parsed.enabled else None


def client_edits(client: Any, edits: ContextManagement | None, *, entry: str) -> None:
    """Refuse a ``client`` that cannot send ``edits`` (an agent config's
    ``context_management``), before a turn's first model call.

    A client says what it can send in ``server_edits`` (a set of edit names: the
    :class:`~normandy_core.clients.AnthropicClient` sends all three, an
    :class:`~normandy_core.clients.OpenAIClient` on the Responses API ``compact``);
    a client without it sends none.

    :raises OptionsError: naming ``entry``, the client and the edits it cannot send.
    """
    if edits is None:
        return
    supported = frozenset(getattr(client, "server_edits", ()) or ())
    missing = sorted(edits.names() - supported)
    if missing:
        can = ", ".join(sorted(supported)) or "none"
        raise OptionsError(
            f"{entry}: the agent config's context_management asks for "
            f"{', '.join(missing)}, which {type(client).__name__} cannot send (it sends: "
            f"{can}); use AnthropicClient for every edit, OpenAIClient(api='responses') for "
            "compact, or leave context_management out"
        )
