"""The OpenAI Agents SDK seams: :class:`NormandySession` and :class:`NormandyInputFilter`.

- :class:`NormandySession` wraps any ``Session`` (``SQLiteSession``, an in-memory one,
  SQLAlchemy, Redis...): when the runner reads the history, the stored items are compacted
  by the named compactor and, when it compacted, the store is rewritten with the
  compacted list, so the next run starts from it and nothing is dropped (or archived)
  twice.
- :class:`NormandyInputFilter` is a ``RunConfig(call_model_input_filter=...)``: before
  every model call of a run, the input the model is about to receive is compacted, so a
  long tool-using run stays within the window with or without a session.

Each compaction is reported the framework's ways: an ``on_compact`` callback, a custom
span named :data:`SPAN` in the run's trace, and a log line (logger
``normandy_openai_agents``, INFO).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from agents.memory import Session
from agents.run_config import CallModelData, ModelInputData
from agents.tracing import custom_span
from typing_extensions import Unpack

from normandy_core.contract.eventloop import bind_turn_loop
from normandy_core.transcripts.adapter import AdapterSeam, SeamOptions
from normandy_openai_agents.compaction import AgentsCompaction, ItemCompactor, newest

__all__ = ["FILTER_ENTRY", "SESSION_ENTRY", "SPAN", "NormandyInputFilter", "NormandySession"]

logger = logging.getLogger("normandy_openai_agents")

#: The entry point named in the option errors of :class:`NormandySession`.
SESSION_ENTRY = "normandy_openai_agents.NormandySession()"
#: The entry point named in the option errors of :class:`NormandyInputFilter`.
FILTER_ENTRY = "normandy_openai_agents.NormandyInputFilter()"
#: Name of the custom span recorded in the run's trace for each compaction.
SPAN = "normandy_compaction"


def span_data(done: AgentsCompaction) -> dict[str, Any]:
    """The JSON-ready figures of a compaction, as its span carries them."""
    figures = done.result.figures()
    notes = figures.pop("notes")  # last, as the events have always listed them
    return {
        **figures,
        "items_removed": len(done.removed),
        "items_after": len(done.items),
        "notes": notes,
    }


class _Adapter(AdapterSeam[AgentsCompaction]):
    """What both seams share: the prepared compactor and how a compaction is reported."""

    compactor_class = ItemCompactor
    compactor: ItemCompactor

    def _start(self) -> None:
        self._lock = asyncio.Lock()

    _continued = False

    def _run(self, items: list[Any], mid_round: bool | None) -> AgentsCompaction:
        if self._continued:
            return self._checked(self.compactor.run_continued(items, mid_round=mid_round))
        return self._checked(self.compactor.run(items, mid_round=mid_round))

    async def _compact(self, items: list[Any], mid_round: bool | None = None) -> AgentsCompaction:
        """``items`` compacted in a worker thread (the loop keeps serving meanwhile)."""
        with bind_turn_loop(asyncio.get_running_loop()):
            done = await asyncio.to_thread(self._run, items, mid_round)
        if done.compacted:
            with custom_span(SPAN, span_data(done)):
                pass
        return self._reported(done)


class NormandySession(_Adapter):
    """A ``Session`` that keeps the wrapped session's items within the window.

    ``session`` is any session of the SDK (or one of your own); ``compactor``, ``opts``,
    ``window``/``model``, ``timeout``, ``client`` are those of
    :class:`~normandy_openai_agents.ItemCompactor`, validated here (errors name
    ``normandy_openai_agents.NormandySession()``). :meth:`get_items` compacts what is
    stored and, when it compacted, replaces the stored items with the compacted list
    (``clear_session`` then ``add_items`` on the wrapped session). ``on_compact``
    receives each :class:`~normandy_openai_agents.AgentsCompaction`. A compactor error
    leaves the items unchanged (logged as a warning by the core); with
    ``raise_on_error=True`` it raises :class:`~normandy_core.CannotFitError`.

    The wrapped session must return its whole history from ``get_items()``: one with
    ``session_settings.limit`` set is refused (give the limit to this session instead,
    which applies it after compacting, never cutting between a call and its output).
    """

    entry = SESSION_ENTRY

    def __init__(
        self,
        session: Session,
        compactor: str | None = None,
        opts: Mapping[str, Any] | None = None,
        *,
        session_settings: Any = None,
        **options: Unpack[SeamOptions],
    ) -> None:
        inner_limit = getattr(getattr(session, "session_settings", None), "limit", None)
        if inner_limit is not None:
            raise ValueError(
                f"{SESSION_ENTRY}: the wrapped session {session.session_id!r} has "
                f"session_settings.limit={inner_limit}; compaction needs its whole history "
                "(pass session_settings to NormandySession instead)"
            )
        super().__init__(compactor, opts, **options)
        self.session = session
        self.session_id: str = session.session_id
        self.session_settings = session_settings

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The stored history, compacted (and stored compacted when it was).

        ``limit`` (or ``session_settings.limit``) keeps the newest items of the compacted
        history, starting after any tool output whose call the cut left out."""
        async with self._lock:
            items = list(await self.session.get_items())
            done = await self._compact(items, mid_round=False)
            if done.compacted:
                await self._replace(items, done.items)
                items = done.items
        if limit is None:
            limit = getattr(self.session_settings, "limit", None)
        if limit is not None:
            items = newest(items, limit)
        return items

    async def _replace(self, read: list[Any], items: list[Any]) -> None:
        """Store ``items`` instead of ``read``: in one transaction where the wrapped
        session offers one (the SDK's ``SQLiteSession`` replaces its rows atomically when
        they are still the ones read, and are left as they are otherwise), else
        ``clear_session()`` then ``add_items()``."""
        snapshot = getattr(self.session, "_get_compaction_snapshot", None)
        if callable(snapshot):
            try:
                snap = await snapshot(len(read) + 1)
            except Exception:  # another SDK version's private method: the plain way
                snap = None
            if snap is not None and snap.complete and snap.items == read:
                if not await snap.replace_suffix(0, items):
                    # written meanwhile by another writer: keep what is stored (the next
                    # read compacts it again; the archive stores content once)
                    logger.warning(
                        "%s: session %r changed while it was compacted; its stored items "
                        "were left as they are",
                        SESSION_ENTRY,
                        self.session_id,
                    )
                return
        await self.session.clear_session()
        await self.session.add_items(items)

    async def add_items(self, items: list[Any]) -> None:
        """Store ``items`` in the wrapped session."""
        async with self._lock:
            await self.session.add_items(items)

    async def pop_item(self) -> Any:
        """Remove and return the newest stored item (``None`` when empty)."""
        async with self._lock:
            return await self.session.pop_item()

    async def clear_session(self) -> None:
        """Remove every stored item."""
        async with self._lock:
            await self.session.clear_session()


