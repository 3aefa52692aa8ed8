"""A scripted OpenAI Agents SDK model and tool for the adapter's tests (the edge: the LLM).

:class:`ScriptedModel` is a real ``agents.Model`` subclass: the ``Runner`` calls it through
the SDK's own machinery (sessions, input filters, tool execution). It records every input
list it receives, and answers by a fixed script: ``rounds`` tool rounds per user turn
(each a ``reasoning`` item, a short assistant message and the calls, every third round a
parallel pair of calls), then a final assistant message. Every output item carries an id
of its own, so tests can check kept items are unchanged.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

from agents import Model, ModelResponse, Usage, function_tool
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_reasoning_item import Summary

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


def chunk_text(n: int) -> str:
    """About 300 tokens of log text."""
    return f"chunk {n}: " + " ".join(WORDS[(n + i) % len(WORDS)] for i in range(240))


@function_tool
def read_chunk(n: int) -> str:
    """Read chunk ``n`` of the project's log (about 300 tokens of text)."""
    return chunk_text(n)


def _message(item_id: str, text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=item_id,
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(text=text, type="output_text", annotations=[])],
    )


class ScriptedModel(Model):
    """Answers by script; records (deep copies of) what it was sent in ``received``."""

    def __init__(self, rounds: int = 6) -> None:
        self.rounds = rounds
        self.received: list[list[Any]] = []
        self.calls = 0

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[Any],
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        self.received.append(copy.deepcopy(list(items)))
        k = self.calls
        self.calls += 1
        step = k % (self.rounds + 1)
        output: list[Any] = [
            ResponseReasoningItem(
                id=f"rs_{k}",
                type="reasoning",
                summary=[Summary(text=f"thinking {k}", type="summary_text")],
            )
        ]
        if step < self.rounds:
            width = 2 if step % 3 == 2 else 1
            output.append(_message(f"msg_{k}", f"reading {k}"))
            output.extend(
                ResponseFunctionToolCall(
                    id=f"fc_{k}_{j}",
                    call_id=f"call_{k}_{j}",
                    type="function_call",
                    name="read_chunk",
                    arguments=json.dumps({"n": k * 10 + j}),
                    status="completed",
                )
                for j in range(width)
            )
        else:
            output.append(_message(f"msg_{k}", f"answer {k}"))
        return ModelResponse(output=output, usage=Usage(), response_id=f"resp_{k}")

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model does not stream")


def _kind(item: Any) -> str:
    return str(item.get("type") or "message")


def is_output(item: Any) -> bool:
    return _kind(item).endswith("_output")


def pairing_problems(items: Sequence[Any]) -> list[str]:
    """What the Responses API would refuse in ``items``: an output whose call is not
    pending, or calls left unanswered when the conversation moves on."""
    problems: list[str] = []
    pending: set[str] = set()
    previous_output = False
    for i, item in enumerate(items):
        if is_output(item):
            if item["call_id"] not in pending:
                problems.append(f"item {i}: orphaned output {item['call_id']}")
            pending.discard(item["call_id"])
            previous_output = True
            continue
        if pending and (previous_output or item.get("role") == "user"):
            problems.append(f"item {i}: calls {sorted(pending)} unanswered")
            pending = set()
        previous_output = False
        if _kind(item) == "function_call":
            pending.add(item["call_id"])
    if pending:
        problems.append(f"end: calls {sorted(pending)} unanswered")
    return problems


def reasoning_problems(items: Sequence[Any]) -> list[str]:
    """A reasoning item without the model item that must follow it (an assistant message
    or a call), which the Responses API refuses. (A call whose reasoning was stripped is
    accepted.)"""
    return [
        f"item {i}: {item['id']} has no model item after it"
        for i, item in enumerate(items)
        if _kind(item) == "reasoning"
        and (
            i + 1 == len(items)
            or _kind(items[i + 1]) not in ("message", "function_call", "reasoning")
            or items[i + 1].get("role", "assistant") != "assistant"
        )
    ]


def key(item: Any) -> str:
    """An item's identity across requests: its id, or (for easy messages) its content."""
    if item.get("id"):
        return str(item["id"])
    if "call_id" in item:
        return f"{_kind(item)}:{item['call_id']}"
    return json.dumps(item, sort_keys=True)
