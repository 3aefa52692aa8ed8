"""Independent request validators for the fuzz campaign: the oracle of provider validity.

Written from the providers' documented request rules, without ``normandy_core.structure``
or the project's pairing checks, so a bug shared by the compactors and those helpers
still shows. Each validator returns a list of problems (empty when the request is
valid); a problem names the message index.

OpenAI Chat Completions (``messages`` of ``/v1/chat/completions``):

- roles ``system``, ``developer``, ``user``, ``assistant``, ``tool``; only their fields;
- ``content`` a string or a non-empty array of the parts the role allows (text for
  system, developer and tool; text, image_url, input_audio and file for user; text and
  refusal for assistant); an assistant message may omit ``content`` only with
  ``tool_calls``;
- ``tool_calls`` a non-empty array of ``{id, type: "function", function: {name,
  arguments}}`` with ``arguments`` a JSON string; tool-call ids unique in the request;
- an assistant message with ``tool_calls`` is followed directly by one ``tool`` message
  per call (``tool_call_id`` matching, in any order, nothing in between); a ``tool``
  message answers a call of that assistant message, once.

Anthropic Messages (``system`` and ``messages`` of ``/v1/messages``):

- ``system`` a string or an array of text blocks; messages have role ``user`` or
  ``assistant`` only, and the first message has role ``user``;
- consecutive messages of one role are combined into one turn (the API does this), and
  the rules below apply to the combined turns;
- content is a non-empty string or a non-empty array of blocks; text is never empty or
  only whitespace (only the final assistant message may have empty content);
- user turns hold text, image, document and tool_result blocks; assistant turns text,
  thinking (with a signature), redacted_thinking and tool_use (id matching
  ``^[a-zA-Z0-9_-]+$``, unique in the request, ``input`` an object);
- every tool_use of an assistant turn is answered by a tool_result in the user turn
  right after it, whose tool_result blocks come before any other block; a tool_result
  answers a tool_use of the assistant turn right before it, once.

Both accept, with ``allow_open_round`` (the default), tool calls of the *last* message
without results: the state of a transcript whose round still waits for its tools
(``mid_round``), which gets its results before it is sent.

A Normandy memory dump is checked for ids and parent links, for tool pairing over its
active branch, and then under both providers' rules after conversion with the project's
``to_openai``/``to_anthropic`` (the conversions are what the clients send).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "validate",
    "validate_anthropic",
    "validate_normandy",
    "validate_openai",
]

FIRST_USER = "first message must use the user role"

_TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_IMAGE_TYPES = {"image/jpeg", "image/png", "image/gif", "image/webp"}

_OPENAI_KEYS = {
    "system": {"role", "content", "name"},
    "developer": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    "assistant": {"role", "content", "name", "tool_calls", "refusal", "audio", "function_call"},
    "tool": {"role", "content", "tool_call_id"},
}
_OPENAI_PARTS = {
    "system": {"text"},
    "developer": {"text"},
    "user": {"text", "image_url", "input_audio", "file"},
    "assistant": {"text", "refusal"},
    "tool": {"text"},
}


# -- OpenAI ---------------------------------------------------------------------------


def _openai_part_problem(part: Any, role: str) -> str | None:
    if not isinstance(part, Mapping):
        return f"content part is {type(part).__name__}, not an object"
    kind = part.get("type")
    if kind not in _OPENAI_PARTS[role]:
        return f"content part type {kind!r} is not allowed in a {role} message"
    if kind == "text":
        return None if isinstance(part.get("text"), str) else "text part without a string text"
    if kind == "refusal":
        ok = isinstance(part.get("refusal"), str)
        return None if ok else "refusal part without a string refusal"
    if kind == "image_url":
        img = part.get("image_url")
        url = img.get("url") if isinstance(img, Mapping) else None
        if not isinstance(url, str) or not url:
            return "image_url part without a url"
        if url.startswith("data:") and not re.match(r"^data:image/[\w.+-]+;base64,", url):
            return f"image_url data URL is not a base64 image: {url[:40]!r}"
        if not url.startswith(("data:", "http://", "https://")):
            return f"image_url url is neither http(s) nor a data URL: {url[:40]!r}"
        return None
    if kind == "file":
        f = part.get("file")
        if not isinstance(f, Mapping) or not (
            isinstance(f.get("file_data"), str) or isinstance(f.get("file_id"), str)
        ):
            return "file part without file_data or file_id"
        return None
    audio = part.get("input_audio")
    if not isinstance(audio, Mapping) or not isinstance(audio.get("data"), str):
        return "input_audio part without data"
    return None


def _openai_content_problems(m: Mapping[str, Any], role: str) -> list[str]:
    content = m.get("content")
    if content is None:
        if role == "assistant" and m.get("tool_calls"):
            return []
        return ["content is missing (only an assistant message with tool_calls may omit it)"]
    if isinstance(content, str):
        return []
    if not isinstance(content, list):
        return [f"content is {type(content).__name__}, not a string or an array"]
    if not content:
        return ["content is an empty array"]
    out = []
    for j, part in enumerate(content):
        problem = _openai_part_problem(part, role)
        if problem:
            out.append(f"content[{j}]: {problem}")
    return out


def _openai_tool_call_problems(calls: Any) -> tuple[list[str], list[str]]:
    """Problems of an assistant message's ``tool_calls``, and the ids it declares."""
    if not isinstance(calls, list):
        return [f"tool_calls is {type(calls).__name__}, not an array"], []
    if not calls:
        return ["tool_calls is an empty array"], []
    problems: list[str] = []
    ids: list[str] = []
    for j, c in enumerate(calls):
        where = f"tool_calls[{j}]"
        if not isinstance(c, Mapping):
            problems.append(f"{where} is not an object")
            continue
        cid = c.get("id")
        if not isinstance(cid, str) or not cid:
            problems.append(f"{where}.id is missing")
        else:
            ids.append(cid)
        if c.get("type") != "function":
            problems.append(f"{where}.type is {c.get('type')!r}, not 'function'")
        fn = c.get("function")
        if not isinstance(fn, Mapping):
            problems.append(f"{where}.function is missing")
            continue
        name = fn.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            problems.append(f"{where}.function.name {name!r} is not a valid function name")
        args = fn.get("arguments")
        if not isinstance(args, str):
            problems.append(f"{where}.function.arguments is not a string")
            continue
        try:
            parsed = json.loads(args)
        except ValueError:
            problems.append(f"{where}.function.arguments is not JSON")
            continue
        if not isinstance(parsed, dict):
            problems.append(f"{where}.function.arguments is not a JSON object")
    return problems, ids


