"""A compactor that holds the GIL in C past its time limit (issue 32, case 5).

``compaction_timeout`` is waited for with ``Thread.join(timeout)``, which needs the GIL to
wake up. A compactor running a catastrophic regular expression holds the GIL inside the
C matcher for the whole match, so the wait ended only when the match did, seconds past
the limit, and the compactor's result, which had just arrived, was taken as if it had
come in time (``error=None``, the memory compacted). A result that arrives after its
limit is now refused: the error path, the memory as it was. The boundary still waits
until the C code lets go (no thread can take the GIL from it); docs/concepts.md says so.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

import pytest
from reliability_counts import LATE_REGEX_BOUNDARIES

from normandy_core import (
    AgentConfig,
    AgentMemory,
    hookimpl,
    register_compactor,
    reload_plugins,
    run_compaction,
)

#: The pattern and the subject that make ``re`` backtrack 2**n times: ``(a+)+$`` over
#: ``a * n + "b"``. The matcher is C code that keeps the GIL throughout.
PATTERN = re.compile(r"(a+)+$")
#: The compaction_timeout of these tests, and how long the match is made to take at least.
LIMIT = 0.1
MATCH_SECONDS = 0.5


def _subject_length() -> int:
    """The ``n`` for which the match takes about :data:`MATCH_SECONDS` on this machine
    now: each extra ``a`` doubles the time, so one measured length gives the others."""
    n = 18
    t0 = time.perf_counter()
    PATTERN.match("a" * n + "b")
    took = max(time.perf_counter() - t0, 1e-4)
    return n + max(math.ceil(math.log2(MATCH_SECONDS / took)), 1)


class CatastrophicRegex:
    """Scans the newest tool output with a catastrophic pattern, then drops the two
    oldest entries; notes how long each scan held the GIL."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        self.scans: list[float] = []

    @hookimpl
    def needs_window(self, opts: Any) -> bool:
        return False

    @hookimpl
    def maybe_compact(self, acc: Any, ctx: Any, opts: Any) -> Any:
        t0 = time.perf_counter()
        PATTERN.match(self.subject)
        self.scans.append(time.perf_counter() - t0)
        entries = acc.memory.entries()
        return acc.with_memory(acc.memory.derive(entries[2:])), {
            "compacted": True,
            "dropped": entries[:2],
        }


def _conversation() -> AgentMemory:
    mem = AgentMemory()
    for i in range(12):
        mem.add_message("user" if i % 2 == 0 else "assistant", f"message {i} " + "x" * 40)
    return mem


@pytest.fixture(params=["no hook plugins", "the installed hook plugins"])
def hooks(request, monkeypatch):
    """Without hook plugins the late result was taken as it came; with the archive's
    ``before_commit`` installed it was refused for want of time left for the hook."""
    if request.param == "no hook plugins":
        monkeypatch.setenv("NORMANDY_DISABLE_PLUGINS", "archive")
        reload_plugins()
    return request.param


def test_a_compactor_holding_the_gil_past_its_limit_has_its_late_result_refused(hooks):
    compactor = CatastrophicRegex("a" * _subject_length() + "b")
    register_compactor("catastrophic_regex", compactor, replace=True)
    acc = AgentConfig(
        model="gpt-4o",
        compactor="catastrophic_regex",
        compaction_timeout=LIMIT,
        survival={"keep_first_user": False},  # it drops the task too
    ).with_memory(_conversation())
    before = acc.memory.dump()
    for n in range(1, LATE_REGEX_BOUNDARIES + 1):
        t0 = time.perf_counter()
        out, meta = run_compaction(acc, mid_round=False)
        waited = time.perf_counter() - t0
        # the boundary may take the GIL back before the worker noted its scan
        end = time.monotonic() + 30
        while len(compactor.scans) < n and time.monotonic() < end:
            time.sleep(0.01)
        scan = compactor.scans[-1]
        # the regex really held the GIL past the limit, and the boundary waited for it
        assert scan > 2 * LIMIT
        assert waited >= scan * 0.95  # (the scan's clock started after the boundary's)
        # ... and what it returned late is refused: the error path, the memory untouched
        assert meta.compacted is False
        assert meta.error is not None
        assert "catastrophic_regex" in meta.error
        # when the match ends, the waiting thread takes the GIL back either before the
        # worker noted that it finished (the wait timed out: abandoned) or after (late)
        assert re.search(
            rf"did not return within {LIMIT:g} s \(compaction_timeout\); its result will be "
            rf"ignored|returned after \d+\.\d+ s, past compaction_timeout \({LIMIT:g} s\): "
            "its late result is refused",
            meta.error,
        ), meta.error
        assert out is acc
        assert acc.memory.dump() == before
    assert len(compactor.scans) == LATE_REGEX_BOUNDARIES


def test_a_compactor_that_returns_in_time_under_the_limit_is_taken():
    """The same compactor with a subject it matches at once: its compaction stands."""
    compactor = CatastrophicRegex("a" * 10 + "b")
    register_compactor("quick_regex", compactor, replace=True)
    acc = AgentConfig(
        model="gpt-4o",
        compactor="quick_regex",
        compaction_timeout=5.0,
        survival={"keep_first_user": False},
    ).with_memory(_conversation())
    out, meta = run_compaction(acc, mid_round=False)
    assert meta.compacted is True and meta.error is None
    assert len(out.memory) == 10
    assert [e.id for e in meta.dropped] == [e.id for e in acc.memory.entries()[:2]]
