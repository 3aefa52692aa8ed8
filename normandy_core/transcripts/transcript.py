"""Transcripts as given: every provider shape read into a conversation, written back losslessly.

:func:`read` turns a message list, in any of the shapes people send, into an
:class:`~normandy_core.AgentMemory` plus a record of where each entry came from;
:func:`write` turns a (compacted) memory back into the same shape, where every entry the
compactor kept unchanged comes back as the very objects it was read from (the same dicts,
the same SDK objects), and only what compaction created or changed is rendered anew.

Shapes:

- ``"openai"``: OpenAI Chat Completions ``messages`` (``system``, ``developer``,
  ``user``, ``assistant`` with ``tool_calls`` of type ``function`` or ``custom``,
  ``tool``), with every content part and field the API defines.
- ``"anthropic"``: Anthropic Messages ``messages`` (and ``system``), every block type:
  the ones the conversation interprets (text, thinking, tool use and result, image,
  document) and the ones it carries as :class:`~normandy_core.OpaqueBlock` (server
  tools and their results, MCP tool use and result, search results, container uploads,
  ``compaction``, any future type).
- ``"responses"``: the OpenAI Responses API input item list (``message`` items and
  easy messages, ``function_call`` / ``function_call_output``, ``custom_tool_call`` /
  ``custom_tool_call_output``, ``reasoning``, ``compaction``, and every other item as
  opaque, paired by ``call_id`` where it has an output item).

How items become entries: a message is an entry; in the Responses API, consecutive
model-side items (reasoning, assistant messages, calls) are one assistant entry and
consecutive outputs one results entry, so a reasoning item stays with the calls it
precedes and a parallel batch stays whole. A provider's compaction (Anthropic's
``compaction`` block, the Responses ``compaction`` item) is a summary of everything
before it: the entry holding the newest one is pinned, so no compactor alters it or
splits it from what follows; entries before it may be dropped.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from pydantic import BaseModel, ValidationError

from normandy_core.conversation.entries import (
    Block,
    Content,
    DocumentBlock,
    Entry,
    ImageBlock,
    OpaqueBlock,
    RedactedThinkingBlock,
    Role,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from normandy_core.conversation.keys import MARKER_KEY, PROVIDER_COMPACTION_KEY, SUMMARY_KEY
from normandy_core.conversation.memory import AgentMemory
from normandy_core.conversation.tokens import ARGUMENTS_KEY, NAME_KEY

__all__ = [
    "PROVIDER_COMPACTION",
    "Source",
    "Transcript",
    "TranscriptError",
    "WireFormat",
    "detect",
    "read",
    "write",
]

WireFormat = Literal["openai", "anthropic", "responses"]

#: Metadata key of the entry holding a provider's compaction (a summary the provider made).
PROVIDER_COMPACTION = PROVIDER_COMPACTION_KEY


class TranscriptError(ValueError):
    """A transcript that cannot be read; the message names the message index and field.

    ``index`` is the position of the message at fault (``None`` for the whole input) and
    ``field`` the path inside it in the input's own vocabulary, such as
    ``content[2].tool_use_id`` (Anthropic), ``tool_calls[0].id`` (Chat Completions) or
    ``call_id`` (Responses).
    """

    def __init__(self, index: int | None, field: str | None, problem: str) -> None:
        self.index = index
        self.field = field
        self.problem = problem
        where = "transcript" if index is None else f"message {index}"
        if field:
            where += f", field {field!r}"
        super().__init__(f"{where}: {problem}")


# -- where entries come from ----------------------------------------------------------


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


@dataclass(slots=True)
class Transcript:
    """A transcript read by :func:`read`: its format, its memory and its sources.

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
    turns: _Turns = field(default_factory=lambda: _Turns())
    seen: dict[str, tuple[int, str]] = field(default_factory=dict)
    pending: dict[str, tuple[int, str]] = field(default_factory=dict)


# -- shared helpers -------------------------------------------------------------------

#: Tags opening the text of a message a compactor inserted, and the metadata key of each.
INSERTED_TAGS: dict[str, str] = {
    "[normandy:marker]": MARKER_KEY,
    "[normandy:summary]": SUMMARY_KEY,
}


def _inserted_key(text: str) -> str | None:
    if not text.startswith("[normandy:"):
        return None
    for tag, key in INSERTED_TAGS.items():
        if text.startswith(tag):
            return key
    return None


def as_mapping(obj: Any, index: int | None, field: str | None) -> Mapping[str, Any]:
    """``obj`` as a mapping: itself, or an SDK object's JSON dump."""
    if isinstance(obj, Mapping):
        return obj
    dump = getattr(obj, "model_dump", None)  # SDK objects (pydantic models)
    if callable(dump):
        data = dump(mode="json", exclude_none=True)
        if isinstance(data, Mapping):
            return data
    raise TranscriptError(index, field, f"expected an object, got {type(obj).__name__}")


def _json_dict(obj: Any) -> dict[str, Any]:
    return dict(as_mapping(obj, None, None))


def _string(m: Mapping[str, Any], key: str, index: int, where: str) -> str:
    v = m.get(key)
    if not isinstance(v, str):
        raise TranscriptError(index, where, "missing or not a string")
    return v


def _nonempty_id(m: Mapping[str, Any], key: str, index: int, where: str) -> str:
    v = _string(m, key, index, where)
    if not v:
        raise TranscriptError(index, where, "must not be empty")
    return v


def _parse_arguments(args: Any, index: int, where: str, *, vocabulary: str) -> dict[str, Any]:
    if args is None or args == "":
        return {}
    if not isinstance(args, str):
        raise TranscriptError(index, where, f"expected a JSON string ({vocabulary})")
    try:
        parsed = json.loads(args)
    except json.JSONDecodeError as exc:
        raise TranscriptError(index, where, f"not valid JSON: {exc.msg}") from exc
    except RecursionError as exc:
        raise TranscriptError(index, where, "nested too deeply") from exc
    except ValueError as exc:  # integers over the interpreter's digit limit
        raise TranscriptError(index, where, str(exc)) from exc
    if not isinstance(parsed, dict):
        raise TranscriptError(index, where, "must encode a JSON object")
    from normandy_core.transcripts.formats import value_problem

    bad = value_problem(parsed)
    if bad is not None:
        raise TranscriptError(index, where + (f" {bad[0]}" if bad[0] else ""), bad[1])
    return parsed


def _custom_input(text: str) -> dict[str, Any]:
    """A custom tool call's free-form input as a tool use's input: ``{"input": text}``, or
    nothing for an empty one (the writers send an empty input as ``""``, so a call whose
    input was cleared reads back as it was written, and counts the same)."""
    return {"input": text} if text else {}


def _custom_text(b: ToolUseBlock) -> str:
    """The free-form input a custom tool call is written with (:func:`_custom_input`'s
    inverse: no input is written empty)."""
    return str(b.input.get("input", "")) if b.input else ""


