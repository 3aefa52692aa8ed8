"""The one boundary function: build ``ctx``, call the selected compactor, check, run hooks."""

from __future__ import annotations

import contextvars
import logging
import threading
from dataclasses import dataclass
from typing import Any

from normandy_core.config import AgentConfig
from normandy_core.memory import Entry
from normandy_core.plugins import Compactor, describe_hook, hook_manager, resolve_compactor

__all__ = [
    "CompactionContext",
    "CompactionTimeoutError",
    "build_context",
    "run_after_compact",
    "run_compaction",
]

log = logging.getLogger("normandy_core.boundary")


@dataclass(frozen=True, slots=True)
class CompactionContext:
    """The decision inputs of one boundary (the contract's ``ctx``), immutable.

    ``model``: the model id of the turn. ``window``: its context window, ``None`` only for
    a compactor that needs none. ``prompt_tokens``: estimated tokens of the system prompt
    and tool definitions the next call sends (about four characters per token), 0 when
    there is no window. ``mid_round``: false at the start of a turn, true after a tool
    batch, where the model's tool round is still open. ``turn_id``: the running turn, so a
    compactor can tell this turn's messages (``None`` outside a turn loop: the newest
    entry's turn is then taken as the running one).
    """

    model: str | None
    window: int | None
    prompt_tokens: int
    mid_round: bool
    turn_id: str | None = None


def build_context(
    acc: AgentConfig,
    compactor: Compactor | None = None,
    *,
    mid_round: bool,
    turn_id: str | None = None,
) -> CompactionContext:
    """The ``ctx`` for ``acc``'s compactor: window and prompt tokens only when it needs a window."""
    comp = compactor or resolve_compactor(acc.compactor)
    window = acc.resolve_window(comp)
    return CompactionContext(
        model=acc.model,
        window=window,
        prompt_tokens=acc.prompt_tokens if window is not None else 0,
        mid_round=mid_round,
        turn_id=turn_id,
    )


def _error(
    acc: AgentConfig, reason: str, exc: BaseException | None = None
) -> tuple[AgentConfig, dict[str, Any]]:
    if exc is not None:
        log.error("%s", reason, exc_info=exc)
    else:
        log.error("%s", reason)
    return acc, {"compacted": False, "error": reason}


_GONE = object()


def _dropped_problem(acc: AgentConfig, new_acc: AgentConfig, dropped: list[Any]) -> str | None:
    """What is wrong with a compactor's ``dropped``, or ``None``.

    The contract: the entries removed from ``acc``'s active branch, oldest first, each
    under the id it had and with its original content. An entry the compactor kept but
    rewrote (a cleared or shortened tool result) is reported too, with its original
    content, so hooks can keep what was cut; an entry kept unchanged is not. Hooks archive
    what it says, so a list of ids, an unchanged kept entry or a rewritten original would
    lose or invent messages silently. Linear in the branch; run only when something was
    dropped.
    """
    position = {e.id: i for i, e in enumerate(acc.memory)}
    kept = {e.id: e.content for e in new_acc.memory}
    last = -1
    for item in dropped:
        if not isinstance(item, Entry):
            return f"reported a 'dropped' item of type {type(item).__name__}, not an Entry"
        i = position.get(item.id)
        if i is None:
            return (
                f"reported dropped entry {item.id!r}, which is not on the active branch it "
                "was given"
            )
        if i <= last:
            return f"reported 'dropped' not oldest first without repeats (at entry {item.id!r})"
        had = acc.memory[item.id].content
        now = kept.get(item.id, _GONE)
        if now is had or now == had:
            return f"reported dropped entry {item.id!r}, which it kept unchanged"
        if item.content is not had and item.content != had:
            return f"reported dropped entry {item.id!r} with content other than it had"
        last = i
    return None


def run_after_compact(
    acc: AgentConfig, ctx: CompactionContext, meta: dict[str, Any]
) -> list[dict[str, str]]:
    """Broadcast ``after_compact`` to every hook plugin, each isolated from the others.

    Returns one ``{"hook": name, "plugin": description, "error": text}`` per hook that
    raised (each also logged); ``plugin`` names the entry point and its distribution.
    """
    pm = hook_manager()
    errors: list[dict[str, str]] = []
    args = {"acc": acc, "ctx": ctx, "meta": meta}
    for impl in reversed(pm.hook.after_compact.get_hookimpls()):
        try:
            impl.function(*[args[a] for a in impl.argnames])
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            what = describe_hook(impl.plugin_name)
            log.error("after_compact of %s raised %s", what, text, exc_info=exc)
            errors.append({"hook": impl.plugin_name, "plugin": what, "error": text})
    return errors


