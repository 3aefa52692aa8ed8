"""The ``pipeline`` compactor: hookimpls running the configured steps in order.

Semantics (see ``docs/plugins/pipeline.md``):

* Each step is the compactor registered under its name, called through its own
  ``maybe_compact`` with its own options. A step that needs a window gets its pinned
  ``context_window``, else the pipeline's ``ctx.window``.
* Every step gets the config's survival rules: its ``validate_opts`` sees them when the
  pipeline is prepared, and its ``ctx.rules`` at every boundary; each step's result is
  checked against them (:func:`normandy_core.check_compaction`).
* A step that skips (``compacted`` false, no error) hands on to the next step. A step
  that compacts hands its result to the next step, unless its meta says
  ``target_met: True``: the conversation fits, and the pipeline stops there. Every later
  step decides for itself whether the conversation is over its own trigger.
* At a mid-round boundary the pipeline returns the memory unchanged, running no step
  without a window, while the conversation fits: it is under the smallest window of its
  window-sized steps and each of them, asked first on the input, leaves it alone (it is
  under their usable windows: window minus reserve, which only the step knows).
  Otherwise the steps run in order; the judging step's call is reused when only
  window-sized steps come before it.
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
    from normandy_core import CompactionResult, Prepared, SurvivalRules

__all__ = ["maybe_compact", "needs_window", "options_model", "requires_client", "validate_opts"]

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
def validate_opts(
    opts: PipelineOptions, entry: str, window: int | None, rules: SurvivalRules
) -> None:
    """Prepare every step through the core's prepare step, with the pipeline's window and
    the config's survival rules.

    A refusal names ``entry``, the step's index and its compactor. The prepared steps are
    kept on the options, so no step is validated again at a boundary.
    """
    prepared: list[Prepared] = []
    for i, step in enumerate(opts.steps):
        where = f"{entry} {_label(i, step)}"
        try:
            step_opts = _scheduled(step, opts.schedule)
            prepared.append(
                prepare(step.compactor, step_opts, entry=where, window=window, rules=rules)
            )
        except OptionsError:
            raise
        except Exception as exc:
            raise OptionsError(f"{where}: cannot use this compactor: {exc}") from exc
    opts.keep_prepared_steps(prepared)


@hookimpl
def requires_client(opts: PipelineOptions) -> str | None:
    """The first step whose options need the config's model client, and why."""
    for i, prepared in enumerate(opts.prepared_steps):
        reason = prepared.compactor.requires_client(prepared.options)
        if reason is not None:
            return f"{_label(i, opts.steps[i])}: {reason}"
    return None


def _scheduled(step: Step, schedule: str | None) -> dict[str, Any]:
    """The step's options, with ``schedule`` added when the pipeline's is ``cost``, the
    step sets none and its compactor has that option."""
    from normandy_core import resolve_compactor

    if schedule != "cost" or "schedule" in step.opts:
        return dict(step.opts)
    model = resolve_compactor(step.compactor).options_model
    fields = getattr(model, "model_fields", {})
    return {**step.opts, "schedule": "cost"} if "schedule" in fields else dict(step.opts)


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


def _step_ctx(acc: AgentConfig, ctx: CompactionContext, prepared: Prepared) -> CompactionContext:
    return build_context(
        prepared,
        model=ctx.model,
        prompt_tokens=acc.prompt_tokens,
        mid_round=ctx.mid_round,
        turn_id=ctx.turn_id,
        calibration=ctx.counter.calibration,
        rules=ctx.rules,
        force=ctx.force,
        focus=ctx.focus,
    )


#: The mid-round judge's verdict: the index of the first window-sized step that does not
#: leave the input alone, with its checked result (to reuse), the contract violation to
#: report, or ``None`` when it raised (it then runs again in order, and is named).
_Judged = tuple[int, "CompactionResult | str | None"]


def _judge(acc: AgentConfig, ctx: CompactionContext, steps: tuple[Prepared, ...]) -> _Judged | None:
    """Mid-round: ``None`` when every window-sized step leaves the input alone, else the
    verdict on the first one that does not."""
    for i, prepared in enumerate(steps):
        if prepared.window is None:
            continue
        try:
            result = call_compactor(
                prepared.compactor, acc, _step_ctx(acc, ctx, prepared), prepared.options
            )
        except ContractViolation as exc:
            return i, f"broke the contract: {exc}"
        except Exception:
            return i, None
        if result.meta.compacted or result.meta.error is not None:
            return i, result
    return None


