"""The pure core of a turn: a state machine from events to effects, with no I/O and no clock.

One agent turn runs as::

    idle --UserInput--> steering(mid_round=False) --CompactionDone--> awaiting_model
    awaiting_model --ModelReplied(tool uses)--> awaiting_tools
    awaiting_tools --ToolResults--> steering(mid_round=True) --CompactionDone--> awaiting_model
    awaiting_model --ModelReplied(final answer)--> done

The core parks in ``steering`` at the start of the turn and after every tool batch and
emits :class:`MaybeCompact`; it goes on only when the shell feeds :class:`CompactionDone`
back. When the provider refuses a model call as too long (:class:`ContextOverflowed`),
the core steers once more (``trigger="overflow"``, the ``mid_round`` of the boundary
before the call) and then repeats the call; a second refusal of the same call, or an
overflow boundary that compacted nothing, ends the turn with :class:`Fail`, so no
sequence of refusals makes more than two requests of one call::

    awaiting_model --ContextOverflowed--> steering(overflow) --CompactionDone--> awaiting_model

A tool batch whose :class:`ToolResults` say ``compact`` (the model's ``compact_context``
call was accepted) steers at a forced boundary (``trigger="forced"``, with its ``focus``).

After ``max_iterations`` model calls with tools, or once the task budget is spent,
the next call is *final*: :class:`CallModel` with ``final=True`` asks for an answer with
tools disabled. :func:`step` never mutates its input and raises :class:`InvalidTransition`
(naming the state and the event) for an event the state does not accept.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from normandy_core.conversation.entries import (
    Block,
    Content,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from normandy_core.errors import NormandyError

__all__ = [
    "AppendMessage",
    "Budget",
    "CallModel",
    "CompactionDone",
    "ContextOverflowed",
    "DispatchTools",
    "Effect",
    "Emit",
    "Event",
    "Fail",
    "Finish",
    "FinishReason",
    "InvalidTransition",
    "MaybeCompact",
    "ModelReplied",
    "Phase",
    "ToolResults",
    "Trigger",
    "TurnError",
    "TurnState",
    "UserInput",
    "boundary_summary",
    "start",
    "step",
]

#: Why a turn ended: the model answered, the iteration cap or the task budget forced it.
FinishReason = Literal["answer", "iteration_cap", "budget"]
#: Why a boundary ran: the loop's own (a turn start, after a tool batch), the
#: provider's refusal of a request as too long, or the model's ``compact_context`` call.
Trigger = Literal["scheduled", "overflow", "forced"]


class TurnError(NormandyError):
    """A turn could not go on."""


class InvalidTransition(TurnError):
    """An event the turn's current state does not accept (or malformed for it)."""

    def __init__(self, state: TurnState, event: Event, why: str) -> None:
        self.state = state
        self.event = event
        super().__init__(
            f"turn {state.turn_id!r}: event {type(event).__name__} is not valid in state "
            f"{state.phase.value!r}: {why}"
        )


class Phase(enum.Enum):
    """Where a turn is."""

    IDLE = "idle"
    STEERING = "steering"
    AWAITING_MODEL = "awaiting_model"
    AWAITING_TOOLS = "awaiting_tools"
    DONE = "done"


# -- events (in) ----------------------------------------------------------------------


_T = TypeVar("_T")


def replace(obj: _T, **changes: Any) -> _T:
    """A copy of the frozen dataclass ``obj`` with ``changes`` (no ``__post_init__`` here).

    What :func:`dataclasses.replace` does, without its per-call field introspection: the
    core steps several times per boundary, and that introspection was a visible share of
    a boundary that does not compact.
    """
    unknown = changes.keys() - obj.__dataclass_fields__.keys()  # type: ignore[attr-defined]
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field(s) {sorted(unknown)}")
    new = object.__new__(type(obj))
    state = new.__dict__
    state.update(obj.__dict__)
    state.update(changes)
    return new


@dataclass(frozen=True)
class UserInput:
    """The user's message that starts the turn; ``tokens`` its count, for the budget."""

    content: Content
    tokens: int = 0


