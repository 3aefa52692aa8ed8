"""Seeded generators of realistic agent sessions in the four transcript formats.

A session is drawn once in a neutral shape (:class:`Session`) from a ``random.Random``
and rendered as an OpenAI Chat Completions list, an Anthropic Messages list or
``{system, messages}`` dict, an OpenAI Responses API input item list, or a Normandy
memory dump. Sessions have parallel tool batches, images and documents (in tool results
where the format can carry them), signed and redacted thinking (Anthropic, Normandy, and
Chat Completions as LangChain writes a Claude conversation: thinking parts leading an
assistant's content) and reasoning items (Responses), errors, unicode and NUL, now and
then a very long tool output (60-240k characters), pinned entries and a system prompt,
and end in one of four states: a finished reply, after a tool batch, an open round (an
assistant message whose tool calls have no results yet) or a user message.

Half the provider sessions are *decorated* with what real requests carry beside the
plain conversation: names and custom tool calls and refusals (Chat Completions);
``cache_control``, citations, server-tool and MCP pairs inside one assistant message,
``search_result`` and ``container_upload`` blocks, and block types of the future
(Anthropic); custom tool calls, refusals, ``computer_call``, ``shell_call``,
``apply_patch_call`` and MCP approval pairs, standalone server-side calls and items of
the future (Responses). Now and then an assistant turn carries a provider compaction
(Anthropic's ``compaction`` block, the Responses ``compaction`` item), sometimes two.

Most texts carry a unique tag (``#m17``), so the campaign's loss oracle can tell equal
texts apart. The average session is small, so a campaign runs many cases.
:func:`request_points` splits a rendered session into the batches an agent appends
between two model requests (the continuation campaign grows a list batch by batch).
"""

from __future__ import annotations

import base64
import itertools
import json
import random
import string
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "FORMATS",
    "PROVIDER_FORMATS",
    "Assistant",
    "Call",
    "Image",
    "Result",
    "Results",
    "Session",
    "Text",
    "User",
    "draw_session",
    "render",
    "request_points",
]

Format = Literal["openai", "anthropic", "normandy", "responses"]
FORMATS: tuple[Format, ...] = ("openai", "anthropic", "normandy", "responses")
#: The formats a provider defines (read and written by ``normandy_core.transcripts.transcript``).
PROVIDER_FORMATS: tuple[Format, ...] = ("openai", "anthropic", "responses")
#: Type names standing for block and item types a provider adds later.
FUTURE_PREFIX = "fuzz_future_"
Ending = Literal["reply", "results", "open_round", "user"]

_WORDS = (
    "read", "file", "src/app.py", "def", "return", "error", "test", "passed", "json", "config",
    "tokens", "window", "the", "a", "fix", "TypeError", "line", "build", "deploy", "cache",
    "retry", "timeout", "parse", "value", "None", "import", "class", "self", "async", "await",
    "yield", "lambda", "assert", "raise", "except", "finally", "with", "open", "path", "query",
)  # fmt: skip
_ODD = (
    "\x00", "\u200b", "\u200f", "\u202e", "\ufeff", "\u00ad", "é", "ß", "ñ", "中文", "日本語",
    "한국어", "عربى", "עברית", "🙂", "👩\u200d💻", "🏳️\u200d🌈", "\U0001d518", "e\u0301",
    "\t", "\r\n", "\\", '"', "</transcript>", "\uff1c", "{}", "[]", "\u2028",
)  # fmt: skip
_TOOLS = ("read_file", "grep", "run_tests", "bash", "fetch_url", "list_dir", "edit_file")
_PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d4944415478da63f8cfc0f01f0005000201a5d3e5c50000000049454e44ae426082"
    )
).decode()


@dataclass
class Text:
    """A text part."""

    text: str


@dataclass
class Image:
    """An image part: base64 PNG data or a URL."""

    data: str | None = None
    url: str | None = None


@dataclass
class Document:
    """A document part: a plain-text document or a base64 PDF."""

    text: str | None = None
    pdf: str | None = None
    title: str | None = None


Part = Text | Image | Document


@dataclass
class Call:
    """One tool call.

    ``kind`` is ``function``, ``custom`` (Chat Completions and Responses: ``input`` is
    ``{"input": text}``), or a Responses call answered by its own output item
    (``computer_call``, ``shell_call``, ``apply_patch_call``, ``mcp_approval_request``),
    whose fields ``input`` holds.
    """

    id: str
    name: str
    input: dict[str, Any]
    kind: str = "function"


@dataclass
class Result:
    """One tool result: text, then images, and whether it is an error."""

    id: str
    text: str
    images: list[Image] = field(default_factory=list)
    is_error: bool = False
    kind: str = "function"  # the kind of the call it answers
    extra: dict[str, Any] | None = None  # a search_result block beside the text (Anthropic)


@dataclass
class User:
    """A user message; ``extras`` are format-native blocks appended to it (Anthropic)."""

    parts: list[Part]
    pinned: bool = False
    extras: list[dict[str, Any]] = field(default_factory=list)
    name: str | None = None


