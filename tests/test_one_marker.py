"""Issue 34 item 3 through :func:`normandy_core.compact`: a caller that compacts its
Chat Completions list before every request of 40 runs (two tool rounds each) sends one
marker in the last request, and every request holds the question it answers."""

from __future__ import annotations

from typing import Any

from normandy_core import compact

WINDOW = 3000
OPTS = {"reserved_tokens": 500, "counter": "cl100k_base"}
MARKER = "[normandy:marker]"


def _result(call: str, n: int) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call, "content": f"chunk {n}: " + "alpha bravo " * 120}


def _call(call: str, n: int) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call,
                "type": "function",
                "function": {"name": "read", "arguments": f'{{"n": {n}}}'},
            }
        ],
    }


def test_forty_runs_of_compact_leave_one_marker_in_the_last_request() -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You read logs."}]
    sent: list[list[dict[str, Any]]] = []
    compactions = 0

    def request(mid_round: bool) -> None:
        nonlocal messages, compactions
        result = compact(messages, window=WINDOW, opts=OPTS, model="gpt-4", mid_round=mid_round)
        assert result.error is None, result.error
        compactions += result.compacted
        messages = list(result.messages)
        sent.append(messages)

    for q in range(40):
        question = f"Question {q}: read the log."
        messages.append({"role": "user", "content": question})
        for r in range(2):
            request(mid_round=r > 0)
            assert question in [m["content"] for m in sent[-1] if m["role"] == "user"]
            call = f"call_{q}_{r}"
            messages += [_call(call, q * 10 + r), _result(call, q * 10 + r)]
        request(mid_round=True)
        messages.append({"role": "assistant", "content": f"answer {q}"})
    assert compactions >= 10
    markers = [
        m for m in sent[-1] if isinstance(m.get("content"), str) and m["content"].startswith(MARKER)
    ]
    assert len(markers) == 1, [m.get("content") for m in sent[-1]]
