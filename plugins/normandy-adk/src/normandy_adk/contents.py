"""Read a Google ADK request's contents (``google.genai`` ``Content`` objects) as Normandy
entries, and write a compacted conversation back as contents.

Each ``Content`` becomes one entry of an :class:`~normandy_core.AgentMemory`, one block per
part: a ``model`` content is an assistant entry, any other a user entry.

- A ``function_call`` part is a tool use, a ``function_response`` part its result.
  ADK removes its own call ids (``adk-...``) from the copies it puts in a request, so a
  response is paired with the call of the content right before it by id when both have
  one, else by name, in order; a parallel batch stays whole.
- A ``thought`` text part is a thinking block, which stays with its content.
- Any other part (files, inline data, code execution, server-side tool calls) is carried
  as an opaque block, counted by its JSON form, and moves with its content unaltered.

Entries are identified by a digest of the content, so the same content has the same id in
every call (ADK builds the request from the session's events anew before each call).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.genai import types

from normandy_core.conversation.entries import (
    Block,
    Entry,
    OpaqueBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

__all__ = ["OPAQUE_FORMAT", "Read", "changed_content", "created_content", "open_round", "read"]

#: ``OpaqueBlock.format`` of the parts carried without interpretation.
OPAQUE_FORMAT = "google_genai"

#: Digests of contents seen by the last read: ``id(content) -> (content, digest)`` (the
#: content is held, so its ``id`` is not reused while it is in the table).
Digests = dict[int, tuple[types.Content, str]]


@dataclass
class Read:
    """Contents read into entries, with the way back to each content and its parts."""

    entries: list[Entry] = field(default_factory=list)
    by_entry: dict[str, tuple[types.Content, Entry]] = field(default_factory=dict)
    #: per entry id, the internal tool-use id of each of its call or response parts
    #: (by part index)
    call_ids: dict[str, dict[int, str]] = field(default_factory=dict)
    digests: Digests = field(default_factory=dict)


def _digest(content: types.Content, known: Digests | None) -> str:
    hit = known.get(id(content)) if known is not None else None
    if hit is not None and hit[0] is content:
        return hit[1]
    raw = content.model_dump_json(exclude_none=True).encode()
    return "adk-" + hashlib.sha256(raw).hexdigest()[:24]


def response_text(response: Mapping[str, Any] | None) -> str:
    """A function response as the text the model reads: the ``result`` (or ``output``)
    string ADK wraps a tool's return in, else the whole response as JSON."""
    if not response:
        return ""
    if len(response) == 1:
        (value,) = response.values()
        if isinstance(value, str):
            return value
    return json.dumps(response, ensure_ascii=False, default=str)


def _opaque(part: types.Part) -> OpaqueBlock:
    """A part carried without interpretation (counted by its JSON form)."""
    data = part.model_dump(mode="json", exclude_none=True)
    kind = next(iter(data), "part")
    return OpaqueBlock(format=OPAQUE_FORMAT, kind=kind, data=data)


class _Reader:
    """Reads contents in order: the tool-use ids used so far (one used again is numbered)
    and the calls of the model content right before each user content."""

    def __init__(self) -> None:
        self.used: set[str] = set()
        self.open: list[tuple[str | None, str | None, str]] = []  # (name, given id, internal)

    def internal(self, given: str | None, fallback: str) -> str:
        base = given or fallback
        internal, number = base, 1
        while internal in self.used:
            internal = f"{base}#{number}"
            number += 1
        self.used.add(internal)
        return internal

    def model(self, content: types.Content, eid: str, ids: dict[int, str]) -> list[Block]:
        """The blocks of a model content; ``ids`` receives its calls' internal ids."""
        self.open = []
        blocks: list[Block] = []
        for j, part in enumerate(content.parts or []):
            call = part.function_call
            if call is not None:
                internal = self.internal(call.id, f"{eid}.{j}")
                ids[j] = internal
                self.open.append((call.name, call.id, internal))
                blocks.append(
                    ToolUseBlock(id=internal, name=call.name or "", input=dict(call.args or {}))
                )
            elif part.thought and part.text is not None:
                blocks.append(ThinkingBlock(thinking=part.text, signature=_signature(part)))
            elif part.text is not None and not part.thought:
                blocks.append(TextBlock(text=part.text))
            else:
                blocks.append(_opaque(part))
        return blocks

    def answering(self, response: types.FunctionResponse) -> str | None:
        """The internal id of the open call ``response`` answers (by id, else by name)."""
        for k, (name, given, internal) in enumerate(self.open):
            if (response.id and given == response.id) or (
                not (response.id and given) and name == response.name
            ):
                del self.open[k]
                return internal
        return None

    def user(self, content: types.Content, eid: str, ids: dict[int, str]) -> list[Block]:
        """The blocks of a user content; ``ids`` receives the internal ids of the calls its
        responses answer (those of the model content right before it)."""
        blocks: list[Block] = []
        for j, part in enumerate(content.parts or []):
            response = part.function_response
            if response is not None:
                internal = self.answering(response) or self.internal(
                    response.id, f"{response.name or 'response'}@{eid}.{j}"
                )
                ids[j] = internal
                blocks.append(
                    ToolResultBlock(tool_use_id=internal, content=response_text(response.response))
                )
            elif part.text is not None and not part.thought:
                blocks.append(TextBlock(text=part.text))
            else:
                blocks.append(_opaque(part))
        self.open = []
        return blocks


