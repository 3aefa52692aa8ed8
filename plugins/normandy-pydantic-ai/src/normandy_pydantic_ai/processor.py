"""History processors for Pydantic AI agents: a Normandy compactor chosen by name.

Installed with one line, ``Agent(model, capabilities=[ProcessHistory(
NormandyHistoryProcessor("window_manager", window=32_000))])``, the processor runs before
every model request: the history is compacted by the named compactor and the compacted
list is what the model receives and what the run keeps. Kept messages are the history's
own objects; dropped ones reach the ``after_compact`` hooks.
"""

from __future__ import annotations

import asyncio
import logging

from pydantic_ai.messages import ModelMessage

from normandy_core.contract.eventloop import bind_turn_loop
from normandy_core.transcripts.adapter import AdapterSeam
from normandy_pydantic_ai.history import HistoryCompactor, PydanticAICompaction

__all__ = [
    "ASYNC_PROCESSOR_ENTRY",
    "PROCESSOR_ENTRY",
    "AsyncNormandyHistoryProcessor",
    "NormandyHistoryProcessor",
]

logger = logging.getLogger("normandy_pydantic_ai")

#: The entry point named in the option errors of :class:`NormandyHistoryProcessor`.
PROCESSOR_ENTRY = "normandy_pydantic_ai.NormandyHistoryProcessor()"
#: The entry point named in the option errors of :class:`AsyncNormandyHistoryProcessor`.
ASYNC_PROCESSOR_ENTRY = "normandy_pydantic_ai.AsyncNormandyHistoryProcessor()"


class NormandyHistoryProcessor(AdapterSeam[PydanticAICompaction]):
    """A Pydantic AI history processor that compacts with a named compactor (sync).

    ``compactor`` is the entry-point name (``window_manager`` when neither given nor
    configured), ``opts`` its options: both validated here, when the processor is built,
    so a bad option raises :class:`~normandy_core.OptionsError` naming this class and the
    compactor. ``window`` pins the context window in tokens (or ``model`` names a model
    the catalog knows); ``timeout`` bounds the compactor's time. ``on_compact`` is called
    with the :class:`~normandy_pydantic_ai.PydanticAICompaction` of each compaction, which
    is also logged (logger ``normandy_pydantic_ai``, INFO). A compactor error (the
    history cannot fit) leaves the history unchanged and is logged as a warning by the
    core; with ``raise_on_error=True`` it raises :class:`~normandy_core.CannotFitError`.

    Pydantic AI runs a sync processor in a worker thread, so it never blocks the event
    loop; :class:`AsyncNormandyHistoryProcessor` is the ``async`` form.
    """

    compactor_class = HistoryCompactor
    entry = PROCESSOR_ENTRY
    compactor: HistoryCompactor

    def _process(self, messages: list[ModelMessage]) -> list[ModelMessage]:
        done = self._reported(self._checked(self.compactor.run(messages)))
        return done.messages if done.compacted else messages

    def __call__(self, messages: list[ModelMessage]) -> list[ModelMessage]:
        """The history the model receives: ``messages`` compacted when needed (the same
        list when nothing needed compacting)."""
        return self._process(messages)


class AsyncNormandyHistoryProcessor(NormandyHistoryProcessor):
    """:class:`NormandyHistoryProcessor` as an ``async`` history processor: the compactor
    runs in a worker thread bound to the running loop, so the loop keeps serving while it
    counts, summarizes or archives. Errors name this class."""

    entry = ASYNC_PROCESSOR_ENTRY

    async def __call__(self, messages: list[ModelMessage]) -> list[ModelMessage]:  # type: ignore[override]
        """The history the model receives, compacted off the event loop."""
        with bind_turn_loop(asyncio.get_running_loop()):
            return await asyncio.to_thread(self._process, messages)
