"""Sessions, configs and clients shared by the native compactors' tests."""

from __future__ import annotations

import sys
from typing import Any

from normandy_core import AgentConfig, AgentMemory, ToolResultBlock, ToolUseBlock
from normandy_core.clients import AnthropicClient, OpenAIClient

servers = sys.modules["normandy_client_test_servers"]  # loaded by conftest.py

MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-4o"}
NAMES = {"anthropic": "anthropic_native", "openai": "openai_native"}
TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
    {
        "name": "search",
        "description": "Search the code.",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
]
WINDOW = 8_000
OPTS = {"context_window": WINDOW, "reserved_tokens": 1_000, "counter": "cl100k_base"}


def source(r: int, lines: int = 110) -> str:
    """A distinct file body of about ``lines`` lines (tokenizes like code)."""
    return "".join(f"def f{r}_{k}(x):\n    return x * {k} + {r}\n" for k in range(lines))


def add_rounds(
    mem: AgentMemory, start: int, count: int, turn: str, tool: str = "read_file"
) -> None:
    """``count`` rounds: a tool call, its result, a short answer."""
    for r in range(start, start + count):
        name = tool if r % 3 else "search"
        mem.add_message(
            "assistant",
            (ToolUseBlock(id=f"u{r}", name=name, input={"path": f"m{r}.py"}),),
            id=f"a{r}",
            turn_id=turn,
        )
        mem.add_message(
            "user",
            (ToolResultBlock(tool_use_id=f"u{r}", content=source(r)),),
            id=f"r{r}",
            turn_id=turn,
        )
        mem.add_message("assistant", f"m{r}.py holds f{r}.", id=f"s{r}", turn_id=turn)


def session(rounds: int = 6, *, ask: str | None = "Now look at the tests.") -> AgentMemory:
    """The system prompt, the task, ``rounds`` rounds, and the user's new message."""
    mem = AgentMemory()
    mem.add_message("system", "You are a coding agent.", id="sys", turn_id="t0")
    mem.add_message("user", "Fix the parser in m2.py.", id="task", turn_id="t1")
    add_rounds(mem, 0, rounds, "t1")
    if ask is not None:
        mem.add_message("user", ask, id="ask", turn_id="t2")
    return mem


def client(kind: str, provider: Any, **kw: Any) -> Any:
    """The real SDK client of ``kind`` on the loopback ``provider`` (no retries)."""
    if kind == "anthropic":
        return AnthropicClient(
            MODELS[kind], api_key="test-key", base_url=provider.base_url, max_retries=0, **kw
        )
    kw.setdefault("api", "responses")
    return OpenAIClient(
        MODELS[kind], api_key="test-key", base_url=provider.base_url, max_retries=0, **kw
    )


def config(
    kind: str, model_client: Any, memory: AgentMemory | None = None, **kw: Any
) -> AgentConfig:
    """A config of ``kind``'s native compactor holding ``memory`` (default: :func:`session`)."""
    opts = {**OPTS, **kw.pop("opts", {})}
    acc = AgentConfig(
        model=kw.pop("model", MODELS[kind]),
        system_prompt="You are a coding agent.",
        tools=TOOLS,
        compactor=NAMES[kind],
        compactor_opts=opts,
        client=model_client,
        **kw,
    )
    return acc.with_memory(memory if memory is not None else session())
