"""normandy-strands in real Strands agents (``Agent`` with its event loop, tool execution,
hooks and overflow retry), with :class:`~strands_scripted.ScriptedModel` as the only fake."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, strategies as st
from strands import Agent
from strands.hooks import BeforeModelCallEvent, HookProvider, HookRegistry
from strands_scripted import ScriptedModel, pairing_problems, read_chunk, user_texts

import normandy_core
from normandy_core import OptionsError, UnknownCompactorError, hookimpl
from normandy_core.transcripts.formats import TranscriptError
from normandy_strands import (
    MessageCompactor,
    NormandyConversationManager,
    StrandsCompaction,
    compact_messages,
)
from normandy_strands.reading import is_created

WINDOW = 4000
OPTS = {"reserved_tokens": 500}
SYSTEM = "You read logs and answer."


class DroppedRecorder:
    """An ``after_compact`` hook plugin registered in code: what each compaction dropped."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    @hookimpl
    def after_compact(self, acc: Any, ctx: Any, meta: dict[str, Any]) -> None:
        self.calls.append({"dropped": list(meta["dropped"]), "mid_round": ctx.mid_round})

    @property
    def dropped_ids(self) -> list[str]:
        return [e.id for call in self.calls for e in call["dropped"]]


@pytest.fixture
def recorder() -> Iterator[DroppedRecorder]:
    rec = DroppedRecorder()
    qname = normandy_core.register_hook(rec, "strands-test-recorder")
    yield rec
    normandy_core.unregister_hook(qname)


class Snapshots(HookProvider):
    """Before every model call (after the manager's compaction): the agent's message
    objects, each with a deep copy taken then."""

    def __init__(self) -> None:
        self.seen: list[list[tuple[dict[str, Any], dict[str, Any]]]] = []

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeModelCallEvent, self._before)

    def _before(self, event: BeforeModelCallEvent) -> None:
        self.seen.append([(m, copy.deepcopy(m)) for m in event.agent.messages])  # type: ignore[misc]


def _agent(model: ScriptedModel, manager: Any, snapshots: Snapshots | None = None) -> Agent:
    return Agent(
        model=model,
        tools=[read_chunk],
        system_prompt=SYSTEM,
        conversation_manager=manager,
        hooks=[snapshots] if snapshots is not None else None,
        callback_handler=None,
    )


