"""Entries and their content blocks: the immutable messages of a conversation.

An :class:`Entry` is one message under a stable ``id``, linked to its parent by
``parent_id``; its ``content`` is text or a tuple of typed blocks (text, thinking,
redacted thinking, tool use, tool result, image, document, and opaque provider blocks).
Entries are frozen. :mod:`normandy_core.conversation.memory` links them into a graph.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "BLOCK_TYPES",
    "Block",
    "Content",
    "DocumentBlock",
    "Entry",
    "ImageBlock",
    "OpaqueBlock",
    "RedactedThinkingBlock",
    "Role",
    "TextBlock",
    "ThinkingBlock",
    "ToolResultBlock",
    "ToolUseBlock",
    "new_id",
]

Role = Literal["system", "user", "assistant", "tool"]


class _Block(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TextBlock(_Block):
    """Plain text."""

    type: Literal["text"] = "text"
    text: str


class ThinkingBlock(_Block):
    """A model's extended-thinking block; ``signature`` lets the provider verify it on replay."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(_Block):
    """Thinking the provider encrypted; replayed as the opaque ``data`` it came with."""

    type: Literal["redacted_thinking"] = "redacted_thinking"
    data: str


class ImageBlock(_Block):
    """An image, by ``source`` (``{"type": "base64", "media_type", "data"}`` or a URL)."""

    type: Literal["image"] = "image"
    source: dict[str, Any]


class DocumentBlock(_Block):
    """A document (PDF or text) by ``source``, with an optional title."""

    type: Literal["document"] = "document"
    source: dict[str, Any]
    title: str | None = None


class OpaqueBlock(_Block):
    """A provider block or item the conversation carries without interpreting it.

    ``format`` is the wire format it came in (``"anthropic"``, ``"openai"`` for Chat
    Completions, ``"responses"`` for the OpenAI Responses API), ``kind`` its type there
    (``"server_tool_use"``, ``"mcp_call"``, ``"compaction"``...) and ``data`` the block
    as given, as JSON. It moves with its entry and is never altered. ``use_id`` marks a
    call answered in a later entry by an opaque block whose ``answers`` is that id (the
    Responses API's ``computer_call`` and ``computer_call_output``, for instance): the
    pair is kept or dropped together, like a tool use and its result. ``reasoning``
    marks provider reasoning that stripping thinking may remove.
    """

    type: Literal["opaque"] = "opaque"
    format: str
    kind: str
    data: dict[str, Any]
    use_id: str | None = None
    answers: str | None = None
    reasoning: bool = False


ResultPart = Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]


class ToolUseBlock(_Block):
    """The model's call of tool ``name`` with JSON ``input``; ``id`` pairs it with its result."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(_Block):
    """The result of the tool use whose id is ``tool_use_id``."""

    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: str | tuple[ResultPart, ...] = ""
    is_error: bool = False

    def text(self) -> str:
        """The result's text parts, joined by newlines."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content if isinstance(p, TextBlock))


Block = Annotated[
    TextBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ToolUseBlock
    | ToolResultBlock
    | ImageBlock
    | DocumentBlock
    | OpaqueBlock,
    Field(discriminator="type"),
]
#: An entry's content: plain text, or a tuple of typed blocks.
Content = str | tuple[Block, ...]

_THINKING = (ThinkingBlock, RedactedThinkingBlock)


def _is_thinking(block: object) -> bool:
    return isinstance(block, _THINKING) or (isinstance(block, OpaqueBlock) and block.reasoning)


#: Where :func:`new_id` gets its 16 random bytes (a replay that must repeat its ids, as
#: the quality benchmark's does, swaps in a seeded source).
_random_bytes = os.urandom


def new_id() -> str:
    """A fresh entry id (32 hex characters: a random version-4 UUID's ``hex``).

    Made from 16 random bytes directly, as :func:`uuid.uuid4` does, without building a
    ``UUID`` object (two per tool batch in a turn).
    """
    raw = bytearray(_random_bytes(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # the RFC 4122 variant
    return raw.hex()


class Entry(BaseModel):
    """One message of the conversation, under a stable ``id``.

    ``parent_id`` links it into the memory's graph, ``turn_id`` names the agent turn that
    produced it, and ``pinned`` entries are never removed by a compactor. ``metadata`` is
    free-form JSON for plugins (the summarize strategy marks its summaries there).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1)
    parent_id: str | None = None
    turn_id: str | None = None
    role: Role
    content: Content
    pinned: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def blocks(self) -> tuple[Block, ...]:
        """The content as blocks (plain text becomes one :class:`TextBlock`)."""
        if isinstance(self.content, str):
            return (TextBlock(text=self.content),) if self.content else ()
        return self.content

    @property
    def tool_uses(self) -> list[ToolUseBlock]:
        """The tool-use blocks of this entry, in order."""
        if isinstance(self.content, str):
            return []
        return [b for b in self.content if isinstance(b, ToolUseBlock)]

    @property
    def tool_results(self) -> list[ToolResultBlock]:
        """The tool-result blocks of this entry, in order."""
        if isinstance(self.content, str):
            return []
        return [b for b in self.content if isinstance(b, ToolResultBlock)]

    @property
    def has_thinking(self) -> bool:
        """Whether the entry holds a thinking or redacted-thinking block."""
        if isinstance(self.content, str):
            return False
        return any(_is_thinking(b) for b in self.content)

    def text(self) -> str:
        """The entry's text, tool-result texts included, joined by newlines."""
        if isinstance(self.content, str):
            return self.content
        parts: list[str] = []
        for b in self.content:
            if isinstance(b, TextBlock):
                parts.append(b.text)
            elif isinstance(b, ToolResultBlock):
                parts.append(b.text())
        return "\n".join(parts)

    def without_thinking(self) -> Entry:
        """This entry without thinking blocks (the same object when it has none)."""
        if not self.has_thinking:
            return self
        assert not isinstance(self.content, str)
        kept = tuple(b for b in self.content if not _is_thinking(b))
        return self.model_copy(update={"content": kept})


#: Every block type of the content model, in a fixed order.
BLOCK_TYPES = (
    TextBlock,
    ThinkingBlock,
    RedactedThinkingBlock,
    ToolUseBlock,
    ToolResultBlock,
    ImageBlock,
    DocumentBlock,
    OpaqueBlock,
)
