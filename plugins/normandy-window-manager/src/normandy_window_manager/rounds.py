"""Round-aware compaction: make room at a turn start for the round the turn will run.

A mid-round compaction strips the thinking of every kept message, and the model then
finishes that round with thinking disabled. Compacting at the turn start instead, when
the conversation plus what the coming round will add would not fit the usable window,
keeps the model's reasoning for the whole round.

What a round adds is estimated from the session's own rounds: the tokens each complete
earlier turn added after its opening user message (its replies, thinking and tool
results), and the ``round_percentile`` of those. The conversation alone holds few of them
in a small window (a compaction keeps one to four rounds at 48k), too few for a high
percentile, and the thinking of the rounds a compaction kept is gone from them. So every
compaction made in a turn loop records the rounds it measured, as they were before it cut
them (:func:`round_record`), on the marker or summary it puts where history was cut
(metadata :data:`ROUNDS_KEY`, the newest :data:`RECORDED_ROUNDS` rounds; such a cut
always leaves a marker, as with the recall tool on); the estimate draws on that record
and the rounds still in the conversation. Before there is any
round, the estimate is the prior ``round_prior`` of the usable window. It is capped at
``round_max`` of the usable window: a round larger than that is left to mid-round
compaction, so that a turn start never empties the conversation for one outsized round
(and the turn-start skip level stays fixed).

How deep a turn start compacts (:func:`round_target`): to ``target``, or lower when the
estimate needs more room than ``target`` leaves, and then lower by ``round_headroom``
times the estimate. Every compaction rewrites the prompt cache from its first change on,
so a turn start that made room for one round only would compact again at the next turn
start; the headroom spaces compactions out, and pays for compacting a round early (a
turn start compacts before the round instead of when it overflows, so its compactions
come a little more often). Deeper cuts cost less and keep fewer facts in context: 0.15
kept as many facts as compacting mid-round and cost at most 1.02x of it at 48k and 128k,
measured in ``benchmarks/RESULTS.md`` section 17.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from normandy_core.conversation.survival import is_inserted, is_user_message

if TYPE_CHECKING:
    from normandy_core import AgentMemory, CompactionContext
    from normandy_core.conversation.calibration import CalibratedCounter
    from normandy_window_manager.options import WindowManagerOptions

__all__ = [
    "MIN_ROUND_TARGET",
    "RECORDED_ROUNDS",
    "ROUNDS_KEY",
    "RoundEstimate",
    "estimate_round",
    "round_growths",
    "round_record",
    "round_target",
    "turn_start_level",
]

#: The lowest share of the usable window a round-aware turn start compacts down to.
MIN_ROUND_TARGET = 0.1
#: Metadata key of a marker or summary: the rounds the session ran, as ``(turn id, tokens
#: added)`` pairs, oldest first, measured before the compaction that inserted it cut them.
ROUNDS_KEY = "normandy.window_manager.rounds"
#: How many of the newest rounds the record keeps: enough for a 90th percentile, few
#: enough that the estimate follows a session whose rounds change size.
RECORDED_ROUNDS = 32


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
            source = f"the {share}th percentile of the session's last {self.rounds} rounds"
        capped = f", capped at round_max {opts.round_max}" if self.capped else ""
        return f"{self.tokens:,} tokens ({source}{capped})"


def round_growths(
    memory: AgentMemory, counter: CalibratedCounter, current_turn: str | None
) -> list[int]:
    """The tokens each complete earlier turn of ``memory`` added after its opening user
    message, oldest first. A turn counts when it is not ``current_turn`` and still starts
    with the user message that opened it (a turn cut into by a compaction does not)."""
    return list(_turn_growths(memory, counter, current_turn, current=False).values())


def _turn_growths(
    memory: AgentMemory, counter: CalibratedCounter, current_turn: str | None, *, current: bool
) -> dict[str, int]:
    """:func:`round_growths` by turn id; with ``current``, the current turn's growth so
    far too (a lower bound of its round)."""
    entries = memory.entries()
    if current_turn is None and entries:
        current_turn = entries[-1].turn_id
    growth: dict[str, int] = {}
    opened: set[str] = set()
    for e in entries:
        turn = e.turn_id
        skip = turn == current_turn and not current
        if turn is None or skip or e.role == "system" or is_inserted(e):
            continue
        if turn not in growth:
            # the turn's first entry in the conversation must be its request
            growth[turn] = 0
            if is_user_message(e):
                opened.add(turn)
            continue
        if turn in opened:
            growth[turn] += counter.entry_tokens(memory, e)
    return {t: g for t, g in growth.items() if t in opened and g > 0}


def _recorded(memory: AgentMemory) -> dict[str, int]:
    """The record of the newest marker or summary carrying one (empty without)."""
    for e in reversed(memory.entries()):
        pairs = e.metadata.get(ROUNDS_KEY)
        if pairs:
            return {str(turn): int(tokens) for turn, tokens in pairs}
    return {}


def _session_rounds(
    memory: AgentMemory, counter: CalibratedCounter, current_turn: str | None, *, current: bool
) -> dict[str, int]:
    """The recorded rounds and those in ``memory``, by turn id, oldest first, the newest
    :data:`RECORDED_ROUNDS`: a round in both counts at its larger figure (a compaction
    that kept it stripped its thinking)."""
    rounds = _recorded(memory)
    for turn, tokens in _turn_growths(memory, counter, current_turn, current=current).items():
        rounds[turn] = max(tokens, rounds.pop(turn, 0))
    if not current and current_turn is not None:
        rounds.pop(current_turn, None)
    return dict(list(rounds.items())[-RECORDED_ROUNDS:])


def round_record(
    memory: AgentMemory, counter: CalibratedCounter, current_turn: str | None
) -> dict[str, tuple[tuple[str, int], ...]]:
    """The metadata a compaction of ``memory`` puts on its marker or summary: the session's
    rounds (:data:`ROUNDS_KEY`), the running one's growth so far included."""
    rounds = _session_rounds(memory, counter, current_turn, current=True)
    return {ROUNDS_KEY: tuple(rounds.items())}


def estimate_round(
    memory: AgentMemory, ctx: CompactionContext, opts: WindowManagerOptions, usable: int
) -> RoundEstimate:
    """What the coming round is expected to add (see the module)."""
    rounds = _session_rounds(memory, ctx.counter, ctx.turn_id, current=False)
    growths = sorted(rounds.values())
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
