"""The model every format's reader and writer share: messages staged as entries, where
each entry came from, and the checks and helpers that do not depend on the format.

A format's reader turns its messages into :class:`Staged` entries (each block with the
raw part it came from); :func:`build` and :func:`extend` check their tool pairing and
append them to a memory, recording a :class:`Source` per entry in a
:class:`Transcript`. A format's writer gets, for each block of a changed entry, the raw
part it came from (:func:`match_blocks`), so what is unchanged goes back as given.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from normandy_core.conversation.entries import (
    Block,
    Content,
    Entry,
    OpaqueBlock,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from normandy_core.conversation.keys import PROVIDER_COMPACTION_KEY
from normandy_core.conversation.memory import AgentMemory
from normandy_core.conversation.tokens import ARGUMENTS_KEY
from normandy_core.transcripts.formats import (
    TranscriptError,
    WireFormat,
    as_mapping,
    read_json_float,
    value_problem,
)

__all__ = [
    "Matched",
    "Source",
    "Staged",
    "Transcript",
    "Turns",
    "build",
    "check_tools",
    "custom_input",
    "custom_text",
    "entry_list",
    "extend",
    "json_dict",
    "keep_arguments",
    "match_blocks",
    "message_list",
    "newest_compaction",
    "nonempty_id",
    "parse_arguments",
    "source_from_url",
    "string_field",
]

#: Each block of a changed entry with the ``(raw position, raw part)`` it came from (or
#: ``None``: a new block) and whether it is unchanged.
Matched = list[tuple[Block, tuple[int, Any] | None, bool]]


@dataclass(slots=True)
class Source:
    """Where one entry came from: the raw messages as given and each block's raw part.

    ``raws`` are the input objects (one message; several ``tool`` messages of one batch;
    several Responses items). ``parts`` pairs each block of ``content`` with the position
    in ``raws`` it came from and its raw part (the block dict, the tool call, the item).
    ``group`` numbers the entries read from one Anthropic message that held a marker or
    summary between other blocks.
    """

    raws: list[Any]
    role: str
    content: Content
    parts: list[tuple[Block, int, Any]]
    group: tuple[int, int] | None = None  # (raw index, number of entries in the group)


class Turns:
    """``turn-N`` ids: a new turn at every user message that is not only tool results."""

    def __init__(self) -> None:
        self.n = 0

    def next(self, role: str, content: Content) -> str:
        """The turn id of the next entry, of ``role`` holding ``content``."""
        results_only = (
            role in ("user", "tool")
            and isinstance(content, tuple)
            and bool(content)
            and all(
                isinstance(b, ToolResultBlock) or (isinstance(b, OpaqueBlock) and b.answers)
                for b in content
            )
        )
        if (role == "user" and not results_only) or self.n == 0:
            self.n += 1
        return f"turn-{self.n}"


@dataclass(slots=True)
class Transcript:
    """A transcript as read: its format, its memory and where each entry came from.

    ``system`` is an Anthropic request's ``system`` as given (``None`` otherwise) and
    ``system_id`` the id of the entry read from it.
    """

    format: WireFormat
    memory: AgentMemory
    sources: dict[str, Source]
    container: Any
    system: Any = None
    system_id: str | None = None
    #: What reading more messages after these needs: turn numbering, the tool-use ids
    #: seen (id -> index and field) and the calls of the last message still open.
    turns: Turns = field(default_factory=Turns)
    seen: dict[str, tuple[int, str]] = field(default_factory=dict)
    pending: dict[str, tuple[int, str]] = field(default_factory=dict)
    #: The entry read from the last message and its staged role (``tool``: a run of
    #: results or outputs; ``assistant``: model-side items), which say whether a message
    #: after it joins that entry without reading the last message again.
    tail: tuple[str, str] | None = None


@dataclass(slots=True)
class Staged:
    """One entry as a format's reader staged it, before it joins a memory."""

    role: str  # system, user, assistant, tool (results)
    index: int
    raws: list[Any] = field(default_factory=list)
    parts: list[tuple[Block, int, Any]] = field(default_factory=list)
    text: str | None = None  # plain-text content, when the message was a string
    meta: dict[str, Any] = field(default_factory=dict)
    where: list[tuple[int, str]] = field(default_factory=list)  # per part: (index, id field)
    group: tuple[int, int] | None = None  # see Source.group

    def add(self, block: Block, raw_pos: int, raw_part: Any, at: tuple[int, str]) -> None:
        """Add ``block``, read from ``raw_part`` of ``raws[raw_pos]``; ``at`` names its
        message index and id field for the pairing errors."""
        self.parts.append((block, raw_pos, raw_part))
        self.where.append(at)

    def content(self) -> Content:
        """The entry's content: its text, or its blocks."""
        if self.text is not None:
            return self.text
        return tuple(b for b, _, _ in self.parts)


