"""The one boundary function: build ``ctx``, call the selected compactor, check, run hooks.

Every boundary is observable: it is logged on the ``normandy_core.boundary`` logger
(DEBUG when the compactor skipped, INFO when it compacted, WARNING when it failed, each
line naming the compactor and its distribution) and reported to the ``on_boundary``
hook of every hook plugin with a :class:`~normandy_core.BoundaryInfo`, once its result
is final.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from normandy_core.contract.check import CompactionResult, account, build_context, call_compactor
from normandy_core.contract.config import AgentConfig
from normandy_core.contract.faults import (
    AbandonedLimitError,
    PluginTimeoutError,
    abandoned_threads,
    call_plugin,
    fault_cause,
    run_bounded,
)
from normandy_core.contract.hooks import (
    fault_text,
    run_after_compact,
    run_before_commit,
    run_on_boundary,
    selected,
)
from normandy_core.contract.plugins import HookCaller
from normandy_core.contract.types import (
    SKIP,
    BoundaryInfo,
    CompactionContext,
    CompactionMeta,
    ContractViolation,
    Outcome,
)
from normandy_core.conversation.structure import thinking_lost

if TYPE_CHECKING:
    from normandy_core.contract.preparation import Prepared
    from normandy_core.conversation.calibration import Calibration
    from normandy_core.conversation.memory import AgentMemory

__all__ = ["check_focus", "run_compaction"]

log = logging.getLogger("normandy_core.boundary")


class _Probe:
    """What :func:`_resolve` learns on the way, for the log line and ``on_boundary``.

    The defaults are class attributes, so making one (at every boundary) runs no
    ``__init__``."""

    comp: Any = None
    ctx: CompactionContext | None = None
    error_type: str | None = None
    exc: BaseException | None = None
    started: float | None = None
    took: float | None = None


def run_compaction(
    acc: AgentConfig,
    *,
    mid_round: bool,
    turn_id: str | None = None,
    timeout: float | None = None,
    calibration: Calibration | None = None,
    thinking: bool = False,
    trigger: str = "scheduled",
    force: bool = False,
    focus: str | None = None,
) -> CompactionResult:
    """Resolve one boundary: call ``acc``'s compactor and return the checked result.

    The result unpacks as the contract's ``(acc, meta)``; ``meta`` is a read-only
    :class:`~normandy_core.CompactionMeta`. Builds ``ctx`` from what the config prepared
    (:func:`~normandy_core.build_context`; ``calibration`` overrides the config's), calls
    the compactor and checks its result with the contract's one check
    (:func:`~normandy_core.check_compaction`). Anything wrong (an exception of any kind
    from the compactor, a refused result, a mutated input) yields the error path
    ``{"compacted": False, "error": ...}`` with the caller's ``acc``, its memory restored.
    On a compaction the boundary computes ``tokens_before``, ``tokens_after`` and
    ``tokens_removed`` with ``ctx.counter``. When something was dropped, every
    ``before_commit`` hook must accept it first (the first that raises refuses the
    compaction: the error path, the conversation kept), then the ``after_compact`` hooks
    run; those that fail are listed in ``meta["hook_errors"]``, and the notes hooks of
    both kinds return in ``meta["hook_notes"]``.

    Once the result is final, the boundary is logged on the ``normandy_core.boundary``
    logger (DEBUG skipped, INFO compacted, WARNING failed, naming the compactor and its
    distribution) and every ``on_boundary`` hook gets the result's ``acc`` and ``meta``
    with a :class:`BoundaryInfo` (its ``trigger`` the one given here: ``"overflow"`` from
    the turn loop's recovery after a too-long refusal); a hook that fails there is
    logged and changes nothing.
    ``thinking`` says whether the model call after the boundary asks for extended
    thinking (the turn loop passes whether it does); then ``BoundaryInfo.thinking_disabled``
    says whether that call must go without it.

    ``force=True`` asks for a compaction now, whatever the compactor's trigger
    (``ctx.force``; the boundary's ``trigger`` is then ``"forced"``), with an optional
    ``focus`` for the summarizer (``ctx.focus``; a non-empty string, refused without
    ``force``). The compactor may still decline, saying why in ``meta["declined"]``; one
    that skips without a reason (it does not know ``ctx.force``) is given one here. A
    ``compaction_threshold`` level does not stand in for a forced call.

    ``timeout`` (default: ``acc.compaction_timeout``; ``None``: unbounded) bounds the
    whole boundary, hooks included. Under it the compactor works on a private copy of the
    memory in a worker thread, so a compactor abandoned past the limit can never reach
    the live memory or its token totals; at most
    :data:`~normandy_core.contract.faults.MAX_ABANDONED` abandoned threads may be alive,
    past which the boundary is skipped with an error; a result that arrives after the
    limit (the compactor held the GIL in C code, so the wait could not end on time) is
    refused the same way. The ``on_boundary`` hooks share a time limit of their own of
    the same length (a boundary that ran out of time is still reported), and are called
    on this thread when the cap leaves no thread to bound them in.
    This function does not raise for a faulty compactor or hook; only a genuine Ctrl-C of
    the user's process propagates (with the memory restored).
    """
    check_focus(force, focus, entry="run_compaction()")
    start_ns = time.time_ns()
    t0 = time.perf_counter()
    probe = _Probe()
    limit = timeout if timeout is not None else acc.compaction_timeout
    request = _Request(mid_round, turn_id, calibration, force, focus)
    result = _resolve(acc, probe, limit, request, t0)
    if force:
        result = _with_reason(acc, result, probe)
        trigger = "forced" if trigger == "scheduled" else trigger
    duration = time.perf_counter() - t0
    outcome = _outcome(result.meta)
    logged = log.isEnabledFor(_LEVELS[outcome])
    observers = selected("on_boundary", gated=True)
    if logged or observers:
        info = _info(acc, result, outcome, probe, start_ns, duration, thinking, trigger)
        _report(result, probe, info, limit, logged, observers)
    return result


def check_focus(force: bool, focus: object, *, entry: str) -> None:
    """Refuse a ``focus`` that is not a non-empty string, or one given without ``force``
    (only a forced boundary passes it on); the message names ``entry`` and the option."""
    if focus is None:
        return
    if not isinstance(focus, str) or not focus.strip():
        raise ValueError(f"{entry}: focus must be a non-empty string, got {focus!r}")
    if not force:
        raise ValueError(
            f"{entry}: focus is read only by a compaction on request; pass force=True with it"
        )


class _Request(NamedTuple):
    """What the caller of one boundary asked for: its kind, turn and calibration, and
    whether it is forced (with its focus)."""

    mid_round: bool
    turn_id: str | None
    calibration: Calibration | None
    force: bool
    focus: str | None


def _with_reason(acc: AgentConfig, result: CompactionResult, probe: _Probe) -> CompactionResult:
    """A forced boundary's result, with ``declined`` said when the compactor skipped
    without a reason (it does not read ``ctx.force``)."""
    meta = result.meta
    if meta.compacted or "error" in meta or meta.declined is not None:
        return result
    who = f"compactor {acc.compactor!r}" if probe.comp is None else probe.comp.describe()
    why = f"{who} did not compact on request and gave no reason (it may not read ctx.force)"
    return CompactionResult(result.acc, meta.replace(declined=why))


def _outcome(meta: CompactionMeta) -> Outcome:
    if meta is SKIP or not (meta.compacted or "error" in meta):
        return "skipped"
    return "compacted" if meta.compacted else "failed"


def _error(
    acc: AgentConfig,
    reason: str,
    probe: _Probe,
    kind: str,
    exc: BaseException | None = None,
) -> CompactionResult:
    """The error path; logged (at WARNING) once the boundary ends, by :func:`_log`."""
    probe.error_type = kind
    probe.exc = exc
    return CompactionResult(acc, CompactionMeta({"compacted": False, "error": reason}))


def _type_name(exc: BaseException) -> str:
    kind = type(fault_cause(exc))
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _resolve(
    acc: AgentConfig,
    probe: _Probe,
    limit: float | None,
    request: _Request,
    t0: float,
) -> CompactionResult:
    """The boundary itself (see :func:`run_compaction`), noting what it learns in ``probe``."""
    deadline = None if limit is None else time.monotonic() + limit
    try:
        prepared = acc.prepared
        probe.comp = prepared.compactor
        ctx = build_context(
            acc,
            mid_round=request.mid_round,
            turn_id=request.turn_id,
            calibration=request.calibration,
            force=request.force,
            focus=request.focus,
        )
    except Exception as exc:
        why = f"compactor {acc.compactor!r} could not be prepared: {exc}"
        return _error(acc, why, probe, "context", exc)
    probe.ctx = ctx
    started = time.perf_counter()
    probe.started = started - t0
    if not ctx.force and _at_or_below(acc.memory, ctx, prepared.thresholds[ctx.mid_round]):
        # The compactor declared (compaction_threshold) that it skips at or below this
        # level: its call would give exactly this result (a property test compares them).
        probe.took = time.perf_counter() - started
        return CompactionResult(acc, SKIP)
    try:
        result = _call(acc, ctx, prepared, limit, probe)
    finally:
        probe.took = time.perf_counter() - t0 - probe.started
    if not result.meta.compacted:
        return result
    return _commit(acc, account(result, acc.memory, ctx), ctx, deadline, probe)


def _at_or_below(memory: AgentMemory, ctx: CompactionContext, level: int | None) -> bool:
    """Whether the memory and the prompt, counted as the compactor counts, are at or below
    the ``level`` its ``compaction_threshold`` declared (never, without a level). A count
    that fails falls through to the call, which meets the failure itself."""
    if level is None:
        return False
    try:
        return ctx.counter.at_most(memory, level - ctx.prompt_tokens)
    except Exception:
        return False


def _call(
    acc: AgentConfig,
    ctx: CompactionContext,
    prepared: Prepared,
    limit: float | None,
    probe: _Probe,
) -> CompactionResult:
    """The compactor called and its result checked; the error path for anything wrong."""
    comp = prepared.compactor
    try:
        if limit is None:
            result: CompactionResult = call_plugin(call_compactor, comp, acc, ctx, prepared.options)
        else:
            result = _call_bounded(acc, ctx, prepared, limit)
    except PluginTimeoutError as exc:
        return _error(acc, _past_the_limit(comp.describe(), exc), probe, "timeout")
    except AbandonedLimitError as exc:
        return _error(acc, f"{comp.describe()} was not called: {exc}", probe, "abandoned_limit")
    except ContractViolation as exc:
        return _error(acc, str(exc), probe, "contract")
    except Exception as exc:
        why = f"{comp.describe()} raised {fault_text(exc)}"
        return _error(acc, why, probe, _type_name(exc), exc)
    return result


def _past_the_limit(who: str, exc: PluginTimeoutError) -> str:
    """Why a compactor's result is not taken: it was abandoned at ``compaction_timeout``,
    or it returned after it (its thread held the GIL, so the wait could not end on time)."""
    if exc.took is None:
        return (
            f"{who} did not return within {exc.limit:g} s (compaction_timeout); its result "
            f"will be ignored ({abandoned_threads()} abandoned thread(s) running)"
        )
    return (
        f"{who} returned after {exc.took:.2f} s, past compaction_timeout ({exc.limit:g} s): "
        "its late result is refused and the conversation kept as it was (code holding the "
        "GIL, such as a regular expression in C, delays the boundary until it returns)"
    )


def _commit(
    acc: AgentConfig,
    result: CompactionResult,
    ctx: CompactionContext,
    deadline: float | None,
    probe: _Probe,
) -> CompactionResult:
    """A compaction that dropped entries, once every ``before_commit`` hook recorded them
    (the error path when one refuses), with what the ``after_compact`` hooks reported."""
    dropped = result.meta.dropped
    if not dropped:
        return result
    notes: list[dict[str, Any]] = []
    raised: list[Exception] = []
    refused = run_before_commit(
        result.acc, ctx, result.meta, deadline=deadline, notes=notes, raised=raised
    )
    if refused is not None:
        # One report of the refusal: the boundary's WARNING, with the hook's traceback.
        cause = fault_cause(raised[0]) if raised else None  # None: it ran out of time
        return _error(
            acc,
            f"{probe.comp.describe()} compacted, but the compaction was refused: "
            f"{refused['plugin']} could not record the {len(dropped)} dropped "
            f"entries ({refused['error']}); the conversation is kept as it was",
            probe,
            "refused",
            cause,
        )
    hook_errors = run_after_compact(result.acc, ctx, result.meta, deadline=deadline, notes=notes)
    if not (hook_errors or notes):
        return result
    meta = result.meta.replace(hook_errors=hook_errors or None, hook_notes=notes or None)
    return CompactionResult(result.acc, meta)


def _report(
    result: CompactionResult,
    probe: _Probe,
    info: BoundaryInfo,
    timeout: float | None,
    logged: bool,
    observers: tuple[HookCaller, ...],
) -> None:
    """The finished boundary's log line and ``on_boundary`` reports."""
    if logged:
        _log(result, probe, info)
    if observers:
        deadline = None if timeout is None else time.monotonic() + timeout
        run_on_boundary(
            result.acc, probe.ctx, result.meta, info, deadline=deadline, callers=observers
        )


#: The level of each outcome's log line.
_LEVELS = {"skipped": logging.DEBUG, "compacted": logging.INFO, "failed": logging.WARNING}


def _info(
    acc: AgentConfig,
    result: CompactionResult,
    outcome: Outcome,
    probe: _Probe,
    start_ns: int,
    duration: float,
    thinking: bool,
    trigger: str,
) -> BoundaryInfo:
    comp = probe.comp
    error_type = probe.error_type if outcome == "failed" else None
    if outcome == "failed" and error_type is None:
        error_type = "reported"
    return BoundaryInfo(
        outcome=outcome,
        compactor=acc.compactor if comp is None else comp.name,
        distribution="?" if comp is None else comp.distribution,
        version="?" if comp is None else comp.version,
        plugin=f"compactor {acc.compactor!r}" if comp is None else comp.describe(),
        start_ns=start_ns,
        duration=duration,
        compactor_start=probe.started,
        compactor_duration=probe.took,
        error_type=error_type,
        # the request the client sends next is the result's conversation
        thinking_disabled=thinking and thinking_lost(result.acc.memory.newest_first()),
        trigger=trigger,
    )


def _log(result: CompactionResult, probe: _Probe, info: BoundaryInfo) -> None:
    """The boundary's one log line: DEBUG skipped, INFO compacted, WARNING failed."""
    ctx = probe.ctx
    meta = result.meta
    model = None if ctx is None else ctx.model
    where = f"model {model}" if model else "no model"
    if ctx is not None:
        where += ", mid-round" if ctx.mid_round else ", turn start"
    took = f"{info.duration * 1000:.1f} ms"
    extra: dict[str, Any] = {
        "normandy_outcome": info.outcome,
        "normandy_compactor": info.compactor,
        "normandy_distribution": info.distribution,
        "normandy_version": info.version,
        "normandy_model": model,
        "normandy_duration": info.duration,
    }
    if info.outcome == "skipped":
        log.debug("%s skipped the boundary (%s; %s)", info.plugin, where, took, extra=extra)
    elif info.outcome == "compacted":
        dropped = len(meta.dropped)
        extra.update(
            normandy_tokens_before=meta.tokens_before,
            normandy_tokens_after=meta.tokens_after,
            normandy_tokens_removed=meta.tokens_removed,
            normandy_strategy=meta.strategy,
            normandy_dropped=dropped,
        )
        hook_errors = len(meta.hook_errors)
        log.info(
            "%s compacted: %s -> %s tokens (%s of this turn removed), strategy %s, "
            "%d entr%s dropped (%s; %s)%s",
            info.plugin,
            _n(meta.tokens_before),
            _n(meta.tokens_after),
            _n(meta.tokens_removed),
            meta.strategy or "not reported",
            dropped,
            "y" if dropped == 1 else "ies",
            where,
            took,
            f"; {hook_errors} hook error(s)" if hook_errors else "",
            extra=extra,
        )
    else:
        _log_failure(meta, probe, info, f"{where}; {took}", extra)


def _log_failure(
    meta: CompactionMeta, probe: _Probe, info: BoundaryInfo, where: str, extra: dict[str, Any]
) -> None:
    """The WARNING line of a failed boundary; identical failures (this plugin, this kind)
    are logged once per interval with a count (``FAULT_FLOOD``)."""
    extra.update(
        normandy_error=meta.error,
        normandy_error_type=info.error_type,
        normandy_fault=f"boundary of {info.plugin}: {info.error_type}",
    )
    error = meta.error or ""
    # The boundary's own reasons name the compactor; what a compactor reports is its own.
    text = error if probe.error_type is not None else f"{info.plugin} failed: {error}"
    log.warning("%s (%s)", text, where, exc_info=probe.exc, extra=extra)


def _n(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _call_bounded(
    acc: AgentConfig, ctx: CompactionContext, prepared: Prepared, limit: float
) -> CompactionResult:
    """The compactor on a private copy of the memory, in a thread abandoned past ``limit``.

    The copy shares the (frozen) entries, so the checked result is the same as on the
    live memory; on the skip and error paths the caller's own ``acc`` is returned.
    """
    private = acc.with_memory(acc.memory.copy())
    comp = prepared.compactor

    def work() -> CompactionResult:
        return call_compactor(comp, private, ctx, prepared.options)

    result = run_bounded(work, limit, f"normandy-compactor-{comp.name}")
    if not result.meta.compacted:
        return CompactionResult(acc, result.meta)
    return result
