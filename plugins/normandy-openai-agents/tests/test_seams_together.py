"""NormandySession and NormandyInputFilter used together report each item once (issue 32, case 7).

The SDK keeps nothing the input filter returns, so the session's store still held what
the filter dropped; the next run's ``get_items()`` compacted the store and reported the
same calls and outputs again, under new entry ids (``call_1``... twice in the docs' own
example, and again at every run). The page promises that nothing is dropped (or
archived) twice and that each dropped item reaches the ``after_compact`` hooks once.

Real OpenAI Agents SDK runs (``Runner``, ``SQLiteSession``, the SDK's tool execution),
the real archive hook on SQLite in a temporary directory, a recording ``after_compact``
hook plugin; the model is the only stand-in (the docs' own scripted model, or
:class:`oa_scripted.ScriptedModel`).

An item is counted by its identity in the conversation: a tool call and its output by
``call_id`` (through the hooks' entries), a model item by its ``id`` and an input
message by its content (through each compaction's ``removed`` items). The notes the
compactor inserts (markers) are Normandy's own, not items of the conversation.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, SQLiteSession
from agents.memory import SessionSettings
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from doc_blocks import ROOT, blocks
from hypothesis import HealthCheck, given, settings, strategies as st
from oa_scripted import pairing_problems, read_chunk
from reliability_counts import AGENTS_DOC_RUNS, AGENTS_RUN_ORDERS

import normandy_core
from normandy_archive import Archive
from normandy_core import hookimpl
from normandy_openai_agents import AgentsCompaction, NormandyInputFilter, NormandySession

PAGE = ROOT / "docs" / "plugins" / "openai-agents.md"


class Dropped:
    """An ``after_compact`` hook plugin registered in code: the entries of each call."""

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []

    @hookimpl
    def after_compact(self, acc: Any, ctx: Any, meta: dict[str, Any]) -> None:
        self.calls.append(list(meta["dropped"]))

    def per_call_id(self) -> Counter[str]:
        """How often each tool call and each output reached the hook, by ``call_id``."""
        seen: Counter[str] = Counter()
        for dropped in self.calls:
            for entry in dropped:
                seen.update(f"call {use.id}" for use in entry.tool_uses)
                seen.update(f"output {result.tool_use_id}" for result in entry.tool_results)
        return seen


@pytest.fixture
def hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Dropped]:
    """The recording hook, beside the archive hook writing to a fresh SQLite file."""
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(tmp_path / "archive.sqlite3"))
    monkeypatch.delenv("NORMANDY_ARCHIVE_URL", raising=False)
    monkeypatch.delenv("NORMANDY_ARCHIVE_SESSION", raising=False)
    monkeypatch.chdir(tmp_path)  # the docs' example writes conversations.sqlite3 here
    recorder = Dropped()
    name = normandy_core.register_hook(recorder, "seams-together-recorder")
    yield recorder
    normandy_core.unregister_hook(name)


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def _item_key(item: Any) -> str | None:
    """An item's identity: its id, its ``call_id`` and kind, or an input message's
    content; ``None`` for a note the compactor inserted."""
    kind = _field(item, "type") or "message"
    if _field(item, "id"):
        return f"{kind} {_field(item, 'id')}"
    if _field(item, "call_id"):
        return f"{kind} {_field(item, 'call_id')}"
    content = _field(item, "content")
    parts = content if isinstance(content, list) else [{"text": content}]
    if any(str(_field(p, "text") or "").startswith("[normandy:") for p in parts):
        return None
    return f"message {json.dumps(content, sort_keys=True, default=str)}"


def _removed_per_item(compactions: list[AgentsCompaction]) -> Counter[str]:
    keys = (_item_key(item) for c in compactions for item in c.removed)
    return Counter(k for k in keys if k is not None)


def _twice(counts: Counter[str]) -> dict[str, int]:
    return {k: n for k, n in counts.items() if n > 1}


def _check_the_archive(hook: Dropped) -> None:
    """The archive recorded exactly what the hooks received: a compaction per call, the
    same entries, and each dropped call stored with its output."""
    archive = Archive(os.environ["NORMANDY_ARCHIVE_PATH"])
    try:
        records = archive.compactions(limit=10_000)
        assert len(records) == len(hook.calls)
        assert sum(r.dropped_count for r in records) == sum(len(d) for d in hook.calls)
        for key in hook.per_call_id():
            if key.startswith("call "):
                stored = archive.by_source_id(key.removeprefix("call "))
                assert len(stored) == 2, key  # the call and its output, once each
    finally:
        archive.close()


def _docs_example() -> str:
    (example,) = [
        b.code for b in blocks(PAGE) if b.lang == "python" and "NormandyInputFilter(" in b.code
    ]
    return example


def test_the_docs_example_reports_each_item_once(hook: Dropped) -> None:
    """The page's example as written (three runs), then more runs of its agent."""
    namespace: dict[str, Any] = {"__name__": "openai_agents_example"}
    exec(compile(_docs_example(), str(PAGE), "exec"), namespace)
    agent, session, run_config = namespace["agent"], namespace["session"], namespace["run_config"]

    async def more() -> list[Any]:
        for n in range(AGENTS_DOC_RUNS - 3):
            await Runner.run(agent, f"Read module {n}.", session=session, run_config=run_config)
        return list(await session.get_items())

    stored = asyncio.run(more())
    per_call = hook.per_call_id()
    assert len(per_call) >= 20  # the runs dropped many calls and outputs, for the hooks
    assert _twice(per_call) == {}
    assert _twice(_removed_per_item(namespace["compactions"])) == {}
    assert pairing_problems(stored) == []
    _check_the_archive(hook)


