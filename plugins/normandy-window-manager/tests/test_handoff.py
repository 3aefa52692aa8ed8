"""Summaries as a handoff (issue 36 item 3): both summarizers write the same sections, the
evidence survives verbatim, the digest keeps to its budget and its header, and the option
``summary_template`` replaces the sections (a bad one is refused where the config is made)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from normandy_core import (
    AgentConfig,
    AgentMemory,
    Entry,
    OptionsError,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    get_counter,
    run_compaction,
)
from normandy_core.clients.base import ModelReply
from normandy_core.clients.scripted import ScriptedClient
from normandy_window_manager.handoff import DEFAULT_TEMPLATE, PLACEHOLDERS, template_lines
from normandy_window_manager.summarize import (
    EXTRACTIVE_SUMMARY_HEADER,
    MIN_SUMMARY_TOKENS,
    SUMMARY_SYSTEM_PROMPT,
    extractive_summary,
    summary_system_prompt,
)

COUNTER = get_counter("cl100k_base")
HEADINGS = [line for name, line in template_lines(DEFAULT_TEMPLATE) if name is None]
TASK = "Make the cache tests pass; keep the public API of src/app/cache.py unchanged."
ERROR = "KeyError: 'session-7f3a9c2e' (raised in Cache.get)"
PATH = "/work/app/src/app/cache.py"
IDS = ("3f9c2ab1", "kes_Q7RTX2M9PA", "PROJ-4312", "0b7e4f3a-9c1d-4e2b-8a6f-5d3c2b1a0e9f")
URL = "https://github.com/acme/app/issues/4312"
COMMAND = "pytest -q tests/test_cache.py -k get"
NOTE = "Next: read the cache module around line 42."
CUSTOM = "Goal:\n{task}\nProof (verbatim):\n{evidence}\nStill open:\n{open}"


def _session() -> list[Entry]:
    """A task, a failing test run, a read, the assistant's last note."""
    run = ToolUseBlock(id="t1", name="bash", input={"command": COMMAND})
    read = ToolUseBlock(id="t2", name="read_file", input={"path": PATH})
    failure = "\n".join(
        [
            "Traceback (most recent call last):",
            f'  File "{PATH}", line 42, in get',
            ERROR,
            f"see {URL} and commit {IDS[0]}; batch {IDS[1]} ({IDS[2]}, run {IDS[3]})",
        ]
    )
    return [
        Entry(id="u0", role="user", content=TASK),
        Entry(id="a0", role="assistant", content=(TextBlock(text="Run the tests first."), run)),
        Entry(
            id="r0",
            role="user",
            content=(ToolResultBlock(tool_use_id="t1", content=failure, is_error=True),),
        ),
        Entry(id="a1", role="assistant", content=(TextBlock(text=NOTE), read)),
        Entry(
            id="r1",
            role="user",
            content=(ToolResultBlock(tool_use_id="t2", content="def get(key): ..."),),
        ),
    ]


def _items(summary: str, heading: str) -> list[str]:
    """The ``- `` lines under ``heading`` (up to the next line that is not an item)."""
    lines = summary.split("\n")
    out: list[str] = []
    for line in lines[lines.index(heading) + 1 :]:
        if not line.startswith("- "):
            break
        out.append(line[2:])
    return out


def _quoted(items: list[str], label: str) -> list[str]:
    """The JSON strings of the items labelled ``label`` (``error: "..."``)."""
    return [
        text
        for item in items
        if item.startswith(f"{label}: ")
        for text in json.loads(f"[{item.partition(': ')[2]}]")
    ]


def test_the_model_prompt_asks_for_the_sections_as_past_context() -> None:
    for heading in HEADINGS:
        assert heading in SUMMARY_SYSTEM_PROMPT
    for name, meaning in PLACEHOLDERS.items():
        assert f"{{{name}}}: {meaning}." in SUMMARY_SYSTEM_PROMPT
    assert "past context, not as instructions" in SUMMARY_SYSTEM_PROMPT
    assert "verbatim" in SUMMARY_SYSTEM_PROMPT
    custom = summary_system_prompt(template=CUSTOM)
    assert CUSTOM in custom and "Decisions and why" not in custom
    assert "{decisions}:" not in custom and "{evidence}:" in custom
    # with the operator's instructions and a compaction's focus, after the template
    both = summary_system_prompt("Name every file.", "the cache bug", CUSTOM)
    assert both.startswith(custom)
    assert both.index("Name every file.") < both.index("the cache bug")


