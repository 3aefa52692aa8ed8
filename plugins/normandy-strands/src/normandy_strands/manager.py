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
``toolResult``; dropped messages reach the ``after_compact`` hooks. ``removed_message_count``
counts, as in Strands' own managers, the messages the user or the model provided that are
no longer in ``agent.messages`` (a marker or summary a compactor created is not counted).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from strands.agent.conversation_manager import ConversationManager
from strands.hooks import BeforeModelCallEvent, HookRegistry
from strands.types.exceptions import ContextWindowOverflowException

from normandy_core.contract.eventloop import bind_turn_loop
from normandy_core.transcripts.adapter import AdapterSeam
from normandy_strands.compaction import MessageCompactor, StrandsCompaction

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
            agent.messages[:] = done.messages
            self.removed_message_count += done.removed_count
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
