"""The ``pipeline`` compactor: hookimpls running the configured steps in order.

Semantics (see ``docs/plugins/pipeline.md``):

* Each step is the compactor registered under its name, called through its own
  ``maybe_compact`` with its own options. A step that needs a window gets its pinned
  ``context_window``, else the pipeline's ``ctx.window``.
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
    Entry,
    OptionsError,
    default_counter_for,
    get_counter,
    hookimpl,
    parse_options,
    resolve_compactor,
)
from normandy_pipeline import NAME
from normandy_pipeline.options import PipelineOptions, Step

if TYPE_CHECKING:
    from normandy_core import Compactor, TokenCounter

__all__ = ["maybe_compact", "needs_window", "validate_opts"]

log = logging.getLogger("normandy_pipeline")


def _options(opts: dict[str, Any], entry: str | None = None) -> PipelineOptions:
    return parse_options(PipelineOptions, opts, compactor=NAME, entry=entry)


def _label(index: int, step: Step) -> str:
    return f"pipeline steps[{index}] ({step.compactor!r})"


def _step_window(comp: Compactor, step: Step, window: int | None) -> tuple[bool, int | None]:
    """Whether the step needs a window, and the one it gets (its pinned one first)."""
    if not comp.needs_window(dict(step.opts)):
        return False, None
    pinned = step.opts.get("context_window")
    return True, int(pinned) if pinned is not None else window


@hookimpl
def needs_window(opts: dict[str, Any]) -> bool:
    """True when some step needs a window and pins no ``context_window`` of its own."""
    try:
        o = _options(opts)
        for step in o.steps:
            comp = resolve_compactor(step.compactor)
            if comp.needs_window(dict(step.opts)) and step.opts.get("context_window") is None:
                return True
        return False
    except Exception:  # must not raise; validate_opts reports the fault
        return True


@hookimpl
def validate_opts(opts: dict[str, Any], entry: str) -> None:
    """Check the pipeline's options, then each step's through the step's own ``validate_opts``.

    A refusal names ``entry``, the step's index and its compactor.
    """
    o = _options(opts, entry)
    for i, step in enumerate(o.steps):
        where = f"{entry} {_label(i, step)}"
        try:
            comp = resolve_compactor(step.compactor)
        except Exception as exc:
            raise OptionsError(f"{where}: cannot use this compactor: {exc}") from exc
        try:
            comp.validate_opts(dict(step.opts), where)
        except OptionsError:
            raise
        except Exception as exc:
            raise OptionsError(
                f"{where}: compactor {step.compactor!r} refused its options: "
                f"{type(exc).__name__}: {exc}"
            ) from exc


def _error(acc: AgentConfig, index: int, step: Step, reason: str) -> tuple[AgentConfig, Any]:
    text = f"{_label(index, step)} {reason}"
    log.error("%s", text)
    return acc, {"compacted": False, "error": text, "failed_step": index}


@hookimpl
def maybe_compact(
    acc: AgentConfig, ctx: CompactionContext, opts: dict[str, Any]
) -> tuple[AgentConfig, dict[str, Any]]:
    """Run the steps in order until one meets its target; see the module docs."""
    o = _options(opts)
    counter = get_counter(o.counter or default_counter_for(ctx.model))
    memory = acc.memory
    before = memory.tokens(counter)
    comps = [resolve_compactor(s.compactor) for s in o.steps]
    windows = [_step_window(c, s, ctx.window) for c, s in zip(comps, o.steps, strict=True)]
    sized = [w for needs, w in windows if needs and w is not None]
    judged: tuple[int, Any] | None = None
    if ctx.mid_round and sized and before + acc.prompt_tokens <= min(sized):
        # Under every window, the conversation may still be over a step's usable window.
        # The window-sized steps judge it; while they all leave it alone, nothing runs (a
        # step without a window would act at its own trigger while the conversation fits).
        judged = _judge(acc, ctx, o.steps, comps, windows)
        if judged is None:
            return acc, {"compacted": False}
        if isinstance(judged[1], str):
            return _error(acc, judged[0], o.steps[judged[0]], judged[1])
        if judged[1] is None or not all(needs for needs, _ in windows[: judged[0]]):
            judged = None  # a step without a window runs first: the judge's step runs again

    current = acc
    reports: list[dict[str, Any]] = []
    dropped_ids: dict[str, None] = {}
    compacted = False
    target_met: bool | None = None
    for i, (step, comp, (needs, window)) in enumerate(zip(o.steps, comps, windows, strict=True)):
        if needs and window is None:
            return _error(acc, i, step, "needs a context window and the pipeline got none")
        sctx = _step_ctx(acc, ctx, window)
        step_memory = current.memory
        version = step_memory.version
        try:
            if judged is not None and judged[0] == i:
                result = judged[1]  # its call on the input as the mid-round judge
            else:
                result = comp.maybe_compact(current, sctx, dict(step.opts))
        except Exception as exc:
            return _error(acc, i, step, f"raised {type(exc).__name__}: {exc}")
        if step_memory.version != version or current.memory is not step_memory:
            return _error(acc, i, step, "mutated the memory it was given")
        if not (isinstance(result, tuple) and len(result) == 2):
            return _error(acc, i, step, f"returned {type(result).__name__}, not (acc, meta)")
        new_acc, meta = result
        if not isinstance(new_acc, AgentConfig):
            return _error(acc, i, step, f"returned acc of type {type(new_acc).__name__}")
        if not isinstance(meta, dict) or not isinstance(meta.get("compacted"), bool):
            return _error(acc, i, step, "returned meta without a boolean 'compacted'")
        if "error" in meta:
            return _error(acc, i, step, f"failed: {meta['error']}")
        dropped = meta.get("dropped") or []
        if not isinstance(dropped, list):
            return _error(acc, i, step, "returned 'dropped' that is not a list")
        report = {k: v for k, v in meta.items() if k != "dropped"}
        report = {"index": i, "compactor": step.compactor, **report}
        if not meta["compacted"]:
            if dropped:
                return _error(acc, i, step, "reported dropped entries with compacted=False")
            reports.append(report)
            continue
        report["dropped_ids"] = [e.id for e in dropped if isinstance(e, Entry)]
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
    return acc.with_memory(current.memory), _meta(
        acc, current, ctx, counter, before, reports, dropped_ids, target_met
    )


def _step_ctx(acc: AgentConfig, ctx: CompactionContext, window: int | None) -> CompactionContext:
    return CompactionContext(
        model=ctx.model,
        window=window,
        prompt_tokens=acc.prompt_tokens if window is not None else 0,
        mid_round=ctx.mid_round,
        turn_id=ctx.turn_id,
    )


def _judge(
    acc: AgentConfig,
    ctx: CompactionContext,
    steps: tuple[Step, ...],
    comps: list[Compactor],
    windows: list[tuple[bool, int | None]],
) -> tuple[int, Any] | None:
    """Mid-round: ``None`` when every window-sized step leaves the input alone, else the
    first one that does not, with what its call returned (to reuse) or, when it mutated
    the memory, the error to report."""
    for i, (step, comp, (needs, window)) in enumerate(zip(steps, comps, windows, strict=True)):
        if not needs or window is None:
            continue
        version = acc.memory.version
        try:
            result = comp.maybe_compact(acc, _step_ctx(acc, ctx, window), dict(step.opts))
        except Exception:
            return i, None  # not reused: the step runs again in order and its error is named
        if acc.memory.version != version:
            return i, "mutated the memory it was given"
        meta = result[1] if isinstance(result, tuple) and len(result) == 2 else None
        if not (isinstance(meta, dict) and meta.get("compacted") is False and "error" not in meta):
            return i, result
    return None


def _meta(
    acc: AgentConfig,
    result: AgentConfig,
    ctx: CompactionContext,
    counter: TokenCounter,
    before: int,
    reports: list[dict[str, Any]],
    dropped_ids: dict[str, None],
    target_met: bool | None,
) -> dict[str, Any]:
    memory = acc.memory
    new_memory = result.memory
    entries = memory.entries()
    # The original entries, once each, oldest first: a version rewritten by an earlier step
    # and dropped by a later one is reported with the content it had in the input.
    dropped = [e for e in entries if e.id in dropped_ids]
    turn = ctx.turn_id if ctx.turn_id is not None else (entries[-1].turn_id if entries else None)
    new_by_id = {e.id: e for e in new_memory}
    removed = 0
    for e in entries:
        if e.turn_id == turn:
            kept = new_by_id.get(e.id)
            new_size = new_memory.entry_tokens(kept, counter) if kept is not None else 0
            removed += memory.entry_tokens(e, counter) - new_size
    meta: dict[str, Any] = {
        "compacted": True,
        "strategy": NAME,
        "tokens_before": before,
        "tokens_after": new_memory.tokens(counter),
        "tokens_removed": max(removed, 0),
        "counter": counter.name,
        "steps": reports,
        "dropped": dropped,
    }
    if target_met is not None:
        meta["target_met"] = target_met
    return meta
