"""The one boundary function: build ``ctx``, call the selected compactor, check, run hooks.

Every boundary is observable: it is logged on the ``normandy_core.contract.boundary`` logger
(DEBUG when the compactor skipped, INFO when it compacted, WARNING when it failed, each
line naming the compactor and its distribution) and reported to the ``on_boundary``
hook of every hook plugin with a :class:`BoundaryInfo`, once its result is final.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from normandy_core.contract import plugins as _plugins
from normandy_core.contract.check import (
    _SKIP,
    CompactionContext,
    CompactionMeta,
    CompactionResult,
    ContractViolation,
    _reused_context,
    account,
    build_context,
    call_compactor,
)
from normandy_core.contract.config import AgentConfig
from normandy_core.contract.faults import (
    AbandonedLimitError,
    PluginFault,
    PluginTimeoutError,
    abandoned_threads,
    call_gate,
    call_plugin,
    run_bounded,
)
from normandy_core.contract.hookspecs import ACTIVE_ATTR
from normandy_core.contract.plugins import describe_hook, hook_manager

if TYPE_CHECKING:
    from normandy_core.conversation.calibration import Calibration

__all__ = [
    "BoundaryInfo",
    "CompactionContext",
    "CompactionTimeoutError",
    "build_context",
    "run_after_compact",
    "run_before_commit",
    "run_compaction",
    "run_on_boundary",
]

log = logging.getLogger("normandy_core.boundary")

#: Makes a named tuple from a tuple without its Python-level ``__new__`` (hot path).
_new_result = tuple.__new__


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
    ``None`` unless it failed.

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

    @property
    def compacted(self) -> bool:
        """Whether the boundary compacted."""
        return self.outcome == "compacted"

    @property
    def failed(self) -> bool:
        """Whether the boundary took the error path."""
        return self.outcome == "failed"


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


def _fault_text(exc: BaseException) -> str:
    cause = exc.__cause__ if isinstance(exc, PluginFault) and exc.__cause__ else exc
    return f"{type(cause).__name__}: {cause}"


def _type_name(exc: BaseException) -> str:
    cause = exc.__cause__ if isinstance(exc, PluginFault) and exc.__cause__ else exc
    kind = type(cause)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _selected(hook: str, *, gated: bool = False) -> list[tuple[Any, Any]]:
    """``hook``'s implementations in pluggy's order, each with a caller through pluggy's
    call path that calls only it; with ``gated``, only those whose :func:`active_when`
    gate is true (or that have none)."""
    pm = hook_manager()
    caller = getattr(pm.hook, hook)
    impls = caller.get_hookimpls()
    if not impls:
        return []
    if len(impls) == 1:
        pairs = [(impls[0], caller)]  # the hook's own caller calls its one implementation
    else:
        impls.reverse()  # pluggy's order: the last registered first
        pairs = list(zip(impls, _callers(pm, hook, impls), strict=True))
    if gated:
        pairs = [p for p in pairs if _active(hook, p[0])]
    return pairs


#: The ``on_boundary`` selection of the last boundary: the hook manager, its
#: implementations then, the pairs of :func:`_selected`, each with its gate, and those
#: pairs alone when none has a gate (else ``None``).
_observer_plan: (
    tuple[Any, list[Any], list[tuple[tuple[Any, Any], Any]], list[tuple[Any, Any]] | None] | None
) = None


def _observers() -> list[tuple[Any, Any]]:
    """``_selected("on_boundary", gated=True)``, at the cost of a list comparison.

    The pairs are made again only when the hook manager or its ``on_boundary``
    implementations changed (a plugin registered or unregistered); the gates are asked
    at every boundary, as :func:`active_when` promises. Without gates the same list is
    returned every time (callers only read it).
    """
    global _observer_plan
    pm = _plugins._REG.hook_pm  # hook_manager(), without its call once loaded
    if pm is None:
        pm = hook_manager()
    caller = pm.hook.on_boundary
    impls = getattr(caller, "_hookimpls", None)
    if impls is None:  # pragma: no cover - a pluggy without the attribute
        impls = caller.get_hookimpls()
    plan = _observer_plan
    if plan is None or plan[0] is not pm or plan[1] != impls:
        gates = [(p, getattr(p[0].function, ACTIVE_ATTR, None)) for p in _selected("on_boundary")]
        fixed = None if any(g is not None for _, g in gates) else [p for p, _ in gates]
        plan = _observer_plan = (pm, list(impls), gates, fixed)
    if plan[3] is not None:
        return plan[3]
    selected = []
    for pair, gate in plan[2]:
        if gate is not None:
            try:
                if not call_gate(gate):
                    continue
            except Exception as exc:  # a gate that raises counts as true
                what = describe_hook(pair[0].plugin_name)
                log.error(
                    "the on_boundary gate of %s raised %s", what, _fault_text(exc), exc_info=exc
                )
        selected.append(pair)
    return selected


def _active(hook: str, impl: Any) -> bool:
    """Whether ``impl``'s :func:`active_when` gate lets it be called (true without one)."""
    gate = getattr(impl.function, ACTIVE_ATTR, None)
    if gate is None:
        return True
    try:
        return call_gate(gate)
    except Exception as exc:
        what = describe_hook(impl.plugin_name)
        log.error("the %s gate of %s raised %s", hook, what, _fault_text(exc), exc_info=exc)
        return True


