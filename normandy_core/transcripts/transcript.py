"""Transcripts as given: every provider shape read into a conversation, written back losslessly.

:func:`read` turns a message list, in any of the shapes people send, into an
:class:`~normandy_core.AgentMemory` plus a record of where each entry came from
(a :class:`~normandy_core.transcripts.staging.Transcript`); :func:`write` turns a
(compacted) memory back into the same shape, where every entry the compactor kept
unchanged comes back as the very objects it was read from (the same dicts, the same SDK
objects), and only what compaction created or changed is rendered anew.

Shapes, each read and written by its own module:

- ``"openai"``: OpenAI Chat Completions ``messages``
  (:mod:`~normandy_core.transcripts.chat`), with every content part and field the API
  defines.
- ``"anthropic"``: Anthropic Messages ``messages`` and ``system``
  (:mod:`~normandy_core.transcripts.anthropic`), every block type.
- ``"responses"``: the OpenAI Responses API input item list
  (:mod:`~normandy_core.transcripts.responses`), and a request's ``instructions``.

A request holds its list under ``messages`` (its system prompt, for Anthropic, under
``system``) or, for the Responses API, under ``input`` (its system prompt under
``instructions``): :func:`request_keys` says which, and :func:`write` puts the kept
messages and system prompt back under the same keys, every other key as given.

How items become entries: a message is an entry; in the Responses API, consecutive
model-side items (reasoning, assistant messages, calls) are one assistant entry and
consecutive outputs one results entry, so a reasoning item stays with the calls it
precedes and a parallel batch stays whole. A provider's compaction (Anthropic's
``compaction`` block, the Responses ``compaction`` item) is a summary of everything
before it: the entry holding the newest one is pinned, so no compactor alters it or
splits it from what follows; entries before it may be dropped.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from normandy_core.conversation.entries import Block, Content, Entry, ToolResultBlock
from normandy_core.conversation.memory import AgentMemory
from normandy_core.transcripts.anthropic import (
    read_anthropic,
    rebuild_anthropic,
    stage_anthropic,
    system_text,
)
from normandy_core.transcripts.chat import read_chat, rebuild_chat, stage_chat
from normandy_core.transcripts.detection import detect
from normandy_core.transcripts.formats import FORMAT_NAMES, TranscriptError, WireFormat
from normandy_core.transcripts.responses import (
    read_responses,
    rebuild_responses,
    stage_responses,
)
from normandy_core.transcripts.staging import (
    Source,
    Staged,
    Transcript,
    match_blocks,
    message_list,
)

__all__ = [
    "read",
    "request_keys",
    "stage",
    "write",
]


def request_keys(request: Mapping[str, Any]) -> tuple[str, str] | None:
    """Where a request holds its messages and its system prompt: ``("messages",
    "system")``, ``("input", "instructions")`` for a Responses API request, or ``None``
    when it holds neither list."""
    if "messages" in request:
        return "messages", "system"
    if "input" in request:
        return "input", "instructions"
    return None


# -- reading ------------------------------------------------------------------------------


def read(
    messages: Any,
    format: WireFormat | Literal["auto"] = "auto",
    *,
    system: Any = None,
    instructions: Any = None,
    allow_pending: bool = True,
) -> Transcript:
    """Read ``messages`` (a list, tuple or any iterable of dicts or SDK objects).

    ``system`` is an Anthropic request's system prompt (a string or text blocks) and
    ``instructions`` a Responses API request's (a string; the format is then
    Responses), read as a leading system entry. ``allow_pending`` accepts calls without
    results in the last message only (a round still waiting for its tools). Raises
    :class:`~normandy_core.TranscriptError` naming the message index and the field in
    the input's vocabulary.
    """
    items = message_list(messages)
    if format != "auto":
        fmt: WireFormat = format
    elif instructions is not None:
        fmt = "responses"
    else:
        fmt = detect(items, has_system=system is not None)
    if fmt not in FORMAT_NAMES:
        raise ValueError(f"unknown transcript format {fmt!r}; expected one of {list(FORMAT_NAMES)}")
    if instructions is not None and fmt != "responses":
        raise TranscriptError(None, "instructions", f"{FORMAT_NAMES[fmt]} has no instructions")
    if fmt == "anthropic":
        return read_anthropic(items, messages, system=system, allow_pending=allow_pending)
    if system is not None:
        raise TranscriptError(
            None, "system", f"{FORMAT_NAMES[fmt]} puts the system prompt in a message"
        )
    if fmt == "openai":
        return read_chat(items, messages, allow_pending=allow_pending)
    return read_responses(items, messages, instructions=instructions, allow_pending=allow_pending)


def stage(fmt: WireFormat, items: Sequence[Any], start: int = 0) -> Iterator[Staged]:
    """The messages ``items`` (positions from ``start``) as staged entries of ``fmt``."""
    if fmt == "anthropic":
        return stage_anthropic(items, start)
    if fmt == "openai":
        return stage_chat(items, start)
    return stage_responses(items, start)


# -- writing ------------------------------------------------------------------------------


def _kept_group(t: Transcript, entries: list[Entry], k: int, src: Source) -> int:
    """How many entries from ``k`` on are the unchanged group ``src`` opens (one
    Anthropic message read as several entries), or 0."""
    if src.group is None:
        return 0
    _index, size = src.group
    run = entries[k : k + size]
    if len(run) == size and all(
        (s := t.sources.get(x.id)) is not None and s.group == src.group and x.content == s.content
        for x in run
    ):
        return size
    return 0


def write(t: Transcript, memory: AgentMemory) -> Any:
    """``memory`` in the format and container shape ``t`` was read from.

    Entries the compactor kept unchanged come back as the objects they were read from;
    changed entries keep every raw part they still hold; new entries (markers,
    summaries) are rendered in the format.
    """
    entries = memory.entries()
    out: list[Any] = []
    system_out: Any = None
    system_texts: list[str] = []
    k = 0
    while k < len(entries):
        entry = entries[k]
        src = t.sources.get(entry.id)
        step = 1
        if entry.id == t.system_id and t.system_id is not None:
            if entry.content == t.memory[entry.id].content:
                system_out = t.system
            else:
                system_texts.append(entry.text())
        elif src is not None and (size := _kept_group(t, entries, k, src)):
            out.append(src.raws[0])
            step = size
        elif (
            src is not None
            and entry.role == src.role
            and (entry.content is src.content or entry.content == src.content)
        ):
            out.extend(src.raws)
        elif entry.role == "system" and t.format == "anthropic":
            system_texts.append(entry.text())
        else:
            out.extend(_rendered(t, entry, src))
        k += step
    return _container(t, out, system_out, system_texts)


def _rendered(t: Transcript, entry: Entry, src: Source | None) -> list[Any]:
    """A changed or new entry in ``t``'s format, keeping the raw parts it still holds."""
    placed: list[tuple[Block, int, Any]] = []  # Responses: each block with its item
    matched = match_blocks(src, entry.content)
    if t.format == "anthropic":
        emitted = rebuild_anthropic(entry, src, matched)
    elif t.format == "openai":
        emitted = rebuild_chat(entry, src, matched)
    else:
        emitted = rebuild_responses(entry, src, matched, placed)
    # What was rendered is now the caller's: given back unchanged, it is kept as is, and
    # changed again, its unchanged items are still given back as they are.
    t.sources[entry.id] = Source(
        raws=emitted,
        role=entry.role,
        content=entry.content,
        parts=placed or _rendered_parts(t.format, entry.content, emitted),
    )
    return emitted