@dataclass
class Assistant:
    """An assistant message: thinking, text, tool calls.

    ``extras`` are format-native blocks (Anthropic: server-tool and MCP pairs, future
    blocks) or items (Responses: standalone server-side calls, future items);
    ``compaction`` the text of a provider compaction the turn opens with.
    """

    text: str
    calls: list[Call] = field(default_factory=list)
    thinking: list[tuple[str, str]] = field(default_factory=list)  # (kind, payload)
    refusal: str | None = None
    citations: list[dict[str, Any]] = field(default_factory=list)
    extras: list[dict[str, Any]] = field(default_factory=list)
    compaction: str | None = None
    name: str | None = None
    parts: bool = False  # Chat: content as text parts; Responses: an output message


@dataclass
class Results:
    """The results of one batch, optionally followed by user text in the same turn."""

    results: list[Result]
    then_text: str | None = None


Message = User | Assistant | Results


@dataclass
class Session:
    """A drawn session in a neutral shape, rendered per format by :func:`render`."""

    format: Format
    system: str | None
    system_pinned: bool
    messages: list[tuple[str, Message]]  # (turn id, message)
    ending: Ending
    shape: dict[str, Any] = field(default_factory=dict)  # container details per format
    fork_at: int | None = None  # Normandy: an abandoned branch after this message index

    @property
    def open_round(self) -> bool:
        """Whether the last message is an assistant message whose calls have no results."""
        return self.ending == "open_round"


class _Draw:
    """Drawing helpers sharing one ``random.Random`` and a counter for unique tags."""

    def __init__(self, rng: random.Random, fmt: Format) -> None:
        self.rng = rng
        self.fmt = fmt
        self.serial = 0
        self.ids: set[str] = set()
        self.odd = rng.random() < 0.35  # this session sprinkles unicode, NUL, ...
        # decorated: names, cache_control, server tools, custom calls... (see the module)
        self.decorated = fmt in PROVIDER_FORMATS and rng.random() < 0.5
        # Chat Completions: a Claude conversation as LangChain writes it (thinking parts
        # leading the assistants' content); set by draw_session.
        self.lc_thinking = False

    def tag(self) -> str:
        self.serial += 1
        return f"#m{self.serial}"

    def words(self, n_chars: int) -> str:
        rng = self.rng
        out: list[str] = []
        size = 0
        while size < n_chars:
            w = rng.choice(_ODD) if self.odd and rng.random() < 0.08 else rng.choice(_WORDS)
            if rng.random() < 0.03:
                w = "".join(rng.choice(string.printable) for _ in range(rng.randint(1, 12)))
            out.append(w)
            size += len(w) + 1
        return " ".join(out)

    def text(self, lo: int, hi: int, tagged: bool = True) -> str:
        body = self.words(self.rng.randint(lo, hi))
        text = f"{body} {self.tag()}" if tagged else body
        return text if text.strip() else f"x {self.tag()}"

    def output_size(self) -> int:
        r = self.rng.random()
        if r < 0.004:
            return self.rng.randint(60_000, 240_000)
        if r < 0.03:
            return self.rng.randint(6_000, 30_000)
        if r < 0.25:
            return self.rng.randint(800, 6_000)
        return self.rng.randint(0, 800)

    def tool_id(self) -> str:
        alphabet = string.ascii_letters + string.digits
        prefix = "call_" if self.fmt in ("openai", "responses") else "toolu_"
        while True:
            tid = prefix + "".join(self.rng.choice(alphabet) for _ in range(24))
            if tid not in self.ids:
                self.ids.add(tid)
                return tid

    def item_id(self, prefix: str) -> str:
        """A fresh id with ``prefix`` (Responses item ids, server tool use ids)."""
        while True:
            iid = prefix + "".join(self.rng.choice("0123456789abcdef") for _ in range(20))
            if iid not in self.ids:
                self.ids.add(iid)
                return iid

    def cache(self, block: dict[str, Any], p: float = 0.12) -> dict[str, Any]:
        """``block`` with ``cache_control`` now and then (decorated Anthropic sessions)."""
        if self.decorated and self.fmt == "anthropic" and self.rng.random() < p:
            cc: dict[str, Any] = {"type": "ephemeral"}
            if self.rng.random() < 0.3:
                cc["ttl"] = self.rng.choice(["5m", "1h"])
            block["cache_control"] = cc
        return block

    def tool_input(self) -> dict[str, Any]:
        rng = self.rng
        data: dict[str, Any] = {"path": f"src/{self.words(rng.randint(3, 20))}.py"}
        if rng.random() < 0.5:
            data["pattern"] = self.words(rng.randint(1, 30))
        if rng.random() < 0.3:
            data["limit"] = rng.randint(-5, 10_000)
        if rng.random() < 0.2:
            data["flags"] = [rng.choice(["-n", "-r", "-i", None, True, 1.5]) for _ in range(3)]
        if rng.random() < 0.1:
            data["nested"] = {"a": {"b": [1, {"c": self.words(10)}]}}
        if rng.random() < 0.05:
            data = {}
        return data

    def image(self) -> Image:
        if self.rng.random() < 0.7:
            return Image(data=_PNG)
        return Image(url=f"https://example.com/img/{self.rng.randint(1, 10**9)}.png")

    def signature(self) -> str:
        alphabet = string.ascii_letters + string.digits + "+/"
        return "".join(self.rng.choice(alphabet) for _ in range(self.rng.randint(40, 120)))