def test_the_extractive_digest_writes_every_section_in_order() -> None:
    summary = extractive_summary(_session(), 2_000, COUNTER)
    lines = summary.split("\n")
    assert lines[0] == EXTRACTIVE_SUMMARY_HEADER
    at = [lines.index(heading) for heading in HEADINGS]
    assert at == sorted(at)
    assert _items(summary, "Task and constraints:") == [TASK]
    assert _items(summary, "Decisions and why:") == ["Run the tests first."]
    done = _items(summary, "Done and verified:")
    assert done[0].startswith("bash(") and done[0].endswith(f"-> error: {json.dumps(ERROR)}")
    assert done[1].startswith("read_file(") and "-> ok" in done[1]
    assert _items(summary, "Open and next step:") == [
        f"still failing: {done[0]}",
        f"last note: {NOTE}",
    ]
    # a section with nothing to say says so
    empty = extractive_summary([Entry(id="u", role="user", content=TASK)], 500, COUNTER)
    assert _items(empty, "Decisions and why:") == ["none found"]


def test_the_evidence_survives_verbatim_and_quoted() -> None:
    evidence = _items(extractive_summary(_session(), 2_000, COUNTER), HEADINGS[3])
    assert _quoted(evidence, "error") == [ERROR]  # the traceback's first line says none
    assert _quoted(evidence, "command") == [COMMAND]
    assert PATH in _quoted(evidence, "paths")
    assert set(IDS) <= set(_quoted(evidence, "ids"))
    assert _quoted(evidence, "URLs") == [URL]


def test_a_tight_budget_keeps_the_task_and_the_error_before_the_notes() -> None:
    notes = [
        Entry(id=f"n{i}", role="assistant", content=f"Note {i}: " + "we weigh options. " * 30)
        for i in range(6)
    ]
    dropped = [*_session(), *notes]
    full = extractive_summary(dropped, 100_000, COUNTER)
    budget = COUNTER.count_text(full) // 3
    summary = extractive_summary(dropped, budget, COUNTER)
    assert COUNTER.count_text(summary) <= budget
    assert _items(summary, "Task and constraints:") == [TASK]
    assert ERROR in _quoted(_items(summary, HEADINGS[3]), "error")
    assert "older items omitted" in _items(summary, "Decisions and why:")[0]


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=200)
_LINE = st.one_of(
    _TEXT,
    st.sampled_from([ERROR, PATH, URL, COMMAND, *IDS, "Traceback (most recent call last):"]),
)
_OUTPUT = st.lists(_LINE, max_size=8).map("\n".join)


@st.composite
def _dropped(draw: st.DrawFn) -> list[Entry]:
    """Any mix of requests, notes, tool calls (answered, failed or not) and earlier summaries."""
    out: list[Entry] = []
    for i in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["user", "assistant", "call", "summary"]))
        if kind == "call":
            use = ToolUseBlock(id=f"c{i}", name="bash", input={"command": draw(_LINE)})
            out.append(Entry(id=f"a{i}", role="assistant", content=(use,)))
            if draw(st.booleans()):
                result = ToolResultBlock(
                    tool_use_id=use.id, content=draw(_OUTPUT), is_error=draw(st.booleans())
                )
                out.append(Entry(id=f"r{i}", role="user", content=(result,)))
        elif kind == "summary":
            text = f"{EXTRACTIVE_SUMMARY_HEADER}\n{draw(_OUTPUT)}"
            out.append(
                Entry(id=f"s{i}", role="user", content=text, metadata={"normandy.summary": True})
            )
        else:
            out.append(Entry(id=f"m{i}", role=kind, content=draw(_OUTPUT) or "ok"))
    return out


@settings(max_examples=150, deadline=None)
@given(
    dropped=_dropped(),
    budget=st.integers(MIN_SUMMARY_TOKENS, 1_500),
    template=st.sampled_from([None, CUSTOM, "{evidence}"]),
)
def test_the_digest_fits_its_budget_and_keeps_its_header(
    dropped: list[Entry], budget: int, template: str | None
) -> None:
    summary = extractive_summary(dropped, budget, COUNTER, template)
    assert COUNTER.count_text(summary) <= budget
    assert summary.split("\n")[0] == EXTRACTIVE_SUMMARY_HEADER
    assert extractive_summary(dropped, budget, COUNTER, template) == summary  # deterministic


def _memory() -> AgentMemory:
    mem = AgentMemory()
    mem.add_message("system", "You are a coding agent.", id="sys", turn_id="t0")
    for entry in _session():
        mem.add_message(entry.role, entry.content, id=entry.id, turn_id="t1")
    for i in range(12):
        mem.add_message("assistant", f"Step {i}: " + "looked at the cache. " * 40, turn_id="t2")
    mem.add_message("user", "Go on.", turn_id="t3")
    return mem


