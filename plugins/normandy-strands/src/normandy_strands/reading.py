"""Strands messages (Bedrock Converse shaped dicts) read as Normandy entries, and back.

Each Strands ``Message`` becomes one :class:`~normandy_core.Entry`, one block per content
block:

- ``toolUse`` is a tool use and ``toolResult`` its result, so a call and its result are
  kept or dropped together; results pair with the calls of the assistant message right
  before them (an id an earlier call already used is numbered, so each pair stays
  unambiguous).
- ``reasoningContent`` is thinking (its signature kept), or redacted thinking.
- ``text`` is text; anything else (images, documents, cache points, guard content...)
  is carried as an opaque block, counted by its JSON form, and moves with its message.
- A message Strands pins (``metadata.custom.pinned``) is pinned: no compactor removes it.

The agent's system prompt and tool specs are read as one pinned system entry ahead of the
messages, so they are counted against the window with the real tokenizer; it is never
written back.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strands.types.content import Message, Role

from normandy_core.conversation.entries import (
    Block,
    Entry,
    OpaqueBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from normandy_core.transcripts.formats import inserted_key

__all__ = [
    "CREATED_KEY",
    "Read",
    "SYSTEM_ID",
    "bridge_message",
    "created_message",
    "is_created",
    "read_messages",
]

#: ``OpaqueBlock.format`` of the content blocks carried without interpretation.
OPAQUE_FORMAT = "strands"
#: The id of the entry holding the system prompt and the tool specs.
SYSTEM_ID = "strands-system"
#: The ``metadata.custom`` key marking a message a compactor created (a marker or a
#: summary): removing it later removes nothing the user or the model said.
CREATED_KEY = "normandy_created"


def _plain(value: Any) -> Any:
    """``value`` made JSON-able for digests and counting (bytes by their digest)."""
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes sha256:{hashlib.sha256(value).hexdigest()[:16]}>"
    return repr(value)


def _json(value: Any) -> str:
    return json.dumps(value, default=_plain, sort_keys=True, ensure_ascii=False)


def _result_text(items: Sequence[Mapping[str, Any]]) -> str:
    """A ``toolResult``'s content as the text it sends (JSON items as JSON)."""
    parts = []
    for item in items:
        if "text" in item:
            parts.append(str(item["text"]))
        elif "json" in item:
            parts.append(_json(item["json"]))
        else:
            parts.append(_json(item))
    return "\n".join(parts)


def _thinking(reasoning: Mapping[str, Any]) -> Block:
    text = reasoning.get("reasoningText")
    if isinstance(text, Mapping):
        return ThinkingBlock(
            thinking=str(text.get("text", "")), signature=str(text.get("signature") or "")
        )
    redacted = reasoning.get("redactedContent")
    if redacted is not None:
        return RedactedThinkingBlock(data=_plain(redacted) if isinstance(redacted, bytes) else "")
    return OpaqueBlock(
        format=OPAQUE_FORMAT,
        kind="reasoningContent",
        data=json.loads(_json(reasoning)),
        reasoning=True,
    )


def is_created(message: Mapping[str, Any]) -> bool:
    """Whether ``message`` is one a compactor created (a marker or a summary)."""
    custom = (message.get("metadata") or {}).get("custom") or {}
    return bool(custom.get(CREATED_KEY))


def _pinned(message: Mapping[str, Any]) -> bool:
    custom = (message.get("metadata") or {}).get("custom") or {}
    return custom.get("pinned") is True


def created_message(text: str, role: Role = "user") -> Message:
    """A Strands message holding ``text`` that a compactor (or this adapter) created,
    marked as created so removing it later is not counted as a removed message."""
    return {
        "role": role,
        "content": [{"text": text}],
        "tracking_id": str(uuid.uuid4()),
        "metadata": {"custom": {CREATED_KEY: True}},
    }


