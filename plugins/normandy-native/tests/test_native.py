"""anthropic_native and openai_native against the loopback providers (real SDK clients,
real HTTP, real tokenizer, the SQLite archive at tmp_path): a compaction through the
provider, the compaction kept byte for byte across later calls (sync and async turns),
a second compaction superseding the first, the survival rules, every fallback named in
meta, and the options refused where the config is made."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from native_helpers import (
    MODELS,
    NAMES,
    OPTS,
    add_rounds,
    client,
    config,
    servers,
    session,
    source,
)

from normandy_core import (
    AgentConfig,
    AgentMemory,
    OpaqueBlock,
    OptionsError,
    SurvivalRules,
    first_user_entry,
    run_compaction,
)
from normandy_core.clients import OpenAIClient
from normandy_core.conversation.keys import PROVIDER_COMPACTION_KEY
from normandy_core.turn import arun_turn, run_turn
from normandy_native.common import MARKER_KEY
from normandy_native.options import ANTHROPIC_MIN_TRIGGER

pytest.importorskip("anthropic", reason="needs the anthropic extra")
pytest.importorskip("openai", reason="needs the openai extra")
from normandy_archive import Archive

KINDS = ["anthropic", "openai"]


def issued(provider: Any, item: dict[str, Any]) -> bool:
    """Whether ``item`` is, key for key and byte for byte, one the provider made."""
    return json.dumps(item, sort_keys=True) in provider.issued


def compaction_of(acc: AgentConfig) -> Any:
    found = [e for e in acc.memory.entries() if e.metadata.get(PROVIDER_COMPACTION_KEY)]
    assert len(found) == 1, [e.id for e in acc.memory.entries()]
    return found[0]


def same(a: Any, b: Any) -> bool:
    """The same message: id, role, content and pin (the branch links are the memory's)."""
    return (a.id, a.role, a.content, a.pinned) == (b.id, b.role, b.content, b.pinned)


def read_file(path: str) -> str:
    return source(int("".join(c for c in path if c.isdigit()) or 0), 30)


# -- one compaction -------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_provider_compacts_and_the_originals_are_archived(kind: str, archive: Path) -> None:
    with servers.FakeProvider(kind) as provider:
        acc = config(kind, client(kind, provider))
        before = {e.id: e for e in acc.memory.entries()}
        new_acc, meta = run_compaction(acc, mid_round=False)
    assert provider.refusals == []
    assert meta.compacted, meta
    assert meta["native"] is True and meta["provider"] == kind
    assert meta["strategy"] == NAMES[kind]
    summarized = [i for i in before if i not in ("sys", "task", "ask")]
    assert meta["summarized_ids"] == summarized
    assert meta["kept_by_rules"] == ["task"]
    assert [e.id for e in meta.dropped] == summarized
    assert meta["provider_usage"]["input_tokens"] > 0
    # system, a note opening the history, the compaction (pinned), then the task and the
    # new message exactly as they were: the provider ignores what precedes a compaction
    entries = new_acc.memory.entries()
    cmp = compaction_of(new_acc)
    assert cmp.pinned and cmp.id == meta["compaction_id"]
    assert [e.id for e in entries] == ["sys", entries[1].id, cmp.id, "task", "ask"]
    assert entries[1].metadata.get(MARKER_KEY) and entries[1].role == "user"
    assert same(entries[3], before["task"]) and same(entries[4], before["ask"])
    assert first_user_entry(entries).id == "task"
    (block,) = cmp.blocks
    assert isinstance(block, OpaqueBlock) and block.kind == "compaction"
    assert issued(provider, block.data)
    # what went over the wire: the summarized entries only, as the API documents
    body = provider.requests[0]
    if kind == "anthropic":
        assert provider.paths == ["/v1/messages"]
        assert body["compaction"] == {"type": "summarize"}
        assert "context_management" not in body and "tool_choice" not in body
        assert provider.headers[0]["anthropic-beta"] == "compact-2026-09-04"
        sent = json.dumps(body["messages"])
        assert "Fix the parser" not in sent and "Now look at the tests" not in sent
        assert sent.count("tool_use_id") == 6
    else:
        assert provider.paths == ["/v1/responses/compact"]
        assert body["instructions"] == "You are a coding agent."
        assert not any(
            i.get("role") == "user" and "Fix the parser" in str(i) for i in body["input"]
        )
        assert [i.get("type") for i in body["input"]].count("function_call_output") == 6
    # the archive keeps the readable originals the provider's compaction replaced
    archived = Archive(archive)
    for e in meta.dropped:
        got = archived.recall(e.id)
        assert got is not None and got.content == before[e.id].content


@pytest.mark.parametrize("kind", KINDS)
def test_under_the_trigger_nothing_is_sent(kind: str) -> None:
    with servers.FakeProvider(kind) as provider:
        acc = config(kind, client(kind, provider), session(1))
        new_acc, meta = run_compaction(acc, mid_round=False)
    assert not meta.compacted and new_acc.memory is acc.memory
    assert provider.requests == []


# -- later calls ----------------------------------------------------------------------


def _wire_compactions(kind: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    if kind == "anthropic":
        return [
            b
            for m in body["messages"]
            if isinstance(m["content"], list)
            for b in m["content"]
            if b.get("type") == "compaction"
        ]
    return [i for i in body["input"] if i.get("type") == "compaction"]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_compaction_goes_back_byte_for_byte_on_every_later_call(kind: str, mode: str) -> None:
    script = [
        {"tools": [("read_file", {"path": "m7.py"})]},
        {"text": "The parser is fixed."},
        {"text": "The tests pass."},
    ]
    with servers.FakeProvider(kind, script) as provider:
        acc = config(kind, client(kind, provider), session(ask=None))
        kwargs: dict[str, Any] = {
            "client": acc.client,
            "tools": {"read_file": read_file},
            "budget": 100_000,
        }
        if mode == "sync":
            first = run_turn(acc, "Now look at the tests.", **kwargs)
            second = run_turn(first.acc, "Run them.", **kwargs)
        else:

            async def main() -> tuple[Any, Any]:
                a = await arun_turn(acc, "Now look at the tests.", **kwargs)
                return a, await arun_turn(a.acc, "Run them.", **kwargs)

            first, second = asyncio.run(main())
    assert provider.refusals == []
    assert first.text == "The parser is fixed." and second.text == "The tests pass."
    (boundary,) = [b for b in first.events_of("boundary") if b["meta"]["compacted"]]
    assert boundary["meta"]["native"] is True
    assert len(provider.issued) == 1
    (made,) = provider.issued
    model_calls = provider.requests[1:]
    assert len(model_calls) == 3
    for body in model_calls:  # each later request carries it exactly as made, and first
        (sent,) = _wire_compactions(kind, body)
        assert json.dumps(sent, sort_keys=True) == made
        if kind == "anthropic":
            assert body["messages"][0]["content"][0] == sent
            assert (
                "compact-2026-09-04"
                in provider.headers[provider.requests.index(body)]["anthropic-beta"]
            )
        else:
            users = [i for i in body["input"][: body["input"].index(sent)]]
            assert all(i.get("role") == "user" for i in users)
    # the memory still holds it unaltered, pinned, after two turns
    cmp = compaction_of(second.acc)
    assert cmp.pinned and json.dumps(cmp.blocks[0].data, sort_keys=True) == made
    assert first_user_entry(second.acc.memory.entries()).id == "task"


@pytest.mark.parametrize("kind", KINDS)
def test_a_second_compaction_supersedes_the_first(kind: str, archive: Path) -> None:
    with servers.FakeProvider(kind) as provider:
        model_client = client(kind, provider)
        acc = config(kind, model_client)
        once, meta1 = run_compaction(acc, mid_round=False)
        assert meta1.compacted and meta1["native"]
        first_cmp = compaction_of(once)
        mem = once.memory.derive(once.memory.entries())
        add_rounds(mem, 10, 6, "t3")
        mem.add_message("user", "And the lexer?", id="ask2", turn_id="t4")
        twice, meta2 = run_compaction(once.with_memory(mem), mid_round=False)
    assert provider.refusals == []
    assert meta2.compacted and meta2["native"], meta2
    second_cmp = compaction_of(twice)
    assert second_cmp.id != first_cmp.id and second_cmp.pinned
    # the first compaction was sent back as made, summarized again, and reported dropped
    assert issued(provider, first_cmp.blocks[0].data)
    assert first_cmp.blocks[0].data in _wire_compactions(kind, provider.requests[1])
    assert first_cmp.id in [e.id for e in meta2.dropped]
    ids = [e.id for e in twice.memory.entries()]
    assert ids.index(second_cmp.id) < ids.index("task") < ids.index("ask2") == len(ids) - 1
    assert first_user_entry(twice.memory.entries()).id == "task"
    assert Archive(archive).recall(first_cmp.id) is not None


# -- survival rules -------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_what_the_rules_keep_follows_the_compaction_unchanged(kind: str) -> None:
    mem = session(9)
    pinned = next(e for e in mem.entries() if e.id == "s4")
    mem = mem.derive(
        [e.model_copy(update={"pinned": True}) if e is pinned else e for e in mem.entries()]
    )
    rules = SurvivalRules(keep_tools=("search",))
    with servers.FakeProvider(kind) as provider:
        acc = config(kind, client(kind, provider), mem, survival=rules)
        new_acc, meta = run_compaction(acc, mid_round=False)
    assert provider.refusals == []
    assert meta.compacted and meta["native"], meta
    before = {e.id: e for e in mem.entries()}
    kept = {e.id: e for e in new_acc.memory.entries()}
    search_rounds = [f"{x}{r}" for r in (0, 3, 6) for x in "ar"]
    for eid in ["task", "s4", *search_rounds]:
        assert same(kept[eid], before[eid]), eid
    assert sorted(meta["kept_by_rules"]) == sorted(["task", "s4", *search_rounds])
    ids = [e.id for e in new_acc.memory.entries()]
    after = ids[ids.index(compaction_of(new_acc).id) + 1 :]
    assert after == ["task", "a0", "r0", "a3", "r3", "s4", "a6", "r6", "ask"]
    sent = json.dumps(provider.requests[0])
    assert "f0_1(x)" not in sent and "f3_1(x)" not in sent and "f1_1(x)" in sent


def _big_users(n: int, rounds: int = 0) -> AgentMemory:
    """The task, then ``n`` long user messages (pasted logs) with short answers, then
    ``rounds`` tool rounds."""
    mem = AgentMemory()
    mem.add_message("system", "You are a coding agent.", id="sys", turn_id="t0")
    mem.add_message("user", "Fix the parser in m2.py.", id="task", turn_id="t1")
    mem.add_message("assistant", "Send me the logs.", id="s0", turn_id="t1")
    for k in range(n):
        log = "".join(f"[{k}:{i}] parse error at line {i * 7 + k}\n" for i in range(260))
        mem.add_message("user", log, id=f"log{k}", turn_id=f"t{k + 2}")
        mem.add_message("assistant", f"Log {k} read.", id=f"ok{k}", turn_id=f"t{k + 2}")
    add_rounds(mem, 20, rounds, "t8")
    mem.add_message("user", "What now?", id="ask", turn_id="t9")
    return mem


def test_openai_copies_of_user_messages_never_pass_for_the_task() -> None:
    """/responses/compact returns the user messages; too large with them, the fallback
    cuts further, and the task it keeps is the real one, not a returned copy."""
    mem = _big_users(3)
    with servers.FakeProvider("openai", [{"text": "Summary: three logs of parse errors."}]) as p:
        acc = config("openai", client("openai", p), mem)
        new_acc, meta = run_compaction(acc, mid_round=False)
    assert p.refusals == []
    assert meta.compacted, meta
    assert meta["native"] is True and meta["then"]["fallback_cause"] == "too_large"
    entries = new_acc.memory.entries()
    assert same(first_user_entry(entries), mem.entries()[1])
    assert "task" in [e.id for e in entries]
    assert compaction_of(new_acc).pinned
    gone = {e.id for e in meta.dropped}
    assert {"log0", "log1", "log2"} <= gone and "task" not in gone


def test_openai_returned_copies_are_marked_when_the_task_follows() -> None:
    mem = _big_users(1, rounds=4)
    with servers.FakeProvider("openai") as p:
        acc = config("openai", client("openai", p), mem)
        new_acc, meta = run_compaction(acc, mid_round=False)
    assert meta.compacted and meta["native"] and "then" not in meta, meta
    entries = new_acc.memory.entries()
    copies = [e for e in entries if e.metadata.get("normandy.provider_rebuilt")]
    assert [c.text() for c in copies] == [mem.entries()[3].text()]
    assert copies[0].id != "log0" and "log0" in {e.id for e in meta.dropped}
    assert first_user_entry(entries).id == "task"


# -- fallbacks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "cause"),
    [("refuse", "refused"), ("overloaded", "unreachable")],
)
@pytest.mark.parametrize("kind", KINDS)
def test_a_refusing_or_failing_provider_falls_back_to_window_manager(
    kind: str, mode: str, cause: str
) -> None:
    with servers.FakeProvider(kind, [{"text": "A summary."}], compaction=mode) as provider:
        acc = config(kind, client(kind, provider))
        new_acc, meta = run_compaction(acc, mid_round=False)
    assert meta.compacted, meta
    assert meta["native"] is False
    assert meta["fallback"] == "window_manager" and meta["fallback_cause"] == cause
    assert meta["strategy"] == NAMES[kind] and meta["fallback_strategy"] == "summarize"
    assert ("refused" if mode == "refuse" else "529" if kind == "anthropic" else "503") in (
        meta["fallback_reason"]
    )
    assert not any(e.metadata.get(PROVIDER_COMPACTION_KEY) for e in new_acc.memory.entries())
    assert first_user_entry(new_acc.memory.entries()).id == "task"
    # the summary is the model's when the provider answers; an unreachable one is not
    # asked again (the fallback writes its summary offline)
    summary_requests = [r for r in provider.requests if "compaction" not in r]
    if kind == "openai":
        summary_requests = [r for r in summary_requests if "max_output_tokens" in r]
    assert len(summary_requests) == (1 if cause == "refused" else 0)


@pytest.mark.parametrize("kind", KINDS)
def test_an_unsupported_model_falls_back_and_is_not_asked_again(kind: str) -> None:
    with servers.FakeProvider(kind, no_compaction=(MODELS[kind],)) as provider:
        opts = {"fallback_opts": {"strategy": "oldest_first", "reserved_tokens": 1_000}}
        acc = config(kind, client(kind, provider), opts=opts)
        new_acc, meta = run_compaction(acc, mid_round=False)
        asked = len(provider.requests)
        _, meta2 = run_compaction(new_acc.with_memory(acc.memory), mid_round=False)
    assert meta.compacted and meta["native"] is False
    assert meta["fallback_cause"] == "unsupported" and "does not support" in meta["fallback_reason"]
    assert meta["fallback"] == "window_manager" and meta["fallback_strategy"] == "oldest_first"
    assert meta2["fallback_cause"] == "unsupported"
    assert len(provider.requests) == asked == 1  # remembered per model by this config


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("kind", KINDS)
def test_an_unreachable_provider_falls_back_offline(kind: str) -> None:
    class Down:
        base_url = f"http://127.0.0.1:{_closed_port()}" + ("/v1" if kind == "openai" else "")

    acc = config(kind, client(kind, Down()))
    new_acc, meta = run_compaction(acc, mid_round=False)
    assert meta.compacted, meta
    assert meta["fallback_cause"] == "unreachable" and meta["native"] is False
    assert first_user_entry(new_acc.memory.entries()).id == "task"


def test_a_chat_completions_client_cannot_send_a_compaction_item_back() -> None:
    with servers.FakeProvider("openai") as provider:
        chat = client("openai", provider, api="chat")
        acc = config("openai", chat, opts={"fallback_opts": {"strategy": "oldest_first"}})
        _, meta = run_compaction(acc, mid_round=False)
    assert meta.compacted and meta["fallback_cause"] == "unsupported"
    assert "api='responses'" in meta["fallback_reason"]
    assert provider.requests == []


@pytest.mark.parametrize("kind", KINDS)
def test_no_client_or_another_providers_client_falls_back(kind: str) -> None:
    opts = {"fallback_opts": {"strategy": "oldest_first"}}
    _, meta = run_compaction(config(kind, None, opts=opts), mid_round=False)
    assert meta["fallback_cause"] == "unsupported" and "no model client" in meta["fallback_reason"]
    other = OpenAIClient("gpt-4o", api="responses", api_key="k") if kind == "anthropic" else None
    if other is not None:
        _, meta = run_compaction(config(kind, other, opts=opts), mid_round=False)
        assert "not an Anthropic client" in meta["fallback_reason"]


@pytest.mark.parametrize("kind", KINDS)
def test_without_a_fallback_the_boundary_reports_an_error(kind: str) -> None:
    with servers.FakeProvider(kind, compaction="refuse") as provider:
        acc = config(kind, client(kind, provider), opts={"fallback": None})
        new_acc, meta = run_compaction(acc, mid_round=False)
    assert not meta.compacted and "no fallback is configured" in meta.error
    assert new_acc.memory.entries() == acc.memory.entries()


def test_anthropic_server_compaction_on_the_client_rules_out_on_demand() -> None:
    with servers.FakeProvider("anthropic") as provider:
        edits = client("anthropic", provider, context_management={"compact": {}})
        acc = config("anthropic", edits, opts={"fallback_opts": {"strategy": "oldest_first"}})
        _, meta = run_compaction(acc, mid_round=False)
    assert (
        meta["fallback_cause"] == "unsupported" and "server compaction" in meta["fallback_reason"]
    )
    assert provider.requests == []


# -- options --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "opts", "named"),
    [
        ("anthropic", {"trigger_tokens": ANTHROPIC_MIN_TRIGGER - 1}, "trigger_tokens"),
        ("anthropic", {"instructions": "   "}, "instructions"),
        ("anthropic", {"max_tokens": 0}, "max_tokens"),
        ("openai", {"trigger_tokens": 0}, "trigger_tokens"),
        ("openai", {"instructions": "Summarize."}, "instructions"),
        ("openai", {"timeout": 0}, "timeout"),
        ("anthropic", {"fallback": None, "fallback_opts": {"strategy": "summarize"}}, "fallback"),
        ("openai", {"fallback": "openai_native"}, "fallback"),
        ("anthropic", {"fallback": "no_such_compactor"}, "no_such_compactor"),
        ("openai", {"fallback_opts": {"strategy": "shred"}}, "strategy"),
        ("anthropic", {"reserved_tokens": 8_000}, "reserved_tokens"),
    ],
)
def test_options_are_refused_where_the_config_is_made(
    kind: str, opts: dict[str, Any], named: str
) -> None:
    with pytest.raises(OptionsError, match=named) as info:
        AgentConfig(model=MODELS[kind], compactor=NAMES[kind], compactor_opts={**OPTS, **opts})
    assert NAMES[kind] in str(info.value)


