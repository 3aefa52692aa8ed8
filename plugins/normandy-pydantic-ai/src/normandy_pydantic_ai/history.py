"""Compact a Pydantic AI message history (``ModelMessage`` objects) with a Normandy compactor.

Each ``ModelRequest`` or ``ModelResponse`` becomes one entry of an
:class:`~normandy_core.AgentMemory`, one block per part, and the memory is compacted by the
core's own path (:func:`normandy_core.transcripts.facade.compact_with`): the boundary checks the
result, ``after_compact`` hooks receive what was dropped, broken tool pairs are refused.
Every message the compactor kept comes back as the very object it was given (parts,
timestamps, ``usage``, ``provider_response_id``, ``metadata`` unchanged). A message the
compactor changed (a shortened tool result, stripped thinking) is the original with new
parts, every other field kept; one it created (a summary, a marker) is a new message.

How parts are read:

- ``ToolCallPart`` is a tool use, ``ToolReturnPart`` (and a ``RetryPromptPart`` that
  names a tool call) its result, so a call and its result are kept or dropped together;
  a parallel batch stays whole.
- ``ThinkingPart`` is a thinking block (with its signature), which stays with the
  response it belongs to.
- A request holding a ``SystemPromptPart`` is pinned: no compactor removes it.
- The response holding the newest ``CompactionPart`` (a provider's summary of what came
  before it) is pinned too, as the core pins a provider's compaction.
- Any other part (files, native tool calls and returns, ...) is carried as an opaque
  block, counted by its JSON form, and moves with its message unaltered.

One marker per conversation: Pydantic AI merges consecutive requests, so the marker a
compaction inserted after the pinned first request (system prompt and first question)
ends up as a part of that request, where no compactor would ever remove it. A marker
part inside a request holding other parts is therefore an earlier marker the next
compaction replaces: it is left out of what is read, and the request comes back without
it (reported in ``removed``); the compaction inserts a new marker where it cuts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.messages import (
    CompactionPart,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    ModelResponsePart,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from normandy_core.conversation.entries import (
    Block,
    Entry,
    OpaqueBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from normandy_core.conversation.keys import MARKER_KEY
from normandy_core.conversation.memory import AgentMemory
from normandy_core.conversation.structure import pairing_problems
from normandy_core.transcripts.adapter import (
    AdapterCompaction,
    NamedCompactor,
    map_entries_back,
)
from normandy_core.transcripts.facade import compact_with
from normandy_core.transcripts.formats import INSERTED_TAGS, TranscriptError

__all__ = ["FUNCTION_ENTRY", "HistoryCompactor", "PydanticAICompaction", "compact_history"]

logger = logging.getLogger("normandy_pydantic_ai")

#: The entry point named in the option errors of :func:`compact_history`.
FUNCTION_ENTRY = "normandy_pydantic_ai.compact_history()"
#: ``OpaqueBlock.format`` of the parts carried without interpretation.
OPAQUE_FORMAT = "pydantic_ai"


@cache
def _part_adapter() -> TypeAdapter[Any]:
    return TypeAdapter(ModelResponsePart)


def _as_json(part: Any) -> dict[str, Any]:
    """A part as JSON, for an opaque block (counted, never altered)."""
    try:
        data = _part_adapter().dump_python(part, mode="json")
    except Exception:  # a request part, or one the union does not hold
        data = None
    if isinstance(data, dict):
        return data
    return {"part_kind": getattr(part, "part_kind", type(part).__name__), "repr": repr(part)}


class PydanticAICompaction(AdapterCompaction[ModelMessage]):
    """What :meth:`HistoryCompactor.run` returns: the core's
    :class:`~normandy_core.transcripts.adapter.AdapterCompaction` of a Pydantic AI history
    (``messages``, ``removed``, ``result``, ``compacted``), under this adapter's name."""


@dataclass
class _Read:
    """A history read into entries, with the way back to its messages and parts."""

    entries: list[Entry]
    by_entry: dict[str, tuple[ModelMessage, Entry]]
    #: per entry id, the internal tool-use id of each original ``tool_call_id``
    call_ids: dict[str, dict[str, str]]
    #: the digest of each message read
    digests: Digests = field(default_factory=dict)


