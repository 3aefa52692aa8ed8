"""Hypothesis strategies for tool-using conversations (needs the ``testing`` extra).

:func:`conversations` draws realistic agent sessions: user turns, assistant rounds with
parallel tool calls, results in one user entry (Anthropic style) or one ``tool`` entry
each (OpenAI style), thinking blocks with signatures, images, pinned entries, an optional
system entry and abandoned branches. Every drawn conversation pairs its tools correctly.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

try:
    from hypothesis import strategies as st
except ImportError as exc:  # ModuleNotFoundError included
    raise ImportError(
        "normandy_core.testing.strategies needs hypothesis, which the 'testing' extra "
        f"installs: pip install 'normandy-core[testing]' ({exc})",
        name=exc.name,
    ) from exc

from normandy_core.conversation.entries import (
    Block,
    Entry,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from normandy_core.conversation.memory import AgentMemory

if TYPE_CHECKING:
    from normandy_core.conversation.survival import SurvivalRules

__all__ = [
    "TOOL_NAMES",
    "Case",
    "Conversation",
    "KeepTurns",
    "cases",
    "conversations",
    "survival_rules",
    "texts",
]

#: The tool names :func:`conversations` draws its calls from.
TOOL_NAMES = ("read_file", "run_tests", "search", "shell")

_WORDS = [
    "read", "file", "src/app.py", "def", "return", "error", "test", "passed", "json",
    "{\"k\": 1}", "config", "tokens", "window", "the", "a", "fix", "TypeError", "line",
]  # fmt: skip


def texts(min_size: int = 0, max_size: int = 400) -> st.SearchStrategy[str]:
    """Text mixing words, code-ish tokens and arbitrary characters."""
    words = st.lists(st.sampled_from(_WORDS), min_size=0, max_size=max_size // 4).map(" ".join)
    raw = st.text(alphabet=string.printable, min_size=min_size, max_size=max_size)
    return st.one_of(words, raw).filter(lambda t: len(t) >= min_size)


@dataclass
class Conversation:
    """A drawn conversation: its memory and whether it ends after a tool batch."""

    memory: AgentMemory
    ends_mid_round: bool


@st.composite
def conversations(
    draw: st.DrawFn,
    *,
    max_turns: int = 5,
    max_rounds: int = 4,
    max_result_chars: int = 2500,
    mid_round: bool | None = None,
) -> Conversation:
    """A valid tool-using conversation; ``mid_round`` forces ending after a tool batch or not."""
    mem = AgentMemory()
    tool_ids = (f"toolu_{n:04d}" for n in itertools.count(1))
    if draw(st.booleans()):
        mem.add_message("system", draw(texts(1, 200)), turn_id="t0")
    turns = draw(st.integers(1, max_turns))
    ends_mid = mid_round if mid_round is not None else draw(st.booleans())
    fork_done = False
    for t in range(turns):
        turn_id = f"t{t + 1}"
        last_turn = t == turns - 1
        mem.add_message(
            "user", draw(texts(1, 300)), turn_id=turn_id, pinned=draw(st.integers(0, 9)) == 0
        )
        rounds = draw(st.integers(1 if (last_turn and ends_mid) else 0, max_rounds))
        for r in range(rounds):
            _tool_round(draw, mem, turn_id, f"sig-{turn_id}-{r}", tool_ids, max_result_chars)
        if last_turn and ends_mid:
            break
        final: list[Block] = []
        if draw(st.booleans()):
            final.append(ThinkingBlock(thinking=draw(texts(1, 100)), signature=f"sig-{turn_id}-f"))
        final.append(TextBlock(text=draw(texts(1, 300))))
        mem.add_message("assistant", tuple(final), turn_id=turn_id)
        if not fork_done and not last_turn and draw(st.integers(0, 4)) == 0:
            fork_done = True
            mem = _with_abandoned_branch(mem, turn_id)
    return Conversation(memory=mem, ends_mid_round=ends_mid)


def _tool_round(
    draw: st.DrawFn,
    mem: AgentMemory,
    turn_id: str,
    signature: str,
    tool_ids: Iterator[str],
    max_result_chars: int,
) -> None:
    """Append one tool round: the assistant's calls (with thinking and text, or not), and
    their results in one user message or one tool message each."""
    blocks: list[Block] = []
    if draw(st.booleans()):
        blocks.append(ThinkingBlock(thinking=draw(texts(1, 200)), signature=signature))
    if draw(st.booleans()):
        blocks.append(TextBlock(text=draw(texts(1, 120))))
    uses = [
        ToolUseBlock(
            id=next(tool_ids),
            name=draw(st.sampled_from(TOOL_NAMES)),
            input={"arg": draw(texts(0, 60)), "n": draw(st.integers(0, 99))},
        )
        for _ in range(draw(st.integers(1, 3)))
    ]
    blocks.extend(uses)
    mem.add_message("assistant", tuple(blocks), turn_id=turn_id)
    results = [_tool_result(draw, use.id, max_result_chars) for use in uses]
    if draw(st.booleans()):
        mem.add_message("user", tuple(results), turn_id=turn_id)
    else:
        for result in results:
            mem.add_message("tool", (result,), turn_id=turn_id)


def _tool_result(draw: st.DrawFn, tool_use_id: str, max_result_chars: int) -> ToolResultBlock:
    """A tool's result: text, now and then a screenshot, now and then an error."""
    content: object
    if draw(st.integers(0, 7)) == 0:
        content = (
            TextBlock(text="screenshot"),
            ImageBlock(source={"type": "base64", "media_type": "image/png", "data": "iVBO"}),
        )
    else:
        content = draw(texts(0, max_result_chars))
    return ToolResultBlock(
        tool_use_id=tool_use_id, content=content, is_error=draw(st.integers(0, 9)) == 0
    )


