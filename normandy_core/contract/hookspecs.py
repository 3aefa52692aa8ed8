"""The compactor contract as pluggy hook specifications, in two sets.

:class:`CompactorSpec` holds the hooks a compactor implements, :class:`HookSpec` the
hooks a hook plugin implements. Each kind of plugin is registered against its own set,
so a hook in the wrong kind of plugin is refused when it is loaded (it would otherwise
never run). These docstrings are the reference documentation of the contract;
``docs/hooks.md`` is generated from them, and a test fails when a hookspec is missing
there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import pluggy

if TYPE_CHECKING:
    from pydantic import BaseModel

    from normandy_core.contract.embedders import Embedder

    # The specs type acc structurally (an import circle otherwise: see AgentConfigView);
    # what compactors and hooks receive is an AgentConfig.
    from normandy_core.contract.types import (
        AgentConfigView as AgentConfig,
        BoundaryInfo,
        CompactionContext,
        CompactionMeta,
        RecallHit,
    )
    from normandy_core.conversation.entries import Entry
    from normandy_core.conversation.survival import SurvivalRules

__all__ = ["PROJECT_NAME", "CompactorSpec", "HookSpec", "active_when", "hookimpl", "hookspec"]

#: The pluggy project name every Normandy hookspec and hookimpl belongs to.
PROJECT_NAME = "normandy"

#: Marks the hook specifications below.
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: Marks a plugin's implementation of a hook: ``@hookimpl def maybe_compact(acc, ctx, opts): ...``
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

_F = TypeVar("_F", bound=Callable[..., Any])

#: The attribute :func:`active_when` sets on an ``on_boundary`` implementation.
ACTIVE_ATTR = "normandy_active"


def active_when(gate: Callable[[], bool]) -> Callable[[_F], _F]:
    """Mark an ``on_boundary`` implementation as idle while ``gate()`` is false.

    ``@hookimpl @active_when(in_use) def on_boundary(...)``: at a boundary where ``gate()``
    returns false the implementation is not called, and a boundary no implementation
    observes builds no :class:`~normandy_core.BoundaryInfo`. For observers that are idle
    most of the time (``normandy-otel`` until the application sets OpenTelemetry up);
    ``gate`` runs at every boundary, so it must be cheap. A gate that raises counts as
    true (the error is logged). Other hooks ignore the mark.
    """

    def mark(fn: _F) -> _F:
        setattr(fn, ACTIVE_ATTR, gate)
        return fn

    return mark


class CompactorSpec:
    """The hooks of a compactor (entry-point group ``normandy_core.compactors``)."""

    @staticmethod
    @hookspec(firstresult=True)
    def maybe_compact(
        acc: AgentConfig, ctx: CompactionContext, opts: Any
    ) -> tuple[AgentConfig, dict[str, Any]]:
        """Shrink the conversation held in ``acc.memory`` when it needs to.

        Required. Called on the selected compactor only (never broadcast), by the turn's
        boundary function :func:`normandy_core.run_compaction`: once at the start of a turn
        (``ctx.mid_round`` false) and after every tool batch (``ctx.mid_round`` true).

        :param acc: the running agent config; the conversation is ``acc.memory``. Never
            mutate it or its memory: return a new config (``acc.with_memory(new_memory)``)
            when something changed, the same ``acc`` otherwise. Model, system prompt, tools
            and compactor settings must come back unchanged.
        :param ctx: the prepared decision inputs (:class:`~normandy_core.CompactionContext`):
            ``model``, ``window`` (``None`` only when :func:`needs_window` says no),
            ``prompt_tokens`` (estimated tokens of the system prompt and tool definitions
            the next call sends, about four characters per token, plus what the request
            costs once, the reply's priming, ``ctx.counter.request_tokens``; all of it
            shares the window with the history; 0 when there is no window), ``mid_round``,
            ``turn_id``,
            ``counter``, the calibrated token counter every size decision must use,
            ``rules``, and ``force`` with ``focus``: the boundary was asked for
            (``compact(force=True)``, ``normandy compact --force``, the model's
            ``compact_context`` tool), so compact now whatever your trigger, giving
            ``focus`` (a string, or ``None``) to your summarizer as instructions, or
            return the skip path with ``declined``, the reason (a compactor that does
            not read ``force`` is given a generic reason by the boundary).
        :param opts: the compactor's options, prepared once where the config was made:
            an instance of the model :func:`options_model` returns, or, without one, a
            read-only mapping of the options as configured.
        :returns: ``(acc, meta)``. ``meta`` is a dict that always has ``compacted`` (bool).
            To do nothing return the same ``acc`` and ``{"compacted": False}`` (the skip
            path). A failed compaction returns the input ``acc`` untouched and
            ``{"compacted": False, "error": reason}`` (the error path). ``dropped`` lists
            the :class:`~normandy_core.Entry` objects removed from the active branch, or
            kept but rewritten, oldest first, each under the id it had in ``acc.memory``
            and with its original content; every kept message keeps its entry id.
            ``dropped`` is absent on the skip and error paths, so consumers test
            ``meta.get("dropped")``. A compactor that compacted but could not bring the
            conversation under the window it was given says so: ``target_met`` false and
            ``target_missed``, the reason (a string); ``compact(raise_on_error=True)``
            raises for it and ``normandy compact`` exits 4. ``target_met`` may also be
            false for a result under the window but over the compactor's own target
            (``window_manager``'s ``target``), without ``target_missed``: that is not
            an error. ``strategy`` and any other keys are the compactor's own. The
            boundary computes ``tokens_before``, ``tokens_after`` (whole-memory counts)
            and ``tokens_removed`` (tokens of this turn's messages that compaction
            removed; the task budget subtracts it) with ``ctx.counter`` itself, and the
            next call's estimated billed input with prompt caching without and with the
            compaction, ``billed_next_without`` and ``billed_next_with``, with the cached
            tokens it keeps, ``cache_kept_tokens`` (see ``docs/cost.md``), and
            ``thinking_stripped``, whether a message it kept lost its thinking blocks.

        At a mid-round boundary the model's tool round is still open: the next request
        continues it and its assistant turns go back with their thinking. A compactor must
        leave the memory unchanged there while the conversation still fits the window. When
        it does compact there, it strips the thinking blocks from every message it keeps
        (:func:`normandy_core.drop_thinking`): they were produced with the full history in
        place and the API can reject them after a summary or a cut.

        What it returns is checked by :func:`normandy_core.check_compaction` (the same
        check the pipeline and the conformance kit apply): every entry that left the
        active branch, or was rewritten, must be in ``dropped``; nothing kept unchanged may
        be; no entry a survival rule keeps may be dropped or rewritten; no tool use may
        lose its result; the kept history may not start with an assistant message. May
        raise: the boundary turns any exception (``SystemExit`` included), a malformed or
        refused result, into the error path with the caller's ``acc`` untouched, and logs
        it naming the compactor and its distribution.
        """
        raise NotImplementedError  # pragma: no cover - a specification has no body

    @staticmethod
    @hookspec(firstresult=True)
    def options_model() -> type[BaseModel]:
        """Name the pydantic model of the compactor's options.

        Optional. When implemented, the core validates the configured options with this
        model where the config is made (a :class:`~normandy_core.CompactorOptions`
        subclass refuses unknown options), with errors that begin with the entry point and
        name the compactor and the option; the parsed instance is what
        :func:`maybe_compact`, :func:`needs_window` and :func:`validate_opts` receive as
        ``opts``. Without it, they receive a read-only mapping of the options as
        configured.

        :returns: the options model (a class, not an instance).

        Called once per compactor when it is loaded; it must not raise.
        """
        raise NotImplementedError  # pragma: no cover

    @staticmethod
    @hookspec(firstresult=True)
    def needs_window(opts: Any) -> bool:
        """Say whether this compactor, given ``opts``, sizes against the model's context window.

        Optional. A compactor without it is taken to need one. When it does and the options
        pin no ``context_window``, the window is resolved through the agent's model catalog
        where the config is made; when neither gives one, the config is refused there with
        :class:`~normandy_core.WindowUnknownError`. When it returns false, ``ctx.window`` is
        ``None`` and ``ctx.prompt_tokens`` is 0.

        :param opts: the compactor's prepared options (see :func:`maybe_compact`).
        :returns: ``True`` when the compactor needs ``ctx.window``.

        Called where a config is made, once; it must not raise.
        """
        raise NotImplementedError  # pragma: no cover

    @staticmethod
    @hookspec(firstresult=True)
    def validate_opts(opts: Any, entry: str, window: int | None, rules: SurvivalRules) -> None:
        """Check the compactor's options (and the config's survival rules) where the
        config is made, never mid-turn.

        Optional. Called once by the core's prepare step (:func:`normandy_core.prepare`),
        which :class:`~normandy_core.AgentConfig`, :func:`normandy_core.compact`, the
        ``normandy`` command and the ``pipeline`` (for each step) all go through, after the
        options were parsed with :func:`options_model` and the window was resolved. Raise to
        refuse; the return value is not used. An implementation may take any subset of
        the arguments (pluggy's convention).

        :param opts: the prepared options (see :func:`maybe_compact`).
        :param entry: the public entry point that made the config, such as
            ``"normandy_core.AgentConfig()"``. The core begins every refusal with it and
            names the compactor, whatever the implementation raised.
        :param window: the context window the compactor will be given (``None`` when it
            needs none), so a window the options make unusable (smaller than a reserve)
            is refused here rather than at every boundary.
        :param rules: the config's survival rules (:class:`~normandy_core.SurvivalRules`,
            already validated), which ``ctx.rules`` carries at every boundary. Refuse here
            a rule the compactor cannot honour (a summarizer-only rule such as
            ``summary_instructions`` given to a compactor that writes no summary), rather
            than ignoring it.
        :returns: nothing.
        :raises normandy_core.OptionsError: (a ``ValueError``) naming the option and what
            is allowed; any other exception is wrapped into one.
        """
        raise NotImplementedError  # pragma: no cover

    @staticmethod
    @hookspec(firstresult=True)
    def requires_client(opts: Any) -> str | None:
        """Say what in ``opts``, if anything, needs the config's model client (``acc.client``).

        Optional. A compactor without it is taken to need none. Called where the config is
        made, once, after :func:`validate_opts` accepted the options; when it returns a
        reason and the config has no client, the config is refused there with
        :class:`~normandy_core.OptionsError` (beginning with the entry point, naming the
        compactor and the reason, and saying how to give a client), rather than every
        boundary failing for want of one. A compactor that only *may* use a client (one
        that falls back to something offline without it) returns ``None``.

        :param opts: the compactor's prepared options (see :func:`maybe_compact`).
        :returns: ``None`` when the options need no client; otherwise the option at fault
            and what would do without a client, in a clause such as ``"option 'summarizer'
            is 'model' ('auto' or 'extractive' summarize without a client)"``.

        It must not raise: a failure is logged naming the compactor, and the config is
        then accepted (the boundary reports a missing client, as before).
        """
        raise NotImplementedError  # pragma: no cover

    @staticmethod
    @hookspec(firstresult=True)
    def compaction_threshold(opts: Any, window: int | None, mid_round: bool) -> int | None:
        """Declare the token level at or below which :func:`maybe_compact` does nothing.

        Optional, and a promise: at a boundary of this kind (``mid_round``) where the
        conversation's calibrated size plus the prompt,
        ``ctx.counter.memory_tokens(acc.memory) + ctx.prompt_tokens``, is at most the
        level returned, ``maybe_compact(acc, ctx, opts)`` would return exactly
        ``(acc, {"compacted": False})``: the plain skip path, no other key. The boundary
        then does not call it. It counts the memory itself (the running total it keeps
        anyway; an upper bound first, while the tokenizer is not loaded, as
        ``window_manager`` does), and only a boundary over the level calls the compactor.
        The result is the one the call would have given: the same ``acc`` and ``meta``
        (``{"compacted": False}``), the same log line and ``on_boundary`` report, whose
        :class:`~normandy_core.BoundaryInfo` times the check as the compactor's part.
        Most boundaries of a long session skip, so this is what keeps one close to the
        cost of counting the new messages.

        A compactor whose skip decision depends on anything else (the turn's messages, a
        schedule's estimates, a meta key it adds when it waits) returns ``None`` for that
        kind of boundary, or does not implement the hook: the boundary then calls
        :func:`maybe_compact` every time, as before. The conformance kit
        (:func:`normandy_core.testing.check_call`) checks the promise: a call at or below
        the level that does anything but the plain skip fails it.

        :param opts: the compactor's prepared options (see :func:`maybe_compact`).
        :param window: the context window ``ctx.window`` will hold (``None`` when the
            compactor needs none).
        :param mid_round: the kind of boundary: false at the start of a turn, true after
            a tool batch. The hook is asked once for each.
        :returns: the level in tokens (an ``int``; a negative one never skips), or
            ``None`` to have every boundary of this kind call :func:`maybe_compact`.

        Called where the config is made, twice (once per kind of boundary), after
        :func:`validate_opts` accepted the options; never at a boundary. It must not
        raise: a failure, or a result that is not an ``int``, is logged naming the
        compactor, and the boundary then always calls :func:`maybe_compact`.
        """
        raise NotImplementedError  # pragma: no cover


class HookSpec:
    """The hooks of a hook plugin (entry-point group ``normandy_core.hooks``)."""

    @staticmethod
    @hookspec
    def before_commit(
        acc: AgentConfig, ctx: CompactionContext, meta: CompactionMeta | Mapping[str, Any]
    ) -> Mapping[str, Any] | None:
        """Record what a compaction drops before it takes effect; raise to refuse it.

        Optional, for hook plugins that must not let a message go unrecorded (an archive
        in its durable mode). Called on every hook plugin that implements it, through
        pluggy's call path, after the compactor's result passed the contract check and
        only when ``meta["dropped"]`` is non-empty, *before* the compaction is handed
        back: every implementation is required. When one raises (any exception,
        ``SystemExit`` included) or runs past its share of ``compaction_timeout``, the
        compaction does not happen: the boundary returns the caller's ``acc`` untouched
        and ``{"compacted": False, "error": ...}`` naming the hook plugin, its distribution
        and its error, and no ``after_compact`` hook runs. Implementations that ran before
        the refusal may have recorded entries that stay in the conversation; records must
        therefore be idempotent. Do the durable part here and the rest (indexing,
        notifying) in :func:`after_compact`.

        :param acc: the config the compactor returned (the compacted conversation).
        :param ctx: the context the compactor was called with.
        :param meta: the checked result's meta, read-only, as :func:`after_compact` gets it.
        :returns: ``None``, or a *note* for the caller: a mapping of JSON values saying what
            the hook did (where it recorded the entries, how many), with an optional
            ``"message"``, one line for people. When the compaction takes effect the
            boundary lists every note in ``meta["hook_notes"]`` as ``{"hook": name,
            "plugin": description, "note": note}`` (see :func:`after_compact`); a return
            value that is not a mapping is ignored.
        :raises Exception: to refuse the compaction, with the reason in the message.
        """
        raise NotImplementedError  # pragma: no cover

    @staticmethod
    @hookspec
    def after_compact(
        acc: AgentConfig, ctx: CompactionContext, meta: CompactionMeta | Mapping[str, Any]
    ) -> Mapping[str, Any] | None:
        """React to a compaction that removed entries: archive them, log them, index them.

        Broadcast to every registered hook plugin (entry points in the
        ``normandy_core.hooks`` group, and plugins registered in code with
        :func:`normandy_core.register_hook`), each through pluggy's call path (so hook-call
        monitoring sees it) and isolated from the others, run only when ``meta["dropped"]``
        is non-empty, after the compactor's result passed the contract check and every
        :func:`before_commit` accepted it, and before the turn continues.

        :param acc: the config the compactor returned (the compacted conversation).
        :param ctx: the context the compactor was called with.
        :param meta: the checked result's meta, read-only
            (:class:`~normandy_core.CompactionMeta`): ``meta["dropped"]`` is a tuple of
            the removed entries (frozen), oldest first, each with the id it had and its
            original content. No hook can change what the next one receives.
        :returns: ``None``, or a *note* for the caller: a mapping of JSON values saying what
            the hook did (an archive says where it wrote the dropped entries), with an
            optional ``"message"``, one line for people. The boundary lists the notes of
            :func:`before_commit` and of this hook in ``meta["hook_notes"]``, in the order
            the hooks ran, each as ``{"hook": name, "plugin": description, "note": note}``
            (``name`` and ``description`` as in ``hook_errors``); ``compact()``'s result
            gives them as :attr:`~normandy_core.CompactResult.notes` and the ``normandy
            compact`` command prints each message on stderr. A return value that is not a
            mapping is ignored.

        A hook that raises (any exception, ``SystemExit`` included) does not stop the others
        or the turn: the boundary logs the error and records it in ``meta["hook_errors"]``
        as ``{"hook": name, "plugin": description, "error": text}``, where ``plugin`` names
        the entry point and its distribution. Under ``compaction_timeout`` the hooks share
        what the compactor left of it; a hook past its share is abandoned and recorded the
        same way, and is not called again while its abandoned call still runs (recorded as
        not called). To see every boundary, not only those that drop, implement
        :func:`on_boundary`.
        """
        raise NotImplementedError  # pragma: no cover

    @staticmethod
    @hookspec
    def on_boundary(
        acc: AgentConfig,
        ctx: CompactionContext | None,
        meta: CompactionMeta | Mapping[str, Any],
        info: BoundaryInfo,
    ) -> None:
        """Observe every boundary, whatever it came to: compacted, skipped or failed.

        Optional, for hook plugins that log, trace or measure (the ``normandy-otel``
        distribution emits spans and metrics from it). Called on every hook plugin that
        implements it, through pluggy's call path and each isolated from the others, at
        every boundary :func:`normandy_core.run_compaction` resolves (the turn loop's,
        :func:`normandy_core.compact`'s, the ``normandy compact`` command's), once its
        result is final: after the contract check, the :func:`before_commit` and
        :func:`after_compact` hooks, and the boundary's own log line, just before the
        result is handed back. It runs on every boundary, so keep it cheap: a skipped
        boundary is the hot path. An implementation that is idle most of the time marks
        itself with :func:`~normandy_core.active_when` (``@active_when(gate)``): at a
        boundary where ``gate()`` is false it is not called, and when no implementation
        is called the boundary builds no ``info``.

        :param acc: the config the turn continues with: the compacted conversation, or
            the caller's own ``acc`` when the boundary skipped or failed.
        :param ctx: the context the compactor was called with; ``None`` only when the
            boundary failed before it could be built.
        :param meta: the result's meta, read-only, exactly as the caller gets it:
            ``compacted``, and on a compaction ``tokens_before``, ``tokens_after``,
            ``tokens_removed``, ``billed_next_without``, ``billed_next_with``,
            ``cache_kept_tokens``, ``thinking_stripped``, ``dropped``, ``strategy``,
            ``hook_errors`` and ``hook_notes``; on the error path ``error``; on the skip
            path only the keys the compactor added, if any (a ``schedule="cost"``
            compactor that weighed the boundary and waited adds its estimates:
            ``billed_next_without``, ``billed_next_with``, ``cost_horizon_without``,
            ``cost_horizon_with``, ``growth_per_call``, ``cost_decision``).
        :param info: what the meta does not say (:class:`~normandy_core.BoundaryInfo`):
            ``outcome`` (``"compacted"``, ``"skipped"`` or ``"failed"``), the compactor's
            name, distribution and version, when the boundary started (``start_ns``,
            wall clock) and how long it and the compactor's own call took (seconds), on
            failure a short ``error_type`` for grouping, and in the turn loop whether the
            model call after the boundary goes without the thinking the turn asks for
            (``thinking_disabled``: a mid-round compaction stripped it; these flags
            summed over a turn are its ``TurnResult.thinking_disabled_calls``).
        :returns: nothing; a return value is ignored.

        A hook that raises (any exception, ``SystemExit`` included) does not stop the
        others or the turn and changes nothing in the result: the boundary logs the error
        at ERROR, naming the hook plugin and its distribution (identical faults once a
        minute, with a count). Under ``compaction_timeout`` these hooks share a time limit
        of the same length of their own (so a boundary that ran out of time is still
        observed); a hook past its share is abandoned and logged the same way, and is not
        called again while its abandoned call still runs. When the cap of abandoned
        threads leaves no thread to bound it in, the hook is called on the boundary's own
        thread, without a limit: every boundary is reported whatever the cap does.
        """
        raise NotImplementedError  # pragma: no cover

    @staticmethod
    @hookspec
    def recall_entries(
        query: str, session_id: str | None, limit: int
    ) -> Sequence[RecallHit | Entry] | None:
        """Search what compactions dropped, for the ``recall`` tool and ``normandy_core.recall``.

        Optional, for hook plugins that keep dropped entries (the ``archive`` hook plugin
        of ``normandy-archive`` implements it over SQLite full-text search and PostgreSQL
        ``tsvector``). Called on every hook plugin that implements it, each isolated from
        the others, whenever the model calls the ``recall`` tool (an agent made with
        ``AgentConfig(recall=True)``) or a program calls :func:`normandy_core.recall`.
        The core merges the answers (best first, taking each source's in turn), leaves
        out markers and summaries compactors inserted, duplicates and what the model still
        sees, bounds the result in tokens with the agent's counter and frames it as
        quoted data; a source only searches.

        :param query: keywords as the model wrote them; an entry matching any of them is a
            hit, one matching more ranks higher. A single word that is an entry id or a
            tool-use id should find that entry.
        :param session_id: the session whose dropped entries to search (the agent's
            ``session_id``); ``None`` searches every session the source holds.
        :param limit: the most hits wanted.
        :returns: at most ``limit`` hits, best first: :class:`~normandy_core.RecallHit`
            (the entry as it was dropped, its session, when it was archived, the names
            of the tools whose results it holds) or plain :class:`~normandy_core.Entry`
            objects; ``None`` or an empty list when nothing matches.
        :raises Exception: when the search cannot be done (the archive is off or
            unreadable). The error is reported with the plugin's name; the other sources'
            hits are still returned, and the tool answers with an error result only when
            every source failed.
        """
        raise NotImplementedError  # pragma: no cover

    @staticmethod
    @hookspec
    def recall_similar(
        query: str, session_id: str | None, limit: int, embedder: Embedder
    ) -> Sequence[RecallHit | Entry] | None:
        """Search what compactions dropped by meaning, for recall with an embedder.

        Optional, like :meth:`recall_entries`, and called only when recall is configured
        with an embedder (the ``embedder`` setting of ``[recall]``,
        ``NORMANDY_RECALL_EMBEDDER``, or ``RecallSettings(embedder=...)``). The source
        ranks its entries by how close their vectors are to the query's, both made by
        ``embedder``; it computes (and keeps) the vectors of entries that have none yet,
        off the compaction's path. The core fuses this ranking with the keyword one
        (reciprocal rank fusion) before it bounds and frames the result. The ``archive``
        hook plugin of ``normandy-archive`` implements it over SQLite (vectors in a table
        of the archive, compared with NumPy).

        :param query: the query as the model wrote it.
        :param session_id: as for :meth:`recall_entries`.
        :param limit: the most hits wanted.
        :param embedder: the configured :class:`~normandy_core.contract.embedders.Embedder`;
            vectors of another ``embedder.key`` are never compared with its own.
        :returns: at most ``limit`` hits, the closest first (``None`` or an empty list:
            nothing to compare).
        :raises Exception: when the search cannot be done; reported with the plugin's
            name, as for :meth:`recall_entries`.
        """
        raise NotImplementedError  # pragma: no cover


#: Every hookspec by name, with the set it belongs to (for listings and error messages).
SPEC_SETS: dict[str, type] = {
    "maybe_compact": CompactorSpec,
    "options_model": CompactorSpec,
    "needs_window": CompactorSpec,
    "validate_opts": CompactorSpec,
    "requires_client": CompactorSpec,
    "compaction_threshold": CompactorSpec,
    "before_commit": HookSpec,
    "after_compact": HookSpec,
    "on_boundary": HookSpec,
    "recall_entries": HookSpec,
    "recall_similar": HookSpec,
}