def _check_requests(model: ScriptedModel, prompts: list[str]) -> None:
    """The independent validator, on every request the model received: tool pairs whole,
    roles alternating, the task and the current request present, within the window."""
    calls_per_prompt = model.rounds + 1
    for n, request in enumerate(model.received):
        assert pairing_problems(request.messages) == [], f"request {n}"
        texts = user_texts(request.messages)
        assert texts[0] == prompts[0], f"request {n}: the task is gone"
        assert prompts[n // calls_per_prompt] in texts, f"request {n}: the current request"
        assert request.tokens <= WINDOW, f"request {n}: {request.tokens} tokens"


def _check_kept_unchanged(snapshots: Snapshots) -> None:
    """Every message object the agent holds is, each time it is seen, as first seen."""
    first: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
    for seen in snapshots.seen:
        for m, snap in seen:
            held = first.setdefault(id(m), (m, snap))
            assert held[0] is m and held[1] == snap, f"message changed: {m}"


def test_a_long_tool_session_sends_only_valid_requests_within_the_window(
    recorder: DroppedRecorder,
) -> None:
    model = ScriptedModel(rounds=12)
    done: list[StrandsCompaction] = []
    manager = NormandyConversationManager(
        "window_manager", OPTS, window=WINDOW, on_compact=done.append
    )
    snapshots = Snapshots()
    agent = _agent(model, manager, snapshots)
    prompts = [f"Question {q}: read the log." for q in range(4)]
    for prompt in prompts:
        result = agent(prompt)
        assert str(result).strip() == f"answer {model.calls - 1}"
    tool_calls = sum(
        "toolUse" in b for r in model.received[-1:] for m in r.messages for b in m["content"]
    )
    assert model.calls == 4 * 13 and tool_calls < 10
    assert sum(1 for k in range(model.calls) if k % 13 < 12) >= 40  # tool rounds run
    _check_requests(model, prompts)
    _check_kept_unchanged(snapshots)
    # what the model was sent is what the agent held (Strands strips only its own keys)
    for seen, request in zip(snapshots.seen, model.received, strict=True):
        assert [{"role": m["role"], "content": m["content"]} for m, _ in seen] == request.messages
    assert len(done) >= 8 and any(c["mid_round"] for c in recorder.calls)
    # every dropped entry reached the hooks once, and they are the compactions' own
    assert recorder.dropped_ids == [e.id for c in done for e in c.result.dropped]
    assert len(set(recorder.dropped_ids)) == len(recorder.dropped_ids)


def test_removed_message_count_is_where_the_stored_messages_resume(
    recorder: DroppedRecorder,
) -> None:
    """As Strands' session managers read it: the messages before the kept run of stored
    ones are the removed and those kept ahead of the cut (the task), which the state
    carries with the markers (``head``)."""
    model = ScriptedModel(rounds=12)
    done: list[StrandsCompaction] = []
    manager = NormandyConversationManager(
        "window_manager", OPTS, window=WINDOW, on_compact=done.append
    )
    agent = _agent(model, manager)
    given = 0
    for q in range(3):
        agent(f"Question {q}")
        given += 1 + 2 * 12 + 1  # the prompt, the rounds' calls and results, the answer
    state = manager.get_state()
    head = state["head"]
    assert head and head == agent.messages[: len(head)]
    assert head[0]["content"] == [{"text": "Question 0"}] and any(is_created(m) for m in head)
    tail = agent.messages[len(head) :]
    assert not any(is_created(m) for m in tail)
    assert manager.removed_message_count == given - len(tail)
    # the given messages no longer anywhere are those the compactions report gone
    kept_given = sum(not is_created(m) for m in agent.messages)
    assert sum(c.removed_count for c in done) == given - kept_given
    other = NormandyConversationManager("window_manager", OPTS, window=WINDOW)
    assert other.restore_from_session(state) == head
    assert other.removed_message_count == manager.removed_message_count
    assert other.get_state() == state


def test_a_session_restores_the_compacted_conversation(
    recorder: DroppedRecorder, tmp_path: Any
) -> None:
    """Strands' own ``FileSessionManager``: an agent restored from the session holds the
    messages the compacted agent held (the task and marker from the state, the rest from
    storage), and goes on with valid requests."""
    from strands.session.file_session_manager import FileSessionManager

    def agent_in_session(model: ScriptedModel) -> Agent:
        return Agent(
            model=model,
            tools=[read_chunk],
            system_prompt=SYSTEM,
            conversation_manager=NormandyConversationManager("window_manager", OPTS, window=WINDOW),
            session_manager=FileSessionManager(session_id="s1", storage_dir=str(tmp_path)),
            callback_handler=None,
        )

    first = agent_in_session(ScriptedModel(rounds=12))
    for q in range(3):
        first(f"Question {q}: read the log.")
    restored = agent_in_session(ScriptedModel(rounds=12))
    assert [m["tracking_id"] for m in restored.messages] == [
        m["tracking_id"] for m in first.messages
    ]
    assert pairing_problems(restored.messages) == []
    model = restored.model
    assert isinstance(model, ScriptedModel)
    restored("Question 3: read the log.")
    assert model.received and all(pairing_problems(r.messages) == [] for r in model.received)
    assert all(user_texts(r.messages)[0] == "Question 0: read the log." for r in model.received)
    assert all(r.tokens <= WINDOW for r in model.received)


def test_an_overflow_is_recovered_by_a_forced_compaction_and_a_retry(
    recorder: DroppedRecorder,
) -> None:
    """A provider whose real limit is below the window the manager was given: Strands
    catches its overflow, calls ``reduce_context`` and retries; the retry fits."""
    model = ScriptedModel(rounds=12, limit=1500)
    manager = NormandyConversationManager("window_manager", OPTS, window=WINDOW)
    agent = _agent(model, manager)
    agent("Question 0: read the log.")
    assert model.refused, "the provider refused at least one request"
    assert model.calls == 13
    assert all(r.tokens <= 1500 for r in model.received)
    assert all(pairing_problems(r.messages) == [] for r in model.received)
    assert recorder.calls


def test_an_overflow_with_nothing_left_to_remove_raises_strands_own_error() -> None:
    from strands.types.exceptions import ContextWindowOverflowException

    model = ScriptedModel(rounds=2, limit=10)
    agent = _agent(model, NormandyConversationManager("window_manager", OPTS, window=WINDOW))
    with pytest.raises(ContextWindowOverflowException):
        agent("Question 0: read the log.")
    assert model.received == []


def test_the_async_path_compacts_off_the_event_loop(recorder: DroppedRecorder) -> None:
    model = ScriptedModel(rounds=12)
    done: list[StrandsCompaction] = []
    manager = NormandyConversationManager(
        "window_manager", OPTS, window=WINDOW, on_compact=done.append
    )
    agent = _agent(model, manager)
    prompts = [f"Question {q}: read the log." for q in range(3)]

    async def run() -> None:
        for prompt in prompts:
            await agent.invoke_async(prompt)

    asyncio.run(run())
    assert model.calls == 3 * 13 and done
    _check_requests(model, prompts)
    assert recorder.dropped_ids == [e.id for c in done for e in c.result.dropped]


def test_nothing_happens_while_the_history_fits(recorder: DroppedRecorder) -> None:
    model = ScriptedModel(rounds=2)
    done: list[StrandsCompaction] = []
    manager = NormandyConversationManager("window_manager", window=200_000, on_compact=done.append)
    agent = _agent(model, manager)
    agent("short")
    assert done == [] and recorder.calls == [] and manager.removed_message_count == 0
    assert [len(r.messages) for r in model.received] == [1, 3, 5]
    assert len(agent.messages) == 6


def test_every_removed_message_reaches_the_hooks_once_across_runs(
    recorder: DroppedRecorder,
) -> None:
    """Five runs of one session: each message the user or the model gave that left
    ``agent.messages`` is in exactly one ``after_compact`` call (by its tracking id), and
    nothing still held was reported."""
    model = ScriptedModel(rounds=9)
    manager = NormandyConversationManager("window_manager", OPTS, window=WINDOW)
    snapshots = Snapshots()
    agent = _agent(model, manager, snapshots)
    for q in range(5):
        agent(f"Question {q}: read the log.")
    given = {m["tracking_id"] for seen in snapshots.seen for m, _ in seen if not is_created(m)}
    given |= {m["tracking_id"] for m in agent.messages if not is_created(m)}
    held = {m["tracking_id"] for m in agent.messages}
    reported = [
        e.metadata["tracking_id"]
        for call in recorder.calls
        for e in call["dropped"]
        if "tracking_id" in e.metadata
    ]
    left = given - held
    assert left and len(recorder.calls) >= 5
    assert sorted(t for t in reported if t in given) == sorted(left)


def test_wrong_names_and_options_are_refused_when_the_manager_is_built() -> None:
    with pytest.raises(
        OptionsError, match=r"normandy_strands\.NormandyConversationManager\(\)"
    ) as e:
        NormandyConversationManager("window_manager", {"reserved_tokens": -1}, window=WINDOW)
    assert "window_manager" in str(e.value) and "reserved_tokens" in str(e.value)
    with pytest.raises(OptionsError, match=r"(?s)NormandyConversationManager\(\).*no_such_option"):
        NormandyConversationManager("window_manager", {"no_such_option": 1}, window=WINDOW)
    with pytest.raises(UnknownCompactorError, match="no_such_compactor"):
        NormandyConversationManager("no_such_compactor", window=WINDOW)
    with pytest.raises(OptionsError, match=r"normandy_strands\.compact_messages\(\)"):
        compact_messages([], compactor="clear_tool_results", opts={"keep": -1})
    with pytest.raises(normandy_core.WindowUnknownError, match="NormandyConversationManager"):
        NormandyConversationManager("window_manager", model="no-such-model-anywhere")


def test_a_compactor_error_raises_with_raise_on_error() -> None:
    """A window too small for the pinned task and the system prompt: the core's error
    path, which leaves the messages as they were, or raises when asked to."""
    model = ScriptedModel(rounds=3)
    manager = NormandyConversationManager(
        "window_manager", {"reserved_tokens": 10}, window=120, raise_on_error=True
    )
    agent = _agent(model, manager)
    with pytest.raises(normandy_core.CannotFitError, match="window_manager"):
        agent("Question 0: " + "read the log. " * 60)


def test_beside_strands_context_offloader(recorder: DroppedRecorder) -> None:
    """Strands' ``ContextOffloader`` shortens large tool results when the tool returns;
    the manager compacts what remains, and every request still holds."""
    from strands.vended_plugins.context_offloader import ContextOffloader, InMemoryStorage

    model = ScriptedModel(rounds=12)
    manager = NormandyConversationManager("window_manager", OPTS, window=WINDOW)
    offloader = ContextOffloader(
        storage=InMemoryStorage(), max_result_tokens=200, preview_tokens=60
    )
    agent = Agent(
        model=model,
        tools=[read_chunk],
        system_prompt=SYSTEM,
        conversation_manager=manager,
        plugins=[offloader],
        callback_handler=None,
    )
    prompts = [f"Question {q}: read the log." for q in range(4)]
    for prompt in prompts:
        agent(prompt)
    _check_requests(model, prompts)
    results = [
        c["text"]
        for r in model.received
        for m in r.messages
        for b in m["content"]
        if "toolResult" in b
        for c in b["toolResult"]["content"]
        if "text" in c
    ]
    assert results and all(len(t) < 1500 for t in results)  # offloaded, previews only
    assert manager.removed_message_count > 0 and recorder.calls


def _session(rounds: int, width: int = 1) -> list[dict[str, Any]]:
    """A finished Strands session of ``rounds`` tool rounds of ``width`` calls each."""
    out: list[dict[str, Any]] = [
        {"role": "user", "content": [{"text": "start"}], "tracking_id": "t"}
    ]
    for r in range(rounds):
        calls = [f"c{r}-{j}" for j in range(width)]
        out.append(
            {
                "role": "assistant",
                "content": [
                    {
                        "reasoningContent": {
                            "reasoningText": {"text": f"think {r}", "signature": "s"}
                        }
                    },
                    {"text": f"round {r}"},
                    *(
                        {"toolUse": {"toolUseId": c, "name": "read_chunk", "input": {"n": r}}}
                        for c in calls
                    ),
                ],
                "metadata": {"custom": {"round": r}},
                "tracking_id": f"a{r}",
            }
        )
        out.append(
            {
                "role": "user",
                "content": [
                    {
                        "toolResult": {
                            "toolUseId": c,
                            "status": "success",
                            "content": [{"text": read_chunk._tool_func(r)}],
                        }
                    }
                    for c in calls
                ],
                "tracking_id": f"u{r}",
            }
        )
    out.append({"role": "assistant", "content": [{"text": "done"}], "tracking_id": "end"})
    return out


def test_a_changed_message_keeps_its_other_keys() -> None:
    messages = _session(6)
    done = MessageCompactor(
        "clear_tool_results", {"trigger_tool_uses": 3, "keep": 1, "clear_tool_inputs": True}
    ).run(messages)
    assert done.compacted and len(done.messages) == len(messages)  # cleared in place
    changed = [(m, o) for m, o in zip(done.messages, messages, strict=True) if m is not o]
    assert changed and [id(o) for o in done.removed] == [id(o) for _, o in changed]
    assert done.removed_count == 0  # changed, not removed
    for m, o in changed:
        assert {k: v for k, v in m.items() if k != "content"} == {
            k: v for k, v in o.items() if k != "content"
        }
        assert m["content"] != o["content"]
    assert pairing_problems(done.messages) == []


def test_an_orphaned_tool_result_is_refused() -> None:
    messages = [
        {"role": "user", "content": [{"text": "hi"}]},
        {"role": "assistant", "content": [{"text": "ok"}]},
        {
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": "nobody", "status": "success", "content": []}}
            ],
        },
    ]
    with pytest.raises(TranscriptError, match="nobody"):
        compact_messages(messages, window=WINDOW, opts=OPTS)  # type: ignore[arg-type]