def _user_parts(d: _Draw, images: bool) -> list[Part]:
    rng = d.rng
    parts: list[Part] = [Text(d.text(1, 400 if rng.random() < 0.9 else 3000))]
    if images and rng.random() < 0.12:
        parts.append(d.image())
    if d.fmt != "openai" and rng.random() < 0.04:
        if rng.random() < 0.5 and d.fmt != "responses":
            parts.append(Document(text=d.text(20, 2000), title="notes.txt"))
        else:
            parts.append(Document(pdf=_PNG, title=None))
    if rng.random() < 0.08:
        parts.append(Text(d.text(1, 100)))
    return parts


def _user(d: _Draw, images: bool) -> User:
    rng = d.rng
    u = User(_user_parts(d, images), pinned=rng.random() < 0.08)
    if not d.decorated:
        return u
    if d.fmt == "openai" and rng.random() < 0.3:
        u.name = rng.choice(["alice", "dev_bob", "ops-7"])
    if d.fmt == "anthropic" and rng.random() < 0.15:
        u.extras.append(
            rng.choice(
                [
                    lambda: _search_result(d),
                    lambda: {"type": "container_upload", "file_id": d.item_id("file_")},
                    lambda: _future(d, "block"),
                ]
            )()
        )
    return u


def _search_result(d: _Draw) -> dict[str, Any]:
    block: dict[str, Any] = {
        "type": "search_result",
        "source": f"https://docs.example.com/{d.rng.randint(1, 10**6)}",
        "title": d.text(1, 40, tagged=False).strip() or "Docs",
        "content": [{"type": "text", "text": d.text(5, 300)}],
    }
    if d.rng.random() < 0.5:
        block["citations"] = {"enabled": True}
    return d.cache(block)


def _future(d: _Draw, what: str) -> dict[str, Any]:
    """A block or item of a type the provider adds later: carried, never interpreted."""
    return {
        "type": f"{FUTURE_PREFIX}{what}",
        "id": d.item_id("fut_"),
        "payload": {"note": d.text(1, 120), "n": d.rng.randint(0, 99)},
    }


def _server_pair(d: _Draw) -> list[dict[str, Any]]:
    """A server-side tool use and its result, as they sit in one Anthropic assistant message."""
    rng = d.rng
    kind = rng.choice(["web_search", "web_fetch", "code_execution", "mcp"])
    if kind == "mcp":
        uid = d.item_id("mcptoolu_")
        content: Any = (
            d.text(1, 300) if rng.random() < 0.5 else [{"type": "text", "text": d.text(1, 300)}]
        )
        return [
            {
                "type": "mcp_tool_use",
                "id": uid,
                "name": rng.choice(["lookup", "search_docs"]),
                "server_name": "docs",
                "input": {"q": d.text(1, 40)},
            },
            {"type": "mcp_tool_result", "tool_use_id": uid, "is_error": False, "content": content},
        ]
    uid = d.item_id("srvtoolu_")
    use = {"type": "server_tool_use", "id": uid, "name": kind, "input": {}}
    if kind == "web_search":
        use["input"] = {"query": d.text(1, 60)}
        result: dict[str, Any] = {
            "type": "web_search_tool_result",
            "tool_use_id": uid,
            "content": [
                {
                    "type": "web_search_result",
                    "url": f"https://example.com/{rng.randint(1, 10**6)}",
                    "title": d.text(1, 40),
                    "encrypted_content": d.signature(),
                    "page_age": "May 2",
                }
                for _ in range(rng.randint(0, 3))
            ],
        }
    elif kind == "web_fetch":
        url = f"https://example.com/page/{rng.randint(1, 10**6)}"
        use["input"] = {"url": url}
        result = {
            "type": "web_fetch_tool_result",
            "tool_use_id": uid,
            "content": {
                "type": "web_fetch_result",
                "url": url,
                "content": {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": d.text(5, 800)},
                },
                "retrieved_at": "2025-05-02T10:00:00Z",
            },
        }
    else:
        use["input"] = {"code": "print(1 + 1)"}
        result = {
            "type": "code_execution_tool_result",
            "tool_use_id": uid,
            "content": {
                "type": "code_execution_result",
                "stdout": d.text(1, 200),
                "stderr": "",
                "return_code": 0,
                "content": [],
            },
        }
    return [d.cache(use), d.cache(result)]


def _citation(d: _Draw) -> dict[str, Any]:
    if d.rng.random() < 0.5:
        return {
            "type": "char_location",
            "cited_text": d.text(1, 40, tagged=False),
            "document_index": 0,
            "document_title": "notes.txt",
            "start_char_index": 0,
            "end_char_index": 10,
        }
    return {
        "type": "search_result_location",
        "cited_text": d.text(1, 40, tagged=False),
        "source": "https://docs.example.com/r",
        "title": "Releases",
        "search_result_index": 0,
        "start_block_index": 0,
        "end_block_index": 0,
    }