class _Progress:
    """What the steps have done so far: the config the next step is given, each step's
    report, the ids dropped (once each, in order) and the last ``target_met`` said, with
    its ``target_missed`` (why the result is still over the window)."""

    def __init__(self, acc: AgentConfig) -> None:
        self.current = acc
        self.reports: list[dict[str, Any]] = []
        self.dropped_ids: dict[str, None] = {}
        self.compacted = False
        self.target_met: bool | None = None
        self.target_missed: str | None = None

    def record(self, index: int, step: Step, result: CompactionResult) -> bool:
        """Take step ``index``'s result; whether it met its target (the pipeline stops)."""
        new_acc, meta = result
        report: dict[str, Any] = {"index": index, "compactor": step.compactor}
        report.update((k, v) for k, v in meta.items() if k != "dropped")
        self.reports.append(report)
        if not meta.compacted:
            return False
        ids = [e.id for e in meta.dropped]
        report["dropped_ids"] = ids
        for entry_id in ids:
            self.dropped_ids.setdefault(entry_id)
        self.compacted = True
        self.current = new_acc
        if "target_met" in meta:
            self.target_met = bool(meta["target_met"])
            self.target_missed = meta.target_missed
        return meta.get("target_met") is True

    def outcome(self, acc: AgentConfig, ctx: CompactionContext) -> tuple[AgentConfig, Any]:
        """The pipeline's result for its input ``acc`` (on a forced boundary that nothing
        compacted, ``declined`` gives each step's reason)."""
        counter = ctx.counter
        if not self.compacted:
            meta: dict[str, Any] = {"compacted": False, "steps": self.reports}
            if ctx.force:
                meta["declined"] = "no step compacted: " + "; ".join(
                    f"step {r['index']} ({r['compactor']}) {r.get('declined') or 'gave no reason'}"
                    for r in self.reports
                )
            return acc, meta
        # The original entries, once each, oldest first: a version rewritten by an earlier
        # step and dropped by a later one is reported with the content it had in the input.
        dropped = [e for e in acc.memory.entries() if e.id in self.dropped_ids]
        meta = {
            "compacted": True,
            "strategy": NAME,
            "counter": counter.name,
            "steps": self.reports,
            "dropped": dropped,
        }
        if self.target_met is not None:
            meta["target_met"] = self.target_met
        if self.target_missed is not None:
            meta["target_missed"] = self.target_missed
        return acc.with_memory(self.current.memory), meta


@hookimpl
def maybe_compact(
    acc: AgentConfig, ctx: CompactionContext, opts: PipelineOptions
) -> tuple[AgentConfig, dict[str, Any]]:
    """Run the steps in order until one meets its target (each forced on a forced
    boundary, ``ctx.force``); see the module docs."""
    steps = opts.prepared_steps
    reused: tuple[int, CompactionResult] | None = None
    # a forced boundary (ctx.force) runs every step, each forced, until one meets its target
    if ctx.mid_round and not ctx.force and _fits_every_step(acc, ctx, steps):
        # Under every window, the conversation may still be over a step's usable window.
        # The window-sized steps judge it; while they all leave it alone, nothing runs (a
        # step without a window would act at its own trigger while the conversation fits).
        judged = _judge(acc, ctx, steps)
        if judged is None:
            return acc, {"compacted": False}
        index, verdict = judged
        if isinstance(verdict, str):
            return _error(acc, index, opts.steps[index], verdict)
        # its call on the input is reused, unless a step without a window runs first
        if verdict is not None and all(p.window is not None for p in steps[:index]):
            reused = index, verdict

    progress = _Progress(acc)
    for i, (step, prepared) in enumerate(zip(opts.steps, steps, strict=True)):
        try:
            if reused is not None and reused[0] == i:
                result = reused[1]
            else:
                step_ctx = _step_ctx(acc, ctx, prepared)
                result = call_compactor(
                    prepared.compactor, progress.current, step_ctx, prepared.options
                )
        except ContractViolation as exc:
            return _error(acc, i, step, f"broke the contract: {exc}")
        except Exception as exc:
            return _error(acc, i, step, f"raised {type(exc).__name__}: {exc}")
        if result.meta.error is not None:
            return _error(acc, i, step, f"failed: {result.meta.error}")
        if progress.record(i, step, result):
            break
    return progress.outcome(acc, ctx)
