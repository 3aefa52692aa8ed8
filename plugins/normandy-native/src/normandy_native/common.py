"""What both provider-native compactors share: when to act, what to send, the fallback.

A compaction sends the provider every unit of the active branch but the newest (the live
state: the user's new message, or the open tool round), system entries and the units of
entries a survival rule keeps (``ctx.rules``: pinned entries, the task, ``keep_tools``,
``keep_if``; they stay as they are, after the compaction, since a provider ignores what
precedes its compaction); the provider's compaction replaces what it was sent,
and everything it replaced is reported in ``dropped``, with its readable content, so an
``after_compact`` hook (the archive) keeps it: the compaction itself is readable only by
the provider that made it. The compaction is pinned and marked
``normandy.provider_compaction``; a later compaction sends it back and replaces it (the
contract lets the pin of a superseded provider compaction move to the new one).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from normandy_core import (
    ContractViolation,
    Entry,
    OpaqueBlock,
    build_context,
    call_compactor,
    group_units,
    hookimpl,
    new_id,
)
from normandy_core.clients.base import ProviderCompaction, ProviderCompactionError
from normandy_core.contract.eventloop import turn_loop
from normandy_core.contract.faults import (
    AbandonedLimitError,
    PluginTimeoutError,
    fault_cause,
    run_bounded,
)
from normandy_core.conversation import keys
from normandy_core.conversation.keys import PROVIDER_COMPACTION_KEY, PROVIDER_REBUILT_KEY

if TYPE_CHECKING:
    from normandy_core import AgentConfig, CompactionContext, SurvivalRules
    from normandy_native.options import NativeOptions

__all__ = [
    "MARKER_KEY",
    "MARKER_TEXT",
    "NATIVE_KEY",
    "Cannot",
    "Plan",
    "call_provider",
    "ask_provider",
    "client_methods",
    "NativeCompactor",
    "client_of",
    "compact_with_provider",
    "plan",
]

log = logging.getLogger("normandy_native")

#: Metadata key of the note put before a compaction that would open the history.
MARKER_KEY = keys.MARKER_KEY
#: That note (its tag lets a transcript reader recognise it in any format).
MARKER_TEXT = "[normandy:marker] Earlier messages were compacted by the model provider here."
#: Metadata key of the compaction entry: the provider, and the ids of what it replaced.
NATIVE_KEY = "normandy.native_compaction"


class Cannot(Exception):
    """The provider cannot compact this time; ``reason`` is the text meta reports."""

    def __init__(self, reason: str, kind: str = "failed") -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


@dataclass
class Plan:
    """Which entries of the active branch the provider summarizes, and which stay."""

    entries: list[Entry]
    summarized: list[int] = field(default_factory=list)
    system: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    """The units holding an entry a survival rule keeps: kept verbatim, after the
    compaction."""
    tail: list[int] = field(default_factory=list)

    def sent(self) -> list[Entry]:
        """What the provider is sent (and what its compaction replaces), in order."""
        return [self.entries[i] for i in self.summarized]


def _ours(entry: Entry) -> bool:
    return bool(
        entry.metadata.get(MARKER_KEY)
        or entry.metadata.get(PROVIDER_COMPACTION_KEY)
        or entry.metadata.get(PROVIDER_REBUILT_KEY)
    )


def protected_ids(entries: Sequence[Entry], rules: SurvivalRules) -> set[str]:
    """The ids ``rules`` keep in ``entries``, but for the pin of a provider compaction: a
    new compaction summarizes it and takes its place (and its pin)."""
    view = [
        e.model_copy(update={"pinned": False}) if e.metadata.get(PROVIDER_COMPACTION_KEY) else e
        for e in entries
    ]
    return set(rules.protected(view))


def _plain_user(entry: Entry) -> bool:
    return entry.role == "user" and not entry.tool_results


def plan(
    entries: Sequence[Entry], rules: SurvivalRules, *, returns_users: bool = False
) -> Plan | None:
    """The plan over ``entries`` under ``rules``; ``None`` when nothing but earlier
    compactions (and their notes) comes before the newest unit and what the rules keep.

    ``returns_users``: the provider gives the user messages back with its compaction
    (OpenAI's ``/responses/compact``), so a plan that would send nothing else but earlier
    compactions is ``None`` too: compacting again would change nothing but cost a call,
    at every boundary after it."""
    planned = Plan(entries=list(entries))
    units = group_units(entries)
    if not units:
        return None
    keep = protected_ids(entries, rules)
    *older, newest = units
    planned.tail = list(range(*newest))
    for start, end in older:
        unit = entries[start:end]
        if any(e.role == "system" for e in unit):
            planned.system.extend(range(start, end))
        elif any(e.id in keep for e in unit):
            planned.kept.extend(range(start, end))
        else:
            planned.summarized.extend(range(start, end))
    if all(
        _ours(entries[i]) or (returns_users and _plain_user(entries[i])) for i in planned.summarized
    ):
        return None
    return planned


def client_of(acc: AgentConfig, provider: str, example: str) -> Any:
    """The config's model client, when it is ``provider``'s (``example`` shows how to
    give one); otherwise :class:`Cannot` (``unsupported``)."""
    client = acc.client
    if client is None:
        raise Cannot(
            f"the config has no model client (AgentConfig(client={example}))", "unsupported"
        )
    if getattr(client, "provider", None) != provider:
        raise Cannot(
            f"the config's client ({type(client).__name__}) is not an "
            f"{'Anthropic' if provider == 'anthropic' else 'OpenAI'} client",
            "unsupported",
        )
    return client


def ask_provider(
    client: Any, system: str, messages: list[Entry], timeout: float, **kwargs: Any
) -> ProviderCompaction:
    """The client's ``compact_conversation(system, messages, **kwargs)`` (sync or async)
    within ``timeout`` seconds; anything but a compaction is :class:`Cannot`."""
    call, acall = client_methods(client, "compact_conversation")

    def sync() -> Any:
        assert call is not None
        return call(system, messages, **kwargs)

    def coro() -> Any:
        assert acall is not None
        return acall(system, messages, **kwargs)

    result = call_provider(
        sync if call is not None else None, coro if acall is not None else None, timeout
    )
    if not isinstance(result, ProviderCompaction):
        raise Cannot(f"the client's compact_conversation() returned {type(result).__name__}")
    return result


def call_provider(
    call: Callable[[], Any] | None,
    acall: Callable[[], Awaitable[Any]] | None,
    timeout: float,
) -> Any:
    """Run the provider's compaction in a worker thread, waiting at most ``timeout`` seconds.

    ``call`` is the client's synchronous method; without one, the coroutine of ``acall``
    runs on the turn's own event loop under ``arun_turn`` (where an async client's
    connections live), else on a loop of the worker. The thread is under the library's
    one cap of abandoned threads (:func:`~normandy_core.contract.faults.run_bounded`), and
    the client's SDK request is sent with ``timeout`` as its own, so a provider that never
    answers does not keep it. A :class:`~normandy_core.clients.ProviderCompactionError`
    becomes :class:`Cannot` with its reason; a wait past ``timeout``, or no thread to
    wait in, is ``unreachable``.
    """
    loop = turn_loop()
    pending: list[concurrent.futures.Future[Any]] = []

    def work() -> Any:
        if call is not None:
            return call()
        if acall is None:
            return None
        if loop is not None:
            pending.append(asyncio.run_coroutine_threadsafe(_await(acall), loop))
            return pending[0].result()
        return asyncio.run(_await(acall))

    try:
        return run_bounded(work, timeout, "normandy-native-compaction")
    except PluginTimeoutError as exc:
        for future in pending:
            future.cancel()
        raise Cannot(f"the provider did not answer within {timeout:g} s", "unreachable") from exc
    except AbandonedLimitError as exc:
        raise Cannot(f"the provider was not asked: {exc}", "unreachable") from exc
    except ProviderCompactionError as exc:
        raise Cannot(str(exc), exc.reason) from exc
    except Exception as exc:
        cause = fault_cause(exc)
        raise Cannot(f"the compaction request failed: {type(cause).__name__}: {cause}") from cause


async def _await(acall: Callable[[], Awaitable[Any]]) -> Any:
    return await acall()


def client_methods(
    client: Any, name: str
) -> tuple[Callable[..., Any] | None, Callable[..., Awaitable[Any]] | None]:
    """The client's synchronous method ``name`` (``None`` when it is a coroutine function
    or missing) and its ``a``-prefixed asynchronous form (or ``None``)."""
    method = getattr(client, name, None)
    amethod = getattr(client, "a" + name, None)
    if inspect.iscoroutinefunction(method):
        method, amethod = None, method
    if method is None and amethod is None:
        raise Cannot(f"the config's client has no {name}() method", "unsupported")
    return method, amethod


def over(acc: AgentConfig, ctx: CompactionContext, opts: NativeOptions) -> tuple[bool, int, int]:
    """Whether the boundary is over its trigger (always, when forced: ``ctx.force``), the
    usable window, and the tokens sent (the conversation and the prompt)."""
    total = ctx.counter.memory_tokens(acc.memory) + ctx.prompt_tokens
    usable = (ctx.window or 0) - opts.reserved_tokens
    if ctx.force:
        return True, usable, total
    if ctx.window is None:
        return (not ctx.mid_round and total > opts.trigger_tokens), usable, total
    threshold = usable if ctx.mid_round else min(opts.trigger_tokens, usable)
    return total > threshold, usable, total


#: Meta figures the boundary computes for the compaction as a whole.
_TOKEN_FIGURES = ("tokens_before", "tokens_after", "tokens_removed")


def run_fallback(
    acc: AgentConfig,
    ctx: CompactionContext,
    opts: NativeOptions,
    name: str,
    reason: str,
    kind: str,
) -> tuple[AgentConfig, dict[str, Any]]:
    """Compact with the fallback instead, saying why in meta.

    When the provider could not be reached, the fallback runs without the config's model
    client (a ``summarize`` fallback then writes its summary offline).
    """
    note = {"native": False, "fallback_reason": reason, "fallback_cause": kind}
    log.info("%s: the provider did not compact (%s); fallback %s", name, reason, opts.fallback)
    prepared = opts.prepared_fallback
    if prepared is None:
        text = f"{name}: the provider did not compact ({reason}) and no fallback is configured"
        return acc, {"compacted": False, "error": text, **note}
    note["fallback"] = prepared.name
    given = acc
    if kind == "unreachable" and acc.client is not None:
        given = acc.with_client(None)
    fctx = build_context(
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
    try:
        result = call_compactor(prepared.compactor, given, fctx, prepared.options)
    except ContractViolation as exc:
        text = f"{name} fallback broke the contract: {exc}"
        return acc, {"compacted": False, "error": text, **note}
    except Exception as exc:
        text = f"{name} fallback {prepared.name!r} raised {type(exc).__name__}: {exc}"
        return acc, {"compacted": False, "error": text, **note}
    meta = {k: v for k, v in result.meta.items() if k not in _TOKEN_FIGURES}
    if meta.get("error") is not None:
        meta["error"] = f"{name} fallback {prepared.name!r}: {meta['error']}"
    fallback_strategy = meta.pop("strategy", None)
    meta.update(note, strategy=name, fallback_strategy=fallback_strategy)
    if not result.meta.compacted:
        return acc, meta
    return acc.with_memory(result.acc.memory), meta


def compact_with_provider(
    acc: AgentConfig,
    ctx: CompactionContext,
    opts: NativeOptions,
    name: str,
    provider: str,
    ask: Callable[[Plan], ProviderCompaction],
    rebuild: Callable[[Plan, ProviderCompaction, str], tuple[list[Entry], list[Entry]]],
) -> tuple[AgentConfig, dict[str, Any]]:
    """The compaction of a native compactor: the plan, the provider's call, the new memory.

    ``ask`` sends the plan's entries to the provider; ``rebuild`` turns its compaction
    into the entries that replace them and the originals they replace (``dropped``).
    Whatever the provider cannot do goes to :func:`run_fallback`.
    """
    fire, usable, total = over(acc, ctx, opts)
    if not fire:
        return acc, {"compacted": False}
    model = ctx.model or ""
    known = opts.unsupported_reason(model)
    if known is not None:
        return run_fallback(acc, ctx, opts, name, known, "unsupported")
    planned = plan(acc.memory.entries(), ctx.rules, returns_users=provider == "openai")
    if planned is None:
        return _nothing_to_summarize(acc, ctx, opts, name, within=total <= usable)
    try:
        compaction = ask(planned)
    except Cannot as exc:
        if exc.kind == "unsupported" and model:
            opts.remember_unsupported(model, exc.reason)
        return run_fallback(acc, ctx, opts, name, exc.reason, exc.kind)
    turn = f"compaction-{new_id()[:12]}"
    replacing, dropped = rebuild(planned, compaction, turn)
    entries = planned.entries
    kept = [entries[i].without_thinking() for i in planned.system]
    kept += replacing
    kept += [entries[i].without_thinking() for i in (*planned.kept, *planned.tail)]
    new_acc = acc.with_memory(acc.memory.derive(kept))
    compaction_entry = next(e for e in replacing if e.metadata.get(PROVIDER_COMPACTION_KEY))
    meta: dict[str, Any] = {
        "compacted": True,
        "strategy": name,
        "native": True,
        "provider": provider,
        "dropped": dropped,
        "compaction_id": compaction_entry.id,
        "summarized_ids": [entries[i].id for i in planned.summarized],
        "kept_by_rules": [entries[i].id for i in planned.kept],
        "provider_usage": {
            "input_tokens": compaction.usage.input_tokens,
            "output_tokens": compaction.usage.output_tokens,
        },
        "counter": ctx.counter.name,
        "window": ctx.window,
        "trigger_tokens": opts.trigger_tokens,
    }
    after = ctx.counter.memory_tokens(new_acc.memory) + ctx.prompt_tokens
    if ctx.window is not None and after > usable:
        return _cut_further(acc, new_acc, meta, ctx, opts, name, after, usable)
    return new_acc, meta


def _nothing_to_summarize(
    acc: AgentConfig, ctx: CompactionContext, opts: NativeOptions, name: str, *, within: bool
) -> tuple[AgentConfig, dict[str, Any]]:
    """Over the trigger with nothing left for the provider to summarize: the fallback's
    compaction, or a skip when there is no fallback and the conversation is ``within``
    the window (not a failure: the next compaction will have something to summarize)."""
    reason = (
        "nothing before the newest message (but what the survival rules keep) is left "
        "for the provider to summarize"
    )
    if opts.prepared_fallback is None and ctx.window is not None and within:
        meta: dict[str, Any] = {"compacted": False, "native": False, "skipped_because": reason}
        if ctx.force:
            meta["declined"] = reason
        return acc, meta
    return run_fallback(acc, ctx, opts, name, reason, "nothing_to_summarize")


def _cut_further(
    acc: AgentConfig,
    compacted: AgentConfig,
    meta: dict[str, Any],
    ctx: CompactionContext,
    opts: NativeOptions,
    name: str,
    after: int,
    usable: int,
) -> tuple[AgentConfig, dict[str, Any]]:
    """The provider's compaction of ``acc`` left ``compacted`` (``meta``) still over the
    ``usable`` window, at ``after`` tokens: the newest unit (or what the rules keep) alone
    is over it. The fallback cuts further, reporting the originals of what it removes as
    well; when it cannot, it compacts the input instead (the compaction, pinned like the
    provider's summary must stay, can leave no room where cutting the originals still
    fits); when neither fits, the error."""
    why = "still over the usable window after the provider's compaction"
    more_acc, more = run_fallback(compacted, ctx, opts, name, why, "too_large")
    if more.get("error") is None and more.get("compacted"):
        gone = {e.id for e in more["dropped"]} | {e.id for e in meta["dropped"]}
        meta["dropped"] = [e for e in acc.memory.entries() if e.id in gone]
        meta["then"] = {k: v for k, v in more.items() if k != "dropped"}
        return more_acc, meta
    why = (
        f"{after:,} tokens after the provider's compaction, and the fallback could "
        "not fit that; its compaction is discarded"
    )
    alt_acc, alt = run_fallback(acc, ctx, opts, name, why, "too_large")
    if alt.get("error") is None and alt.get("compacted"):
        alt["provider_usage"] = meta["provider_usage"]
        alt["provider_compaction_discarded"] = True
        return alt_acc, alt
    text = (
        alt.get("error")
        or more.get("error")
        or (
            f"{name}: {after:,} tokens after the provider's compaction, over the "
            f"usable window of {usable:,}"
        )
    )
    return acc, {"compacted": False, "error": text}


OptionsT = TypeVar("OptionsT", bound="NativeOptions")


class NativeCompactor(Generic[OptionsT]):
    """The hookimpls of a provider-native compactor, for ``anthropic_native`` and
    ``openai_native`` alike. A subclass names the compactor (:attr:`name`), its
    :attr:`provider` and :attr:`options`, and says how to ask the provider (:meth:`ask`)
    and how its answer replaces the entries sent (:meth:`rebuild`)."""

    #: The name the compactor is registered under.
    name: ClassVar[str]
    #: The provider that compacts (``anthropic``, ``openai``), as meta reports it.
    provider: ClassVar[str]
    #: The wire format of its compaction (``OpaqueBlock.format``).
    wire_format: ClassVar[str]
    #: The compactor's options model.
    options: type[OptionsT]
    #: Whether the provider's compaction takes instructions (``ctx.focus`` is sent with
    #: them); when not, a focus given is reported in meta's ``focus_ignored``.
    takes_focus: ClassVar[bool] = True

    @hookimpl
    def options_model(self) -> type[OptionsT]:
        """The options are the compactor's :attr:`options`."""
        return self.options

    @hookimpl
    def needs_window(self, opts: OptionsT) -> bool:
        """Sizes against the window: it caps the trigger and decides mid-round."""
        return True

    @hookimpl
    def validate_opts(
        self, opts: OptionsT, entry: str, window: int | None, rules: SurvivalRules
    ) -> None:
        """Refuse a window the reserve fills and survival rules the provider cannot
        honour, and prepare the fallback with the same window and survival rules."""
        opts.check_window(window)
        self.check_rules(entry, rules)
        opts.prepare_fallback(self.name, entry, window, rules)

    @hookimpl
    def requires_client(self, opts: OptionsT) -> str | None:
        """What of the fallback's options needs the config's model client (without a
        client the provider is not asked: the fallback compacts)."""
        fallback = opts.prepared_fallback
        if fallback is None:
            return None
        reason = fallback.compactor.requires_client(fallback.options)
        return None if reason is None else f"option 'fallback' ({fallback.name!r}): {reason}"

    def check_rules(self, entry: str, rules: SurvivalRules) -> None:
        """Refuse survival rules the provider cannot honour (none unless overridden)."""

    @hookimpl
    def maybe_compact(
        self, acc: AgentConfig, ctx: CompactionContext, opts: OptionsT
    ) -> tuple[AgentConfig, dict[str, Any]]:
        """Over the trigger (or forced, ``ctx.force``), have the provider compact the
        conversation; see the module."""
        new_acc, meta = compact_with_provider(
            acc,
            ctx,
            opts,
            self.name,
            self.provider,
            lambda planned: self.ask(acc, ctx, opts, planned),
            self.rebuild,
        )
        if ctx.focus is not None and not self.takes_focus and meta.get("native"):
            meta["focus_ignored"] = f"{self.name}: the provider's compaction takes no instructions"
        return new_acc, meta

    def ask(
        self, acc: AgentConfig, ctx: CompactionContext, opts: OptionsT, planned: Plan
    ) -> ProviderCompaction:
        """The provider's compaction of what ``planned`` sends (:class:`Cannot` when it
        cannot compact)."""
        raise NotImplementedError

    def rebuild(
        self, planned: Plan, compaction: ProviderCompaction, turn: str
    ) -> tuple[list[Entry], list[Entry]]:
        """The entries (of turn ``turn``) that replace what ``planned`` sent, and the
        originals they replace."""
        raise NotImplementedError

    def compaction_entry(
        self, compaction: ProviderCompaction, turn: str, replaced: list[Entry]
    ) -> Entry:
        """The pinned assistant entry of ``turn`` holding the provider's compaction, in
        place of the ``replaced`` entries."""
        block = OpaqueBlock(format=self.wire_format, kind="compaction", data=dict(compaction.item))
        return Entry(
            id=f"cmp_{turn.split('-', 1)[-1]}",
            turn_id=turn,
            role="assistant",
            content=(block,),
            pinned=True,
            metadata={
                PROVIDER_COMPACTION_KEY: True,
                NATIVE_KEY: {"provider": self.provider, "replaced_ids": [e.id for e in replaced]},
            },
        )


def marker(turn: str) -> Entry:
    """The user note put before a compaction that would otherwise open the history."""
    return Entry(
        id=new_id(), turn_id=turn, role="user", content=MARKER_TEXT, metadata={MARKER_KEY: True}
    )
