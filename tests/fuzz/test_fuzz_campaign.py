"""A bounded, deterministic slice of the fuzz campaign (issues 12 and 13), plus a hypothesis
wrapper.

The slice runs :data:`CASES` cases of seed :data:`SEED` (a few seconds), every format
(the Responses API too) and, for a share of the provider-format cases, continuation
sequences. No finding is allowed but those of the open defects (:data:`OPEN`, each with
a strict xfail reproducer in ``test_findings_13.py``). The defects of issue 12
(:mod:`fuzz.known`) are all fixed; each keeps a test of its own that its check never
fires again (they fired in this slice before their fixes). The long campaign is
``make fuzz``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import given, settings, strategies as st

from fuzz.campaign import COMPACTORS, CaseReport, Finding, case_rng, run_case, run_indexed
from fuzz.generators import FORMATS, PROVIDER_FORMATS
from fuzz.known import DEFECTS, classify
from fuzz.provider import NATIVE
from normandy_core.contract import plugins

SEED = 5
CASES = 300

#: Known defects still firing in this slice (none: each was fixed, after firing here at
#: case #1 33, #2 3, #3 38, #4 41, #5 225, #6 156, #9 0, new-thinking 139,
#: new-clear-inputs 191, new-offbranch 11; #10 never did: the in-tree compactors insert a
#: marker, and the core's contract check now refuses a result that would not).
FIRING: set[str] = set()
#: Open defects: findings they explain are allowed anywhere until they are fixed (none;
#: issue 13's two, 13-identity and 13-redrop, are fixed: see test_findings_13.py).
OPEN: set[str] = set()


@pytest.fixture(scope="module")
def reports() -> Iterator[list[CaseReport]]:
    """The slice's case reports, run once, with the archive hook disabled."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(plugins.ENV_DISABLE, "archive")
        mp.delenv(plugins.ENV_LOAD, raising=False)
        plugins.reload_plugins()
        try:
            yield [run_indexed(SEED, i) for i in range(CASES)]
        finally:
            mp.undo()
            plugins.reload_plugins()


def _show(findings: list[Finding]) -> str:
    return "\n".join(f"{f.check}: {f.message[:200]}\n    {f.reproducer()}" for f in findings[:8])


def _unexplained(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if classify(f) not in OPEN]


def test_no_finding_at_all(reports: list[CaseReport]) -> None:
    found = _unexplained([f for r in reports for f in r.findings])
    assert not found, f"{len(found)} findings:\n{_show(found)}"


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(
            d.key,
            id=d.key,
            marks=[pytest.mark.xfail(strict=False, reason=f"{d.key}: {d.title}")]
            if d.key in FIRING
            else [],
        )
        for d in DEFECTS
    ],
)
def test_known_defect_does_not_fire(reports: list[CaseReport], key: str) -> None:
    hits = [f for r in reports for f in r.findings if classify(f) == key]
    assert not hits, f"{len(hits)} findings of {key}:\n{_show(hits)}"


def test_the_slice_covers_every_compactor_format_and_path(reports: list[CaseReport]) -> None:
    cells = Counter((r.compactor, r.format) for r in reports)
    # A native compactor compacts its own provider's format only.
    missing = [
        (c, f)
        for c in COMPACTORS
        for f in ((NATIVE[c][1],) if c in NATIVE else FORMATS)
        if not cells[(c, f)]
    ]
    assert not missing, f"compactor x format never drawn: {missing}"
    outcomes = Counter(r.outcome for r in reports)
    assert outcomes["compacted"] and outcomes["skipped"] and outcomes["error"], outcomes
    assert not outcomes["raised"] and not outcomes["rejected"], outcomes
    modes = Counter((r.mode, r.format) for r in reports if r.outcome == "compacted")
    sequences = [(m, f) for m in ("continue-full", "continue-replace") for f in PROVIDER_FORMATS]
    assert all(modes[cell] for cell in sequences), modes
    calls = sum(r.calls for r in reports)
    continued = sum(r.continued for r in reports)
    sequenced = sum(1 for r in reports if r.mode != "single")
    assert continued >= (calls - sequenced) * 0.9, (calls, continued, sequenced)


def test_a_case_is_reproducible_from_seed_and_index() -> None:
    def key(r: CaseReport) -> str:
        # Messages may name entry ids, which are fresh uuids on every parse.
        found = [json.loads(f.to_json()) for f in r.findings]
        for f in found:
            f.pop("message")
        return json.dumps([r.compactor, r.format, r.outcome, found], sort_keys=True)

    for i in range(15):
        assert key(run_indexed(SEED + 1, i)) == key(run_indexed(SEED + 1, i))


@settings(deadline=None)
@given(seed=st.integers(0, 2**31), index=st.integers(0, 10**6))
def test_fuzz_case_under_hypothesis(seed: int, index: int) -> None:
    """Cases hypothesis picks (derandomized under the CI profile): no finding."""
    findings = _unexplained(run_case(case_rng(seed, index), seed=seed, index=index))
    assert not findings, _show(findings)
