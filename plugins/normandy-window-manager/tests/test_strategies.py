"""window_manager on a realistic session, per strategy, selected by name through the core."""

from __future__ import annotations

import math

import pytest

from normandy_core import (
    AgentConfig,
    AgentMemory,
    OptionsError,
    ToolResultBlock,
    ToolUseBlock,
    get_counter,
    pairing_problems,
    resolve_compactor,
    run_compaction,
)
from normandy_core.app.workload import SYSTEM_PROMPT, TOOLS, generate_session

WINDOW = 60_000


def make_acc(strategy: str, messages: int = 300, client=None, **opts) -> AgentConfig:
    acc = AgentConfig(
        client=client,
        model="claude-sonnet-4-5",
        system_prompt=SYSTEM_PROMPT,
        tools=TOOLS,
        compactor="window_manager",
        compactor_opts={
            "strategy": strategy,
            "context_window": WINDOW,
            "counter": "cl100k_base",
            **opts,
        },
    )
    return acc.with_memory(generate_session(7, messages, end_mid_round=True))


def test_resolved_from_the_installed_distribution():
    comp = resolve_compactor("window_manager")
    assert comp.distribution == "normandy-window-manager"
    assert comp.module == "normandy_window_manager.compactor"
    assert comp.needs_window({}) is True


def check_result(acc, new_acc, meta, strategy):
    counter = get_counter("cl100k_base")
    assert meta["compacted"] is True
    assert meta["strategy"] == strategy
    kept = list(new_acc.memory)
    assert pairing_problems(kept) == []
    assert not any(e.has_thinking for e in kept)
    assert kept[0].role == "system"
    usable = WINDOW - 4096
    assert meta["tokens_before"] == acc.memory.tokens(counter)
    assert meta["tokens_after"] == new_acc.memory.tokens(counter)
    assert meta["tokens_after"] + acc.prompt_tokens <= 0.6 * usable
    assert meta["target_met"] is True
    return kept


def test_oldest_first_drops_whole_units_oldest_first():
    acc = make_acc("oldest_first")
    new_acc, meta = run_compaction(acc, mid_round=True)
    kept = check_result(acc, new_acc, meta, "oldest_first")
    original = [e.id for e in acc.memory]
    dropped = [e.id for e in meta["dropped"]]
    # the task (the first user message) survives, by default
    assert kept[1].id == original[1] and kept[1].role == "user"
    # a contiguous oldest prefix (after the system prompt and the task) is dropped
    assert dropped == original[2 : 2 + len(dropped)]
    # the newest entries are all kept, under their ids
    assert [e.id for e in kept][-10:] == original[-10:]
    # the open round (last assistant tool use + its results) is intact
    assert kept[-1].tool_results and kept[-2].tool_uses


def test_sliding_window_keeps_the_newest_turns():
    acc = make_acc("sliding_window", keep_last_turns=1)
    last_turn = acc.memory.last().turn_id
    new_acc, meta = run_compaction(acc, mid_round=False)
    kept = check_result(acc, new_acc, meta, "sliding_window")
    task = next(e for e in acc.memory if e.role == "user")
    assert kept[1].id == task.id  # the first user message survives, by default
    turns = {e.turn_id for e in kept[2:] if not e.metadata}
    assert turns == {last_turn}


def test_summarize_replaces_the_prefix_with_one_summary_entry():
    acc = make_acc("summarize", summary_max_tokens=800)
    new_acc, meta = run_compaction(acc, mid_round=True)
    kept = check_result(acc, new_acc, meta, "summarize")
    assert kept[1].id == acc.memory.entries()[1].id  # the task, kept by default
    summary = kept[2]
    assert summary.id == meta["summary_id"]
    assert summary.metadata["normandy.summary"] is True
    assert summary.role == "user"
    assert summary.turn_id not in {e.turn_id for e in acc.memory}
    assert summary.metadata["summarized_ids"] == [e.id for e in meta["dropped"]]
    text = summary.text()
    assert "\nDone and verified:\n" in text and "\n- read_file(" in text
    assert "\nTask and constraints:\n- " in text
    assert get_counter("cl100k_base").count_text(text) <= 800

    # a second summary folds the first one in
    more = new_acc.memory.copy()
    for e in generate_session(8, 200):
        if e.role != "system":
            more.add_message(e.role, e.content, id="x" + e.id, turn_id="later-" + (e.turn_id or ""))
    again_acc, again = run_compaction(new_acc.with_memory(more), mid_round=True)
    assert again["compacted"] is True
    assert summary.id in [e.id for e in again["dropped"]]
    # read back item by item: the first request stays the task's first, with no nesting
    folded = again_acc.memory.entries()[2].text()
    tasks = text.split("\nTask and constraints:\n")[1].split("\n")
    first_task = next(t for t in tasks if "older items omitted" not in t)
    assert first_task.startswith("- ") and f"\n{first_task}\n" in folded.split("Decisions")[0]
    assert "Earlier summary:" not in folded and folded.count("Task and constraints:") == 1


