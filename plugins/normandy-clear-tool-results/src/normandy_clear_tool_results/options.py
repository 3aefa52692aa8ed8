"""The options of the ``clear_tool_results`` compactor, validated where a config is made."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from normandy_core import CompactorOptions, CounterSpec

__all__ = [
    "DEFAULT_PLACEHOLDER",
    "DEFAULT_TRIGGER_TOKENS",
    "RECALL_PLACEHOLDER",
    "ClearToolResultsOptions",
]

#: The text that replaces a cleared tool result.
DEFAULT_PLACEHOLDER = "[tool result cleared to save context; the original was archived]"
#: The default placeholder when the agent's ``recall`` tool is on (``{tool}``: its name).
RECALL_PLACEHOLDER = (
    "[tool result cleared to save context; the `{tool}` tool brings the original back]"
)
#: The token trigger used when neither trigger option is given.
DEFAULT_TRIGGER_TOKENS = 100_000


class ClearToolResultsOptions(CompactorOptions):
    """Options of ``clear_tool_results``; unknown options and bad values are refused.

    The compactor acts when the conversation is over *either* trigger. With neither given,
    ``trigger_tokens`` is 100,000.
    """

    trigger_tokens: int | None = Field(default=None, gt=0)
    """Act when the conversation plus the system prompt and tool definitions (estimated at
    four characters per token) exceed this many tokens."""
    trigger_tool_uses: int | None = Field(default=None, gt=0)
    """Act when more than this many tool uses (outside ``exclude_tools``) still have their
    content intact."""
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
        if self.schedule != "cost" and "horizon" in self.model_fields_set:
            raise ValueError(
                f"horizon applies only to schedule 'cost' (schedule is {self.schedule!r})"
            )
        return self

    @property
    def effective_trigger_tokens(self) -> int | None:
        """``trigger_tokens``, or its default when no trigger is given at all."""
        if self.trigger_tokens is None and self.trigger_tool_uses is None:
            return DEFAULT_TRIGGER_TOKENS
        return self.trigger_tokens