def validate_openai(messages: Any, *, allow_open_round: bool = True) -> list[str]:
    """Problems of an OpenAI Chat Completions ``messages`` array (empty when valid)."""
    if isinstance(messages, Mapping) and "messages" in messages:
        messages = messages["messages"]
    if not isinstance(messages, list):
        return [f"messages is {type(messages).__name__}, not an array"]
    if not messages:
        return ["messages is empty"]
    problems: list[str] = []
    seen_ids: dict[str, int] = {}
    pending: dict[str, int] = {}  # tool_call_id -> index of the assistant message
    answered: set[str] = set()
    batch_open = False  # the previous message is the assistant message or one of its tools
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping):
            problems.append(f"{where}: not an object")
            batch_open = False
            continue
        role = m.get("role")
        if role not in _OPENAI_KEYS:
            problems.append(f"{where}: role {role!r} is not a Chat Completions role")
            batch_open = False
            continue
        extra = set(m) - _OPENAI_KEYS[role]
        if extra:
            problems.append(f"{where}: fields {sorted(extra)} are not allowed in a {role} message")
        problems.extend(f"{where}: {p}" for p in _openai_content_problems(m, role))
        if role == "tool":
            tid = m.get("tool_call_id")
            if not isinstance(tid, str) or not tid:
                problems.append(f"{where}: tool message without tool_call_id")
            elif not batch_open or tid not in pending:
                if tid in answered:
                    problems.append(f"{where}: tool call {tid!r} is answered twice")
                else:
                    problems.append(
                        f"{where}: tool message {tid!r} does not answer a tool call of the "
                        "assistant message right before it"
                    )
            else:
                del pending[tid]
                answered.add(tid)
            continue
        if pending:
            problems.append(
                f"{where}: tool calls {sorted(pending)} of messages[{min(pending.values())}] "
                "are not answered by tool messages right after it"
            )
            pending = {}
        batch_open = False
        if role == "assistant" and "tool_calls" in m and m["tool_calls"] is not None:
            call_problems, ids = _openai_tool_call_problems(m["tool_calls"])
            problems.extend(f"{where}: {p}" for p in call_problems)
            for cid in ids:
                if cid in seen_ids:
                    problems.append(
                        f"{where}: tool call id {cid!r} is also used by messages[{seen_ids[cid]}]"
                    )
                seen_ids[cid] = i
                pending[cid] = i
            batch_open = True
    if pending:
        last = messages[-1]
        open_round = (
            isinstance(last, Mapping)
            and last.get("role") == "assistant"
            and set(pending.values()) == {len(messages) - 1}
        )
        if not (allow_open_round and open_round):
            problems.append(
                f"messages[{min(pending.values())}]: tool calls {sorted(pending)} are never "
                "answered"
            )
    return problems