# -- reading helpers ----------------------------------------------------------------------


def message_list(data: Any) -> Sequence[Any]:
    """``data`` as a sequence of messages (a generator is read once), or the error."""
    if isinstance(data, (str, bytes, bytearray, Mapping)):
        raise TranscriptError(None, "messages", "expected a list of messages")
    if isinstance(data, Sequence):
        return data
    if isinstance(data, Iterable):
        return list(data)  # tuples are Sequences; generators and other iterables
    raise TranscriptError(
        None, "messages", f"expected a list of messages, got {type(data).__name__}"
    )


def json_dict(obj: Any) -> dict[str, Any]:
    """A copy of ``obj`` (a mapping or an SDK object) as a dict."""
    return dict(as_mapping(obj, None, None))


def string_field(message: Mapping[str, Any], key: str, index: int, where: str) -> str:
    """``message[key]``, which must be a string (``where`` names it in the error)."""
    value = message.get(key)
    if not isinstance(value, str):
        raise TranscriptError(index, where, "missing or not a string")
    return value


def nonempty_id(message: Mapping[str, Any], key: str, index: int, where: str) -> str:
    """``message[key]``, which must be a non-empty string (an id)."""
    value = string_field(message, key, index, where)
    if not value:
        raise TranscriptError(index, where, "must not be empty")
    return value


def parse_arguments(args: Any, index: int, where: str, *, vocabulary: str) -> dict[str, Any]:
    """A tool call's JSON arguments string as an object (empty for none); ``vocabulary``
    says, in the error for a non-string, how the format sends them."""
    if args is None or args == "":
        return {}
    if not isinstance(args, str):
        raise TranscriptError(index, where, f"expected a JSON string ({vocabulary})")
    try:
        parsed = json.loads(args, parse_float=read_json_float)  # underflows kept visible
    except json.JSONDecodeError as exc:
        raise TranscriptError(index, where, f"not valid JSON: {exc.msg}") from exc
    except RecursionError as exc:
        raise TranscriptError(index, where, "nested too deeply") from exc
    except ValueError as exc:  # integers over the interpreter's digit limit
        raise TranscriptError(index, where, str(exc)) from exc
    if not isinstance(parsed, dict):
        raise TranscriptError(index, where, "must encode a JSON object")
    bad = value_problem(parsed)
    if bad is not None:
        raise TranscriptError(index, where + (f" {bad[0]}" if bad[0] else ""), bad[1])
    return parsed


def custom_input(text: str) -> dict[str, Any]:
    """A custom tool call's free-form input as a tool use's input: ``{"input": text}``, or
    nothing for an empty one (the writers send an empty input as ``""``, so a call whose
    input was cleared reads back as it was written, and counts the same)."""
    return {"input": text} if text else {}


def custom_text(use: ToolUseBlock) -> str:
    """The free-form input a custom tool call is written with (:func:`custom_input`'s
    inverse: no input is written empty)."""
    return str(use.input.get("input", "")) if use.input else ""


