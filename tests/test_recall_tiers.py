"""The tiered recall benchmark (benchmarks/quality/tiers.py, issue 35 item 4).

Its queries must not be answerable by a token only the fact holds (the old benchmark's
codenames were): the checker is tested on a planted violation, then run on every
session the benchmark replays. The score is checked on recall results written by hand,
and the replay (real turn loop, real archive on SQLite in ``tmp_path``, cl100k) on a
small session: the model asks at every need, whatever the request holds.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from benchmarks.quality import sessions, tiered, tiers
from benchmarks.quality.sessions import QualitySession, Turn, from_memory
from normandy_core.app.workload import generate_session


@pytest.fixture(autouse=True)
def _archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(tmp_path / "default.sqlite3"))
    monkeypatch.delenv("NORMANDY_ARCHIVE_URL", raising=False)
    monkeypatch.delenv("NORMANDY_ARCHIVE_SESSION", raising=False)


def _hand_made(queries: dict[tiered.Tier, str]) -> tiered.TieredSession:
    """Two turns: the fact in one output, a near-identical line in the other."""
    fact = "deploy checkout replicas=7"
    turns = (
        Turn("t0", "Read the deploy files.", (), ({"tool_use_id": "a", "content": fact},)),
        Turn(
            "t1",
            "And the next.",
            (),
            ({"tool_use_id": "b", "content": "deploy catalog replicas=3"},),
        ),
    )
    base = QualitySession("hand-made", "You are an agent.", (), turns)
    f = tiered.TieredFact("f01", "batch", fact, 0, 0, ("deploy catalog replicas=3",), (), queries)
    return tiered.TieredSession(base, (f,), ())


def test_the_checker_finds_a_token_only_the_fact_holds() -> None:
    clean = _hand_made({"exact": "deploy replicas", "paraphrase": "x", "meaning": "copies"})
    assert tiered.unique_tokens(clean) == []
    planted = _hand_made({"exact": "Checkout deploy", "paraphrase": "x", "meaning": "copies"})
    assert tiered.unique_tokens(planted) == [("f01", "exact", "checkout")]
    # a word in neither the fact nor the session is a paraphrase, not a giveaway
    assert (
        tiered.unique_tokens(_hand_made({"exact": "zebra", "paraphrase": "", "meaning": ""})) == []
    )


def test_the_checker_finds_a_meaning_query_sharing_a_word_with_its_fact() -> None:
    assert tiered.meaning_overlap(_hand_made({"meaning": "how many copies of it run"})) == []
    assert tiered.meaning_overlap(_hand_made({"meaning": "how many Replicas"})) == [
        ("f01", "replicas")
    ]


def test_the_checker_finds_the_codenames_of_the_older_benchmark() -> None:
    # the quality benchmark's queries name a codename found only where its fact is
    old = sessions.tiny()
    facts = tuple(
        tiered.TieredFact(
            f"n{i}", "task", old.fact(n.fact).text, 0, None, (), (), {"exact": n.query}
        )
        for i, n in enumerate(old.needs)
    )
    found = tiered.unique_tokens(tiered.TieredSession(old, facts, ()))
    assert {f for f, _, _ in found} == {f.id for f in facts}


@pytest.mark.parametrize("quick", [True, False])
def test_no_benchmark_query_holds_a_token_only_its_fact_has(quick: bool) -> None:
    for session in tiered.default_sessions(quick=quick):
        session.check()
        assert tiered.unique_tokens(session) == []
        assert tiered.meaning_overlap(session) == []
        # ... and a query given one of its fact's own tokens would be caught
        for f in session.facts:
            text = tiered.session_text(session.base).split("\n")
            own = set(tiered.words(f.text)) - set(
                tiered.words("\n".join(x for x in text if f.text not in x))
            )
            if own:
                token = sorted(own)[0]
                bad = replace(f, queries={**f.queries, "exact": f"{f.queries['exact']} {token}"})
                facts = tuple(bad if g is f else g for g in session.facts)
                assert (f.id, "exact", token) in tiered.unique_tokens(replace(session, facts=facts))
                break
        else:
            pytest.fail(f"{session.name}: no fact has a token of its own to plant")


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), size=st.integers(600, 1_200))
def test_any_seed_plants_queries_without_a_giveaway(seed: int, size: int) -> None:
    session = tiered.build(from_memory("any", generate_session(seed, size)), seed)
    session.check()  # every fact and rival planted, every need after its fact
    assert tiered.unique_tokens(session) == []
    assert tiered.meaning_overlap(session) == []
    assert len({f.text for f in session.facts}) == len(session.facts)


def test_a_session_too_short_for_its_facts_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"short: \d+ turns are too few to plant 12 facts"):
        tiered.build(from_memory("short", generate_session(0, 300)), 0)


def test_every_kind_of_fact_and_need_is_planted() -> None:
    session = tiered.default_sessions(quick=True)[0]
    assert {f.kind for f in session.facts} == {"task", "error", "path", "setting", "batch"}
    assert {n.timing for n in session.needs} == {"task", "early", "late"}
    setting = next(f for f in session.facts if f.kind == "setting")
    assert len(setting.stale) == 2 and setting.text not in setting.stale
    batch = next(f for f in session.facts if f.kind == "batch")
    assert len(session.base.turns[batch.turn].outputs) == 8  # one batch of eight results


_E = "<entry-ab12 id='{}' role='user'>\n{}\n</entry-ab12>"


def _result(*entries: str) -> str:
    body = "\n".join(_E.format(n, text) for n, text in enumerate(entries))
    return f"[normandy:recall] ...\n<recalled-ab12>\n{body}\n</recalled-ab12>"


def test_the_score_reads_rank_from_the_result() -> None:
    fact = tiered.TieredFact("f", "setting", "set a.b to 42", 0, None, (), ("set a.b to 17",), {})
    assert tiers.score(_result("set a.b to 42", "set a.b to 17"), fact) == tiers.Score(
        True, True, True, True
    )
    assert tiers.score(_result("set a.b to 17", "x set a.b to 42"), fact) == tiers.Score(
        True, False, False, False
    )
    assert tiers.score(_result("set a.b to 17"), fact) == tiers.Score(False, False, False, False)
    line = tiered.TieredFact("g", "error", "E job=a", 0, 0, ("E job=b",), (), {})
    # in the first entry, but after a rival in the same entry
    assert tiers.score(_result("E job=b\nE job=a"), line) == tiers.Score(True, True, False, None)


@pytest.fixture(scope="module")
def small() -> tiered.TieredSession:
    return tiered.build(from_memory("small", generate_session(5, 300)), 5, facts=4)


def test_the_model_asks_every_tier_at_every_need_whatever_the_request_holds(
    small: tiered.TieredSession, tmp_path: Path
) -> None:
    # a window the whole session fits in: nothing is dropped, every fact stays visible
    subject = tiers.SUBJECTS[0]
    out = tiers.replay_tiers(small, subject, 400_000, tmp_path)
    assert len(out) == 3 * len(small.needs)
    assert all(o.visible for o in out)
    assert all(o.compactions == 0 for o in out)
    # nothing was archived, so nothing comes back: a visible fact is not a recalled one
    assert not any(o.score.returned for o in out)


def test_a_tight_window_is_measured_the_same_at_every_run(
    small: tiered.TieredSession, tmp_path: Path
) -> None:
    subject = tiers.SUBJECTS[0]
    first = tiers.replay_tiers(small, subject, 8_000, tmp_path)
    assert any(o.compactions > 5 for o in first if o.need.timing == "late")
    assert any(not o.visible for o in first)
    assert tiers.replay_tiers(small, subject, 8_000, tmp_path) == first
    report = tiers.tables(first, [small], "lexical")
    assert "| 8k | window_manager oldest_first | late | meaning |" in report


def test_an_embedder_that_is_not_installed_is_named() -> None:
    assert tiers.check_embedder(None).startswith("lexical")
    with pytest.raises(SystemExit, match=r"--embedder minilm: not installed; installed: .*'bert'"):
        tiers.check_embedder("minilm")
    assert tiers.check_embedder("bert").startswith("lexical fused with the embedder 'bert'")