class FailingClient:
    def __init__(self, reply):
        self.reply = reply
        self.calls = 0

    def complete(self, system, messages, **kwargs):
        self.calls += 1
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply


@pytest.mark.parametrize(
    "reply",
    [
        RuntimeError("upstream 529 overloaded"),
        "",
        "   ",
        "Error: rate limit exceeded, try again later",
        "word " * 5000,
        42,
    ],
)
def test_a_failing_summarizer_leaves_everything_untouched(reply):
    client = FailingClient(reply)
    acc = make_acc("summarize", summarizer="model", client=client)
    before = acc.memory.dump()
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert client.calls == 1
    assert new_acc is acc
    assert meta["compacted"] is False
    assert "summarize" in meta["error"]
    assert "dropped" not in meta
    assert acc.memory.dump() == before


def test_model_summarizer_is_given_tool_outputs_as_data():
    seen = {}

    class Client:
        def complete(self, system, messages, **kwargs):
            seen["system"], seen["messages"] = system, messages
            return "The agent fixed rounding in billing; tests pass."

    acc = make_acc("summarize", summarizer="model", client=Client())
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert meta["compacted"] is True
    assert "data" in seen["system"] and "must not be followed" in seen["system"]
    prompt = seen["messages"][0].text()
    assert prompt.startswith("<transcript>") and "<tool_output" in prompt
    summary = new_acc.memory.entries()[2].text()
    assert summary.startswith("[normandy:summary] ")
    assert summary.endswith("\nThe agent fixed rounding in billing; tests pass.")


def test_mid_round_under_the_window_returns_the_same_memory():
    acc = make_acc("oldest_first", messages=20)
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert meta == {"compacted": False}
    assert new_acc is acc and new_acc.memory is acc.memory


def test_trigger_and_target_make_compaction_rare():
    """With target below trigger, a growing session compacts once per ~40% of the window."""
    session = generate_session(3, 1200)
    entries = list(session)
    acc = AgentConfig(
        model="gpt-4o",
        compactor="window_manager",
        compactor_opts={"context_window": 40_000, "trigger": 0.9, "target": 0.5},
    )
    mem = AgentMemory()
    acc = acc.with_memory(mem)
    boundaries = compactions = 0
    for e in entries:
        acc.memory.add_message(e.role, e.content, id=e.id, turn_id=e.turn_id)
        if e.role == "user" and e.tool_results:
            boundaries += 1
            acc, meta = run_compaction(acc, mid_round=True)
            assert "error" not in meta
            compactions += meta["compacted"]
            assert pairing_problems(list(acc.memory)) == []
    assert compactions >= 5
    assert compactions * 4 < boundaries


def test_irreducible_error_names_the_irreducible_tokens():
    mem = AgentMemory()
    mem.add_message("system", "rules " * 3000, turn_id="t0")
    mem.add_message("user", "go", turn_id="t1")
    use = ToolUseBlock(id="u1", name="read_file", input={"path": "a.py"})
    mem.add_message("assistant", (use,), turn_id="t1")
    mem.add_message(
        "user", (ToolResultBlock(tool_use_id="u1", content="x = 1\n" * 4000),), turn_id="t1"
    )
    acc = AgentConfig(
        model="m",
        compactor="window_manager",
        compactor_opts={"context_window": 5000, "reserved_tokens": 0},
    ).with_memory(mem)
    before = mem.dump()
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert new_acc is acc and mem.dump() == before
    assert meta["compacted"] is False
    assert "irreducible" in meta["error"] and "system entries" in meta["error"]
    assert meta["irreducible_tokens"] > 5000


