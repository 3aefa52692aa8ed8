"""The values the contract's hooks exchange: ``ctx``, ``meta``, a boundary's report.

:class:`CompactionContext` is the contract's ``ctx``, :class:`CompactionMeta` its checked
``meta``, :class:`BoundaryInfo` what ``on_boundary`` hooks learn of a finished boundary,
:class:`RecallHit` what a ``recall_entries`` source answers. The hook specifications
(:mod:`normandy_core.contract.hookspecs`) and the boundary both use them, so they sit
below both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, NoReturn, Protocol

from normandy_core.conversation.entries import Entry
from normandy_core.errors import NormandyError

if TYPE_CHECKING:
    from typing_extensions import Self

    from normandy_core.conversation.calibration import CalibratedCounter
    from normandy_core.conversation.memory import AgentMemory
    from normandy_core.conversation.survival import SurvivalRules

__all__ = [
    "SKIP",
    "AgentConfigView",
    "TOKEN_KEYS",
    "BoundaryInfo",
    "CompactionContext",
    "CompactionMeta",
    "CompactionTimeoutError",
    "ContractViolation",
    "Outcome",
    "RecallHit",
]


class AgentConfigView(Protocol):
    """The contract's ``acc`` as the hook specifications type it: an
    :class:`~normandy_core.AgentConfig`, the conversation in ``memory``.

    Structural, because the config is made through the hooks (it prepares its compactor
    where it is made), so the specifications cannot name its class without an import
    circle; the hook reference shows ``AgentConfig``.
    """

    @property
    def model(self) -> str | None: ...

    @property
    def memory(self) -> AgentMemory: ...

    def with_memory(self, memory: AgentMemory) -> Self: ...


#: Meta keys holding token figures: non-negative ints when present.
TOKEN_KEYS = ("tokens_before", "tokens_after", "tokens_removed")


@dataclass(frozen=True, slots=True)
class CompactionContext:
    """The decision inputs of one boundary (the contract's ``ctx``), immutable.

    ``model``: the model id of the turn. ``window``: its context window, ``None`` only for
    a compactor that needs none. ``prompt_tokens``: estimated tokens of the system prompt
    and tool definitions the next call sends (about four characters per token), plus what
    the request itself costs once (``counter.request_tokens``, the reply's priming), 0 when
    there is no window. ``mid_round``: false at the start of a turn, true after a tool
    batch, where the model's tool round is still open. ``turn_id``: the running turn, so a
    compactor can tell this turn's messages (``None`` outside a turn loop: the newest
    entry's turn is then taken as the running one). ``counter``: the calibrated counter
    prepared for this config (its ``counter`` option, else the model's default, scaled by
    the agent's calibration); every size decision uses it, and the boundary computes the
    token figures of the result with it. ``rules``: the config's survival rules
    (:class:`~normandy_core.SurvivalRules`; the defaults when not given): what the
    compactor must keep, and the summary instructions. ``force``: the boundary was asked
    for (``compact(force=True)``, ``normandy compact --force``, the model's
    ``compact_context`` tool): compact now whatever the trigger, or decline with a reason
    in ``meta["declined"]``; a compactor that ignores it skips as usual and the boundary
    says so. ``focus``: what the asker wants the summary to keep (``None``: no focus), for
    a compactor that summarizes to give its summarizer as instructions.
    """

    model: str | None
    window: int | None
    prompt_tokens: int
    mid_round: bool
    turn_id: str | None = None
    counter: CalibratedCounter = None  # type: ignore[assignment]  # filled in __post_init__
    rules: SurvivalRules = None  # type: ignore[assignment]  # filled in __post_init__
    force: bool = False
    focus: str | None = None

    def __post_init__(self) -> None:
        if self.counter is None:
            from normandy_core.conversation.calibration import CalibratedCounter

            object.__setattr__(self, "counter", CalibratedCounter(None, self.model))
        if self.rules is None:
            from normandy_core.conversation.survival import DEFAULT_RULES

            object.__setattr__(self, "rules", DEFAULT_RULES)


class CompactionMeta(dict[str, Any]):
    """The contract's ``meta``, checked and read-only: a ``dict`` that refuses changes.

    Read it like the contract's mapping (``meta["compacted"]``, ``meta.get("dropped")``)
    or through the typed properties. ``dropped`` is a tuple of frozen entries. Hooks get
    this object, so no hook can change what the next one receives; ``dict(meta)`` is a
    mutable copy and :meth:`replace` a changed read-only one.
    """

    __slots__ = ()

    def _read_only(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("compaction meta is read-only; copy it with dict(meta) or meta.replace()")

    __setitem__ = _read_only
    __delitem__ = _read_only
    __ior__ = _read_only
    clear = _read_only
    pop = _read_only
    popitem = _read_only
    setdefault = _read_only
    update = _read_only

    def __reduce__(self) -> tuple[Any, ...]:
        return (CompactionMeta, (dict(self),))

    def __copy__(self) -> CompactionMeta:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> CompactionMeta:
        return self

    def replace(self, **changes: Any) -> CompactionMeta:
        """A copy with ``changes`` (a value of ``None`` removes the key)."""
        data = dict(self)
        for key, value in changes.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        return CompactionMeta(data)

    @property
    def compacted(self) -> bool:
        """Whether the compactor compacted."""
        return bool(dict.get(self, "compacted"))

    @property
    def dropped(self) -> tuple[Entry, ...]:
        """The removed (or rewritten) entries with their original content, oldest first."""
        return tuple(dict.get(self, "dropped") or ())

    @property
    def error(self) -> str | None:
        """The error of the error path, else ``None``."""
        err = dict.get(self, "error")
        return None if err is None else str(err)

    @property
    def declined(self) -> str | None:
        """Why a forced boundary (``ctx.force``) did not compact, else ``None``."""
        value = dict.get(self, "declined")
        return None if value is None else str(value)

    @property
    def strategy(self) -> str | None:
        """The compactor's strategy name, when it reports one."""
        value = dict.get(self, "strategy")
        return None if value is None else str(value)

    @property
    def tokens_before(self) -> int | None:
        """Tokens of the whole active branch before compaction (``ctx.counter``)."""
        return dict.get(self, "tokens_before")

    @property
    def tokens_after(self) -> int | None:
        """Tokens of the whole active branch after compaction (``ctx.counter``)."""
        return dict.get(self, "tokens_after")

    @property
    def tokens_removed(self) -> int | None:
        """Tokens of the running turn's messages that compaction removed."""
        return dict.get(self, "tokens_removed")

    @property
    def target_met(self) -> bool | None:
        """Whether the compactor reached the size it aims for (``None``: it did not say)."""
        value = dict.get(self, "target_met")
        return None if value is None else bool(value)

    @property
    def target_missed(self) -> str | None:
        """Why the result is still over the window the compactor was given; ``None`` when
        it is not (or the compactor sizes against no window)."""
        value = dict.get(self, "target_missed")
        return None if value is None else str(value)

    @property
    def thinking_stripped(self) -> bool:
        """Whether the compaction stripped the thinking blocks of an entry it kept (set by
        the boundary on every compaction; false on the skip and error paths). Mid-round,
        the model then finishes its tool round with thinking disabled."""
        return bool(dict.get(self, "thinking_stripped"))

    @property
    def hook_errors(self) -> tuple[Mapping[str, str], ...]:
        """One ``{"hook", "plugin", "error"}`` per ``after_compact`` hook that failed."""
        return tuple(dict.get(self, "hook_errors") or ())

    @property
    def hook_notes(self) -> tuple[Mapping[str, Any], ...]:
        """One ``{"hook", "plugin", "note"}`` per note a hook returned, in the order run."""
        return tuple(dict.get(self, "hook_notes") or ())


#: The skip path's meta, shared (it is read-only).
SKIP = CompactionMeta({"compacted": False})


class ContractViolation(NormandyError):
    """A compactor's result breaks the contract; the message names the compactor and rule."""


class CompactionTimeoutError(Exception):
    """A compactor did not return within the configured ``compaction_timeout``."""


#: What a boundary came to: the compactor compacted, skipped, or the boundary failed.
Outcome = Literal["compacted", "skipped", "failed"]


class BoundaryInfo(NamedTuple):
    """What one boundary did, beyond its ``meta``: who ran, how it ended, how long it took.

    The ``on_boundary`` hook receives it at every boundary. ``outcome`` is
    ``"compacted"``, ``"skipped"`` or ``"failed"`` (the error path). ``compactor`` is the
    configured name, ``distribution`` and ``version`` where it comes from
    (``"<registered in code>"`` and ``"-"`` for one registered in code) and ``plugin``
    the description error messages use. ``start_ns`` is the wall-clock time the boundary
    began (:func:`time.time_ns`), ``duration`` its length in seconds, hooks included;
    ``compactor_start`` (seconds after ``start_ns``) and ``compactor_duration`` time the
    compactor's ``maybe_compact`` with the contract check (at a boundary at or below the
    level its ``compaction_threshold`` hook declared, the comparison that stands in for
    the call), ``None`` when it was not reached. ``error_type`` says briefly why a
    boundary failed, for grouping: ``"reported"`` (the compactor returned the error
    path), ``"contract"`` (its result broke the contract), ``"timeout"``
    (``compaction_timeout`` passed), ``"refused"`` (a ``before_commit`` hook refused to
    record the dropped entries), ``"abandoned_limit"`` (too many abandoned threads to
    call it), ``"context"`` (the boundary's ``ctx`` could not be built), or the name of
    the exception the compactor raised (``"RuntimeError"``, ``"mypackage.BusyError"``);
    ``None`` unless it failed. ``thinking_disabled`` says whether the model call after
    the boundary goes without extended thinking although the turn asks for it: a tool
    round is open and its last assistant message lost its thinking to a mid-round
    compaction, so the round finishes with thinking disabled (known inside the turn
    loop, which says whether it asks for thinking; false elsewhere). Summed over a
    turn's boundaries, it is the turn's
    :attr:`~normandy_core.turn.TurnResult.thinking_disabled_calls`.
    ``trigger`` says why the boundary ran: ``"scheduled"``
    (where the turn loop, :func:`~normandy_core.compact` or the command line resolve
    one), ``"overflow"`` (the turn loop's recovery after the provider refused a
    request as too long) or ``"forced"`` (compaction on request: ``force=True``, ``normandy
    compact --force`` or the model's ``compact_context`` tool).

    Immutable (a named tuple: made at every observed boundary, it must be cheap), so no
    hook can change what the next one receives.
    """

    outcome: Outcome
    compactor: str
    distribution: str
    version: str
    plugin: str
    start_ns: int
    duration: float
    compactor_start: float | None = None
    compactor_duration: float | None = None
    error_type: str | None = None
    thinking_disabled: bool = False
    trigger: str = "scheduled"

    @property
    def compacted(self) -> bool:
        """Whether the boundary compacted."""
        return self.outcome == "compacted"

    @property
    def failed(self) -> bool:
        """Whether the boundary took the error path."""
        return self.outcome == "failed"


@dataclass(frozen=True)
class RecallHit:
    """One entry a recall source found, best match first in the source's answer.

    ``entry`` is the entry as it was dropped (its id, role and original content);
    ``session_id`` the session that archived it; ``archived_at`` when (Unix time);
    ``tool_names`` the names of the tools whose results it holds, by tool-use id, when
    the source knows them (a tool result does not carry its tool's name); ``order`` its
    place in the source's archive order (larger: archived later), when the source knows
    it. ``superseded`` is set by recall, not by sources: the settings the entry gives
    (``key=value``, ``set key to value``) that a later message gave another value, as
    ``key -> later value``. ``near`` is the part of the entry's text (one of
    :func:`~normandy_core.contract.recall_parts.parts` of one of its blocks) closest to
    the query by meaning, when a source ranked the entry by meaning: recall's excerpt of
    a long entry is centred on it; ``similarity`` is then how close that part is to the
    query (the cosine of their vectors, 1 the closest), which weighs the hit in recall's
    fusion (by how it stands out from the other hits found by meaning).
    """

    entry: Entry
    session_id: str | None = None
    archived_at: float | None = None
    tool_names: Mapping[str, str] = field(default_factory=dict)
    order: int | None = None
    superseded: Mapping[str, str] = field(default_factory=dict)
    near: str | None = None
    similarity: float | None = None
