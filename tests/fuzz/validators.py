"""Independent request validators for the fuzz campaign: the oracle of provider validity.

Written from the providers' documented request rules, without
``normandy_core.conversation.structure`` or the project's pairing checks, so a bug shared by the
compactors and those helpers still shows. Each validator returns a list of problems (empty when the
request is valid); a problem names the message index.

OpenAI Chat Completions (``messages`` of ``/v1/chat/completions``):

- roles ``system``, ``developer``, ``user``, ``assistant``, ``tool``; only their fields;
- ``content`` a string or a non-empty array of the parts the role allows (text for
  system, developer and tool; text, image_url, input_audio and file for user; text and
  refusal for assistant); an assistant message may omit ``content`` only with
  ``tool_calls``;
- ``tool_calls`` a non-empty array of ``{id, type: "function", function: {name,
  arguments}}`` with ``arguments`` a JSON string, or ``{id, type: "custom", custom:
  {name, input}}`` with ``input`` a string; tool-call ids unique in the request;
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
- user turns hold text, image, document, tool_result, search_result and
  container_upload blocks; assistant turns text, thinking (with a signature),
  redacted_thinking, tool_use (id matching ``^[a-zA-Z0-9_-]+$``, unique in the request,
  ``input`` an object), compaction (``content`` a string), and the server-side tool
  blocks: ``server_tool_use`` (id ``^srvtoolu_[a-zA-Z0-9_]+$``) and ``mcp_tool_use``,
  each answered by its result block (``web_search_tool_result``, ``web_fetch_tool_result``,
  the code execution results; ``mcp_tool_result``) later in the same assistant turn;
- text blocks may carry ``citations`` (each with a ``type`` and ``cited_text``) and any
  block ``cache_control`` (``{"type": "ephemeral"}``, with an optional ``ttl``);
- block types named ``fuzz_future_*`` stand for types the API adds after this was
  written: accepted in either role (the campaign draws them to check they are carried);
- every tool_use of an assistant turn is answered by a tool_result in the user turn
  right after it, whose tool_result blocks come before any other block; a tool_result
  answers a tool_use of the assistant turn right before it, once.

OpenAI Responses (``input`` item list of ``/v1/responses``), see :func:`validate_responses`.

Each accepts, with ``allow_open_round`` (the default), tool calls of the *last* message
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
    "validate_responses",
    "validate_sdk",
]

FIRST_USER = "first message must use the user role"
#: Block and item types standing for what a provider adds later (see the module docs).
FUTURE_PREFIX = "fuzz_future_"

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


#: Anthropic thinking parts an assistant's content holds in a Claude conversation written
#: as Chat Completions messages (LangChain's ``convert_to_openai_messages``).
_LC_THINKING = ("thinking", "redacted_thinking")


def _lc_thinking_problems(content: list[Any]) -> list[str]:
    """Thinking parts (allowed by ``thinking=True``): well formed, before any other part."""
    out = []
    seen_other = False
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in _LC_THINKING:
            seen_other = True
            continue
        if seen_other:
            out.append(f"content[{j}]: a {kind} part after a text or refusal part")
        if kind == "thinking" and not (
            isinstance(part.get("thinking"), str) and isinstance(part.get("signature"), str)
        ):
            out.append(f"content[{j}]: thinking part without thinking text and a signature")
        if kind == "redacted_thinking" and not (
            isinstance(part.get("data"), str) and part.get("data")
        ):
            out.append(f"content[{j}]: redacted_thinking part without data")
    return out


def _openai_content_problems(m: Mapping[str, Any], role: str, thinking: bool = False) -> list[str]:
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
    lc = thinking and role == "assistant"
    out = _lc_thinking_problems(content) if lc else []
    for j, part in enumerate(content):
        if lc and isinstance(part, Mapping) and part.get("type") in _LC_THINKING:
            continue
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
        if c.get("type") == "custom":
            custom = c.get("custom")
            if not isinstance(custom, Mapping):
                problems.append(f"{where}.custom is missing")
                continue
            name = custom.get("name")
            if not isinstance(name, str) or not _TOOL_NAME.match(name):
                problems.append(f"{where}.custom.name {name!r} is not a valid tool name")
            if not isinstance(custom.get("input"), str):
                problems.append(f"{where}.custom.input is not a string")
            continue
        if c.get("type") != "function":
            problems.append(f"{where}.type is {c.get('type')!r}, not 'function' or 'custom'")
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


def validate_openai(
    messages: Any, *, allow_open_round: bool = True, thinking: bool = False
) -> list[str]:
    """Problems of an OpenAI Chat Completions ``messages`` array (empty when valid).

    ``thinking=True`` also accepts Anthropic thinking parts leading an assistant's
    content (a Claude conversation as LangChain writes it in this format)."""
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
        problems.extend(f"{where}: {p}" for p in _openai_content_problems(m, role, thinking))
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

_USER_BLOCKS = {"text", "image", "document", "tool_result", "search_result", "container_upload"}
#: Server tool results, by the name of the server tool whose ``server_tool_use`` they answer.
_SERVER_RESULTS = {
    "web_search_tool_result": "web_search",
    "web_fetch_tool_result": "web_fetch",
    "code_execution_tool_result": "code_execution",
    "bash_code_execution_tool_result": "bash_code_execution",
    "text_editor_code_execution_tool_result": "text_editor_code_execution",
}
_ASSISTANT_BLOCKS = {
    "text",
    "thinking",
    "redacted_thinking",
    "tool_use",
    "server_tool_use",
    "mcp_tool_use",
    "mcp_tool_result",
    "compaction",
    *_SERVER_RESULTS,
}
_SERVER_ID = re.compile(r"^srvtoolu_[a-zA-Z0-9_]+$")
_CACHE_TTLS = {"5m", "1h"}
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


def _cache_problem(b: Mapping[str, Any]) -> str | None:
    cc = b.get("cache_control")
    if cc is None:
        return None
    if not isinstance(cc, Mapping) or cc.get("type") != "ephemeral":
        return f"cache_control {cc!r} is not {{'type': 'ephemeral'}}"
    if "ttl" in cc and cc["ttl"] not in _CACHE_TTLS:
        return f"cache_control ttl {cc['ttl']!r} is not one of {sorted(_CACHE_TTLS)}"
    return None


def _citations_problem(citations: Any) -> str | None:
    if citations is None:
        return None
    if not isinstance(citations, list):
        return "text citations is not an array"
    for j, c in enumerate(citations):
        if not (
            isinstance(c, Mapping)
            and isinstance(c.get("type"), str)
            and isinstance(c.get("cited_text"), str)
        ):
            return f"citations[{j}] is not a citation with a type and cited_text"
    return None


def _server_block_problem(b: Mapping[str, Any], kind: str) -> str | None:
    """Fields of the server-side tool blocks (``server_tool_use``, MCP, their results)."""
    if kind in ("server_tool_use", "mcp_tool_use"):
        uid = b.get("id")
        pattern = _SERVER_ID if kind == "server_tool_use" else _TOOL_ID
        if not isinstance(uid, str) or not pattern.match(uid):
            return f"{kind} id {uid!r} does not match {pattern.pattern}"
        if not isinstance(b.get("name"), str) or not b["name"]:
            return f"{kind} without a name"
        if not isinstance(b.get("input"), Mapping):
            return f"{kind} input is not an object"
        if kind == "mcp_tool_use" and not isinstance(b.get("server_name"), str):
            return "mcp_tool_use without a server_name"
        return None
    if kind == "compaction":
        content = b.get("content")
        return None if content is None or isinstance(content, str) else "compaction content"
    # a result block
    if not isinstance(b.get("tool_use_id"), str):
        return f"{kind} without tool_use_id"
    if "content" not in b:
        return f"{kind} without content"
    if kind == "mcp_tool_result":
        content = b["content"]
        if "is_error" in b and not isinstance(b["is_error"], bool):
            return "mcp_tool_result is_error is not a boolean"
        if isinstance(content, str):
            return None
        if not isinstance(content, list) or not all(
            isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        ):
            return "mcp_tool_result content is neither a string nor text blocks"
    return None


def _search_result_problem(b: Mapping[str, Any]) -> str | None:
    if not isinstance(b.get("source"), str) or not isinstance(b.get("title"), str):
        return "search_result without a string source and title"
    content = b.get("content")
    if not isinstance(content, list) or not content:
        return "search_result content is not a non-empty array of text blocks"
    for p in content:
        if not (isinstance(p, Mapping) and p.get("type") == "text"):
            return "search_result content holds a block that is not text"
        if not isinstance(p.get("text"), str) or _blank(p["text"]):
            return "search_result text block is empty"
    return None


def _anthropic_block_problem(b: Any, role: str, final: bool) -> str | None:
    if not isinstance(b, Mapping):
        return f"block is {type(b).__name__}, not an object"
    kind = b.get("type")
    if isinstance(kind, str) and kind.startswith(FUTURE_PREFIX):
        return None
    allowed = _USER_BLOCKS if role == "user" else _ASSISTANT_BLOCKS
    if kind not in allowed:
        return f"block type {kind!r} is not allowed in a {role} message"
    cache = _cache_problem(b)
    if cache:
        return cache
    if kind == "text":
        text = b.get("text")
        if not isinstance(text, str):
            return "text block without a string text"
        if _blank(text):
            return "text block is empty or only whitespace"
        return _citations_problem(b.get("citations"))
    if kind == "search_result":
        return _search_result_problem(b)
    if kind == "container_upload":
        ok = isinstance(b.get("file_id"), str) and b["file_id"]
        return None if ok else "container_upload without a file_id"
    if kind in ("server_tool_use", "mcp_tool_use", "mcp_tool_result", "compaction") or (
        kind in _SERVER_RESULTS
    ):
        return _server_block_problem(b, kind)
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
            server_ids = [
                (at, b["id"])
                for at, b in turn_blocks
                if b.get("type") in ("server_tool_use", "mcp_tool_use")
            ]
            uses = [(at, b["id"]) for at, b in turn_blocks if b.get("type") == "tool_use"]
            for at, uid in [*server_ids, *uses]:
                if uid in seen_uses:
                    problems.append(
                        f"messages[{at}]: tool_use id {uid!r} is also used by "
                        f"messages[{seen_uses[uid]}]"
                    )
                seen_uses[uid] = at
            problems.extend(_server_pair_problems(turn_blocks))
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


def _server_pair_problems(turn_blocks: list[tuple[int, Mapping[str, Any]]]) -> list[str]:
    """Server and MCP tool uses answered, once each, later in the same assistant turn."""
    problems: list[str] = []
    open_: dict[str, tuple[int, str]] = {}  # id -> (message index, use kind or tool name)
    done: set[str] = set()
    for at, b in turn_blocks:
        kind = b.get("type")
        if kind == "server_tool_use":
            open_[b["id"]] = (at, str(b.get("name")))
        elif kind == "mcp_tool_use":
            open_[b["id"]] = (at, "mcp")
        elif kind in _SERVER_RESULTS or kind == "mcp_tool_result":
            rid = b.get("tool_use_id")
            want = "mcp" if kind == "mcp_tool_result" else _SERVER_RESULTS[str(kind)]
            if rid in done:
                problems.append(f"messages[{at}]: {kind} {rid!r} answers its tool use twice")
            elif rid not in open_:
                problems.append(
                    f"messages[{at}]: {kind} {rid!r} answers no server or MCP tool use "
                    "earlier in this assistant turn"
                )
            elif open_[rid][1] != want:
                problems.append(
                    f"messages[{at}]: {kind} {rid!r} answers a {open_[rid][1]!r} tool use"
                )
            else:
                del open_[rid]
                done.add(str(rid))
    for uid, (at, _) in open_.items():
        problems.append(
            f"messages[{at}]: server or MCP tool use {uid!r} has no result in its assistant turn"
        )
    return problems


# -- OpenAI Responses ------------------------------------------------------------------

#: Output item type -> the call item type it answers (by ``call_id``).
RESPONSES_OUTPUTS = {
    "function_call_output": "function_call",
    "custom_tool_call_output": "custom_tool_call",
    "computer_call_output": "computer_call",
    "shell_call_output": "shell_call",
    "apply_patch_call_output": "apply_patch_call",
    "local_shell_call_output": "local_shell_call",
}
#: The field of an output item naming its call (``call_id`` unless listed): the reference
#: gives ``local_shell_call_output`` an ``id``, "the unique ID of the local shell tool call
#: generated by the model", which is the call's ``call_id``.
_OUTPUT_CALL_KEY = {"local_shell_call_output": "id"}
#: Required fields (beside ``type``) of the items the model produces, from the API reference.
_RESPONSES_MODEL_ITEMS: dict[str, tuple[str, ...]] = {
    "reasoning": ("id", "summary"),
    "function_call": ("call_id", "name", "arguments"),
    "custom_tool_call": ("call_id", "name", "input"),
    "web_search_call": ("id", "status", "action"),
    "file_search_call": ("id", "queries", "status"),
    "computer_call": ("id", "call_id", "action", "pending_safety_checks", "status"),
    "code_interpreter_call": ("id", "code", "container_id", "outputs", "status"),
    "image_generation_call": ("id", "result", "status"),
    "shell_call": ("call_id", "action"),
    "local_shell_call": ("id", "call_id", "action", "status"),
    "tool_search_call": ("arguments",),
    "apply_patch_call": ("call_id", "operation", "status"),
    "mcp_call": ("id", "arguments", "name", "server_label"),
    "mcp_list_tools": ("id", "server_label", "tools"),
    "mcp_approval_request": ("id", "arguments", "name", "server_label"),
}
_RESPONSES_OTHER_ITEMS: dict[str, tuple[str, ...]] = {
    "function_call_output": ("call_id", "output"),
    "custom_tool_call_output": ("call_id", "output"),
    "computer_call_output": ("call_id", "output"),
    "shell_call_output": ("call_id", "output"),
    "apply_patch_call_output": ("call_id", "status"),
    "local_shell_call_output": ("id", "output"),
    "tool_search_output": ("tools",),
    "mcp_approval_response": ("approval_request_id", "approve"),
    "compaction": ("encrypted_content",),
    "item_reference": ("id",),
}
_RESPONSES_STATUS = {"in_progress", "completed", "incomplete"}
#: Every status an item may have (the call items add their own).
_ITEM_STATUS = _RESPONSES_STATUS | {"searching", "failed", "generating", "interpreting"}
#: Item id prefixes the API checks when an item is given back with its id.
_RESPONSES_ID_PREFIX = {"reasoning": "rs_", "function_call": "fc_", "message": "msg_"}
_INPUT_PARTS = {"input_text", "input_image", "input_file"}


def _input_part_problem(part: Any) -> str | None:
    if not isinstance(part, Mapping):
        return f"content part is {type(part).__name__}, not an object"
    kind = part.get("type")
    if kind == "input_text":
        return None if isinstance(part.get("text"), str) else "input_text without a string text"
    if kind == "input_image":
        url, fid = part.get("image_url"), part.get("file_id")
        if not (isinstance(url, str) and url) and not (isinstance(fid, str) and fid):
            return "input_image without image_url or file_id"
        if isinstance(url, str) and not url.startswith(("data:image/", "http://", "https://")):
            return f"input_image image_url is neither http(s) nor an image data URL: {url[:40]!r}"
        if part.get("detail") not in ("low", "high", "auto", "original"):
            return f"input_image detail {part.get('detail')!r} is not low, high, auto or original"
        return None
    if kind == "input_file":
        if not any(isinstance(part.get(k), str) for k in ("file_data", "file_id", "file_url")):
            return "input_file without file_data, file_id or file_url"
        return None
    return f"content part type {kind!r} is not an input part ({sorted(_INPUT_PARTS)})"


def _output_part_problem(part: Any) -> str | None:
    if not isinstance(part, Mapping):
        return f"content part is {type(part).__name__}, not an object"
    kind = part.get("type")
    if kind == "output_text":
        if not isinstance(part.get("text"), str):
            return "output_text without a string text"
        if not isinstance(part.get("annotations"), list):
            return "output_text without an annotations array"
        return None
    if kind == "refusal":
        ok = isinstance(part.get("refusal"), str)
        return None if ok else "refusal part without a string refusal"
    return f"content part type {kind!r} is not allowed in an assistant message"


def _responses_message_problems(m: Mapping[str, Any]) -> list[str]:
    role = m.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        return [f"message role {role!r} is not user, system, developer or assistant"]
    content = m.get("content")
    if isinstance(content, str):
        return []
    if not isinstance(content, list):
        return [f"message content is {type(content).__name__}, not a string or an array"]
    problems: list[str] = []
    check = _output_part_problem if role == "assistant" else _input_part_problem
    for j, part in enumerate(content):
        problem = check(part)
        if problem:
            problems.append(f"content[{j}]: {problem}")
    if role == "assistant":
        # An assistant message given with content parts is an output message: id, status.
        if not isinstance(m.get("id"), str):
            problems.append("an assistant output message without an id")
        if m.get("status") not in _RESPONSES_STATUS:
            problems.append(f"an assistant output message with status {m.get('status')!r}")
    elif not content:
        problems.append("message content is an empty array")
    return problems


def _responses_item_problems(m: Mapping[str, Any], kind: str) -> list[str]:
    """The fields of one item, as the API reference lists them."""
    if kind == "message":
        problems = _responses_message_problems(m)
    else:
        required = _RESPONSES_MODEL_ITEMS.get(kind) or _RESPONSES_OTHER_ITEMS.get(kind)
        if required is None:
            return [f"item type {kind!r} is not a Responses input item"]
        problems = [f"{kind} without {k!r}" for k in required if m.get(k) is None]
        for k in ("call_id", "approval_request_id"):
            if k in required and not (isinstance(m.get(k), str) and m[k]):
                problems.append(f"{kind} {k} is not a non-empty string")
    status = m.get("status")
    if status is not None and status not in _ITEM_STATUS:
        problems.append(f"{kind} status {status!r} is not an item status")
    prefix = _RESPONSES_ID_PREFIX.get(kind)
    if prefix and "id" in m and not (isinstance(m["id"], str) and m["id"].startswith(prefix)):
        problems.append(f"{kind} id {m['id']!r} does not begin with {prefix!r}")
    if kind == "function_call" and isinstance(m.get("arguments"), str):
        try:
            args = json.loads(m["arguments"])
        except ValueError:
            problems.append("function_call arguments is not JSON")
        else:
            if not isinstance(args, dict):
                problems.append("function_call arguments is not a JSON object")
    if kind in ("function_call", "custom_tool_call"):
        name = m.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            problems.append(f"{kind} name {name!r} is not a valid function name")
    if kind == "custom_tool_call" and not isinstance(m.get("input"), str):
        problems.append("custom_tool_call input is not a string")
    if kind in ("function_call_output", "custom_tool_call_output"):
        out = m.get("output")
        if isinstance(out, list):
            for j, part in enumerate(out):
                problem = _input_part_problem(part)
                if problem:
                    problems.append(f"output[{j}]: {problem}")
        elif not isinstance(out, str):
            problems.append(f"{kind} output is neither a string nor an array of input parts")
    if kind == "reasoning":
        summary = m.get("summary")
        if not isinstance(summary, list) or not all(
            isinstance(x, Mapping)
            and x.get("type") == "summary_text"
            and isinstance(x.get("text"), str)
            for x in summary
        ):
            problems.append("reasoning summary is not an array of summary_text parts")
        enc = m.get("encrypted_content")
        if enc is not None and not isinstance(enc, str):
            problems.append("reasoning encrypted_content is not a string")
    if kind == "compaction" and not isinstance(m.get("encrypted_content"), str):
        problems.append("compaction encrypted_content is not a string")
    if kind == "mcp_approval_response" and not isinstance(m.get("approve"), bool):
        problems.append("mcp_approval_response approve is not a boolean")
    return problems


def _responses_kind(m: Mapping[str, Any]) -> str | None:
    kind = m.get("type")
    if kind is None and "role" in m:
        return "message"  # an easy input message
    return kind if isinstance(kind, str) else None


def _model_side(m: Any, *, reasoning: bool) -> bool:
    """An item the model produces (an assistant message, a call, a reasoning item)."""
    if not isinstance(m, Mapping):
        return False
    kind = _responses_kind(m)
    if kind == "message":
        return m.get("role") == "assistant"
    if kind == "reasoning":
        return reasoning
    return kind in _RESPONSES_MODEL_ITEMS or kind == "item_reference"


def validate_responses(items: Any, *, allow_open_round: bool = True) -> list[str]:
    """Problems of an OpenAI Responses ``input`` item list (empty when valid).

    From the API reference and the errors it documents:

    - every item has a known ``type`` (a message may omit it) and the fields the
      reference marks required; messages have role ``user``, ``system``, ``developer``
      (input parts: ``input_text``, ``input_image`` with ``detail``, ``input_file``) or
      ``assistant`` (a string, or ``output_text`` with ``annotations`` and ``refusal``
      parts, then with ``id`` and ``status``: an output message); item ids the API
      checks begin with their prefix (``rs_``, ``fc_``, ``msg_``);
    - every ``function_call``, ``custom_tool_call`` and other call with a ``call_id``
      and an output type (``computer_call``, ``shell_call``, ``apply_patch_call``,
      ``local_shell_call``, whose output names the call in its ``id``) is answered by
      exactly one output item of its type with that ``call_id``, after it
      and before the next user, system or developer message ("No tool output found for
      function call ..."); no output without its call ("No tool call found for function
      call output ..."); call ids unique; an ``mcp_approval_response`` answers an
      ``mcp_approval_request`` before it, once;
    - a ``reasoning`` item is directly followed by another item of the model's turn
      (a call or an assistant message, possibly after more reasoning): "Item 'rs_...'
      of type 'reasoning' was provided without its required following item";
    - with ``allow_open_round``, calls after the last output and the last input message
      may be unanswered (the round waits for its tools), never a partly answered batch.
    """
    if isinstance(items, Mapping) and "input" in items:
        items = items["input"]
    if not isinstance(items, list):
        return [f"input is {type(items).__name__}, not an array"]
    if not items:
        return ["input is empty"]
    problems: list[str] = []
    pending: dict[str, tuple[int, str]] = {}  # call id -> (index, call type)
    seen_calls: dict[str, int] = {}
    answered: set[str] = set()
    approvals: dict[str, int] = {}  # mcp approval request id -> index
    tool_searches: set[str] = set()
    approved: set[str] = set()
    last_closing = -1  # index of the last output item or input message
    for i, m in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(m, Mapping):
            problems.append(f"{where}: not an object")
            continue
        kind = _responses_kind(m)
        if kind is None:
            problems.append(f"{where}: type is missing or not a string")
            continue
        if kind.startswith(FUTURE_PREFIX):
            continue
        problems.extend(f"{where}: {p}" for p in _responses_item_problems(m, kind))
        if kind == "message" and m.get("role") != "assistant":
            if pending:
                first = min(at for at, _ in pending.values())
                problems.append(
                    f"input[{first}]: calls {sorted(pending)} have no output before the "
                    f"{m.get('role')} message at {where}"
                )
                pending = {}
            last_closing = i
        elif kind in RESPONSES_OUTPUTS:
            last_closing = i
            cid = m.get(_OUTPUT_CALL_KEY.get(kind, "call_id"))
            if cid in answered:
                problems.append(f"{where}: call {cid!r} is answered twice")
            elif cid not in pending:
                problems.append(
                    f"{where}: {kind} {cid!r} has no {RESPONSES_OUTPUTS[kind]} before it"
                )
            elif pending[cid][1] != RESPONSES_OUTPUTS[kind]:
                problems.append(f"{where}: {kind} {cid!r} answers a {pending[cid][1]}")
                del pending[cid]
            else:
                del pending[cid]
                answered.add(str(cid))
        elif kind == "tool_search_output":
            # answers the tool_search_call its optional call_id names (a search the
            # server ran has no output item to give)
            cid = m.get("call_id")
            if cid is not None and cid not in tool_searches:
                problems.append(f"{where}: tool_search_output {cid!r} answers no tool_search_call")
        elif kind == "tool_search_call":
            if isinstance(m.get("call_id"), str):
                tool_searches.add(m["call_id"])
        elif kind == "mcp_approval_response":
            last_closing = i
            rid = m.get("approval_request_id")
            if rid in approved:
                problems.append(f"{where}: approval request {rid!r} is answered twice")
            elif rid not in approvals:
                problems.append(f"{where}: approval response {rid!r} answers no request before it")
            approved.add(str(rid))
        elif kind == "reasoning":
            j = i + 1
            while (
                j < len(items)
                and isinstance(items[j], Mapping)
                and items[j].get("type") == ("reasoning")
            ):
                j += 1
            if j >= len(items) or not _model_side(items[j], reasoning=False):
                problems.append(
                    f"{where}: reasoning item {m.get('id')!r} was provided without its required "
                    "following item"
                )
        elif kind == "mcp_approval_request":
            if m.get("id") in approvals:
                problems.append(f"{where}: approval request id {m.get('id')!r} is used twice")
            approvals[str(m.get("id"))] = i
        elif f"{kind}_output" in RESPONSES_OUTPUTS:
            cid = m.get("call_id")
            if isinstance(cid, str) and cid:
                if cid in seen_calls:
                    problems.append(
                        f"{where}: call id {cid!r} is also used by input[{seen_calls[cid]}]"
                    )
                seen_calls[cid] = i
                pending[cid] = (i, kind)
    if pending:
        first = min(at for at, _ in pending.values())
        if not (allow_open_round and first > last_closing):
            problems.append(f"input[{first}]: calls {sorted(pending)} are never answered")
    return problems


# -- the official SDKs' typed request params, as a second oracle --------------------------

_ADAPTERS: dict[str, Any] = {}


def _adapter(fmt: str) -> Any:
    """The SDK's type adapter of one message (item) of ``fmt``."""
    if fmt not in _ADAPTERS:
        from pydantic import TypeAdapter

        if fmt == "openai":
            from openai.types.chat import ChatCompletionMessageParam

            _ADAPTERS[fmt] = TypeAdapter(ChatCompletionMessageParam)
        elif fmt == "anthropic":
            from anthropic.types.beta import BetaMessageParam

            _ADAPTERS[fmt] = TypeAdapter(BetaMessageParam)
        else:
            from openai.types.responses import ResponseInputItemParam

            _ADAPTERS[fmt] = TypeAdapter(ResponseInputItemParam)
    return _ADAPTERS[fmt]


def _future(x: Any) -> bool:
    return isinstance(x, Mapping) and str(x.get("type", "")).startswith(FUTURE_PREFIX)


def _force(value: Any) -> None:
    """Consume what pydantic validates lazily: the SDKs type arrays as ``Iterable``, whose
    items pydantic validates only when iterated."""
    if isinstance(value, Mapping):
        for v in value.values():
            _force(v)
    elif isinstance(value, (list, tuple)) or type(value).__name__ == "ValidatorIterator":
        for v in value:
            _force(v)


def _best_error(errors: list[Any]) -> Any:
    """The error of the union member named like the block or item it was given.

    A union reports every member's error; the telling one is where the input's ``type``
    (``tool_result``) names the member (``BetaToolResultBlockParam``).
    """

    def norm(x: Any) -> str:
        return re.sub(r"[^a-z]", "", str(x).lower())

    best, best_extra = errors[0], None
    for e in errors:
        kind = e.get("input", {}).get("type") if isinstance(e.get("input"), Mapping) else None
        if not isinstance(kind, str):
            continue
        for seg in e["loc"]:
            if isinstance(seg, str) and norm(kind) in norm(seg):
                extra = len(norm(seg)) - len(norm(kind))
                if best_extra is None or extra < best_extra:
                    best, best_extra = e, extra
    return best


def validate_sdk(fmt: str, data: Any, *, thinking: bool = False) -> list[str]:
    """Problems the official SDK's typed params find (``pydantic`` validation errors).

    Chat Completions: ``list[openai.types.chat.ChatCompletionMessageParam]``; Anthropic:
    ``list[anthropic.types.beta.BetaMessageParam]``; Responses:
    ``list[openai.types.responses.ResponseInputItemParam]``; each message validated alone
    and in depth (the SDKs type arrays as ``Iterable``, which pydantic checks only when
    iterated, so every array is consumed). A second oracle beside the hand-written
    validators: the SDK checks each message's shape, not the pairing. The
    ``fuzz_future_*`` stand-ins are left out (no SDK knows them yet), and with
    ``thinking=True`` the Anthropic thinking parts of Chat assistant messages (no SDK type
    of Chat Completions holds them).
    """
    if fmt not in ("openai", "anthropic", "responses"):
        return []
    messages = data
    if isinstance(data, Mapping):
        messages = data.get("messages", data.get("input"))
    if not isinstance(messages, list):
        return [f"sdk: messages is {type(messages).__name__}"]
    from pydantic import ValidationError

    adapter = _adapter(fmt)
    problems: list[str] = []
    for i, m in enumerate(messages):
        if _future(m):
            continue
        content = m.get("content") if isinstance(m, Mapping) else None
        if isinstance(content, list) and any(_future(b) for b in content):
            m = {**m, "content": [b for b in content if not _future(b)]}
            content = m["content"]
        if thinking and fmt == "openai" and isinstance(content, list):
            rest = [
                b for b in content if not (isinstance(b, Mapping) and b.get("type") in _LC_THINKING)
            ]
            if len(rest) != len(content):
                m = {**m, "content": rest or None}
        try:
            _force(adapter.validate_python(m))
        except ValidationError as exc:
            errors = exc.errors()
            first = _best_error(errors)
            loc = ".".join(str(x) for x in first["loc"])
            problems.append(
                f"sdk: messages[{i}] does not validate ({len(errors)} errors, first at "
                f"{loc}: {first['msg']})"
            )
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
    from normandy_core.transcripts.anthropic import to_anthropic
    from normandy_core.transcripts.chat import to_openai

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


def validate(
    fmt: str, data: Any, *, allow_open_round: bool = True, thinking: bool = False
) -> list[str]:
    """Problems of ``data`` under the validator of ``fmt`` (openai, anthropic, responses or
    normandy); ``thinking`` as :func:`validate_openai` takes it."""
    if fmt == "openai":
        return validate_openai(data, allow_open_round=allow_open_round, thinking=thinking)
    if fmt == "anthropic":
        return validate_anthropic(data, allow_open_round=allow_open_round)
    if fmt == "normandy":
        return validate_normandy(data, allow_open_round=allow_open_round)
    if fmt == "responses":
        return validate_responses(data, allow_open_round=allow_open_round)
    raise ValueError(f"unknown format {fmt!r}")
