"""The options of the ``clear_tool_results`` compactor, validated where a config is made."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from normandy_core import CompactorOptions, CounterSpec

__all__ = [
    "DEFAULT_OFFLOAD_PREVIEW",
    "DEFAULT_PLACEHOLDER",
    "DEFAULT_TRIGGER",
    "RECALL_PLACEHOLDER",
    "ClearToolResultsOptions",
]

#: The text that replaces a cleared tool result.
DEFAULT_PLACEHOLDER = "[tool result cleared to save context; the original was archived]"
#: The default placeholder when the agent's ``recall`` tool is on (``{tool}``: its name).
RECALL_PLACEHOLDER = (
    "[tool result cleared to save context; the `{tool}` tool brings the original back]"
)
#: The share of the usable window (``window - reserved_tokens``) above which the
#: conversation is cleared at the start of a turn, when no trigger is given: close enough
#: to the window to clear rarely, far enough that a turn's first rounds still fit.
DEFAULT_TRIGGER = 0.8
#: The share of ``offload_tokens`` an offloaded result's preview may take (its head and
#: tail together), when ``offload_preview`` is not given: 0.3 of 1,500 tokens is 450.
DEFAULT_OFFLOAD_PREVIEW = 0.3


class ClearToolResultsOptions(CompactorOptions):
    """Options of ``clear_tool_results``; unknown options and bad values are refused.

    The compactor acts when the conversation is over *any* trigger. With none given it
    sizes against the model's window: ``trigger`` is 0.8 of the usable window
    (``window - reserved_tokens``). With a window (that default, or ``trigger`` or
    ``context_window`` given), a mid-round boundary acts only over the usable window
    itself (the contract), and a result still over it says so in meta (``target_met``
    false, ``target_missed`` the reason).
    """

    trigger_tokens: int | None = Field(default=None, gt=0)
    """Act when the conversation plus the system prompt and tool definitions (estimated at
    four characters per token) exceed this many tokens."""
    trigger_tool_uses: int | None = Field(default=None, gt=0)
    """Act when more than this many tool uses (outside ``exclude_tools``) still have their
    content intact."""
    trigger: float | None = Field(default=None, gt=0.0, le=1.0)
    """Act at the start of a turn when the conversation plus the prompt tokens exceed this
    fraction of the usable window (mid-round: the usable window itself). Default 0.8 when
    neither ``trigger_tokens`` nor ``trigger_tool_uses`` is given."""
    reserved_tokens: int = Field(default=4096, ge=0)
    """With a window: room kept free for the model's reply."""
    context_window: int | None = Field(default=None, gt=0)
    """Pins the window in tokens; otherwise the model catalog gives it (when one is used)."""
    keep: int = Field(default=3, ge=0)
    """How many of the newest tool uses to keep intact (whatever their tool)."""
    clear_at_least: int = Field(default=0, ge=0)
    """Clear at least this many tokens or nothing, so a prompt-cache prefix is not broken
    for a trivial gain."""
    clear_tool_inputs: bool = False
    """Also replace the ``input`` of cleared tool uses by ``{}``."""
    exclude_tools: tuple[str, ...] = ()
    """Tool names whose uses and results are never touched."""
    placeholder: str = Field(default=DEFAULT_PLACEHOLDER, min_length=1, max_length=2000)
    """The text a cleared tool result is replaced by. Left at its default with the agent's
    ``recall`` tool on, the text names the tool instead (``RECALL_PLACEHOLDER``). Start a
    text of your own with ``[tool result cleared``
    (:data:`normandy_core.conversation.keys.CLEARED_TAG`) so the result is still recognised as
    cleared when the conversation comes back through a provider's format, which carries no metadata
    (otherwise a later compaction may clear it again, or count it as new growth)."""
    counter: CounterSpec | None = None
    """``estimate``, ``conservative``, a tiktoken encoding or model name. Default: exact
    where tiktoken knows the model's encoding, else ``conservative``."""
    schedule: Literal["threshold", "cost"] = "threshold"
    """``threshold`` clears whenever a trigger is passed (today's behaviour); ``cost``
    clears over a trigger only when that pays for the prompt-cache rewrite it causes
    over the next ``horizon`` calls (see ``docs/cost.md``)."""
    horizon: int = Field(default=50, ge=1, le=10_000)
    """``cost`` only: how many further model calls the cost is weighed over."""

    offload_tokens: int | None = Field(default=None, ge=64)
    """Offload at arrival: a tool result over this many tokens is archived at the first
    boundary that sees it, whatever the triggers, and replaced by a preview (its head and
    tail) naming the reference ``recall`` takes to give it back whole. Off (``None``) by
    default; needs an archive (see ``docs/recall.md``)."""
    offload_preview: float = Field(default=DEFAULT_OFFLOAD_PREVIEW, gt=0.0, le=0.5)
    """``offload_tokens`` only: the share of ``offload_tokens`` the preview's head and tail
    take together, at most (two thirds head, one third tail), plus a two-line frame."""

    @field_validator("exclude_tools", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        if isinstance(value, str):
            raise ValueError("exclude_tools must be a list of tool names, not one string")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ClearToolResultsOptions:
        if self.trigger_tool_uses is not None and self.keep >= self.trigger_tool_uses:
            raise ValueError(
                f"keep ({self.keep}) must be below trigger_tool_uses "
                f"({self.trigger_tool_uses}): otherwise the trigger fires with nothing to clear"
            )
        if self.window_trigger is None and "reserved_tokens" in self.model_fields_set:
            raise ValueError(
                "reserved_tokens applies only when clearing sizes against the window "
                "(no trigger_tokens or trigger_tool_uses, or trigger or context_window given)"
            )
        if self.offload_tokens is None and "offload_preview" in self.model_fields_set:
            raise ValueError("offload_preview applies only with offload_tokens (offload is off)")
        if self.schedule != "cost" and "horizon" in self.model_fields_set:
            raise ValueError(
                f"horizon applies only to schedule 'cost' (schedule is {self.schedule!r})"
            )
        return self

    @property
    def window_trigger(self) -> float | None:
        """The share of the usable window that triggers a clearing: ``trigger``, its
        default when no trigger is given at all, or ``None`` when sized by no window."""
        if self.trigger is not None:
            return self.trigger
        if self.context_window is not None or (
            self.trigger_tokens is None and self.trigger_tool_uses is None
        ):
            return DEFAULT_TRIGGER
        return None
