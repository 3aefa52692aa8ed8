"""Cutting between units never separates a tool use from its results."""

from __future__ import annotations

from hypothesis import given

from normandy_core import Entry, ToolResultBlock, ToolUseBlock, group_units, pairing_problems
from strategies import build, well_formed_conversations


@given(well_formed_conversations())
def test_units_partition_the_branch_and_every_cut_between_them_pairs(script):
    entries = build(script).entries()
    assert pairing_problems(entries, allow_pending=False) == []
    units = group_units(entries)
    assert [i for u in units for i in range(*u)] == list(range(len(entries)))
    for start, _ in units:
        assert pairing_problems(entries[start:], allow_pending=False) == []
        assert pairing_problems(entries[:start], allow_pending=False) == []


def test_pairing_problems_names_orphans():
    use = Entry(id="a", role="assistant", content=(ToolUseBlock(id="c1", name="t"),))
    result = Entry(id="r", role="user", content=(ToolResultBlock(tool_use_id="c1"),))
    assert pairing_problems([use, result]) == []
    assert pairing_problems([use]) == []  # a round waiting for its tools
    assert pairing_problems([use], allow_pending=False) == [
        "entry 'a' has tool use 'c1' without a result after it"
    ]
    (orphan,) = pairing_problems([result])
    assert "entry 'r'" in orphan
    assert "without its tool use" in orphan