#: The formats whose request holds the system prompt, and under which key.
_SYSTEM_KEYS = frozenset({("anthropic", "system"), ("responses", "instructions")})


def _container(t: Transcript, out: list[Any], system_out: Any, system_texts: list[str]) -> Any:
    """``out`` in the container ``t`` was read from: the list, or the request with its
    messages and system prompt replaced (every other key as given)."""
    like = t.container
    keys = request_keys(like) if isinstance(like, Mapping) else None
    holds_system = keys is not None and (t.format, keys[1]) in _SYSTEM_KEYS
    if system_texts and not holds_system:
        raise TranscriptError(None, "system", "the compacted transcript gained a system prompt")
    if keys is None:
        return out
    list_key, system_key = keys
    request = dict(like)
    request[list_key] = out
    if not holds_system:
        return request
    if system_out is not None and not system_texts:
        request[system_key] = system_out
    elif system_texts or system_out is not None:
        prefix = [system_text(system_out)] if system_out is not None else []
        request[system_key] = "\n\n".join([*prefix, *system_texts])
    else:
        request.pop(system_key, None)
    return request


def _rendered_parts(
    fmt: WireFormat, content: Content, emitted: list[Any]
) -> list[tuple[Block, int, Any]]:
    """Each block of ``content`` with the rendered part it became, where they align."""
    if isinstance(content, str) or not emitted:
        return []
    if fmt == "anthropic" and len(emitted) == 1:
        parts = emitted[0].get("content")
        if isinstance(parts, list) and len(parts) == len(content):
            return [(b, 0, p) for b, p in zip(content, parts, strict=True)]
    elif len(emitted) == len(content) and (
        fmt == "responses" or all(isinstance(b, ToolResultBlock) for b in content)
    ):  # one item (Responses), or one tool message per result (Chat), per block
        return [(b, k, m) for k, (b, m) in enumerate(zip(content, emitted, strict=True))]
    return []