def _keep_arguments(st: _Staged, call_id: str, given: Any, parsed: dict[str, Any]) -> None:
    """Record a call's own arguments string where it is longer than ours (it is sent)."""
    if isinstance(given, str) and len(given) > len(json.dumps(parsed, ensure_ascii=False)):
        st.meta.setdefault(ARGUMENTS_KEY, {})[call_id] = given


def _source_from_url(url: str, index: int, where: str) -> dict[str, Any]:
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


# -- staging: what the per-format readers produce --------------------------------------


@dataclass(slots=True)
class _Staged:
    role: str  # system, user, assistant, tool (results)
    index: int
    raws: list[Any] = field(default_factory=list)
    parts: list[tuple[Block, int, Any]] = field(default_factory=list)
    text: str | None = None  # plain-text content, when the message was a string
    meta: dict[str, Any] = field(default_factory=dict)
    pinned: bool = False
    where: list[tuple[int, str]] = field(default_factory=list)  # per part: (index, id field)

    def add(self, block: Block, raw_pos: int, raw_part: Any, at: tuple[int, str]) -> None:
        self.parts.append((block, raw_pos, raw_part))
        self.where.append(at)

    def content(self) -> Content:
        if self.text is not None:
            return self.text
        return tuple(b for b, _, _ in self.parts)


class _Turns:
    """``turn-N`` ids: a new turn at every user message that is not only tool results."""

    def __init__(self) -> None:
        self.n = 0

    def next(self, role: str, content: Content) -> str:
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


# -- Anthropic ------------------------------------------------------------------------

_ANTHROPIC_TYPED: dict[str, type[BaseModel]] = {
    "text": TextBlock,
    "thinking": ThinkingBlock,
    "redacted_thinking": RedactedThinkingBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
    "image": ImageBlock,
    "document": DocumentBlock,
}
_ANTHROPIC_KEYS = {
    "text": ("type", "text"),
    "thinking": ("type", "thinking", "signature"),
    "redacted_thinking": ("type", "data"),
    "tool_use": ("type", "id", "name", "input"),
    "tool_result": ("type", "tool_use_id", "content", "is_error"),
    "image": ("type", "source"),
    "document": ("type", "source", "title"),
}
# Blocks an assistant message may hold that are only carried (server-side tool rounds:
# the use and its result sit in the same message).
_ANTHROPIC_ASSISTANT_OPAQUE = frozenset(
    {
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "compaction",
    }
)
#: Block types only Anthropic defines (evidence of the format).
ANTHROPIC_ONLY = (
    frozenset(_ANTHROPIC_TYPED) - {"text"}
    | _ANTHROPIC_ASSISTANT_OPAQUE
    | {"container_upload", "search_result"}
)
_ANTHROPIC_SERVER_USES = frozenset({"server_tool_use", "mcp_tool_use"})


def _anthropic_block(raw: Any, index: int, where: str, role: str) -> Block:
    data = as_mapping(raw, index, where)
    kind = data.get("type")
    if not isinstance(kind, str) or not kind:
        raise TranscriptError(index, f"{where}.type", "missing or not a string")
    cls = _ANTHROPIC_TYPED.get(kind)
    if cls is None:
        if role == "user" and kind in _ANTHROPIC_ASSISTANT_OPAQUE - {"compaction"}:
            raise TranscriptError(
                index, f"{where}.type", f"a {kind!r} block belongs in an assistant message"
            )
        return OpaqueBlock(format="anthropic", kind=kind, data=dict(data))
    fields = {k: data[k] for k in _ANTHROPIC_KEYS[kind] if k in data}
    if kind == "tool_result":
        content = fields.get("content", "")
        if isinstance(content, list):
            parts: list[Block] = []
            for j, p in enumerate(content):
                sub = f"{where}.content[{j}]"
                pm = as_mapping(p, index, sub)
                pkind = pm.get("type")
                if pkind in ("text", "image", "document"):
                    parts.append(_anthropic_block(pm, index, sub, role))
                elif isinstance(pkind, str) and pkind:
                    # search results, tool references...: counted and carried as text
                    parts.append(TextBlock(text=json.dumps(dict(pm), ensure_ascii=False)))
                else:
                    raise TranscriptError(index, f"{sub}.type", "missing or not a string")
            fields["content"] = tuple(parts)
        elif content is None:
            fields["content"] = ""
    try:
        return cast("Block", cls.model_validate(fields))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise TranscriptError(index, f"{where}.{loc}" if loc else where, err["msg"]) from exc


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, (list, tuple)):
        texts: list[str] = []
        for j, b in enumerate(system):
            m = as_mapping(b, None, f"system[{j}]")
            if m.get("type") != "text" or not isinstance(m.get("text"), str):
                raise TranscriptError(None, f"system[{j}]", "expected a text block")
            texts.append(m["text"])
        return "\n".join(texts)
    raise TranscriptError(
        None, "system", f"expected a string or a list of text blocks, got {type(system).__name__}"
    )


def _stage_anthropic(messages: Sequence[Any], start: int = 0) -> Iterator[_Staged]:
    for i, raw in enumerate(messages, start):
        m = as_mapping(raw, i, None)
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise TranscriptError(i, "role", f"expected 'user' or 'assistant', got {role!r}")
        content = m.get("content")
        st = _Staged(role=role, index=i, raws=[raw])
        if isinstance(content, str):
            st.text = content
            key = _inserted_key(content) if role == "user" else None
            if key:
                st.meta[key] = True
            yield st
            continue
        if not isinstance(content, (list, tuple)):
            raise TranscriptError(
                i, "content", f"expected a string or a list of blocks, got {type(content).__name__}"
            )
        open_server: dict[str, int] = {}
        for j, b in enumerate(content):
            where = f"content[{j}]"
            block = _anthropic_block(b, i, where, role)
            if role == "user" and isinstance(
                block, (ThinkingBlock, RedactedThinkingBlock, ToolUseBlock)
            ):
                raise TranscriptError(
                    i, f"{where}.type", f"a user message cannot hold a {block.type!r} block"
                )
            if role == "assistant" and isinstance(block, ToolResultBlock):
                raise TranscriptError(
                    i, f"{where}.type", "an assistant message cannot hold tool results"
                )
            if isinstance(block, OpaqueBlock):
                _check_server_pair(block, open_server, i, j)
                if block.kind == "compaction":
                    st.meta[PROVIDER_COMPACTION] = True
            at = (i, f"{where}.tool_use_id" if isinstance(block, ToolResultBlock) else where)
            if isinstance(block, ToolUseBlock):
                at = (i, f"{where}.id")
            st.add(block, 0, b, at)
        if open_server:
            uid, j = next(iter(open_server.items()))
            raise TranscriptError(
                i,
                f"content[{j}].id",
                f"server tool use {uid!r} has no result block after it in the same message",
            )
        yield from _split_tagged(st)


