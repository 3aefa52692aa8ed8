"""Compact a list of Strands messages with a Normandy compactor chosen by name.

The messages are read as entries (:mod:`normandy_strands.reading`) and compacted by the
core's own path (:func:`normandy_core.transcripts.facade.compact_with`): the boundary
checks the result, ``after_compact`` hooks receive what was dropped, broken tool pairs
are refused. Every message the compactor kept comes back as the very dict it was given
(``tracking_id``, ``metadata`` and content unchanged). A message the compactor changed
(a shortened tool result, stripped thinking) is a copy of the original with new content,
every other key kept; one it created (a marker, a summary) is a new message marked as
created in ``metadata.custom``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strands.types.content import Message, Role

from normandy_core.conversation.entries import (
    Block,
    Entry,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from normandy_core.conversation.memory import AgentMemory
from normandy_core.conversation.structure import pairing_problems
from normandy_core.transcripts.adapter import (
    AdapterCompaction,
    Mapped,
    NamedCompactor,
    map_entries_back,
    removed_from,
)
from normandy_core.transcripts.facade import compact_with
from normandy_core.transcripts.formats import TranscriptError
from normandy_strands.reading import (
    SYSTEM_ID,
    Digests,
    Read,
    bridge_message,
    created_message,
    is_created,
    read_messages,
    system_entry,
)

__all__ = ["FUNCTION_ENTRY", "MessageCompactor", "StrandsCompaction", "compact_messages"]

logger = logging.getLogger("normandy_strands")

#: The entry point named in the option errors of :func:`compact_messages`.
FUNCTION_ENTRY = "normandy_strands.compact_messages()"


@dataclass(frozen=True)
class StrandsCompaction(AdapterCompaction[Message]):
    """What :meth:`MessageCompactor.run` returns: the core's
    :class:`~normandy_core.transcripts.adapter.AdapterCompaction` of Strands messages
    (``messages``, ``removed``, ``result``, ``compacted``), under this adapter's name,
    with what the conversation manager needs beside it.

    ``removed_count``: how many of the ``removed`` messages the user or the model
    provided and are gone (not replaced by a changed copy, not a marker or summary a
    compactor created).
    """

    removed_count: int = 0
    #: per message of ``messages``, the index in the input of the message it is (or is a
    #: changed copy of); ``None`` for a message created (a marker, a summary)
    sources: list[int | None] = field(default_factory=list, repr=False)
    #: the input indices of the given messages that are gone (``removed_count`` of them)
    gone: list[int] = field(default_factory=list, repr=False)


def _block(b: Block, source: Mapping[str, Any], originals: Mapping[str, str]) -> dict[str, Any]:
    """A content block for ``b``, a block the compactor changed or created in a message
    read from ``source``: the original tool block with its new content where there is
    one."""
    if isinstance(b, ToolResultBlock):
        original = originals.get(b.tool_use_id, b.tool_use_id)
        for raw in source.get("content", []):
            res = raw.get("toolResult")
            if res is not None and res.get("toolUseId") == original:
                return {"toolResult": {**res, "content": [{"text": b.text()}]}}
    if isinstance(b, ToolUseBlock):
        original = originals.get(b.id, b.id)
        for raw in source.get("content", []):
            use = raw.get("toolUse")
            if use is not None and use.get("toolUseId") == original:
                return {"toolUse": {**use, "input": dict(b.input)}}
    if isinstance(b, ThinkingBlock):
        text: dict[str, Any] = {"text": b.thinking}
        if b.signature:
            text["signature"] = b.signature
        return {"reasoningContent": {"reasoningText": text}}
    if isinstance(b, TextBlock):
        return {"text": b.text}
    return {"text": Entry(id="x", role="user", content=(b,)).text()}


def _changed(source: Message, before: Entry, after: Entry, originals: Mapping[str, str]) -> Message:
    """``source`` with the content of ``after``: a block found unchanged in ``before`` is
    its original content block, a changed one is rebuilt (:func:`_block`)."""
    old = list(before.blocks)
    raw = list(source.get("content", []))
    taken: set[int] = set()
    content: list[Any] = []
    for b in after.blocks:
        idx = next((j for j, block in enumerate(old) if j not in taken and block == b), None)
        if idx is None:
            content.append(_block(b, source, originals))
        else:
            taken.add(idx)
            content.append(raw[idx])
    changed: Any = {**source, "content": content}
    return changed  # type: ignore[no-any-return]


def _mid_round(messages: Sequence[Message]) -> bool:
    """Whether the last message answers tool calls (the model is about to continue)."""
    if not messages or messages[-1].get("role") != "user":
        return False
    return any("toolResult" in b for b in messages[-1].get("content", []))


def _written(read: Read, memory: AgentMemory) -> list[Mapped[Message]]:
    """The messages of the compacted ``memory``: kept ones as given, changed ones as
    copies, created ones new (the system entry is not a message), roles alternating."""
    return _alternating(
        map_entries_back(
            (e for e in memory if e.id != SYSTEM_ID),
            read.by_entry,
            lambda source, before, after: _changed(source, before, after, read.originals[after.id]),
            lambda e: created_message(e.text()),
        )
    )


def _alternating(messages: list[Mapped[Message]]) -> list[Mapped[Message]]:
    """``messages`` starting with a user message and alternating roles, as providers
    require (a cut can put the kept task next to a kept user message): a created marker
    or summary takes the role its place needs (a copy, when it was kept), and between two
    given messages of one role goes a created marker of the other."""
    out: list[Mapped[Message]] = []
    before: Role = "assistant"  # the first message must be a user message
    for m, source in messages:
        if m["role"] == before:
            other: Role = "user" if before == "assistant" else "assistant"
            if is_created(m):
                m = {**m, "role": other}
            else:
                out.append((bridge_message(other), None))
        out.append((m, source))
        before = m["role"]
    return out


class MessageCompactor(NamedCompactor):
    """A compactor chosen by name, prepared once, for lists of Strands messages.

    The arguments are :class:`normandy_core.transcripts.adapter.NamedCompactor`'s (errors
    name ``entry``, by default ``normandy_strands.compact_messages()``).
    """

    default_entry = FUNCTION_ENTRY

    def _start(self) -> None:
        # What the last run read and returned: the digests of its messages and the
        # compacted memory, whose cached token counts carry over to entries kept by id
        # (ids are content digests, so an id always names the same content).
        self._digests: Digests = {}
        self._last: AgentMemory | None = None

    def _memory(self, read: Read) -> AgentMemory:
        last = self._last
        if last is None:
            return AgentMemory.from_entries(read.entries)
        return last.derive(read.entries)

    def run(
        self,
        messages: Sequence[Message],
        *,
        system_prompt: str | None = None,
        tool_specs: Sequence[Any] = (),
        mid_round: bool | None = None,
        force: bool = False,
    ) -> StrandsCompaction:
        """Compact ``messages`` once.

        ``system_prompt`` and ``tool_specs`` are what the agent sends beside the messages:
        they count against the window and are never removed. ``mid_round`` says the last
        assistant message's tool round is still open; left out, it is taken to be open
        when the last message answers tool calls. ``force`` compacts now, as deep as the
        compactor goes (``compact(..., force=True)``). Raises
        :class:`~normandy_core.TranscriptError` for messages whose tool pairs do not hold
        (a result answering no call of the message before it, a call left without its
        result anywhere but in the last message).
        """
        original = list(messages)
        if mid_round is None:
            mid_round = _mid_round(original)
        read = read_messages(original, self._digests, system_entry(system_prompt, tool_specs))
        problems = pairing_problems(read.entries, allow_pending=True)
        if problems:
            raise TranscriptError(None, "content", "; ".join(problems))
        result = compact_with(
            self.config, self._memory(read), mid_round=mid_round, format="normandy", force=force
        )
        self._digests = read.digests
        self._last = result.memory
        if not result.compacted:
            return StrandsCompaction(original, result)
        written = _written(read, result.memory)
        out = [m for m, _ in written]
        removed = removed_from(original, out)
        # a message whose entry survived (kept, or changed into a copy) is not gone
        position = {id(m): i for i, m in enumerate(original)}
        sources = [None if src is None else position[id(src)] for _, src in written]
        survived = set(sources)
        gone = [i for i, m in enumerate(original) if i not in survived and not is_created(m)]
        self.log(logger, len(original), len(out), result, "messages")
        return StrandsCompaction(out, result, removed, len(gone), sources, gone)


def compact_messages(
    messages: Sequence[Message],
    *,
    compactor: str | None = None,
    opts: Mapping[str, Any] | None = None,
    model: str | None = None,
    window: int | None = None,
    system_prompt: str | None = None,
    mid_round: bool | None = None,
    timeout: float | None = None,
) -> list[Message]:
    """``messages`` compacted once by the compactor named ``compactor``.

    A ``toolUse`` is never separated from its ``toolResult``, and what is removed reaches
    the ``after_compact`` hooks. Kept messages come back as the same dicts. The arguments
    are those of :class:`MessageCompactor` (errors name
    ``normandy_strands.compact_messages()``) and :meth:`MessageCompactor.run`.
    """
    return (
        MessageCompactor(compactor, opts, model=model, window=window, timeout=timeout)
        .run(messages, system_prompt=system_prompt, mid_round=mid_round)
        .messages
    )
