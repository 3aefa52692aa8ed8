"""The one seam between the core and its compactors: ``ctx``, the typed result, the check.

Everything that calls a compactor goes through this module: the boundary
(:func:`normandy_core.run_compaction`), compactors that run others (the ``pipeline``) and
the conformance kit (:mod:`normandy_core.testing`). They build ``ctx`` with
:func:`build_context`, call with :func:`call_compactor`, and get one verdict from
:func:`check_compaction`, so a plugin author certifies against exactly the rules the
runtime applies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from normandy_core.contract.config import AgentConfig
from normandy_core.contract.types import (
    SKIP,
    TOKEN_KEYS,
    CompactionContext,
    CompactionMeta,
    ContractViolation,
)
from normandy_core.conversation.cost import next_call_estimate, rates_for
from normandy_core.conversation.entries import Entry
from normandy_core.conversation.keys import PROVIDER_COMPACTION_KEY
from normandy_core.conversation.structure import pairing_problems

if TYPE_CHECKING:
    from normandy_core.contract.preparation import Prepared
    from normandy_core.conversation.calibration import Calibration
    from normandy_core.conversation.memory import AgentMemory
    from normandy_core.conversation.survival import SurvivalRules

__all__ = [
    "CompactionResult",
    "account",
    "build_context",
    "call_compactor",
    "check_compaction",
]

#: Config fields a compactor must return unchanged (it may only replace the memory).
_SETTINGS = (
    "model",
    "system_prompt",
    "tools",
    "compactor",
    "compactor_opts",
    "catalog",
    "survival",
)


def build_context(
    source: AgentConfig | Prepared,
    *,
    mid_round: bool,
    turn_id: str | None = None,
    model: str | None = None,
    prompt_tokens: int | None = None,
    calibration: Calibration | None = None,
    rules: SurvivalRules | None = None,
    force: bool = False,
    focus: str | None = None,
) -> CompactionContext:
    """The ``ctx`` of one call of a prepared compactor (window, counter and survival rules
    as prepared; :meth:`~normandy_core.Prepared.context`).

    ``source`` is a config (its prepared compactor, model and prompt tokens are used) or
    a :class:`~normandy_core.Prepared` (then give ``model`` and ``prompt_tokens``; a
    pipeline does for its steps). ``prompt_tokens`` reach the compactor only when it has
    a window (0 otherwise), with the counter's ``request_tokens`` added; ``calibration``
    overrides the prepared one (the turn shells pass their own); ``rules`` the prepared
    survival rules (a pipeline gives its steps its own); ``force`` and ``focus`` ask for
    a compaction now (:class:`~normandy_core.CompactionContext`; a compactor that calls
    others passes its own ``ctx.force`` and ``ctx.focus`` on).
    """
    if isinstance(source, AgentConfig):
        prepared = source.prepared
        model = source.model if model is None else model
        prompt_tokens = source.prompt_tokens if prompt_tokens is None else prompt_tokens
    else:
        prepared = source
    return prepared.context(
        mid_round=mid_round,
        model=model,
        prompt_tokens=prompt_tokens or 0,
        turn_id=turn_id,
        calibration=calibration,
        rules=rules,
        force=force,
        focus=focus,
    )


class CompactionResult(NamedTuple):
    """A checked compaction: unpacks as the contract's ``(acc, meta)`` pair.

    ``acc`` is the config to continue with (the input's on the skip and error paths) and
    ``meta`` the read-only :class:`CompactionMeta`.
    """

    acc: AgentConfig
    meta: CompactionMeta

    @property
    def compacted(self) -> bool:
        """Whether the compactor compacted."""
        return self.meta.compacted

    @property
    def dropped(self) -> tuple[Entry, ...]:
        """The removed entries, oldest first."""
        return self.meta.dropped

    @property
    def error(self) -> str | None:
        """The error of the error path, else ``None``."""
        return self.meta.error


def _describe(compactor: Any) -> str:
    describe = getattr(compactor, "describe", None)
    return str(describe()) if callable(describe) else f"compactor {compactor!r}"


def _same_settings(acc: AgentConfig, new_acc: AgentConfig) -> str | None:
    for name in _SETTINGS:
        a, b = getattr(acc, name), getattr(new_acc, name)
        if a is not b and a != b:
            return name
    return None


def _content_without_thinking(entry: Entry) -> object:
    return entry.without_thinking().content


def check_compaction(
    compactor: Any,
    acc: AgentConfig,
    ctx: CompactionContext,
    result: object,
) -> CompactionResult:
    """Check one ``maybe_compact`` result against the contract; the typed result, or raise.

    ``compactor`` names who returned it (a :class:`~normandy_core.Compactor` or a label).
    :raises ContractViolation: naming the compactor and the rule: not ``(AgentConfig,
        dict)``; no boolean ``compacted``; an ``error`` that is not text or comes with
        ``compacted`` true; a changed model, system prompt, tools, compactor or options; on
        the skip and error paths, ``dropped`` entries (the caller's ``acc`` is the result
        there, whatever came back, and an empty ``dropped`` is removed); token figures that
        are not non-negative ints; ``dropped`` that is not a list of entries of the input's
        active branch, once each, oldest first, equal to the originals (content and
        metadata); an entry listed in ``dropped`` that was kept unchanged; an entry that
        left the active branch or was rewritten (other than losing its thinking) without
        being listed (silent loss); a kept entry whose metadata differs from the
        original's without being listed; a
        tool use or result separated from its partner; an entry a survival rule keeps
        (``ctx.rules``) dropped or rewritten other than losing its thinking; a kept
        history that starts with an assistant message; thinking kept by a mid-round
        compaction.
    :raises normandy_core.SurvivalError: the ``keep_if`` predicate raised.
    """
    if _plain_skip(acc, result):
        # The common skip path, nothing to check. The full check gives the same verdict
        # (a property test says so).
        return CompactionResult(acc, SKIP)
    return _check(compactor, acc, ctx, result)


def _plain_skip(acc: AgentConfig, result: object) -> bool:
    """Whether ``result`` is exactly ``(acc, {"compacted": False})`` (``False`` itself:
    ``{"compacted": 0}`` compares equal, and the full check refuses it)."""
    return (
        type(result) is tuple
        and len(result) == 2
        and result[0] is acc
        and type(result[1]) is dict
        and len(result[1]) == 1
        and result[1].get("compacted") is False
    )


def _check(
    compactor: Any,
    acc: AgentConfig,
    ctx: CompactionContext,
    result: object,
) -> CompactionResult:
    """:func:`check_compaction` without its shortcut for the plain skip path."""
    who = _describe(compactor)

    def refuse(rule: str) -> NoReturn:
        raise ContractViolation(f"{who} {rule}")

    if not (isinstance(result, tuple) and len(result) == 2):
        refuse(f"returned {type(result).__name__}, not (acc, meta)")
    new_acc, raw_meta = result
    if not isinstance(new_acc, AgentConfig):
        refuse(f"returned acc of type {type(new_acc).__name__}, not AgentConfig")
    if not isinstance(raw_meta, Mapping) or not isinstance(raw_meta.get("compacted"), bool):
        refuse(f"returned meta without a boolean 'compacted': {raw_meta!r:.200}")
    meta = dict(raw_meta)
    if (changed := _same_settings(acc, new_acc)) is not None:
        refuse(f"changed the config's {changed!r}; a compactor may only replace the memory")
    _check_meta_fields(refuse, meta)
    dropped = meta.get("dropped")
    if not meta["compacted"]:
        if dropped:
            refuse("reported dropped entries with compacted=False")
        meta.pop("dropped", None)  # an empty list says the same as no key
        # Nothing was compacted, so whatever memory came back is ignored: the caller's
        # acc is the result and nothing can be lost.
        return CompactionResult(acc, CompactionMeta(meta))

    old = acc.memory.entries()
    new = new_acc.memory.entries()
    listed = tuple(dropped or ())
    _check_dropped(refuse, old, new, listed)
    _check_rules(refuse, ctx.rules, old, new)
    if not pairing_problems(old) and (problems := pairing_problems(new)):
        refuse("separated a tool use from its result: " + "; ".join(problems[:3]))
    if ctx.mid_round and (thinking := _thinking_after_a_change(old, new)):
        refuse(f"compacted mid-round but kept thinking blocks (entries {thinking[:3]})")
    if _starts_with_assistant(new) and not _starts_with_assistant(old):
        refuse(
            "left a kept history that starts with an assistant message, which providers "
            "refuse; insert a user marker before it"
        )
    meta["dropped"] = listed
    return CompactionResult(new_acc, CompactionMeta(meta))


def _thinking_after_a_change(old: list[Entry], new: list[Entry]) -> list[str]:
    """The ids of the kept entries with thinking that something before them changed.

    Replayed thinking is checked against what came before it: a change after the last
    thinking block (a tool result rewritten as it arrives) leaves every block valid."""
    last = max((i for i, e in enumerate(new) if e.has_thinking), default=-1)
    if last < 0:
        return []
    unchanged = len(old) > last and all(
        a is b or (a.id == b.id and _same_content(a, b))
        for a, b in zip(old[: last + 1], new[: last + 1], strict=True)
    )
    return [] if unchanged else [e.id for e in new if e.has_thinking]


def _check_meta_fields(refuse: Callable[[str], NoReturn], meta: Mapping[str, Any]) -> None:
    """Token figures are non-negative ints, ``dropped`` a list, an error text and only on
    the error path."""
    for key in TOKEN_KEYS:
        value = meta.get(key)
        if value is not None and not (
            isinstance(value, int) and not isinstance(value, bool) and value >= 0
        ):
            refuse(f"returned meta[{key!r}] = {value!r}, not a non-negative int")
    dropped = meta.get("dropped")
    if dropped is not None and not isinstance(dropped, (list, tuple)):
        refuse(f"returned 'dropped' of type {type(dropped).__name__}, not a list")
    if "error" in meta:
        if meta["compacted"]:
            refuse(f"reported an error while compacted=True: {meta['error']!r:.200}")
        if not isinstance(meta["error"], str):
            refuse(f"returned an error that is not text: {meta['error']!r:.200}")


def _starts_with_assistant(entries: Sequence[Entry]) -> bool:
    first = next((e for e in entries if e.role != "system"), None)
    return first is not None and first.role == "assistant"


#: How to let go what a default rule keeps, for the refusal naming that rule.
_LET_GO = {
    "keep_first_user": " (survival={'keep_first_user': False} lets the task go)",
    "keep_current_request": (
        " (survival={'keep_current_request': False} lets the current request go)"
    ),
}


def _check_rules(
    refuse: Callable[[str], NoReturn], rules: SurvivalRules, old: list[Entry], new: list[Entry]
) -> None:
    """Every entry the rules keep in ``old`` is in ``new``, unchanged but for its thinking.

    The pin of a provider compaction moves: a pinned provider compaction (metadata
    ``normandy.provider_compaction``) may go when ``new`` holds a provider compaction
    ``old`` did not, which summarizes it (and which a later request starts from).
    """
    protected = rules.protected(old)
    if not protected:
        return
    now = {e.id: e for e in new}
    known = {e.id for e in old}
    superseded = any(e.metadata.get(PROVIDER_COMPACTION_KEY) and e.id not in known for e in new)
    for e in old:
        rule = protected.get(e.id)
        if rule is None:
            continue
        if superseded and rule == "pinned" and e.metadata.get(PROVIDER_COMPACTION_KEY):
            continue
        kept = now.get(e.id)
        if kept is None:
            what = "dropped"
        elif kept.content is e.content or (
            _content_without_thinking(kept) == _content_without_thinking(e)
        ):
            continue
        else:
            what = "rewrote"
        refuse(
            f"{what} entry {e.id!r} ({e.role}), which survival rule {rules.describe(rule)} "
            "keeps; a compactor keeps it unchanged, refuses the rule where the config is "
            "made, or returns the error path" + _LET_GO.get(rule, "")
        )


def _check_dropped(
    refuse: Callable[[str], NoReturn], old: list[Entry], new: list[Entry], listed: tuple[Any, ...]
) -> None:
    position = {e.id: i for i, e in enumerate(old)}
    now = {e.id: e for e in new}
    reported: set[str] = set()
    last = -1
    for item in listed:
        if not isinstance(item, Entry):
            refuse(f"reported a 'dropped' item of type {type(item).__name__}, not an Entry")
        i = position.get(item.id)
        if i is None:
            refuse(
                f"reported dropped entry {item.id!r}, which is not on the active branch "
                "it was given"
            )
        if i <= last:
            refuse(f"reported 'dropped' not oldest first without repeats (at {item.id!r})")
        original = old[i]
        if item is not original and item != original:
            what = "metadata" if _same_content(item, original) else "content"
            refuse(f"reported dropped entry {item.id!r} with {what} other than it had")
        kept = now.get(item.id)
        if kept is not None and _same_content(kept, original) and _same_metadata(kept, original):
            refuse(f"reported dropped entry {item.id!r}, which it kept unchanged")
        reported.add(item.id)
        last = i
    lost: list[str] = []
    remarked: list[str] = []
    for e in old:
        if e.id in reported:
            continue
        kept = now.get(e.id)
        if kept is None or not (
            _same_content(kept, e)
            or _content_without_thinking(kept) == _content_without_thinking(e)
        ):
            lost.append(e.id)
        elif not _same_metadata(kept, e):
            remarked.append(e.id)
    if lost:
        refuse(
            f"removed or rewrote {_entries(lost)} without reporting them in 'dropped' "
            f"(lost silently): {lost[:5]}"
        )
    if remarked:
        refuse(
            f"changed the metadata of {_entries(remarked)} it kept, without reporting them "
            f"in 'dropped': {remarked[:5]}; a kept entry stays as it was, or its original "
            "is reported in 'dropped'"
        )


def _same_content(kept: Entry, original: Entry) -> bool:
    return kept.content is original.content or kept.content == original.content


def _same_metadata(kept: Entry, original: Entry) -> bool:
    return kept.metadata is original.metadata or kept.metadata == original.metadata


def _entries(ids: Sequence[str]) -> str:
    return f"{len(ids)} entr{'y' if len(ids) == 1 else 'ies'}"


def call_compactor(
    compactor: Any, acc: AgentConfig, ctx: CompactionContext, opts: Any
) -> CompactionResult:
    """Call ``compactor.maybe_compact(acc, ctx, opts)`` and check what it did and returned.

    The memory it was given is restored when the compactor appended to it (also when it
    then raised), and so is an entry it changed in place (``object.__setattr__`` gets
    past a frozen model) when it raised or returned anything but the plain skip: the
    memory finds such a change (:meth:`~normandy_core.AgentMemory.undo_changes_in_place`)
    by a walk of the conversation, made where the result is checked in full, so not at
    a boundary that skips. Exceptions of the compactor propagate unchanged
    (``BaseException`` included); callers decide what they become.

    :raises ContractViolation: the compactor mutated its input (naming the entries it
        changed in place), or :func:`check_compaction` refused its result.
    """
    memory = acc.memory
    snapshot = memory.state()
    try:
        raw = compactor.maybe_compact(acc, ctx, opts)
    except BaseException:
        memory.restore(snapshot)
        memory.undo_changes_in_place()
        if acc.memory is not memory:
            object.__setattr__(acc, "memory", memory)
        raise
    if memory.state() != snapshot:
        memory.restore(snapshot)
        raise ContractViolation(
            f"{_describe(compactor)} mutated the memory it was given (restored)"
        )
    if acc.memory is not memory:
        object.__setattr__(acc, "memory", memory)
        raise ContractViolation(
            f"{_describe(compactor)} replaced the memory of the config it was given (restored)"
        )
    if not _plain_skip(acc, raw) and (changed := memory.undo_changes_in_place()):
        listed = "; ".join(
            f"entry {eid!r} (its {', '.join(names)})" for eid, names in list(changed.items())[:5]
        )
        raise ContractViolation(
            f"{_describe(compactor)} changed {_entries(list(changed))} in place, which "
            f"entries never are (put back): {listed}"
        )
    return check_compaction(compactor, acc, ctx, raw)


def account(
    result: CompactionResult, before: AgentMemory, ctx: CompactionContext
) -> CompactionResult:
    """``result`` with the token figures every compactor shares, computed by the core.

    On a compaction: ``tokens_before`` and ``tokens_after`` (whole active branch) and
    ``tokens_removed`` (the running turn's messages: their count before minus what is left
    of them after), all with ``ctx.counter``; and the next call's estimated billed input
    with prompt caching, ``billed_next_without`` and ``billed_next_with``, with the cached
    tokens the compaction keeps, ``cache_kept_tokens`` (:mod:`normandy_core.conversation.cost`);
    and ``thinking_stripped``, whether an entry it kept lost its thinking blocks (the
    compactor's own value is replaced, as the token figures are). Other results are
    returned as they are.
    """
    if not result.meta.compacted:
        return result
    counter = ctx.counter
    after = result.acc.memory
    old = before.entries()
    turn = ctx.turn_id if ctx.turn_id is not None else (old[-1].turn_id if old else None)
    removed = 0
    for e in old:
        if e.turn_id != turn:
            continue
        was = counter.entry_tokens(before, e)
        kept = after.get(e.id)
        removed += was - (counter.entry_tokens(after, kept) if kept is not None else 0)
    meta = result.meta.replace(
        tokens_before=counter.memory_tokens(before),
        tokens_after=counter.memory_tokens(after),
        tokens_removed=max(removed, 0),
        thinking_stripped=_stripped_thinking(old, after),
        **_billed_next(result, before, ctx),
    )
    return CompactionResult(result.acc, meta)


def _stripped_thinking(old: Sequence[Entry], after: AgentMemory) -> bool:
    """Whether an entry of ``old`` with thinking blocks is kept in ``after`` without them
    (mid-round, the model then finishes its round with thinking disabled)."""
    for e in old:
        if e.has_thinking:
            kept = after.get(e.id)
            if kept is not None and not kept.has_thinking:
                return True
    return False


def _billed_next(
    result: CompactionResult, before: AgentMemory, ctx: CompactionContext
) -> dict[str, int]:
    """The next call's billed input with and without the compaction
    (``normandy_core.conversation.cost``)."""
    acc = result.acc
    prompt = ctx.prompt_tokens or acc.prompt_tokens + ctx.counter.request_tokens
    rates = rates_for(acc.catalog, ctx.model)
    return next_call_estimate(before, acc.memory, ctx.counter, prompt, rates).as_meta()
