"""The ``openai_native`` compactor: OpenAI's ``/responses/compact``, as hookimpls.

The provider is sent what :func:`normandy_native.common.plan` summarizes (through
``OpenAIClient.compact_conversation``, which needs the Responses API since only it can
send the compaction item back). It answers with the conversation's user messages and
one ``compaction`` item: a user message it returns as it was sent keeps its entry (id
and all) when no entry a survival rule keeps follows; the others, and everything else it
was sent, are replaced and reported in ``dropped`` (a returned message kept as a new
entry is marked ``normandy.provider_rebuilt``, so the task rule never takes it for the
task). The compaction item is a pinned assistant entry of its own; what the survival
rules keep follows it, unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from normandy_core import Content, Entry, OpaqueBlock, OptionsError, TextBlock, hookimpl, new_id
from normandy_core.clients.base import ProviderCompaction
from normandy_core.conversation.keys import PROVIDER_COMPACTION_KEY
from normandy_core.conversation.survival import PROVIDER_REBUILT_KEY
from normandy_core.transcripts.formats import TranscriptError
from normandy_core.transcripts.transcript import read
from normandy_native import OPENAI_NATIVE
from normandy_native.common import (
    NATIVE_KEY,
    Cannot,
    Plan,
    ask_provider,
    check_reserve,
    client_of,
    compact_with_provider,
    marker,
    prepare_fallback,
)
from normandy_native.options import OpenAINativeOptions

if TYPE_CHECKING:
    from normandy_core import AgentConfig, CompactionContext, SurvivalRules

__all__ = ["NAME", "maybe_compact", "needs_window", "options_model", "validate_opts"]

#: The name this compactor is registered under.
NAME = OPENAI_NATIVE


@hookimpl
def options_model() -> type[OpenAINativeOptions]:
    """The options are :class:`~normandy_native.options.OpenAINativeOptions`."""
    return OpenAINativeOptions


@hookimpl
def needs_window(opts: OpenAINativeOptions) -> bool:
    """Sizes against the window: it caps the trigger and decides mid-round."""
    return True


@hookimpl
def validate_opts(
    opts: OpenAINativeOptions, entry: str, window: int | None, rules: SurvivalRules
) -> None:
    """Refuse a window the reserve fills and ``summary_instructions`` (the provider takes
    none), and prepare the fallback with the same window and survival rules."""
    check_reserve(opts, window)
    if rules.summary_instructions is not None:
        raise OptionsError(
            f"{entry}: compactor {NAME!r} cannot honour survival rule 'summary_instructions': "
            "/responses/compact takes no summarization prompt; use anthropic_native, or "
            "window_manager with strategy 'summarize', or drop summary_instructions"
        )
    prepare_fallback(opts, NAME, entry, window, rules)


def _client(acc: AgentConfig) -> Any:
    client = client_of(acc, "openai", "OpenAIClient(..., api='responses')")
    if getattr(client, "api", None) != "responses":
        raise Cannot(
            "the client speaks Chat Completions, which cannot send a compaction item back; "
            "use OpenAIClient(..., api='responses')",
            "unsupported",
        )
    return client


def _ask(
    acc: AgentConfig, ctx: CompactionContext, opts: OpenAINativeOptions, p: Plan
) -> ProviderCompaction:
    return ask_provider(_client(acc), acc.system_prompt, p.sent(), opts.timeout, model=ctx.model)


def _blocks(content: Content) -> tuple[Any, ...]:
    return (TextBlock(text=content),) if isinstance(content, str) else tuple(content)


def _returned_users(compaction: ProviderCompaction) -> list[Entry]:
    """The user messages the provider returned, read as entries."""
    if not compaction.kept:
        return []
    try:
        read_back = read(list(compaction.kept), "responses").memory.entries()
    except TranscriptError as exc:
        raise Cannot(f"the provider returned items this version cannot read: {exc}") from exc
    return read_back


def _rebuild(p: Plan, compaction: ProviderCompaction, turn: str) -> tuple[list[Entry], list[Entry]]:
    sent = p.sent()
    returned = _returned_users(compaction)
    out: list[Entry] = []
    reused: set[str] = set()
    k = 0  # the next sent entry a returned user message may be
    # A returned message is the very entry it was sent as, unless something the rules
    # keep follows the compaction: the entry would then come before the task it followed.
    reuse = not p.kept
    for r in returned:
        hit = None
        for j in range(k, len(sent) if reuse else 0):
            e = sent[j]
            if e.role == r.role and not e.tool_results and _blocks(e.content) == _blocks(r.content):
                hit = j
                break
        if hit is not None:
            out.append(sent[hit])  # the very entry: kept, not dropped
            reused.add(sent[hit].id)
            k = hit + 1
        else:
            # a copy the task rule must not take for the task (the task stays after it)
            out.append(
                r.model_copy(
                    update={
                        "id": new_id(),
                        "turn_id": turn,
                        "parent_id": None,
                        "metadata": {**r.metadata, PROVIDER_REBUILT_KEY: True},
                    }
                )
            )
    if not any(e.role != "system" for e in out):
        out.insert(0, marker(turn))
    block = OpaqueBlock(format="responses", kind="compaction", data=dict(compaction.item))
    out.append(
        Entry(
            id=f"cmp_{turn.split('-', 1)[-1]}",
            turn_id=turn,
            role="assistant",
            content=(block,),
            pinned=True,
            metadata={
                PROVIDER_COMPACTION_KEY: True,
                NATIVE_KEY: {
                    "provider": "openai",
                    "replaced_ids": [e.id for e in sent if e.id not in reused],
                },
            },
        )
    )
    return out, [e for e in sent if e.id not in reused]


@hookimpl
def maybe_compact(
    acc: AgentConfig, ctx: CompactionContext, opts: OpenAINativeOptions
) -> tuple[AgentConfig, dict[str, Any]]:
    """Over the trigger, have OpenAI compact the conversation; see the module docs."""
    return compact_with_provider(
        acc,
        ctx,
        opts,
        NAME,
        "openai",
        lambda p: _ask(acc, ctx, opts, p),
        _rebuild,
    )
