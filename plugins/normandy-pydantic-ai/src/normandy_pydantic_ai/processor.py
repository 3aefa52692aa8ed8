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
from collections.abc import Callable, Mapping
from typing import Any

from pydantic_ai.messages import ModelMessage

from normandy_core.eventloop import bind_turn_loop
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


class NormandyHistoryProcessor:
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

    _entry = PROCESSOR_ENTRY

    def __init__(
        self,
        compactor: str | None = None,
        opts: Mapping[str, Any] | None = None,
        *,
        model: str | None = None,
        window: int | None = None,
        timeout: float | None = None,
        client: Any = None,
        raise_on_error: bool = False,
        on_compact: Callable[[PydanticAICompaction], None] | None = None,
    ) -> None:
        self.compactor = HistoryCompactor(
            compactor,
            opts,
            model=model,
            window=window,
            timeout=timeout,
            client=client,
            entry=self._entry,
        )
        self.raise_on_error = raise_on_error
        self.on_compact = on_compact

    def _process(self, messages: list[ModelMessage]) -> list[ModelMessage]:
        done = self.compactor.run(messages)
        if self.raise_on_error:
            done.result.check()
        if not done.compacted:
            return messages
        if self.on_compact is not None:
            self.on_compact(done)
        return done.messages

    def __call__(self, messages: list[ModelMessage]) -> list[ModelMessage]:
        """The history the model receives: ``messages`` compacted when needed (the same
        list when nothing needed compacting)."""
        return self._process(messages)


class AsyncNormandyHistoryProcessor(NormandyHistoryProcessor):
    """:class:`NormandyHistoryProcessor` as an ``async`` history processor: the compactor
    runs in a worker thread bound to the running loop, so the loop keeps serving while it
    counts, summarizes or archives. Errors name this class."""

    _entry = ASYNC_PROCESSOR_ENTRY

    async def __call__(self, messages: list[ModelMessage]) -> list[ModelMessage]:  # type: ignore[override]
        """The history the model receives, compacted off the event loop."""
        with bind_turn_loop(asyncio.get_running_loop()):
            return await asyncio.to_thread(self._process, messages)
