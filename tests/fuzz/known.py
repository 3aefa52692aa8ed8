"""Defects the campaign has found: issue 12's list, and what the campaign itself found.

Issue 12's are fixed, and so are issue 13's (the Responses API, decorated transcripts
and continuations), each with a regression test in ``tests/fuzz/test_findings_13.py``.
:func:`classify` names the defect a finding would be explained by, so ``make fuzz`` can
say when an old defect comes back; the CI slice allows no finding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fuzz.campaign import Finding
from fuzz.validators import FIRST_USER

__all__ = ["DEFECTS", "Defect", "classify"]


@dataclass(frozen=True)
class Defect:
    """A known defect and the findings it explains."""

    key: str
    title: str
    matches: Callable[[Finding], bool]


def _needless(f: Finding, summarize: bool) -> bool:
    return f.check == "needless_error" and f.message.startswith("summarize:") == summarize


def _clears_inputs(f: Finding) -> bool:
    opts = f.options
    if f.compactor == "pipeline":
        opts = opts["steps"][0]["opts"]
    return bool(opts.get("clear_tool_inputs"))


DEFECTS: tuple[Defect, ...] = (
    Defect(
        "#1",
        "clear_tool_results ignores keep with fewer tool uses than keep (issue 12, 1)",
        lambda f: f.check == "keep" or (f.check == "idempotence" and "of the newest" in f.message),
    ),
    Defect(
        "#2",
        "pipeline skips a mid-round boundary over the usable window (issue 12, 2)",
        lambda f: f.check == "skipped_over_window" and f.compactor == "pipeline",
    ),
    Defect(
        "#3",
        "window_manager with trigger < 1 compacts mid-round while it fits (issue 12, 3)",
        lambda f: (
            f.check == "mid_round_compacted_fitting" and f.compactor.startswith("window_manager")
        ),
    ),
    Defect(
        "#4",
        "summarize fails where oldest_first fits (issue 12, 4)",
        lambda f: f.check == "summarize_vs_oldest_first" or _needless(f, summarize=True),
    ),
    Defect(
        "#5",
        "the marker inserted at the cut is not budgeted (issue 12, 5)",
        lambda f: _needless(f, summarize=False),
    ),
    Defect(
        "#6",
        "not idempotent through compact() (issue 12, 6)",
        lambda f: f.check in ("idempotence", "idempotence_marker"),
    ),
    Defect(
        "#9",
        "the marker counts internal entries, not the caller's messages (issue 12, 9)",
        lambda f: f.check == "marker_count",
    ),
    Defect(
        "#10",
        "a compacted Anthropic transcript can start with an assistant message (issue 12, 10)",
        lambda f: f.check == "validity" and FIRST_USER in f.message,
    ),
    # Found by this campaign, not (yet) in issue 12's list:
    Defect(
        "new-thinking",
        "window_manager budgets kept entries with the thinking blocks its commit strips, "
        "so it reports 'irreducible' where the stripped result fits",
        lambda f: f.check == "needless_error_thinking",
    ),
    Defect(
        "new-clear-inputs",
        "clear_tool_results with clear_tool_inputs reports an assistant entry whose tool "
        "inputs were already {} as dropped unchanged; the boundary then refuses the result",
        lambda f: (
            f.check == "unexpected_error"
            and "which it kept unchanged" in f.message
            and _clears_inputs(f)
        ),
    ),
    # Found once the campaign covered issue 13 (fixed; see tests/fuzz/test_findings_13.py):
    Defect(
        "13-identity",
        "a continuation renders anew every message an earlier call changed or inserted "
        "(cleared results, stripped thinking, markers, summaries): the object the caller "
        "gives back comes back as an equal new one",
        lambda f: f.check == "identity" and f.mode == "continue-replace",
    ),
    Defect(
        "13-redrop",
        "a batch with a newer provider compaction sends a full-history continuation down "
        "the full path, which reports again what earlier calls dropped",
        lambda f: (
            f.check == "dropped_twice"
            and f.mode == "continue-full"
            and "continued=False" in f.message
        ),
    ),
    Defect(
        "new-offbranch",
        "compact() of a Normandy dump returns only the active branch: abandoned branches "
        "are gone from the output dump, unreported",
        lambda f: f.check == "offbranch_loss",
    ),
)


def classify(f: Finding) -> str | None:
    """The key of the known defect that explains ``f``, or ``None``."""
    for d in DEFECTS:
        if d.matches(f):
            return d.key
    return None
