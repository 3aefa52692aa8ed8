"""A :class:`~normandy_core.ContinuationMemo` of one's own: its bounds, its LRU order, and
the process-wide memo left as it was.

Real compactors, real tiktoken counts, the archive in a temporary file (root conftest).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from normandy_core import ContinuationMemo, compact
from normandy_core.app.workload import generate_session
from normandy_core.transcripts import continuation
from normandy_core.transcripts.chat import to_openai
from normandy_core.transcripts.result import CompactResult

OPTS = {"counter": "cl100k_base", "reserved_tokens": 0}
WINDOW = 12_000


@pytest.fixture(autouse=True)
def _fresh_memo() -> None:
    continuation.clear()


def _conversation(seed: int) -> tuple[list[dict[str, Any]], list[int]]:
    """A Chat Completions session and the positions where a tool batch starts."""
    msgs = to_openai(generate_session(seed, 120))
    cuts = [i for i, m in enumerate(msgs) if m["role"] == "assistant" and m.get("tool_calls")]
    return msgs, cuts


def _call(messages: list[Any], memo: ContinuationMemo | None) -> CompactResult:
    return compact(messages, window=WINDOW, model="gpt-4o", opts=OPTS, memo=memo)


class _Agents:
    """Conversations that each grow by one tool batch per call, as agents' do."""

    def __init__(self, n: int) -> None:
        self.sessions = [_conversation(100 + c) for c in range(n)]
        self.live: list[list[Any]] = [[] for _ in range(n)]
        self.turn = [2] * n

    def call(self, c: int, memo: ContinuationMemo | None) -> CompactResult:
        msgs, cuts = self.sessions[c]
        self.turn[c] += 1
        self.live[c].extend(msgs[len(self.live[c]) : cuts[self.turn[c]]])
        return _call(self.live[c], memo)


@pytest.mark.parametrize(("states", "messages"), [(0, 10), (8, 0), (-1, 10), (True, 10), (8, 2.5)])
def test_bounds_must_be_positive_integers(states: Any, messages: Any) -> None:
    with pytest.raises(ValueError, match="ContinuationMemo: max_"):
        ContinuationMemo(states, messages)


def test_the_default_bounds_are_the_process_memo_s() -> None:
    memo = ContinuationMemo()
    assert (memo.max_states, memo.max_messages) == (
        continuation.MAX_STATES,
        continuation.MAX_MESSAGES,
    )


def test_a_memo_of_ones_own_continues_more_conversations_than_the_process_memo() -> None:
    n = continuation.MAX_STATES + 4
    memo = ContinuationMemo(max_states=n)
    agents, shared = _Agents(n), _Agents(n)
    for _ in range(3):
        for c in range(n):
            agents.call(c, memo)
            shared.call(c, None)
    # round robin over more conversations than 8: the process memo never continues one
    assert all(agents.call(c, memo).continued for c in range(n))
    assert not any(shared.call(c, None).continued for c in range(n))
    assert len(memo) == n and len(continuation._states) == continuation.MAX_STATES


def test_a_memo_of_ones_own_leaves_the_process_memo_alone() -> None:
    agents = _Agents(1)
    memo = ContinuationMemo(max_states=2)
    agents.call(0, memo)
    assert len(continuation._states) == 0 and len(memo) == 1
    assert agents.call(0, memo).continued
    # the process memo never saw this conversation: from scratch there
    assert not agents.call(0, None).continued


def test_a_compaction_over_max_messages_is_not_remembered() -> None:
    agents = _Agents(1)
    memo = ContinuationMemo(max_messages=5)
    agents.call(0, memo)
    assert len(memo) == 0 and memo.messages == 0
    assert not agents.call(0, memo).continued


@settings(max_examples=12, deadline=None)
@given(
    max_states=st.integers(1, 4),
    max_messages=st.sampled_from([40, 120, 10**6]),
    order=st.lists(st.integers(0, 4), min_size=1, max_size=12),
)
def test_memo_bounds_and_lru_order_property(
    max_states: int, max_messages: int, order: list[int]
) -> None:
    """Never more than the bounds kept; with room for the messages, a conversation's call
    continues exactly when it is among the ``max_states`` most recently used."""
    memo = ContinuationMemo(max_states, max_messages)
    agents = _Agents(5)
    recent: OrderedDict[int, None] = OrderedDict()  # the model: least recently used first
    for c in order:
        result = agents.call(c, memo)
        assert len(memo) <= max_states and memo.messages <= max_messages
        if max_messages == 10**6:
            assert result.continued == (c in recent)
        elif result.continued:
            assert c in recent  # a continuation is only ever of this conversation's call
        recent.pop(c, None)
        recent[c] = None
        while len(recent) > max_states:
            recent.popitem(last=False)