def test_shortening_keeps_head_tail_and_reports_the_original():
    mem = AgentMemory()
    mem.add_message("user", "read it", turn_id="t1")
    use = ToolUseBlock(id="u1", name="read_file", input={"path": "big.log"})
    mem.add_message("assistant", (use,), turn_id="t1")
    body = "HEAD-LINE\n" + ("log line with some words\n" * 3000) + "TAIL-LINE"
    big = mem.add_message("user", (ToolResultBlock(tool_use_id="u1", content=body),), turn_id="t1")
    acc = AgentConfig(
        compactor="window_manager", compactor_opts={"context_window": 8000, "reserved_tokens": 1000}
    )
    acc = acc.with_memory(mem)
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert meta["compacted"] is True
    assert meta["shortened"] == [big.id]
    kept = new_acc.memory[big.id]
    text = kept.tool_results[0].text()
    assert text.startswith("HEAD-LINE") and text.endswith("TAIL-LINE")
    assert "cut by normandy window_manager" in text
    assert next(e for e in meta["dropped"] if e.id == big.id) == big


@pytest.mark.parametrize(
    ("opts", "fragment"),
    [
        ({"strategy": "newest_first"}, "option 'strategy'"),
        ({"trigger": 1.5}, "option 'trigger'"),
        ({"target": 0.9, "trigger": 0.8}, "target (0.9) must not exceed trigger (0.8)"),
        ({"keep_last_turns": 2}, "keep_last_turns applies only to strategy 'sliding_window'"),
        ({"summary_max_tokens": 500}, "apply only to strategy 'summarize'"),
        ({"counter": "no-such-encoding"}, "option 'counter'"),
        ({"reserved": 10}, "unknown option; did you mean 'reserved_tokens'? allowed options:"),
        ({"context_window": 0}, "option 'context_window'"),
    ],
)
def test_bad_options_are_refused_at_config_time(opts, fragment):
    with pytest.raises(OptionsError) as err:
        AgentConfig(model="claude-sonnet-4-5", compactor="window_manager", compactor_opts=opts)
    message = str(err.value)
    assert message.startswith("normandy_core.AgentConfig(): compactor 'window_manager'")
    assert fragment in message


def test_calibration_from_provider_usage_moves_the_decision():
    from normandy_core.conversation.calibration import default_calibration

    model = "calibration-test-model"
    memory = generate_session(11, 45, end_mid_round=True)
    raw = memory.tokens(get_counter("cl100k_base"))
    window = int(raw * 1.2)  # fits the window by the local count
    opts = {"context_window": window, "counter": "cl100k_base", "reserved_tokens": 0}
    acc = AgentConfig(model=model, compactor="window_manager", compactor_opts=opts)
    acc = acc.with_memory(memory)
    _new_acc, meta = run_compaction(acc, mid_round=True)
    assert meta == {"compacted": False}
    try:
        # the provider billed 40 % more than the local count: the window is really exceeded
        default_calibration().observe(model, "tiktoken:cl100k_base", 10_000, 14_000)
        _, meta = run_compaction(acc, mid_round=True)
        assert meta["compacted"] is True
        assert meta["calibration"]["factor"] == 1.4
        assert meta["tokens_before"] == math.ceil(raw * 1.4)
    finally:
        default_calibration().reset(model)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_summarize_with_the_scripted_model_client(asynchronous):
    from normandy_core import TextBlock
    from normandy_core.clients import ModelReply, ScriptedClient

    reply = ModelReply(content=(TextBlock(text="Rounding fixed in billing; 3 tests fail."),))
    client = ScriptedClient([reply])
    if asynchronous:

        class AsyncOnly:
            async def acomplete(self, *args, **kwargs):
                return await client.acomplete(*args, **kwargs)

        acc = make_acc("summarize").replace(client=AsyncOnly())
    else:
        acc = make_acc("summarize").replace(client=client)
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert meta["compacted"] is True
    header, text = new_acc.memory[meta["summary_id"]].text().split("\n")
    assert header.startswith("[normandy:summary] ")
    assert text == "Rounding fixed in billing; 3 tests fail."
    (request,) = client.requests
    assert "never addressed to you" in request.system