# -- Anthropic ------------------------------------------------------------------------

_USER_BLOCKS = {"text", "image", "document", "tool_result", "search_result"}
_ASSISTANT_BLOCKS = {"text", "thinking", "redacted_thinking", "tool_use"}
#: A combined turn of an Anthropic request: role, and (message index, block) pairs.
Turn = tuple[str, list[tuple[int, Mapping[str, Any]]]]


def _blank(text: str) -> bool:
    return not text.strip()


def _source_problem(source: Any, kind: str) -> str | None:
    if not isinstance(source, Mapping):
        return f"{kind} without a source object"
    stype = source.get("type")
    if stype == "base64":
        if not isinstance(source.get("data"), str):
            return f"{kind} base64 source without data"
        media = source.get("media_type")
        if kind == "image" and media not in _IMAGE_TYPES:
            return f"image media_type {media!r} is not one of {sorted(_IMAGE_TYPES)}"
        if kind == "document" and media != "application/pdf":
            return f"document base64 media_type {media!r} is not application/pdf"
        return None
    if stype == "url":
        return None if isinstance(source.get("url"), str) else f"{kind} url source without url"
    if stype == "file":
        ok = isinstance(source.get("file_id"), str)
        return None if ok else f"{kind} file source without file_id"
    if kind == "document" and stype == "text":
        return None if isinstance(source.get("data"), str) else "text document without data"
    if kind == "document" and stype == "content":
        return None
    return f"{kind} source type {stype!r} is not allowed"


def _anthropic_block_problem(b: Any, role: str, final: bool) -> str | None:
    if not isinstance(b, Mapping):
        return f"block is {type(b).__name__}, not an object"
    kind = b.get("type")
    allowed = _USER_BLOCKS if role == "user" else _ASSISTANT_BLOCKS
    if kind not in allowed:
        return f"block type {kind!r} is not allowed in a {role} message"
    if kind == "text":
        text = b.get("text")
        if not isinstance(text, str):
            return "text block without a string text"
        if _blank(text):
            return "text block is empty or only whitespace"
        return None
    if kind in ("image", "document"):
        return _source_problem(b.get("source"), kind)
    if kind == "thinking":
        if not isinstance(b.get("thinking"), str):
            return "thinking block without thinking text"
        if not isinstance(b.get("signature"), str):
            return "thinking block without a signature"
        return None
    if kind == "redacted_thinking":
        data = b.get("data")
        return None if isinstance(data, str) and data else "redacted_thinking without data"
    if kind == "tool_use":
        tid, name = b.get("id"), b.get("name")
        if not isinstance(tid, str) or not _TOOL_ID.match(tid):
            return f"tool_use id {tid!r} does not match ^[a-zA-Z0-9_-]+$"
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            return f"tool_use name {name!r} is not a valid tool name"
        if not isinstance(b.get("input"), Mapping):
            return "tool_use input is not an object"
        return None
    if kind == "tool_result":
        if not isinstance(b.get("tool_use_id"), str):
            return "tool_result without tool_use_id"
        if "is_error" in b and not isinstance(b["is_error"], bool):
            return "tool_result is_error is not a boolean"
        content = b.get("content", "")
        if isinstance(content, str):
            return None
        if not isinstance(content, list):
            return "tool_result content is neither a string nor an array"
        for j, p in enumerate(content):
            if not isinstance(p, Mapping) or p.get("type") not in (
                "text",
                "image",
                "document",
                "search_result",
            ):
                return f"tool_result content[{j}] is not a text, image or document block"
            problem = _anthropic_block_problem(p, "user", final)
            if problem:
                return f"tool_result content[{j}]: {problem}"
        return None
    return None