#: The text of the marker put between two kept messages of one role, which providers
#: (Bedrock's Converse API among them) refuse; tagged, so the next compaction replaces it.
BRIDGE_TEXT = "[normandy:marker] Earlier messages were removed here to fit the context window."


def bridge_message(role: Role) -> Message:
    """A created marker message in ``role``, to keep the roles alternating."""
    return created_message(BRIDGE_TEXT, role)


def _metadata(msg: Message) -> dict[str, Any]:
    """An entry's metadata: the message's ``tracking_id``, and the key of the tag its
    text opens with (a marker or summary, which the next compaction recognises)."""
    metadata: dict[str, Any] = {}
    if msg.get("tracking_id"):
        metadata["tracking_id"] = msg["tracking_id"]
    first = next((b for b in msg.get("content", []) if "text" in b), None)
    key = inserted_key(str(first["text"])) if first is not None else None
    if key is not None:
        metadata[key] = True
    return metadata


@dataclass
class Read:
    """Messages read into entries, with the way back from each entry to its message."""

    entries: list[Entry] = field(default_factory=list)
    #: per entry id, the message it was read from and the entry as read
    by_entry: dict[str, tuple[Message, Entry]] = field(default_factory=dict)
    #: per entry id, the original ``toolUseId`` of each internal tool-use id
    originals: dict[str, dict[str, str]] = field(default_factory=dict)
    #: what this read saw of each message, for the next (:class:`Seen`)
    digests: Digests = field(default_factory=dict)


@dataclass(frozen=True)
class Seen:
    """What a read remembers of a message for the next: the message (held, so its ``id``
    is not reused) with its content list (replaced when Strands or a plugin changes the
    message), its digest, and the entry it became with its tool-use ids."""

    message: Message
    content: Any
    digest: str
    entry: Entry
    #: internal tool-use id -> original ``toolUseId``, as :attr:`Read.originals`
    ids: dict[str, str]
    #: the calls it leaves open for the next message: original -> internal id
    calls: dict[str, str]


#: What a read remembers, by ``id(message)``.
Digests = dict[int, Seen]


