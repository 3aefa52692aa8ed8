"""The compactor contract as pluggy hook specifications.

These docstrings are the reference documentation of the contract; ``docs/hooks.md`` is
generated from them, and a test fails when a hookspec is missing there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from normandy_core.boundary import CompactionContext
    from normandy_core.config import AgentConfig

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec"]

#: The pluggy project name every Normandy hookspec and hookimpl belongs to.
PROJECT_NAME = "normandy"

#: Marks the hook specifications below.
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: Marks a plugin's implementation of a hook: ``@hookimpl def maybe_compact(acc, ctx, opts): ...``
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec(firstresult=True)
def maybe_compact(
    acc: AgentConfig, ctx: CompactionContext, opts: dict[str, Any]
) -> tuple[AgentConfig, dict[str, Any]]:
    """Shrink the conversation held in ``acc.memory`` when it needs to.

    Called on the selected compactor only (never broadcast), by the turn's boundary
    function :func:`normandy_core.run_compaction`: once at the start of a turn
    (``ctx.mid_round`` false) and after every tool batch (``ctx.mid_round`` true).

    :param acc: the running agent config; the conversation is ``acc.memory``. Never mutate
        it or its memory: return a new config (``acc.with_memory(new_memory)``) when
        something changed, the same ``acc`` otherwise.
    :param ctx: the decision inputs the pure turn core cannot compute: ``model``,
        ``window`` (``None`` only when :func:`needs_window` says no), ``prompt_tokens``
        (estimated tokens of the system prompt and tool definitions the next call sends,
        about four characters per token, which share the window with the history; 0 when
        there is no window) and ``mid_round``.
    :param opts: the compactor's options exactly as configured (already accepted by
        :func:`validate_opts`).
    :returns: ``(acc, meta)``. ``meta`` is a dict that always has ``compacted`` (bool).
        To do nothing return the same ``acc`` and ``{"compacted": False}`` (the skip
        path). A failed compaction returns the input ``acc`` untouched and
        ``{"compacted": False, "error": reason}`` (the error path). ``dropped``, when
        present, lists the :class:`~normandy_core.Entry` objects removed from the active
        branch, oldest first, each under the id it had in ``acc.memory`` and with its
        original content; a compactor that fills it keeps every kept message under its
        entry id. ``dropped`` is absent on the skip and error paths, so consumers test
        ``meta.get("dropped")``. The window-sized compactors add ``tokens_before``,
        ``tokens_after`` (whole-memory estimates), ``tokens_removed`` (estimated tokens of
        this turn's messages that compaction removed; the task budget subtracts it) and
        ``strategy``.

    At a mid-round boundary the model's tool round is still open: the next request
    continues it and its assistant turns go back with their thinking. A compactor must
    leave the memory unchanged there while the conversation still fits the window. When
    it does compact there, it strips the thinking blocks from every message it keeps
    (:func:`normandy_core.drop_thinking`): they were produced with the full history in
    place and the API can reject them after a summary or a cut.

    May raise: the boundary turns any exception, or a malformed return value, into the
    error path with the caller's ``acc`` untouched, and logs it naming the compactor.
    """
    raise NotImplementedError  # pragma: no cover - a specification has no body


@hookspec(firstresult=True)
def needs_window(opts: dict[str, Any]) -> bool:
    """Say whether this compactor, given ``opts``, sizes against the model's context window.

    Optional. A compactor without it is taken to need one. When it does and ``opts`` pin no
    ``context_window``, the window is resolved through the agent's model catalog (memoised
    per agent and model); when neither gives one, the config is refused where it is made
    with :class:`~normandy_core.WindowUnknownError`. When it returns false, ``ctx.window``
    is ``None`` and ``ctx.prompt_tokens`` is 0.

    :param opts: the compactor's options as configured.
    :returns: ``True`` when the compactor needs ``ctx.window``.

    Called where a config is made (to check the window can be resolved) and at every
    boundary (to build ``ctx``); it must be cheap and must not raise.
    """
    raise NotImplementedError  # pragma: no cover


@hookspec(firstresult=True)
def validate_opts(opts: dict[str, Any], entry: str) -> None:
    """Check the compactor's options where the config is made, never mid-turn.

    Optional. Called by :class:`~normandy_core.AgentConfig` on creation and on every copy
    or rebuild that changes the compactor settings, by :func:`normandy_core.compact`, by
    the ``normandy`` command before anything runs, and by compactors that run others
    (the ``pipeline``). Raise to refuse; the return value is not used and
    :func:`maybe_compact` gets the options as configured.

    :param opts: the options to check.
    :param entry: the public entry point that made the config, such as
        ``"normandy_core.AgentConfig()"``. Pass it to
        :func:`normandy_core.validate_options` so the message begins with it. An
        implementation must accept ``entry``: one that does not is refused when the plugin
        is loaded, because its errors could not say which call made the bad config.
    :returns: nothing.
    :raises normandy_core.OptionsError: (a ``ValueError``) naming the entry point, the
        compactor, the option and what is allowed.
    """
    raise NotImplementedError  # pragma: no cover


@hookspec
def after_compact(acc: AgentConfig, ctx: CompactionContext, meta: dict[str, Any]) -> None:
    """React to a compaction that removed entries: archive them, log them, index them.

    Broadcast to every registered hook plugin (entry points in the ``normandy_core.hooks``
    group, and plugins registered in code with :func:`normandy_core.register_hook`), run
    only when ``meta["dropped"]`` is non-empty, after the compactor returned and before the
    turn continues.

    :param acc: the config the compactor returned (the compacted conversation).
    :param ctx: the context the compactor was called with.
    :param meta: the compactor's meta; ``meta["dropped"]`` holds the removed entries, oldest
        first, each with the id it had and its original content. Do not mutate it.
    :returns: nothing; return values are ignored.

    A hook that raises does not stop the others or the turn: the boundary logs the error
    and records it in ``meta["hook_errors"]`` as
    ``{"hook": name, "plugin": description, "error": text}``, where ``plugin`` names the
    entry point and its distribution.
    """
    raise NotImplementedError  # pragma: no cover