def _responses_extra(d: _Draw) -> dict[str, Any]:
    """A standalone server-side call item of the Responses API (or one of the future)."""
    rng = d.rng
    kind = rng.choice(
        ["web_search_call", "file_search_call", "mcp_call", "mcp_list_tools",
         "image_generation_call", "code_interpreter_call", "future"]
    )  # fmt: skip
    if kind == "web_search_call":
        return {
            "type": kind,
            "id": d.item_id("ws_"),
            "status": "completed",
            "action": {"type": "search", "query": d.text(1, 60)},
        }
    if kind == "file_search_call":
        return {
            "type": kind,
            "id": d.item_id("fs_"),
            "status": "completed",
            "queries": [d.text(1, 40)],
        }
    if kind == "mcp_call":
        return {
            "type": kind,
            "id": d.item_id("mcp_"),
            "name": "lookup",
            "server_label": "docs",
            "arguments": _json({"q": d.text(1, 40)}),
            "output": d.text(1, 400),
        }
    if kind == "mcp_list_tools":
        return {
            "type": kind,
            "id": d.item_id("mcpl_"),
            "server_label": "docs",
            "tools": [{"name": "lookup", "input_schema": {"type": "object"}}],
        }
    if kind == "image_generation_call":
        return {"type": kind, "id": d.item_id("ig_"), "status": "completed", "result": _PNG}
    if kind == "code_interpreter_call":
        return {
            "type": kind,
            "id": d.item_id("ci_"),
            "status": "completed",
            "code": "print(2 * 21)",
            "container_id": d.item_id("cntr_"),
            "outputs": [{"type": "logs", "logs": d.text(1, 200)}],
        }
    return _future(d, "item")


def _call(d: _Draw) -> Call:
    rng = d.rng
    name = rng.choice(_TOOLS)
    if not d.decorated or d.fmt not in ("openai", "responses") or rng.random() < 0.75:
        return Call(d.tool_id(), name, d.tool_input())
    if d.fmt == "openai" or rng.random() < 0.4:
        return Call(d.tool_id(), "apply_diff", {"input": d.text(1, 300)}, kind="custom")
    kind = rng.choice(["computer_call", "shell_call", "apply_patch_call", "mcp_approval_request"])
    if kind == "computer_call":
        fields: dict[str, Any] = {
            "id": d.item_id("cu_"),
            "action": {"type": "screenshot"},
            "pending_safety_checks": [],
            "status": "completed",
        }
    elif kind == "shell_call":
        fields = {
            "id": d.item_id("sh_"),
            "action": {"commands": [f"ls {d.text(1, 20, tagged=False)}"], "timeout_ms": 1000},
            "status": "completed",
        }
    elif kind == "apply_patch_call":
        fields = {
            "id": d.item_id("apc_"),
            "operation": {"type": "update_file", "path": "src/app.py", "diff": d.text(5, 300)},
            "status": "completed",
        }
    else:
        return Call(
            d.item_id("mcpr_"),
            "lookup",
            {"arguments": _json({"q": d.text(1, 30)}), "server_label": "docs"},
            kind=kind,
        )
    return Call(d.tool_id(), name, fields, kind=kind)


def _assistant(d: _Draw, n_calls: int, thinking: bool) -> Assistant:
    rng = d.rng
    text = d.text(1, 600) if (n_calls == 0 or rng.random() < 0.5) else ""
    calls = [_call(d) for _ in range(n_calls)]
    think: list[tuple[str, str]] = []
    if thinking and (d.fmt != "openai" or d.lc_thinking):
        if rng.random() < 0.85:
            think.append(("thinking", d.text(10, 800, tagged=False)))
        if rng.random() < 0.15:
            think.append(("redacted", d.signature()))
    a = Assistant(text=text, calls=calls, thinking=think)
    if not d.decorated:
        return a
    a.parts = rng.random() < 0.3
    if d.fmt in ("openai", "responses") and not calls and rng.random() < 0.08:
        a.refusal = f"I can't help with that. {d.tag()}"
    if d.fmt == "openai" and rng.random() < 0.2:
        a.name = "agent"
    if d.fmt == "anthropic":
        if text and rng.random() < 0.15:
            a.citations = [_citation(d) for _ in range(rng.randint(1, 2))]
        if rng.random() < 0.2:
            a.extras.extend(_server_pair(d))
            if rng.random() < 0.3:
                a.extras.extend(_server_pair(d))
        if rng.random() < 0.05:
            a.extras.append(_future(d, "block"))
    if d.fmt == "responses" and rng.random() < 0.2:
        a.extras.append(_responses_extra(d))
    return a


def _results(d: _Draw, calls: list[Call], images: bool) -> Results:
    rng = d.rng
    out = []
    for c in calls:
        n = d.output_size()
        text = d.text(n, n, tagged=False) if n else ""
        imgs = [d.image()] if images and rng.random() < 0.1 and c.kind == "function" else []
        if d.fmt == "anthropic" and not text and not imgs:
            text = "(no output)"
        r = Result(c.id, text, imgs, is_error=rng.random() < 0.08, kind=c.kind)
        if d.fmt == "anthropic" and d.decorated and rng.random() < 0.06:
            r.extra = _search_result(d)
        out.append(r)
    order = list(out)
    if len(order) > 1 and rng.random() < 0.2:
        rng.shuffle(order)  # results in another order than the calls
    then = d.text(1, 200) if rng.random() < 0.05 else None
    return Results(order, then)


