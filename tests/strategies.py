"""Reusable hypothesis strategies for Normandy's conversation model.

- ``json_values()``: JSON-exact values (no NaN or infinities, no tuples).
- ``text_blocks()``, ``thinking_blocks()``, ``redacted_thinking_blocks()``, ``image_blocks()``,
  ``document_blocks()``, ``tool_use_blocks()``, ``tool_result_blocks()``, ``blocks()``.
- ``contents()``: an entry's content (plain text or a tuple of blocks).
- ``entries()``: standalone :class:`Entry` objects.
- ``steps()`` and ``conversations()``: scripts of conversation steps, replayed with
  :func:`build` into an :class:`AgentMemory`: plain messages (some pinned, with metadata),
  assistant turns with thinking and signatures, parallel tool-use batches whose results
  come in one or several entries, and forks that branch off an earlier entry.
- ``memories()``: the memory a conversation builds.

Strategies are built once and reused (``functools.cache``): building them anew inside
every draw would dominate the run time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from hypothesis import strategies as st

from normandy_core import (
    AgentMemory,
    DocumentBlock,
    Entry,
    ImageBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

ROLES = ("system", "user", "assistant", "tool")

short_text = st.text(max_size=40)
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
ids = st.text(alphabet="0123456789abcdef", min_size=8, max_size=12)
turn_ids = st.none() | st.sampled_from(["t1", "t2", "t3"])


@cache
def json_values(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """Values that survive a JSON round trip exactly."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**53), max_value=2**53)
        | st.floats(allow_nan=False, allow_infinity=False)
        | short_text
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(short_text, inner, max_size=3),
        max_leaves=max_leaves,
    )


@cache
def json_objects() -> st.SearchStrategy[dict[str, Any]]:
    """JSON objects (tool inputs, metadata)."""
    return st.dictionaries(short_text, json_values(), max_size=3)


@cache
def text_blocks() -> st.SearchStrategy[TextBlock]:
    return st.builds(TextBlock, text=short_text)


@cache
def thinking_blocks() -> st.SearchStrategy[ThinkingBlock]:
    """Thinking with a signature (sometimes empty, as a provider may send)."""
    return st.builds(ThinkingBlock, thinking=short_text, signature=st.text(max_size=24))


@cache
def redacted_thinking_blocks() -> st.SearchStrategy[RedactedThinkingBlock]:
    return st.builds(RedactedThinkingBlock, data=st.text(min_size=1, max_size=40))


@cache
def _sources() -> st.SearchStrategy[dict[str, Any]]:
    base64 = st.fixed_dictionaries(
        {
            "type": st.just("base64"),
            "media_type": st.sampled_from(["image/png", "image/jpeg", "application/pdf"]),
            "data": st.text(alphabet="ABCDEFGHabcdefgh0123456789+/=", max_size=40),
        }
    )
    url = st.fixed_dictionaries(
        {"type": st.just("url"), "url": names.map(lambda p: f"https://example.com/{p}.png")}
    )
    text = st.fixed_dictionaries(
        {"type": st.just("text"), "media_type": st.just("text/plain"), "data": short_text}
    )
    return base64 | url | text


@cache
def image_blocks() -> st.SearchStrategy[ImageBlock]:
    return st.builds(ImageBlock, source=_sources())


@cache
def document_blocks() -> st.SearchStrategy[DocumentBlock]:
    return st.builds(DocumentBlock, source=_sources(), title=st.none() | short_text)


@cache
def tool_use_blocks(id: st.SearchStrategy[str] = ids) -> st.SearchStrategy[ToolUseBlock]:
    return st.builds(ToolUseBlock, id=id, name=names, input=json_objects())


@cache
def tool_result_blocks(
    tool_use_id: st.SearchStrategy[str] = ids,
) -> st.SearchStrategy[ToolResultBlock]:
    parts = st.lists(text_blocks() | image_blocks() | document_blocks(), max_size=3).map(tuple)
    return st.builds(
        ToolResultBlock,
        tool_use_id=tool_use_id,
        content=short_text | parts,
        is_error=st.booleans(),
    )


@cache
def blocks() -> st.SearchStrategy[Any]:
    """Any content block."""
    return st.one_of(
        text_blocks(),
        thinking_blocks(),
        redacted_thinking_blocks(),
        tool_use_blocks(),
        tool_result_blocks(),
        image_blocks(),
        document_blocks(),
    )


@cache
def contents() -> st.SearchStrategy[Any]:
    """An entry's content: text, or a tuple of blocks (thinking blocks are frequent)."""
    return short_text | st.lists(blocks(), max_size=5).map(tuple)


@cache
def entries(id: st.SearchStrategy[str] = ids) -> st.SearchStrategy[Entry]:
    return st.builds(
        Entry,
        id=id,
        parent_id=st.none() | ids,
        turn_id=turn_ids,
        role=st.sampled_from(ROLES),
        content=contents(),
        pinned=st.booleans(),
        metadata=json_objects(),
    )


