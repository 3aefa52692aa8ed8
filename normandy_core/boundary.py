"""The one boundary function: build ``ctx``, call the selected compactor, check, run hooks."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from normandy_core.config import AgentConfig
from normandy_core.contract import (
    CompactionContext,
    CompactionMeta,
    CompactionResult,
    ContractViolation,
    account,
    build_context,
    call_compactor,
)
from normandy_core.faults import (
    AbandonedLimitError,
    PluginFault,
    abandoned_threads,
    call_plugin,
    run_bounded,
)
from normandy_core.plugins import describe_hook, hook_manager

if TYPE_CHECKING:
    from normandy_core.calibration import Calibration

__all__ = [
    "CompactionContext",
    "CompactionTimeoutError",
    "build_context",
    "run_after_compact",
    "run_before_commit",
    "run_compaction",
]

log = logging.getLogger("normandy_core.boundary")


class CompactionTimeoutError(Exception):
    """A compactor did not return within the configured ``compaction_timeout``."""


def _error(acc: AgentConfig, reason: str, exc: BaseException | None = None) -> CompactionResult:
    if exc is not None:
        log.error("%s", reason, exc_info=exc)
    else:
        log.error("%s", reason)
    return CompactionResult(acc, CompactionMeta({"compacted": False, "error": reason}))


def _fault_text(exc: BaseException) -> str:
    cause = exc.__cause__ if isinstance(exc, PluginFault) and exc.__cause__ else exc
    return f"{type(cause).__name__}: {cause}"


def _run_hooks(
    hook: str,
    acc: AgentConfig,
    ctx: CompactionContext,
    meta: Mapping[str, Any],
    deadline: float | None,
    *,
    stop_at_first: bool,
    notes: list[dict[str, Any]] | None = None,
) -> list[dict[str, str]]:
    """Call ``hook`` on every hook plugin implementing it, each isolated from the others,
    through pluggy's call path; one ``{"hook", "plugin", "error"}`` per failure. The notes
    the hooks return (mappings) are appended to ``notes`` as ``{"hook", "plugin", "note"}``.
    """
    pm = hook_manager()
    view = meta if isinstance(meta, CompactionMeta) else CompactionMeta(meta)
    errors: list[dict[str, str]] = []
    impls = list(reversed(getattr(pm.hook, hook).get_hookimpls()))
    plugins = [impl.plugin for impl in impls]
    for n, impl in enumerate(impls):
        others = [p for p in plugins if p is not impl.plugin]
        caller = pm.subset_hook_caller(hook, remove_plugins=others)

        def call(caller: Any = caller) -> Any:
            return caller(acc=acc, ctx=ctx, meta=view)

        what = describe_hook(impl.plugin_name)
        try:
            if deadline is None:
                returned = call_plugin(call)
            else:
                share = max(deadline - time.monotonic(), 0.0) / (len(impls) - n)
                returned = run_bounded(call, share, f"normandy-hook-{impl.plugin_name}")
            if notes is not None:
                for note in returned or ():
                    if isinstance(note, Mapping):
                        notes.append({"hook": impl.plugin_name, "plugin": what, "note": dict(note)})
        except TimeoutError:
            text = "abandoned: it did not return within its share of compaction_timeout"
            log.error("%s of %s %s", hook, what, text)
            errors.append({"hook": impl.plugin_name, "plugin": what, "error": text})
        except Exception as exc:
            text = _fault_text(exc)
            log.error("%s of %s raised %s", hook, what, text, exc_info=exc)
            errors.append({"hook": impl.plugin_name, "plugin": what, "error": text})
        if errors and stop_at_first:
            break
    return errors


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

    ``timeout`` (default: ``acc.compaction_timeout``; ``None``: unbounded) bounds the
    whole boundary, hooks included. Under it the compactor works on a private copy of the
    memory in a worker thread, so a compactor abandoned past the limit can never reach
    the live memory or its token totals; at most
    :data:`~normandy_core.faults.MAX_ABANDONED` abandoned threads may be alive, past which
    the boundary is skipped with an error. This function does not raise for a faulty
    compactor or hook; only a genuine Ctrl-C of the user's process propagates (with the
    memory restored).
    """
    limit = timeout if timeout is not None else acc.compaction_timeout
    deadline = None if limit is None else time.monotonic() + limit
    try:
        prepared = acc.prepared
        ctx = build_context(
            prepared,
            model=acc.model,
            prompt_tokens=acc.prompt_tokens,
            mid_round=mid_round,
            turn_id=turn_id,
            calibration=calibration,
        )
    except Exception as exc:
        return _error(acc, f"compactor {acc.compactor!r} could not be prepared: {exc}", exc)
    comp = prepared.compactor
    try:
        if limit is None:
            result = call_plugin(call_compactor, comp, acc, ctx, prepared.options)
        else:
            result = _call_bounded(acc, ctx, prepared, limit)
    except TimeoutError:
        return _error(
            acc,
            f"{comp.describe()} did not return within {limit:g} s (compaction_timeout); its "
            f"result will be ignored ({abandoned_threads()} abandoned thread(s) running)",
        )
    except AbandonedLimitError as exc:
        return _error(acc, f"{comp.describe()} was not called: {exc}")
    except ContractViolation as exc:
        return _error(acc, str(exc))
    except Exception as exc:
        return _error(acc, f"{comp.describe()} raised {_fault_text(exc)}", exc)
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