def keep_arguments(st: Staged, call_id: str, given: Any, parsed: dict[str, Any]) -> None:
    """Record a call's own arguments string where it is longer than ours (it is sent)."""
    if isinstance(given, str) and len(given) > len(json.dumps(parsed, ensure_ascii=False)):
        st.meta.setdefault(ARGUMENTS_KEY, {})[call_id] = given


def source_from_url(url: str, index: int, where: str) -> dict[str, Any]:
    """An image or document source from a URL: a base64 ``data:`` URL, or a link."""
    if url.startswith("data:"):
        head, sep, data = url.partition(",")
        if not sep or not head.endswith(";base64"):
            raise TranscriptError(index, where, "a data URL must be base64 encoded")
        try:
            base64.b64decode(data, validate=True)
        except ValueError as exc:
            raise TranscriptError(index, where, "the data URL is not valid base64") from exc
        return {"type": "base64", "media_type": head[5:-7], "data": data}
    return {"type": "url", "url": url}


# -- from staged entries to a memory ------------------------------------------------------


def newest_compaction(staged: Sequence[Staged]) -> int:
    """The position in ``staged`` of the newest provider compaction (the entry to pin), or
    -1 when there is none."""
    return max(
        (k for k, st in enumerate(staged) if st.meta.get(PROVIDER_COMPACTION_KEY)), default=-1
    )


def build(
    fmt: WireFormat,
    staged: list[Staged],
    container: Any,
    allow_pending: bool,
    *,
    system: Any = None,
    system_text: str = "",
) -> Transcript:
    """A :class:`Transcript` of ``staged``, read from ``container``.

    ``system`` is an Anthropic request's system prompt as given and ``system_text`` its
    text, read as a leading system entry when not empty. ``allow_pending`` accepts calls
    without results in the last message.
    """
    memory = AgentMemory()
    t = Transcript(format=fmt, memory=memory, sources={}, container=container)
    if system is not None and system_text:
        entry = memory.add_message("system", system_text, turn_id=None)
        t.system, t.system_id = system, entry.id
    t.pending = check_tools(staged, allow_pending, t.seen, {})
    extend(t, memory, staged, pin=newest_compaction(staged))
    return t


def extend(t: Transcript, memory: AgentMemory, staged: list[Staged], *, pin: int = -1) -> None:
    """Append ``staged`` to ``memory`` as entries, recording their sources in ``t``.

    ``pin`` is the position in ``staged`` of the entry to pin (the newest provider
    compaction), or -1.
    """
    sources = t.sources
    turns = t.turns
    for k, st in enumerate(staged):
        content = st.content()
        role: Role = "user" if st.role == "tool" else cast("Role", st.role)
        turn = None if role == "system" else turns.next(role, content)
        entry = memory.add_message(role, content, turn_id=turn, pinned=k == pin, metadata=st.meta)
        sources[entry.id] = Source(
            raws=st.raws, role=role, content=entry.content, parts=st.parts, group=st.group
        )
        t.tail = (entry.id, st.role)


def _use_id(block: Block) -> str | None:
    """The id of the call ``block`` makes (a tool use, an opaque call item), or ``None``."""
    if isinstance(block, ToolUseBlock):
        return block.id
    if isinstance(block, OpaqueBlock):
        return block.use_id
    return None


def _record_ids(st: Staged, seen: dict[str, tuple[int, str]]) -> None:
    """Add the call ids of ``st`` to ``seen``, refusing one used before."""
    for (block, _, _), (i, where) in zip(st.parts, st.where, strict=True):
        uid = _use_id(block)
        if uid is None:
            continue
        if uid in seen:
            first_index, first_field = seen[uid]
            raise TranscriptError(
                i,
                where,
                f"tool-use id {uid!r} is already used by message {first_index} "
                f"({first_field}); tool-use ids must be unique in a transcript",
            )
        seen[uid] = (i, where)


