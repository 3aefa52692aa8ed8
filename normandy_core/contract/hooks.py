"""Calling the hook plugins: each implementation isolated from the others, through pluggy.

Every hook plugin's ``before_commit``, ``after_compact`` and ``on_boundary`` (and the
``recall_entries`` sources) is called here, one implementation at a time through
pluggy's call path (so ``pm.add_hookcall_monitoring`` sees every call), with a
read-only ``meta`` and, under a deadline, an equal share of the time left each. A hook
that raises or runs out of time is logged naming it and reported; it never stops the
others, except where a refusal is the point (``before_commit``).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from normandy_core.contract.faults import (
    FAULT_FLOOD,
    AbandonedLimitError,
    PluginTimeoutError,
    StillRunningError,
    call_gate,
    call_plugin,
    fault_cause,
    run_bounded,
)
from normandy_core.contract.plugins import HookCaller, describe_hook, hook_callers
from normandy_core.contract.types import BoundaryInfo, CompactionContext, CompactionMeta

if TYPE_CHECKING:
    from normandy_core.contract.config import AgentConfig

__all__ = [
    "fault_text",
    "run_after_compact",
    "run_before_commit",
    "run_hooks",
    "run_on_boundary",
    "selected",
]

# Hook faults are reported where the boundary's own lines are: the logger users watch. A
# flood of identical faults is logged once per interval, with a count (FAULT_FLOOD).
log = logging.getLogger("normandy_core.boundary")
log.addFilter(FAULT_FLOOD)


def fault_text(exc: BaseException) -> str:
    """``Type: message`` of what a plugin raised (the cause a :class:`PluginFault` carries)."""
    cause = fault_cause(exc)
    return f"{type(cause).__name__}: {cause}"


def selected(hook: str, *, gated: bool = False) -> tuple[HookCaller, ...]:
    """``hook``'s implementations in pluggy's call order, each with its own caller; with
    ``gated``, only those whose :func:`~normandy_core.active_when` gate is open now (or
    that have none). A gate that raises counts as open, and is logged."""
    callers = hook_callers(hook)
    if not gated or not any(c.gate is not None for c in callers):
        return callers
    return tuple(c for c in callers if _gate_open(hook, c))


def _gate_open(hook: str, caller: HookCaller) -> bool:
    if caller.gate is None:
        return True
    try:
        return call_gate(caller.gate)
    except Exception as exc:
        what = describe_hook(caller.impl.plugin_name)
        text = fault_text(exc)
        fault = f"the {hook} gate of {what}: {type(fault_cause(exc)).__name__}"
        log.error(
            "the %s gate of %s raised %s", hook, what, text, exc_info=exc, extra=_fault(fault)
        )
        return True


def _fault(key: str) -> dict[str, str]:
    """The ``extra`` of a fault's log record: its key, by which
    :data:`~normandy_core.contract.faults.FAULT_FLOOD` tells identical faults apart."""
    return {"normandy_fault": key}


def run_hooks(
    hook: str,
    acc: AgentConfig,
    ctx: CompactionContext | None,
    meta: Mapping[str, Any],
    deadline: float | None,
    *,
    stop_at_first: bool,
    notes: list[dict[str, Any]] | None = None,
    extra: Mapping[str, Any] | None = None,
    callers: tuple[HookCaller, ...] | None = None,
    inline_at_cap: bool = False,
    raised: list[Exception] | None = None,
) -> list[dict[str, str]]:
    """Call ``hook`` on every hook plugin implementing it (or on ``callers``), each
    isolated; one ``{"hook", "plugin", "error"}`` per failure. The notes the hooks return
    (mappings) are appended to ``notes`` as ``{"hook", "plugin", "note"}``; with
    ``stop_at_first`` the first failure stops the others.

    With a ``deadline`` each implementation runs in a bounded thread with an equal share
    of the time left, one call at a time (one abandoned past its share and still running
    is not called again until it returns). ``inline_at_cap``: where the cap of abandoned
    threads leaves no thread, the implementation is called on this thread instead.
    ``raised``: the failures are the caller's to report, not logged here; it receives
    what each raised (but a lateness, which has no traceback of its own)."""
    if callers is None:
        callers = selected(hook)
    if not callers:
        return []
    view = meta if isinstance(meta, CompactionMeta) else CompactionMeta(meta)
    kwargs = {"acc": acc, "ctx": ctx, "meta": view, **(extra or {})}
    errors: list[dict[str, str]] = []
    for n, caller in enumerate(callers):
        name = caller.impl.plugin_name
        share = None
        if deadline is not None:
            share = max(deadline - time.monotonic(), 0.0) / (len(callers) - n)
        try:
            returned = _call_hook(hook, caller, kwargs, share, inline_at_cap)
            if notes is not None and returned:
                _keep_notes(notes, name, returned)
        except Exception as exc:
            errors.append(_hook_fault(hook, name, exc, logged=raised is None))
            if raised is not None and not isinstance(exc, _LATE):
                raised.append(exc)
        if errors and stop_at_first:
            break
    return errors


def _call_hook(
    hook: str,
    caller: HookCaller,
    kwargs: Mapping[str, Any],
    share: float | None,
    inline_at_cap: bool,
) -> Any:
    """One implementation's call: on this thread without a ``share`` of time, else in a
    bounded thread (:func:`run_bounded`, one at a time per implementation); with
    ``inline_at_cap``, on this thread when the cap leaves no thread."""
    if share is None:
        return call_plugin(caller.call, **kwargs)
    call = functools.partial(caller.call, **kwargs)
    thread = f"normandy-{hook}-{caller.impl.plugin_name}"
    try:
        return run_bounded(call, share, thread, exclusive=True)
    except AbandonedLimitError:
        if not inline_at_cap:
            raise
    # No thread to be had: the report is made on the boundary's own thread, so observers
    # see every boundary whatever the cap does (a hung one is not called: still running).
    return call_plugin(caller.call, **kwargs)


#: What a hook did not do in time (or was not called for): no traceback of its own.
_LATE = (PluginTimeoutError, StillRunningError, AbandonedLimitError)


def _hook_fault(hook: str, name: str, exc: Exception, *, logged: bool = True) -> dict[str, str]:
    """What hook plugin ``name``'s ``hook`` did wrong (``exc``), as reported (and logged
    unless ``logged`` is false). Only what the hook raised is logged with its traceback:
    the rest is the boundary's."""
    what = describe_hook(name)
    if isinstance(exc, _LATE):
        kind = "timeout" if isinstance(exc, PluginTimeoutError) else type(exc).__name__
        text = said = _not_in_time(exc)
        trace: Exception | None = None
    else:
        kind = type(fault_cause(exc)).__name__
        text = fault_text(exc)
        said = f"raised {text}"
        trace = exc
    if logged:
        log.error(
            "%s of %s %s",
            hook,
            what,
            said,
            exc_info=trace,
            extra=_fault(f"{hook} of {what}: {kind}"),
        )
    return {"hook": name, "plugin": what, "error": text}


