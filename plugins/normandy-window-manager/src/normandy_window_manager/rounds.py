"""Round-aware compaction: make room at a turn start for the round the turn will run.

A mid-round compaction strips the thinking of every kept message, and the model then
finishes that round with thinking disabled. Compacting at the turn start instead, when
the conversation plus what the coming round will add would not fit the usable window,
keeps the model's reasoning for the whole round.

What a round adds is estimated from the session's own rounds: the tokens of each
complete earlier turn still in the conversation after its opening user message (its
replies, thinking and tool results), and the ``round_percentile`` of those. Before the
conversation holds a complete turn, the estimate is the prior ``round_prior`` of the
usable window. It is capped at ``round_max`` of the usable window: a round larger than
that is left to mid-round compaction, so that a turn start never empties the
conversation for one outsized round (and the turn-start skip level stays fixed).

How deep a turn start compacts (:func:`round_target`): to ``target``, or lower when the
estimate needs more room than ``target`` leaves, and then lower by ``round_headroom``
times the estimate. Every compaction rewrites the prompt cache from its first change on,
so a turn start that made room for one round only would compact again at the next turn
start; the headroom spaces compactions out. Measured on the demo session and generated
sessions (``benchmarks/RESULTS.md`` section 17): with no headroom the cache-aware cost
was 1.14x that of compacting mid-round at 48k; with a whole round of headroom, fewer
facts stayed in context; 0.35 kept both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from normandy_core.conversation.survival import is_user_message

if TYPE_CHECKING:
    from normandy_core import AgentMemory, CompactionContext
    from normandy_core.conversation.calibration import CalibratedCounter
    from normandy_window_manager.options import WindowManagerOptions

__all__ = [
    "MIN_ROUND_TARGET",
    "RoundEstimate",
    "estimate_round",
    "round_growths",
    "round_target",
    "turn_start_level",
]

#: The lowest share of the usable window a round-aware turn start compacts down to.
MIN_ROUND_TARGET = 0.1


@dataclass(frozen=True)
class RoundEstimate:
    """The tokens the coming round is expected to add, and what the figure rests on:
    ``rounds`` complete turns (0: the prior), ``capped`` when ``round_max`` limited it."""

    tokens: int
    rounds: int
    capped: bool

    def describe(self, opts: WindowManagerOptions) -> str:
        """One phrase saying where the estimate comes from, for meta."""
        if self.rounds == 0:
            source = f"the prior round_prior {opts.round_prior} of the usable window"
        else:
            share = round(opts.round_percentile * 100)
            source = f"the {share}th percentile of the {self.rounds} complete rounds kept"
        capped = f", capped at round_max {opts.round_max}" if self.capped else ""
        return f"{self.tokens:,} tokens ({source}{capped})"


def round_growths(
    memory: AgentMemory, counter: CalibratedCounter, current_turn: str | None
) -> list[int]:
    """The tokens each complete earlier turn of ``memory`` added after its opening user
    message, oldest first. A turn counts when it is not ``current_turn`` and still starts
    with the user message that opened it (a turn cut into by a compaction does not)."""
    entries = memory.entries()
    if current_turn is None and entries:
        current_turn = entries[-1].turn_id
    growth: dict[str, int] = {}
    opened: set[str] = set()
    for e in entries:
        turn = e.turn_id
        if turn is None or turn == current_turn or e.role == "system":
            continue
        if turn not in growth:
            # the turn's first entry in the conversation must be its request
            if not is_user_message(e):
                growth[turn] = -1
                continue
            growth[turn] = 0
            opened.add(turn)
            continue
        if turn in opened:
            growth[turn] += counter.entry_tokens(memory, e)
    return [g for t, g in growth.items() if t in opened and g > 0]


def estimate_round(
    memory: AgentMemory, ctx: CompactionContext, opts: WindowManagerOptions, usable: int
) -> RoundEstimate:
    """What the coming round is expected to add (see the module)."""
    growths = sorted(round_growths(memory, ctx.counter, ctx.turn_id))
    cap = int(opts.round_max * usable)
    if growths:
        rank = max(math.ceil(opts.round_percentile * len(growths)) - 1, 0)
        tokens = growths[rank]
    else:
        tokens = int(opts.round_prior * usable)
    return RoundEstimate(min(tokens, cap), len(growths), tokens > cap)


def round_target(opts: WindowManagerOptions, estimate: RoundEstimate, usable: int) -> float:
    """The share of the usable window a round-aware turn start compacts down to: room for
    the round (at most ``target``), less ``round_headroom`` of the estimate, at least
    :data:`MIN_ROUND_TARGET` (or ``target`` when that is lower)."""
    share = estimate.tokens / usable
    room = min(opts.target, 1.0 - share) - opts.round_headroom * share
    return max(room, min(MIN_ROUND_TARGET, opts.target))


def turn_start_level(opts: WindowManagerOptions, usable: int) -> int:
    """The level at or below which a turn start never compacts: under ``trigger`` of the
    usable window, and with room for the largest estimate (``round_max``) when round-aware."""
    share = opts.trigger
    if opts.round_aware:
        share = min(share, 1.0 - opts.round_max)
    return math.floor(share * usable)
