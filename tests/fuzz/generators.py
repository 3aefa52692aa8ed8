"""Seeded generators of realistic agent sessions in the three transcript formats.

A session is drawn once in a neutral shape (:class:`Session`) from a ``random.Random``
and rendered as an OpenAI Chat Completions list, an Anthropic Messages list or
``{system, messages}`` dict, or a Normandy memory dump. Sessions have parallel tool
batches, images and documents (in tool results where the format can carry them),
signed and redacted thinking (Anthropic and Normandy), errors, unicode and NUL, now and
then a very long tool output (60-240k characters), pinned entries and a system prompt,
and end in one of four states: a finished reply, after a tool batch, an open round (an
assistant message whose tool calls have no results yet) or a user message.

Most texts carry a unique tag (``#m17``), so the campaign's loss oracle can tell equal
texts apart. The average session is small, so a campaign runs many cases.
"""

from __future__ import annotations

import base64
import random
import string
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "FORMATS",
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
]

Format = Literal["openai", "anthropic", "normandy"]
FORMATS: tuple[Format, ...] = ("openai", "anthropic", "normandy")
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
    """One tool call."""

    id: str
    name: str
    input: dict[str, Any]


@dataclass
class Result:
    """One tool result: text, then images, and whether it is an error."""

    id: str
    text: str
    images: list[Image] = field(default_factory=list)
    is_error: bool = False


@dataclass
class User:
    """A user message."""

    parts: list[Part]
    pinned: bool = False


@dataclass
class Assistant:
    """An assistant message: thinking, text, tool calls."""

    text: str
    calls: list[Call] = field(default_factory=list)
    thinking: list[tuple[str, str]] = field(default_factory=list)  # (kind, payload)


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
        prefix = "call_" if self.fmt == "openai" else "toolu_"
        while True:
            tid = prefix + "".join(self.rng.choice(alphabet) for _ in range(24))
            if tid not in self.ids:
                self.ids.add(tid)
                return tid

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
        if rng.random() < 0.5:
            parts.append(Document(text=d.text(20, 2000), title="notes.txt"))
        else:
            parts.append(Document(pdf=_PNG, title=None))
    if rng.random() < 0.08:
        parts.append(Text(d.text(1, 100)))
    return parts


def _assistant(d: _Draw, n_calls: int, thinking: bool) -> Assistant:
    rng = d.rng
    text = d.text(1, 600) if (n_calls == 0 or rng.random() < 0.5) else ""
    calls = [Call(d.tool_id(), rng.choice(_TOOLS), d.tool_input()) for _ in range(n_calls)]
    think: list[tuple[str, str]] = []
    if thinking and d.fmt != "openai":
        if rng.random() < 0.85:
            think.append(("thinking", d.text(10, 800, tagged=False)))
        if rng.random() < 0.15:
            think.append(("redacted", d.signature()))
    return Assistant(text=text, calls=calls, thinking=think)


def _results(d: _Draw, calls: list[Call], images: bool) -> Results:
    rng = d.rng
    out = []
    for c in calls:
        n = d.output_size()
        text = d.text(n, n, tagged=False) if n else ""
        imgs = [d.image()] if images and rng.random() < 0.1 else []
        if d.fmt == "anthropic" and not text and not imgs:
            text = "(no output)"
        out.append(Result(c.id, text, imgs, is_error=rng.random() < 0.08))
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
    system = d.text(5, 1500) if rng.random() < 0.7 else None
    endings: tuple[Ending, ...] = ("reply", "results", "open_round", "user")
    ending = rng.choices(endings, weights=[35, 25, 30, 10])[0]
    msgs: list[tuple[str, Message]] = []
    if fmt == "openai" and rng.random() < 0.04:
        msgs.append(("turn-0", Assistant(text=d.text(1, 200))))  # a greeting first
    for t in range(1, n_turns + 1):
        turn = f"turn-{t}"
        last = t == n_turns
        msgs.append((turn, User(_user_parts(d, images), pinned=rng.random() < 0.08)))
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
    shape = {
        "system_as_blocks": rng.random() < 0.3,
        "dict": rng.random() < 0.15,
        "developer": rng.random() < 0.2,
        "name": rng.random() < 0.1,
        "tool_role": rng.random() < 0.2,
        "cache_control": rng.random() < 0.2,
    }
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
            if s.shape["name"]:
                msg["name"] = "alice"
            out.append(msg)
        elif isinstance(m, Assistant):
            msg = {"role": "assistant", "content": m.text or None}
            if m.calls:
                msg["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": _json(c.input)},
                    }
                    for c in m.calls
                ]
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


def _an_result(r: Result) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": r.id}
    if r.images:
        parts: list[dict[str, Any]] = [{"type": "text", "text": r.text}] if r.text else []
        block["content"] = parts + [_an_part(i) for i in r.images]
    else:
        block["content"] = r.text
    if r.is_error:
        block["is_error"] = True
    return block


def _an_assistant(m: Assistant) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for kind, payload in m.thinking:
        if kind == "thinking":
            sig = base64.b64encode(payload[:40].encode("utf-8", "replace")).decode() or "c2ln"
            blocks.append({"type": "thinking", "thinking": payload, "signature": sig})
        else:
            blocks.append({"type": "redacted_thinking", "data": payload})
    if m.text:
        blocks.append({"type": "text", "text": m.text})
    blocks.extend(
        {"type": "tool_use", "id": c.id, "name": c.name, "input": c.input} for c in m.calls
    )
    return blocks


def _render_anthropic(s: Session) -> Any:
    out: list[dict[str, Any]] = []
    last_user = max((i for i, (_, m) in enumerate(s.messages) if isinstance(m, User)), default=-1)
    for i, (_, m) in enumerate(s.messages):
        if isinstance(m, User):
            cache = s.shape["cache_control"] and i == last_user
            if len(m.parts) == 1 and isinstance(m.parts[0], Text) and not cache:
                out.append({"role": "user", "content": m.parts[0].text})
            else:
                out.append({"role": "user", "content": [_an_part(p, cache) for p in m.parts]})
        elif isinstance(m, Assistant):
            blocks = _an_assistant(m)
            if len(blocks) == 1 and blocks[0]["type"] == "text" and s.shape["name"]:
                out.append({"role": "assistant", "content": blocks[0]["text"]})
            else:
                out.append({"role": "assistant", "content": blocks})
        else:
            content = [_an_result(r) for r in m.results]
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
            request["system"] = [{"type": "text", "text": s.system}]
        else:
            request["system"] = s.system
    return request


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
    import json

    return json.dumps(value, ensure_ascii=False)


def render(s: Session) -> Any:
    """The session in its format: what a caller hands to ``compact()``."""
    if s.format == "openai":
        return _render_openai(s)
    if s.format == "anthropic":
        return _render_anthropic(s)
    return _render_normandy(s)