@dataclass(frozen=True)
class ModelReplied:
    """The model's reply: tool uses make it a tool batch, none a final answer."""

    content: tuple[Block, ...]
    tokens: int = 0


@dataclass(frozen=True)
class ToolResults:
    """The results of the dispatched batch, one per tool use (any order).

    ``compact``: the batch asked for a compaction (the ``compact_context`` tool accepted
    a call), so the boundary after it is forced, with ``focus`` for the summary.
    """

    results: tuple[ToolResultBlock, ...]
    tokens: int = 0
    compact: bool = False
    focus: str | None = None


@dataclass(frozen=True)
class CompactionDone:
    """The boundary was resolved; ``meta`` is the compaction's meta."""

    meta: Mapping[str, Any]


@dataclass(frozen=True)
class ContextOverflowed:
    """The provider refused the model call as too long for its context window.

    ``info`` is what the shell learned (the provider's figures, its own counts; JSON-ready,
    reported in the ``context_overflow`` event); ``target`` the tokens the overflow
    boundary compacts below (``None``: as the compactor sizes).
    """

    info: Mapping[str, Any]
    target: int | None = None


Event = UserInput | ModelReplied | ToolResults | CompactionDone | ContextOverflowed


# -- effects (out) --------------------------------------------------------------------


@dataclass(frozen=True)
class AppendMessage:
    """Append a message of this turn to the conversation."""

    role: Literal["user", "assistant"]
    content: Content


@dataclass(frozen=True)
class MaybeCompact:
    """Resolve a boundary (call the compactor), then feed :class:`CompactionDone` back.

    ``trigger`` says why it runs; an overflow boundary compacts below ``target`` tokens
    (the overshoot and a margin below the refused request) where the compactor sizes
    against a window; a forced one (the model asked) compacts now with ``focus``.
    """

    mid_round: bool
    trigger: Trigger = "scheduled"
    target: int | None = None
    focus: str | None = None


@dataclass(frozen=True)
class CallModel:
    """Call the model; ``final`` asks for an answer with tools disabled (``reason`` says why)."""

    final: bool = False
    reason: FinishReason | None = None


@dataclass(frozen=True)
class DispatchTools:
    """Run these tool calls as one batch, then feed :class:`ToolResults` back."""

    calls: tuple[ToolUseBlock, ...]


@dataclass(frozen=True)
class Emit:
    """Report an event to the host (``event["type"]`` names it)."""

    event: dict[str, Any]


@dataclass(frozen=True)
class Finish:
    """The turn is over with ``text``."""

    text: str
    reason: FinishReason


@dataclass(frozen=True)
class Fail:
    """The turn cannot go on: the provider refused a call as too long and the one
    recovery did not help (``why`` says how); the shell raises."""

    why: str


Effect = AppendMessage | MaybeCompact | CallModel | DispatchTools | Emit | Finish | Fail

# The effects every boundary emits, made once (they are immutable and carry no data).
_COMPACT_AT_START = MaybeCompact(mid_round=False)
_COMPACT_MID_ROUND = MaybeCompact(mid_round=True)
_CALL = CallModel(final=False)


# -- state ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """A per-turn task budget in tokens of this turn's messages; compaction never refunds it.

    ``in_context`` counts this turn's messages still in the conversation and ``removed``
    the ``tokens_removed`` every compaction reported: a compaction moves tokens from one
    to the other, so ``remaining = total - in_context - removed`` never grows back.
    """

    total: int
    in_context: int = 0
    removed: int = 0

    @property
    def spent(self) -> int:
        """Tokens spent so far, removed ones included."""
        return self.in_context + self.removed

    @property
    def remaining(self) -> int:
        """Tokens left (negative once overspent)."""
        return self.total - self.spent

    @property
    def exhausted(self) -> bool:
        """Whether nothing is left."""
        return self.remaining <= 0

    def add(self, tokens: int) -> Budget:
        """After appending a message of ``tokens``."""
        return replace(self, in_context=self.in_context + max(tokens, 0))

    def compacted(self, tokens_removed: int) -> Budget:
        """After a compaction removed ``tokens_removed`` of this turn's tokens."""
        removed = max(tokens_removed, 0)
        return replace(
            self, in_context=max(self.in_context - removed, 0), removed=self.removed + removed
        )

    def as_dict(self) -> dict[str, int]:
        """JSON-ready view."""
        return {
            "total": self.total,
            "spent": self.spent,
            "removed": self.removed,
            "remaining": self.remaining,
        }


