"""What a turn produced: :class:`TurnResult`, or :class:`TurnAborted` when its model client
failed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from normandy_core.clients.base import Usage
from normandy_core.contract.config import AgentConfig
from normandy_core.conversation.entries import Entry
from normandy_core.turn.core import Budget, FinishReason, TurnError, TurnState

__all__ = ["TurnAborted", "TurnResult"]


class TurnAborted(TurnError):
    """The model client failed mid-turn. ``acc`` and ``events`` hold the turn so far (the
    config given to the turn is unchanged)."""

    def __init__(self, message: str, acc: AgentConfig, events: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.acc = acc
        self.events = events


@dataclass
class TurnResult:
    """What a turn produced.

    ``text`` is the final answer; ``acc`` the agent config after the turn (its memory
    holds the turn's messages, compacted where a boundary compacted; the config given
    to the turn is never changed); ``events`` everything the turn reported, in order;
    ``usage`` the provider-reported tokens summed over the turn's calls; ``budget`` the
    task budget at the end (``None`` without one); ``reason`` why the turn ended;
    ``boundaries`` the meta of each of the turn's boundaries, in order (with the dropped
    entries in full, and ``tokens_before`` and ``tokens_after`` on every one).

    The typed fields sum up the turn's boundaries and are always there, as on
    :class:`~normandy_core.CompactResult`: :attr:`compacted`, :attr:`tokens_before`,
    :attr:`tokens_after`, :attr:`tokens_removed`, :attr:`dropped`, :attr:`error`,
    :attr:`archive`, :attr:`thinking_stripped` and :attr:`thinking_disabled_calls`.
    """

    text: str
    acc: AgentConfig
    turn_id: str
    reason: FinishReason
    events: list[dict[str, Any]] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    budget: Budget | None = None
    state: TurnState | None = None
    boundaries: list[Mapping[str, Any]] = field(default_factory=list)

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        """The events whose ``type`` is ``kind``."""
        return [event for event in self.events if event.get("type") == kind]

    @property
    def thinking_disabled_calls(self) -> int:
        """How many of the turn's model calls were sent with thinking disabled (the rest of
        a round whose thinking a mid-round compaction stripped; ``thinking_disabled``
        events)."""
        return len(self.events_of("thinking_disabled"))

    @property
    def thinking_stripped(self) -> bool:
        """Whether a compaction of the turn stripped the thinking of messages it kept (its
        meta's ``thinking_stripped``)."""
        return any(bool(meta.get("thinking_stripped")) for meta in self.boundaries)

    @property
    def compacted(self) -> bool:
        """Whether any boundary of the turn compacted."""
        return any(bool(meta.get("compacted")) for meta in self.boundaries)

    @property
    def tokens_before(self) -> int:
        """Tokens of the conversation at the turn's first boundary, before it compacted (the
        history and the user's message), counted with the compactor's counter."""
        return int(self.boundaries[0].get("tokens_before") or 0) if self.boundaries else 0

    @property
    def tokens_after(self) -> int:
        """Tokens of the conversation after the turn's last boundary: what its last model
        call was sent (without the system prompt and tools), before the final reply."""
        return int(self.boundaries[-1].get("tokens_after") or 0) if self.boundaries else 0

    @property
    def tokens_removed(self) -> int:
        """Tokens of this turn's messages its compactions removed, summed (they stay
        counted as spent in the task budget)."""
        return sum(int(meta.get("tokens_removed") or 0) for meta in self.boundaries)

    @property
    def dropped(self) -> list[Entry]:
        """Every entry the turn's compactions removed, in the order they were dropped."""
        return [entry for meta in self.boundaries for entry in (meta.get("dropped") or ())]

    @property
    def error(self) -> str | None:
        """The first error a boundary of the turn reported (that boundary left the
        conversation as it was), else ``None``."""
        for meta in self.boundaries:
            if meta.get("error") is not None:
                return str(meta["error"])
        return None

    @property
    def archive(self) -> Mapping[str, Any] | None:
        """The ``archive`` hook plugin's note of the turn's last compaction it recorded
        (where the dropped entries went), else ``None``."""
        found = None
        for meta in self.boundaries:
            for item in meta.get("hook_notes") or ():
                name = str(item.get("hook", ""))
                if name.rsplit(":", 1)[-1].split("@", 1)[0] == "archive":
                    found = item.get("note")
        return found