def draw_session(rng: random.Random, fmt: Format) -> Session:
    """A valid session in ``fmt`` (its rendering passes the campaign's validators)."""
    d = _Draw(rng, fmt)
    size = rng.random()
    if size < 0.35:
        n_turns, max_rounds = rng.randint(1, 2), 3
    elif size < 0.85:
        n_turns, max_rounds = rng.randint(2, 5), 4
    else:
        n_turns, max_rounds = rng.randint(5, 12), 5
    images = rng.random() < 0.3
    thinking = rng.random() < 0.35
    d.lc_thinking = fmt == "openai" and thinking and rng.random() < 0.5
    system = d.text(5, 1500) if rng.random() < 0.7 else None
    endings: tuple[Ending, ...] = ("reply", "results", "open_round", "user")
    ending = rng.choices(endings, weights=[35, 25, 30, 10])[0]
    msgs: list[tuple[str, Message]] = []
    if fmt == "openai" and rng.random() < 0.04:
        msgs.append(("turn-0", Assistant(text=d.text(1, 200))))  # a greeting first
    for t in range(1, n_turns + 1):
        turn = f"turn-{t}"
        last = t == n_turns
        msgs.append((turn, _user(d, images)))
        if last and ending == "user":
            break
        lo = 1 if last and ending in ("results", "open_round") else 0
        rounds = rng.randint(lo, max_rounds)
        for r in range(rounds):
            n_calls = rng.choices([1, 2, 3, 4, 6], weights=[55, 20, 12, 8, 5])[0]
            if rng.random() < 0.06 and not (last and r == rounds - 1):
                msgs.append((turn, _assistant(d, 0, thinking)))  # a remark between rounds
            a = _assistant(d, n_calls, thinking)
            msgs.append((turn, a))
            if last and r == rounds - 1 and ending == "open_round":
                break
            msgs.append((turn, _results(d, a.calls, images)))
        if not last or ending == "reply":
            msgs.append((turn, _assistant(d, 0, thinking)))
    if fmt in ("anthropic", "responses") and rng.random() < 0.12:
        # A provider compaction now and then (sometimes two: the newest is pinned).
        turns = [m for _, m in msgs if isinstance(m, Assistant)]
        for a in rng.sample(turns, min(len(turns), 2 if rng.random() < 0.3 else 1)):
            a.compaction = f"Summary of the conversation so far: {d.text(20, 600)}"
    shape = {
        "system_as_blocks": rng.random() < 0.3,
        "dict": rng.random() < 0.15,
        "developer": rng.random() < 0.2,
        "name": rng.random() < 0.1,
        "tool_role": rng.random() < 0.2,
        "cache_control": rng.random() < 0.2,
        "typed": rng.random() < 0.4,  # Responses: typed message items, not easy messages
    }
    if fmt == "responses":
        shape["dict"] = False  # the Responses input is a list of items
    shape["decorated"] = d.decorated
    shape["lc_thinking"] = d.lc_thinking
    fork_at = rng.randrange(len(msgs)) if fmt == "normandy" and rng.random() < 0.1 else None
    return Session(fmt, system, rng.random() < 0.5, msgs, ending, shape, fork_at)


# -- rendering --------------------------------------------------------------------------


def _oa_part(p: Part) -> dict[str, Any]:
    if isinstance(p, Text):
        return {"type": "text", "text": p.text}
    if isinstance(p, Image):
        url = f"data:image/png;base64,{p.data}" if p.data else str(p.url)
        return {"type": "image_url", "image_url": {"url": url}}
    raise ValueError("documents are not drawn for OpenAI")


def _oa_call(c: Call) -> dict[str, Any]:
    if c.kind == "custom":
        return {
            "id": c.id,
            "type": "custom",
            "custom": {"name": c.name, "input": str(c.input["input"])},
        }
    return {
        "id": c.id,
        "type": "function",
        "function": {"name": c.name, "arguments": _json(c.input)},
    }