# -- conversations ----------------------------------------------------------------------


@dataclass(frozen=True)
class Add:
    """Append one message."""

    role: str
    content: Any
    pinned: bool = False
    turn_id: str | None = None
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True)
class Fork:
    """Continue on a fork of the memory at the entry ``at`` (a fraction of all entries;
    ``None`` forks to an empty branch)."""

    at: float | None


Step = Add | Fork


@st.composite
def assistant_turns(draw: st.DrawFn) -> list[Step]:
    """An assistant message with thinking (signed or redacted) and text."""
    parts: list[Any] = draw(st.lists(thinking_blocks() | redacted_thinking_blocks(), max_size=2))
    parts += draw(st.lists(text_blocks(), min_size=1, max_size=2))
    return [Add("assistant", tuple(parts), turn_id=draw(turn_ids))]


@st.composite
def tool_batches(draw: st.DrawFn) -> list[Step]:
    """A parallel tool-use batch: the assistant entry (thinking first) and its results,
    in one entry or split over several."""
    n = draw(st.integers(min_value=1, max_value=3))
    use_ids = draw(st.lists(ids, min_size=n, max_size=n, unique=True))
    turn = draw(turn_ids)
    head: list[Any] = draw(st.lists(thinking_blocks() | redacted_thinking_blocks(), max_size=1))
    head += draw(st.lists(text_blocks(), max_size=1))
    uses = [draw(tool_use_blocks()).model_copy(update={"id": u}) for u in use_ids]
    results = [draw(tool_result_blocks()).model_copy(update={"tool_use_id": u}) for u in use_ids]
    split = draw(st.integers(min_value=1, max_value=n))
    chunks = [results[i::split] for i in range(split)]
    role = draw(st.sampled_from(["user", "tool"]))
    steps: list[Step] = [Add("assistant", tuple(head + uses), turn_id=turn)]
    steps += [Add(role, tuple(c), turn_id=turn) for c in chunks if c]
    return steps


@st.composite
def plain_messages(draw: st.DrawFn) -> list[Step]:
    """A user, system or tool message of any content; sometimes pinned, with metadata."""
    return [
        Add(
            draw(st.sampled_from(ROLES)),
            draw(contents()),
            pinned=draw(st.booleans()),
            turn_id=draw(turn_ids),
            metadata=draw(st.none() | json_objects()),
        )
    ]


@cache
def forks() -> st.SearchStrategy[list[Step]]:
    return st.builds(lambda at: [Fork(at)], st.none() | st.floats(min_value=0, max_value=1))


@cache
def steps() -> st.SearchStrategy[list[Step]]:
    """One step of a conversation script."""
    return st.one_of(plain_messages(), assistant_turns(), tool_batches(), forks())


@cache
def conversations(max_steps: int = 12) -> st.SearchStrategy[list[Step]]:
    """A conversation script: a flat list of steps for :func:`build`."""
    return st.lists(steps(), max_size=max_steps).map(lambda chunks: [s for c in chunks for s in c])


def apply_step(memory: AgentMemory, step: Step) -> AgentMemory:
    """Apply ``step`` and return the memory to continue with (a fork returns a new one)."""
    if isinstance(step, Fork):
        graph = memory.all_entries()
        if step.at is None or not graph:
            return memory.fork(None)
        return memory.fork(graph[min(int(step.at * len(graph)), len(graph) - 1)].id)
    memory.add_message(
        step.role,  # type: ignore[arg-type]
        step.content,
        pinned=step.pinned,
        turn_id=step.turn_id,
        metadata=step.metadata,
    )
    return memory


def build(
    script: list[Step], after_step: Callable[[AgentMemory], None] | None = None
) -> AgentMemory:
    """Replay ``script`` into a new memory; ``after_step`` sees the memory after each step."""
    memory = AgentMemory()
    for step in script:
        memory = apply_step(memory, step)
        if after_step is not None:
            after_step(memory)
    return memory


@cache
def memories(max_steps: int = 12) -> st.SearchStrategy[AgentMemory]:
    """A memory built from a conversation script (with branches, batches, pinned entries)."""
    return conversations(max_steps).map(build)


@st.composite
def text_messages(draw: st.DrawFn) -> list[Step]:
    """A user or assistant text message, sometimes pinned."""
    role = draw(st.sampled_from(["user", "assistant"]))
    return [Add(role, draw(short_text), pinned=draw(st.booleans()), turn_id=draw(turn_ids))]


@cache
def well_formed_conversations(max_steps: int = 10) -> st.SearchStrategy[list[Step]]:
    """A linear script a provider would accept: text, thinking turns and complete batches."""
    step = st.one_of(text_messages(), assistant_turns(), tool_batches())
    return st.lists(step, max_size=max_steps).map(lambda chunks: [s for c in chunks for s in c])