def test_the_documented_anthropic_minimum_is_accepted_and_capped_by_the_window() -> None:
    acc = AgentConfig(
        model=MODELS["anthropic"],
        compactor="anthropic_native",
        compactor_opts={**OPTS, "trigger_tokens": ANTHROPIC_MIN_TRIGGER},
    )
    assert acc.prepared.options.trigger_tokens == ANTHROPIC_MIN_TRIGGER
    assert acc.prepared.window == OPTS["context_window"]


def test_the_fallback_gets_the_configs_survival_rules() -> None:
    rules = SurvivalRules(keep_tools=("search",), summary_instructions="Keep every path.")
    acc = config("anthropic", None, survival=rules)
    assert acc.prepared.options.prepared_fallback.rules is rules
    # a fallback that writes no summary refuses the instructions, naming itself
    with pytest.raises(OptionsError, match=r"anthropic_native fallback.*summary_instructions"):
        config(
            "anthropic", None, survival=rules, opts={"fallback_opts": {"strategy": "oldest_first"}}
        )
    # /responses/compact takes no summarization prompt: openai_native refuses them
    with pytest.raises(OptionsError, match=r"openai_native.*summary_instructions"):
        config("openai", None, survival=rules)


def test_anthropic_sends_the_summary_instructions_with_the_compaction() -> None:
    rules = SurvivalRules(summary_instructions="Keep every file path verbatim.")
    with servers.FakeProvider("anthropic") as provider:
        acc = config("anthropic", client("anthropic", provider), survival=rules)
        _, meta = run_compaction(acc, mid_round=False)
        assert meta["native"] is True
        body = provider.requests[0]
    assert body["compaction"] == {"type": "summarize", "instructions": rules.summary_instructions}
    own = {"instructions": "Summarize for a parser fix."}
    with servers.FakeProvider("anthropic") as provider:
        acc = config("anthropic", client("anthropic", provider), survival=rules, opts=own)
        run_compaction(acc, mid_round=False)
    assert provider.requests[0]["compaction"]["instructions"] == own["instructions"]