def _render_openai(s: Session) -> Any:
    out: list[dict[str, Any]] = []
    if s.system is not None:
        role = "developer" if s.shape["developer"] else "system"
        out.append({"role": role, "content": s.system})
    for _, m in s.messages:
        if isinstance(m, User):
            msg: dict[str, Any] = {"role": "user"}
            if len(m.parts) == 1 and isinstance(m.parts[0], Text):
                msg["content"] = m.parts[0].text
            else:
                msg["content"] = [_oa_part(p) for p in m.parts]
            if s.shape["name"] or m.name:
                msg["name"] = m.name or "alice"
            out.append(msg)
        elif isinstance(m, Assistant):
            msg = {"role": "assistant", "content": m.text or None}
            if m.parts and m.text:
                msg["content"] = [{"type": "text", "text": m.text}]
            if m.refusal is not None:
                if m.parts or not m.text:  # a refusal part (after the text, if any)
                    msg["content"] = [
                        *([{"type": "text", "text": m.text}] if m.text else []),
                        {"type": "refusal", "refusal": m.refusal},
                    ]
                else:  # the refusal field beside the text
                    msg["refusal"] = m.refusal
            if m.thinking:  # thinking parts first, then the text (and refusal) parts
                rest = msg["content"] if isinstance(msg["content"], list) else []
                if isinstance(msg["content"], str) and msg["content"]:
                    rest = [{"type": "text", "text": msg["content"]}]
                msg["content"] = [*(_lc_thinking_part(k, p) for k, p in m.thinking), *rest]
            if m.name:
                msg["name"] = m.name
            if m.calls:
                msg["tool_calls"] = [_oa_call(c) for c in m.calls]
            elif msg["content"] is None:
                msg["content"] = ""
            out.append(msg)
        else:
            held: list[dict[str, Any]] = []
            for r in m.results:
                out.append({"role": "tool", "tool_call_id": r.id, "content": r.text})
                held.extend(_oa_part(i) for i in r.images)
            if m.then_text is not None:
                held.append({"type": "text", "text": m.then_text})
            if held:
                out.append({"role": "user", "content": held})
    return {"messages": out} if s.shape["dict"] else out


def _lc_thinking_part(kind: str, payload: str) -> dict[str, Any]:
    """A thinking part of a Chat assistant message, as LangChain writes Claude's."""
    if kind == "thinking":
        sig = base64.b64encode(payload[:40].encode("utf-8", "replace")).decode() or "c2ln"
        return {"type": "thinking", "thinking": payload, "signature": sig}
    return {"type": "redacted_thinking", "data": payload}


def _an_part(p: Part, cache: bool = False) -> dict[str, Any]:
    if isinstance(p, Text):
        block: dict[str, Any] = {"type": "text", "text": p.text}
        if cache:
            block["cache_control"] = {"type": "ephemeral"}
        return block
    if isinstance(p, Image):
        if p.data:
            return {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": p.data},
            }
        return {"type": "image", "source": {"type": "url", "url": p.url}}
    if p.text is not None:
        doc: dict[str, Any] = {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": p.text},
        }
    else:
        doc = {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": p.pdf},
        }
    if p.title is not None:
        doc["title"] = p.title
    return doc


def _cached(block: dict[str, Any], key: str, on: bool) -> dict[str, Any]:
    """``block`` with ``cache_control`` for about one key in eight (decorated sessions)."""
    if on and zlib.crc32(key.encode("utf-8", "surrogatepass")) % 8 == 0:
        block["cache_control"] = {"type": "ephemeral"}
    return block


