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

A compaction on request (``ctx.force``) compacts whatever the trigger; its ``focus`` is
not sent (the endpoint takes no instructions), which meta says in ``focus_ignored``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from normandy_core import Content, Entry, OptionsError, TextBlock, new_id
from normandy_core.clients.base import ProviderCompaction
from normandy_core.conversation.keys import PROVIDER_REBUILT_KEY
from normandy_core.transcripts.formats import TranscriptError
from normandy_core.transcripts.transcript import read
from normandy_native import OPENAI_NATIVE
from normandy_native.common import (
    Cannot,
    NativeCompactor,
    Plan,
    ask_provider,
    client_of,
    marker,
)
from normandy_native.options import OpenAINativeOptions

if TYPE_CHECKING:
    from normandy_core import AgentConfig, CompactionContext, SurvivalRules

__all__ = [
    "NAME",
    "OpenAINative",
    "maybe_compact",
    "needs_window",
    "options_model",
    "requires_client",
    "validate_opts",
]

#: The name this compactor is registered under.
NAME = OPENAI_NATIVE


def _client(acc: AgentConfig) -> Any:
    client = client_of(acc, "openai", "OpenAIClient(..., api='responses')")
    if getattr(client, "api", None) != "responses":
        raise Cannot(
            "the client speaks Chat Completions, which cannot send a compaction item back; "
            "use OpenAIClient(..., api='responses')",
            "unsupported",
        )
    return client


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


def _sent_index(returned: Entry, sent: list[Entry], start: int) -> int | None:
    """The index (from ``start``) of the entry ``returned`` was sent as: the same role and
    content, and no tool results; ``None`` when there is none."""
    for index in range(start, len(sent)):
        candidate = sent[index]
        if (
            candidate.role == returned.role
            and not candidate.tool_results
            and _blocks(candidate.content) == _blocks(returned.content)
        ):
            return index
    return None


def _copied(returned: Entry, turn: str) -> Entry:
    """A returned message as a new entry of ``turn``, marked so the task rule never takes
    it for the task (the task stays after it)."""
    metadata = {**returned.metadata, PROVIDER_REBUILT_KEY: True}
    update = {"id": new_id(), "turn_id": turn, "parent_id": None, "metadata": metadata}
    return returned.model_copy(update=update)


class OpenAINative(NativeCompactor[OpenAINativeOptions]):
    """``openai_native``: OpenAI's ``/responses/compact``, through the config's
    ``OpenAIClient`` speaking the Responses API."""

    name = NAME
    provider = "openai"
    wire_format = "responses"
    options = OpenAINativeOptions
    takes_focus = False

    def check_rules(self, entry: str, rules: SurvivalRules) -> None:
        """Refuse ``summary_instructions``: the provider takes none."""
        if rules.summary_instructions is not None:
            raise OptionsError(
                f"{entry}: compactor {NAME!r} cannot honour survival rule "
                "'summary_instructions': /responses/compact takes no summarization prompt; "
                "use anthropic_native, or window_manager with strategy 'summarize', or drop "
                "summary_instructions"
            )

    def ask(
        self, acc: AgentConfig, ctx: CompactionContext, opts: OpenAINativeOptions, planned: Plan
    ) -> ProviderCompaction:
        """The compaction of what ``planned`` sends."""
        return ask_provider(
            _client(acc), acc.system_prompt, planned.sent(), opts.timeout, model=ctx.model
        )

    def rebuild(
        self, planned: Plan, compaction: ProviderCompaction, turn: str
    ) -> tuple[list[Entry], list[Entry]]:
        """The returned user messages and the pinned compaction item (see the module)."""
        sent = planned.sent()
        out: list[Entry] = []
        reused: set[str] = set()
        next_sent = 0  # the next sent entry a returned user message may be
        # A returned message is the very entry it was sent as, unless something the rules
        # keep follows the compaction: the entry would then come before the task it followed.
        reuse = not planned.kept
        for returned in _returned_users(compaction):
            hit = _sent_index(returned, sent, next_sent) if reuse else None
            if hit is None:
                out.append(_copied(returned, turn))
                continue
            out.append(sent[hit])  # the very entry: kept, not dropped
            reused.add(sent[hit].id)
            next_sent = hit + 1
        if not any(e.role != "system" for e in out):
            out.insert(0, marker(turn))
        replaced = [e for e in sent if e.id not in reused]
        out.append(self.compaction_entry(compaction, turn, replaced))
        return out, replaced


_COMPACTOR = OpenAINative()
# The entry point names this module: pluggy registers the hookimpls it finds here.
options_model = _COMPACTOR.options_model
needs_window = _COMPACTOR.needs_window
validate_opts = _COMPACTOR.validate_opts
requires_client = _COMPACTOR.requires_client
maybe_compact = _COMPACTOR.maybe_compact