def _run_hooks(
    hook: str,
    acc: AgentConfig,
    ctx: CompactionContext | None,
    meta: Mapping[str, Any],
    deadline: float | None,
    *,
    stop_at_first: bool,
    notes: list[dict[str, Any]] | None = None,
    extra: Mapping[str, Any] | None = None,
    pairs: list[tuple[Any, Any]] | None = None,
) -> list[dict[str, str]]:
    """Call ``hook`` on every hook plugin implementing it (or on ``pairs``, from
    :func:`_selected`), each isolated from the others, through pluggy's call path; one
    ``{"hook", "plugin", "error"}`` per failure. The notes the hooks return (mappings) are
    appended to ``notes`` as ``{"hook", "plugin", "note"}``.
    """
    if pairs is None:
        pairs = _selected(hook)
    if not pairs:
        return []
    view = meta if isinstance(meta, CompactionMeta) else CompactionMeta(meta)
    kwargs = {"acc": acc, "ctx": ctx, "meta": view}
    if extra:
        kwargs.update(extra)
    errors: list[dict[str, str]] = []
    count = len(pairs)
    for n in range(count):
        impl, call = pairs[n]
        try:
            if deadline is None:
                returned = call_plugin(call, **kwargs)
            else:
                share = max(deadline - time.monotonic(), 0.0) / (count - n)
                returned = run_bounded(
                    functools.partial(call, **kwargs), share, f"normandy-hook-{impl.plugin_name}"
                )
            if notes is not None and returned:
                what = describe_hook(impl.plugin_name)
                for note in returned:
                    if isinstance(note, Mapping):
                        notes.append({"hook": impl.plugin_name, "plugin": what, "note": dict(note)})
        except PluginTimeoutError:
            what = describe_hook(impl.plugin_name)
            text = "abandoned: it did not return within its share of compaction_timeout"
            log.error("%s of %s %s", hook, what, text)
            errors.append({"hook": impl.plugin_name, "plugin": what, "error": text})
        except Exception as exc:
            what = describe_hook(impl.plugin_name)
            text = _fault_text(exc)
            log.error("%s of %s raised %s", hook, what, text, exc_info=exc)
            errors.append({"hook": impl.plugin_name, "plugin": what, "error": text})
        if errors and stop_at_first:
            break
    return errors


#: Per hook, the callers of its implementations (one plugin each), with the manager and
#: implementations they were made for: reused while those stay the same.
_subsets: dict[str, tuple[Any, tuple[Any, ...], list[Any]]] = {}


def _callers(pm: Any, hook: str, impls: list[Any]) -> list[Any]:
    """A caller per implementation, each through pluggy's call path and calling only its
    own plugin (a subset caller); the hook's own caller when it has one implementation.

    Made once per set of implementations: building subset callers at every boundary was
    most of what an observed boundary that skips cost.
    """
    if len(impls) == 1:
        return [getattr(pm.hook, hook)]
    cached = _subsets.get(hook)
    if (
        cached is not None
        and cached[0] is pm
        and len(cached[1]) == len(impls)
        and all(a is b for a, b in zip(cached[1], impls, strict=True))
    ):
        return cached[2]
    plugins = [impl.plugin for impl in impls]
    callers = [
        pm.subset_hook_caller(hook, remove_plugins=[p for p in plugins if p is not impl.plugin])
        for impl in impls
    ]
    _subsets[hook] = (pm, tuple(impls), callers)
    return callers