#: Digests of messages seen by the last read: ``id(message) -> (message, digest)`` (the
#: message is held, so its ``id`` is not reused while it is in the table).
Digests = dict[int, tuple[ModelMessage, str]]


def _digest(msg: ModelMessage, known: Digests | None) -> str:
    hit = known.get(id(msg)) if known is not None else None
    if hit is not None and hit[0] is msg:
        return hit[1]
    raw = ModelMessagesTypeAdapter.dump_json([msg])
    return "pai-" + hashlib.sha256(raw).hexdigest()[:24]


def _message_id(
    msg: ModelMessage, seen: dict[str, int], known: Digests | None, fresh: Digests
) -> str:
    """A stable id for ``msg``: a digest of its serialized form (the same message gives
    the same id on every call), numbered when an identical message came before. ``known``
    holds the digests of the last read, reused for the same objects (messages are not
    changed in place by Pydantic AI); ``fresh`` receives this read's."""
    digest = _digest(msg, known)
    fresh[id(msg)] = (msg, digest)
    earlier = seen.get(digest, 0)
    seen[digest] = earlier + 1
    return digest if earlier == 0 else f"{digest}-{earlier}"


def _user_text(part: UserPromptPart) -> Block:
    if isinstance(part.content, str):
        return TextBlock(text=part.content)
    texts = [c for c in part.content if isinstance(c, str)]
    if len(texts) == len(part.content):
        return TextBlock(text="\n".join(texts))
    return OpaqueBlock(
        format=OPAQUE_FORMAT,
        kind="user-prompt",
        data={
            "text": "\n".join(texts),
            "items": [type(c).__name__ for c in part.content if not isinstance(c, str)],
        },
    )


def _opaque(part: Any) -> OpaqueBlock:
    """A part carried without interpretation (counted by its JSON form)."""
    kind = getattr(part, "part_kind", type(part).__name__)
    return OpaqueBlock(format=OPAQUE_FORMAT, kind=kind, data=_as_json(part))


def _result(part: ToolReturnPart | RetryPromptPart, internal: str) -> ToolResultBlock:
    """A tool's return (or its retry prompt, an error) as the result of call ``internal``."""
    if isinstance(part, RetryPromptPart):
        return ToolResultBlock(tool_use_id=internal, content=part.model_response(), is_error=True)
    return ToolResultBlock(tool_use_id=internal, content=part.model_response_str(), is_error=False)


#: The text tags of a compactor's marker (a note that carries nothing of the history).
_MARKER_TAGS = tuple(tag for tag, key in INSERTED_TAGS.items() if key == MARKER_KEY)


def _is_marker(part: Any) -> bool:
    return (
        isinstance(part, UserPromptPart)
        and isinstance(part.content, str)
        and part.content.startswith(_MARKER_TAGS)
    )


def without_merged_markers(msg: ModelMessage) -> ModelMessage:
    """``msg`` without the marker parts Pydantic AI merged into it (a request holding
    other parts too); ``msg`` itself when it holds none."""
    if not isinstance(msg, ModelRequest) or not any(_is_marker(p) for p in msg.parts):
        return msg
    rest = [p for p in msg.parts if not _is_marker(p)]
    if not rest:
        return msg  # a marker request of its own: the compactors recognise it as one
    return dataclasses.replace(msg, parts=rest)


def _newest_compaction(messages: Sequence[ModelMessage]) -> int:
    """The index of the newest response holding a ``CompactionPart`` (-1 when none)."""
    return max(
        (
            i
            for i, m in enumerate(messages)
            if isinstance(m, ModelResponse) and any(isinstance(p, CompactionPart) for p in m.parts)
        ),
        default=-1,
    )


