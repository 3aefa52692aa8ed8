"""Compact a list of OpenAI Agents SDK input items (Responses API items) with a compactor.

The items are read as the Responses API input list they are (``message`` items and easy
messages, ``reasoning``, ``function_call`` / ``function_call_output``, custom tool calls,
``compaction`` items, every other item carried opaque and paired by ``call_id``), and
compacted by the core's own path (:func:`normandy_core.transcripts.facade.compact_with`, format
``"responses"``): consecutive model-side items are one assistant entry (a reasoning item
stays with the calls it precedes, a parallel batch stays whole), consecutive outputs one
results entry; the entry holding the newest ``compaction`` item is pinned. The boundary
checks the result, ``after_compact`` hooks receive what was dropped, and broken pairs are
refused. Every item the compactor keeps comes back as the very object given (ids and
every field unchanged); only what it creates or changes is rendered anew.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from normandy_core.transcripts.adapter import AdapterCompaction, NamedCompactor
from normandy_core.transcripts.facade import compact_with
from normandy_core.transcripts.result import CompactResult

__all__ = ["AgentsCompaction", "ItemCompactor", "is_output", "newest", "open_round"]

logger = logging.getLogger("normandy_openai_agents")


def _field(item: Any, name: str) -> Any:
    if isinstance(item, Mapping):
        return item.get(name)
    return getattr(item, name, None)


def is_output(item: Any) -> bool:
    """Whether ``item`` is a tool's output (``function_call_output`` and the like)."""
    kind = _field(item, "type")
    return isinstance(kind, str) and (kind.endswith("_output") or kind == "mcp_approval_response")


def _input_message(item: Any) -> bool:
    kind = _field(item, "type")
    return (kind is None or kind == "message") and bool(_field(item, "role") != "assistant")


def _starts_group(items: Sequence[Any], i: int) -> bool:
    """Whether a cut before ``items[i]`` separates no call from its output: it is not an
    output, and either an input message or the first model item after one or an output."""
    if is_output(items[i]):
        return False
    if i == 0 or _input_message(items[i]):
        return True
    return is_output(items[i - 1]) or _input_message(items[i - 1])


def newest(items: Sequence[Any], limit: int) -> list[Any]:
    """At most the ``limit`` newest of ``items``, the cut moved later to the start of a
    group of model items (or an input message), so no output loses its call and no
    reasoning item loses what follows it."""
    start = max(0, len(items) - max(limit, 0))
    while start < len(items) and not _starts_group(items, start):
        start += 1
    return list(items[start:])


def open_round(items: Sequence[Any]) -> bool:
    """Whether the model is about to continue a tool round: the last item is an output."""
    return bool(items) and is_output(items[-1])


class AgentsCompaction(AdapterCompaction[Any]):
    """What :meth:`ItemCompactor.run` returns: the core's
    :class:`~normandy_core.transcripts.adapter.AdapterCompaction` of Responses input
    items (``removed``, ``result``, ``compacted``), under this adapter's name, with the
    compacted list as :attr:`items`."""

    @property
    def items(self) -> list[Any]:
        """The compacted list (the input's objects where kept, unchanged): ``messages``."""
        return self.messages


class ItemCompactor(NamedCompactor):
    """A compactor chosen by name, prepared once, for lists of Responses input items.

    The arguments are :class:`normandy_core.transcripts.adapter.NamedCompactor`'s (``entry`` names
    the adapter in the errors).
    """

    def run(self, items: Sequence[Any], *, mid_round: bool | None = None) -> AgentsCompaction:
        """Compact ``items`` once.

        ``mid_round`` says the last tool round is still open; left out, it is open when
        the last item is a tool's output. Raises :class:`~normandy_core.TranscriptError`
        (naming the item index and field) for a list the Responses format cannot hold,
        such as a ``function_call_output`` whose ``call_id`` no call before it has.
        """
        original = list(items)
        if mid_round is None:
            mid_round = open_round(original)
        result = compact_with(self.config, original, mid_round=mid_round, format="responses")
        if not result.compacted:
            return AgentsCompaction(original, result)
        return self._compacted(original, result)

    def run_continued(self, items: list[Any], *, mid_round: bool | None = None) -> AgentsCompaction:
        """:meth:`run` for a list that extends the one an earlier call returned (its very
        objects first, then new items): through :func:`normandy_core.compact`, whose
        continuation reads and counts only the new items and keeps the earlier cuts
        (``result.continued``; ``meta`` reports only what this call dropped). Any other
        list is compacted whole. ``items`` is returned when nothing changed.
        """
        if mid_round is None:
            mid_round = open_round(items)
        result = self.compact(items, mid_round=mid_round, format="responses")
        if not result.compacted:
            return AgentsCompaction(list(result.messages), result)
        return self._compacted(items, result)

    def _compacted(self, given: list[Any], result: CompactResult) -> AgentsCompaction:
        """The compaction of ``given`` that ``result`` made, logged: its items, and the
        ones of ``given`` it left out."""
        out = list(result.messages)
        self.log(logger, len(given), len(out), result, "items")
        return AgentsCompaction.of(given, out, result)