@dataclass(frozen=True)
class TurnState:
    """Everything the core knows about a turn. Immutable; :func:`step` returns a new one.

    ``iterations`` counts model calls made with tools enabled (at most
    ``max_iterations``); ``pending`` the tool-use ids of the dispatched batch;
    ``final_reason`` is set once a final call was asked for; ``text`` and
    ``finish_reason`` once the turn is done; ``trigger`` why the boundary it steers at
    runs; ``refusals`` how often the provider refused the current model call as too long.
    """

    turn_id: str
    max_iterations: int = 25
    phase: Phase = Phase.IDLE
    iterations: int = 0
    batches: int = 0
    mid_round: bool = False
    pending: tuple[str, ...] = ()
    budget: Budget | None = None
    final_reason: FinishReason | None = None
    text: str | None = None
    finish_reason: FinishReason | None = None
    trigger: Trigger = "scheduled"
    refusals: int = 0


def start(turn_id: str, *, max_iterations: int = 25, budget: int | None = None) -> TurnState:
    """A fresh turn in ``idle``, waiting for :class:`UserInput`.

    ``max_iterations`` (at least 1) caps the model calls made with tools; ``budget``
    (positive tokens, optional) is the task budget.
    """
    if max_iterations < 1:
        raise ValueError(f"max_iterations must be at least 1, got {max_iterations}")
    if budget is not None and budget <= 0:
        raise ValueError(f"budget must be a positive number of tokens, got {budget}")
    return TurnState(
        turn_id=turn_id,
        max_iterations=max_iterations,
        budget=Budget(budget) if budget is not None else None,
    )


def _holds_entries(key: str, value: Any) -> bool:
    if key == "dropped":
        return True
    return (
        isinstance(value, (list, tuple))
        and bool(value)
        and all(hasattr(item, "id") and hasattr(item, "content") for item in value)
    )


def boundary_summary(meta: Mapping[str, Any]) -> dict[str, Any]:
    """``meta`` without message contents, for events: lists of entries become ids and counts.

    ``dropped`` becomes ``dropped_ids`` and ``dropped_count`` (both always present); any
    other list of entries (such as shortened originals) becomes ``<key>_ids`` and
    ``<key>_count`` the same way. Everything else is kept as it is.
    """
    out: dict[str, Any] = {}
    held: list[tuple[str, Any]] = []
    # One pass; only a non-empty list or tuple can hold entries (most boundaries have none).
    for key, value in meta.items():
        if key == "dropped" or (isinstance(value, (list, tuple)) and _holds_entries(key, value)):
            held.append((key, value))
        else:
            out[key] = value
    for key, value in held:
        items = list(value or [])
        out[f"{key}_ids"] = [getattr(entry, "id", None) for entry in items]
        out[f"{key}_count"] = len(items)
    out.setdefault("dropped_ids", [])
    out.setdefault("dropped_count", 0)
    return out


_EXPECTS = {
    Phase.IDLE: "UserInput",
    Phase.STEERING: "CompactionDone",
    Phase.AWAITING_MODEL: "ModelReplied or ContextOverflowed",
    Phase.AWAITING_TOOLS: "ToolResults",
    Phase.DONE: "nothing (the turn is done)",
}


def _add(budget: Budget | None, tokens: int) -> Budget | None:
    return budget.add(tokens) if budget is not None else None