class _Reader:
    """Reads a history's messages into blocks, in order: the tool-call ids used so far
    (one used again is numbered) and the calls of the response before each request."""

    def __init__(self) -> None:
        self.used: set[str] = set()
        self.open_calls: dict[str, str] = {}

    def response(self, msg: ModelResponse, ids: dict[str, str]) -> list[Block]:
        """The blocks of a response; ``ids`` receives its calls' internal ids."""
        self.open_calls = {}
        blocks: list[Block] = []
        for part in msg.parts:
            if isinstance(part, TextPart):
                blocks.append(TextBlock(text=part.content))
            elif isinstance(part, ThinkingPart):
                blocks.append(ThinkingBlock(thinking=part.content, signature=part.signature or ""))
            elif isinstance(part, ToolCallPart):
                internal = self.call_id(part.tool_call_id)
                ids[part.tool_call_id] = internal
                blocks.append(
                    ToolUseBlock(id=internal, name=part.tool_name, input=part.args_as_dict())
                )
            else:
                blocks.append(_opaque(part))
        return blocks

    def call_id(self, tool_call_id: str) -> str:
        """The internal id of a call: its own, numbered when an earlier call used it."""
        internal = tool_call_id
        number = 1
        while internal in self.used:
            internal = f"{tool_call_id}#{number}"
            number += 1
        self.used.add(internal)
        self.open_calls[tool_call_id] = internal
        return internal

    def request(self, msg: ModelRequest, ids: dict[str, str]) -> list[Block]:
        """The blocks of a request; ``ids`` receives the internal ids of the calls its
        results answer (those of the response right before it)."""
        blocks: list[Block] = []
        part: Any
        for part in msg.parts:
            if isinstance(part, SystemPromptPart):
                blocks.append(TextBlock(text=part.content))
            elif isinstance(part, UserPromptPart):
                blocks.append(_user_text(part))
            elif isinstance(part, ToolReturnPart) or (
                isinstance(part, RetryPromptPart) and part.tool_name is not None
            ):
                internal = self.open_calls.get(part.tool_call_id, part.tool_call_id)
                ids[part.tool_call_id] = internal
                blocks.append(_result(part, internal))
            elif isinstance(part, RetryPromptPart):
                blocks.append(TextBlock(text=part.model_response()))
            else:
                blocks.append(_opaque(part))
        self.open_calls = {}
        return blocks


def read_history(messages: Sequence[ModelMessage], known: Digests | None = None) -> _Read:
    """``messages`` as entries, one block per part (see the module's rules).

    Tool-call ids are used as the entries' tool-use ids; one that an earlier response
    already used (a test model's fixed ids, say) is numbered, so each pair stays
    unambiguous, and results are matched to the calls of the response right before them.
    """
    seen: dict[str, int] = {}
    reader = _Reader()
    newest_compaction = _newest_compaction(messages)
    read = _Read(entries=[], by_entry={}, call_ids={})
    for i, msg in enumerate(messages):
        eid = _message_id(msg, seen, known, read.digests)
        ids: dict[str, str] = {}
        if isinstance(msg, ModelResponse):
            blocks = reader.response(msg, ids)
            entry = Entry(
                id=eid, role="assistant", content=tuple(blocks), pinned=i == newest_compaction
            )
        else:
            blocks = reader.request(msg, ids)
            system = any(isinstance(p, SystemPromptPart) for p in msg.parts)
            only_system = system and all(isinstance(p, SystemPromptPart) for p in msg.parts)
            role = "system" if only_system else "user"
            entry = Entry(id=eid, role=role, content=tuple(blocks), pinned=system)
        read.entries.append(entry)
        read.by_entry[eid] = (msg, entry)
        read.call_ids[eid] = ids
    return read


def _changed(
    source: ModelMessage, before: Entry, after: Entry, ids: Mapping[str, str]
) -> ModelMessage:
    """``source`` with the parts of ``after``: a block found unchanged in ``before`` is its
    original part; a changed one is that part with its new content."""
    old = list(before.blocks)
    parts: list[Any] = list(source.parts)
    by_internal = {v: k for k, v in ids.items()}
    taken: set[int] = set()
    out: list[Any] = []
    for b in after.blocks:
        idx = next((j for j, block in enumerate(old) if j not in taken and block == b), None)
        if idx is not None:
            taken.add(idx)
            out.append(parts[idx])
            continue
        if isinstance(b, ToolResultBlock):
            original = by_internal.get(b.tool_use_id, b.tool_use_id)
            src = next(
                (
                    p
                    for p in parts
                    if getattr(p, "tool_call_id", None) == original
                    and not isinstance(p, ToolCallPart)
                ),
                None,
            )
            if isinstance(src, (ToolReturnPart, RetryPromptPart)):
                out.append(dataclasses.replace(src, content=b.text()))
                continue
        if isinstance(b, ToolUseBlock):
            original = by_internal.get(b.id, b.id)
            src = next(
                (p for p in parts if isinstance(p, ToolCallPart) and p.tool_call_id == original),
                None,
            )
            if src is not None:
                out.append(dataclasses.replace(src, args=dict(b.input)))
                continue
        if isinstance(b, ThinkingBlock):
            out.append(ThinkingPart(content=b.thinking, signature=b.signature or None))
        elif isinstance(b, TextBlock):
            out.append(
                TextPart(b.text) if isinstance(source, ModelResponse) else UserPromptPart(b.text)
            )
    changed: Any = source
    return dataclasses.replace(changed, parts=out)  # type: ignore[no-any-return]