def run_after_compact(
    acc: AgentConfig,
    ctx: CompactionContext,
    meta: Mapping[str, Any],
    *,
    deadline: float | None = None,
    notes: list[dict[str, Any]] | None = None,
) -> list[dict[str, str]]:
    """Broadcast ``after_compact`` to every hook plugin, each isolated from the others.

    Each hook is called through pluggy's call path (a subset caller of one plugin, so
    ``pm.add_hookcall_monitoring`` sees every call) with a read-only ``meta``. With a
    ``deadline`` (a :func:`time.monotonic` value) each hook gets an equal share of the
    time left and is abandoned past it. Returns one
    ``{"hook": name, "plugin": description, "error": text}`` per hook that raised (any
    exception, ``SystemExit`` included) or ran out of time, each also logged. The notes
    the hooks return are appended to ``notes`` (when given) as
    ``{"hook": name, "plugin": description, "note": mapping}``.
    """
    return _run_hooks("after_compact", acc, ctx, meta, deadline, stop_at_first=False, notes=notes)


def run_before_commit(
    acc: AgentConfig,
    ctx: CompactionContext,
    meta: Mapping[str, Any],
    *,
    deadline: float | None = None,
    notes: list[dict[str, Any]] | None = None,
) -> dict[str, str] | None:
    """Ask every ``before_commit`` hook to record the compaction; the first refusal, or None.

    Every implementation is required: the first that raises or runs past its share of the
    ``deadline`` stops the others and is returned as ``{"hook", "plugin", "error"}``. The
    notes the hooks return are appended to ``notes`` (when given), as for
    :func:`run_after_compact`.
    """
    errors = _run_hooks("before_commit", acc, ctx, meta, deadline, stop_at_first=True, notes=notes)
    return errors[0] if errors else None


def run_on_boundary(
    acc: AgentConfig,
    ctx: CompactionContext | None,
    meta: Mapping[str, Any],
    info: BoundaryInfo,
    *,
    deadline: float | None = None,
) -> list[dict[str, str]]:
    """Report a finished boundary to every ``on_boundary`` hook, each isolated.

    Called like :func:`run_after_compact` (pluggy's call path, a read-only ``meta``, an
    equal share of the time left before ``deadline`` each); what the hooks return is
    ignored. Returns one ``{"hook", "plugin", "error"}`` per hook that raised or ran out
    of time, each also logged at ERROR.
    """
    return _run_hooks(
        "on_boundary",
        acc,
        ctx,
        meta,
        deadline,
        stop_at_first=False,
        extra={"info": info},
        pairs=_observers(),
    )


