"""Loopback stand-ins for the Anthropic and OpenAI APIs, for the real SDK clients.

Each server runs ``http.server`` on 127.0.0.1 in a daemon thread, answers in the
provider's wire format, and checks every request the way the real API does, answering
400 with the API's own kind of error JSON. It is bounded: it stops itself after
``max_requests`` requests or ``lifetime`` seconds, and on leaving its ``with`` block.
Loaded by path from tests/clients/conftest.py (not a test module).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import math
import re
import threading
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
    if msgs[0].get("role") != "user":
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
            if role == "user" and b.get("type") in (*THINKING, "tool_use"):
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
            kinds = [b.get("type") for b in blocks]
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
    kinds = [b.get("type") for b in _blocks(msgs[last_assistant]["content"])]
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


# -- the server -----------------------------------------------------------------------


class FakeProvider:
    """A loopback provider: ``kind`` is ``"anthropic"`` or ``"openai"``.

    ``script`` is the list of actions the fake model takes, one per accepted request.
    ``requests`` holds every body received, ``refusals`` every 400 sent (with the body).
    """

    def __init__(
        self,
        kind: str,
        script: list[dict[str, Any]] | None = None,
        *,
        max_requests: int = 100,
        lifetime: float = 60.0,
    ) -> None:
        self.kind = kind
        self.script = list(script or [])
        self.requests: list[dict[str, Any]] = []
        self.refusals: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.max_requests = max_requests
        self.lifetime = lifetime
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                status, answer = provider.handle(self.path, dict(self.headers), body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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

    def handle(
        self, path: str, headers: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        """Check one request; answer it or refuse it."""
        with self._lock:
            self.requests.append(body)
            if len(self.requests) > self.max_requests:
                threading.Thread(target=self.stop, daemon=True).start()
                return 500, {"error": {"message": "loopback server: request limit reached"}}
            if self.kind == "anthropic":
                if path != "/v1/messages":
                    return 404, {
                        "type": "error",
                        "error": {"type": "not_found_error", "message": path},
                    }
                lower = {k.lower(): v for k, v in headers.items()}
                if not lower.get("x-api-key") and not lower.get("authorization"):
                    return 401, {
                        "type": "error",
                        "error": {"type": "authentication_error", "message": "missing API key"},
                    }
                check, reply, error = check_anthropic, anthropic_reply, anthropic_error
            else:
                if path != "/v1/chat/completions":
                    return 404, {"error": {"message": f"Unknown path {path}"}}
                check, reply, error = check_openai, openai_reply, openai_error
            try:
                check(body)
            except Refusal as refusal:
                answer = error(refusal)
                self.refusals.append((body, answer))
                return 400, answer
            n = next(self._counter)
            action = self.script.pop(0) if self.script else {"text": "Nothing left to do."}
            return 200, reply(body, action, n)

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
