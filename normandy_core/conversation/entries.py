"""Entries and their content blocks: the immutable messages of a conversation.

An :class:`Entry` is one message under a stable ``id``, linked to its parent by
``parent_id``; its ``content`` is text or a tuple of typed blocks (text, thinking,
redacted thinking, tool use, tool result, image, document, and opaque provider blocks).
Entries are frozen, deep down: an entry's ``metadata`` and the JSON objects of its blocks
(a tool use's ``input``, an image's ``source``, an opaque block's ``data``) are read-only
(:class:`FrozenDict`, :class:`FrozenList`), so no compactor, hook or abandoned thread can
change an entry that the caller or another hook holds.
:mod:`normandy_core.conversation.memory` links them into a graph.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, ClassVar, Literal, NoReturn, SupportsIndex

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from typing_extensions import Self

__all__ = [
    "BLOCK_TYPES",
    "EMPTY_METADATA",
    "Block",
    "Content",
    "DocumentBlock",
    "Entry",
    "FrozenDict",
    "FrozenList",
    "ImageBlock",
    "OpaqueBlock",
    "RedactedThinkingBlock",
    "Role",
    "TextBlock",
    "ThinkingBlock",
    "ToolResultBlock",
    "ToolUseBlock",
    "freeze",
    "new_id",
]

Role = Literal["system", "user", "assistant", "tool"]


def _read_only(kind: str) -> NoReturn:
    raise TypeError(
        f"this {kind} of an entry is read-only: entries never change once made; build a "
        "new one (entry.model_copy(update={'metadata': {**entry.metadata, key: value}}))"
    )


class FrozenDict(dict[str, Any]):
    """A read-only ``dict``: an entry's ``metadata``, and every JSON object inside it or
    inside a block.

    Made with its values frozen (:func:`freeze`), so it is read-only all the way down.
    Every mutating method raises ``TypeError``; reading, ``==``, ``json.dumps``, pickling
    and ``isinstance(x, dict)`` work as for a ``dict``, and ``dict(x)`` or ``x.copy()``
    give a mutable (shallow) copy.
    """

    __slots__ = ()

    def __init__(self, data: Mapping[str, Any] | Iterable[tuple[str, Any]] = (), /) -> None:
        pairs = data.items() if isinstance(data, Mapping) else data
        super().__init__((key, freeze(value)) for key, value in pairs)

    def __reduce__(self) -> tuple[type[FrozenDict], tuple[dict[str, Any]]]:
        # made again through __init__ (pickle and copy would otherwise set items one by one)
        return (FrozenDict, (dict(self),))

    def __setitem__(self, key: str, value: Any) -> NoReturn:
        _read_only("mapping")

    def __delitem__(self, key: str) -> NoReturn:
        _read_only("mapping")

    def __ior__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _read_only("mapping")

    def clear(self) -> NoReturn:
        _read_only("mapping")

    def pop(self, *args: Any) -> NoReturn:
        _read_only("mapping")

    def popitem(self) -> NoReturn:
        _read_only("mapping")

    def setdefault(self, *args: Any) -> NoReturn:
        _read_only("mapping")

    def update(self, *args: Any, **kwargs: Any) -> NoReturn:
        _read_only("mapping")


class FrozenList(list[Any]):
    """A read-only ``list``: every JSON array inside an entry's metadata or a block.

    Made with its items frozen (:func:`freeze`); every mutating method raises
    ``TypeError``, and it reads, compares and serializes as a ``list``.
    """

    __slots__ = ()

    def __init__(self, items: Iterable[Any] = (), /) -> None:
        super().__init__(freeze(item) for item in items)

    def __reduce__(self) -> tuple[type[FrozenList], tuple[list[Any]]]:
        return (FrozenList, (list(self),))

    def __setitem__(self, index: Any, value: Any) -> NoReturn:
        _read_only("list")

    def __delitem__(self, index: SupportsIndex | slice) -> NoReturn:
        _read_only("list")

    def __iadd__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _read_only("list")

    def __imul__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _read_only("list")

    def append(self, item: Any) -> NoReturn:
        _read_only("list")

    def extend(self, items: Any) -> NoReturn:
        _read_only("list")

    def insert(self, index: Any, item: Any) -> NoReturn:
        _read_only("list")

    def pop(self, *args: Any) -> NoReturn:
        _read_only("list")

    def remove(self, item: Any) -> NoReturn:
        _read_only("list")

    def clear(self) -> NoReturn:
        _read_only("list")

    def sort(self, *args: Any, **kwargs: Any) -> NoReturn:
        _read_only("list")

    def reverse(self) -> NoReturn:
        _read_only("list")


#: What needs no freezing: immutable JSON scalars, and what is frozen already.
_FROZEN_TYPES = frozenset((str, int, float, bool, type(None), FrozenDict, FrozenList))


def freeze(value: Any) -> Any:
    """``value`` made read-only all the way down, equal to it.

    Mappings become :class:`FrozenDict`, lists :class:`FrozenList`, tuples tuples of
    frozen items and sets ``frozenset``; scalars and what is frozen already are returned
    as they are (so freezing twice costs nothing). Other objects are kept as given:
    metadata is meant to be JSON.
    """
    kind = type(value)
    if kind in _FROZEN_TYPES:
        return value
    if isinstance(value, Mapping):
        return FrozenDict(value)
    if isinstance(value, list):
        return FrozenList(value)
    if isinstance(value, tuple):
        return tuple(freeze(item) for item in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(value)
    return value


def _freeze_mapping(value: Mapping[str, Any]) -> FrozenDict:
    return value if type(value) is FrozenDict else FrozenDict(value)


#: The metadata of an entry without any (shared: it cannot change).
EMPTY_METADATA = FrozenDict()

#: A JSON object field of an entry or block: validated as a mapping, kept read-only.
ReadOnlyObject = Annotated[Mapping[str, Any], AfterValidator(_freeze_mapping)]


class _Sealed(BaseModel):
    """A frozen model whose JSON-object fields (``_read_only_fields``) are read-only too,
    however it is made: validated, copied with ``model_copy(update=...)`` or built with
    ``model_construct``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    _read_only_fields: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def _frozen_fields(cls, fields: Mapping[str, Any]) -> Mapping[str, Any]:
        """``fields`` with every read-only field's value frozen (the same mapping when
        they are frozen already, the common case)."""
        for name in cls._read_only_fields:
            if name in fields and type(fields[name]) is not FrozenDict:
                fields = {**fields, name: _freeze_mapping(fields[name])}
        return fields

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` applied (unvalidated, as pydantic's), its read-only
        fields frozen."""
        if update:
            update = self._frozen_fields(update)
        return super().model_copy(update=update, deep=deep)

    @classmethod
    # the pydantic mypy plugin types model_construct with each model's own fields
    def model_construct(  # type: ignore[override]
        cls, _fields_set: set[str] | None = None, **values: Any
    ) -> Self:
        """An unvalidated instance (as pydantic's), its read-only fields frozen."""
        return super().model_construct(_fields_set, **cls._frozen_fields(values))


class _Block(_Sealed):
    pass


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
    source: ReadOnlyObject
    _read_only_fields = ("source",)


class DocumentBlock(_Block):
    """A document (PDF or text) by ``source``, with an optional title."""

    type: Literal["document"] = "document"
    source: ReadOnlyObject
    title: str | None = None
    _read_only_fields = ("source",)


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
    data: ReadOnlyObject
    use_id: str | None = None
    answers: str | None = None
    reasoning: bool = False
    _read_only_fields = ("data",)


ResultPart = Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]


class ToolUseBlock(_Block):
    """The model's call of tool ``name`` with JSON ``input``; ``id`` pairs it with its result."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: ReadOnlyObject = Field(default_factory=lambda: EMPTY_METADATA)
    _read_only_fields = ("input",)


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


class Entry(_Sealed):
    """One message of the conversation, under a stable ``id``.

    ``parent_id`` links it into the memory's graph, ``turn_id`` names the agent turn that
    produced it, and ``pinned`` entries are never removed by a compactor. ``metadata`` is
    free-form JSON for plugins (the summarize strategy marks its summaries there), kept
    read-only (a :class:`FrozenDict`, frozen all the way down): an entry with other
    metadata is a new entry, ``entry.model_copy(update={"metadata": {...}})``.
    """

    id: str = Field(min_length=1)
    parent_id: str | None = None
    turn_id: str | None = None
    role: Role
    content: Content
    pinned: bool = False
    metadata: ReadOnlyObject = Field(default_factory=lambda: EMPTY_METADATA)
    _read_only_fields = ("metadata",)

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
