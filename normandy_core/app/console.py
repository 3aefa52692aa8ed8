"""Small terminal helpers for the ``normandy`` command: a progress bar, tables, sparklines.

No dependencies: the progress bar redraws one line of stderr with ``\\r`` and draws only
when stderr is a terminal or when forced, so pipes and CI logs stay clean.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence
from typing import TextIO

__all__ = ["ProgressBar", "format_table", "marks", "sparkline"]

_BARS = " ▁▂▃▄▅▆▇█"


class ProgressBar:
    """A one-line progress bar on ``stream`` (stderr by default).

    ``enabled=None`` draws only when the stream is a terminal; ``True`` forces it (the
    bar is then redrawn at most every 50 ms and completed with a newline by :meth:`close`).
    Text written between updates with :meth:`write` appears above the bar.
    """

    def __init__(
        self,
        total: int,
        *,
        label: str = "",
        stream: TextIO | None = None,
        enabled: bool | None = None,
        width: int | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self._isatty() if enabled is None else enabled
        self.total = max(total, 1)
        self.label = label
        self.done = 0
        self.suffix = ""
        self.width = width
        self._drawn = 0.0
        self._shown = False
        self._started = time.perf_counter()

    def _isatty(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def update(self, done: int, suffix: str = "") -> None:
        """Set progress to ``done`` of ``total`` with an optional note after the bar."""
        self.done = min(done, self.total)
        self.suffix = suffix
        now = time.perf_counter()
        if self.enabled and (now - self._drawn >= 0.05 or self.done == self.total):
            self._drawn = now
            self._draw()

    def _line(self) -> str:
        cols = self.width or shutil.get_terminal_size((80, 20)).columns
        frac = self.done / self.total
        head = f"{self.label} " if self.label else ""
        tail = f" {self.done}/{self.total} {self.suffix}".rstrip()
        bar_width = max(10, min(40, cols - len(head) - len(tail) - 4))
        filled = int(frac * bar_width)
        bar = "█" * filled + "░" * (bar_width - filled)
        return f"{head}|{bar}|{tail}"[: cols - 1]

    def _draw(self) -> None:
        self.stream.write("\r\x1b[2K" + self._line())
        self.stream.flush()
        self._shown = True

    def write(self, text: str) -> None:
        """Print ``text`` on its own line (above the bar when it is drawn) to stdout."""
        if self.enabled and self._shown:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
        print(text, flush=True)
        if self.enabled and self._shown:
            self._draw()

    def close(self) -> None:
        """Draw the final state and end the line."""
        if self.enabled:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()


def _columns(count: int, width: int) -> list[range]:
    """The indexes each of at most ``width`` columns stands for, ``count`` values in all."""
    cols = min(width, count)
    return [
        range(i * count // cols, max((i + 1) * count // cols, i * count // cols + 1))
        for i in range(cols)
    ]


def sparkline(values: Sequence[float], *, width: int = 72, top: float | None = None) -> str:
    """``values`` as a row of block characters, resampled to at most ``width`` columns.

    Each column shows the largest value of its bucket; ``top`` (default the largest value)
    is the full block.
    """
    if not values:
        return ""
    buckets = [max(values[i] for i in column) for column in _columns(len(values), width)]
    full = top if top is not None else max(buckets)
    if full <= 0:
        return _BARS[0] * len(buckets)
    out = []
    for value in buckets:
        level = round(min(max(value, 0) / full, 1.0) * (len(_BARS) - 1))
        out.append(_BARS[max(level, 1 if value > 0 else 0)])
    return "".join(out)


def marks(flags: Sequence[bool], *, width: int = 72, mark: str = "!") -> str:
    """``flags`` as a row of ``mark`` and spaces, in the columns :func:`sparkline` gives the
    same number of values: a column is marked when any value of its bucket is set."""
    return "".join(
        mark if any(flags[i] for i in column) else " " for column in _columns(len(flags), width)
    )


def format_table(
    rows: Sequence[Sequence[str]], header: Sequence[str], *, align: str | None = None
) -> str:
    """A plain-text table: columns padded to their widest cell, a rule under the header.

    ``align`` has one letter per column, ``l`` or ``r`` (default: all left).
    """
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    spec = align or "l" * len(header)

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(widths[i]) if spec[i] == "r" else c.ljust(widths[i])
            for i, c in enumerate(cells)
        ]
        return "  ".join(parts).rstrip()

    out = [line(header), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in rows)
    return "\n".join(out)
