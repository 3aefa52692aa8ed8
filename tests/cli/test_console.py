"""The dependency-free terminal helpers: progress bar, sparkline, table."""

from __future__ import annotations

import io

from normandy_core.app.console import ProgressBar, format_table, sparkline


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_only_on_a_terminal_or_when_forced() -> None:
    quiet = io.StringIO()
    bar = ProgressBar(10, label="x", stream=quiet)
    bar.update(5)
    bar.close()
    assert quiet.getvalue() == ""
    tty = _Tty()
    bar = ProgressBar(10, label="x", stream=tty, width=60)
    bar.update(10, "done")
    bar.close()
    out = tty.getvalue()
    assert "x |" in out and "10/10 done" in out and out.endswith("\n")
    forced = io.StringIO()
    bar = ProgressBar(4, stream=forced, enabled=True, width=60)
    bar.update(4)
    assert "4/4" in forced.getvalue()


def test_sparkline_resamples_and_scales() -> None:
    assert sparkline([]) == ""
    line = sparkline([0, 5, 10], top=10)
    assert line == " ▄█"
    assert len(sparkline(list(range(1000)), width=50)) == 50
    assert sparkline([1, 1], top=100) == "▁▁"  # small but non-zero values stay visible


def test_format_table_aligns() -> None:
    text = format_table([["a", "1"], ["bbb", "22"]], ["name", "n"], align="lr")
    lines = text.splitlines()
    assert lines[0] == "name   n"
    assert lines[2] == "a      1"
    assert lines[3] == "bbb   22"