def _check_server_pair(block: OpaqueBlock, open_: dict[str, int], index: int, j: int) -> None:
    """A server or MCP tool use is answered by a result block later in the same message."""
    data = block.data
    where = f"content[{j}]"
    if block.kind in _ANTHROPIC_SERVER_USES:
        uid = data.get("id")
        if not isinstance(uid, str) or not uid:
            raise TranscriptError(index, f"{where}.id", "missing or not a string")
        open_[uid] = j
    elif block.kind.endswith("_tool_result"):
        rid = data.get("tool_use_id")
        if not isinstance(rid, str) or rid not in open_:
            raise TranscriptError(
                index,
                f"{where}.tool_use_id",
                f"{rid!r} answers no server or MCP tool use earlier in this message",
            )
        del open_[rid]


def _split_tagged(st: _Staged) -> Iterator[_Staged]:
    """A user message whose text blocks open with a marker or summary tag, as entries."""
    if st.role != "user" or not any(
        isinstance(b, TextBlock) and _inserted_key(b.text) for b, _, _ in st.parts
    ):
        yield st
        return
    pieces: list[_Staged] = []
    run = _Staged(role="user", index=st.index, raws=st.raws)
    for (b, pos, raw), at in zip(st.parts, st.where, strict=True):
        key = _inserted_key(b.text) if isinstance(b, TextBlock) else None
        if key is None:
            run.add(b, pos, raw, at)
            continue
        if run.parts:
            pieces.append(run)
            run = _Staged(role="user", index=st.index, raws=st.raws)
        tagged = _Staged(role="user", index=st.index, raws=st.raws, meta={key: True})
        tagged.add(b, pos, raw, at)
        pieces.append(tagged)
    if run.parts:
        pieces.append(run)
    if len(pieces) == 1:
        pieces[0].meta.update(st.meta)
        yield pieces[0]
        return
    for p in pieces:
        p.meta["_group"] = (st.index, len(pieces))
        yield p


# -- OpenAI Chat Completions ------------------------------------------------------------

_CHAT_TEXTS = frozenset({"text", "input_text", "output_text"})


#: Anthropic thinking parts in an assistant message's content, as LangChain's
#: ``convert_to_openai_messages`` leaves them for a Claude conversation: carried through.
_CHAT_THINKING = frozenset({"thinking", "redacted_thinking"})