def step(state: TurnState, event: Event) -> tuple[TurnState, tuple[Effect, ...]]:
    """Apply ``event`` to ``state``: the next state and the effects to run, in order.

    Raises :class:`InvalidTransition` when ``state`` does not accept ``event``; ``state``
    is never changed.
    """
    phase = state.phase
    if phase is Phase.IDLE and isinstance(event, UserInput):
        return _on_user_input(state, event)
    if phase is Phase.STEERING and isinstance(event, CompactionDone):
        return _on_compaction_done(state, event)
    if phase is Phase.AWAITING_MODEL and isinstance(event, ModelReplied):
        return _on_model_replied(state, event)
    if phase is Phase.AWAITING_MODEL and isinstance(event, ContextOverflowed):
        return _on_overflow(state, event)
    if phase is Phase.AWAITING_TOOLS and isinstance(event, ToolResults):
        return _on_tool_results(state, event)
    raise InvalidTransition(state, event, f"expected {_EXPECTS[phase]}")


def _on_user_input(state: TurnState, event: UserInput) -> tuple[TurnState, tuple[Effect, ...]]:
    if not event.content:
        raise InvalidTransition(state, event, "the user's message is empty")
    new = replace(
        state, phase=Phase.STEERING, mid_round=False, budget=_add(state.budget, event.tokens)
    )
    return new, (
        Emit({"type": "turn_started", "turn_id": state.turn_id}),
        AppendMessage("user", event.content),
        _COMPACT_AT_START,
    )


def _boundary(state: TurnState, meta: Mapping[str, Any]) -> tuple[Budget | None, Emit]:
    """The budget after a boundary and the event that reports it."""
    budget = state.budget
    removed = meta.get("tokens_removed")
    if budget is not None and isinstance(removed, int) and meta["compacted"]:
        budget = budget.compacted(removed)
    boundary: dict[str, Any] = {
        "type": "boundary",
        "turn_id": state.turn_id,
        "mid_round": state.mid_round,
        "trigger": state.trigger,
        "batch": state.batches,
        "meta": boundary_summary(meta),
    }
    if budget is not None:
        boundary["budget"] = budget.as_dict()
    return budget, Emit(boundary)


def _on_compaction_done(
    state: TurnState, event: CompactionDone
) -> tuple[TurnState, tuple[Effect, ...]]:
    meta = event.meta
    if not isinstance(meta.get("compacted"), bool):
        raise InvalidTransition(state, event, "meta has no boolean 'compacted'")
    budget, report = _boundary(state, meta)
    if state.trigger == "overflow":
        return _after_overflow(state, meta, budget, report)
    if state.trigger == "forced":
        state = replace(state, trigger="scheduled")
    effects: list[Effect] = [report]
    reason: FinishReason | None = None
    if state.iterations >= state.max_iterations:
        reason = "iteration_cap"
    elif budget is not None and budget.exhausted:
        reason = "budget"
    if reason is not None:
        info: dict[str, Any] = {"type": reason, "turn_id": state.turn_id}
        info["iterations"] = state.iterations
        if budget is not None:
            info["budget"] = budget.as_dict()
        effects.append(Emit(info))
        effects.append(CallModel(final=True, reason=reason))
        new = replace(state, phase=Phase.AWAITING_MODEL, budget=budget, final_reason=reason)
    else:
        effects.append(_CALL)
        new = replace(
            state, phase=Phase.AWAITING_MODEL, budget=budget, iterations=state.iterations + 1
        )
    return new, tuple(effects)


def _on_overflow(
    state: TurnState, event: ContextOverflowed
) -> tuple[TurnState, tuple[Effect, ...]]:
    """A model call refused as too long: steer at an overflow boundary, once per call."""
    info: dict[str, Any] = {"type": "context_overflow", "turn_id": state.turn_id, **event.info}
    if state.refusals:
        info["recovery"] = "failed"
        new = replace(state, phase=Phase.DONE, refusals=state.refusals + 1)
        return new, (Emit(info), Fail("refused again after the overflow compaction"))
    info["recovery"] = "compact_and_retry"
    new = replace(state, phase=Phase.STEERING, trigger="overflow", refusals=1)
    compact = MaybeCompact(mid_round=state.mid_round, trigger="overflow", target=event.target)
    return new, (Emit(info), compact)


