"""Issue 34 item 1 through the core loop: at every model call of every turn of a
multi-turn session, the model sees the request that turn answers.

Three turns of ten tool rounds each in a 3,000-token window (``window_manager``, its
defaults but ``reserved_tokens``), run with :func:`normandy_core.turn.run_turn` and a
scripted model, counted with cl100k: before the ``keep_current_request`` rule, the final
call of turn 1 saw only ``Task 0`` (the first user message, kept by ``keep_first_user``)
while ``Task 1`` had been compacted away.
"""

from __future__ import annotations

from normandy_core import AgentConfig, TextBlock, ToolUseBlock
from normandy_core.clients import ScriptedClient
from normandy_core.clients.base import ModelReply, Usage
from normandy_core.turn import run_turn

TURNS = 3
ROUNDS = 10
WINDOW = 3_000


def _script(turn: int) -> list[ModelReply]:
    """Ten tool rounds, then the answer."""
    calls = [
        ModelReply(
            content=(
                TextBlock(text=f"Reading part {r}."),
                ToolUseBlock(id=f"t{turn}_{r}", name="read", input={"path": f"part{r}.py"}),
            ),
            stop_reason="tool_use",
            usage=Usage(0, 30),
        )
        for r in range(ROUNDS)
    ]
    return [*calls, ModelReply(content=(TextBlock(text=f"Task {turn} is done."),))]


def read(path: str) -> str:
    """A tool result of about 200 tokens."""
    return f"{path}: " + "def handler(request): return parse(request.body)\n" * 20


def _requests_seen(acc: AgentConfig) -> tuple[list[list[list[str]]], int]:
    """The user messages each model call of each turn saw, and the compactions made."""
    seen: list[list[list[str]]] = []
    compactions = 0
    for turn in range(TURNS):
        client = ScriptedClient(_script(turn), model="gpt-4")
        result = run_turn(acc, f"Task {turn}: fix part {turn}.", client=client, tools=[read])
        acc = result.acc
        compactions += sum(bool(meta.get("compacted")) for meta in result.boundaries)
        seen.append(
            [
                [m.text() for m in request.messages if m.role == "user" and not m.tool_results]
                for request in client.requests
            ]
        )
    return seen, compactions


def test_every_model_call_sees_the_request_of_its_turn() -> None:
    acc = AgentConfig(
        model="gpt-4",
        compactor="window_manager",
        compactor_opts={"context_window": WINDOW, "reserved_tokens": 500},
    )
    seen, compactions = _requests_seen(acc)
    assert compactions >= TURNS  # the window is tight: every turn compacts
    for turn, calls in enumerate(seen):
        assert len(calls) == ROUNDS + 1
        for call, users in enumerate(calls):
            assert f"Task {turn}: fix part {turn}." in users, (turn, call, users)
            assert users[0] == "Task 0: fix part 0."  # the task, by keep_first_user


def test_turning_the_rule_off_lets_the_request_go() -> None:
    """The option exists to turn the rule off; then a long turn loses its request, as the
    first user message alone is kept (what the issue measured)."""
    acc = AgentConfig(
        model="gpt-4",
        compactor="window_manager",
        compactor_opts={"context_window": WINDOW, "reserved_tokens": 500},
        survival={"keep_current_request": False},
    )
    seen, _ = _requests_seen(acc)
    final_calls = [calls[-1] for calls in seen]
    assert any(f"Task {t}: fix part {t}." not in users for t, users in enumerate(final_calls))
