"""The demo's summary shows the real token figures whoever computes them."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from normandy_core import hookimpl, register_compactor, unregister_compactor
from normandy_core.app.cli_demo import summary_rows
from normandy_core.app.demo import load_session, replay

support = sys.modules["normandy_turn_test_support"]  # loaded by conftest.py


class Bare(support.KeepTail):
    """KeepTail without any token figure in its meta."""

    @hookimpl
    def maybe_compact(self, acc: Any, ctx: Any, opts: dict[str, Any]) -> Any:
        new, meta = support.KeepTail.maybe_compact(self, acc, ctx, opts)
        return new, {k: v for k, v in meta.items() if not k.startswith("tokens_")}


@pytest.fixture
def bare():
    register_compactor("bare_tail_test", Bare(), replace=True)
    yield "bare_tail_test"
    unregister_compactor("bare_tail_test")


def _history(report: Any) -> int:
    return report.final_tokens + report.tokens_removed


@pytest.mark.parametrize("boundary_figures", [True, False])
def test_the_demo_counts_what_a_compactor_does_not_report(
    bare: str, boundary_figures: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not boundary_figures:  # not even the boundary adds them: the turn loop counts
        import normandy_core.contract.boundary as boundary

        monkeypatch.setattr(boundary, "account", lambda result, before, ctx: result)
    session = load_session()
    report = replay(session, compactor=bare, window=12_000, turns=8)
    reference = replay(session, compactor="noop", window=12_000, turns=8)
    comps = report.compactions
    assert comps and all(b.before > b.after for b in comps)
    for b in report.boundaries:
        assert isinstance(b.meta["tokens_before"], int)
    # the same session was replayed: the history the table shows is about what noop sent (less
    # the thinking of the replies a stripped round had answered with thinking disabled)
    assert abs(_history(report) - _history(reference)) <= 0.1 * _history(reference)
    rows = dict((k, v) for k, v in summary_rows(report))
    before, after = rows["tokens before -> after"].split(" per ")[0].split(" -> ")
    assert int(before.replace(",", "")) > int(after.replace(",", ""))


def test_the_demo_shows_where_thinking_was_disabled(tmp_path: Any) -> None:
    """Each boundary says whether the call after it went without thinking; the table
    counts those calls beside all of them, and the chart marks where they were."""
    from normandy_core.app.cli_demo import _chart_text

    session = load_session()
    # round_aware off: compactions come mid-round, so rounds lose their thinking
    report = replay(session, window=12_000, turns=8, opts={"round_aware": False})
    flags = [b.thinking_disabled for b in report.boundaries]
    assert sum(flags) == report.thinking_disabled > 0
    assert len(report.boundaries) == len(report.billed)  # one boundary before each call
    counts = [b.thinking_disabled_calls for b in report.boundaries]
    assert counts == [sum(flags[: i + 1]) for i in range(len(flags))]
    stripped = [b for b in report.compactions if b.thinking_stripped]
    assert stripped and all(isinstance(b.meta["thinking_stripped"], bool) for b in stripped)
    # a round's thinking is lost only after a mid-round compaction stripped it
    first = flags.index(True)
    assert any(b.mid_round and b.thinking_stripped for b in report.boundaries[: first + 1])
    rows = dict((k, v) for k, v in summary_rows(report))
    calls = len(report.billed)
    expected = f"{report.thinking_disabled} of {calls} model calls"
    assert rows["thinking disabled"].startswith(expected)
    chart = _chart_text(report).splitlines()
    at = next(i for i, line in enumerate(chart) if line.startswith("thinking disabled"))
    marks = chart[at + 1]
    assert "!" in marks and len(marks) == len(chart[1])  # aligned under the context line
    assert marks.strip(" !") == ""


def test_without_disabled_thinking_the_chart_has_no_marker_row() -> None:
    from normandy_core.app.cli_demo import _chart_text

    report = replay(load_session(), window=None, compactor="noop", turns=3)
    assert report.thinking_disabled == 0
    assert not any(b.thinking_disabled for b in report.boundaries)
    assert "thinking disabled" not in _chart_text(report)
    rows = dict((k, v) for k, v in summary_rows(report))
    assert rows["thinking disabled"].startswith(f"0 of {len(report.billed)} model calls")