def run_compaction(
    acc: AgentConfig,
    *,
    mid_round: bool,
    turn_id: str | None = None,
    timeout: float | None = None,
    calibration: Calibration | None = None,
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

    Once the result is final, the boundary is logged on the ``normandy_core.contract.boundary``
    logger (DEBUG skipped, INFO compacted, WARNING failed, naming the compactor and its
    distribution) and every ``on_boundary`` hook gets the result's ``acc`` and ``meta``
    with a :class:`BoundaryInfo`; a hook that fails there is logged and changes nothing.

    ``timeout`` (default: ``acc.compaction_timeout``; ``None``: unbounded) bounds the
    whole boundary, hooks included. Under it the compactor works on a private copy of the
    memory in a worker thread, so a compactor abandoned past the limit can never reach
    the live memory or its token totals; at most
    :data:`~normandy_core.contract.faults.MAX_ABANDONED` abandoned threads may be alive, past which
    the boundary is skipped with an error. The ``on_boundary`` hooks share a time limit
    of their own of the same length (a boundary that ran out of time is still reported).
    This function does not raise for a faulty compactor or hook; only a genuine Ctrl-C of
    the user's process propagates (with the memory restored).
    """
    start_ns = time.time_ns()
    t0 = time.perf_counter()
    quick = _below_threshold(acc, mid_round, turn_id, calibration)
    if quick is not None:
        # The compactor's declared threshold, met with a reused ctx: the plain skip
        # (exactly what _resolve returns then; a property test compares the two paths).
        # The comparison's end is the boundary's: nothing runs between them.
        started, ctx = quick
        end = time.perf_counter()
        result = _new_result(CompactionResult, (acc, _SKIP))
        logged = log.isEnabledFor(logging.DEBUG)
        observers = _observers()
        if not (logged or observers):
            return result  # the hot path: a skip nobody watches costs no more than this
        probe = _Probe()
        probe.comp = acc.prepared.compactor
        probe.ctx = ctx
        probe.started = started - t0
        probe.took = end - started
        _report(acc, result, probe, "skipped", start_ns, end - t0, timeout, logged, observers)
        return result
    probe = _Probe()
    result = _resolve(
        acc,
        probe,
        timeout if timeout is not None else acc.compaction_timeout,
        mid_round,
        turn_id,
        calibration,
        t0,
    )
    duration = time.perf_counter() - t0
    meta = result.meta
    outcome: Outcome = (
        "skipped"
        if meta is _SKIP
        else "compacted"
        if meta.compacted
        else "failed"
        if "error" in meta
        else "skipped"
    )
    logged = log.isEnabledFor(_LEVELS[outcome])
    observers = _observers()
    if logged or observers:
        _report(acc, result, probe, outcome, start_ns, duration, timeout, logged, observers)
    return result


def _context(
    acc: AgentConfig,
    prepared: Any,
    mid_round: bool,
    turn_id: str | None,
    calibration: Calibration | None,
) -> CompactionContext:
    """The boundary's ``ctx`` (:func:`build_context` for ``acc`` prepared as ``prepared``)."""
    return build_context(
        prepared,
        model=acc.model,
        prompt_tokens=acc.prompt_tokens,
        mid_round=mid_round,
        turn_id=turn_id,
        calibration=calibration,
    )


def _below_threshold(
    acc: AgentConfig, mid_round: bool, turn_id: str | None, calibration: Calibration | None
) -> tuple[float, CompactionContext] | None:
    """The threshold shortcut of :func:`_resolve`, for a boundary with an exact counter:
    the clock at the comparison's start and the ``ctx``, when the memory is at or below
    the compactor's declared level; ``None`` otherwise (and for anything unusual), leaving
    the boundary to :func:`_resolve`.

    Written out (build_context's reuse test first, ``memory_tokens`` inline): it is most of
    what a turn-start boundary costs beyond counting the new message. The ``ctx`` is built
    when the last one of its kind cannot be reused (a new turn's first boundaries of
    each kind), as :func:`_resolve` would build it. A property test compares its ``ctx``
    and count with :func:`build_context` and ``memory_tokens``.
    """
    try:
        prepared = acc._prepared[0]  # acc.prepared, without the property's call
        level = prepared.thresholds[mid_round]
        if level is None:
            return None
        known = acc._prompt_tokens
        ctx = _reused_context(
            prepared,
            1 if mid_round else 0,
            acc.model,
            known[0] if known else acc.prompt_tokens,
            turn_id,
            calibration,
            None,
        )
        if ctx is None:
            ctx = _context(acc, prepared, mid_round, turn_id, calibration)
        counter: Any = ctx.counter
        base = counter._base
        if not counter._exact or base is None or isinstance(base, str):
            return None  # the bound first, or the base counter not resolved yet
        started = time.perf_counter()
        # counter.memory_tokens(memory), written out
        n = acc.memory.tokens(base)
        model, cal = counter.model, counter.calibration
        if model is not None and model in cal._models:
            f = cal.factor(model, base.name)
            if f != 1.0:
                n = math.ceil(n * f)
    except Exception:
        return None  # _resolve meets it again, and handles it
    return (started, ctx) if n + ctx.prompt_tokens <= level else None


def _report(
    acc: AgentConfig,
    result: CompactionResult,
    probe: _Probe,
    outcome: Outcome,
    start_ns: int,
    duration: float,
    timeout: float | None,
    logged: bool,
    observers: list[tuple[Any, Any]],
) -> None:
    """The finished boundary's log line and ``on_boundary`` reports."""
    info = _info(acc, outcome, probe, start_ns, duration)
    if logged:
        _log(result, probe, info)
    if observers:
        limit = timeout if timeout is not None else acc.compaction_timeout
        deadline = None if limit is None else time.monotonic() + limit
        _run_hooks(
            "on_boundary",
            result.acc,
            probe.ctx,
            result.meta,
            deadline,
            stop_at_first=False,
            extra={"info": info},
            pairs=observers,
        )


#: The level of each outcome's log line.
_LEVELS = {"skipped": logging.DEBUG, "compacted": logging.INFO, "failed": logging.WARNING}


def _info(
    acc: AgentConfig, outcome: Outcome, probe: _Probe, start_ns: int, duration: float
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
    extra = {
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
        extra.update(normandy_error=meta.error, normandy_error_type=info.error_type)
        error = meta.error or ""
        # The boundary's own reasons name the compactor; what a compactor reports is its own.
        text = error if probe.error_type is not None else f"{info.plugin} failed: {error}"
        log.warning(
            "%s (%s; %s)",
            text,
            where,
            took,
            exc_info=probe.exc,
            extra=extra,
        )


def _n(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _resolve(
    acc: AgentConfig,
    probe: _Probe,
    limit: float | None,
    mid_round: bool,
    turn_id: str | None,
    calibration: Calibration | None,
    t0: float,
) -> CompactionResult:
    """The boundary itself (see :func:`run_compaction`), noting what it learns in ``probe``."""
    deadline = None if limit is None else time.monotonic() + limit
    try:
        prepared = acc.prepared
        probe.comp = prepared.compactor
        ctx = _context(acc, prepared, mid_round, turn_id, calibration)
    except Exception as exc:
        return _error(
            acc, f"compactor {acc.compactor!r} could not be prepared: {exc}", probe, "context", exc
        )
    probe.ctx = ctx
    comp = prepared.compactor
    started = time.perf_counter()
    probe.started = started - t0
    level = prepared.thresholds[mid_round]
    if level is not None:
        # The compactor declared (compaction_threshold) that it skips at or below this
        # level: its call would give exactly this result (a property test compares them).
        # Counted as it counts, an upper bound first while the tokenizer is not loaded;
        # a count that fails falls through to the call, which meets the failure itself.
        counter = ctx.counter
        prompt = ctx.prompt_tokens
        memory = acc.memory
        try:
            # (memory_bound answers None at once after the tokenizer loaded: not asked)
            bound = None if counter._exact else counter.memory_bound(memory)
            below = (bound is not None and bound + prompt <= level) or (
                counter.memory_tokens(memory) + prompt <= level
            )
        except Exception:
            below = False
        if below:
            probe.took = time.perf_counter() - started
            return _new_result(CompactionResult, (acc, _SKIP))
    try:
        if limit is None:
            result = call_plugin(call_compactor, comp, acc, ctx, prepared.options)
        else:
            result = _call_bounded(acc, ctx, prepared, limit)
    except PluginTimeoutError:
        return _error(
            acc,
            f"{comp.describe()} did not return within {limit:g} s (compaction_timeout); its "
            f"result will be ignored ({abandoned_threads()} abandoned thread(s) running)",
            probe,
            "timeout",
        )
    except AbandonedLimitError as exc:
        return _error(acc, f"{comp.describe()} was not called: {exc}", probe, "abandoned_limit")
    except ContractViolation as exc:
        return _error(acc, str(exc), probe, "contract")
    except Exception as exc:
        return _error(
            acc, f"{comp.describe()} raised {_fault_text(exc)}", probe, _type_name(exc), exc
        )
    finally:
        probe.took = time.perf_counter() - t0 - probe.started
    if not result.meta.compacted:
        return result
    result = account(result, acc.memory, ctx)
    if result.meta.dropped:
        notes: list[dict[str, Any]] = []
        refused = run_before_commit(result.acc, ctx, result.meta, deadline=deadline, notes=notes)
        if refused is not None:
            return _error(
                acc,
                f"{comp.describe()} compacted, but the compaction was refused: "
                f"{refused['plugin']} could not record the {len(result.meta.dropped)} dropped "
                f"entries ({refused['error']}); the conversation is kept as it was",
                probe,
                "refused",
            )
        hook_errors = run_after_compact(
            result.acc, ctx, result.meta, deadline=deadline, notes=notes
        )
        if hook_errors or notes:
            result = CompactionResult(
                result.acc,
                result.meta.replace(hook_errors=hook_errors or None, hook_notes=notes or None),
            )
    return result


def _call_bounded(
    acc: AgentConfig, ctx: CompactionContext, prepared: Any, limit: float
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
