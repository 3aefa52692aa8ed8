"""A scripted Pydantic AI model and tool for the adapter's tests (the true edge: the LLM).

:class:`ScriptedFunction` is the function of a real ``FunctionModel``: the agent calls it
through Pydantic AI's own machinery (history processors, tool execution, retries). It
records every message list it receives, and answers by a fixed script: ``rounds`` tool
rounds per user prompt (every third round a parallel pair of calls), each response with
a thinking part, then a final text. Every response carries a provider response id and
metadata of its own, so tests can check they survive compaction.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo

WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
]


def read_chunk(n: int) -> str:
    """Read chunk ``n`` of the project's log (about 300 tokens of text)."""
    return f"chunk {n}: " + " ".join(WORDS[(n + i) % len(WORDS)] for i in range(240))


class ScriptedFunction:
    """The function of a ``FunctionModel``: answers by script, records what it was sent."""

    def __init__(self, rounds: int = 6, *, fixed_ids: bool = False) -> None:
        self.rounds = rounds
        self.fixed_ids = fixed_ids  # every call id the same per tool, as TestModel does
        self.received: list[list[ModelMessage]] = []
        self.snapshots: list[list[ModelMessage]] = []
        self.calls = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.received.append(list(messages))
        self.snapshots.append(copy.deepcopy(messages))
        k = self.calls
        self.calls += 1
        step = k % (self.rounds + 1)
        parts: list[Any] = [ThinkingPart(f"thinking {k}", signature=f"sig-{k}")]
        if step < self.rounds:
            width = 2 if step % 3 == 2 else 1
            parts.append(TextPart(f"reading {k}"))
            parts.extend(
                ToolCallPart(
                    "read_chunk",
                    {"n": k * 10 + j},
                    tool_call_id=f"call-read_chunk-{j}" if self.fixed_ids else f"call-{k}-{j}",
                )
                for j in range(width)
            )
        else:
            parts.append(TextPart(f"answer {k}"))
        return ModelResponse(
            parts=parts,
            model_name="scripted",
            provider_response_id=f"resp-{k}",
            metadata={"call": k},
        )


def pairing_problems(messages: Sequence[ModelMessage]) -> list[str]:
    """What a provider would refuse in ``messages``: a tool result that answers no call of
    the response right before it, or a call left without its result."""
    problems: list[str] = []
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        if isinstance(m, ModelRequest):
            answered = {
                p.tool_call_id
                for p in m.parts
                if isinstance(p, ToolReturnPart)
                or (isinstance(p, RetryPromptPart) and p.tool_name is not None)
            }
            for stray in sorted(answered - open_calls):
                problems.append(f"message {i}: orphaned result {stray}")
            for missing in sorted(open_calls - answered):
                problems.append(f"message {i}: call {missing} unanswered")
            open_calls = set()
        else:
            if open_calls:
                problems.append(f"message {i}: calls {sorted(open_calls)} unanswered")
            open_calls = {p.tool_call_id for p in m.parts if isinstance(p, ToolCallPart)}
    if open_calls:
        problems.append(f"end: calls {sorted(open_calls)} unanswered")
    return problems


def thinking_problems(messages: Sequence[ModelMessage]) -> list[str]:
    """Thinking parts outside a response, or a response whose thinking does not come first."""
    problems: list[str] = []
    for i, m in enumerate(messages):
        if isinstance(m, ModelResponse):
            kinds = [isinstance(p, ThinkingPart) for p in m.parts]
            if kinds and any(kinds) and kinds != sorted(kinds, reverse=True):
                problems.append(f"message {i}: thinking after other parts")
    return problems


def fingerprint(m: ModelMessage) -> Any:
    """What must survive compaction unchanged for a kept message: all of it."""
    return copy.deepcopy(m)