def _an_result(r: Result, decorated: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": r.id}
    if r.images or r.extra is not None:
        parts: list[dict[str, Any]] = [{"type": "text", "text": r.text}] if r.text else []
        if r.extra is not None:
            parts.append(r.extra)
        block["content"] = parts + [_an_part(i) for i in r.images]
    else:
        block["content"] = r.text
    if r.is_error:
        block["is_error"] = True
    return _cached(block, r.id, decorated)


def _an_assistant(m: Assistant, decorated: bool = False) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if m.compaction is not None:
        blocks.append({"type": "compaction", "content": m.compaction})
    for kind, payload in m.thinking:
        if kind == "thinking":
            sig = base64.b64encode(payload[:40].encode("utf-8", "replace")).decode() or "c2ln"
            blocks.append({"type": "thinking", "thinking": payload, "signature": sig})
        else:
            blocks.append({"type": "redacted_thinking", "data": payload})
    blocks.extend(m.extras)
    if m.text:
        text: dict[str, Any] = {"type": "text", "text": m.text}
        if m.citations:
            text["citations"] = m.citations
        blocks.append(_cached(text, m.text, decorated))
    blocks.extend(
        _cached({"type": "tool_use", "id": c.id, "name": c.name, "input": c.input}, c.id, decorated)
        for c in m.calls
    )
    return blocks


def _render_anthropic(s: Session) -> Any:
    out: list[dict[str, Any]] = []
    decorated = bool(s.shape.get("decorated"))
    last_user = max((i for i, (_, m) in enumerate(s.messages) if isinstance(m, User)), default=-1)
    for i, (_, m) in enumerate(s.messages):
        if isinstance(m, User):
            cache = s.shape["cache_control"] and i == last_user
            if len(m.parts) == 1 and isinstance(m.parts[0], Text) and not cache and not m.extras:
                out.append({"role": "user", "content": m.parts[0].text})
            else:
                blocks = [_an_part(p, cache) for p in m.parts]
                out.append({"role": "user", "content": blocks + m.extras})
        elif isinstance(m, Assistant):
            blocks = _an_assistant(m, decorated)
            if (
                len(blocks) == 1
                and blocks[0]["type"] == "text"
                and s.shape["name"]
                and set(blocks[0]) == {"type", "text"}
            ):
                out.append({"role": "assistant", "content": blocks[0]["text"]})
            else:
                out.append({"role": "assistant", "content": blocks})
        else:
            content = [_an_result(r, decorated) for r in m.results]
            if m.then_text is not None:
                if s.shape["tool_role"]:  # the user's words as a message of their own
                    out.append({"role": "user", "content": content})
                    out.append({"role": "user", "content": m.then_text})
                    continue
                content.append({"type": "text", "text": m.then_text})
            out.append({"role": "user", "content": content})
    if s.system is None and not s.shape["dict"]:
        return out
    request: dict[str, Any] = {"messages": out}
    if s.system is not None:
        if s.shape["system_as_blocks"]:
            request["system"] = [_cached({"type": "text", "text": s.system}, "", decorated)]
        else:
            request["system"] = s.system
    return request


def _rs_part(p: Part) -> dict[str, Any]:
    if isinstance(p, Text):
        return {"type": "input_text", "text": p.text}
    if isinstance(p, Image):
        url = f"data:image/png;base64,{p.data}" if p.data else str(p.url)
        return {"type": "input_image", "image_url": url, "detail": "auto"}
    return {
        "type": "input_file",
        "filename": p.title or "doc.pdf",
        "file_data": f"data:application/pdf;base64,{p.pdf}",
    }


def _rs_id(prefix: str, key: str) -> str:
    """A stable item id derived from ``key`` (unique: a tagged text, a call id, a serial)."""
    return f"{prefix}{zlib.crc32(key.encode('utf-8', 'surrogatepass')):08x}{len(key):04x}"


def _rs_call(c: Call) -> dict[str, Any]:
    if c.kind == "function":
        return {
            "type": "function_call",
            "id": _rs_id("fc_", c.id),
            "call_id": c.id,
            "name": c.name,
            "arguments": _json(c.input),
            "status": "completed",
        }
    if c.kind == "custom":
        return {
            "type": "custom_tool_call",
            "id": _rs_id("ctc_", c.id),
            "call_id": c.id,
            "name": c.name,
            "input": str(c.input["input"]),
        }
    if c.kind == "mcp_approval_request":
        return {"type": c.kind, "id": c.id, "name": c.name, **c.input}
    return {"type": c.kind, "call_id": c.id, **c.input}


def _rs_output(r: Result) -> dict[str, Any]:
    if r.kind == "function":
        output: Any = r.text
        if r.images:
            output = [{"type": "input_text", "text": r.text}, *(_rs_part(i) for i in r.images)]
        return {"type": "function_call_output", "call_id": r.id, "output": output}
    if r.kind == "custom":
        return {"type": "custom_tool_call_output", "call_id": r.id, "output": r.text}
    if r.kind == "computer_call":
        return {
            "type": "computer_call_output",
            "call_id": r.id,
            "output": {"type": "computer_screenshot", "image_url": f"data:image/png;base64,{_PNG}"},
        }
    if r.kind == "shell_call":
        return {
            "type": "shell_call_output",
            "call_id": r.id,
            "output": [
                {"stdout": r.text, "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}
            ],
        }
    if r.kind == "apply_patch_call":
        status = "failed" if r.is_error else "completed"
        return {
            "type": "apply_patch_call_output",
            "call_id": r.id,
            "status": status,
            "output": r.text,
        }
    return {"type": "mcp_approval_response", "approval_request_id": r.id, "approve": not r.is_error}


def _rs_assistant(m: Assistant, serial: Iterator[int]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if m.compaction is not None:
        items.append(
            {
                "type": "compaction",
                "id": _rs_id("cmp_", m.compaction),
                "encrypted_content": base64.b64encode(
                    m.compaction.encode("utf-8", "surrogatepass")
                ).decode(),
            }
        )
    for kind, payload in m.thinking:
        key = payload[:60]
        unique = f"{key}{next(serial)}"
        item: dict[str, Any] = {"type": "reasoning", "id": _rs_id("rs_", unique), "summary": []}
        if kind == "thinking":
            item["summary"] = [{"type": "summary_text", "text": payload}]
        item["encrypted_content"] = base64.b64encode(key.encode("utf-8", "surrogatepass")).decode()
        items.append(item)
    if m.text or m.refusal is not None:
        if m.parts or m.refusal is not None:
            parts: list[dict[str, Any]] = []
            if m.text:
                parts.append({"type": "output_text", "text": m.text, "annotations": []})
            if m.refusal is not None:
                parts.append({"type": "refusal", "refusal": m.refusal})
            key = m.text or m.refusal or ""
            items.append(
                {
                    "type": "message",
                    "id": _rs_id("msg_", key),
                    "role": "assistant",
                    "status": "completed",
                    "content": parts,
                }
            )
        else:
            items.append({"role": "assistant", "content": m.text})
    items.extend(_rs_call(c) for c in m.calls)
    items.extend(m.extras)
    return items


def _render_responses(s: Session) -> Any:
    out: list[dict[str, Any]] = []
    typed = bool(s.shape.get("typed"))
    serial = itertools.count()
    if s.system is not None:
        role = "developer" if s.shape["developer"] else "system"
        if s.shape["system_as_blocks"]:
            content: Any = [{"type": "input_text", "text": s.system}]
            out.append({"type": "message", "role": role, "content": content})
        else:
            out.append({"role": role, "content": s.system})
    for _, m in s.messages:
        if isinstance(m, User):
            if len(m.parts) == 1 and isinstance(m.parts[0], Text) and not typed:
                out.append({"role": "user", "content": m.parts[0].text})
            else:
                parts = [_rs_part(p) for p in m.parts]
                out.append({"type": "message", "role": "user", "content": parts})
        elif isinstance(m, Assistant):
            out.extend(_rs_assistant(m, serial))
        else:
            out.extend(_rs_output(r) for r in m.results)
            if m.then_text is not None:
                out.append({"role": "user", "content": m.then_text})
    return out


def _render_normandy(s: Session) -> Any:
    from normandy_core import AgentMemory

    mem = AgentMemory()
    ids: list[str] = []
    if s.system is not None:
        mem.add_message("system", s.system, turn_id=None, pinned=s.system_pinned)
    for turn, m in s.messages:
        if isinstance(m, User):
            content: Any
            if len(m.parts) == 1 and isinstance(m.parts[0], Text):
                content = m.parts[0].text
            else:
                content = [_an_part(p) for p in m.parts]
            e = mem.add_message("user", content, turn_id=turn, pinned=m.pinned)
        elif isinstance(m, Assistant):
            blocks = _an_assistant(m)
            if len(blocks) == 1 and blocks[0]["type"] == "text":
                e = mem.add_message("assistant", blocks[0]["text"], turn_id=turn)
            else:
                e = mem.add_message("assistant", blocks, turn_id=turn)
        else:
            blocks = [_an_result(r) for r in m.results]
            if m.then_text is not None:
                blocks.append({"type": "text", "text": m.then_text})
            role: Literal["tool", "user"] = "tool" if s.shape["tool_role"] else "user"
            e = mem.add_message(role, blocks, turn_id=turn, metadata={"source": "fuzz"})
        ids.append(e.id)
    if s.fork_at is not None:
        # An abandoned branch after message fork_at: a user message that was edited later.
        fork = mem.fork(ids[s.fork_at])
        fork.add_message("user", f"abandoned branch {len(ids)}", turn_id="turn-x")
        mem = fork.fork(mem.head)
    return mem.dump()


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def render(s: Session) -> Any:
    """The session in its format: what a caller hands to ``compact()``."""
    if s.format == "openai":
        return _render_openai(s)
    if s.format == "anthropic":
        return _render_anthropic(s)
    if s.format == "responses":
        return _render_responses(s)
    return _render_normandy(s)


# -- request points: where an agent calls the model ------------------------------------------


def _model_side(fmt: str, m: Any) -> bool:
    """Whether message ``m`` of a rendered ``fmt`` list comes from the model."""
    if fmt in ("openai", "anthropic"):
        return m.get("role") == "assistant"
    kind = m.get("type") or "message"
    if kind == "message":
        return m.get("role") == "assistant"
    return not (kind.endswith("_output") or kind == "mcp_approval_response")


def _is_result(fmt: str, m: Any) -> bool:
    if fmt == "openai":
        return m.get("role") == "tool"
    if fmt == "anthropic":
        content = m.get("content")
        return (
            m.get("role") == "user"
            and isinstance(content, list)
            and bool(content)
            and content[0].get("type") == "tool_result"
        )
    kind = m.get("type") or "message"
    return kind.endswith("_output") or kind == "mcp_approval_response"


def request_points(fmt: str, messages: list[Any]) -> list[tuple[int, bool]]:
    """Where an agent holding ``messages`` (a rendered provider list) calls the model.

    Returns ``(end, mid_round)`` pairs: the list up to ``end`` is what the agent sends
    before a model request (after a user message or a tool batch), ending with the whole
    list; ``mid_round`` when the tool round is still running there (the messages since
    the model's last answer hold tool results, or the list ends with calls awaiting
    them). Each batch between two points starts with what the model said, so no batch
    continues the entry of the one before.
    """
    points: list[tuple[int, bool]] = []
    results = False
    for k, m in enumerate(messages):
        if _model_side(fmt, m):
            if k > 0 and not _model_side(fmt, messages[k - 1]):
                points.append((k, results))
            results = False
        elif _is_result(fmt, m):
            results = True
    n = len(messages)
    if n and (not points or points[-1][0] != n):
        last = messages[-1]
        if _model_side(fmt, last):
            open_round = any(_is_call(fmt, m) for m in _trailing_model_run(fmt, messages))
            points.append((n, open_round))
        else:
            points.append((n, results))
    return points


def _trailing_model_run(fmt: str, messages: list[Any]) -> list[Any]:
    k = len(messages)
    while k > 0 and _model_side(fmt, messages[k - 1]):
        k -= 1
    return messages[k:]


def _is_call(fmt: str, m: Any) -> bool:
    if fmt == "openai":
        return bool(m.get("tool_calls"))
    if fmt == "anthropic":
        content = m.get("content")
        return isinstance(content, list) and any(b.get("type") == "tool_use" for b in content)
    kind = m.get("type") or "message"
    return kind in (
        "function_call", "custom_tool_call", "computer_call", "shell_call",
        "apply_patch_call", "mcp_approval_request",
    )  # fmt: skip