def _chat_text_parts(
    content: Any, index: int, role: str
) -> str | list[tuple[str | Block, Any, int]]:
    """A Chat content as its text: a string, or ``(text, raw part, position)`` per part
    (an assistant's thinking part as its block instead of a text)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        raise TranscriptError(
            index, "content", f"expected a string or a list of parts, got {type(content).__name__}"
        )
    out: list[tuple[str | Block, Any, int]] = []
    for j, raw in enumerate(content):
        p = as_mapping(raw, index, f"content[{j}]")
        kind = p.get("type")
        if kind in _CHAT_TEXTS:
            out.append((_string(p, "text", index, f"content[{j}].text"), raw, j))
        elif kind == "refusal" and role == "assistant":
            out.append((_string(p, "refusal", index, f"content[{j}].refusal"), raw, j))
        elif kind in _CHAT_THINKING and role == "assistant":
            out.append((_anthropic_block(p, index, f"content[{j}]", role), raw, j))
        else:
            allowed = "text, refusal or thinking" if role == "assistant" else "text"
            raise TranscriptError(
                index, f"content[{j}].type", f"expected a {allowed} part, got {kind!r}"
            )
    return out


def _chat_user_part(raw: Any, index: int, j: int) -> Block:
    p = as_mapping(raw, index, f"content[{j}]")
    kind = p.get("type")
    where = f"content[{j}]"
    if kind in _CHAT_TEXTS:
        return TextBlock(text=_string(p, "text", index, f"{where}.text"))
    if kind == "image_url":
        img = p.get("image_url")
        url = img.get("url") if isinstance(img, Mapping) else img
        if not isinstance(url, str) or not url:
            raise TranscriptError(index, f"{where}.image_url.url", "missing or not a string")
        return ImageBlock(source=_source_from_url(url, index, f"{where}.image_url.url"))
    if kind == "file":
        f = p.get("file")
        if not isinstance(f, Mapping):
            raise TranscriptError(index, f"{where}.file", "missing or not an object")
        title = f.get("filename")
        title = title if isinstance(title, str) else None
        if isinstance(f.get("file_data"), str):
            src = _source_from_url(f["file_data"], index, f"{where}.file.file_data")
        elif isinstance(f.get("file_id"), str) and f["file_id"]:
            src = {"type": "file", "file_id": f["file_id"]}
        else:
            raise TranscriptError(
                index, f"{where}.file", "expected 'file_data' or 'file_id' (a string)"
            )
        return DocumentBlock(source=src, title=title)
    if kind == "input_audio":
        audio = p.get("input_audio")
        if not isinstance(audio, Mapping) or not isinstance(audio.get("data"), str):
            raise TranscriptError(index, f"{where}.input_audio.data", "missing or not a string")
        return OpaqueBlock(format="openai", kind="input_audio", data=dict(p))
    raise TranscriptError(
        index,
        f"{where}.type",
        f"unsupported content part {kind!r}; expected text, image_url, input_audio or file",
    )


def _stage_chat(messages: Sequence[Any], start: int = 0) -> Iterator[_Staged]:
    tools: _Staged | None = None
    for i, raw in enumerate(messages, start):
        m = as_mapping(raw, i, None)
        role = m.get("role")
        if role == "tool":
            tid = _nonempty_id(m, "tool_call_id", i, "tool_call_id")
            text = _chat_text_parts(m.get("content"), i, "tool")
            body = (
                text
                if isinstance(text, str)
                else "\n".join(t for t, _, _ in text if isinstance(t, str))
            )
            if tools is None:
                tools = _Staged(role="tool", index=i)
            tools.raws.append(raw)
            tools.add(
                ToolResultBlock(tool_use_id=tid, content=body),
                len(tools.raws) - 1,
                raw,
                (i, "tool_call_id"),
            )
            continue
        if tools is not None:
            yield tools
            tools = None
        st = _Staged(role="user", index=i, raws=[raw])
        name = m.get("name")
        if isinstance(name, str) and name:
            st.meta[NAME_KEY] = name  # counted: the provider bills a message's name
        if role in ("system", "developer"):
            st.role = "system"
            text = _chat_text_parts(m.get("content"), i, role)
            if isinstance(text, str):
                st.text = text
            else:
                for t, part, _ in text:
                    if isinstance(t, str):  # only an assistant's content holds thinking
                        st.add(TextBlock(text=t), 0, part, (i, "content"))
        elif role == "user":
            content = m.get("content")
            if isinstance(content, str):
                st.text = content
                key = _inserted_key(content)
                if key:
                    st.meta[key] = True
            elif isinstance(content, (list, tuple)):
                for j, part in enumerate(content):
                    st.add(_chat_user_part(part, i, j), 0, part, (i, f"content[{j}]"))
            else:
                raise TranscriptError(
                    i,
                    "content",
                    f"expected a string or a list of parts, got {type(content).__name__}",
                )
        elif role == "assistant":
            st.role = "assistant"
            if m.get("function_call") is not None:
                raise TranscriptError(
                    i, "function_call", "legacy function_call is not supported; use tool_calls"
                )
            _stage_chat_assistant(m, raw, st, i)
        else:
            raise TranscriptError(
                i, "role", f"expected system, developer, user, assistant or tool, got {role!r}"
            )
        yield st
    if tools is not None:
        yield tools


def _stage_chat_assistant(m: Mapping[str, Any], raw: Any, st: _Staged, i: int) -> None:
    text = _chat_text_parts(m.get("content"), i, "assistant")
    calls = m.get("tool_calls") or []
    if not isinstance(calls, (list, tuple)):
        raise TranscriptError(i, "tool_calls", "expected a list")
    refusal = m.get("refusal")
    audio = m.get("audio")
    if isinstance(text, str) and not calls and refusal is None and audio is None:
        st.text = text
        return
    if isinstance(text, str):
        if text:
            st.add(TextBlock(text=text), 0, ("content", None), (i, "content"))
    else:
        for t, _part, j in text:
            block = TextBlock(text=t) if isinstance(t, str) else t
            st.add(block, 0, ("content", j), (i, f"content[{j}]"))
    if isinstance(refusal, str) and refusal:
        st.add(TextBlock(text=refusal), 0, ("refusal", None), (i, "refusal"))
    if isinstance(audio, Mapping):
        st.add(
            OpaqueBlock(format="openai", kind="audio", data=dict(audio)),
            0,
            ("audio", None),
            (i, "audio"),
        )
    for j, rc in enumerate(calls):
        c = as_mapping(rc, i, f"tool_calls[{j}]")
        cid = _nonempty_id(c, "id", i, f"tool_calls[{j}].id")
        kind = c.get("type", "function")
        if kind == "custom":
            custom = c.get("custom")
            if not isinstance(custom, Mapping) or not isinstance(custom.get("name"), str):
                raise TranscriptError(i, f"tool_calls[{j}].custom.name", "missing or not a string")
            raw_input = custom.get("input", "")
            if not isinstance(raw_input, str):
                raise TranscriptError(i, f"tool_calls[{j}].custom.input", "not a string")
            use = ToolUseBlock(id=cid, name=custom["name"], input=_custom_input(raw_input))
        elif kind == "function":
            fn = c.get("function")
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                raise TranscriptError(
                    i, f"tool_calls[{j}].function.name", "missing or not a string"
                )
            args = _parse_arguments(
                fn.get("arguments"),
                i,
                f"tool_calls[{j}].function.arguments",
                vocabulary="Chat Completions sends arguments as a string",
            )
            use = ToolUseBlock(id=cid, name=fn["name"], input=args)
            _keep_arguments(st, cid, fn.get("arguments"), args)
        else:
            raise TranscriptError(
                i, f"tool_calls[{j}].type", f"expected 'function' or 'custom', got {kind!r}"
            )
        st.add(use, 0, ("tool_calls", j), (i, f"tool_calls[{j}].id"))


# -- OpenAI Responses -------------------------------------------------------------------

#: Item types only the Responses API uses (evidence of the format).
RESPONSES_ITEMS = frozenset(
    {
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "reasoning",
        "compaction",
        "item_reference",
        "web_search_call",
        "file_search_call",
        "computer_call",
        "computer_call_output",
        "code_interpreter_call",
        "image_generation_call",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "tool_search_call",
        "tool_search_output",
    }
)
#: Output items and the field naming the call they answer (the call's ``call_id``, or the
#: ``id`` of an approval request).
_RESPONSES_OUTPUTS = {
    "function_call_output": "call_id",
    "custom_tool_call_output": "call_id",
    "computer_call_output": "call_id",
    "local_shell_call_output": "id",
    "shell_call_output": "call_id",
    "apply_patch_call_output": "call_id",
    "tool_search_output": "call_id",
    "mcp_approval_response": "approval_request_id",
}
#: Call items answered by an output item, and the field naming them.
_RESPONSES_CALLS = {
    "function_call": "call_id",
    "custom_tool_call": "call_id",
    "computer_call": "call_id",
    "local_shell_call": "call_id",
    "shell_call": "call_id",
    "apply_patch_call": "call_id",
    "tool_search_call": "call_id",
    "mcp_approval_request": "id",
}
_RESPONSES_PARTS = frozenset(
    {"input_text", "output_text", "input_image", "input_file", "input_audio", "refusal"}
)


def _responses_part(raw: Any, index: int, j: int, role: str) -> Block:
    p = as_mapping(raw, index, f"content[{j}]")
    kind = p.get("type")
    where = f"content[{j}]"
    if kind in ("input_text", "output_text", "text"):
        return TextBlock(text=_string(p, "text", index, f"{where}.text"))
    if kind == "refusal":
        return TextBlock(text=_string(p, "refusal", index, f"{where}.refusal"))
    if kind == "input_image":
        url = p.get("image_url")
        if isinstance(url, str) and url:
            return ImageBlock(source=_source_from_url(url, index, f"{where}.image_url"))
        if isinstance(p.get("file_id"), str):
            return ImageBlock(source={"type": "file", "file_id": p["file_id"]})
        raise TranscriptError(index, where, "expected 'image_url' or 'file_id' (a string)")
    if kind == "input_file":
        title = p.get("filename") if isinstance(p.get("filename"), str) else None
        if isinstance(p.get("file_data"), str):
            data = p["file_data"]
            src = (
                _source_from_url(data, index, f"{where}.file_data")
                if data.startswith("data:")
                else {"type": "base64", "media_type": "application/pdf", "data": data}
            )
        elif isinstance(p.get("file_id"), str):
            src = {"type": "file", "file_id": p["file_id"]}
        elif isinstance(p.get("file_url"), str):
            src = {"type": "url", "url": p["file_url"]}
        else:
            raise TranscriptError(
                index, where, "expected 'file_data', 'file_id' or 'file_url' (a string)"
            )
        return DocumentBlock(source=src, title=title)
    if kind == "input_audio":
        return OpaqueBlock(format="responses", kind="input_audio", data=dict(p))
    raise TranscriptError(
        index,
        f"{where}.type",
        f"unsupported content part {kind!r} in a {role} message; expected one of "
        + ", ".join(sorted(_RESPONSES_PARTS)),
    )


def _output_text(output: Any, index: int) -> str | tuple[Any, ...]:
    """A function call's output: a string, or its parts as result blocks."""
    if isinstance(output, str):
        return output
    if isinstance(output, (list, tuple)):
        parts: list[Block] = []
        for j, raw in enumerate(output):
            b = _responses_part(raw, index, j, "tool output")
            if isinstance(b, OpaqueBlock):
                b = TextBlock(text=json.dumps(b.data, ensure_ascii=False))
            parts.append(b)
        return tuple(parts)
    raise TranscriptError(
        index, "output", f"expected a string or a list of parts, got {type(output).__name__}"
    )