@given(
    rounds=st.integers(min_value=0, max_value=14),
    width=st.integers(min_value=1, max_value=3),
    window=st.integers(min_value=1500, max_value=6000),
    open_round=st.booleans(),
)
def test_any_history_comes_back_valid_with_kept_messages_unchanged(
    rounds: int, width: int, window: int, open_round: bool
) -> None:
    messages = _session(rounds, width)
    if open_round and rounds:
        messages = messages[:-1]  # the model is about to continue the round
    before = copy.deepcopy(messages)
    done = MessageCompactor("window_manager", {"reserved_tokens": 200}, window=window).run(
        messages  # type: ignore[arg-type]
    )
    assert pairing_problems(done.messages) == []
    assert messages == before  # the input is untouched
    originals = {id(m): i for i, m in enumerate(messages)}
    positions = [originals[id(m)] for m in done.messages if id(m) in originals]
    assert positions == sorted(positions)
    assert done.messages[0] is messages[0]  # the task is kept
    if not done.compacted:
        assert done.messages == messages and done.removed == [] and done.removed_count == 0
    else:
        assert {id(m) for m in done.removed} == set(originals) - {id(m) for m in done.messages}
        # a removed message replaced by a changed copy (same tracking id) is not counted
        held = {m["tracking_id"] for m in done.messages}
        assert done.removed_count == sum(m["tracking_id"] not in held for m in done.removed)
        assert done.result.tokens_after < done.result.tokens_before