def _created(entry: Entry) -> ModelMessage:
    """A message for an entry the compactor created (a marker or a summary)."""
    if entry.role == "assistant":
        return ModelResponse(parts=[TextPart(entry.text())])
    return ModelRequest(parts=[UserPromptPart(entry.text())])


def _mid_round(messages: Sequence[ModelMessage]) -> bool:
    """Whether the last message answers tool calls (the model is about to continue)."""
    if not messages or not isinstance(messages[-1], ModelRequest):
        return False
    return any(
        isinstance(p, ToolReturnPart) or (isinstance(p, RetryPromptPart) and p.tool_name)
        for p in messages[-1].parts
    )


class HistoryCompactor(NamedCompactor):
    """A compactor chosen by name, prepared once, for Pydantic AI message histories.

    The arguments are :class:`normandy_core.transcripts.adapter.NamedCompactor`'s (errors name
    ``entry``, by default ``normandy_pydantic_ai.compact_history()``).
    """

    default_entry = FUNCTION_ENTRY

    def _start(self) -> None:
        # What the last run read and returned: the digests of its messages and the
        # compacted memory, whose cached token counts carry over to entries kept by id
        # (ids are content digests, so an id always names the same content).
        self._digests: Digests = {}
        self._last: AgentMemory | None = None

    def run(
        self, messages: Sequence[ModelMessage], *, mid_round: bool | None = None
    ) -> PydanticAICompaction:
        """Compact ``messages`` once.

        ``mid_round`` says the last response's tool round is still open; left out, it is
        taken to be open when the last message is a request answering tool calls. Raises
        :class:`~normandy_core.TranscriptError` for a history whose tool pairs do not
        hold (a result answering no call of the response before it, a call left without
        its result anywhere but in the last response).
        """
        original = list(messages)
        if mid_round is None:
            mid_round = _mid_round(original)
        read = read_history([without_merged_markers(m) for m in original], self._digests)
        problems = pairing_problems(read.entries, allow_pending=True)
        if problems:
            raise TranscriptError(None, "parts", "; ".join(problems))
        last = self._last
        memory = (
            last.derive(read.entries)
            if last is not None
            else AgentMemory.from_entries(read.entries)
        )
        result = compact_with(self.config, memory, mid_round=mid_round, format="normandy")
        self._digests = read.digests
        self._last = result.memory
        if not result.compacted:
            return PydanticAICompaction(original, result)
        mapped = map_entries_back(
            result.memory,
            read.by_entry,
            lambda source, before, after: _changed(source, before, after, read.call_ids[after.id]),
            _created,
        )
        out = [m for m, _ in mapped]
        self.log(logger, len(original), len(out), result, "messages")
        return PydanticAICompaction.of(original, out, result)


def compact_history(
    messages: Sequence[ModelMessage],
    *,
    compactor: str | None = None,
    opts: Mapping[str, Any] | None = None,
    model: str | None = None,
    window: int | None = None,
    mid_round: bool | None = None,
    timeout: float | None = None,
    client: Any = None,
) -> list[ModelMessage]:
    """``messages`` compacted once by the compactor named ``compactor``.

    A tool call is never separated from its result, thinking stays with its response,
    and what is removed reaches the ``after_compact`` hooks. Kept messages come back as
    the same objects. The arguments are those of :class:`HistoryCompactor` (errors name
    ``normandy_pydantic_ai.compact_history()``) and :meth:`HistoryCompactor.run`.
    """
    return (
        HistoryCompactor(
            compactor, opts, model=model, window=window, timeout=timeout, client=client
        )
        .run(messages, mid_round=mid_round)
        .messages
    )
