"""A scripted LangChain chat model and tool for the adapter's tests (the true edge: the LLM).

:class:`ScriptedChatModel` is a real ``BaseChatModel``: ``create_agent`` binds tools to it
and calls it through LangChain's own machinery. It records every message list it
receives, and answers by a fixed script: ``rounds`` tool rounds per user turn (every
third round a parallel pair of calls), then a final text. Every reply carries an id,
``additional_kwargs`` and ``response_metadata`` of its own, so tests can check they
survive compaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from pydantic import Field

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


@tool
def read_chunk(n: int) -> str:
    """Read chunk ``n`` of the project's log (about 300 tokens of text)."""
    return f"chunk {n}: " + " ".join(WORDS[(n + i) % len(WORDS)] for i in range(240))


class ScriptedChatModel(BaseChatModel):
    """Answers by script; records what it was sent in ``received``."""

    rounds: int = 6
    received: list[list[BaseMessage]] = Field(default_factory=list)
    calls: int = 0

    @property
    def _llm_type(self) -> str:
        return "normandy-scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:  # type: ignore[override]
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.received.append(list(messages))
        k = self.calls
        self.calls += 1
        step = k % (self.rounds + 1)
        meta = {"additional_kwargs": {"trace": k}, "response_metadata": {"call": k}}
        if step < self.rounds:
            width = 2 if step % 3 == 2 else 1
            calls = [
                {"name": "read_chunk", "args": {"n": k * 10 + j}, "id": f"call-{k}-{j}"}
                for j in range(width)
            ]
            reply = AIMessage(content=f"reading {k}", id=f"ai-{k}", tool_calls=calls, **meta)
        else:
            reply = AIMessage(content=f"answer {k}", id=f"ai-{k}", **meta)
        return ChatResult(generations=[ChatGeneration(message=reply)])


def pairing_problems(messages: Sequence[BaseMessage]) -> list[str]:
    """What a provider would refuse in ``messages``: a ``ToolMessage`` that answers no call
    of the ``AIMessage`` right before its batch, or a call left without its result."""
    problems: list[str] = []
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        if isinstance(m, ToolMessage):
            if m.tool_call_id not in open_calls:
                problems.append(f"message {i}: orphaned result {m.tool_call_id}")
            open_calls.discard(m.tool_call_id)
            continue
        if open_calls:
            problems.append(f"message {i}: calls {sorted(open_calls)} unanswered")
        open_calls = {c["id"] for c in m.tool_calls} if isinstance(m, AIMessage) else set()
        open_calls.discard(None)  # type: ignore[arg-type]
    if open_calls:
        problems.append(f"end: calls {sorted(open_calls)} unanswered")
    return problems


def fingerprint(m: BaseMessage) -> dict[str, Any]:
    """What must survive compaction unchanged for a kept message."""
    return {
        "type": m.type,
        "content": m.content,
        "additional_kwargs": m.additional_kwargs,
        "response_metadata": m.response_metadata,
        "tool_calls": [c["id"] for c in m.tool_calls] if isinstance(m, AIMessage) else None,
        "tool_call_id": m.tool_call_id if isinstance(m, ToolMessage) else None,
    }