def _with_abandoned_branch(mem: AgentMemory, turn_id: str) -> AgentMemory:
    """``mem`` with an abandoned branch: the turn's user message answered again, then the
    original branch taken back up."""
    head = mem.head
    user_entry = next(e for e in mem if e.turn_id == turn_id)
    alt = mem.fork(user_entry.id)
    alt.add_message("assistant", "an alternative answer", turn_id=turn_id)
    return alt.fork(head)


@dataclass
class Case:
    """A conversation and the context window a compactor is asked to fit it into."""

    conversation: Conversation
    window: int


@st.composite
def cases(
    draw: st.DrawFn,
    *,
    windows: tuple[int, int] = (1_000, 10_000),
    mid_round: bool | None = None,
) -> Case:
    """A :func:`conversations` example with a window drawn from ``windows`` (ends included).

    The default range makes about half of the drawn conversations exceed the window, so
    both the skip path and the compacting path are exercised.
    """
    conv = draw(conversations(mid_round=mid_round))
    return Case(conversation=conv, window=draw(st.integers(*windows)))


@dataclass(frozen=True)
class KeepTurns:
    """A ``keep_if`` predicate for tests: keeps the entries of ``turns`` (with ``role``,
    any role when ``None``). Readable in a falsifying example, and pure."""

    turns: frozenset[str]
    role: str | None = None

    def __call__(self, entry: Entry) -> bool:
        return entry.turn_id in self.turns and (self.role is None or entry.role == self.role)


@st.composite
def survival_rules(draw: st.DrawFn, *, max_turns: int = 5) -> SurvivalRules:
    """Survival rules over :func:`conversations`: ``keep_first_user`` and
    ``keep_current_request`` on or off, some of
    :data:`TOOL_NAMES` in ``keep_tools``, and maybe a :class:`KeepTurns` ``keep_if``."""
    from normandy_core.conversation.survival import SurvivalRules

    keep_if = None
    if draw(st.booleans()):
        turns = draw(st.frozensets(st.integers(1, max_turns), min_size=1, max_size=2))
        role = draw(st.sampled_from([None, "user", "assistant", "tool"]))
        keep_if = KeepTurns(frozenset(f"t{n}" for n in turns), role)
    return SurvivalRules(
        keep_first_user=draw(st.booleans()),
        keep_current_request=draw(st.booleans()),
        keep_tools=tuple(draw(st.lists(st.sampled_from(TOOL_NAMES), max_size=2, unique=True))),
        keep_if=keep_if,
    )