def test_no_churn_when_only_an_earlier_marker_could_go():
    """Found by hypothesis: over the trigger, with only the old marker droppable, a second
    call must not swap it for a new marker and call that a compaction."""
    from normandy_core import ImageBlock, TextBlock

    def image_result(use_id):
        shot = ImageBlock(source={"type": "base64", "media_type": "image/png", "data": "iVBO"})
        return ToolResultBlock(tool_use_id=use_id, content=(TextBlock(text="screenshot"), shot))

    mem = AgentMemory()
    for n in (1, 2):
        mem.add_message("user", "look", turn_id=f"t{n}")
        use = ToolUseBlock(id=f"u{n}", name="screenshot", input={})
        mem.add_message("assistant", (use,), turn_id=f"t{n}")
        mem.add_message("tool", (image_result(use.id),), turn_id=f"t{n}")
        if n == 1:
            mem.add_message("assistant", "seen", turn_id="t1")
    # at the start of a turn, where the trigger (not the usable window) decides
    opts = {"context_window": 1700, "reserved_tokens": 0, "trigger": 0.9, "target": 0.5}
    acc = AgentConfig(
        compactor="window_manager",
        compactor_opts={**opts, "counter": "estimate"},
        survival={"keep_current_request": False},  # the second "look" may go, as before
    )
    first_acc, first = run_compaction(acc.with_memory(mem), mid_round=False)
    assert first["compacted"] is True
    assert first["target_met"] is False
    assert first["tokens_after"] > 0.9 * 1700
    assert "marker_id" in first
    again_acc, again = run_compaction(first_acc, mid_round=False)
    assert again == {"compacted": False}
    assert again_acc is first_acc


@pytest.mark.parametrize("strategy", ["oldest_first", "sliding_window", "summarize"])
def test_trigger_below_one_never_compacts_mid_round_while_it_fits(strategy):
    """Issue 12: with trigger 0.8 a conversation at 91 % of the usable window was compacted
    mid-round. The contract: mid-round, the memory stays unchanged while it fits; the
    trigger applies at the start of a turn."""
    memory = generate_session(7, 40, end_mid_round=True)
    acc = make_acc(strategy, trigger=0.8, target=0.5).with_memory(memory)
    size = memory.tokens(get_counter("cl100k_base")) + acc.prompt_tokens
    usable = int(size / 0.91)
    acc = acc.replace(compactor_opts={**acc.compactor_opts, "context_window": usable + 4096})
    new_acc, meta = run_compaction(acc, mid_round=True)
    assert meta == {"compacted": False}
    assert new_acc is acc
    # at the start of a turn the trigger decides: 91 % is over 0.8
    _, meta = run_compaction(acc, mid_round=False)
    assert meta["compacted"] is True
    # mid-round and over the usable window: compacted down to target
    tight = acc.replace(compactor_opts={**acc.compactor_opts, "context_window": size - 1 + 4096})
    _, meta = run_compaction(tight, mid_round=True)
    assert meta["compacted"] is True and meta["target_met"] is True


@pytest.mark.parametrize("strategy", ["oldest_first", "sliding_window"])
def test_the_marker_is_part_of_the_budget(strategy):
    """Issue 12: three 300-character messages, window 4,096+213, target 1.0: the cut stopped
    at the target, the marker added after crossed the window, and the compaction failed
    ("230 tokens are irreducible") though dropping the assistant message leaves 104."""
    mem = AgentMemory()
    for n, role in enumerate(("user", "assistant", "user")):
        mem.add_message(role, chr(ord("a") + n) * 300, turn_id=f"t{n}")
    opts = {"context_window": 4096 + 213, "target": 1.0, "counter": "conservative"}
    if strategy == "sliding_window":
        opts["keep_last_turns"] = 2
    acc = AgentConfig(
        compactor="window_manager",
        compactor_opts={"strategy": strategy, **opts},
        survival={"keep_first_user": False},  # the marker's budget, not the task's
    )
    new_acc, meta = run_compaction(acc.with_memory(mem), mid_round=False)
    assert "error" not in meta, meta["error"]
    assert meta["compacted"] is True and meta["target_met"] is True
    assert [e.id for e in new_acc.memory] == [mem.last().id]
    assert meta["tokens_after"] == 104


def test_summarize_falls_back_to_dropping_when_no_summary_fits():
    """Issue 12: ten messages, window 100, reserve 30: summarize failed ("irreducible")
    while oldest_first fits at 38 tokens. With no room for even a minimal summary it
    drops as oldest_first does, and says so in meta."""
    mem = AgentMemory()
    for n in range(10):
        role = "user" if n % 2 == 0 else "assistant"
        mem.add_message(role, f"message {n}: " + "some words here " * 3, turn_id=f"t{n // 2}")
    opts = {"context_window": 100, "reserved_tokens": 30, "counter": "estimate"}
    results = {}
    for strategy in ("oldest_first", "summarize"):
        acc = AgentConfig(compactor="window_manager", compactor_opts={"strategy": strategy, **opts})
        results[strategy] = run_compaction(acc.with_memory(mem), mid_round=False)
    (plain_acc, plain), (new_acc, meta) = results["oldest_first"], results["summarize"]
    assert "error" not in meta, meta["error"]
    assert meta["compacted"] is True and meta["strategy"] == "summarize"
    assert "room" in meta["summary_fallback"] and "summary_id" not in meta
    # the same entries (a marker is new each time, so compared by its text)
    assert [e.text() for e in new_acc.memory] == [e.text() for e in plain_acc.memory]
    assert new_acc.memory.entries()[0].id == mem.entries()[0].id  # the task survives
    assert meta["tokens_after"] == plain["tokens_after"] <= 70


