"""What :func:`normandy_core.compact` returns, and the errors it raises when it has no
transcript fit to send.

Below both ways a compaction is run (:mod:`~normandy_core.transcripts.facade` reads a
whole transcript, :mod:`~normandy_core.transcripts.continuation` only what a growing list
added), so each makes its :class:`CompactResult` and checks its tool pairs here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from normandy_core.contract.types import CompactionMeta
from normandy_core.conversation.entries import Entry
from normandy_core.conversation.memory import AgentMemory
from normandy_core.conversation.structure import pairing_problems
from normandy_core.errors import NormandyError

if TYPE_CHECKING:
    from normandy_core.contract.config import AgentConfig

__all__ = [
    "CannotFitError",
    "CompactResult",
    "CompactionError",
    "check_pairs",
    "compact_result",
]


class CompactionError(NormandyError):
    """:func:`~normandy_core.compact` has no transcript fit to send.

    Raised itself when a compactor returned a conversation a provider would reject (tool
    pairs broken): it is refused, never returned; the message names the compactor and
    each problem. :class:`CannotFitError` is the compactor's own error, on request.
    """


class CannotFitError(CompactionError):
    """The compactor reported an error, so the transcript came back unchanged and may not
    fit the window (``window_manager``'s "cannot fit the context window", a compactor
    that raised or timed out, an archive that refused the compaction...), or it compacted
    but the result is still over the window (meta ``target_met`` false, the reason in
    ``target_missed``: ``result.messages`` are then the compacted ones).

    Raised by :meth:`CompactResult.check` and by ``compact(..., raise_on_error=True)``;
    the message names the compactor and its error. ``result`` is the
    :class:`CompactResult` (its ``messages`` are the input, unchanged).
    """

    def __init__(self, result: CompactResult) -> None:
        self.result = result
        who = result.compactor or "the compactor"
        if result.error is None:
            super().__init__(
                f"{who} compacted the transcript but could not bring it under the window "
                f"(target_met False): {result.target_missed}"
            )
            return
        super().__init__(
            f"{who} could not compact the transcript, which is returned unchanged and may "
            f"not fit the window: {result.error}"
        )


@dataclass(frozen=True)
class CompactResult:
    """What :func:`~normandy_core.compact` returns.

    ``messages``: the transcript in the format and shape it was given (a list, or a dict
    with ``messages`` and, for Anthropic, ``system``). ``meta``: the compactor's meta as
    the boundary checked it (``compacted``, the token figures of a compaction,
    ``strategy``, ``dropped``...). ``memory``: the compacted conversation.
    ``continued``: the list extended one an earlier call compacted, and was compacted as
    its continuation (:mod:`normandy_core.transcripts.continuation`): earlier cuts are kept and
    ``meta`` reports only what this call did.

    The typed fields are always there, whatever happened: :attr:`compacted`,
    :attr:`tokens_before`, :attr:`tokens_after`, :attr:`tokens_removed` (ints),
    :attr:`dropped` (a list), :attr:`error` and :attr:`archive` (``None`` when there is
    none), :attr:`compactor` (the compactor that ran, described) and :meth:`figures`
    (all of it as JSON). :meth:`check` raises :class:`CannotFitError` for an error result.
    """

    messages: Any
    meta: CompactionMeta
    format: str
    memory: AgentMemory = field(repr=False)
    continued: bool = False
    #: The compactor that ran, described (``compactor 'x' (group ...) from dist 1.0``).
    compactor: str | None = field(default=None, repr=False, compare=False)
    #: The counter the boundary sized with (``ctx.counter``), for the figures of a result
    #: that did not compact.
    _counter: Any = field(default=None, repr=False, compare=False)
    _counted: list[int] = field(default_factory=list, repr=False, compare=False)

    @property
    def compacted(self) -> bool:
        """Whether the compactor compacted."""
        return bool(self.meta.get("compacted"))

    def figures(self) -> dict[str, Any]:
        """The compaction's figures, JSON-ready: the compactor, its strategy, the token
        counts, the dropped entries' ids and the hooks' notes (what the framework
        adapters put in their events and spans)."""
        return {
            "compactor": self.compactor,
            "strategy": self.meta.get("strategy"),
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "tokens_removed": self.tokens_removed,
            "dropped": [e.id for e in self.dropped],
            "notes": [dict(n) for n in self.notes],
        }

    def _count(self) -> int:
        """Tokens of :attr:`memory`'s active branch, with the boundary's counter (cached:
        the memory keeps its counts, so this is free once the compactor has counted)."""
        if not self._counted:
            counter = self._counter
            if counter is None:
                from normandy_core.conversation.calibration import CalibratedCounter

                counter = CalibratedCounter(None, None)
            self._counted.append(int(counter.memory_tokens(self.memory)))
        return self._counted[0]

    @property
    def tokens_before(self) -> int:
        """Tokens of the conversation the compactor was given (the boundary's count with the
        compactor's counter, ``ctx.counter``). When nothing was compacted it equals
        :attr:`tokens_after`: the input's count."""
        value = self.meta.tokens_before
        return value if value is not None else self._count()

    @property
    def tokens_after(self) -> int:
        """Tokens of the conversation returned (:attr:`memory`), with the same counter."""
        value = self.meta.tokens_after
        return value if value is not None else self._count()

    @property
    def tokens_removed(self) -> int:
        """Tokens of the running turn's messages that compaction removed (the newest
        message's turn outside a turn loop); 0 when nothing was compacted."""
        value = self.meta.tokens_removed
        return value if value is not None else 0

    @property
    def dropped(self) -> list[Entry]:
        """The removed entries, oldest first (empty when nothing was removed)."""
        return list(self.meta.dropped)

    @property
    def error(self) -> str | None:
        """The compactor's error (the input is then returned unchanged), else ``None``."""
        err = self.meta.get("error")
        return None if err is None else str(err)

    @property
    def target_missed(self) -> str | None:
        """Why the compacted transcript is still over the window (meta ``target_missed``:
        the compactor compacted, but not enough), else ``None``."""
        missed = self.meta.get("target_missed")
        return None if missed is None else str(missed)

    @property
    def archive(self) -> Mapping[str, Any] | None:
        """The note of the ``archive`` hook plugin (``path``, ``session``, ``entries``,
        ``message``...): where the dropped entries went; ``None`` when nothing was
        archived (nothing dropped, or no archive installed)."""
        return self.note("archive")

    def check(self) -> CompactResult:
        """This result, or :class:`CannotFitError` when the compactor reported an error
        (the transcript is then the input, unchanged, and may not fit the window) or
        compacted without bringing the transcript under the window (``target_missed``)."""
        if self.error is not None or self.target_missed is not None:
            raise CannotFitError(self)
        return self

    @property
    def notes(self) -> tuple[Mapping[str, Any], ...]:
        """What the hook plugins said they did with the dropped entries, in the order they
        ran: one ``{"hook", "plugin", "note"}`` per note (``meta["hook_notes"]``). An
        archive's note says where the dropped content went."""
        return self.meta.hook_notes

    def note(self, hook: str) -> Mapping[str, Any] | None:
        """The last note of the hook plugin ``hook`` (its name, bare or qualified, such as
        ``"archive"`` or ``"normandy_core.hooks:archive"``), or ``None``."""
        found = None
        for item in self.notes:
            name = str(item.get("hook", ""))
            if name == hook or name.rsplit(":", 1)[-1].split("@", 1)[0] == hook:
                found = item.get("note")
        return found


def compact_result(
    acc: AgentConfig,
    messages: Any,
    meta: CompactionMeta,
    fmt: str,
    memory: AgentMemory,
    *,
    continued: bool = False,
) -> CompactResult:
    """The result of a compaction run with the prepared ``acc``: it names the compactor,
    and sizes a result that did not compact with the counter its boundary used
    (``ctx.counter``)."""
    return CompactResult(
        messages,
        meta,
        fmt,
        memory,
        continued=continued,
        compactor=acc.compactor_handle.describe(),
        _counter=acc.prepared.counter_for(acc.model),
    )


def check_pairs(acc: AgentConfig, memory: AgentMemory) -> None:
    """Refuse a compacted conversation with broken tool pairs, naming the compactor.

    The boundary's contract check refuses broken pairs when the input had none; the input
    may hold an open round, which that check leaves to the transcript rules.
    """
    problems = pairing_problems(memory.entries(), allow_pending=True)
    if problems:
        raise CompactionError(
            f"{acc.compactor_handle.describe()} returned a conversation with broken tool "
            "pairs: " + "; ".join(problems)
        )
