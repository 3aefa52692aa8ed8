"""The options of the ``window_manager`` compactor, validated where a config is made."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from normandy_core import CompactorOptions, CounterSpec
from normandy_window_manager.handoff import check_template

__all__ = ["WindowManagerOptions"]

Strategy = Literal["oldest_first", "sliding_window", "summarize"]
Schedule = Literal["threshold", "cost"]


class WindowManagerOptions(CompactorOptions):
    """Options of ``window_manager``. Unknown options and bad values are refused at config time.

    The usable window is ``window - reserved_tokens``. At the start of a turn the compactor
    acts when the conversation plus the prompt tokens exceed ``trigger`` of it; mid-round
    only when they exceed the usable window itself (the contract: the memory stays
    unchanged mid-round while it fits). It then compacts down to ``target`` of it, so with
    ``target`` below ``trigger`` a long session compacts rarely.

    With ``schedule="cost"`` the compactor decides by what compacting costs with prompt
    caching instead of by ``trigger`` (see ``docs/cost.md``): over the usable window it
    always compacts; at the start of a turn over its floor it compacts when the next call
    without compacting would cost more than the cheapest compaction's billed tokens per call
    over the cycle it starts (at most ``horizon`` calls), the next call being charged too
    the reasoning the coming round would lose if it overflowed the window mid-round
    (``thinking_value``). It cuts to the floor: ``target``
    of the usable window when given, else 25 % (the newest messages; what is cut stays
    archived and recallable), clearing old tool results instead of dropping where that is
    cheaper. It takes strategy ``oldest_first`` or ``summarize`` (``sliding_window``,
    which keeps a number of turns whatever their size, is refused).

    With ``round_aware`` (on by default, ``schedule="threshold"`` only) a turn start also
    compacts when the conversation plus what the coming round is expected to add would not
    fit the usable window, deep enough that it would (see
    :mod:`normandy_window_manager.rounds`): the round then runs with the model's thinking
    intact instead of being compacted mid-round, which strips it.
    """

    strategy: Strategy = "oldest_first"
    """``oldest_first`` drops whole units oldest first; ``sliding_window`` keeps the newest
    ``keep_last_turns`` turns; ``summarize`` replaces the dropped prefix by one summary."""
    reserved_tokens: int = Field(default=4096, ge=0)
    """Room kept free for the model's reply."""
    context_window: int | None = Field(default=None, gt=0)
    """Pins the window in tokens; otherwise the model catalog gives it."""
    trigger: float = Field(default=1.0, gt=0.0, le=1.0)
    """Fraction of the usable window at which to compact at the start of a turn (mid-round:
    only over the usable window)."""
    target: float = Field(default=0.6, gt=0.0, le=1.0)
    """Fraction of the usable window to compact down to (at most ``trigger``). With
    ``schedule="cost"``: the floor it cuts to, 0.25 when not given."""
    keep_last_turns: int | None = Field(default=None, ge=1)
    """``sliding_window`` only: how many of the newest turns to keep (default 3)."""
    counter: CounterSpec | None = None
    """``estimate``, ``conservative``, a tiktoken encoding or model name. Default: exact
    where tiktoken knows the model's encoding, else ``conservative`` (3 chars per token)."""
    summarizer: Literal["auto", "extractive", "model"] = "auto"
    """``summarize`` only: ``model`` asks the agent's model client (a config without one is
    refused where it is made), ``extractive`` builds a digest without a model, ``auto``
    uses the client when the config has one."""
    summary_max_tokens: int = Field(default=1024, ge=64)
    """``summarize`` only: the most tokens a summary may take (less when the kept messages
    leave less room); a longer one is refused."""
    summary_timeout: float = Field(default=60.0, gt=0)
    """``summarize`` only: seconds to wait for a model summary before giving up."""
    summary_template: str | None = None
    """``summarize`` only: the handoff's sections, as text whose placeholder lines
    (``{task}``, ``{decisions}``, ``{done}``, ``{evidence}``, ``{open}``) the summarizer
    fills; default :data:`~normandy_window_manager.handoff.DEFAULT_TEMPLATE`."""
    schedule: Schedule = "threshold"
    """When to compact: ``threshold`` (over ``trigger``, today's behaviour) or ``cost``
    (when it pays for the cache rewrite it causes; never letting the window be exceeded)."""
    horizon: int = Field(default=50, ge=1, le=10_000)
    """``cost`` only: the most model calls a compaction's cycle is weighed over (its
    rewrite is spread over at most this many calls)."""
    thinking_value: float = Field(default=5.0, ge=0.0, le=1_000.0)
    """``cost`` only: what a token of reasoning lost to a mid-round compaction is worth, as
    a multiple of the input price (5: thinking is billed as output, five times the input
    price for Claude); 0 weighs the cache alone. See :mod:`normandy_window_manager.reasoning`."""

    round_aware: bool = True
    """``threshold`` only: compact at a turn start when the coming round is expected not to
    fit (off: a turn start compacts only over ``trigger``)."""
    round_percentile: float = Field(default=0.9, gt=0.0, le=1.0)
    """``round_aware``: which percentile of the session's per-round growth is the estimate."""
    round_prior: float = Field(default=0.25, ge=0.0, lt=1.0)
    """``round_aware``: the estimate, as a share of the usable window, before the
    conversation holds a complete round."""
    round_max: float = Field(default=0.5, gt=0.0, lt=1.0)
    """``round_aware``: the largest estimate, as a share of the usable window; a round
    expected to add more is left to mid-round compaction."""
    round_headroom: float = Field(default=0.15, ge=0.0, le=2.0)
    """``round_aware``: how much further than the round needs a turn start compacts, as a
    multiple of the estimate (so the next turn start need not compact again at once)."""

    @field_validator("summary_template", mode="after")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        return None if value is None else check_template(value)

    @model_validator(mode="after")
    def _consistent(self) -> WindowManagerOptions:
        self._rounds_consistent()
        if self.target > self.trigger:
            raise ValueError(
                f"target ({self.target}) must not exceed trigger ({self.trigger}): "
                "a compaction must end below the level that starts one"
            )
        if self.keep_last_turns is not None and self.strategy != "sliding_window":
            raise ValueError(
                "keep_last_turns applies only to strategy 'sliding_window' "
                f"(strategy is {self.strategy!r})"
            )
        if self.schedule == "cost" and "trigger" in self.model_fields_set:
            raise ValueError(
                "trigger applies only to schedule 'threshold': schedule 'cost' decides when "
                "to compact by what it costs (and always compacts over the usable window)"
            )
        if self.schedule == "cost" and self.strategy == "sliding_window":
            raise ValueError(
                "schedule 'cost' cuts to a token floor it prices, while strategy "
                "'sliding_window' keeps the newest turns whatever their size (the cut "
                "priced is not the cut made): use strategy 'oldest_first' or 'summarize'"
            )
        cost_only = {"horizon", "thinking_value"} & self.model_fields_set
        if self.schedule != "cost" and cost_only:
            given = ", ".join(sorted(cost_only))
            raise ValueError(
                f"{given} applies only to schedule 'cost' (schedule is {self.schedule!r})"
            )
        summary_only = {"summarizer", "summary_max_tokens", "summary_timeout", "summary_template"}
        if self.strategy != "summarize" and summary_only & self.model_fields_set:
            given = ", ".join(sorted(summary_only & self.model_fields_set))
            raise ValueError(
                f"{given} apply only to strategy 'summarize' (strategy is {self.strategy!r})"
            )
        return self

    def _rounds_consistent(self) -> None:
        """Refuse round options that do nothing, and a prior above its cap."""
        tuning = {
            "round_percentile",
            "round_prior",
            "round_max",
            "round_headroom",
        } & self.model_fields_set
        if tuning and (self.schedule != "threshold" or not self.round_aware):
            given = ", ".join(sorted(tuning))
            why = (
                f"schedule is {self.schedule!r}"
                if self.schedule != "threshold"
                else "round_aware is false"
            )
            raise ValueError(f"{given} apply only to round_aware with schedule 'threshold' ({why})")
        if (
            self.schedule != "threshold"
            and self.round_aware
            and "round_aware" in self.model_fields_set
        ):
            raise ValueError(
                f"round_aware applies only to schedule 'threshold' (schedule is {self.schedule!r})"
            )
        if self.round_prior > self.round_max:
            raise ValueError(
                f"round_prior ({self.round_prior}) must not exceed round_max "
                f"({self.round_max}): the estimate is capped at round_max"
            )

    @property
    def turns_to_keep(self) -> int:
        """``keep_last_turns`` with its default."""
        return self.keep_last_turns or 3