def _call_with_timeout(
    comp: Compactor,
    acc: AgentConfig,
    ctx: CompactionContext,
    opts: dict[str, Any],
    timeout: float | None,
) -> Any:
    """``comp.maybe_compact`` inline, or in a daemon thread abandoned after ``timeout`` s."""
    if timeout is None:
        return comp.maybe_compact(acc, ctx, opts)
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = comp.maybe_compact(acc, ctx, opts)
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(  # in this context: the compactor sees its turn_loop()
        target=contextvars.copy_context().run,
        args=(work,),
        name=f"normandy-compactor-{comp.name}",
        daemon=True,
    )
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise CompactionTimeoutError(
            f"{comp.describe()} did not return within {timeout:g} s (compaction_timeout); "
            "its result will be ignored"
        )
    if "error" in box:
        raise box["error"]
    return box.get("result")


class CompactionTimeoutError(Exception):
    """A compactor did not return within the configured ``compaction_timeout``."""


def run_compaction(
    acc: AgentConfig,
    *,
    mid_round: bool,
    turn_id: str | None = None,
    timeout: float | None = None,
) -> tuple[AgentConfig, dict[str, Any]]:
    """Resolve one boundary: call ``acc``'s compactor and return ``(acc, meta)``.

    Builds ``ctx`` (:func:`build_context`), calls the selected compactor's
    ``maybe_compact``, and checks what it returned: a compactor that raises, returns
    something other than ``(AgentConfig, dict)``, omits the boolean ``compacted``, reports
    ``dropped`` without compacting, reports as ``dropped`` anything but entries it removed
    from the active branch (oldest first, as they were), or mutates the memory it was
    given, yields
    ``{"compacted": False, "error": ...}`` with the caller's ``acc`` (its memory restored
    when it was appended to). ``after_compact`` hooks run only when ``meta["dropped"]`` is
    non-empty; hooks that raise are collected in ``meta["hook_errors"]``.
    ``timeout`` (default: ``acc.compaction_timeout``, none when that is ``None``) bounds
    the compactor's time: past it the boundary returns the error path and the compactor's
    late result is ignored. This function does not raise for a faulty compactor or hook.
    """
    try:
        comp = resolve_compactor(acc.compactor)
        ctx = build_context(acc, comp, mid_round=mid_round, turn_id=turn_id)
    except Exception as exc:
        return _error(acc, f"compactor {acc.compactor!r} could not be prepared: {exc}", exc)
    memory = acc.memory
    snapshot = memory._snapshot()
    opts = dict(acc.compactor_opts)
    limit = timeout if timeout is not None else acc.compaction_timeout
    try:
        result = _call_with_timeout(comp, acc, ctx, opts, limit)
    except CompactionTimeoutError as exc:
        return _error(acc, str(exc))
    except Exception as exc:
        memory._restore(snapshot)
        return _error(acc, f"{comp.describe()} raised {type(exc).__name__}: {exc}", exc)
    if memory._snapshot() != snapshot:
        memory._restore(snapshot)
        return _error(acc, f"{comp.describe()} mutated the memory it was given (restored)")
    if acc.memory is not memory:
        object.__setattr__(acc, "memory", memory)
        return _error(acc, f"{comp.describe()} replaced the memory of the config it was given")
    if not (isinstance(result, tuple) and len(result) == 2):
        return _error(acc, f"{comp.describe()} returned {type(result).__name__}, not (acc, meta)")
    new_acc, meta = result
    if not isinstance(new_acc, AgentConfig):
        return _error(
            acc, f"{comp.describe()} returned acc of type {type(new_acc).__name__}, not AgentConfig"
        )
    if not isinstance(meta, dict) or not isinstance(meta.get("compacted"), bool):
        return _error(
            acc, f"{comp.describe()} returned meta without a boolean 'compacted': {meta!r:.200}"
        )
    meta = dict(meta)
    dropped = meta.get("dropped")
    if dropped is not None and not isinstance(dropped, list):
        return _error(
            acc,
            f"{comp.describe()} returned 'dropped' of type {type(dropped).__name__}, not a list",
        )
    if "error" in meta:
        if meta["compacted"]:
            return _error(
                acc, f"{comp.describe()} reported an error while compacted=True: {meta['error']}"
            )
        meta.pop("dropped", None)
        return acc, meta
    if not meta["compacted"] and dropped:
        return _error(acc, f"{comp.describe()} reported dropped entries with compacted=False")
    if dropped:
        problem = _dropped_problem(acc, new_acc, dropped)
        if problem is not None:
            return _error(acc, f"{comp.describe()} {problem}")
        hook_errors = run_after_compact(new_acc, ctx, meta)
        if hook_errors:
            meta["hook_errors"] = hook_errors
    return new_acc, meta
