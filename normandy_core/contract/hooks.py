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
    PluginTimeoutError,
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

# Hook faults are reported where the boundary's own lines are: the logger users watch.
log = logging.getLogger("normandy_core.boundary")


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
        log.error("the %s gate of %s raised %s", hook, what, fault_text(exc), exc_info=exc)
        return True


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
) -> list[dict[str, str]]:
    """Call ``hook`` on every hook plugin implementing it (or on ``callers``), each
    isolated; one ``{"hook", "plugin", "error"}`` per failure. The notes the hooks return
    (mappings) are appended to ``notes`` as ``{"hook", "plugin", "note"}``; with
    ``stop_at_first`` the first failure stops the others."""
    if callers is None:
        callers = selected(hook)
    if not callers:
        return []
    view = meta if isinstance(meta, CompactionMeta) else CompactionMeta(meta)
    kwargs = {"acc": acc, "ctx": ctx, "meta": view, **(extra or {})}
    errors: list[dict[str, str]] = []
    for n, caller in enumerate(callers):
        name = caller.impl.plugin_name
        try:
            if deadline is None:
                returned = call_plugin(caller.call, **kwargs)
            else:
                share = max(deadline - time.monotonic(), 0.0) / (len(callers) - n)
                call = functools.partial(caller.call, **kwargs)
                returned = run_bounded(call, share, f"normandy-hook-{name}")
            if notes is not None and returned:
                _keep_notes(notes, name, returned)
        except PluginTimeoutError as exc:
            text = (
                "abandoned: it did not return within its share of compaction_timeout"
                if exc.took is None
                else f"returned after {exc.took:.2f} s, past its share of compaction_timeout: "
                "what it returned is refused"
            )
            log.error("%s of %s %s", hook, describe_hook(name), text)
            errors.append({"hook": name, "plugin": describe_hook(name), "error": text})
        except Exception as exc:
            text = fault_text(exc)
            log.error("%s of %s raised %s", hook, describe_hook(name), text, exc_info=exc)
            errors.append({"hook": name, "plugin": describe_hook(name), "error": text})
        if errors and stop_at_first:
            break
    return errors


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
) -> dict[str, str] | None:
    """Ask every ``before_commit`` hook to record the compaction; the first refusal, or None.

    Every implementation is required: the first that raises or runs past its share of the
    ``deadline`` stops the others and is returned as ``{"hook", "plugin", "error"}``. The
    notes the hooks return are appended to ``notes`` (when given), as for
    :func:`run_after_compact`.
    """
    errors = run_hooks("before_commit", acc, ctx, meta, deadline, stop_at_first=True, notes=notes)
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
    ignored. Returns one ``{"hook", "plugin", "error"}`` per hook that raised or ran out
    of time, each also logged at ERROR.
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
    )
