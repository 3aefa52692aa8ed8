"""``summarize`` with an async-only client under ``arun_turn`` (issue 12).

The summarizer ran ``client.acomplete`` with ``asyncio.run`` in a worker thread: a client
built on a shared ``httpx.AsyncClient`` (the way applications share one connection pool)
then used the pool from a second event loop and failed at every boundary, so the history
was never compacted. The async shell must run the summary on its own loop.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from normandy_core import AgentConfig, AgentMemory, ToolResultBlock, ToolUseBlock
from normandy_core.clients import AnthropicClient
from normandy_core.turn import arun_turn

anthropic = pytest.importorskip("anthropic", reason="needs the anthropic extra")
try:  # the HTTP client the SDK is built on (httpx2 in newer SDKs, httpx before)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    httpx = pytest.importorskip("httpx")
servers = sys.modules["normandy_client_test_servers"]  # loaded by conftest.py

TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
SUMMARY = "The agent read m0.py to m5.py; the bug is not found yet."
#: A model of these tests only: the calibration the provider's usage teaches stays here.
MODEL = "claude-async-summary-test"


@pytest.fixture(autouse=True)
def fresh_calibration() -> Any:
    from normandy_core.conversation.calibration import default_calibration

    default_calibration().reset(MODEL)
    yield
    default_calibration().reset(MODEL)


def history() -> AgentMemory:
    mem = AgentMemory()
    for t in range(6):
        mem.add_message("user", f"Look at m{t}.py.", turn_id=f"t{t}")
        use = ToolUseBlock(id=f"toolu_old_{t}", name="read_file", input={"path": f"m{t}.py"})
        mem.add_message("assistant", (use,), turn_id=f"t{t}")
        body = f"def f{t}(x):\n    return x + {t}\n" * 60
        mem.add_message(
            "user", (ToolResultBlock(tool_use_id=use.id, content=body),), turn_id=f"t{t}"
        )
        mem.add_message("assistant", f"m{t}.py adds {t}.", turn_id=f"t{t}")
    return mem


def read_file(path: str) -> str:
    return f"# {path}\n" + "x = 1\n" * 300  # the batch takes the history over the window


@pytest.mark.parametrize("compaction_timeout", [None, 30.0])
def test_an_async_only_client_on_a_shared_httpx_pool_summarizes_under_arun_turn(
    compaction_timeout,
):
    script = [
        {"tools": [("read_file", {"path": "z.py"})]},  # the turn's first call
        {"text": SUMMARY},  # the summary, asked at the boundary after the tool batch
        {"text": "Found it."},  # the turn's last call
    ]
    with servers.FakeProvider("anthropic", script) as provider:
        # HTTP/1.1 keep-alive, as real APIs answer: the pool keeps the connection open
        provider.server.RequestHandlerClass.protocol_version = "HTTP/1.1"

        async def main() -> Any:
            async with httpx.AsyncClient() as shared:
                sdk = anthropic.AsyncAnthropic(
                    api_key="test-key",
                    base_url=provider.base_url,
                    http_client=shared,
                    max_retries=0,
                )
                client = servers.AsyncOnly(AnthropicClient(MODEL, async_client=sdk))
                acc = AgentConfig(
                    model=MODEL,
                    system_prompt="You are a coding agent.",
                    tools=TOOLS,
                    compactor="window_manager",
                    compactor_opts={
                        "strategy": "summarize",
                        "summarizer": "model",
                        "context_window": 5_000,
                        "reserved_tokens": 1_000,
                        "summary_timeout": 10,
                        # the boundaries this test expects are the mid-round ones
                        "round_aware": False,
                        # the history is sized for three characters a token
                        "counter": "conservative",
                    },
                    client=client,
                    compaction_timeout=compaction_timeout,  # the compactor in its own thread
                ).with_memory(history())
                return await asyncio.wait_for(
                    arun_turn(acc, "Find the bug.", client=client, tools={"read_file": read_file}),
                    timeout=60,
                )

        result = asyncio.run(main())
    boundaries = result.events_of("boundary")
    assert [b["mid_round"] for b in boundaries] == [False, True]
    meta = boundaries[1]["meta"]
    assert "error" not in meta, meta["error"]
    assert meta["compacted"] is True
    summary = result.acc.memory[meta["summary_id"]].text()
    assert summary.startswith("[normandy:summary] ") and summary.endswith("\n" + SUMMARY)
    assert result.text == "Found it."
    assert provider.refusals == []
    assert len(provider.requests) == 3


def test_a_summary_past_its_timeout_is_cancelled_on_the_turn_loop():
    """The summary runs on the turn's loop; past ``summary_timeout`` it is cancelled there."""
    from normandy_core import TextBlock
    from normandy_core.clients import ModelReply
    from normandy_window_manager.summarize import SUMMARY_SYSTEM_PROMPT

    cancelled: list[bool] = []
    replies = iter(
        [
            ModelReply(
                content=(ToolUseBlock(id="toolu_new", name="read_file", input={"path": "z"}),),
                stop_reason="tool_use",
            ),
            ModelReply(content=(TextBlock(text="Found it."),)),
        ]
    )

    class Hanging:
        async def acomplete(self, system: str, *args: Any, **kwargs: Any) -> Any:
            if system == SUMMARY_SYSTEM_PROMPT:
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    cancelled.append(True)
                    raise
            return next(replies)

    client = Hanging()
    acc = AgentConfig(
        model=MODEL,
        tools=TOOLS,
        compactor="window_manager",
        compactor_opts={
            "strategy": "summarize",
            "summarizer": "model",
            "context_window": 5_000,
            "reserved_tokens": 1_000,
            "summary_timeout": 0.3,
            # the boundaries this test expects are the mid-round ones
            "round_aware": False,
            # the history is sized for three characters a token
            "counter": "conservative",
        },
        client=client,
    ).with_memory(history())

    async def main() -> Any:
        result = await arun_turn(acc, "Find it.", client=client, tools={"read_file": read_file})
        await asyncio.sleep(0.05)  # let the cancellation reach the task
        return result

    result = asyncio.run(main())
    meta = result.events_of("boundary")[1]["meta"]
    assert "did not answer within 0.3 s" in meta["error"]
    assert result.text == "Found it."
    assert cancelled == [True]
