"""The UTF-8 upper bound window checks use before a tokenizer is loaded.

:class:`~normandy_core.conversation.tokens.Utf8BoundCounter` must never count less than the exact
counter it stands in for (the real cl100k here, the encoding this machine has), nor
than the character estimates the default counter may be, for any text and any entry;
and :meth:`~normandy_core.CalibratedCounter.memory_bound` must stay at least
``memory_tokens`` whatever the calibration factor. What happens in a fresh process
(nothing loaded for a small conversation) is in ``test_first_call.py``; that
``window_manager`` decides as the exact count does is a property in its own tests.
"""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from normandy_core import AgentMemory, CalibratedCounter, Calibration, TiktokenCounter, get_counter
from normandy_core.conversation import tokens as tokens_module
from normandy_core.conversation.entries import Entry, TextBlock, ToolUseBlock
from normandy_core.conversation.tokens import (
    ARGUMENTS_KEY,
    NAME_KEY,
    TOKENS_PER_MESSAGE,
    UTF8_BOUND_PER_MESSAGE,
    Utf8BoundCounter,
)
from strategies import entries, memories

BOUND = Utf8BoundCounter()
EXACT = TiktokenCounter("cl100k_base")
#: Texts tiktoken treats specially when asked to (counted here as ordinary text), and
#: pieces that merge poorly or split oddly: the bound must hold for them too.
AWKWARD = (
    "<|endoftext|>",
    "<|fim_prefix|>",
    "<|endofprompt|>",
    "<|im_start|>",
    " ",
    "\n",
    "\r\n",
    "\t",
    "'s",
    "数字",
    "🙂",
    "é",
    "\u200b",
    "\ud800",  # a lone surrogate: tiktoken replaces it, UTF-8 (surrogatepass) is 3 bytes
    "1234567",
    "{}",
)
texts = st.text() | st.lists(st.sampled_from(AWKWARD) | st.text(max_size=5)).map("".join)


@given(texts)
def test_a_texts_tokens_never_exceed_its_utf8_bytes(text):
    assert EXACT.count_text(text) <= BOUND.count_text(text)
    assert get_counter("conservative").count_text(text) <= BOUND.count_text(text)
    assert get_counter("estimate").count_text(text) <= BOUND.count_text(text)


def test_every_byte_is_a_token_of_cl100k_and_the_roles_fit_the_bounds_overhead():
    """Why the bound holds: byte-level BPE starts from single bytes (all 256 are tokens)
    and only merges them; the message overhead the exact counter computes from its
    encoding (the framing plus the longest role's tokens) is at most the bound's."""
    enc = EXACT.load()._encoding()
    assert all(enc.encode_single_token(bytes([b])) >= 0 for b in range(256))
    assert EXACT._per_message <= UTF8_BOUND_PER_MESSAGE == TOKENS_PER_MESSAGE + len("assistant")


def _with_wire_extras(entry: Entry, name: str | None, arguments: str | None) -> Entry:
    """``entry`` with a message ``name`` and, for its first tool call, an arguments
    string given by the caller: the two metadata the counters also count."""
    metadata = dict(entry.metadata)
    if name is not None:
        metadata[NAME_KEY] = name
    content = entry.content
    calls = [] if isinstance(content, str) else [b for b in content if isinstance(b, ToolUseBlock)]
    if arguments is not None and calls:
        metadata[ARGUMENTS_KEY] = {calls[0].id: arguments}
    return entry.model_copy(update={"metadata": metadata})


@given(entries(), st.none() | texts, st.none() | texts)
def test_an_entrys_bound_is_at_least_every_counters_count(entry, name, arguments):
    entry = _with_wire_extras(entry, name, arguments)
    bound = BOUND.count_entry(entry)
    assert bound >= EXACT.count_entry(entry)
    assert bound >= get_counter("conservative").count_entry(entry)
    assert bound >= get_counter("estimate").count_entry(entry)


def test_the_bound_counts_the_same_parts_as_the_exact_counter():
    """Not a character estimate: fixed costs are the exact counter's, texts are bytes."""
    call = ToolUseBlock(id="c1", name="read", input={"path": "é.py"})
    entry = Entry(id="a", role="assistant", content=(TextBlock(text="ok"), call))
    args = '{"path": "é.py"}'
    expected = UTF8_BOUND_PER_MESSAGE + 2 + len("read") + len(args.encode()) + 9
    assert BOUND.count_entry(entry) == expected
    assert BOUND.count_entry(Entry(id="u", role="user", content="数字")) == 12 + 6


@given(memories(), st.none() | st.floats(0.5, 3.0))
def test_the_memory_bound_is_at_least_the_calibrated_count(memory, factor):
    calibration = Calibration(min_tokens=1)
    if factor is not None:
        calibration.observe("gpt-4", "tiktoken:cl100k_base", 1000, round(1000 * factor))
    counter = CalibratedCounter("cl100k_base", "gpt-4", calibration)
    with pytest.MonkeyPatch.context() as mp:
        # cl100k offering its bound although this process has loaded it (the real
        # upper_bound offers it only before the load, which a test process is long past)
        mp.setattr(TiktokenCounter, "upper_bound", lambda self: tokens_module._UTF8_BOUND)
        bound = counter.memory_bound(memory)
    assert bound is not None
    assert bound >= counter.memory_tokens(memory)


def test_no_bound_once_the_encoding_is_loaded_or_for_a_character_estimate():
    memory = AgentMemory()
    memory.add_message("user", "hello")
    EXACT.load()
    assert EXACT.loaded and EXACT.upper_bound() is None
    assert CalibratedCounter("cl100k_base", "gpt-4").memory_bound(memory) is None
    assert CalibratedCounter("conservative", None).memory_bound(memory) is None
    assert CalibratedCounter(None, "claude-sonnet-4-5").memory_bound(memory) is None


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(st.dictionaries(st.text(), _JSON, max_size=5))
def test_tool_arguments_are_counted_as_json_dumps_writes_them(arguments):
    # the counter's one encoder writes exactly what json.dumps(..., ensure_ascii=False) does
    import json

    assert tokens_module._ARGUMENTS.encode(arguments) == json.dumps(arguments, ensure_ascii=False)


class _MyText(TextBlock):
    """A block of a subclass of a block type (counted as that type)."""


class _MyUse(ToolUseBlock):
    """Likewise for a tool use."""


def test_a_block_of_a_subclass_counts_as_its_block_type():
    use = {"id": "c1", "name": "grep", "input": {"q": "x"}}
    plain = Entry(
        id="a", role="assistant", content=(TextBlock(text="looking"), ToolUseBlock(**use))
    )
    sub = Entry(id="a", role="assistant", content=(_MyText(text="looking"), _MyUse(**use)))
    assert [type(b) for b in sub.content] == [_MyText, _MyUse]
    added = AgentMemory().add_message("assistant", sub.content)  # validated, not copied
    for counter in (EXACT, BOUND):
        assert counter.count_entry(sub) == counter.count_entry(plain) == counter.count_entry(added)
