"""What waiting at a turn start costs in reasoning, for ``schedule="cost"``.

A mid-round compaction strips the thinking of every kept message, and the model finishes
that round with thinking disabled. At a turn start the cost schedule weighs compacting now
against waiting. When the conversation plus what the coming round is expected to add (the
estimate ``round_aware`` uses, :func:`~normandy_window_manager.rounds.estimate_round`)
would not fit the usable window, waiting means the round overflows and is compacted
mid-round, since no turn start comes before the overflow. So the wait side is charged the
reasoning of the calls the round would then make with thinking disabled:

* **calls**: the round grows by ``growth`` tokens per call (the schedule's
  :func:`~normandy_core.conversation.cost.growth_per_call`), so after it passes the usable
  window ``ceil((sent + estimate - usable) / growth)`` calls remain;
* **per call**: the thinking tokens a call of this session makes (the mean over the newest
  :data:`THINKING_CALLS` assistant entries that carry thinking), valued at
  ``thinking_value`` times the input price. The default, 5, is what producing that
  reasoning costs: thinking is billed as output, and Claude's output price is five times
  its input price. It is a floor on what the reasoning is worth, in the billed tokens the
  cache side is weighed in.

A plan is charged the same way from the size it leaves (usually nothing: the floor
leaves room for the round). A cost-schedule cut strips every kept message's thinking and
drops the older rounds, so in a turn loop it records both on the marker it leaves
(:func:`reasoning_record`; such a cut always leaves one): the estimate and the per-call
thinking then draw on that record where the conversation no longer shows them. Without
thinking in the conversation or a record the price is 0 and the schedule weighs the
cache alone: a model that does not think loses nothing. Outside a turn loop
(``compact()``, no turn id) no round is coming and nothing is charged; with
``thinking_value`` 0 neither is anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from normandy_core import ThinkingBlock
from normandy_window_manager.rounds import estimate_round, round_record

if TYPE_CHECKING:
    from normandy_core import AgentMemory, CompactionContext
    from normandy_window_manager.options import WindowManagerOptions

__all__ = [
    "THINKING_CALLS",
    "THINKING_KEY",
    "RoundRisk",
    "reasoning_record",
    "round_risk",
    "thinking_per_call",
]

#: How many of the newest thinking assistant entries the per-call thinking is measured on.
THINKING_CALLS = 8
#: Metadata key of a cost-schedule marker: the thinking tokens per call measured before
#: the cut stripped them.
THINKING_KEY = "normandy.window_manager.thinking_per_call"


@dataclass(frozen=True)
class RoundRisk:
    """The coming round as the cost schedule prices it: ``estimate`` tokens it is expected
    to add, ``growth`` tokens per call, ``usable`` the usable window, and ``per_call`` the
    billed tokens of reasoning one call with thinking disabled loses."""

    estimate: int
    growth: float
    usable: int
    per_call: float

    def disabled_calls(self, size: int) -> int:
        """The calls the round would make with thinking disabled, starting at ``size``
        tokens: those after it passes the usable window (0 when it fits)."""
        overflow = size + self.estimate - self.usable
        if overflow <= 0 or self.growth <= 0:
            return 0
        return math.ceil(overflow / self.growth)

    def price(self, size: int) -> float:
        """The billed tokens of reasoning lost by starting the round at ``size`` tokens."""
        return self.disabled_calls(size) * self.per_call


def thinking_per_call(memory: AgentMemory, ctx: CompactionContext) -> float:
    """The mean thinking tokens of the newest :data:`THINKING_CALLS` assistant entries of
    ``memory`` that carry thinking; when none does, the figure the newest marker recorded
    (:data:`THINKING_KEY`), else 0.0."""
    counts: list[int] = []
    for e in reversed(memory.entries()):
        if e.role != "assistant" or isinstance(e.content, str):
            continue
        texts = [b.thinking for b in e.content if isinstance(b, ThinkingBlock)]
        if texts:
            counts.append(sum(ctx.counter.count_text(t) for t in texts))
            if len(counts) == THINKING_CALLS:
                break
    if counts:
        return sum(counts) / len(counts)
    for e in reversed(memory.entries()):
        recorded = e.metadata.get(THINKING_KEY)
        if recorded is not None:
            return float(recorded)
    return 0.0


def reasoning_record(
    memory: AgentMemory, ctx: CompactionContext, opts: WindowManagerOptions
) -> dict[str, Any]:
    """The metadata a cost-schedule cut in a turn loop puts on its marker, so that the
    next turn starts still know the session's rounds and thinking once the cut has
    dropped them or stripped it: the round record
    (:func:`~normandy_window_manager.rounds.round_record`) and :data:`THINKING_KEY`.
    Empty outside a turn loop or with ``thinking_value`` 0 (nothing weighs them)."""
    if ctx.turn_id is None or opts.thinking_value <= 0:
        return {}
    record: dict[str, Any] = dict(round_record(memory, ctx.counter, ctx.turn_id))
    per_call = thinking_per_call(memory, ctx)
    if per_call > 0:
        record[THINKING_KEY] = round(per_call)
    return record


def round_risk(
    memory: AgentMemory,
    ctx: CompactionContext,
    opts: WindowManagerOptions,
    usable: int,
    growth: float,
) -> RoundRisk | None:
    """The coming round's risk at a turn start in a turn loop, else ``None`` (mid-round,
    outside a turn loop, ``thinking_value`` 0, or no thinking to lose)."""
    if ctx.mid_round or ctx.turn_id is None or opts.thinking_value <= 0:
        return None
    per_call = thinking_per_call(memory, ctx) * opts.thinking_value
    if per_call <= 0:
        return None
    estimate = estimate_round(memory, ctx, opts, usable)
    return RoundRisk(estimate.tokens, growth, usable, per_call)