def validate_anthropic(request: Any, *, allow_open_round: bool = True) -> list[str]:
    """Problems of an Anthropic Messages request: a ``messages`` array or ``{system, messages}``."""
    problems: list[str] = []
    messages = request
    if isinstance(request, Mapping):
        system = request.get("system")
        if system is not None:
            if isinstance(system, list):
                for j, b in enumerate(system):
                    if not (
                        isinstance(b, Mapping)
                        and b.get("type") == "text"
                        and isinstance(b.get("text"), str)
                        and not _blank(b["text"])
                    ):
                        problems.append(f"system[{j}]: not a non-empty text block")
            elif not isinstance(system, str):
                problems.append(f"system is {type(system).__name__}, not a string or an array")
        messages = request.get("messages")
    if not isinstance(messages, list):
        return [*problems, f"messages is {type(messages).__name__}, not an array"]
    if not messages:
        return [*problems, "messages is empty"]

    # Each message checked alone, then combined into turns as the API does.
    turns: list[Turn] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        final = i == len(messages) - 1
        if not isinstance(m, Mapping):
            problems.append(f"{where}: not an object")
            continue
        role = m.get("role")
        if role not in ("user", "assistant"):
            problems.append(f"{where}: role {role!r} is not 'user' or 'assistant'")
            continue
        if i == 0 and role != "user":
            problems.append(f"{where}: {FIRST_USER}")
        extra = set(m) - {"role", "content"}
        if extra:
            problems.append(f"{where}: fields {sorted(extra)} are not allowed")
        content = m.get("content")
        blocks: list[Mapping[str, Any]] = []
        if isinstance(content, str):
            if _blank(content) and not (final and role == "assistant"):
                problems.append(f"{where}: content is empty or only whitespace")
            elif content:
                blocks = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            if not content and not (final and role == "assistant"):
                problems.append(f"{where}: content is an empty array")
            for j, b in enumerate(content):
                problem = _anthropic_block_problem(b, role, final)
                if problem:
                    problems.append(f"{where}.content[{j}]: {problem}")
                elif isinstance(b, Mapping):
                    blocks.append(b)
        else:
            problems.append(f"{where}: content is {type(content).__name__}")
            continue
        indexed = [(i, b) for b in blocks]
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(indexed)
        else:
            turns.append((role, indexed))

    return problems + _turn_problems(turns, allow_open_round)


def _turn_problems(turns: list[Turn], allow_open_round: bool) -> list[str]:
    """Tool pairing over the combined turns of an Anthropic request."""
    problems: list[str] = []
    seen_uses: dict[str, int] = {}
    answered: set[str] = set()
    for t, (role, turn_blocks) in enumerate(turns):
        if role == "assistant":
            uses = [(at, b["id"]) for at, b in turn_blocks if b.get("type") == "tool_use"]
            for at, uid in uses:
                if uid in seen_uses:
                    problems.append(
                        f"messages[{at}]: tool_use id {uid!r} is also used by "
                        f"messages[{seen_uses[uid]}]"
                    )
                seen_uses[uid] = at
            if not uses:
                continue
            last_turn = t == len(turns) - 1
            if last_turn:
                if not allow_open_round:
                    problems.append(
                        f"messages[{uses[0][0]}]: tool_use ids {[u for _, u in uses]} have no "
                        "tool_result after them"
                    )
                continue
            nxt = turns[t + 1][1]
            got = {b.get("tool_use_id") for _, b in nxt if b.get("type") == "tool_result"}
            missing = [u for _, u in uses if u not in got]
            if missing:
                problems.append(
                    f"messages[{uses[0][0]}]: tool_use ids {missing} were found without "
                    "tool_result blocks immediately after"
                )
            continue
        prev_uses: set[str] = set()
        if t > 0 and turns[t - 1][0] == "assistant":
            prev_uses = {b["id"] for _, b in turns[t - 1][1] if b.get("type") == "tool_use"}
        after_other = False
        for at, b in turn_blocks:
            if b.get("type") != "tool_result":
                after_other = True
                continue
            rid = b.get("tool_use_id")
            if after_other:
                problems.append(
                    f"messages[{at}]: tool_result {rid!r} comes after other content; "
                    "tool_result blocks must come first"
                )
            if rid in answered:
                problems.append(f"messages[{at}]: tool_use {rid!r} is answered twice")
            elif rid not in prev_uses:
                problems.append(
                    f"messages[{at}]: unexpected tool_use_id {rid!r} in tool_result blocks: it "
                    "has no tool_use block in the previous message"
                )
            answered.add(str(rid))
    return problems