def test_openai_does_not_compact_again_what_it_returns_anyway() -> None:
    """/responses/compact returns the user messages: once they are all that is left before
    the compaction, still over the trigger, a later boundary does not ask again (it would
    change nothing but cost a call at every boundary after it)."""
    mem = _big_users(1, rounds=2)
    with servers.FakeProvider("openai") as p:
        acc = config(
            "openai",
            client("openai", p),
            mem,
            opts={"trigger_tokens": 1_500},
            survival={"keep_first_user": False},
        )
        first_acc, first = run_compaction(acc, mid_round=False)
        assert first.compacted and first["native"], first
        entries = first_acc.memory.entries()
        # the returned user messages are the very entries (nothing the rules keep follows)
        assert not any(e.metadata.get("normandy.provider_rebuilt") for e in entries)
        assert {"task", "log0"} <= {e.id for e in entries}
        assert first.tokens_after > 1_500  # still over the trigger
        first_acc.memory.add_message("user", "Also, keep it short.", id="more", turn_id="t9")
        second_acc, second = run_compaction(first_acc, mid_round=False)
    assert p.paths.count("/v1/responses/compact") == 1
    assert not second.compacted and second.get("fallback_cause") == "nothing_to_summarize"
    assert second_acc.memory.entries() == first_acc.memory.entries()


# -- compaction on request ------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_on_request_the_provider_is_asked_under_the_trigger(kind: str) -> None:
    focus = "the parser fix in m2.py"
    with servers.FakeProvider(kind) as provider:
        acc = config(kind, client(kind, provider), session(1))
        assert not run_compaction(acc, mid_round=False).meta.compacted
        assert provider.requests == []  # under the trigger: nothing sent
        _, meta = run_compaction(acc, mid_round=False, force=True, focus=focus)
    assert meta.compacted and meta["native"] is True
    (body,) = provider.requests
    if kind == "anthropic":
        # the focus follows the summary instructions (none configured here)
        assert focus in body["compaction"]["instructions"]
        assert "focus_ignored" not in meta
    else:
        assert focus not in json.dumps(body)
        assert "takes no instructions" in meta["focus_ignored"]
