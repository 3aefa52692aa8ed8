"""Loopback stand-ins for the Anthropic and OpenAI APIs, for the real SDK clients.

Each server runs ``http.server`` on 127.0.0.1 in a daemon thread, answers in the
provider's wire format, and checks every request the way the real API does, answering
400 with the API's own kind of error JSON. It is bounded: it stops itself after
``max_requests`` requests or ``lifetime`` seconds, and on leaving its ``with`` block.

Provider compaction, as the providers document it:

* Anthropic (``/v1/messages``, with the ``anthropic-beta`` header): ``context_management``
  edits ``clear_tool_uses_20250919`` and ``clear_thinking_20251015`` (beta
  ``context-management-2025-06-27``) clear what the model reads and are reported in
  ``context_management.applied_edits``; ``compact_20260112`` (beta
  ``compact-2026-01-12``, trigger at least 50,000) opens the reply with a ``compaction``
  block above its trigger (with ``pause_after_compaction``: only that block,
  ``stop_reason`` ``"compaction"``), its cost in ``usage.iterations``; on-demand
  compaction (``"compaction": {"type": "summarize"}``, beta ``compact-2026-09-04``, not
  with ``context_management``) answers one compaction block with ``stop_reason``
  ``"compaction"``. Everything before the newest compaction block is ignored, and a
  compaction block sent back must be one this server made, byte for byte.
* OpenAI Responses (``/v1/responses``, stateless ``store: false``): items in, items out;
  a ``reasoning`` item must be followed by the item it produced; ``context_management``
  ``[{"type": "compaction", "compact_threshold": N}]`` puts a ``compaction`` item (with
  ``encrypted_content``) first in the output above the threshold;
  ``/v1/responses/compact`` answers ``object: "response.compaction"`` whose output is the
  user messages followed by one compaction item, with ``usage``. A compaction item sent
  back must be one this server made.

Too long: with ``window`` (input tokens, counted as :func:`count_tokens` counts) a
request over it is refused as the provider refuses it (:func:`too_long`): Anthropic 400
``invalid_request_error`` ``prompt is too long: N tokens > M maximum``, Chat Completions
400 ``context_length_exceeded`` with both numbers, the Responses API 400
``context_length_exceeded`` without them; with ``max_bytes`` Anthropic answers a larger
body 413 ``request_too_large``. ``overflows`` scripts refusals: each model request pops
the next flag, and ``True`` refuses it as too long whatever its size (the limit then
the smaller of ``window`` and 90 % of its size).

``compaction`` chooses how the server answers a compaction request: ``"ok"``,
``"refuse"`` (400) or ``"overloaded"`` (529 / 503); models named in ``no_compaction``
are refused as not supporting it.

For a proxy in front of them: a request with ``"stream": true`` (Chat Completions,
Messages) is answered with the server-sent events the API streams for the same reply
(:func:`sse_events`); ``answers`` scripts whole answers (status, body, extra headers),
each popped by the next model request before anything is checked; a body that is not
JSON is answered 400 (:func:`not_json`); ``event_pause`` seconds pass between two
events; ``GET`` answers an empty list naming its path;
``raw_bodies`` keeps every body's bytes as received.
Loaded by path from tests/clients/conftest.py (not a test module).
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import itertools
import json
import math
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SECRET = b"loopback-thinking-key"
THINKING = ("thinking", "redacted_thinking")


def sign(thinking: str) -> str:
    """The signature the fake Anthropic API gives a thinking block (and checks on replay)."""
    return hmac.new(SECRET, thinking.encode(), hashlib.sha256).hexdigest()


class Refusal(Exception):
    """A request the API refuses: ``where`` is the field path, ``message`` the API text."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


# -- Anthropic Messages API -----------------------------------------------------------


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content)


_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _check_anthropic_tools(tools: Any) -> None:
    for i, tool in enumerate(tools or []):
        if not _TOOL_NAME.match(str(tool.get("name", ""))):
            raise Refusal(
                f"tools.{i}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
            )
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise Refusal(f"tools.{i}.custom.input_schema: Field required")
        if schema.get("type") != "object":
            raise Refusal(f"tools.{i}.custom.input_schema.type: Input should be 'object'")
        extra = set(tool) - {"name", "description", "input_schema", "cache_control", "type"}
        if extra:
            raise Refusal(f"tools.{i}.custom.{sorted(extra)[0]}: Extra inputs are not permitted")


