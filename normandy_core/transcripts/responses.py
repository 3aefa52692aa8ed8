"""The OpenAI Responses API input item list, read and written: ``message`` items and easy
messages, ``function_call`` / ``function_call_output``, ``custom_tool_call`` /
``custom_tool_call_output``, ``reasoning``, ``compaction``, and every other item as
opaque, paired by ``call_id`` where it has an output item.

Consecutive model-side items (reasoning, assistant messages, calls) are one assistant
entry and consecutive outputs one results entry, so a reasoning item stays with the calls
it precedes and a parallel batch stays whole. A ``compaction`` item is an entry of its
own. :func:`read_responses` and :func:`rebuild_responses` serve
:func:`~normandy_core.transcripts.transcript.read` and ``write``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from normandy_core.conversation.entries import (
    Block,
    DocumentBlock,
    Entry,
    ImageBlock,
    OpaqueBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from normandy_core.conversation.keys import PROVIDER_COMPACTION_KEY
from normandy_core.transcripts.formats import TranscriptError, as_mapping, inserted_key
from normandy_core.transcripts.staging import (
    Matched,
    Source,
    Staged,
    Transcript,
    build,
    custom_input,
    custom_text,
    json_dict,
    keep_arguments,
    nonempty_id,
    parse_arguments,
    source_from_url,
    string_field,
)

__all__ = [
    "RESPONSES_ITEMS",
    "read_responses",
    "rebuild_responses",
    "stage_responses",
]

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


# -- reading --------------------------------------------------------------------------------


def read_responses(
    items: Sequence[Any], container: Any, *, instructions: Any = None, allow_pending: bool = True
) -> Transcript:
    """The Responses ``items`` (read from ``container``) as a transcript, with
    ``instructions`` (a request's system prompt, a string) as a leading system entry."""
    if instructions is not None and not isinstance(instructions, str):  # as the API takes them
        raise TranscriptError(None, "instructions", "expected a string")
    staged = list(stage_responses(items))
    return build(
        "responses",
        staged,
        container,
        allow_pending,
        system=instructions,
        system_text=instructions or "",
    )


def _input_file(part: Mapping[str, Any], index: int, where: str) -> DocumentBlock:
    title = part.get("filename") if isinstance(part.get("filename"), str) else None
    if isinstance(part.get("file_data"), str):
        data = part["file_data"]
        src = (
            source_from_url(data, index, f"{where}.file_data")
            if data.startswith("data:")
            else {"type": "base64", "media_type": "application/pdf", "data": data}
        )
    elif isinstance(part.get("file_id"), str):
        src = {"type": "file", "file_id": part["file_id"]}
    elif isinstance(part.get("file_url"), str):
        src = {"type": "url", "url": part["file_url"]}
    else:
        raise TranscriptError(
            index, where, "expected 'file_data', 'file_id' or 'file_url' (a string)"
        )
    return DocumentBlock(source=src, title=title)


def _responses_part(raw: Any, index: int, j: int, role: str) -> Block:
    part = as_mapping(raw, index, f"content[{j}]")
    kind = part.get("type")
    where = f"content[{j}]"
    if kind in ("input_text", "output_text", "text"):
        return TextBlock(text=string_field(part, "text", index, f"{where}.text"))
    if kind == "refusal":
        return TextBlock(text=string_field(part, "refusal", index, f"{where}.refusal"))
    if kind == "input_image":
        url = part.get("image_url")
        if isinstance(url, str) and url:
            return ImageBlock(source=source_from_url(url, index, f"{where}.image_url"))
        if isinstance(part.get("file_id"), str):
            return ImageBlock(source={"type": "file", "file_id": part["file_id"]})
        raise TranscriptError(index, where, "expected 'image_url' or 'file_id' (a string)")
    if kind == "input_file":
        return _input_file(part, index, where)
    if kind == "input_audio":
        return OpaqueBlock(format="responses", kind="input_audio", data=dict(part))
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
            block = _responses_part(raw, index, j, "tool output")
            if isinstance(block, OpaqueBlock):
                block = TextBlock(text=json.dumps(block.data, ensure_ascii=False))
            parts.append(block)
        return tuple(parts)
    raise TranscriptError(
        index, "output", f"expected a string or a list of parts, got {type(output).__name__}"
    )


def _item_kind(item: Mapping[str, Any], i: int) -> str:
    """The item's type; an easy message (a role without a type) is a ``message``."""
    kind = item.get("type")
    if kind is None and item.get("role") is not None:
        kind = "message"
    if not isinstance(kind, str):
        raise TranscriptError(i, "type", "missing or not a string")
    return kind


def _side(item: Mapping[str, Any], kind: str, i: int) -> str:
    """Which entry an item joins: ``input`` (a message of its own), ``tool`` (the outputs
    run) or ``assistant`` (the model-side run)."""
    role = item.get("role")
    if kind == "message" and role in ("user", "system", "developer"):
        return "input"
    if kind in _RESPONSES_OUTPUTS or kind.endswith("_output"):
        return "tool"
    if kind == "message" and role != "assistant":
        raise TranscriptError(
            i, "role", f"expected user, system, developer or assistant, got {role!r}"
        )
    return "assistant"


def stage_responses(items: Sequence[Any], start: int = 0) -> Iterator[Staged]:
    """The Responses ``items`` (positions from ``start``) as staged entries."""
    run: Staged | None = None  # the open run of consecutive model-side items or outputs
    for i, raw in enumerate(items, start):
        item = as_mapping(raw, i, None)
        kind = _item_kind(item, i)
        side = _side(item, kind, i)
        # A compaction (a provider summary of everything before it) is an entry of its
        # own, kept whole.
        if run is not None and (run.role != side or kind == "compaction"):
            yield run
            run = None
        if side == "input":
            yield _stage_input(item, raw, i)
            continue
        if run is None:
            run = Staged(role=side, index=i)
        run.raws.append(raw)
        pos = len(run.raws) - 1
        if side == "tool":
            _stage_output(run, item, raw, kind, i, pos)
            continue
        _stage_model_item(run, item, raw, kind, i, pos)
        if kind == "compaction":
            # an entry of its own: what follows is not pinned with it
            run.meta[PROVIDER_COMPACTION_KEY] = True
            yield run
            run = None
    if run is not None:
        yield run


def _stage_input(item: Mapping[str, Any], raw: Any, i: int) -> Staged:
    """A user, system or developer message as a staged entry."""
    role = item.get("role")
    st = Staged(role="user" if role == "user" else "system", index=i, raws=[raw])
    content = item.get("content")
    if isinstance(content, str):
        st.text = content
        key = inserted_key(content) if role == "user" else None
        if key:
            st.meta[key] = True
    elif isinstance(content, (list, tuple)):
        for j, part in enumerate(content):
            st.add(_responses_part(part, i, j, str(role)), 0, part, (i, f"content[{j}]"))
        if role == "user" and len(st.parts) == 1:
            block = st.parts[0][0]
            key = inserted_key(block.text) if isinstance(block, TextBlock) else None
            if key:
                st.meta[key] = True
    else:
        raise TranscriptError(
            i, "content", f"expected a string or a list of parts, got {type(content).__name__}"
        )
    return st


def _stage_output(
    st: Staged, item: Mapping[str, Any], raw: Any, kind: str, i: int, pos: int
) -> None:
    """Add the output item ``i`` to the outputs run ``st``."""
    if kind in ("function_call_output", "custom_tool_call_output"):
        cid = nonempty_id(item, "call_id", i, "call_id")
        body = _output_text(item.get("output", ""), i)
        st.add(ToolResultBlock(tool_use_id=cid, content=body), pos, raw, (i, "call_id"))
    elif kind in _RESPONSES_OUTPUTS:
        key = _RESPONSES_OUTPUTS[kind]
        cid = nonempty_id(item, key, i, key)
        block = OpaqueBlock(format="responses", kind=kind, data=dict(item), answers=cid)
        st.add(block, pos, raw, (i, key))
    else:  # an output item this version does not know: carried, unpaired
        block = OpaqueBlock(format="responses", kind=kind, data=dict(item))
        st.add(block, pos, raw, (i, "type"))


def _stage_assistant_message(
    st: Staged, item: Mapping[str, Any], raw: Any, i: int, pos: int
) -> None:
    content = item.get("content")
    if isinstance(content, str):
        st.add(TextBlock(text=content), pos, raw, (i, "content"))
        return
    if not isinstance(content, (list, tuple)):
        raise TranscriptError(
            i, "content", f"expected a string or a list of parts, got {type(content).__name__}"
        )
    for j, part in enumerate(content):
        block = _responses_part(part, i, j, "assistant")
        if not isinstance(block, TextBlock):
            raise TranscriptError(
                i, f"content[{j}].type", "an assistant message holds output_text or refusal"
            )
        st.add(block, pos, raw, (i, f"content[{j}]"))
    if not content:
        st.add(TextBlock(text=""), pos, raw, (i, "content"))


def _stage_model_item(
    st: Staged, item: Mapping[str, Any], raw: Any, kind: str, i: int, pos: int
) -> None:
    """Add the model-side item ``i`` to the assistant run ``st``."""
    if kind == "message":
        _stage_assistant_message(st, item, raw, i, pos)
        return
    if kind == "function_call":
        cid = nonempty_id(item, "call_id", i, "call_id")
        name = string_field(item, "name", i, "name")
        args = parse_arguments(
            item.get("arguments"), i, "arguments", vocabulary="the Responses API sends a string"
        )
        keep_arguments(st, cid, item.get("arguments"), args)
        st.add(ToolUseBlock(id=cid, name=name, input=args), pos, raw, (i, "call_id"))
        return
    if kind == "custom_tool_call":
        cid = nonempty_id(item, "call_id", i, "call_id")
        name = string_field(item, "name", i, "name")
        text = item.get("input", "")
        if not isinstance(text, str):
            raise TranscriptError(i, "input", "not a string")
        st.add(ToolUseBlock(id=cid, name=name, input=custom_input(text)), pos, raw, (i, "call_id"))
        return
    use_id = None
    if kind in _RESPONSES_CALLS:
        use_id = nonempty_id(item, _RESPONSES_CALLS[kind], i, _RESPONSES_CALLS[kind])
    block = OpaqueBlock(
        format="responses",
        kind=kind,
        data=dict(item),
        use_id=use_id,
        reasoning=kind == "reasoning",
    )
    st.add(block, pos, raw, (i, _RESPONSES_CALLS.get(kind, "type")))


# -- writing a changed entry ----------------------------------------------------------------


def rebuild_responses(
    entry: Entry, src: Source | None, matched: Matched, placed: list[tuple[Block, int, Any]]
) -> list[Any]:
    """A changed or new ``entry`` as Responses items, each item whose blocks are all
    unchanged as given; ``placed`` gets each block with the item it went to."""
    out: list[Any] = []
    done: dict[int, int] = {}  # raw position -> the index in ``out`` of its item
    for block, origin, _same in matched:
        if origin is None or src is None:
            if src is None and not _keeps(block):
                continue
            placed.append((block, len(out), None))
            out.append(_responses_fresh(entry.role, block))
            continue
        pos = origin[0]
        if pos not in done:
            raw = src.raws[pos]
            item_blocks = [m for m in matched if m[1] is not None and m[1][0] == pos]
            originals = [p for p in src.parts if p[1] == pos]
            if len(item_blocks) == len(originals) and all(same for _, _, same in item_blocks):
                out.append(raw)
            else:
                out.append(_responses_changed(raw, item_blocks))
            done[pos] = len(out) - 1
        placed.append((block, done[pos], None))
    # the raw part of each block: its item (what match_blocks hands back as the origin)
    placed[:] = [(block, k, out[k]) for block, k, _ in placed]
    return out


def _keeps(block: Block) -> bool:
    return not (isinstance(block, TextBlock) and not block.text)


def _responses_changed(raw: Any, item_blocks: Matched) -> dict[str, Any]:
    """The item ``raw`` with what changed in its blocks written over it."""
    item = json_dict(raw)
    kind = item.get("type", "message")
    block = item_blocks[0][0]
    if kind in ("function_call_output", "custom_tool_call_output") and isinstance(
        block, ToolResultBlock
    ):
        return {**item, "output": block.text()}
    if kind == "function_call" and isinstance(block, ToolUseBlock):
        return {**item, "arguments": json.dumps(block.input, ensure_ascii=False)}
    if kind == "custom_tool_call" and isinstance(block, ToolUseBlock):
        return {**item, "input": custom_text(block)}
    if kind == "message":
        parts = []
        role = item.get("role")
        for text_block, _, _ in item_blocks:
            if isinstance(text_block, TextBlock):
                parts.append(
                    {"type": "output_text", "text": text_block.text, "annotations": []}
                    if role == "assistant"
                    else {"type": "input_text", "text": text_block.text}
                )
        return {**item, "content": parts}
    return item


def _responses_fresh(role: str, block: Block) -> dict[str, Any]:
    """A new block as a Responses item."""
    if isinstance(block, OpaqueBlock) and block.format == "responses":
        return dict(block.data)
    if isinstance(block, ToolUseBlock):
        return {
            "type": "function_call",
            "call_id": block.id,
            "name": block.name,
            "arguments": json.dumps(block.input, ensure_ascii=False),
        }
    if isinstance(block, ToolResultBlock):
        return {
            "type": "function_call_output",
            "call_id": block.tool_use_id,
            "output": block.text(),
        }
    text = (
        block.text
        if isinstance(block, TextBlock)
        else json.dumps(block.model_dump(), ensure_ascii=False)
    )
    if role == "assistant":  # an easy input message: an output message needs an id
        return {"type": "message", "role": "assistant", "content": text}
    input_role = "system" if role == "system" else "user"
    return {
        "type": "message",
        "role": input_role,
        "content": [{"type": "input_text", "text": text}],
    }
