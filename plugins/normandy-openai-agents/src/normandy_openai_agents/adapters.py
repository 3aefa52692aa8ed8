"""The OpenAI Agents SDK seams: :class:`NormandySession` and :class:`NormandyInputFilter`.

- :class:`NormandySession` wraps any ``Session`` (``SQLiteSession``, an in-memory one,
  SQLAlchemy, Redis...): when the runner reads the history, the stored items are compacted
  by the named compactor and, when it compacted, the store is rewritten with the
  compacted list, so the next run starts from it and nothing is dropped (or archived)
  twice.
- :class:`NormandyInputFilter` is a ``RunConfig(call_model_input_filter=...)``: before
  every model call of a run, the input the model is about to receive is compacted, so a
  long tool-using run stays within the window with or without a session.

Used together, the two report each item once: the SDK keeps nothing the filter returns,
so the session's store still holds what the filter dropped; the session that read the
run's history learns what the filter last returned, and at its next read stores that in
place of what the filter was given (:meth:`NormandySession.get_items`), so nothing the
filter dropped is compacted (and reported) again.

Each compaction is reported the framework's ways: an ``on_compact`` callback, a custom
span named :data:`SPAN` in the run's trace, and a log line (logger
``normandy_openai_agents``, INFO).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from contextvars import ContextVar
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


#: The :class:`NormandySession` whose history the run in this context read. The SDK gives
#: an input filter no handle on the run's session, so a session names itself here when
#: the runner reads it (the run's later steps, its tasks included, share its context),
#: and the filter hands it what it returned. Whatever it names is only a candidate: the
#: session takes a filter's lists only when its input starts with the history the session
#: returned, and uses them only where its stored items still hold that input.
_READ_BY: ContextVar[NormandySession | None] = ContextVar(
    "normandy_openai_agents_session", default=None
)


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


class _Handover:
    """What the input filters of a session's run returned, for the session's next read.

    ``start`` is where the history the run was shown starts among the stored items (a
    ``limit`` leaves older ones out) and ``known`` what every input of the run starts
    with: that history, then the input a filter was last given. A filter's lists are
    taken only when its input starts with ``known`` (one of another conversation, run in
    the same context without this session, is left out), and :meth:`applied` puts its
    last return in place of its input only where the stored items still hold that input.
    """

    def __init__(self, start: int, known: list[Any]) -> None:
        self.start = start
        self.known = known
        self.given: list[Any] | None = None
        self.returned: list[Any] = []

    def offer(self, given: list[Any], returned: list[Any]) -> None:
        """A filter of the run was given ``given`` and returned ``returned``."""
        if len(given) >= len(self.known) and given[: len(self.known)] == self.known:
            self.known = self.given = given
            self.returned = returned

    def applied(self, read: list[Any]) -> list[Any]:
        """``read`` (the stored items) with the last filter's return in place of its input,
        or ``read`` itself when no filter changed anything or the store changed."""
        given, start = self.given, self.start
        if given is None or self.returned == given:
            return read
        end = start + len(given)
        if len(read) < end or read[start:end] != given:
            return read
        logger.info(
            "%s: the input filter's %d items stored in place of the %d it was given",
            SESSION_ENTRY,
            len(self.returned),
            len(given),
        )
        return [*read[:start], *self.returned, *read[end:]]


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

    With a :class:`NormandyInputFilter` in the same runs, what the filter dropped is not
    dropped (nor reported) again here: the filter hands this session the input it was last
    given and what it returned, and the next read stores that return in place of the
    input (when the stored items still start with it) before compacting.
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
        self._handover = _Handover(0, [])  # what the filters of the last run returned

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The stored history, compacted (and stored compacted when it was).

        When an input filter compacted the last run's input, its last return stands in
        for what it was given first, so what it dropped is neither compacted nor reported
        again. ``limit`` (or ``session_settings.limit``) keeps the newest items of the
        compacted history, starting after any tool output whose call the cut left out."""
        async with self._lock:
            read = list(await self.session.get_items())
            items = self._handover.applied(read)
            done = await self._compact(items, mid_round=False)
            if done.compacted:
                items = done.items
            if items is not read:
                await self._replace(read, items)
            if limit is None:
                limit = getattr(self.session_settings, "limit", None)
            shown = items if limit is None else newest(items, limit)
            # the run's input starts with what it is shown: its input filter hands back here
            self._handover = _Handover(len(items) - len(shown), shown)
            _READ_BY.set(self)
        return shown

    def note_filtered(self, given: list[Any], returned: list[Any]) -> None:
        """Tell the session that an input filter of its run was given ``given`` (the run's
        input) and returned ``returned``.

        :class:`NormandyInputFilter` calls it before every model call of a run that read
        this session; a ``call_model_input_filter`` of your own may too. The next
        :meth:`get_items` stores the last ``returned`` in place of its ``given``, so what
        the filter dropped is not compacted (nor reported) again. Ignored when ``given``
        does not start with the history this session last returned (then with the input
        noted last): the list of another conversation.
        """
        self._handover.offer(given, returned)

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
    one is compacted from scratch. In a run with a
    :class:`~normandy_openai_agents.NormandySession`, the filter hands it each input and
    what it returned, so the session does not drop (nor report) again what the filter
    dropped.
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
        session = _READ_BY.get()
        if session is not None:
            session.note_filtered(items, self._returned)
        return ModelInputData(input=out, instructions=data.model_data.instructions)
