"""Compact a list of LangChain ``BaseMessage`` objects with a Normandy compactor.

The messages are read as OpenAI Chat Completions dicts (``convert_to_openai_messages``,
one dict per message, each carrying its message's ``id``) and compacted by the core's
own path (:func:`normandy_core.transcripts.facade.compact_with`): the boundary checks the result,
``after_compact`` hooks receive what was dropped, and broken tool pairs are refused.
The core hands back every message it kept as the very dict it was given, so each kept
dict leads back to its original ``BaseMessage``, returned as the same object: id,
``additional_kwargs``, ``response_metadata``, tool calls and ``tool_call_id`` unchanged.
A message the compactor changed (a shortened tool result, stripped thinking) is the
original copied with the new content; one it created (a summary, a marker) is new, with
a fresh id. Anthropic thinking blocks in an ``AIMessage``'s content (a Claude
conversation) are read as thinking and kept, or stripped where the compactor contract
strips them.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ToolMessage,
    convert_to_messages,
    convert_to_openai_messages,
)

from normandy_core.transcripts.adapter import (
    AdapterCompaction,
    NamedCompactor,
    chat_origin,
    map_back,
)

__all__ = [
    "FUNCTION_ENTRY",
    "LangChainCompaction",
    "MessageCompactor",
    "compact_messages",
]

logger = logging.getLogger("normandy_langchain")

#: The entry point named in the option errors of :func:`compact_messages`.
FUNCTION_ENTRY = "normandy_langchain.compact_messages()"


class LangChainCompaction(AdapterCompaction[BaseMessage]):
    """What :meth:`MessageCompactor.run` returns: the core's
    :class:`~normandy_core.transcripts.adapter.AdapterCompaction` of LangChain messages
    (``messages``, ``removed``, ``result``, ``compacted``), under this adapter's name."""


class MessageCompactor(NamedCompactor):
    """A compactor chosen by name, prepared once, for lists of LangChain messages.

    The arguments are :class:`normandy_core.transcripts.adapter.NamedCompactor`'s (errors name
    ``entry``, by default ``normandy_langchain.compact_messages()``).
    """

    default_entry = FUNCTION_ENTRY

    def _start(self) -> None:
        # Each message's Chat dict, made once and handed over again on later calls, so
        # the core continues its last compaction (only new messages are read and
        # counted). Keyed by the message object, and by its id for an equal copy; each
        # with a snapshot of the message it was made from.
        self._dicts: dict[int, tuple[BaseMessage, dict[str, Any]]] = {}
        self._by_lc_id: dict[str, tuple[BaseMessage, dict[str, Any]]] = {}

    def _as_dicts(self, original: list[BaseMessage]) -> list[dict[str, Any]]:
        """The Chat dicts of ``original``: the ones made before for the same (or an equal)
        message, converted otherwise."""
        out: list[dict[str, Any]] = []
        fresh: list[tuple[int, BaseMessage]] = []
        for i, m in enumerate(original):
            # the snapshot held is compared with the message: one changed in place since,
            # or another with the same id, is converted again
            hit = self._dicts.get(id(m))
            if hit is None or hit[0] != m:
                by_id = self._by_lc_id.get(m.id) if m.id else None
                hit = by_id if by_id is not None and by_id[0] == m else None
            if hit is None:
                fresh.append((i, m))
                out.append({})
            else:
                out.append(hit[1])
        if fresh:
            made = convert_to_openai_messages([m for _, m in fresh], include_id=True)
            if len(made) != len(fresh):  # one dict per message is what the mapping needs
                raise ValueError(
                    f"{self.entry}: convert_to_openai_messages gave {len(made)} dicts for "
                    f"{len(fresh)} messages"
                )
            for (i, _m), d in zip(fresh, made, strict=True):
                out[i] = d
        return out

    def _keep(self, messages: list[BaseMessage], dicts: list[Any]) -> None:
        """Remember the dict of each message of the list handed back (only those)."""
        before = self._dicts
        self._dicts = {}
        self._by_lc_id = {}
        for m, d in zip(messages, dicts, strict=True):
            if isinstance(d, dict):
                old = before.get(id(m))
                # a message handed over again as it was keeps its snapshot (no copy)
                held = old if old is not None and old[1] is d else (m.model_copy(deep=True), d)
                self._dicts[id(m)] = held
                if m.id:
                    self._by_lc_id[m.id] = held

    def run(
        self, messages: Sequence[BaseMessage], *, mid_round: bool | None = None
    ) -> LangChainCompaction:
        """Compact ``messages`` once.

        ``mid_round`` says the last assistant message's tool round is still open; left
        out, it is taken to be open when the last message is a ``ToolMessage`` (the
        model is about to continue the round). Raises
        :class:`~normandy_core.TranscriptError` (naming the message index and field) for
        a list the Chat Completions format cannot hold, such as a ``ToolMessage`` that
        answers no call of the ``AIMessage`` before it.
        """
        original = list(messages)
        if mid_round is None:
            mid_round = bool(original) and isinstance(original[-1], ToolMessage)
        dicts = self._as_dicts(original)
        result = self.compact(dicts, mid_round=mid_round, format="openai")
        if not result.compacted:
            self._keep(original, dicts)
            return LangChainCompaction(original, result)
        by_lc_id = {m.id: m for m in original if m.id}
        mapped = map_back(
            result.messages,
            chat_origin(original, dicts, by_lc_id),
            lambda source, d: _changed(source, _fresh(d)),
            lambda d: _created(_fresh(d)),
        )
        out = [m for m, _ in mapped]
        self._keep(out, list(result.messages))
        self.log(logger, len(original), len(out), result, "messages")
        return LangChainCompaction.of(original, out, result)