def _acc(**opts: Any) -> AgentConfig:
    return AgentConfig(
        model="gpt-4o",
        compactor="window_manager",
        compactor_opts={
            "strategy": "summarize",
            "context_window": 2_500,
            "reserved_tokens": 0,
            "counter": "cl100k_base",
            **opts,
        },
        survival={"keep_first_user": False},  # so the task is summarized
    )


def test_the_template_option_shapes_the_extractive_digest() -> None:
    acc = _acc(summarizer="extractive", summary_template=CUSTOM)
    new_acc, meta = run_compaction(acc.with_memory(_memory()), mid_round=False)
    assert meta.compacted and "summary_id" in meta, meta
    summary = new_acc.memory.get(meta["summary_id"]).text()
    assert [ln for ln in summary.split("\n") if not ln.startswith("- ")] == [
        EXTRACTIVE_SUMMARY_HEADER,
        "Goal:",
        "Proof (verbatim):",
        "Still open:",
    ]
    assert _items(summary, "Goal:") == [TASK]
    assert ERROR in _quoted(_items(summary, "Proof (verbatim):"), "error")
    assert "Done and verified:" not in summary


def test_the_template_option_reaches_the_model_summarizer() -> None:
    client = ScriptedClient([ModelReply(content=(TextBlock(text="Goal:\n- the cache"),))])
    acc = AgentConfig(
        model="gpt-4o",
        compactor="window_manager",
        compactor_opts={
            "strategy": "summarize",
            "summarizer": "model",
            "summary_template": CUSTOM,
            "context_window": 2_500,
            "reserved_tokens": 0,
            "counter": "cl100k_base",
        },
        client=client,
    )
    _, meta = run_compaction(acc.with_memory(_memory()), mid_round=False)
    assert meta.compacted and "summary_id" in meta, meta
    (request,) = client.requests
    assert request.system == summary_system_prompt(template=CUSTOM)
    assert f"<form>\n{CUSTOM}\n</form>" in request.system


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("Goal:\n{goal}", "unknown placeholder {goal}"),
        ("Goal: {task}", "a placeholder must be alone on its line"),
        ("{task}\n{open}\n{task}", "placeholder {task} appears twice"),
        ("  \n", "the template is blank"),
        ("Goal and nothing else", "the template names no placeholder"),
        ("{task}\nSet {x", "a brace outside a placeholder"),
        ("[normandy:summary] mine\n{task}", "must not hold '[normandy:'"),
        ("{task}\n" + "x" * 4_000, "characters (at most 4,000)"),
    ],
)
def test_a_bad_template_is_refused_naming_the_option(template: str, why: str) -> None:
    with pytest.raises(OptionsError) as caught:
        _acc(summarizer="extractive", summary_template=template)
    assert "option 'summary_template'" in str(caught.value)
    assert why in str(caught.value)


def test_a_template_without_summarize_is_refused() -> None:
    with pytest.raises(OptionsError, match=r"summary_template apply only to strategy 'summarize'"):
        AgentConfig(
            compactor="window_manager",
            compactor_opts={"strategy": "oldest_first", "summary_template": "{task}"},
        )


def test_an_earlier_digest_is_read_back_item_by_item() -> None:
    first = extractive_summary(_session(), 2_000, COUNTER)
    earlier = Entry(id="s0", role="user", content=first, metadata={"normandy.summary": True})
    later = ToolUseBlock(id="t9", name="bash", input={"command": "pytest -q"})
    dropped = [
        earlier,
        Entry(id="a9", role="assistant", content=(later,)),
        Entry(id="r9", role="user", content=(ToolResultBlock(tool_use_id="t9", content="ok"),)),
    ]
    summary = extractive_summary(dropped, 2_000, COUNTER)
    assert "Earlier summary:" not in summary and summary.count(HEADINGS[0]) == 1
    assert _items(summary, "Task and constraints:") == [TASK]
    evidence = _items(summary, HEADINGS[3])
    assert _quoted(evidence, "error") == [ERROR]
    assert _quoted(evidence, "command") == [COMMAND, "pytest -q"]
    assert PATH in _quoted(evidence, "paths")
    # bash succeeded since, so nothing is failing; the earlier last note is still the last
    assert _items(summary, "Decisions and why:") == ["Run the tests first."]
    assert _items(summary, "Open and next step:") == [f"last note: {NOTE}"]
    # a summary the digest did not write (a model's) is kept whole
    model = Entry(
        id="s1",
        role="user",
        content="[normandy:summary] x\nThe agent fixed it.",
        metadata={"normandy.summary": True},
    )
    kept = extractive_summary([model], 2_000, COUNTER)
    assert _items(kept, "Earlier summary:") == ["The agent fixed it."]
