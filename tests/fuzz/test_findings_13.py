"""What the fuzz campaign found once it covered the Responses API, decorated transcripts and
continuations (issue 13): a minimal reproducer each, now a regression test.

Each was an ``xfail(strict=True)`` reproducer until its fix landed; all are fixed now.
The campaign case that found each is named in its docstring (reproduce it with
``python scripts/fuzz.py --seed S --start I --max-cases 1``).
"""

from __future__ import annotations

from typing import Any

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


def _clear_a_then_b(history: list[dict[str, Any]], opts: dict[str, Any], *kept: Any) -> None:
    """Grow ``history`` (a continued list) by three rounds, compacting at each with
    ``clear_tool_results``: ``a`` and ``b`` are cleared in turn, each of ``kept`` comes
    back as the very object given every time."""
    cleared: list[str] = []
    for n in range(3):
        history += [{"role": "user", "content": f"more {n}"}, *_responses_round(n)]
        result = compact(history, compactor="clear_tool_results", opts=opts, format="responses")
        cleared += result.meta.get("cleared", [])
        for item in kept:
            assert any(m is item for m in result.messages), item
    assert cleared[:2] == ["a", "b"] and result.continued


def test_an_item_kept_beside_a_result_cleared_twice_stays_the_object_given() -> None:
    """Campaign: seed 21, index 31 (clear_tool_results, Responses, ``continue-full``): a
    results entry holding an ``mcp_approval_response`` beside outputs, cleared over two
    calls; the second rebuild rendered the approval anew. Check ``identity``."""
    opts = {"trigger_tokens": 1_000, "keep": 2}  # a, then b, cleared in later calls
    approval = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {
            "type": "mcp_approval_request",
            "id": "mcpr_1",
            "server_label": "s",
            "name": "t",
            "arguments": "{}",
        },
        {"type": "function_call", "call_id": "a", "name": "read", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "read", "arguments": "{}"},
        approval,
        {"type": "function_call_output", "call_id": "a", "output": LONG + "a"},
        {"type": "function_call_output", "call_id": "b", "output": LONG + "b"},
    ]
    _clear_a_then_b(history, opts, approval)


def test_an_item_beside_calls_whose_inputs_are_cleared_twice_stays_the_object_given() -> None:
    """Campaign: seed 47, index 50360 (pipeline ``clear_tool_results`` with
    ``clear_tool_inputs``, Responses, ``continue-full``): an assistant run holding a
    message of two text parts, two calls and a ``file_search_call``; the second call to
    clear one of its inputs rendered the search call anew (the first rebuild's items no
    longer lined up with the entry's blocks). Check ``identity``."""
    opts = {"trigger_tokens": 1_000, "keep": 2, "clear_tool_inputs": True}  # a, then b
    search = {"type": "file_search_call", "id": "fs_1", "status": "completed", "queries": ["q"]}
    text = [{"type": "output_text", "text": t, "annotations": []} for t in ("One.", "Two.")]
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"type": "message", "id": "msg_1", "role": "assistant", "content": text},
        {"type": "function_call", "call_id": "a", "name": "read", "arguments": '{"p": 1}'},
        {"type": "function_call", "call_id": "b", "name": "read", "arguments": '{"p": 2}'},
        search,
        {"type": "function_call_output", "call_id": "a", "output": LONG + "a"},
        {"type": "function_call_output", "call_id": "b", "output": LONG + "b"},
    ]
    _clear_a_then_b(history, opts, search, history[1])  # its message: unchanged too


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
        r"system entries ([\d,]+); pinned entries ([\d,]+); "
        r"(?:keep_first_user \(the first user message\) ([\d,]+); )?"
        r"(?:keep_current_request \(the user message that opened the current turn\) ([\d,]+); )?"
        r"newest unit and other kept "
        r"entries ([\d,]+), after shortening tool results(?:; the (?:marker|summary) ([\d,]+))?",
        result.error,
    )
    assert found, result.error
    total, *parts = (int(x.replace(",", "")) for x in found.groups() if x is not None)
    assert sum(parts) == total, result.error


def _sdk_valid(items: list[dict[str, Any]]) -> None:
    from fuzz.validators import validate_responses, validate_sdk

    assert validate_responses(items) == [] and validate_sdk("responses", items) == []


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


def test_the_campaign_counts_an_opaque_call_with_its_output_as_the_newest_unit() -> None:
    """Campaign: seed 23, index 7882 (pipeline, Responses, summarize): the newest entry
    holds the outputs of a ``shell_call`` and a ``computer_call``, which window_manager
    rightly keeps with their calls; the campaign's estimate of what no compaction may
    drop counted the outputs alone and called the irreducible error needless. The
    oracle now pairs opaque calls and outputs as the core does."""
    from fuzz import campaign

    assert campaign.run_indexed(23, 7882).findings == []
    rng = campaign.case_rng(23, 7882)
    c = campaign._draw_case(rng, 23, 7882, campaign.CaseReport(23, 7882), None)
    entries = c.memory.entries()
    counter = campaign.get_counter(c.counter)
    last_two = sum(counter.count_entry(e) for e in entries[-2:])
    system = sum(counter.count_entry(e) for e in entries if e.role == "system")
    # and the first user message and the current request, which the default survival
    # rules keep
    task = campaign._task_index(entries)
    request = campaign._request_index(entries)
    assert task is not None and task < len(entries) - 2
    assert request is not None and request < len(entries) - 2
    users = sum(counter.count_entry(entries[i]) for i in {task, request})
    assert campaign._minimal_tokens(c, thinking=True) == system + last_two + users