def _signature(part: types.Part) -> str:
    sig = part.thought_signature
    return sig.hex() if sig else ""


def read(
    contents: Sequence[types.Content],
    known: Digests | None = None,
    created: Mapping[int, tuple[types.Content, Entry]] | None = None,
) -> Read:
    """``contents`` as entries, one block per part (see the module's rules).

    ``known`` holds the digests of an earlier read, reused for the same objects (ADK
    does not change a request's contents in place). ``created`` maps the contents an
    earlier compaction created (its markers and summaries, by ``id``) to their entries,
    which are taken as they were: a note keeps its id and what marks it as one. An
    identical content that came before gets a numbered id, so each entry's id is unique.
    """
    seen: dict[str, int] = {}
    reader = _Reader()
    out = Read()
    for content in contents:
        note = created.get(id(content)) if created is not None else None
        if note is not None and note[0] is content:
            reader.open = []  # a note answers no call and makes none
            out.entries.append(note[1])
            out.by_entry[note[1].id] = (content, note[1])
            out.call_ids[note[1].id] = {}
            continue
        digest = _digest(content, known)
        out.digests[id(content)] = (content, digest)
        earlier = seen.get(digest, 0)
        seen[digest] = earlier + 1
        eid = digest if earlier == 0 else f"{digest}-{earlier}"
        ids: dict[int, str] = {}
        if content.role == "model":
            entry = Entry(id=eid, role="assistant", content=tuple(reader.model(content, eid, ids)))
        else:
            entry = Entry(id=eid, role="user", content=tuple(reader.user(content, eid, ids)))
        out.entries.append(entry)
        out.by_entry[eid] = (content, entry)
        out.call_ids[eid] = ids
    return out


def open_round(contents: Sequence[types.Content]) -> bool:
    """Whether the model is about to continue a tool round: the last content holds
    function responses."""
    if not contents or contents[-1].role == "model":
        return False
    return any(p.function_response is not None for p in contents[-1].parts or [])


def _changed_part(block: Block, source: types.Content, ids: Mapping[int, str]) -> types.Part:
    """The part of a block the compactor changed: the original part (found by its tool
    id) with the new result or input, or a new part."""
    by_internal = {internal: j for j, internal in ids.items()}
    parts = source.parts or []
    if isinstance(block, ToolResultBlock) and block.tool_use_id in by_internal:
        part = parts[by_internal[block.tool_use_id]]
        if part.function_response is not None:
            new = {"result": block.text()}
            response = part.function_response.model_copy(update={"response": new})
            return part.model_copy(update={"function_response": response})
    if isinstance(block, ToolUseBlock) and block.id in by_internal:
        part = parts[by_internal[block.id]]
        if part.function_call is not None:
            call = part.function_call.model_copy(update={"args": dict(block.input)})
            return part.model_copy(update={"function_call": call})
    if isinstance(block, ThinkingBlock):
        return types.Part(text=block.thinking, thought=True)
    if isinstance(block, OpaqueBlock):
        return types.Part.model_validate(dict(block.data))
    if isinstance(block, TextBlock):
        return types.Part(text=block.text)
    # another block a compactor made (none of the in-tree ones does): its JSON as text
    return types.Part(text=block.model_dump_json())


def changed_content(
    source: types.Content, before: Entry, after: Entry, ids: Mapping[int, str]
) -> types.Content:
    """``source`` with the parts of ``after``: a block found unchanged in ``before`` is
    its original part, a changed one that part with its new content."""
    old = list(before.blocks)
    parts = list(source.parts or [])
    taken: set[int] = set()
    out: list[types.Part] = []
    for block in after.blocks:
        idx = next((j for j, b in enumerate(old) if j not in taken and b == block), None)
        if idx is not None:
            taken.add(idx)
            out.append(parts[idx])
        else:
            out.append(_changed_part(block, source, ids))
    return source.model_copy(update={"parts": out})


def created_content(entry: Entry) -> types.Content:
    """A content for an entry the compactor created (a marker or a summary)."""
    role = "model" if entry.role == "assistant" else "user"
    return types.Content(role=role, parts=[types.Part(text=entry.text())])