# -- Normandy memory dumps ------------------------------------------------------------


def _dump_entries(dump: Any) -> tuple[list[Mapping[str, Any]], list[str]]:
    """The active branch of a dump (head back to root, oldest first), and its problems."""
    if not isinstance(dump, Mapping) or dump.get("format") != "normandy.memory":
        return [], ["not a Normandy memory dump"]
    raw = dump.get("entries")
    if not isinstance(raw, list):
        return [], ["entries is not an array"]
    by_id: dict[str, Mapping[str, Any]] = {}
    problems: list[str] = []
    for k, e in enumerate(raw):
        eid = e.get("id") if isinstance(e, Mapping) else None
        if not isinstance(eid, str) or not eid:
            problems.append(f"entries[{k}]: no id")
            continue
        if eid in by_id:
            problems.append(f"entries[{k}]: id {eid!r} is used twice")
        by_id[eid] = e
    branch: list[Mapping[str, Any]] = []
    cur = dump.get("head")
    seen: set[str] = set()
    while cur is not None:
        if cur in seen or cur not in by_id:
            problems.append(f"the parent chain from the head breaks at {cur!r}")
            break
        seen.add(cur)
        branch.append(by_id[cur])
        cur = by_id[cur].get("parent_id")
    branch.reverse()
    return branch, problems


def _entry_blocks(e: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = e.get("content")
    if isinstance(content, list):
        return [b for b in content if isinstance(b, Mapping)]
    return []


def validate_normandy(dump: Any, *, allow_open_round: bool = True) -> list[str]:
    """Problems of a Normandy memory dump: ids, links, pairing, and both providers' rules."""
    branch, problems = _dump_entries(dump)
    if problems:
        return problems
    pending: dict[str, str] = {}
    for k, e in enumerate(branch):
        blocks = _entry_blocks(e)
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        if results:
            if e.get("role") not in ("user", "tool"):
                problems.append(f"entry {k}: role {e.get('role')!r} carries tool results")
            for rid in results:
                if rid in pending:
                    del pending[rid]
                else:
                    problems.append(
                        f"entry {k}: tool result {rid!r} without its tool use in the "
                        "assistant entry before it"
                    )
            continue
        if pending:
            problems.append(f"entry {k}: tool uses {sorted(pending)} are not answered before it")
            pending = {}
        if e.get("role") == "assistant":
            pending = {
                str(b.get("id")): str(e.get("id")) for b in blocks if b.get("type") == "tool_use"
            }
    if pending:
        last_is_use = bool(branch) and branch[-1].get("role") == "assistant"
        if not (allow_open_round and last_is_use):
            problems.append(f"tool uses {sorted(pending)} are never answered")
    if problems:
        return problems
    # The project's conversions are what its clients send; the requests must be valid.
    from normandy_core import AgentMemory
    from normandy_core.formats import to_anthropic, to_openai

    try:
        memory = AgentMemory.load(dump)
    except ValueError as exc:
        return [f"the dump does not load: {exc}"]
    problems.extend(
        f"as OpenAI: {p}"
        for p in validate_openai(to_openai(memory), allow_open_round=allow_open_round)
    )
    system, messages = to_anthropic(memory)
    request: dict[str, Any] = {"messages": messages}
    if system is not None:
        request["system"] = system
    problems.extend(
        f"as Anthropic: {p}" for p in validate_anthropic(request, allow_open_round=allow_open_round)
    )
    return problems


def validate(fmt: str, data: Any, *, allow_open_round: bool = True) -> list[str]:
    """Problems of ``data`` under the validator of ``fmt`` (openai, anthropic or normandy)."""
    if fmt == "openai":
        return validate_openai(data, allow_open_round=allow_open_round)
    if fmt == "anthropic":
        return validate_anthropic(data, allow_open_round=allow_open_round)
    if fmt == "normandy":
        return validate_normandy(data, allow_open_round=allow_open_round)
    raise ValueError(f"unknown format {fmt!r}")