class NormandyInputFilter(_Adapter):
    """A ``call_model_input_filter`` that compacts the model's input before every call.

    ``RunConfig(call_model_input_filter=NormandyInputFilter("window_manager",
    window=32_000))``. The arguments are those of
    :class:`~normandy_openai_agents.NormandySession` without the session (errors name
    ``normandy_openai_agents.NormandyInputFilter()``).

    The SDK hands the filter the run's whole input each call and keeps nothing the
    filter returns, so the filter remembers its last input and output: an input that
    extends the last one is compacted as the last output plus the new items, through
    :func:`normandy_core.compact`'s continuation (only the new items are read and
    counted). Earlier cuts are kept, and each dropped item reaches the ``after_compact``
    hooks once. Use one filter per conversation; an input that does not extend the last
    one is compacted from scratch.
    """

    entry = FILTER_ENTRY
    _continued = True

    def _start(self) -> None:
        super()._start()
        self._given: list[Any] | None = None
        self._returned: list[Any] = []

    async def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        """The model's input with its items compacted; the instructions unchanged."""
        items = list(data.model_data.input)
        async with self._lock:
            base = items
            given = self._given
            if given is not None and len(items) >= len(given) and items[: len(given)] == given:
                base = [*self._returned, *items[len(given) :]]
            done = await self._compact(base)
            out = done.items
            self._given = items
            self._returned = list(out)
        return ModelInputData(input=out, instructions=data.model_data.instructions)
