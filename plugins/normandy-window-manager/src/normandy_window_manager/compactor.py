"""The ``window_manager`` compactor: its hookimpls, and when a boundary compacts.

Under ``schedule="threshold"`` a boundary over ``trigger`` of the usable window (at the
start of a turn) or over the usable window (mid-round) makes the cut of
:mod:`normandy_window_manager.cut`; ``schedule="cost"`` is
:mod:`normandy_window_manager.schedule`'s. The cut keeps system entries, the newest unit
and every unit holding an entry a survival rule keeps (``ctx.rules``: pinned entries,
the first user message, ``keep_tools``, ``keep_if``), never shortened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from normandy_core import OptionsError, hookimpl
from normandy_window_manager.cut import MARKER_KEY, MARKER_TEXT, cut_to_target
from normandy_window_manager.options import WindowManagerOptions
from normandy_window_manager.rounds import (
    estimate_round,
    round_record,
    round_target,
    turn_start_level,
)
from normandy_window_manager.schedule import COST_FLOOR, cost_schedule
from normandy_window_manager.summarize import SUMMARY_KEY

if TYPE_CHECKING:
    from normandy_core import AgentConfig, CompactionContext, SurvivalRules

__all__ = [
    "MARKER_KEY",
    "MARKER_TEXT",
    "NAME",
    "SUMMARY_KEY",
    "compaction_threshold",
    "maybe_compact",
    "needs_window",
    "options_model",
    "requires_client",
    "validate_opts",
]

#: The name this compactor is registered under.
NAME = "window_manager"


@hookimpl
def options_model() -> type[WindowManagerOptions]:
    """The options are :class:`~normandy_window_manager.options.WindowManagerOptions`."""
    return WindowManagerOptions


@hookimpl
def needs_window(opts: WindowManagerOptions) -> bool:
    """``window_manager`` always sizes against the window (pinned or from the catalog)."""
    return True


@hookimpl
def validate_opts(
    opts: WindowManagerOptions, entry: str, window: int | None, rules: SurvivalRules
) -> None:
    """Refuse a window that ``reserved_tokens`` leaves no room in, and summary instructions
    the options never use (no ``summarize``, or the ``extractive`` summarizer), where the
    config is made."""
    if window is not None and window <= opts.reserved_tokens:
        raise OptionsError(
            f"option 'reserved_tokens': {opts.reserved_tokens:,} tokens reserved for the "
            f"reply leave nothing of the {window:,}-token context window; lower "
            "reserved_tokens or pin a larger window (option 'context_window')"
        )
    if rules.summary_instructions is None:
        return
    if opts.strategy != "summarize" or opts.summarizer == "extractive":
        why = (
            f"strategy {opts.strategy!r} writes no summary"
            if opts.strategy != "summarize"
            else "the 'extractive' summarizer writes its digest without a model"
        )
        raise OptionsError(
            f"{entry}: compactor {NAME!r} cannot honour survival rule 'summary_instructions': "
            f"only the model summarizer reads them, and {why}; use strategy 'summarize' "
            "with summarizer 'model' or 'auto', or drop summary_instructions"
        )


@hookimpl
def requires_client(opts: WindowManagerOptions) -> str | None:
    """``summarizer="model"`` asks the config's model client for every summary; ``auto``
    uses it only when there is one."""
    if opts.strategy == "summarize" and opts.summarizer == "model":
        return (
            "option 'summarizer' is 'model' (summarizer 'auto' or 'extractive' summarizes "
            "without a client)"
        )
    return None


@hookimpl
def compaction_threshold(
    opts: WindowManagerOptions, window: int | None, mid_round: bool
) -> int | None:
    """The level :func:`maybe_compact` skips at or below (``None`` without a window).

    Mid-round the usable window (``window - reserved_tokens``) under either schedule; at
    the start of a turn ``trigger`` of it (``schedule="threshold"``) or the cost
    schedule's floor (``target``, else 25 % of it), below which that schedule waits
    without weighing anything. Both are what :func:`maybe_compact` and
    :func:`~normandy_window_manager.schedule.cost_schedule` compare with, rounded down
    (a whole number of tokens is at most a level exactly when it is at most its floor).
    """
    if window is None:
        return None
    usable = window - opts.reserved_tokens
    if mid_round:
        return usable
    if opts.schedule == "cost":
        share = opts.target if "target" in opts.model_fields_set else COST_FLOOR
        return int(share * usable)
    return turn_start_level(opts, usable)


@hookimpl
def maybe_compact(
    acc: AgentConfig, ctx: CompactionContext, opts: WindowManagerOptions
) -> tuple[AgentConfig, dict[str, Any]]:
    """Compact ``acc.memory`` when it exceeds ``trigger`` of the usable window (at the
    start of a turn) or the usable window itself (mid-round), or now when the boundary is
    forced (``ctx.force``, :func:`_forced`); see the docs."""
    if ctx.window is None:
        return acc, {"compacted": False, "error": "window_manager needs ctx.window, got None"}
    if ctx.force:
        return _forced(acc, ctx, opts)
    if opts.schedule == "cost":
        return cost_schedule(acc, ctx, opts)
    # The prepared counter, scaled by the model's calibration factor, which the turn
    # shells learn from provider-reported usage (1.0 without evidence).
    counter = ctx.counter
    memory = acc.memory
    usable = ctx.window - opts.reserved_tokens
    # Mid-round the memory stays unchanged while the conversation fits the usable window
    # (the contract); ``trigger`` decides at the start of a turn, and round_aware below it
    # in a turn loop (a boundary with a turn id): outside one (compact(), whose calls must
    # continue one another exactly) nothing says a round is coming.
    round_aware = opts.round_aware and not ctx.mid_round and ctx.turn_id is not None
    if ctx.mid_round:
        threshold: float = usable
    elif round_aware:
        threshold = turn_start_level(opts, usable)
    else:
        threshold = opts.trigger * usable
    # An upper bound first (UTF-8 bytes, while the tokenizer is not loaded): a
    # conversation whose bound fits has an exact count that fits too, so it is skipped
    # without loading a vocabulary; otherwise the exact count decides.
    bound = counter.memory_bound(memory)
    if bound is not None and bound + ctx.prompt_tokens <= threshold:
        return acc, {"compacted": False}
    before = counter.memory_tokens(memory)
    if before + ctx.prompt_tokens <= threshold:
        return acc, {"compacted": False}
    if round_aware:
        return _round_aware_start(acc, ctx, opts, before, usable)
    return cut_to_target(acc, ctx, opts, counter, before, usable, _record(acc, ctx, opts))


def _forced(
    acc: AgentConfig, ctx: CompactionContext, opts: WindowManagerOptions
) -> tuple[AgentConfig, dict[str, Any]]:
    """A compaction on request: whatever the trigger or schedule, every unit the cut may
    drop is dropped (summarized under ``summarize``, with ``ctx.focus`` given to the model
    summarizer); what a survival rule keeps, system entries and the newest unit stay.
    Declines, saying why, when there is nothing the cut may drop."""
    usable = ctx.window - opts.reserved_tokens if ctx.window is not None else 0
    before = ctx.counter.memory_tokens(acc.memory)
    # A target of zero: the cut goes as deep as its rules allow (model_copy does not
    # validate, and the options' own target still says whether the result met it).
    deepest = opts.model_copy(update={"target": 0.0})
    new_acc, meta = cut_to_target(
        acc, ctx, deepest, ctx.counter, before, usable, _record(acc, ctx, opts)
    )
    if meta.get("compacted"):
        after = ctx.counter.memory_tokens(new_acc.memory)
        if after >= before:
            why = f"it would not be smaller ({before:,} -> {after:,} tokens)"
            return acc, {"compacted": False, "declined": f"not compacted: {why}"}
        meta["target_met"] = after + ctx.prompt_tokens <= int(opts.target * usable)
    elif "error" not in meta:
        meta["declined"] = (
            "nothing to compact: every entry is a system entry, kept by a survival rule or "
            "part of the newest exchange"
        )
    return new_acc, meta


def _record(
    acc: AgentConfig, ctx: CompactionContext, opts: WindowManagerOptions
) -> dict[str, Any] | None:
    """The round record a compaction in a turn loop with ``round_aware`` puts on its marker
    or summary (:func:`~normandy_window_manager.rounds.round_record`), else ``None``."""
    if not opts.round_aware or ctx.turn_id is None:
        return None
    return round_record(acc.memory, ctx.counter, ctx.turn_id)


def _round_aware_start(
    acc: AgentConfig, ctx: CompactionContext, opts: WindowManagerOptions, before: int, usable: int
) -> tuple[AgentConfig, dict[str, Any]]:
    """A turn start with ``round_aware``: compact over ``trigger``, or when the coming
    round's estimate would not fit beside the conversation; in either case down to
    :func:`~normandy_window_manager.rounds.round_target`."""
    sent = before + ctx.prompt_tokens
    estimate = estimate_round(acc.memory, ctx, opts, usable)
    over_trigger = sent > opts.trigger * usable
    if not over_trigger and sent + estimate.tokens <= usable:
        return acc, {"compacted": False}
    depth = opts.model_copy(update={"target": round_target(opts, estimate, usable)})
    record = _record(acc, ctx, opts)
    new_acc, meta = cut_to_target(acc, ctx, depth, ctx.counter, before, usable, record)
    if meta.get("compacted"):
        why = (
            f"over trigger {opts.trigger} of the usable window"
            if over_trigger
            else f"the coming round would not fit: {sent:,} tokens + its estimate > the "
            f"usable window {usable:,}"
        )
        meta.update(
            round_estimate=estimate.tokens,
            round_rounds=estimate.rounds,
            round_reason=f"{why}; round estimate {estimate.describe(opts)}",
        )
    return new_acc, meta