def _fresh(d: Any) -> BaseMessage:
    """The message a Chat dict of the core's stands for."""
    return convert_to_messages([d])[0]


def _changed(source: BaseMessage, fresh: BaseMessage) -> BaseMessage:
    """``source`` with the content the compactor gave it (and, for an assistant message,
    its tool calls as they now stand); every other field is kept.

    An Anthropic-shaped ``AIMessage`` also lists its calls as ``tool_use`` blocks in its
    content, which the Chat Completions form moves to ``tool_calls``: those of the calls
    still there come back after the new content, as given."""
    content: Any = fresh.content
    update: dict[str, Any] = {"content": content}
    if isinstance(source, AIMessage) and isinstance(fresh, AIMessage):
        update["tool_calls"] = fresh.tool_calls
        calls = {c["id"] for c in fresh.tool_calls}
        uses = [
            b
            for b in (source.content if isinstance(source.content, list) else [])
            if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("id") in calls
        ]
        if uses:
            parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
            update["content"] = [p for p in parts if p != {"type": "text", "text": ""}] + uses
    return source.model_copy(update=update)


def _created(fresh: BaseMessage) -> BaseMessage:
    """A message the compactor created, with an id of its own (LangGraph's reducer
    matches messages by id)."""
    if not fresh.id:
        fresh.id = f"normandy-{uuid.uuid4().hex}"
    return fresh


def compact_messages(
    messages: Sequence[BaseMessage],
    *,
    compactor: str | None = None,
    opts: Mapping[str, Any] | None = None,
    model: str | None = None,
    window: int | None = None,
    mid_round: bool | None = None,
    timeout: float | None = None,
    client: Any = None,
    on_compact: Callable[[LangChainCompaction], None] | None = None,
) -> list[BaseMessage]:
    """``messages`` compacted by the compactor named ``compactor``, like ``trim_messages``.

    Unlike a trim, the cut never separates an ``AIMessage``'s tool calls from their
    ``ToolMessage`` results, and what is removed reaches the ``after_compact`` hooks
    (the archive, ``recall``). Kept messages come back as the same objects. The
    arguments are those of :class:`MessageCompactor` (errors name
    ``normandy_langchain.compact_messages()``) and :meth:`MessageCompactor.run`;
    ``on_compact`` receives the :class:`LangChainCompaction` of every call. For
    repeated calls, build a :class:`MessageCompactor` once.
    """
    done = MessageCompactor(
        compactor, opts, model=model, window=window, timeout=timeout, client=client
    ).run(messages, mid_round=mid_round)
    if on_compact is not None:
        on_compact(done)
    return done.messages
