"""The campaign's checks can fail: faulty compactors registered in code are caught.

The core's own contract check refuses these compactors before ``compact()`` returns,
so to show that the campaign's independent loss check would catch them too, the core's
check is bypassed here (and, separately, shown to refuse them).
"""

from __future__ import annotations

import functools
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
    from normandy_core.contract import check

    def shape_only(compactor: Any, acc: Any, ctx: Any, result: Any) -> Any:
        new_acc, meta = result
        return check.CompactionResult(new_acc, check.CompactionMeta(meta))

    monkeypatch.setattr(check, "check_compaction", shape_only)
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


# -- the checks of issue 13 fail on doctored results -------------------------------------


def _doctored(monkeypatch: pytest.MonkeyPatch, doctor: Any, **force: Any) -> None:
    """``compact()`` as the campaign calls it, with its result passed through ``doctor``."""
    import dataclasses

    from fuzz import campaign

    real = campaign.compact

    def compact(data: Any, **kwargs: Any) -> Any:
        result = real(data, **{**kwargs, **force})
        messages = doctor(result)
        return result if messages is None else dataclasses.replace(result, messages=messages)

    monkeypatch.setattr(campaign, "compact", compact)


def _checks(indices: Any, seed: int = 3, *, ran: bool = False) -> dict[tuple[str, str], set[str]]:
    """The checks that found something, per (mode, format); ``ran``: only cases whose
    calls ran (a drawn configuration refused where it is made runs none)."""
    found: dict[tuple[str, str], set[str]] = {}
    for i in indices:
        r = run_indexed(seed, i)
        if ran and r.outcome == "refused":
            continue
        found.setdefault((r.mode, r.format), set()).update(f.check for f in r.findings)
    return found


def test_messages_rebuilt_for_nothing_are_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs deep-copied (equal, but not the objects given): ``identity`` in every format."""
    import copy

    _doctored(monkeypatch, lambda r: copy.deepcopy(r.messages) if r.format != "normandy" else None)
    found = _checks(range(40))
    singles = {
        f for (mode, f), checks in found.items() if mode == "single" and "identity" in checks
    }
    assert singles == set(PROVIDER_FORMATS), found


def test_a_dropped_provider_compaction_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider's compaction taken out of every output: ``provider_compaction``."""
    from fuzz import campaign

    def without(r: Any) -> Any:
        if r.format not in ("anthropic", "responses"):
            return None
        out = []
        for m in campaign._messages_of(r.messages):
            content = m.get("content")
            if m.get("type") == "compaction":
                continue
            if isinstance(content, list):
                m = {**m, "content": [b for b in content if b.get("type") != "compaction"]}
            out.append(m)
        return {**r.messages, "messages": out} if isinstance(r.messages, dict) else out

    _doctored(monkeypatch, without)
    found = _checks([i for i in range(300) if _provider_compaction(3, i)][:12])
    formats = {f for (_, f), checks in found.items() if "provider_compaction" in checks}
    assert formats == {"anthropic", "responses"}, found


@functools.cache
def _draw(seed: int, i: int) -> Any:
    """Case ``i`` of campaign ``seed`` as drawn (not run)."""
    from fuzz import campaign

    return campaign._draw_case(
        campaign.case_rng(seed, i), seed, i, campaign.CaseReport(seed, i), None
    )


def _provider_compaction(seed: int, i: int) -> bool:
    """Whether case ``i`` draws a session with a provider compaction."""
    from fuzz.generators import Assistant

    c = _draw(seed, i)
    return any(isinstance(m, Assistant) and m.compaction for _, m in c.session.messages)


def test_calls_not_continued_are_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call of a sequence compacted from scratch (``fresh=True``): ``not_continued``,
    and, where the agent keeps its full history, ``dropped_twice``."""
    _doctored(monkeypatch, lambda r: None, fresh=True)
    sequences = [i for i in range(200) if _draw(3, i).mode != "single"]
    full = [i for i in sequences if _draw(3, i).mode == "continue-full"]
    compacting = [i for i in full if _draw(3, i).compactor in ("window_manager", "pipeline")]
    found = _checks(sorted({*sequences[:8], *compacting[:8]}), ran=True)
    assert all(
        "not_continued" in found[(mode, f)]
        for mode in ("continue-full", "continue-replace")
        for f in PROVIDER_FORMATS
        if (mode, f) in found
    ), found
    assert any("dropped_twice" in checks for (mode, _), checks in found.items()), found