def _results(st: Staged) -> list[tuple[str, tuple[int, str]]]:
    """The call id each result of ``st`` answers, with where it stands."""
    return [
        (block.tool_use_id if isinstance(block, ToolResultBlock) else str(block.answers), at)
        for (block, _, _), at in zip(st.parts, st.where, strict=True)
        if isinstance(block, ToolResultBlock) or (isinstance(block, OpaqueBlock) and block.answers)
    ]


def check_tools(
    staged: list[Staged],
    allow_pending: bool,
    seen: dict[str, tuple[int, str]],
    pending: dict[str, tuple[int, str]],
) -> dict[str, tuple[int, str]]:
    """Check pairing and unique ids, with errors in the input's own vocabulary.

    ``seen`` (tool-use ids so far) is updated in place; ``pending`` holds the calls the
    messages before ``staged`` left open. Returns the calls the last message leaves open
    (only when ``allow_pending``).
    """
    pending = dict(pending)
    answered = 0
    last = len(staged) - 1
    for k, st in enumerate(staged):
        _record_ids(st, seen)
        results = _results(st)
        if results:
            if st.role == "assistant":
                continue  # rejected when read
            for rid, (i, where) in results:
                if rid not in pending:
                    raise TranscriptError(
                        i,
                        where,
                        f"{rid!r} answers no call of the assistant message right before it",
                    )
                del pending[rid]
                answered += 1
            continue
        if pending:
            _unanswered(pending, answered, "the message after its batch is not a result")
        answered = 0
        if st.role == "assistant":
            for (block, _, _), at in zip(st.parts, st.where, strict=True):
                if isinstance(block, ToolUseBlock):
                    pending[block.id] = at
                elif isinstance(block, OpaqueBlock) and block.use_id:
                    pending[block.use_id] = at
            if pending and k == last and allow_pending:
                return pending
    if pending:
        _unanswered(pending, answered, "nothing answers it")
    return {}


def _unanswered(pending: dict[str, tuple[int, str]], answered: int, why: str) -> None:
    uid, (i, where) = next(iter(pending.items()))
    if answered:
        why = (
            f"the results after its message answer {answered} of its batch's "
            f"{answered + len(pending)} calls"
        )
    raise TranscriptError(i, where, f"tool call {uid!r} has no result: {why}")


# -- writing helpers ----------------------------------------------------------------------


def entry_list(entries: Iterable[Entry] | AgentMemory) -> list[Entry]:
    """The entries to write: a memory's active branch, or the given entries."""
    return entries.entries() if isinstance(entries, AgentMemory) else list(entries)


def _block_key(block: Block) -> tuple[str, str] | None:
    """What identifies a changed tool use or result: its call id."""
    if isinstance(block, ToolUseBlock):
        return ("use", block.id)
    if isinstance(block, ToolResultBlock):
        return ("result", block.tool_use_id)
    return None


def _first_unused(src: Source, used: list[bool], block: Block) -> tuple[int, bool] | None:
    """The first unused part of ``src`` that is ``block`` (``True``) or holds its call id
    (``False``: changed), or ``None``."""
    for j, (original, _pos, _raw) in enumerate(src.parts):
        if not used[j] and (original is block or original == block):
            return j, True
    key = _block_key(block)
    if key is None:
        return None
    for j, (original, _pos, _raw) in enumerate(src.parts):
        if not used[j] and _block_key(original) == key:
            return j, False
    return None


def match_blocks(src: Source | None, content: Content) -> Matched:
    """Each block of ``content`` with its original ``(raw position, raw part)`` and
    whether it is unchanged."""
    blocks = (TextBlock(text=content),) if isinstance(content, str) else content
    if src is None:
        return [(b, None, False) for b in blocks]
    used = [False] * len(src.parts)
    out: Matched = []
    for block in blocks:
        hit = _first_unused(src, used, block)
        if hit is None:
            out.append((block, None, False))
            continue
        j, same = hit
        used[j] = True
        out.append((block, src.parts[j][1:], same))
    return out
