"""What the fuzz campaign found once it covered the Responses API, decorated transcripts and
continuations (issue 13): a minimal reproducer each, failing until the defect is fixed.

Each test is ``xfail(strict=True)``: it fails today; when a fix makes it pass, pytest
reports the unexpected pass and the mark comes off. The campaign case that found it is
named in the docstring (``python scripts/fuzz.py --seed S --start I --max-cases 1``).
"""

from __future__ import annotations

from typing import Any

import pytest

from normandy_core import compact

LONG = "the build log says the test suite failed in module parser at line 88. " * 30


def _chat_round(n: int) -> list[dict[str, Any]]:
    cid = f"call_{n}"
    call = {"id": cid, "type": "function", "function": {"name": "read", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": cid, "content": f"{LONG}{n}"},
    ]


def _responses_round(n: int) -> list[dict[str, Any]]:
    return [
        {"type": "function_call", "call_id": f"call_{n}", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": f"call_{n}", "output": f"{LONG}{n}"},
    ]


@pytest.mark.xfail(
    strict=True,
    reason=(
        "a continuation renders anew every message an earlier call changed or inserted "
        "(cleared results, stripped thinking, markers, summaries): the caller gives back "
        "the object the last call returned and gets an equal new one (the sources of what "
        "write() rendered are not remembered); fresh=True returns the very objects"
    ),
)
def test_a_message_an_earlier_call_changed_comes_back_as_the_object_given() -> None:
    """Campaign: seed 7, indices 181 (pipeline, Responses: a cleared output), 178
    (window_manager, Anthropic: an assistant message without its thinking), 149 and 34
    (a summary and a marker), all ``continue-replace``; check ``identity``."""
    opts = {"trigger_tokens": 1_000, "keep": 1}
    messages = [{"role": "user", "content": "read the logs"}]
    for n in range(4):
        messages += _chat_round(n)
    first = compact(messages, compactor="clear_tool_results", opts=opts)
    assert first.compacted and first.meta["cleared"] == ["call_0", "call_1", "call_2"]
    rewritten = [m for m in first.messages if all(m is not g for g in messages)]
    assert len(rewritten) == 3  # the three cleared tool messages

    given = [*first.messages, *_chat_round(4)]  # the list returned, plus the next round
    second = compact(given, compactor="clear_tool_results", opts=opts)
    assert second.continued and second.compacted and second.meta["cleared"] == ["call_3"]
    for m in rewritten:  # kept unchanged by this call: the very object given
        assert any(x == m for x in second.messages)
        assert any(x is m for x in second.messages)


@pytest.mark.xfail(
    strict=True,
    reason=(
        "a batch bringing a newer provider compaction sends a continuation down the full "
        "path; with the caller's full history that re-reads and drops again what earlier "
        "calls dropped and reported, so hooks (the archive) receive those entries twice"
    ),
)
def test_a_newer_provider_compaction_does_not_report_earlier_drops_again() -> None:
    """Campaign: seed 7, indices 96 (pipeline, Responses) and 134 (window_manager
    summarize, Anthropic), ``continue-full``; check ``dropped_twice``."""
    kw: dict[str, Any] = {
        "window": 2_000,
        "opts": {"counter": "cl100k_base", "reserved_tokens": 0},
        "format": "responses",
    }
    history: list[dict[str, Any]] = [{"role": "user", "content": "read the logs"}]
    for n in range(6):
        history += _responses_round(n)
    first = compact(history, mid_round=True, **kw)
    assert first.compacted and first.dropped
    reported = {e.text() for e in first.dropped}

    history += [  # the agent keeps its full history; the provider compacted it meanwhile
        {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAA-summary"},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "go on"},
    ]
    second = compact(history, **kw)
    again = [e.text()[-12:] for e in second.dropped if e.text() in reported]
    assert not again, f"{len(again)} entries reported dropped by both calls: {again}"


@pytest.mark.xfail(
    strict=True,
    reason=(
        "window_manager's 'cannot fit' message leaves the shortened tool results out of its "
        "breakdown (a shortened entry counts 0 there), so the parts do not add up to the "
        "irreducible total it states; here the results of a pinned provider compaction's calls"
    ),
)
def test_the_irreducible_breakdown_adds_up_to_its_total() -> None:
    """Campaign: seed 7, index 3558 (window_manager summarize, Anthropic: '715 tokens are
    irreducible (... 3; ... 0; pinned entries 197; ... 169 ...)'), which the campaign first
    reported as ``needless_error_thinking`` (its estimate then left out the results a
    pinned entry's calls keep with it)."""
    import re

    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "check the three logs"},
        {
            "role": "assistant",
            "content": [
                {"type": "compaction", "content": "Earlier: the user asked for a release."},
                *(
                    {"type": "tool_use", "id": f"toolu_{k}", "name": "read", "input": {"k": k}}
                    for k in range(3)
                ),
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": LONG}
                for k in range(3)
            ],
        },
        {"role": "assistant", "content": "All three failed in the parser."},
    ]
    result = compact(messages, window=250, opts={"counter": "cl100k_base", "reserved_tokens": 0})
    assert result.error is not None
    found = re.search(
        r"([\d,]+) tokens are irreducible \(system prompt and tool definitions ([\d,]+); "
        r"system entries ([\d,]+); pinned entries ([\d,]+); newest unit and other kept "
        r"entries ([\d,]+)",
        result.error,
    )
    assert found, result.error
    total, *parts = (int(x.replace(",", "")) for x in found.groups())
    assert sum(parts) == total, result.error


def _sdk_valid(items: list[dict[str, Any]]) -> None:
    from fuzz.validators import validate_responses, validate_sdk

    assert validate_responses(items) == [] and validate_sdk("responses", items) == []


@pytest.mark.xfail(
    strict=True,
    reason=(
        "a local_shell_call_output as the Responses reference gives it (``id`` names the "
        "call, no ``call_id``) is refused: transcript.py reads every *_output by call_id"
    ),
)
def test_a_documented_local_shell_call_output_is_read() -> None:
    """Found writing the Responses validator from the API reference and the SDK's
    ``LocalShellCallOutput`` (``id``: "The unique ID of the local shell tool call
    generated by the model"; ``output``; ``status``)."""
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "list the files"},
        {
            "type": "local_shell_call",
            "id": "lsh_1",
            "call_id": "call_ls1",
            "status": "completed",
            "action": {"type": "exec", "command": ["ls"], "env": {}},
        },
        {"type": "local_shell_call_output", "id": "call_ls1", "output": '{"stdout": "a.py"}'},
        {"role": "assistant", "content": "One file: a.py."},
    ]
    _sdk_valid(items)
    result = compact(items, window=9_000, format="responses")
    assert result.messages == items


@pytest.mark.xfail(
    strict=True,
    reason=(
        "an output item whose type is not its call's type plus '_output' (tool_search_call "
        "and tool_search_output, in the SDK's ResponseInputItemParam) is refused as answering "
        "no call; other unknown items are carried as opaque"
    ),
)
def test_an_output_item_of_another_name_is_carried() -> None:
    """Found writing the Responses validator from the SDK's ``ResponseInputItemParam``
    (openai 3.57: ``ToolSearchCall``, ``ResponseToolSearchOutputItemParamParam``)."""
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "find a tool for the logs"},
        {
            "type": "tool_search_call",
            "id": "ts_1",
            "call_id": "call_ts1",
            "arguments": {"query": "logs"},
            "status": "completed",
        },
        {
            "type": "tool_search_output",
            "id": "tso_1",
            "call_id": "call_ts1",
            "tools": [],
            "status": "completed",
        },
        {"role": "assistant", "content": "No tool fits."},
    ]
    _sdk_valid(items)
    result = compact(items, window=9_000, format="responses")
    assert result.messages == items