@pytest.mark.parametrize("mid_round", [False, True])
def test_summarize_succeeds_wherever_oldest_first_does(mid_round):
    """The summary is sized to the room left after the kept units (at most
    summary_max_tokens) and is part of the budget, so summarize never fails where
    oldest_first fits."""
    counter = get_counter("cl100k_base")
    memory = generate_session(5, 60, end_mid_round=True)
    probe = make_acc("oldest_first").with_memory(memory)
    size = memory.tokens(counter) + probe.prompt_tokens
    sized_summaries = 0
    for percent in (2, 3, 4, 5, 10, 15, 20, 25, 30, 40, 50, 60, 75, 90, 100, 120, 150):
        window = max(size * percent // 100, 1) + 4096
        acc = probe.replace(compactor_opts={**probe.compactor_opts, "context_window": window})
        _, plain = run_compaction(acc, mid_round=mid_round)
        if "error" in plain:
            continue
        opts = {**acc.compactor_opts, "strategy": "summarize"}
        new_acc, meta = run_compaction(acc.replace(compactor_opts=opts), mid_round=mid_round)
        assert "error" not in meta, (percent, meta["error"])
        assert meta["compacted"] == plain["compacted"], percent
        if meta["compacted"]:
            assert meta["tokens_after"] + acc.prompt_tokens <= window - 4096, percent
        if "summary_id" in meta:
            tokens = counter.count_text(new_acc.memory[meta["summary_id"]].text())
            sized_summaries += tokens < 1024
    assert sized_summaries > 0  # some summaries were sized below summary_max_tokens


@pytest.mark.parametrize("summarizer", ["extractive", "model"])
def test_summarize_falls_back_when_the_budget_cannot_hold_the_header(summarizer):
    """summary_max_tokens=64 under a counter calibrated at 2.0: the summary's first line
    alone would be over budget. It drops as oldest_first instead of failing."""
    from normandy_core.conversation.calibration import default_calibration

    model = "header-budget-test-model"
    mem = generate_session(3, 40, end_mid_round=True)
    opts = {
        "strategy": "summarize",
        "summarizer": summarizer,
        "summary_max_tokens": 64,
        "counter": "conservative",
        "context_window": 9_000,
    }

    class Client:
        def complete(self, system, messages, **kwargs):
            raise AssertionError("no room for a model summary: the model is not asked")

    acc = AgentConfig(
        model=model, compactor="window_manager", compactor_opts=opts, client=Client()
    ).with_memory(mem)
    try:
        default_calibration().observe(model, "conservative", 10_000, 20_000)
        _, meta = run_compaction(acc, mid_round=False)
    finally:
        default_calibration().reset(model)
    assert "error" not in meta, meta["error"]
    assert meta["compacted"] is True and "summary_id" not in meta
    assert "cannot hold a summary" in meta["summary_fallback"]


def test_thinking_the_commit_strips_is_not_counted_as_irreducible():
    """Found by the fuzz campaign: kept entries were budgeted with the thinking blocks the
    commit strips, so a reply whose thinking alone overflowed the window was reported
    'irreducible' although the stripped history fits."""
    from normandy_core import compact

    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "x " * 2000, "signature": "sig"},
                {"type": "text", "text": "done"},
            ],
        },
    ]
    result = compact(messages, model="claude-sonnet-4-5", window=500, opts={"reserved_tokens": 0})
    assert result.error is None, result.error
    assert result.compacted
    assert result.messages[-1]["content"] in ("done", [{"type": "text", "text": "done"}])


def test_an_error_result_of_invisible_characters_only_is_summarized():
    """Found by the fuzz campaign: an error tool result made only of characters that
    normalisation removes (zero-width, soft hyphens) raised IndexError in the summary."""
    from normandy_core import ToolResultBlock
    from normandy_window_manager.summarize import _outcome

    block = ToolResultBlock(tool_use_id="t1", content="\u200b\u00ad\u200d", is_error=True)
    assert _outcome(block) == "error: " + _outcome_quote("")


def _outcome_quote(text: str) -> str:
    from normandy_window_manager.summarize import _quoted

    return _quoted(text, 160)
