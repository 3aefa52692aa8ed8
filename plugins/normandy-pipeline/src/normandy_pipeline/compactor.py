"""The ``pipeline`` compactor: hookimpls running the configured steps in order.

Semantics (see ``docs/plugins/pipeline.md``):

* Each step is the compactor registered under its name, called through its own
  ``maybe_compact`` with its own options. A step that needs a window gets its pinned
  ``context_window``, else the pipeline's ``ctx.window``.
* A step that skips (``compacted`` false, no error) hands on to the next step. A step
  that compacts hands its result to the next step, unless its meta says
  ``target_met: True``: the conversation fits, and the pipeline stops there. Every later
  step decides for itself whether the conversation is over its own trigger.
* At a mid-round boundary the pipeline returns the memory unchanged, running no step,
  while the conversation plus the prompt fits the smallest window of its steps.
* A step that raises, returns something malformed, mutates its input or reports an
  error makes the pipeline return its input ``acc`` untouched with an error naming the
  step (index and compactor).
* ``dropped`` merges the steps' reports: every entry of the input's active branch that
  some step removed or rewrote, once, with the content it had in the input (the oldest
  version, even when a later step dropped a version an earlier step had rewritten),
  oldest first.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from normandy_core import (
    AgentConfig,
    CompactionContext,
    ContractViolation,
    OptionsError,
    build_context,
    call_compactor,
    hookimpl,
    prepare,
)
from normandy_pipeline import NAME
from normandy_pipeline.options import PipelineOptions, Step

if TYPE_CHECKING:
    from normandy_core import CalibratedCounter, Prepared

__all__ = ["maybe_compact", "needs_window", "options_model", "validate_opts"]

log = logging.getLogger("normandy_pipeline")


def _label(index: int, step: Step) -> str:
    return f"pipeline steps[{index}] ({step.compactor!r})"


@hookimpl
def options_model() -> type[PipelineOptions]:
    """The options are :class:`~normandy_pipeline.options.PipelineOptions`."""
    return PipelineOptions


@hookimpl
def needs_window(opts: PipelineOptions) -> bool:
    """True when some step needs a window and pins no ``context_window`` of its own."""
    from normandy_core import resolve_compactor

    try:
        for step in opts.steps:
            comp = resolve_compactor(step.compactor)
            if step.opts.get("context_window") is None and comp.needs_window(
                comp.parse_options(step.opts, "pipeline")
            ):
                return True
        return False
    except Exception:  # must not raise; validate_opts reports the fault
        return True


@hookimpl
def validate_opts(opts: PipelineOptions, entry: str, window: int | None) -> None:
    """Prepare every step through the core's prepare step, with the pipeline's window.

    A refusal names ``entry``, the step's index and its compactor. The prepared steps are
    kept on the options, so no step is validated again at a boundary.
    """
    prepared: list[Prepared] = []
    for i, step in enumerate(opts.steps):
        where = f"{entry} {_label(i, step)}"
        try:
            prepared.append(prepare(step.compactor, step.opts, entry=where, window=window))
        except OptionsError:
            raise
        except Exception as exc:
            raise OptionsError(f"{where}: cannot use this compactor: {exc}") from exc
    opts._prepared = tuple(prepared)


def _error(acc: AgentConfig, index: int, step: Step, reason: str) -> tuple[AgentConfig, Any]:
    text = f"{_label(index, step)} {reason}"
    log.error("%s", text)
    return acc, {"compacted": False, "error": text, "failed_step": index}


def _fits_every_step(acc: AgentConfig, ctx: CompactionContext, steps: tuple[Prepared, ...]) -> bool:
    """Mid-round: whether the conversation plus the prompt fits the smallest step window."""
    sized = [p.window for p in steps if p.window is not None]
    if not sized:
        return False
    return ctx.counter.memory_tokens(acc.memory) + ctx.prompt_tokens <= min(sized)


@hookimpl
def maybe_compact(
    acc: AgentConfig, ctx: CompactionContext, opts: PipelineOptions
) -> tuple[AgentConfig, dict[str, Any]]:
    """Run the steps in order until one meets its target; see the module docs."""
    steps: tuple[Prepared, ...] = opts._prepared
    if ctx.mid_round and _fits_every_step(acc, ctx, steps):
        return acc, {"compacted": False}

    current = acc
    reports: list[dict[str, Any]] = []
    dropped_ids: dict[str, None] = {}
    compacted = False
    target_met: bool | None = None
    for i, (step, prepared) in enumerate(zip(opts.steps, steps, strict=True)):
        sctx = build_context(
            prepared,
            model=ctx.model,
            prompt_tokens=acc.prompt_tokens,
            mid_round=ctx.mid_round,
            turn_id=ctx.turn_id,
            calibration=ctx.counter.calibration,
        )
        try:
            new_acc, meta = call_compactor(prepared.compactor, current, sctx, prepared.options)
        except ContractViolation as exc:
            return _error(acc, i, step, f"broke the contract: {exc}")
        except Exception as exc:
            return _error(acc, i, step, f"raised {type(exc).__name__}: {exc}")
        if meta.error is not None:
            return _error(acc, i, step, f"failed: {meta.error}")
        report = {k: v for k, v in meta.items() if k != "dropped"}
        report = {"index": i, "compactor": step.compactor, **report}
        if not meta.compacted:
            reports.append(report)
            continue
        report["dropped_ids"] = [e.id for e in meta.dropped]
        reports.append(report)
        for eid in report["dropped_ids"]:
            dropped_ids.setdefault(eid)
        compacted = True
        current = new_acc
        if "target_met" in meta:
            target_met = bool(meta["target_met"])
        if meta.get("target_met") is True:
            break

    if not compacted:
        return acc, {"compacted": False, "steps": reports}
    # The original entries, once each, oldest first: a version rewritten by an earlier step
    # and dropped by a later one is reported with the content it had in the input.
    dropped = [e for e in acc.memory.entries() if e.id in dropped_ids]
    counter: CalibratedCounter = ctx.counter
    meta_out: dict[str, Any] = {
        "compacted": True,
        "strategy": NAME,
        "counter": counter.name,
        "steps": reports,
        "dropped": dropped,
    }
    if target_met is not None:
        meta_out["target_met"] = target_met
    return acc.with_memory(current.memory), meta_out
