"""The campaign's checks can fail: faulty compactors registered in code are caught.

The core's own contract check refuses these compactors before ``compact()`` returns,
so to show that the campaign's independent loss check would catch them too, the core's
check is bypassed here (and, separately, shown to refuse them).
"""

from __future__ import annotations

from typing import Any

import pytest

from fuzz.campaign import run_indexed
from fuzz.generators import FORMATS, PROVIDER_FORMATS
from normandy_core import AgentConfig, group_units, hookimpl, register_compactor


class _Faulty:
    """A compactor that needs no window and applies ``fn`` to the active branch."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    @hookimpl
    def needs_window(self, opts: dict[str, Any]) -> bool:
        return False

    @hookimpl
    def maybe_compact(self, acc: AgentConfig, ctx: Any, opts: dict[str, Any]) -> Any:
        entries = acc.memory.entries()
        kept = self.fn(entries)
        if kept is None:
            return acc, {"compacted": False}
        return acc.with_memory(acc.memory.derive(kept)), {"compacted": True}


def _drop_first_unit(entries: list[Any]) -> list[Any] | None:
    """Drops the oldest non-system unit and reports nothing."""
    units = [u for u in group_units(entries) if entries[u[0]].role != "system"]
    if len(units) < 3:
        return None
    start, end = units[0]
    return entries[:start] + entries[end:]


def _rewrite_a_result(entries: list[Any]) -> list[Any] | None:
    """Replaces the first tool result's content and reports nothing."""
    for i, e in enumerate(entries):
        if e.tool_results:
            blocks = tuple(
                b.model_copy(update={"content": "gone"}) if b.type == "tool_result" else b
                for b in e.content
            )
            return [*entries[:i], e.model_copy(update={"content": blocks}), *entries[i + 1 :]]
    return None


@pytest.mark.parametrize("fn", [_drop_first_unit, _rewrite_a_result])
def test_the_core_refuses_unreported_loss_in_every_format(fn: Any) -> None:
    register_compactor("fuzz_faulty", _Faulty(fn))
    errors: dict[str, set[str]] = {}
    for i in range(60):
        r = run_indexed(3, i, compactor="fuzz_faulty")
        assert r.outcome != "compacted", r
        if r.outcome == "error":
            errors.setdefault(r.format, set()).update(f.message for f in r.findings)
    assert set(errors) == set(FORMATS)
    assert all(any("lost silently" in e for e in es) for es in errors.values()), errors


@pytest.mark.parametrize("fn", [_drop_first_unit, _rewrite_a_result])
def test_unreported_loss_is_found_in_every_format(fn: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from normandy_core import contract

    def shape_only(compactor: Any, acc: Any, ctx: Any, result: Any) -> Any:
        new_acc, meta = result
        return contract.CompactionResult(new_acc, contract.CompactionMeta(meta))

    monkeypatch.setattr(contract, "check_compaction", shape_only)
    register_compactor("fuzz_faulty", _Faulty(fn))
    found: dict[str, set[str]] = {}
    for i in range(60):
        r = run_indexed(3, i, compactor="fuzz_faulty")
        if r.outcome == "compacted":
            found.setdefault(r.format, set()).update(f.check for f in r.findings)
    assert set(found) == set(FORMATS)
    assert all("loss" in checks for checks in found.values()), found
    # the entry accounting of the provider formats finds it too, independently
    assert all("accounting" in found[f] for f in PROVIDER_FORMATS), found