def test_a_message_strands_pins_is_never_removed(recorder: DroppedRecorder) -> None:
    messages = _session(12)
    assert messages[6]["tracking_id"] == "u2"  # the results of round 2
    messages[6]["metadata"] = {"custom": {"pinned": True}}
    out = compact_messages(messages, opts=OPTS, window=WINDOW)  # type: ignore[arg-type]
    assert len(out) < len(messages) and recorder.calls
    assert any(m is messages[6] for m in out)
    # its call stays with it (a copy, when the compactor stripped its old reasoning)
    assert "a2" in [m.get("tracking_id") for m in out]
    assert pairing_problems(out) == []


def test_repeated_tool_use_ids_pair_per_round_across_calls(recorder: DroppedRecorder) -> None:
    """A model that gives every call the same id: each result pairs with the call of the
    message right before it, call after call of one compactor (whose reads reuse what
    they saw only when the numbering agrees)."""
    messages = _session(14)
    for m in messages:
        for b in m["content"]:
            for key in ("toolUse", "toolResult"):
                if key in b:
                    b[key]["toolUseId"] = "same"
    compactor = MessageCompactor("window_manager", OPTS, window=WINDOW)
    held = messages[:3]
    for k in range(3, len(messages), 2):
        held = compactor.run(held + messages[k : k + 2]).messages
        assert pairing_problems(held) == [], k
    dropped = [e.id for call in recorder.calls for e in call["dropped"]]
    assert recorder.calls and len(dropped) == len(set(dropped))
    uses = [u.id for call in recorder.calls for e in call["dropped"] for u in e.tool_uses]
    assert "same" in uses and any(u.startswith("same#") for u in uses)