def check_anthropic(body: dict[str, Any]) -> None:
    """Raise :class:`Refusal` for what the Messages API would refuse in ``body``."""
    for key in ("model", "max_tokens", "messages"):
        if key not in body:
            raise Refusal(f"{key}: Field required")
    _check_anthropic_tools(body.get("tools"))
    msgs = body["messages"]
    thinking = body.get("thinking") or {"type": "disabled"}
    enabled = thinking.get("type") == "enabled"
    if enabled:
        budget = thinking.get("budget_tokens", 0)
        if budget < 1024:
            raise Refusal(
                "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
            )
        if body["max_tokens"] <= budget:
            raise Refusal("`max_tokens` must be greater than `thinking.budget_tokens`.")
        if (body.get("tool_choice") or {}).get("type") in ("any", "tool"):
            raise Refusal("Thinking may not be enabled when tool_choice forces tool use.")
    if not msgs:
        raise Refusal("messages: at least one message is required")
    opens_with_compaction = _blocks(msgs[0].get("content"))[:1] and (
        _blocks(msgs[0]["content"])[0].get("type") == "compaction"
    )
    if msgs[0].get("role") != "user" and not opens_with_compaction:
        raise Refusal('messages: first message must use the "user" role')
    uses_tools = False
    for i, m in enumerate(msgs):
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise Refusal(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        blocks = _blocks(m.get("content"))
        if not blocks:
            raise Refusal(f"messages.{i}: all messages must have non-empty content")
        for j, b in enumerate(blocks):
            if b.get("type") == "text" and not b.get("text"):
                raise Refusal(
                    f"messages.{i}.content.{j}.text: text content blocks must be non-empty"
                )
            if b.get("type") in ("tool_use", "tool_result"):
                uses_tools = True
            if b.get("type") == "thinking" and b.get("signature") != sign(b.get("thinking", "")):
                raise Refusal(f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block")
            if role == "user" and b.get("type") in (*THINKING, "tool_use", "compaction"):
                raise Refusal(f"messages.{i}.content.{j}.type: not allowed in a user message")
        prev_uses = set()
        if i and msgs[i - 1].get("role") == "assistant":
            prev_uses = {
                b["id"] for b in _blocks(msgs[i - 1]["content"]) if b["type"] == "tool_use"
            }
        for j, b in enumerate(blocks):
            if b.get("type") == "tool_result" and b.get("tool_use_id") not in prev_uses:
                raise Refusal(
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` "
                    f"blocks: {b.get('tool_use_id')}. Each `tool_result` block must have a "
                    "corresponding `tool_use` block in the previous message."
                )
        if role == "assistant":
            ids = [b["id"] for b in blocks if b.get("type") == "tool_use"]
            nxt = _blocks(msgs[i + 1]["content"]) if i + 1 < len(msgs) else []
            answered = {b.get("tool_use_id") for b in nxt if b.get("type") == "tool_result"}
            missing = [x for x in ids if x not in answered]
            if missing:
                raise Refusal(
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have "
                    "a corresponding `tool_result` block in the next message."
                )
            kinds = [b.get("type") for b in blocks if b.get("type") != "compaction"]
            if any(k in THINKING for k in kinds) and kinds[0] not in THINKING:
                raise Refusal(
                    f"messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, "
                    f"but found `{kinds[0]}`. An `assistant` message that holds thinking blocks "
                    "must start with one."
                )
    if uses_tools and not body.get("tools"):
        raise Refusal(
            "Requests which include `tool_use` or `tool_result` blocks must define tools."
        )
    last_assistant = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
    if last_assistant is None:
        return
    kinds = [
        b.get("type")
        for b in _blocks(msgs[last_assistant]["content"])
        if b.get("type") != "compaction"
    ] or ["compaction"]
    open_round = (
        last_assistant == len(msgs) - 2
        and "tool_use" in kinds
        and any(b.get("type") == "tool_result" for b in _blocks(msgs[-1]["content"]))
    )
    if enabled and open_round and kinds[0] not in THINKING:
        raise Refusal(
            f"messages.{last_assistant}.content.0.type: Expected `thinking` or "
            f"`redacted_thinking`, but found `{kinds[0]}`. When `thinking` is enabled, a final "
            "`assistant` message must start with a thinking block (preceeding the lastmost set "
            "of `tool_use` and `tool_result` blocks). We recommend you include thinking blocks "
            "from previous turns. To avoid this requirement, disable `thinking`."
        )
    if not enabled and any(k in THINKING for k in kinds):
        raise Refusal(
            f"messages.{last_assistant}.content: When `thinking` is disabled, an `assistant` "
            "message in the final position cannot contain `thinking`. To use thinking blocks, "
            "enable `thinking` in your request."
        )


def anthropic_error(refusal: Refusal) -> dict[str, Any]:
    """The API's error body."""
    return {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": refusal.message},
        "request_id": "req_loopback",
    }


def count_tokens(body: dict[str, Any]) -> int:
    """The input tokens the fake provider reports: a bit more than three characters each."""
    text = json.dumps(
        [body.get("system"), body.get("messages"), body.get("tools")], ensure_ascii=False
    )
    return math.ceil(len(text) / 3.2)


def anthropic_reply(body: dict[str, Any], action: dict[str, Any], n: int) -> dict[str, Any]:
    """A Messages API response for ``action`` (``{"tools": [(name, input)]}`` or ``{"text"}``)."""
    content: list[dict[str, Any]] = []
    if (body.get("thinking") or {}).get("type") == "enabled":
        thought = f"Step {n}: deciding what to do next."
        content.append({"type": "thinking", "thinking": thought, "signature": sign(thought)})
    tools_ok = (body.get("tool_choice") or {}).get("type") != "none"
    if action.get("text"):
        content.append({"type": "text", "text": action["text"], "citations": None})
    calls = action.get("tools") or []
    if calls and tools_ok:
        for k, (name, args) in enumerate(calls):
            content.append(
                {"type": "tool_use", "id": f"toolu_{n:03d}_{k}", "name": name, "input": args}
            )
    elif not action.get("text"):
        content.append({"type": "text", "text": "Final answer without tools."})
    return {
        "id": f"msg_{n:04d}",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": content,
        "stop_reason": "tool_use" if calls and tools_ok else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": count_tokens(body) - 100,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 100,
            "output_tokens": 25,
        },
    }


# -- Anthropic provider compaction ----------------------------------------------------

CONTEXT_MANAGEMENT_BETA = "context-management-2025-06-27"
COMPACT_BETA = "compact-2026-01-12"
ON_DEMAND_BETA = "compact-2026-09-04"
COMPACT_MIN_TRIGGER = 50_000
_EDIT_BETAS = {
    "clear_tool_uses_20250919": CONTEXT_MANAGEMENT_BETA,
    "clear_thinking_20251015": CONTEXT_MANAGEMENT_BETA,
    "compact_20260112": COMPACT_BETA,
}


def _trigger(edit: dict[str, Any], default: int) -> tuple[str, int]:
    trig = edit.get("trigger") or {"type": "input_tokens", "value": default}
    return str(trig.get("type")), int(trig.get("value") or 0)


def check_context_management(body: dict[str, Any], betas: set[str]) -> None:
    """Refuse edits the API would refuse: unknown, without their beta, out of order,
    a compaction trigger under 50,000, or combined with on-demand compaction."""
    cm = body.get("context_management")
    if cm is None:
        return
    if "compaction" in body:
        raise Refusal(
            "context_management cannot be used together with `compaction` (on-demand "
            "compaction) in one request"
        )
    edits = cm.get("edits")
    if not isinstance(edits, list) or not edits:
        raise Refusal("context_management.edits: Field required")
    for k, edit in enumerate(edits):
        kind = edit.get("type")
        if kind not in _EDIT_BETAS:
            raise Refusal(f"context_management.edits.{k}.type: unknown edit {kind!r}")
        if _EDIT_BETAS[kind] not in betas:
            raise Refusal(
                f"context_management.edits.{k}: {kind} requires the beta header "
                f"'anthropic-beta: {_EDIT_BETAS[kind]}'"
            )
        if kind == "clear_thinking_20251015" and k != 0:
            raise Refusal(
                "context_management.edits: clear_thinking_20251015 must be the first edit"
            )
        if kind == "compact_20260112":
            ttype, value = _trigger(edit, 150_000)
            if ttype != "input_tokens" or value < COMPACT_MIN_TRIGGER:
                raise Refusal(
                    f"context_management.edits.{k}.trigger.value: Input should be greater "
                    f"than or equal to {COMPACT_MIN_TRIGGER}"
                )


def _tokens_of(value: Any) -> int:
    return math.ceil(len(json.dumps(value, ensure_ascii=False)) / 3.2)


def apply_edits(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Apply the clearing edits to ``body["messages"]`` in place (what the model reads);
    the ``applied_edits`` the response reports (only edits that cleared something)."""
    applied: list[dict[str, Any]] = []
    msgs = body["messages"]
    for edit in (body.get("context_management") or {}).get("edits") or []:
        kind = edit["type"]
        if kind == "clear_thinking_20251015":
            keep = edit.get("keep") or {"type": "thinking_turns", "value": 1}
            turns = [
                m
                for m in msgs
                if m["role"] == "assistant"
                and any(b.get("type") in THINKING for b in _blocks(m["content"]))
            ]
            n = 0 if keep == "all" else max(0, len(turns) - int(keep["value"]))
            cleared = 0
            for m in turns[:n]:
                gone = [b for b in _blocks(m["content"]) if b.get("type") in THINKING]
                cleared += _tokens_of(gone)
                m["content"] = [b for b in _blocks(m["content"]) if b.get("type") not in THINKING]
            if n:
                applied.append(
                    {
                        "type": kind,
                        "cleared_thinking_turns": n,
                        "cleared_input_tokens": cleared,
                    }
                )
        elif kind == "clear_tool_uses_20250919":
            ttype, value = _trigger(edit, 100_000)
            uses = [b for m in msgs for b in _blocks(m["content"]) if b.get("type") == "tool_use"]
            over = len(uses) > value if ttype == "tool_uses" else count_tokens(body) > value
            if not over:
                continue
            keep = int((edit.get("keep") or {}).get("value", 3))
            exclude = set(edit.get("exclude_tools") or [])
            inputs = edit.get("clear_tool_inputs") or False
            names = {b["id"]: b.get("name") for b in uses}
            candidates = [b["id"] for b in uses[: max(0, len(uses) - keep)]]
            candidates = [c for c in candidates if names[c] not in exclude]
            cleared_ids: set[str] = set()
            tokens = 0
            for m in msgs:
                for b in _blocks(m["content"]):
                    if b.get("type") == "tool_result" and b.get("tool_use_id") in candidates:
                        tokens += _tokens_of(b.get("content"))
                        b["content"] = "[cleared]"
                        cleared_ids.add(b["tool_use_id"])
                    elif (
                        b.get("type") == "tool_use"
                        and b["id"] in candidates
                        and (inputs is True or (isinstance(inputs, list) and b["name"] in inputs))
                    ):
                        tokens += _tokens_of(b.get("input"))
                        b["input"] = {}
            least = int((edit.get("clear_at_least") or {}).get("value", 0))
            if cleared_ids and tokens >= least:
                applied.append(
                    {
                        "type": kind,
                        "cleared_tool_uses": len(cleared_ids),
                        "cleared_input_tokens": tokens,
                    }
                )
    return applied


def compaction_block(body: dict[str, Any], n: int) -> dict[str, Any]:
    """The compaction block the fake API writes: a summary naming what it read."""
    instr = (body.get("compaction") or {}).get("instructions") or next(
        (
            e.get("instructions")
            for e in (body.get("context_management") or {}).get("edits") or []
            if e.get("type") == "compact_20260112"
        ),
        None,
    )
    texts = [
        b.get("text", "")
        for m in body["messages"]
        for b in _blocks(m["content"])
        if b.get("type") == "text"
    ]
    summary = f"<summary n={n}>Summary of {len(body['messages'])} messages"
    if instr:
        summary += f" (following: {instr[:40]})"
    summary += ": " + " | ".join(t[:30] for t in texts[:4]) + "</summary>"
    return {"type": "compaction", "content": summary}


def from_newest_compaction(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the API reads of ``msgs``: from the newest compaction block on."""
    for i in range(len(msgs) - 1, -1, -1):
        blocks = _blocks(msgs[i]["content"])
        for j in range(len(blocks) - 1, -1, -1):
            if blocks[j].get("type") == "compaction":
                return [{**msgs[i], "content": blocks[j:]}, *msgs[i + 1 :]]
    return msgs


# -- OpenAI Chat Completions API ------------------------------------------------------

_PART_TYPES = ("text", "image_url", "input_audio", "refusal", "audio", "file")


def _check_openai_tools(tools: Any) -> None:
    for i, tool in enumerate(tools or []):
        if tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise Refusal(f"Missing required parameter: 'tools[{i}].function'.", f"tools[{i}]")
        fn = tool["function"]
        if not _TOOL_NAME.match(str(fn.get("name", ""))):
            raise Refusal(
                f"Invalid 'tools[{i}].function.name': string does not match pattern. Expected "
                "a string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
                f"tools[{i}].function.name",
            )
        params = fn.get("parameters")
        if params is not None and (not isinstance(params, dict) or params.get("type") != "object"):
            raise Refusal(
                f"Invalid schema for function '{fn['name']}': schema must be a JSON Schema of "
                "'type: \"object\"'.",
                f"tools[{i}].function.parameters",
            )


def check_openai(body: dict[str, Any]) -> None:
    """Raise :class:`Refusal` for what Chat Completions would refuse in ``body``."""
    msgs = body.get("messages")
    if not msgs:
        raise Refusal("Invalid 'messages': empty array.", "messages")
    _check_openai_tools(body.get("tools"))
    open_calls: list[str] | None = None
    for i, m in enumerate(msgs):
        role = m.get("role")
        content = m.get("content")
        if isinstance(content, list):
            for j, p in enumerate(content):
                if p.get("type") not in _PART_TYPES:
                    raise Refusal(
                        f"Invalid value: '{p.get('type')}'. Supported values are: 'text', "
                        "'image_url', 'input_audio', 'refusal', 'audio', and 'file'.",
                        f"messages.[{i}].content.[{j}].type",
                    )
        if role == "tool":
            if open_calls is None or m.get("tool_call_id") not in open_calls:
                raise Refusal(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"messages.[{i}].role",
                )
            open_calls.remove(m["tool_call_id"])
            continue
        if open_calls:
            raise Refusal(
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(open_calls)}",
                f"messages.[{i}].role",
            )
        open_calls = None
        if role == "assistant":
            calls = m.get("tool_calls") or []
            for k, c in enumerate(calls):
                try:
                    json.loads(c["function"]["arguments"])
                except (KeyError, ValueError):
                    raise Refusal(
                        "Invalid 'arguments': not valid JSON.",
                        f"messages.[{i}].tool_calls.[{k}].function.arguments",
                    ) from None
            if content is None and not calls:
                raise Refusal(
                    "Invalid value for 'content': expected a string, got null.",
                    f"messages.[{i}].content",
                )
            open_calls = [c["id"] for c in calls] or None
        elif role not in ("system", "developer", "user"):
            raise Refusal(f"Invalid value: '{role}'.", f"messages.[{i}].role")
    if open_calls:
        raise Refusal(
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            f"response messages: {', '.join(open_calls)}",
            f"messages.[{len(msgs) - 1}].role",
        )


def openai_error(refusal: Refusal) -> dict[str, Any]:
    """The API's error body."""
    return {
        "error": {
            "message": refusal.message,
            "type": "invalid_request_error",
            "param": refusal.param,
            "code": None,
        }
    }


def openai_reply(body: dict[str, Any], action: dict[str, Any], n: int) -> dict[str, Any]:
    """A Chat Completions response for ``action``."""
    calls = action.get("tools") or []
    if body.get("tool_choice") == "none":
        calls = []
    text = action.get("text") or (None if calls else "Final answer without tools.")
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call_{n:03d}_{k}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for k, (name, args) in enumerate(calls)
        ]
    prompt = count_tokens(body)
    return {
        "id": f"chatcmpl-{n:04d}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": body["model"],
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 25, "total_tokens": prompt + 25},
    }


# -- OpenAI Responses API -------------------------------------------------------------

_INPUT_PARTS = ("input_text", "input_image", "input_file", "input_audio", "output_text", "refusal")


def responses_tokens(body: dict[str, Any]) -> int:
    """The input tokens of a Responses request, counted as for the other APIs."""
    return math.ceil(
        len(json.dumps([body.get("instructions"), body.get("input"), body.get("tools")])) / 3.2
    )


def check_responses(body: dict[str, Any], issued: set[str]) -> None:
    """Raise :class:`Refusal` for what ``POST /v1/responses`` (or ``/compact``) refuses."""
    if not body.get("model"):
        raise Refusal("Missing required parameter: 'model'.", "model")
    items = body.get("input")
    if isinstance(items, str):
        return
    if not isinstance(items, list) or not items:
        raise Refusal("Invalid 'input': empty array.", "input")
    for i, tool in enumerate(body.get("tools") or []):
        if tool.get("type") != "function" or not _TOOL_NAME.match(str(tool.get("name", ""))):
            raise Refusal(f"Invalid 'tools[{i}]': a function tool needs a valid name.", "tools")
        if (tool.get("parameters") or {}).get("type") != "object":
            raise Refusal(f"Invalid schema for function '{tool.get('name')}'.", "tools")
    calls: dict[str, bool] = {}
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise Refusal(f"Invalid value: '{role}'.", f"input[{i}].role")
            content = item.get("content")
            if isinstance(content, list):
                for j, part in enumerate(content):
                    if part.get("type") not in _INPUT_PARTS:
                        raise Refusal(
                            f"Invalid value: '{part.get('type')}'.",
                            f"input[{i}].content[{j}].type",
                        )
            elif not isinstance(content, str):
                raise Refusal("Invalid type for 'content'.", f"input[{i}].content")
        elif kind == "function_call":
            try:
                json.loads(item["arguments"])
            except (KeyError, ValueError):
                raise Refusal("Invalid 'arguments': not valid JSON.", f"input[{i}]") from None
            calls[item["call_id"]] = False
        elif kind == "function_call_output":
            if item.get("call_id") not in calls:
                raise Refusal(
                    f"No tool call found for function call output with call_id "
                    f"{item.get('call_id')}.",
                    f"input[{i}]",
                )
            calls[item["call_id"]] = True
        elif kind == "reasoning":
            nxt = items[i + 1] if i + 1 < len(items) else {}
            if nxt.get("type", "message") not in ("function_call", "message") or (
                nxt.get("type", "message") == "message" and nxt.get("role") != "assistant"
            ):
                raise Refusal(
                    f"Item '{item.get('id')}' of type 'reasoning' was provided without its "
                    "required following item.",
                    "input",
                )
        elif kind == "compaction":
            if json.dumps(item, sort_keys=True) not in issued:
                raise Refusal(
                    "Invalid 'encrypted_content': the compaction item could not be decrypted "
                    "or was altered.",
                    f"input[{i}].encrypted_content",
                )
        else:
            raise Refusal(f"Invalid value: '{kind}'.", f"input[{i}].type")
    missing = [c for c, answered in calls.items() if not answered]
    last = items[-1].get("type", "message")
    if missing and last != "function_call":
        raise Refusal(f"No tool output found for function call {missing[0]}.", "input")


def _user_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The user messages of ``items``, as ``/responses/compact`` returns them."""
    out = []
    for item in items:
        if item.get("type", "message") == "message" and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                content = [{"type": "input_text", "text": content}]
            out.append({"type": "message", "role": "user", "content": content})
    return out


def compaction_item(body: dict[str, Any], n: int) -> dict[str, Any]:
    """An opaque compaction item (its content means something to this server only)."""
    digest = hashlib.sha256(json.dumps(body.get("input"), sort_keys=True).encode()).hexdigest()
    return {"type": "compaction", "id": f"cmp_{n:04d}", "encrypted_content": f"gAAAA{digest}"}


def responses_reply(
    body: dict[str, Any], action: dict[str, Any], n: int, compaction: dict[str, Any] | None
) -> dict[str, Any]:
    """A Responses API response for ``action``; ``compaction`` (an item) goes first."""
    output: list[dict[str, Any]] = [compaction] if compaction else []
    if body.get("reasoning"):
        item: dict[str, Any] = {"type": "reasoning", "id": f"rs_{n:04d}", "summary": []}
        if "reasoning.encrypted_content" in (body.get("include") or []):
            item["encrypted_content"] = f"enc-reasoning-{n}"
        output.append(item)
    calls = action.get("tools") or []
    if body.get("tool_choice") == "none":
        calls = []
    text = action.get("text") or (None if calls else "Final answer without tools.")
    if text:
        output.append(
            {
                "type": "message",
                "id": f"msg_{n:04d}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for k, (name, args) in enumerate(calls):
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{n:04d}_{k}",
                "call_id": f"call_{n:03d}_{k}",
                "name": name,
                "arguments": json.dumps(args),
                "status": "completed",
            }
        )
    prompt = responses_tokens(body)
    return {
        "id": f"resp_{n:04d}",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "completed",
        "model": body["model"],
        "output": output,
        "usage": {"input_tokens": prompt, "output_tokens": 25, "total_tokens": prompt + 25},
    }


# -- too long -----------------------------------------------------------------------


def too_long(api: str, size: int, limit: int) -> tuple[int, dict[str, Any]]:
    """The status and body each API refuses a request of ``size`` input tokens with,
    over its ``limit``: ``api`` is ``"anthropic"``, ``"chat"`` or ``"responses"``."""
    if api == "anthropic":
        return 400, {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": f"prompt is too long: {size} tokens > {limit} maximum",
            },
            "request_id": "req_loopback",
        }
    if api == "chat":
        message = (
            f"This model's maximum context length is {limit} tokens. However, your messages "
            f"resulted in {size} tokens. Please reduce the length of the messages."
        )
        param = "messages"
    else:
        message = (
            "Your input exceeds the context window of this model. Please adjust your input "
            "and try again."
        )
        param = "input"
    return 400, {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": "context_length_exceeded",
        }
    }


#: Anthropic's answer to a request body over its byte limit.
REQUEST_TOO_LARGE = {
    "type": "error",
    "error": {"type": "request_too_large", "message": "Request exceeds the maximum size"},
}


def not_json(kind: str) -> dict[str, Any]:
    """Each API's answer to a body that is not JSON."""
    message = "There was an error parsing the body of your request: it is not valid JSON."
    if kind == "anthropic":
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    return {"error": {"message": message, "type": "invalid_request_error", "code": None}}


# -- streaming ------------------------------------------------------------------------


def _event(data: Any, name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def _chat_events(reply: dict[str, Any]) -> list[bytes]:
    """A Chat Completions reply as the stream of chunks the API sends for it."""
    choice = reply["choices"][0]
    delta: dict[str, Any] = {"role": "assistant", "content": choice["message"]["content"]}
    if choice["message"].get("tool_calls"):
        delta["tool_calls"] = [
            {"index": k, **call} for k, call in enumerate(choice["message"]["tool_calls"])
        ]
    head = {k: reply[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    first = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    last = {
        **head,
        "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
    }
    return [_event(first), _event(last), b"data: [DONE]\n\n"]


def _block_events(index: int, block: dict[str, Any]) -> list[bytes]:
    """One content block of a Messages reply as its start, delta and stop events."""
    kind = block["type"]
    if kind == "text":
        start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
    elif kind == "tool_use":
        start = {**block, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    else:
        start = {**block, "thinking": "", "signature": ""}
        delta = {"type": "thinking_delta", "thinking": block["thinking"]}
    events = [
        _event(
            {"type": "content_block_start", "index": index, "content_block": start},
            "content_block_start",
        ),
        _event(
            {"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta"
        ),
    ]
    if kind == "thinking":
        signature = {"type": "signature_delta", "signature": block["signature"]}
        events.append(
            _event(
                {"type": "content_block_delta", "index": index, "delta": signature},
                "content_block_delta",
            )
        )
    events.append(_event({"type": "content_block_stop", "index": index}, "content_block_stop"))
    return events


def _anthropic_events(reply: dict[str, Any]) -> list[bytes]:
    """A Messages reply as the stream of events the API sends for it."""
    usage = reply["usage"]
    opening = {**reply, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events = [_event({"type": "message_start", "message": opening}, "message_start")]
    for index, block in enumerate(reply["content"]):
        events += _block_events(index, block)
    closing = {
        "type": "message_delta",
        "delta": {"stop_reason": reply["stop_reason"], "stop_sequence": None},
        "usage": {"output_tokens": usage["output_tokens"]},
    }
    events.append(_event(closing, "message_delta"))
    events.append(_event({"type": "message_stop"}, "message_stop"))
    return events


def sse_events(kind: str, reply: dict[str, Any]) -> list[bytes]:
    """The server-sent events that stream ``reply`` (Chat Completions or Messages)."""
    return _anthropic_events(reply) if kind == "anthropic" else _chat_events(reply)


# -- the server -----------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    # http.server's backlog of 5 resets connections when dozens of clients connect at
    # once (the proxy's load benchmark runs 64 agents).
    request_queue_size = 128


class FakeProvider:
    """A loopback provider: ``kind`` is ``"anthropic"`` or ``"openai"``.

    ``script`` is the list of actions the fake model takes, one per accepted request.
    ``requests`` holds every body received (``paths`` and ``headers`` beside it, header
    names in lower case), ``refusals`` every 400 sent (with the body). ``compaction`` is
    how compaction requests are answered (``"ok"``, ``"refuse"``, ``"overloaded"``);
    ``no_compaction`` names models that do not support it. ``issued`` holds every
    compaction block or item made (as canonical JSON), which alone are accepted back.
    """

    def __init__(
        self,
        kind: str,
        script: list[dict[str, Any]] | None = None,
        *,
        max_requests: int = 100,
        lifetime: float = 60.0,
        compaction: str = "ok",
        no_compaction: tuple[str, ...] = (),
        window: int | None = None,
        max_bytes: int | None = None,
        overflows: list[bool] | None = None,
        answers: list[tuple[int, dict[str, Any], dict[str, str]]] | None = None,
        event_pause: float = 0.0,
    ) -> None:
        self.kind = kind
        self.event_pause = event_pause
        self.window = window
        self.max_bytes = max_bytes
        self.overflows = list(overflows or [])
        self.script = list(script or [])
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.refusals: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.raw_bodies: list[bytes] = []
        self.answers = list(answers or [])
        self.max_requests = max_requests
        self.lifetime = lifetime
        self.compaction = compaction
        self.no_compaction = set(no_compaction)
        self.issued: set[str] = set()
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                status, answer, extra = provider.answer(self.path, dict(self.headers), raw)
                if status == 200 and isinstance(answer, dict) and provider.streams(raw):
                    self._send_events(sse_events(provider.kind, answer), extra)
                    return
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                provider.answer(self.path, dict(self.headers), b"")
                data = json.dumps({"object": "list", "data": [], "path": self.path}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _send_events(self, events: list[bytes], extra: dict[str, str]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("connection", "close")
                self.end_headers()
                for k, event in enumerate(events):  # one write each, as a provider streams
                    if k:
                        time.sleep(provider.event_pause)
                    self.wfile.write(event)
                    self.wfile.flush()
                self.close_connection = True

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._timer = threading.Timer(lifetime, self.stop)
        self._timer.daemon = True

    @property
    def base_url(self) -> str:
        """The URL to give the SDK as ``base_url``."""
        host, port = self.server.server_address[:2]
        root = f"http://{host}:{port}"
        return root + "/v1" if self.kind == "openai" else root

    def streams(self, raw: bytes) -> bool:
        """Whether the request ``raw`` asked for a stream of server-sent events."""
        body = json.loads(raw)
        return isinstance(body, dict) and body.get("stream") is True

    def answer(
        self, path: str, headers: dict[str, str], raw: bytes
    ) -> tuple[int, Any, dict[str, str]]:
        """The status, body and extra headers of the answer to one request's ``raw`` body:
        the next of ``answers`` when any is left (recorded as every request is), a 400 for
        a body that is not JSON, else :meth:`handle`'s."""
        self.raw_bodies.append(raw)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            with self._lock:
                self.paths.append(path.partition("?")[0])
                self.headers.append({k.lower(): v for k, v in headers.items()})
            return 400, not_json(self.kind), {}
        if self.answers:
            with self._lock:
                self.requests.append(body)
                self.paths.append(path.partition("?")[0])
                self.headers.append({k.lower(): v for k, v in headers.items()})
                return self.answers.pop(0)
        status, answer = self.handle(path, headers, body)
        return status, answer, {"x-request-id": f"req_loopback_{len(self.raw_bodies)}"}

    def handle(
        self, path: str, headers: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        """Check one request; answer it or refuse it."""
        lower = {k.lower(): v for k, v in headers.items()}
        route = path.partition("?")[0]
        with self._lock:
            self.requests.append(body)
            self.paths.append(route)
            self.headers.append(lower)
            if len(self.requests) > self.max_requests:
                threading.Thread(target=self.stop, daemon=True).start()
                return 500, {"error": {"message": "loopback server: request limit reached"}}
            if self.kind == "anthropic":
                if route != "/v1/messages":
                    return 404, {
                        "type": "error",
                        "error": {"type": "not_found_error", "message": path},
                    }
                if not lower.get("x-api-key") and not lower.get("authorization"):
                    return 401, {
                        "type": "error",
                        "error": {"type": "authentication_error", "message": "missing API key"},
                    }
                betas = {b.strip() for b in lower.get("anthropic-beta", "").split(",") if b}
                return self._anthropic(body, betas)
            if route == "/v1/responses":
                return self._responses(body)
            if route == "/v1/responses/compact":
                return self._compact(body)
            if route != "/v1/chat/completions":
                return 404, {"error": {"message": f"Unknown path {path}"}}
            try:
                check_openai(body)
            except Refusal as refusal:
                return self._refuse(body, refusal, openai_error)
            refused = self._too_long("chat", body, count_tokens(body))
            if refused is not None:
                return refused
            n = next(self._counter)
            return 200, openai_reply(body, self._action(), n)

    def _too_long(
        self, api: str, body: dict[str, Any], tokens: int
    ) -> tuple[int, dict[str, Any]] | None:
        """The refusal of a model request as too long (``window``, ``max_bytes``, the next
        of ``overflows``), recorded in ``refusals``; else ``None``."""
        forced = self.overflows.pop(0) if self.overflows else False
        too_large = self.max_bytes is not None and len(json.dumps(body).encode()) > self.max_bytes
        if api == "anthropic" and too_large:
            self.refusals.append((body, REQUEST_TOO_LARGE))
            return 413, REQUEST_TOO_LARGE
        if forced:
            limit = int(tokens * 0.9)
            limit = limit if self.window is None else min(self.window, limit)
        elif self.window is not None and tokens > self.window:
            limit = self.window
        else:
            return None
        status, answer = too_long(api, tokens, limit)
        self.refusals.append((body, answer))
        return status, answer

    def _action(self) -> dict[str, Any]:
        return self.script.pop(0) if self.script else {"text": "Nothing left to do."}

    def _refuse(
        self, body: dict[str, Any], refusal: Refusal, error: Any
    ) -> tuple[int, dict[str, Any]]:
        answer = error(refusal)
        self.refusals.append((body, answer))
        return 400, answer

    def _issue(self, item: dict[str, Any]) -> dict[str, Any]:
        self.issued.add(json.dumps(item, sort_keys=True))
        return item

    def _cannot(self, model: str, error: Any) -> tuple[int, dict[str, Any]] | None:
        """The answer to a compaction this server will not make, else ``None``."""
        if model in self.no_compaction:
            return 400, error(Refusal(f"The model {model!r} does not support compaction."))
        if self.compaction == "refuse":
            return 400, error(Refusal("Compaction was refused: the conversation was flagged."))
        if self.compaction == "overloaded":
            if self.kind == "anthropic":
                return 529, {
                    "type": "error",
                    "error": {"type": "overloaded_error", "message": "Overloaded"},
                }
            return 503, {"error": {"message": "The server is overloaded.", "type": "server_error"}}
        return None

    # -- Anthropic -------------------------------------------------------------------

    def _anthropic(self, body: dict[str, Any], betas: set[str]) -> tuple[int, dict[str, Any]]:
        on_demand = "compaction" in body
        try:
            check_context_management(body, betas)
            msgs = body.get("messages") or []
            for i, m in enumerate(msgs):
                for j, b in enumerate(_blocks(m.get("content"))):
                    if b.get("type") != "compaction":
                        continue
                    if not betas & {COMPACT_BETA, ON_DEMAND_BETA}:
                        raise Refusal(
                            f"messages.{i}.content.{j}: compaction blocks require the beta "
                            f"header 'anthropic-beta: {COMPACT_BETA}' or '{ON_DEMAND_BETA}'"
                        )
                    if json.dumps(b, sort_keys=True) not in self.issued:
                        raise Refusal(
                            f"messages.{i}.content.{j}: the compaction block was altered or "
                            "was not made by this API"
                        )
            if on_demand:
                if ON_DEMAND_BETA not in betas:
                    raise Refusal(
                        f"compaction: on-demand compaction requires the beta header "
                        f"'anthropic-beta: {ON_DEMAND_BETA}'"
                    )
                if (body["compaction"] or {}).get("type") != "summarize":
                    raise Refusal("compaction.type: Input should be 'summarize'")
                if "tool_choice" in body:
                    raise Refusal("tool_choice: not allowed with on-demand compaction")
            view = {**body, "messages": copy.deepcopy(from_newest_compaction(msgs))}
            check_anthropic(view)
        except Refusal as refusal:
            return self._refuse(body, refusal, anthropic_error)
        if not on_demand:
            refused = self._too_long("anthropic", body, count_tokens(view))
            if refused is not None:
                return refused
        edits = (body.get("context_management") or {}).get("edits") or []
        compact = next((e for e in edits if e["type"] == "compact_20260112"), None)
        if on_demand or (compact and count_tokens(view) > _trigger(compact, 150_000)[1]):
            cannot = self._cannot(body["model"], anthropic_error)
            if cannot is not None:
                return cannot
        n = next(self._counter)
        tokens = count_tokens(view)
        if on_demand:
            return 200, {
                "id": f"msg_{n:04d}",
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": [self._issue(compaction_block(view, n))],
                "stop_reason": "compaction",
                "stop_sequence": None,
                "usage": {"input_tokens": tokens, "output_tokens": 120},
            }
        applied = apply_edits(view)
        action = self._action()
        reply = anthropic_reply(view, action, n)
        if compact is not None and tokens > _trigger(compact, 150_000)[1]:
            block = self._issue(compaction_block(view, n))
            spent = {"type": "compaction", "input_tokens": tokens, "output_tokens": 120}
            if compact.get("pause_after_compaction"):
                self.script.insert(0, action)  # the model answers on the continuation
                reply["content"] = [block]
                reply["stop_reason"] = "compaction"
                reply["usage"]["iterations"] = [spent]
            else:
                reply["content"] = [block, *reply["content"]]
                message = {"type": "message", "input_tokens": 300, "output_tokens": 25}
                reply["usage"]["iterations"] = [spent, message]
        if applied:
            reply["context_management"] = {"applied_edits": applied}
        return 200, reply

    # -- OpenAI Responses --------------------------------------------------------------

    def _responses(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            check_responses(body, self.issued)
            cm = body.get("context_management")
            if cm is not None and (
                not isinstance(cm, list)
                or any(
                    e.get("type") != "compaction"
                    or not isinstance(e.get("compact_threshold"), int)
                    or e["compact_threshold"] <= 0
                    for e in cm
                )
            ):
                raise Refusal(
                    "Invalid 'context_management': expected [{'type': 'compaction', "
                    "'compact_threshold': N}].",
                    "context_management",
                )
        except Refusal as refusal:
            return self._refuse(body, refusal, openai_error)
        refused = self._too_long("responses", body, responses_tokens(body))
        if refused is not None:
            return refused
        threshold = min(
            (e["compact_threshold"] for e in body.get("context_management") or []), default=None
        )
        compaction = None
        if threshold is not None and responses_tokens(body) > threshold:
            cannot = self._cannot(body["model"], openai_error)
            if cannot is not None:
                return cannot
            compaction = self._issue(compaction_item(body, next(self._counter)))
        n = next(self._counter)
        return 200, responses_reply(body, self._action(), n, compaction)

    def _compact(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            check_responses(body, self.issued)
        except Refusal as refusal:
            return self._refuse(body, refusal, openai_error)
        cannot = self._cannot(body["model"], openai_error)
        if cannot is not None:
            return cannot
        n = next(self._counter)
        items = (
            body["input"]
            if isinstance(body["input"], list)
            else [{"role": "user", "content": body["input"]}]
        )
        prompt = responses_tokens(body)
        return 200, {
            "id": f"resp_cmp_{n:04d}",
            "object": "response.compaction",
            "created_at": 1_700_000_000,
            "output": [*_user_messages(items), self._issue(compaction_item(body, n))],
            "usage": {"input_tokens": prompt, "output_tokens": 150, "total_tokens": prompt + 150},
        }

    def start(self) -> FakeProvider:
        """Serve in a daemon thread; stops itself after ``lifetime`` seconds."""
        self._thread.start()
        self._timer.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        self._timer.cancel()
        if self._thread.is_alive():
            self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._thread.join(timeout=5)


class AsyncOnly:
    """A model client with ``acomplete`` only, as an async application writes one: it
    forwards to ``inner`` (a real client on a shared connection pool, in the tests)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def acomplete(self, *args: Any, **kwargs: Any) -> Any:
        return await self.inner.acomplete(*args, **kwargs)