class _Reader:
    """Reads messages in order: the tool-use ids used so far, and the calls still open."""

    def __init__(self, known: Digests) -> None:
        self.known = known
        self.used: set[str] = set()
        self.open_calls: dict[str, str] = {}
        self.seen: dict[str, int] = {}

    def read(self, msg: Message, read: Read) -> tuple[Entry, dict[str, str]]:
        """``msg`` as an entry, and the original of each of its internal tool-use ids.

        Its id is the digest of its role, content and ``tracking_id``, numbered when an
        equal message came before, so one message keeps one id across calls. A message
        handed over again as it was (the same object and content list) is not read again
        when its tool-use ids need no numbering here either.
        """
        hit = self.known.get(id(msg))
        content = msg.get("content")
        if hit is None or hit.message is not msg or hit.content is not content:
            # the tracking id too: two created markers of one text are two messages
            raw = _json({"role": msg.get("role"), "content": content, "id": msg.get("tracking_id")})
            digest = "strands-" + hashlib.sha256(raw.encode()).hexdigest()[:24]
        elif self._reusable(msg, hit):
            self.seen[hit.digest] = 1
            self.used.update(hit.ids)
            self.open_calls = hit.calls
            read.digests[id(msg)] = hit
            return hit.entry, hit.ids
        else:
            digest = hit.digest
        earlier = self.seen.get(digest, 0)
        self.seen[digest] = earlier + 1
        ids: dict[str, str] = {}
        blocks = self.blocks(msg, ids)
        entry = _entry(msg, digest if earlier == 0 else f"{digest}-{earlier}", blocks)
        read.digests[id(msg)] = Seen(msg, content, digest, entry, ids, self.open_calls)
        return entry, ids

    def _reusable(self, msg: Message, hit: Seen) -> bool:
        """Whether ``hit``'s entry is what reading ``msg`` here would give: its id and
        tool-use ids unnumbered, its results answering the open calls as before, its pin
        (which Strands sets in place) unchanged."""
        if hit.entry.id != hit.digest or hit.digest in self.seen:
            return False
        if _pinned(msg) != hit.entry.pinned or any(k != v for k, v in hit.ids.items()):
            return False
        if any(use in self.used for use in hit.calls.values()):
            return False
        answered = {o for o in hit.ids.values() if o not in hit.calls}
        return all(self.open_calls.get(o, o) == o for o in answered)

    def call_id(self, tool_use_id: str) -> str:
        internal, number = tool_use_id, 1
        while internal in self.used:
            internal, number = f"{tool_use_id}#{number}", number + 1
        self.used.add(internal)
        return internal

    def blocks(self, msg: Message, ids: dict[str, str]) -> list[Block]:
        """The blocks of ``msg``; ``ids`` receives each internal tool-use id's original."""
        blocks: list[Block] = []
        calls: dict[str, str] = {}
        for raw in msg.get("content", []):
            block: Mapping[str, Any] = raw
            if "text" in block:
                blocks.append(TextBlock(text=str(block["text"])))
            elif "toolUse" in block:
                use = block["toolUse"]
                original = str(use["toolUseId"])
                internal = self.call_id(original)
                calls[original] = internal
                ids[internal] = original
                blocks.append(
                    ToolUseBlock(id=internal, name=str(use["name"]), input=_as_input(use))
                )
            elif "toolResult" in block:
                res = block["toolResult"]
                internal = self.open_calls.get(str(res["toolUseId"]), str(res["toolUseId"]))
                ids[internal] = str(res["toolUseId"])
                blocks.append(
                    ToolResultBlock(
                        tool_use_id=internal,
                        content=_result_text(res.get("content", [])),
                        is_error=res.get("status") == "error",
                    )
                )
            elif "reasoningContent" in block:
                blocks.append(_thinking(block["reasoningContent"]))
            else:
                kind = next(iter(block), "unknown")
                blocks.append(
                    OpaqueBlock(format=OPAQUE_FORMAT, kind=kind, data=json.loads(_json(block)))
                )
        self.open_calls = calls
        return blocks


def _entry(msg: Message, eid: str, blocks: list[Block]) -> Entry:
    metadata = _metadata(msg)
    # a marker or summary is a user entry for the compactors, whatever role the
    # alternation gave its message
    created = is_created(msg) and len(metadata) > 1
    role = "assistant" if msg.get("role") == "assistant" and not created else "user"
    return Entry(id=eid, role=role, content=tuple(blocks), pinned=_pinned(msg), metadata=metadata)


def _as_input(use: Mapping[str, Any]) -> dict[str, Any]:
    given = use.get("input")
    if isinstance(given, Mapping):
        return json.loads(_json(given))  # type: ignore[no-any-return]
    return {"input": given}


def system_entry(system_prompt: str | None, tool_specs: Sequence[Any]) -> Entry | None:
    """The pinned entry counting the system prompt and the tool specs (``None``: neither)."""
    parts = [system_prompt] if system_prompt else []
    if tool_specs:
        parts.append(_json(list(tool_specs)))
    if not parts:
        return None
    return Entry(
        id=SYSTEM_ID, role="system", content=(TextBlock(text="\n".join(parts)),), pinned=True
    )


def read_messages(
    messages: Sequence[Message], known: Digests | None = None, system: Entry | None = None
) -> Read:
    """``messages`` as entries (see the module's rules), after ``system`` when given.

    ``known`` is the last read's :attr:`Read.digests`, so a message handed over again as
    it was is not read again.
    """
    reader = _Reader(known or {})
    read = Read()
    if system is not None:
        read.entries.append(system)
    for msg in messages:
        entry, ids = reader.read(msg, read)
        read.entries.append(entry)
        read.by_entry[entry.id] = (msg, entry)
        read.originals[entry.id] = ids
    return read
