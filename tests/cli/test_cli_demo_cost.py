"""``normandy demo`` shows the session's cumulative input cost with prompt caching."""

from __future__ import annotations

import re

import pytest

from normandy_core.app.demo import load_session, replay
from normandy_core.conversation.cost import DEFAULT_RATES, billed
from tests.cli.conftest import run_cli


@pytest.mark.slow
def test_demo_table_and_chart_show_cumulative_cost() -> None:
    r = run_cli("demo", "--turns", "6", "--window", "12000", "--no-progress", "--quiet")
    assert r.code == 0, r
    row = re.search(r"input cost \(cache-aware\)\s+\$([\d.,]+) over ([\d,]+) model calls", r.out)
    assert row, r.out
    assert "cumulative input cost per call" in r.out
    assert "cache read 0.1x, write 1.25x" in r.out


def test_replay_bills_each_call_against_the_one_before(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(tmp_path / "a.sqlite3"))
    session = load_session()
    compacted = replay(session, turns=6, window=12_000)
    plain = replay(session, turns=6, window=None, compactor="noop")
    calls = sum(len(t.replies) for t in session.turns[:6])
    assert len(compacted.billed) == len(plain.billed) == calls
    # without compaction each call reads all the previous call sent: its bill is exactly
    # what the model says for the prefix that call sent
    for i in range(1, calls):
        expected = billed(plain.sent[i - 1], plain.sent[i], DEFAULT_RATES)
        assert abs(plain.billed[i] - expected) < 1e-6
    assert plain.billed[0] == billed(0, plain.sent[0], DEFAULT_RATES)
    assert compacted.cumulative_cost[-1] == compacted.cost > 0
    assert all(
        a <= b
        for a, b in zip(compacted.cumulative_cost, compacted.cumulative_cost[1:], strict=False)
    )
    assert compacted.input_price == 3.0  # claude-sonnet-4-5 in the catalog
    # a compaction rewrites the cache: some call of the compacted replay reads less than
    # everything the call before it sent
    assert any(
        compacted.billed[i] > billed(compacted.sent[i - 1], compacted.sent[i], DEFAULT_RATES)
        for i in range(1, calls)
    )