_RUNS = st.lists(st.sampled_from(["both", "streamed", "session", "filter"]), min_size=2, max_size=6)
#: Tool rounds of each run, before its answer.
ROUNDS = 5


def _script(runs: int) -> list[ModelStep]:
    """The SDK's own scripted model's steps: per run, ``ROUNDS`` calls of ``read_chunk``
    (ids ``fc_<run>_<round>``) and an answer (``msg_<run>``)."""
    steps: list[ModelStep] = []
    for r in range(runs):
        steps += [
            ModelStep(
                output=[
                    function_call(
                        "read_chunk",
                        {"n": 10 * r + j},
                        call_id=f"call_{r}_{j}",
                        item_id=f"fc_{r}_{j}",
                    )
                ]
            )
            for j in range(ROUNDS)
        ]
        steps.append(ModelStep(output=[assistant_message(f"answer {r}", item_id=f"msg_{r}")]))
    return steps


async def _run(
    agent: Agent[Any], question: str, session: Any, config: RunConfig, streamed: bool
) -> None:
    if not streamed:
        await Runner.run(agent, question, session=session, run_config=config)
        return
    result = Runner.run_streamed(agent, question, session=session, run_config=config)
    async for _ in result.stream_events():
        pass


def test_any_order_of_runs_reports_each_item_once(hook: Dropped, tmp_path: Path) -> None:
    """Runs with the session and the filter (run or streamed), the session alone, or the
    filter alone (a run of its own, outside the session), in any order, with or without
    a session ``limit``, the model being the SDK's own ``agents.testing.ScriptedModel``:
    no item reaches the hooks twice, every request is valid, and the store keeps every
    call with its output."""
    tried: list[list[str]] = []
    reported: list[int] = []

    @settings(
        max_examples=AGENTS_RUN_ORDERS,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(kinds=_RUNS, limit=st.sampled_from([None, 14]))
    def runs(kinds: list[str], limit: int | None) -> None:
        hook.calls.clear()
        tried.append(kinds)
        model = ScriptedModel(_script(len(kinds)))
        compactions: list[AgentsCompaction] = []
        opts = {"reserved_tokens": 500}
        store = SQLiteSession(f"s{len(tried)}", tmp_path / "orders.sqlite3")
        session = NormandySession(
            store,
            "window_manager",
            opts,
            window=3000,
            on_compact=compactions.append,
            session_settings=SessionSettings(limit=limit),
        )
        filt = NormandyInputFilter(
            "window_manager", opts, window=3000, on_compact=compactions.append
        )
        agent = Agent(name="reader", instructions="Read.", model=model, tools=[read_chunk])

        async def play() -> list[Any]:
            for n, kind in enumerate(kinds):
                config = RunConfig(
                    call_model_input_filter=filt if kind != "session" else None,
                    tracing_disabled=True,
                )
                chosen = None if kind == "filter" else session
                await _run(agent, f"question {n}", chosen, config, kind == "streamed")
            return list(await session.get_items())

        stored = asyncio.run(play())
        model.assert_complete()
        reported.append(len(hook.per_call_id()))
        assert _twice(hook.per_call_id()) == {}, kinds
        assert _twice(_removed_per_item(compactions)) == {}, kinds
        assert all(pairing_problems(call.input) == [] for call in model.calls)
        assert pairing_problems(stored) == []

    runs()
    assert len(tried) >= AGENTS_RUN_ORDERS
    assert sum(reported) > 0  # calls and outputs were dropped, and reached the hook
    assert any(k.count("both") + k.count("streamed") >= 2 for k in tried)  # the report's case
