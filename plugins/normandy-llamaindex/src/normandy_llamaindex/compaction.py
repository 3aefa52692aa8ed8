"""Compact a list of LlamaIndex ``ChatMessage`` objects with a Normandy compactor.

The messages are read as Chat Completions dicts (:mod:`normandy_llamaindex.messages`)
and compacted by the core's own path: the boundary checks the result, ``after_compact``
hooks receive what was dropped, broken tool pairs are refused. The core hands back every
message it kept as the very dict it was given, so each kept dict leads back to its
original ``ChatMessage``, returned as the same object. A message the compactor changed
is the original copied with the new content; one it created (a summary, a marker) is new.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole

from normandy_core.transcripts.adapter import (
    AdapterCompaction,
    NamedCompactor,
    chat_origin,
    map_back,
)
from normandy_llamaindex.messages import changed_message, created_message, to_chat_dict

__all__ = [
    "FUNCTION_ENTRY",
    "ChatCompactor",
    "LlamaIndexCompaction",
    "compact_chat_history",
]

logger = logging.getLogger("normandy_llamaindex")

#: The entry point named in the option errors of :func:`compact_chat_history`.
FUNCTION_ENTRY = "normandy_llamaindex.compact_chat_history()"


class LlamaIndexCompaction(AdapterCompaction[ChatMessage]):
    """What :meth:`ChatCompactor.run` returns: the core's
    :class:`~normandy_core.transcripts.adapter.AdapterCompaction` of LlamaIndex messages
    (``messages``, ``removed``, ``result``, ``compacted``), under this adapter's name."""


class ChatCompactor(NamedCompactor):
    """A compactor chosen by name, prepared once, for lists of LlamaIndex messages.

    The arguments are :class:`normandy_core.transcripts.adapter.NamedCompactor`'s (errors
    name ``entry``, by default ``normandy_llamaindex.compact_chat_history()``). Repeated
    runs over a list that extends the last one given or returned continue the last
    compaction: only new messages are read and counted, and what was dropped before is
    not reported again.
    """

    default_entry = FUNCTION_ENTRY

    def _start(self) -> None:
        # Each message's Chat dict, made once and handed over again on later runs (the
        # core's continuation recognises its own dicts), with a snapshot of the message
        # it was made from: a message changed in place since is converted again.
        self._dicts: dict[int, tuple[ChatMessage, dict[str, Any]]] = {}
        self._made = 0

    def _as_dicts(self, original: list[ChatMessage]) -> list[dict[str, Any]]:
        """The Chat dicts of ``original``: those made before for the same unchanged
        message, new ones otherwise."""
        out: list[dict[str, Any]] = []
        for i, m in enumerate(original):
            hit = self._dicts.get(id(m))
            if hit is not None and hit[0] == m:
                out.append(hit[1])
                continue
            self._made += 1
            out.append(to_chat_dict(m, f"li-{self._made}", i))
        return out

    def _keep(self, messages: list[ChatMessage], dicts: Sequence[Any]) -> None:
        """Remember the dict of each message of the list handed back (only those)."""
        before = self._dicts
        self._dicts = {}
        for m, d in zip(messages, dicts, strict=True):
            old = before.get(id(m))
            # a message handed over again as it was keeps its snapshot (no copy)
            held = old if old is not None and old[1] is d else (m.model_copy(deep=True), d)
            self._dicts[id(m)] = held

    def run(
        self, messages: Sequence[ChatMessage], *, mid_round: bool | None = None
    ) -> LlamaIndexCompaction:
        """Compact ``messages`` once.

        ``mid_round`` says the last assistant message's tool round is still open; left
        out, it is taken to be open when the last message is a tool result. Raises
        :class:`~normandy_core.TranscriptError` (naming the message index and field) for
        a list whose tool pairs do not hold, such as a result that answers no call.
        """
        original = list(messages)
        if mid_round is None:
            mid_round = bool(original) and original[-1].role == MessageRole.TOOL
        dicts = self._as_dicts(original)
        result = self.compact(dicts, mid_round=mid_round, format="openai")
        if not result.compacted:
            self._keep(original, dicts)
            return LlamaIndexCompaction(original, result)
        by_key = {d.get("id"): m for d, m in zip(dicts, original, strict=True)}
        mapped = map_back(
            result.messages,
            chat_origin(original, dicts, by_key),
            changed_message,
            created_message,
        )
        out = [m for m, _ in mapped]
        # a changed or created message's dict is the core's: the next run continues from it
        self._keep(out, result.messages)
        self.log(logger, len(original), len(out), result, "messages")
        return LlamaIndexCompaction.of(original, out, result)


def compact_chat_history(
    messages: Sequence[ChatMessage],
    *,
    compactor: str | None = None,
    opts: Mapping[str, Any] | None = None,
    model: str | None = None,
    window: int | None = None,
    mid_round: bool | None = None,
    timeout: float | None = None,
    client: Any = None,
) -> list[ChatMessage]:
    """``messages`` compacted once by the compactor named ``compactor``.

    A tool call is never separated from its result and what is removed reaches the
    ``after_compact`` hooks. Kept messages come back as the same objects. The arguments
    are those of :class:`ChatCompactor` (errors name
    ``normandy_llamaindex.compact_chat_history()``) and :meth:`ChatCompactor.run`.
    """
    return (
        ChatCompactor(compactor, opts, model=model, window=window, timeout=timeout, client=client)
        .run(messages, mid_round=mid_round)
        .messages
    )
