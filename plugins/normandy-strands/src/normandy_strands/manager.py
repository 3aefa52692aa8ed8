"""``NormandyConversationManager``: a Strands conversation manager backed by a Normandy
compactor chosen by name.

Installed with one line, ``Agent(model, tools, conversation_manager=
NormandyConversationManager("window_manager", window=32_000))``, it compacts
``agent.messages`` in place:

- before every model call (a ``BeforeModelCallEvent`` hook, run off the event loop in a
  worker thread), so no request the model receives exceeds the window, in the middle of
  a long tool loop too;
- after each invocation (``apply_management``), as every Strands manager does;
- on a context-window overflow (``reduce_context`` with the error), as deep as the
  compactor goes (``force``); Strands then retries the call. When nothing can be removed
  it raises Strands' own ``ContextWindowOverflowException``.

Kept messages are the agent's own dicts; a ``toolUse`` is never separated from its
``toolResult``; dropped messages reach the ``after_compact`` hooks.

``removed_message_count`` keeps the meaning Strands' session managers give it: how many
of the conversation's stored messages, from the first, are not restored from storage.
With a cut that keeps nothing ahead of it, that is the number of messages removed, as in
``SlidingWindowConversationManager``; ``window_manager`` keeps the task (the first user
message) and a marker ahead of its cut, so the count also covers the task, which
:meth:`get_state` carries with the marker (``head``) and :meth:`restore_from_session`
returns to go ahead of the stored messages, as ``SummarizingConversationManager`` does
with its summary. A marker or summary the compactor created is never counted.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import TYPE_CHECKING, Any

from strands.agent.conversation_manager import ConversationManager
from strands.hooks import BeforeModelCallEvent, HookRegistry
from strands.types.content import Message
from strands.types.exceptions import ContextWindowOverflowException

from normandy_core.contract.eventloop import bind_turn_loop
from normandy_core.transcripts.adapter import AdapterSeam
from normandy_strands.compaction import MessageCompactor, StrandsCompaction
from normandy_strands.reading import is_created

if TYPE_CHECKING:
    from strands.agent.agent import Agent

__all__ = ["MANAGER_ENTRY", "NormandyConversationManager"]

logger = logging.getLogger("normandy_strands")

#: The entry point named in the option errors of :class:`NormandyConversationManager`.
MANAGER_ENTRY = "normandy_strands.NormandyConversationManager()"


class NormandyConversationManager(AdapterSeam[StrandsCompaction], ConversationManager):
    """A Strands conversation manager that compacts with a named Normandy compactor.

    ``compactor`` is the entry-point name (``window_manager`` when neither given nor
    configured), ``opts`` its options: both validated here, when the manager is built, so
    a bad option raises :class:`~normandy_core.OptionsError` naming this class and the
    compactor, and an unknown name :class:`~normandy_core.UnknownCompactorError`.
    ``window`` pins the context window in tokens (or ``model`` names a model the catalog
    knows); ``timeout`` bounds the compactor's time. ``on_compact`` is called with the
    :class:`~normandy_strands.StrandsCompaction` of each compaction, which is also logged
    (logger ``normandy_strands``, INFO). A compactor error (the conversation cannot fit)
    leaves the messages unchanged and is logged as a warning by the core; with
    ``raise_on_error=True`` it raises :class:`~normandy_core.CannotFitError`.
    """

    compactor_class = MessageCompactor
    entry = MANAGER_ENTRY
    compactor: MessageCompactor

    def _start(self) -> None:
        # The messages kept ahead of the stored run (the task, markers) as of the last
        # compaction: a session manager restores agent.messages as these followed by the
        # stored messages from removed_message_count on.
        self._head: list[Message] = []

    def get_state(self) -> dict[str, Any]:
        """Strands' state (``removed_message_count``) and the messages kept ahead of the
        stored ones (``head``), JSON-ready, for a session manager to save."""
        return {**super().get_state(), "head": copy.deepcopy(self._head)}

    def restore_from_session(self, state: dict[str, Any]) -> list[Message] | None:
        """Take back ``state`` (:meth:`get_state`'s) and return the messages to put ahead
        of the stored ones: the task and the markers kept ahead of the cut."""
        super().restore_from_session(state)
        self._head = list(state.get("head") or [])
        return list(self._head) or None

    def _follow(self, done: StrandsCompaction, given: int) -> None:
        """Move ``removed_message_count`` and the head past what the compaction ``done``
        of ``given`` messages took out of the stored run: removed, or kept ahead of the
        cut (the newest removal), so the run resumes at its first message after it."""
        start = len(self._head)  # where the stored run begins in the input
        cut = max([start - 1, *done.gone]) + 1
        k = len(done.messages)
        while k and not is_created(done.messages[k - 1]):
            source = done.sources[k - 1]
            if source is None or source < cut:
                break
            k -= 1
        first = done.sources[k] if k < len(done.messages) else None
        self.removed_message_count += (given if first is None else first) - start
        self._head = done.messages[:k]

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        """Register Strands' own hooks and the compaction before every model call."""
        super().register_hooks(registry, **kwargs)
        registry.add_callback(BeforeModelCallEvent, self._before_model_call)

    async def _before_model_call(self, event: BeforeModelCallEvent) -> None:
        # Off the event loop: counting, a model summary or the archive's writes would
        # otherwise hold up every other task; a coroutine the compactor needs (an async
        # client's summary) runs back on this loop.
        with bind_turn_loop(asyncio.get_running_loop()):
            await asyncio.to_thread(self.compact_agent, event.agent)

    def compact_agent(self, agent: Agent, *, force: bool = False) -> StrandsCompaction:
        """Compact ``agent.messages`` in place (the same list object) and return what was
        done; ``force`` compacts as deep as the compactor goes."""
        done = self.compactor.run(
            agent.messages,
            system_prompt=agent.system_prompt,
            tool_specs=agent.tool_registry.get_all_tool_specs(),
            force=force,
        )
        done = self._reported(self._checked(done))
        if done.compacted:
            self._follow(done, len(agent.messages))
            agent.messages[:] = done.messages
        return done

    def apply_management(self, agent: Agent, **kwargs: Any) -> None:
        """Compact ``agent.messages`` when the compactor says so (Strands calls this after
        each invocation)."""
        self.compact_agent(agent)

    def reduce_context(self, agent: Agent, e: Exception | None = None, **kwargs: Any) -> None:
        """Compact ``agent.messages`` as deep as the compactor goes, so Strands can retry
        the call that overflowed (``e``). Raises Strands'
        ``ContextWindowOverflowException`` when ``e`` is given and nothing could be
        removed; without ``e`` that is only logged."""
        done = self.compact_agent(agent, force=True)
        if done.compacted:
            return
        why = done.result.error or done.result.meta.get("declined") or "nothing was removed"
        message = f"{self.entry}: compactor {self.compactor.compactor!r} could not reduce: {why}"
        if e is not None:
            raise ContextWindowOverflowException(message) from e
        logger.warning("%s", message)