def _not_in_time(exc: Exception) -> str:
    """Why a hook's call did not count: abandoned or late at its share of the time, not
    started for want of time or of a thread, or still running from an earlier boundary."""
    if not isinstance(exc, PluginTimeoutError):
        return f"not called: {exc}"
    if exc.took is not None:
        return (
            f"returned after {exc.took:.2f} s, past its share of compaction_timeout: what "
            "it returned is refused"
        )
    if exc.limit <= 0:
        return "not called: nothing was left of compaction_timeout"
    return "abandoned: it did not return within its share of compaction_timeout"


def _keep_notes(notes: list[dict[str, Any]], name: str, returned: Any) -> None:
    """The mappings among what hook plugin ``name``'s implementation returned, as notes."""
    what = describe_hook(name)
    for note in returned:
        if isinstance(note, Mapping):
            notes.append({"hook": name, "plugin": what, "note": dict(note)})


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
    return run_hooks("after_compact", acc, ctx, meta, deadline, stop_at_first=False, notes=notes)


def run_before_commit(
    acc: AgentConfig,
    ctx: CompactionContext,
    meta: Mapping[str, Any],
    *,
    deadline: float | None = None,
    notes: list[dict[str, Any]] | None = None,
    raised: list[Exception] | None = None,
) -> dict[str, str] | None:
    """Ask every ``before_commit`` hook to record the compaction; the first refusal, or None.

    Every implementation is required: the first that raises or runs past its share of the
    ``deadline`` stops the others and is returned as ``{"hook", "plugin", "error"}``. The
    notes the hooks return are appended to ``notes`` (when given), as for
    :func:`run_after_compact`. A refusal is not logged here: it fails the boundary, whose
    one record reports it (``raised`` receives what the hook raised, for its traceback).
    """
    errors = run_hooks(
        "before_commit",
        acc,
        ctx,
        meta,
        deadline,
        stop_at_first=True,
        notes=notes,
        raised=[] if raised is None else raised,
    )
    return errors[0] if errors else None


def run_on_boundary(
    acc: AgentConfig,
    ctx: CompactionContext | None,
    meta: Mapping[str, Any],
    info: BoundaryInfo,
    *,
    deadline: float | None = None,
    callers: tuple[HookCaller, ...] | None = None,
) -> list[dict[str, str]]:
    """Report a finished boundary to every ``on_boundary`` hook whose gate is open, each
    isolated (or to ``callers``, a selection already made).

    Called like :func:`run_after_compact` (pluggy's call path, a read-only ``meta``, an
    equal share of the time left before ``deadline`` each); what the hooks return is
    ignored. When the cap of abandoned threads leaves no thread to bound a hook in, it is
    called on this (the boundary's) thread, unbounded: every observer gets every
    boundary's report, but one whose call at an earlier boundary was abandoned and is
    still running. Returns one ``{"hook", "plugin", "error"}`` per hook that raised, ran
    out of time or was not called, each also logged at ERROR (a flood of identical ones
    once per interval, :class:`~normandy_core.contract.faults.FaultFlood`).
    """
    if callers is None:
        callers = selected("on_boundary", gated=True)
    return run_hooks(
        "on_boundary",
        acc,
        ctx,
        meta,
        deadline,
        stop_at_first=False,
        extra={"info": info},
        callers=callers,
        inline_at_cap=True,
    )