def _after_overflow(
    state: TurnState, meta: Mapping[str, Any], budget: Budget | None, report: Emit
) -> tuple[TurnState, tuple[Effect, ...]]:
    """After the overflow boundary: the refused call again (the same call, so no
    iteration is counted), or :class:`Fail` when nothing was compacted (the request
    would be the same)."""
    if not meta["compacted"]:
        error = meta.get("error")
        why = f"the compactor compacted nothing at the overflow boundary ({error or 'skipped'})"
        new = replace(state, phase=Phase.DONE, budget=budget, trigger="scheduled")
        return new, (report, Fail(why))
    reason = state.final_reason
    call = CallModel(final=True, reason=reason) if reason is not None else _CALL
    new = replace(state, phase=Phase.AWAITING_MODEL, budget=budget, trigger="scheduled")
    return new, (report, call)


def _meaningful(block: Block) -> bool:
    return not (isinstance(block, TextBlock) and not block.text)


def _on_model_replied(
    state: TurnState, event: ModelReplied
) -> tuple[TurnState, tuple[Effect, ...]]:
    uses = [block for block in event.content if isinstance(block, ToolUseBlock)]
    ids = [use.id for use in uses]
    if len(set(ids)) != len(ids):
        raise InvalidTransition(state, event, f"the reply repeats a tool-use id: {ids}")
    if any(isinstance(block, ToolResultBlock) for block in event.content):
        raise InvalidTransition(state, event, "a model reply cannot hold tool results")
    budget = _add(state.budget, event.tokens)
    if uses and state.final_reason is None:
        new = replace(
            state, phase=Phase.AWAITING_TOOLS, pending=tuple(ids), budget=budget, refusals=0
        )
        return new, (
            AppendMessage("assistant", event.content),
            Emit(
                {
                    "type": "tool_batch",
                    "turn_id": state.turn_id,
                    "batch": state.batches + 1,
                    "calls": [{"id": use.id, "name": use.name} for use in uses],
                }
            ),
            DispatchTools(tuple(uses)),
        )
    effects: list[Effect] = []
    content = event.content
    if uses:  # the final call asked for no tools: never leave an unanswered tool use
        content = tuple(block for block in content if not isinstance(block, ToolUseBlock))
        effects.append(Emit({"type": "tool_calls_ignored", "turn_id": state.turn_id, "ids": ids}))
    if any(_meaningful(block) for block in content):
        effects.insert(0, AppendMessage("assistant", content))
    text = "\n".join(block.text for block in content if isinstance(block, TextBlock))
    reason: FinishReason = state.final_reason or "answer"
    new = replace(
        state,
        phase=Phase.DONE,
        budget=budget,
        text=text,
        finish_reason=reason,
        pending=(),
        refusals=0,
    )
    finished: dict[str, Any] = {
        "type": "turn_finished",
        "turn_id": state.turn_id,
        "reason": reason,
        "iterations": state.iterations,
        "batches": state.batches,
    }
    if budget is not None:
        finished["budget"] = budget.as_dict()
    effects.append(Emit(finished))
    effects.append(Finish(text, reason))
    return new, tuple(effects)


def _on_tool_results(state: TurnState, event: ToolResults) -> tuple[TurnState, tuple[Effect, ...]]:
    got = [result.tool_use_id for result in event.results]
    if len(set(got)) != len(got) or set(got) != set(state.pending):
        missing = [use_id for use_id in state.pending if use_id not in got]
        extra = [use_id for use_id in got if use_id not in state.pending]
        raise InvalidTransition(
            state,
            event,
            f"results must answer each pending tool use once; pending {list(state.pending)}, "
            f"got {got} (missing {missing}, unexpected {extra})",
        )
    by_id = {result.tool_use_id: result for result in event.results}
    ordered = tuple(by_id[i] for i in state.pending)
    new = replace(
        state,
        phase=Phase.STEERING,
        mid_round=True,
        pending=(),
        batches=state.batches + 1,
        budget=_add(state.budget, event.tokens),
        trigger="forced" if event.compact else "scheduled",
    )
    if event.compact:
        forced = MaybeCompact(mid_round=True, trigger="forced", focus=event.focus)
        return new, (AppendMessage("user", ordered), forced)
    return new, (AppendMessage("user", ordered), _COMPACT_MID_ROUND)