def _stage_responses(items: Sequence[Any], start: int = 0) -> Iterator[_Staged]:
    model: _Staged | None = None  # consecutive model-side items
    outs: _Staged | None = None  # consecutive outputs

    def flush_model() -> Iterator[_Staged]:
        nonlocal model
        if model is not None:
            yield model
            model = None

    def flush_outs() -> Iterator[_Staged]:
        nonlocal outs
        if outs is not None:
            yield outs
            outs = None

    for i, raw in enumerate(items, start):
        m = as_mapping(raw, i, None)
        kind = m.get("type")
        role = m.get("role")
        if kind is None and role is not None:
            kind = "message"
        if not isinstance(kind, str):
            raise TranscriptError(i, "type", "missing or not a string")
        if kind == "message" and role in ("user", "system", "developer"):
            yield from flush_model()
            yield from flush_outs()
            st = _Staged(role="user" if role == "user" else "system", index=i, raws=[raw])
            content = m.get("content")
            if isinstance(content, str):
                st.text = content
                key = _inserted_key(content) if role == "user" else None
                if key:
                    st.meta[key] = True
            elif isinstance(content, (list, tuple)):
                for j, part in enumerate(content):
                    st.add(_responses_part(part, i, j, role), 0, part, (i, f"content[{j}]"))
                if role == "user" and len(st.parts) == 1:
                    b = st.parts[0][0]
                    key = _inserted_key(b.text) if isinstance(b, TextBlock) else None
                    if key:
                        st.meta[key] = True
            else:
                raise TranscriptError(
                    i,
                    "content",
                    f"expected a string or a list of parts, got {type(content).__name__}",
                )
            yield st
            continue
        is_output = kind in _RESPONSES_OUTPUTS or kind.endswith("_output")
        if is_output:
            yield from flush_model()
            if outs is None:
                outs = _Staged(role="tool", index=i)
            outs.raws.append(raw)
            pos = len(outs.raws) - 1
            if kind in ("function_call_output", "custom_tool_call_output"):
                cid = _nonempty_id(m, "call_id", i, "call_id")
                body = _output_text(m.get("output", ""), i)
                outs.add(ToolResultBlock(tool_use_id=cid, content=body), pos, raw, (i, "call_id"))
            elif kind in _RESPONSES_OUTPUTS:
                key = _RESPONSES_OUTPUTS[kind]
                cid = _nonempty_id(m, key, i, key)
                outs.add(
                    OpaqueBlock(format="responses", kind=kind, data=dict(m), answers=cid),
                    pos,
                    raw,
                    (i, key),
                )
            else:  # an output item this version does not know: carried, unpaired
                block = OpaqueBlock(format="responses", kind=kind, data=dict(m))
                outs.add(block, pos, raw, (i, "type"))
            continue
        if kind == "message" and role != "assistant":
            raise TranscriptError(
                i, "role", f"expected user, system, developer or assistant, got {role!r}"
            )
        yield from flush_outs()
        if kind == "compaction":
            # A provider summary of everything before it: an entry of its own, kept whole.
            yield from flush_model()
        if model is None:
            model = _Staged(role="assistant", index=i)
        model.raws.append(raw)
        pos = len(model.raws) - 1
        _stage_model_item(model, m, raw, kind, i, pos)
        if kind == "compaction":
            # an entry of its own: what follows is not pinned with it
            model.meta[PROVIDER_COMPACTION] = True
            yield from flush_model()
    yield from flush_model()
    yield from flush_outs()


def _stage_model_item(
    st: _Staged, m: Mapping[str, Any], raw: Any, kind: str, i: int, pos: int
) -> None:
    if kind == "message":
        content = m.get("content")
        if isinstance(content, str):
            st.add(TextBlock(text=content), pos, raw, (i, "content"))
            return
        if not isinstance(content, (list, tuple)):
            raise TranscriptError(
                i, "content", f"expected a string or a list of parts, got {type(content).__name__}"
            )
        for j, part in enumerate(content):
            b = _responses_part(part, i, j, "assistant")
            if not isinstance(b, TextBlock):
                raise TranscriptError(
                    i, f"content[{j}].type", "an assistant message holds output_text or refusal"
                )
            st.add(b, pos, raw, (i, f"content[{j}]"))
        if not content:
            st.add(TextBlock(text=""), pos, raw, (i, "content"))
        return
    if kind == "function_call":
        cid = _nonempty_id(m, "call_id", i, "call_id")
        name = _string(m, "name", i, "name")
        args = _parse_arguments(
            m.get("arguments"), i, "arguments", vocabulary="the Responses API sends a string"
        )
        _keep_arguments(st, cid, m.get("arguments"), args)
        st.add(ToolUseBlock(id=cid, name=name, input=args), pos, raw, (i, "call_id"))
        return
    if kind == "custom_tool_call":
        cid = _nonempty_id(m, "call_id", i, "call_id")
        name = _string(m, "name", i, "name")
        text = m.get("input", "")
        if not isinstance(text, str):
            raise TranscriptError(i, "input", "not a string")
        st.add(ToolUseBlock(id=cid, name=name, input=_custom_input(text)), pos, raw, (i, "call_id"))
        return
    use_id = None
    if kind in _RESPONSES_CALLS:
        use_id = _nonempty_id(m, _RESPONSES_CALLS[kind], i, _RESPONSES_CALLS[kind])
    block = OpaqueBlock(
        format="responses",
        kind=kind,
        data=dict(m),
        use_id=use_id,
        reasoning=kind == "reasoning",
    )
    st.add(block, pos, raw, (i, _RESPONSES_CALLS.get(kind, "type")))


# -- detection --------------------------------------------------------------------------

_FORMAT_NAMES = {
    "openai": "OpenAI Chat Completions",
    "anthropic": "Anthropic Messages",
    "responses": "OpenAI Responses",
}


def _evidence(m: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(format, field)`` a message proves, or ``None`` when it reads the same in several."""
    kind = m.get("type")
    role = m.get("role")
    if isinstance(kind, str) and kind in RESPONSES_ITEMS:
        return "responses", "type"
    if role == "tool" or "tool_calls" in m or "tool_call_id" in m:
        return "openai", "role" if role == "tool" else "tool_calls"
    content = m.get("content")
    if isinstance(content, (list, tuple)):
        for j, raw in enumerate(content):
            p = raw if isinstance(raw, Mapping) else None
            if p is None:
                dump = getattr(raw, "model_dump", None)
                p = dump(mode="json", exclude_none=True) if callable(dump) else None
            if not isinstance(p, Mapping):
                continue
            pk = p.get("type")
            if pk in _CHAT_THINKING and role == "assistant":
                # Anthropic's, or a Claude conversation written as Chat Completions
                # messages (LangChain): Anthropic unless another message proves Chat.
                return "anthropic-or-openai", f"content[{j}].type"
            if pk in ANTHROPIC_ONLY:
                return "anthropic", f"content[{j}].type"
            if pk in ("input_text", "output_text", "input_image", "input_file"):
                return "responses", f"content[{j}].type"
            if pk in ("image_url", "file"):
                return "openai", f"content[{j}].type"
    if kind == "message" and role in ("user", "assistant", "system", "developer"):
        if "id" in m and role == "assistant" and isinstance(content, list):
            return None  # an Anthropic Message object has type "message" too
        return "responses", "type"
    if role in ("system", "developer"):
        return "openai-or-responses", "role"
    return None


def detect(
    messages: Sequence[Any], *, has_system: bool = False, prefer: str | None = None
) -> WireFormat:
    """The format of ``messages``, by evidence anywhere in the list.

    A message with a Responses item type (``function_call``, ``reasoning``...) or parts
    (``input_image``, ``output_text``) is Responses; a ``tool`` role, ``tool_calls`` or a
    Chat part (``image_url``, ``file``) is Chat Completions; a block type only Anthropic
    defines is Anthropic (so is a request with ``system`` beside ``messages``), except
    thinking blocks in an assistant's content: Anthropic unless another message proves
    Chat Completions (a Claude conversation as LangChain writes it). Lists that read the
    same in every format (plain text) are Chat Completions. Evidence of two formats is
    refused, naming the two messages. ``prefer="openai"`` reads thinking blocks alone as
    Chat Completions (new messages of a transcript read as Chat before).
    """
    found: dict[str, tuple[int, str]] = {}
    if has_system:
        found["anthropic"] = (-1, "system")
    for i, raw in enumerate(messages):
        m = as_mapping(raw, i, None)
        ev = _evidence(m)
        if ev is None:
            continue
        fmt, where = ev
        if fmt == "openai-or-responses":
            found.setdefault("_system", (i, where))
            continue
        if fmt == "anthropic-or-openai":
            found.setdefault("_thinking", (i, where))
            continue
        found.setdefault(fmt, (i, where))
    if "_thinking" in found and "openai" not in found:
        found.setdefault("openai" if prefer == "openai" else "anthropic", found["_thinking"])
    kinds = [k for k in found if not k.startswith("_")]
    if len(kinds) > 1:
        (a, (ia, fa)), (b, (ib, fb)) = sorted(
            ((k, found[k]) for k in kinds), key=lambda kv: kv[1][0]
        )[:2]
        first = "the request's system" if ia < 0 else f"message {ia} ({fa})"
        raise TranscriptError(
            ib,
            fb,
            f"reads as {_FORMAT_NAMES[b]}, but {first} reads as {_FORMAT_NAMES[a]}; "
            "one transcript holds one format (pass format= to choose)",
        )
    if kinds:
        if kinds[0] == "anthropic" and "_system" in found:
            i, where = found["_system"]
            raise TranscriptError(
                i, where, "Anthropic Messages has no system role; put it in the request's system"
            )
        return cast("WireFormat", kinds[0])
    return "openai"


# -- reading ----------------------------------------------------------------------------


def _items(data: Any) -> Sequence[Any]:
    if isinstance(data, (str, bytes, bytearray, Mapping)):
        raise TranscriptError(None, "messages", "expected a list of messages")
    if isinstance(data, Sequence):
        return data
    if isinstance(data, Iterable):
        return list(data)  # tuples are Sequences; generators and other iterables
    raise TranscriptError(
        None, "messages", f"expected a list of messages, got {type(data).__name__}"
    )


def read(
    messages: Any,
    format: WireFormat | Literal["auto"] = "auto",
    *,
    system: Any = None,
    allow_pending: bool = True,
) -> Transcript:
    """Read ``messages`` (a list, tuple or any iterable of dicts or SDK objects).

    ``system`` is an Anthropic request's system prompt (a string or text blocks), read
    as a leading system entry. ``allow_pending`` accepts calls without results in the
    last message only (a round still waiting for its tools). Raises
    :class:`TranscriptError` naming the message index and the field in the input's
    vocabulary.
    """
    items = _items(messages)
    fmt: WireFormat = detect(items, has_system=system is not None) if format == "auto" else format
    if fmt not in _FORMAT_NAMES:
        raise ValueError(
            f"unknown transcript format {fmt!r}; expected one of {list(_FORMAT_NAMES)}"
        )
    if fmt != "anthropic" and system is not None:
        raise TranscriptError(
            None, "system", f"{_FORMAT_NAMES[fmt]} puts the system prompt in a message"
        )
    staged = list(stage(fmt, items))
    return _build(fmt, staged, messages, system, allow_pending)


def stage(fmt: WireFormat, items: Sequence[Any], start: int = 0) -> Iterator[_Staged]:
    """The messages ``items`` (positions from ``start``) as staged entries of ``fmt``."""
    if fmt == "anthropic":
        return _stage_anthropic(items, start)
    if fmt == "openai":
        return _stage_chat(items, start)
    return _stage_responses(items, start)


def _build(
    fmt: WireFormat, staged: list[_Staged], container: Any, system: Any, allow_pending: bool
) -> Transcript:
    mem = AgentMemory()
    t = Transcript(format=fmt, memory=mem, sources={}, container=container)
    if system is not None:
        text = _system_text(system)
        if text:
            e = mem.add_message("system", text, turn_id=None)
            t.system, t.system_id = system, e.id
    newest = max((k for k, st in enumerate(staged) if st.meta.get(PROVIDER_COMPACTION)), default=-1)
    t.pending = check_tools(staged, allow_pending, t.seen, {})
    extend(t, mem, staged, pin=newest)
    return t


def extend(t: Transcript, mem: AgentMemory, staged: list[_Staged], *, pin: int = -1) -> None:
    """Append ``staged`` to ``mem`` as entries, recording their sources in ``t``.

    ``pin`` is the position in ``staged`` of the entry to pin (the newest provider
    compaction), or -1.
    """
    sources = t.sources
    turns = t.turns
    for k, st in enumerate(staged):
        content = st.content()
        role: Role = "user" if st.role == "tool" else cast("Role", st.role)
        group = st.meta.pop("_group", None)
        turn = None if role == "system" else turns.next(role, content)
        e = mem.add_message(role, content, turn_id=turn, pinned=k == pin, metadata=st.meta)
        sources[e.id] = Source(
            raws=st.raws,
            role=role,
            content=e.content,
            parts=st.parts,
            group=group,
        )


def check_tools(
    staged: list[_Staged],
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
        for (b, _, _), (i, where) in zip(st.parts, st.where, strict=True):
            uid = b.id if isinstance(b, ToolUseBlock) else None
            if isinstance(b, OpaqueBlock):
                uid = b.use_id
            if uid is not None:
                if uid in seen:
                    fi, ff = seen[uid]
                    raise TranscriptError(
                        i,
                        where,
                        f"tool-use id {uid!r} is already used by message {fi} ({ff}); "
                        "tool-use ids must be unique in a transcript",
                    )
                seen[uid] = (i, where)
        results = [
            (b.tool_use_id if isinstance(b, ToolResultBlock) else b.answers, at)
            for (b, _, _), at in zip(st.parts, st.where, strict=True)
            if isinstance(b, ToolResultBlock) or (isinstance(b, OpaqueBlock) and b.answers)
        ]
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
            for (b, _, _), at in zip(st.parts, st.where, strict=True):
                if isinstance(b, ToolUseBlock):
                    pending[b.id] = at
                elif isinstance(b, OpaqueBlock) and b.use_id:
                    pending[b.use_id] = at
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


# -- writing ----------------------------------------------------------------------------


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
    n = len(entries)
    k = 0
    while k < n:
        e = entries[k]
        src = t.sources.get(e.id)
        if e.id == t.system_id and t.system_id is not None:
            if e.content == t.memory[e.id].content:
                system_out = t.system
            else:
                system_texts.append(e.text())
            k += 1
            continue
        if src is not None and src.group is not None:
            _idx, size = src.group
            run = entries[k : k + size]
            if len(run) == size and all(
                (s := t.sources.get(x.id)) is not None
                and s.group == src.group
                and x.content == s.content
                for x in run
            ):
                out.append(src.raws[0])
                k += size
                continue
        if (
            src is not None
            and e.role == src.role
            and (e.content is src.content or e.content == src.content)
        ):
            out.extend(src.raws)
        elif e.role == "system" and t.format == "anthropic":
            system_texts.append(e.text())
        else:
            placed: list[tuple[Block, int, Any]] = []
            emitted = _rebuild(t.format, e, src, placed)
            out.extend(emitted)
            # What was rendered is now the caller's: given back unchanged, it is kept as is,
            # and changed again, its unchanged items are still given back as they are.
            t.sources[e.id] = Source(
                raws=emitted,
                role=e.role,
                content=e.content,
                parts=placed or _rendered_parts(t.format, e.content, emitted),
            )
        k += 1
    return _container(t, out, system_out, system_texts)


def _container(t: Transcript, out: list[Any], system_out: Any, system_texts: list[str]) -> Any:
    like = t.container
    if t.format == "anthropic" and isinstance(like, Mapping):
        d = dict(like)
        d["messages"] = out
        if system_out is not None and not system_texts:
            d["system"] = system_out
        elif system_texts or system_out is not None:
            prefix = [_system_text(system_out)] if system_out is not None else []
            d["system"] = "\n\n".join([*prefix, *system_texts])
        else:
            d.pop("system", None)
        return d
    if system_texts:
        raise TranscriptError(None, "system", "the compacted transcript gained a system prompt")
    if isinstance(like, Mapping):
        return {**like, "messages": out}
    return out


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


def _match(
    src: Source | None, content: Content
) -> list[tuple[Block, tuple[int, Any] | None, bool]]:
    """Each new block with its original ``(raw position, raw part)`` and whether unchanged."""
    blocks = (TextBlock(text=content),) if isinstance(content, str) else content
    if src is None:
        return [(b, None, False) for b in blocks]
    used = [False] * len(src.parts)
    out: list[tuple[Block, tuple[int, Any] | None, bool]] = []
    for b in blocks:
        hit = None
        for j, (ob, _pos, _raw) in enumerate(src.parts):
            if not used[j] and (ob is b or ob == b):
                hit = j
                break
        if hit is None:
            key = _block_key(b)
            for j, (ob, _pos, _raw) in enumerate(src.parts):
                if not used[j] and key is not None and _block_key(ob) == key:
                    hit = j
                    break
            if hit is None:
                out.append((b, None, False))
                continue
            used[hit] = True
            out.append((b, src.parts[hit][1:], False))
            continue
        used[hit] = True
        out.append((b, src.parts[hit][1:], True))
    return out


def _block_key(b: Block) -> tuple[str, str] | None:
    if isinstance(b, ToolUseBlock):
        return ("use", b.id)
    if isinstance(b, ToolResultBlock):
        return ("result", b.tool_use_id)
    return None


def _rebuild(
    fmt: WireFormat, e: Entry, src: Source | None, placed: list[tuple[Block, int, Any]]
) -> list[Any]:
    """A changed or new entry in ``fmt``, keeping the raw parts it still holds. A
    Responses entry also fills ``placed``: each block with the item it went to."""
    matched = _match(src, e.content)
    if fmt == "anthropic":
        return _rebuild_anthropic(e, src, matched)
    if fmt == "openai":
        return _rebuild_chat(e, src, matched)
    return _rebuild_responses(e, src, matched, placed)


def _rebuild_anthropic(
    e: Entry, src: Source | None, matched: list[tuple[Block, tuple[int, Any] | None, bool]]
) -> list[Any]:
    from normandy_core.transcripts.formats import block_to_anthropic

    role = "assistant" if e.role == "assistant" else "user"
    blocks: list[Any] = []
    for b, origin, same in matched:
        if origin is not None and same:
            blocks.append(origin[1])
        elif origin is not None:
            blocks.append({**_json_dict(origin[1]), **block_to_anthropic(b)})
        else:
            fresh = block_to_anthropic(b)
            if not (fresh["type"] == "text" and not fresh["text"]):
                blocks.append(fresh)
    if role == "user":
        blocks.sort(key=lambda x: as_mapping(x, None, None).get("type") != "tool_result")
    base = _json_dict(src.raws[0]) if src is not None and src.raws else {}
    if isinstance(e.content, str):
        return [{**base, "role": role, "content": e.content}]
    return [{**base, "role": role, "content": blocks}] if blocks or base else []


def _rebuild_chat(
    e: Entry, src: Source | None, matched: list[tuple[Block, tuple[int, Any] | None, bool]]
) -> list[Any]:
    from normandy_core.transcripts.formats import to_openai

    if src is None or e.role != src.role:
        return list(to_openai([e]))
    if src.role == "user" and any(isinstance(b, ToolResultBlock) for b, _, _ in matched):
        out: list[Any] = []
        for b, origin, same in matched:
            if origin is not None and same:
                out.append(src.raws[origin[0]])
            elif isinstance(b, ToolResultBlock):
                base = _json_dict(src.raws[origin[0]]) if origin is not None else {}
                out.append(
                    {**base, "role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()}
                )
            else:
                out.extend(to_openai([e.model_copy(update={"content": (b,)})]))
        return out
    base = _json_dict(src.raws[0])
    if src.role == "assistant" and any(
        isinstance(b, (ThinkingBlock, RedactedThinkingBlock))
        for b in (*(ob for ob, _, _ in src.parts), *(b for b, _, _ in matched))
    ):
        return [_rebuild_chat_thinking(base, matched)]
    if src.role == "assistant":
        raw_calls = list(base.get("tool_calls") or [])
        texts: list[str] = []
        calls: list[Any] = []
        content_same = True
        for b, origin, same in matched:
            tag = origin[1] if origin is not None else None
            if isinstance(b, ToolUseBlock):
                if tag is not None and same:
                    calls.append(raw_calls[tag[1]])
                elif tag is not None:
                    calls.append(_chat_call(raw_calls[tag[1]], b))
                else:
                    calls.append(_chat_call(None, b))
            elif isinstance(b, TextBlock):
                if tag is None or tag[0] == "content":
                    texts.append(b.text)
                    content_same = content_same and same
            elif isinstance(b, OpaqueBlock):
                continue  # audio stays in base
        expected = sum(
            1 for ob, _, raw in src.parts if isinstance(ob, TextBlock) and raw[0] == "content"
        )
        msg = dict(base)
        if not (content_same and len(texts) == expected):
            msg["content"] = "\n".join(texts) if texts else ("" if not calls else None)
        if calls:
            msg["tool_calls"] = calls
        else:
            msg.pop("tool_calls", None)
        return [msg]
    parts: list[Any] = []
    for b, origin, same in matched:
        if origin is not None and same:
            parts.append(origin[1])
        elif isinstance(b, TextBlock):
            parts.append({"type": "text", "text": b.text})
        else:
            parts.extend(to_openai([e.model_copy(update={"content": (b,)})])[0]["content"])
    if isinstance(e.content, str):
        return [{**base, "content": e.content}]
    return [{**base, "content": parts}]


def _rebuild_chat_thinking(
    base: dict[str, Any], matched: list[tuple[Block, tuple[int, Any] | None, bool]]
) -> dict[str, Any]:
    """A changed Chat assistant message that held (Anthropic) thinking parts: its content
    stays a list of parts in order, each unchanged part as it was given."""
    raw_parts = base.get("content")
    raw_calls = list(base.get("tool_calls") or [])
    parts: list[Any] = []
    calls: list[Any] = []
    for b, origin, same in matched:
        tag = origin[1] if origin is not None else None
        if isinstance(b, ToolUseBlock):
            if tag is not None and same:
                calls.append(raw_calls[tag[1]])
            else:
                calls.append(_chat_call(raw_calls[tag[1]] if tag is not None else None, b))
        elif isinstance(b, OpaqueBlock):
            continue  # audio stays in base
        elif same and tag is not None and tag[0] == "content" and isinstance(raw_parts, list):
            parts.append(raw_parts[tag[1]])
        elif isinstance(b, ThinkingBlock):
            parts.append({"type": "thinking", "thinking": b.thinking, "signature": b.signature})
        elif isinstance(b, RedactedThinkingBlock):
            parts.append({"type": "redacted_thinking", "data": b.data})
        elif isinstance(b, TextBlock) and (tag is None or tag[0] == "content"):
            parts.append({"type": "text", "text": b.text})
    msg = dict(base)
    msg["content"] = parts if parts else ("" if not calls else None)
    if calls:
        msg["tool_calls"] = calls
    else:
        msg.pop("tool_calls", None)
    return msg


def _chat_call(raw: Any, b: ToolUseBlock) -> dict[str, Any]:
    base: dict[str, Any] = _json_dict(raw) if raw is not None else {"id": b.id, "type": "function"}
    if base.get("type") == "custom":
        custom = dict(base.get("custom") or {})
        custom["input"] = _custom_text(b)
        return {**base, "custom": custom}
    fn = dict(base.get("function") or {"name": b.name})
    fn["arguments"] = json.dumps(b.input, ensure_ascii=False)
    return {**base, "function": fn}


def _rebuild_responses(
    e: Entry,
    src: Source | None,
    matched: list[tuple[Block, tuple[int, Any] | None, bool]],
    placed: list[tuple[Block, int, Any]],
) -> list[Any]:
    out: list[Any] = []
    done: dict[int, int] = {}  # raw position -> the index in ``out`` of its item
    for b, origin, _same in matched:
        if origin is None or src is None:
            if src is None and not _keeps(b):
                continue
            placed.append((b, len(out), None))
            out.append(_responses_fresh(e.role, b))
            continue
        pos = origin[0]
        if pos not in done:
            raw = src.raws[pos]
            item_blocks = [x for x in matched if x[1] is not None and x[1][0] == pos]
            originals = [p for p in src.parts if p[1] == pos]
            if len(item_blocks) == len(originals) and all(s for _, _, s in item_blocks):
                out.append(raw)
            else:
                out.append(_responses_changed(raw, item_blocks))
            done[pos] = len(out) - 1
        placed.append((b, done[pos], None))
    # the raw part of each block: its item (what _match hands back as the origin)
    placed[:] = [(b, k, out[k]) for b, k, _ in placed]
    return out


def _keeps(b: Block) -> bool:
    return not (isinstance(b, TextBlock) and not b.text)


def _responses_changed(
    raw: Any, item_blocks: list[tuple[Block, tuple[int, Any] | None, bool]]
) -> dict[str, Any]:
    d = _json_dict(raw)
    kind = d.get("type", "message")
    b = item_blocks[0][0]
    if kind in ("function_call_output", "custom_tool_call_output") and isinstance(
        b, ToolResultBlock
    ):
        return {**d, "output": b.text()}
    if kind == "function_call" and isinstance(b, ToolUseBlock):
        return {**d, "arguments": json.dumps(b.input, ensure_ascii=False)}
    if kind == "custom_tool_call" and isinstance(b, ToolUseBlock):
        return {**d, "input": _custom_text(b)}
    if kind == "message":
        parts = []
        role = d.get("role")
        for x, _, _ in item_blocks:
            if isinstance(x, TextBlock):
                parts.append(
                    {"type": "output_text", "text": x.text, "annotations": []}
                    if role == "assistant"
                    else {"type": "input_text", "text": x.text}
                )
        return {**d, "content": parts}
    return d


def _responses_fresh(role: str, b: Block) -> dict[str, Any]:
    if isinstance(b, OpaqueBlock) and b.format == "responses":
        return dict(b.data)
    if isinstance(b, ToolUseBlock):
        return {
            "type": "function_call",
            "call_id": b.id,
            "name": b.name,
            "arguments": json.dumps(b.input, ensure_ascii=False),
        }
    if isinstance(b, ToolResultBlock):
        return {"type": "function_call_output", "call_id": b.tool_use_id, "output": b.text()}
    text = b.text if isinstance(b, TextBlock) else json.dumps(b.model_dump(), ensure_ascii=False)
    if role == "assistant":  # an easy input message: an output message needs an id
        return {"type": "message", "role": "assistant", "content": text}
    r = "system" if role == "system" else "user"
    return {"type": "message", "role": r, "content": [{"type": "input_text", "text": text}]}
