"""Recall's ranking: coverage by stems weighted by rarity, recency among near-equal
matches, superseded settings after their successor, near-identical hits once."""

from __future__ import annotations

from hypothesis import given, strategies as st

from normandy_core import Entry, RecallHit, TextBlock, ToolResultBlock
from normandy_core.contract.recall_rank import (
    MIN_FUZZY_WORDS,
    Terms,
    assignments,
    dedupe,
    held_share,
    near_identical,
    rank,
    rarity,
    supersede,
)


def _hit(text: str, order: int, role: str = "user", at: float = 1000.0) -> RecallHit:
    return RecallHit(Entry(id=f"e{order}", role=role, content=text), "s", at, {}, order)


def _ids(hits: list[RecallHit]) -> list[str]:
    return [h.entry.id for h in hits]


def _ranked(hits: list[RecallHit], query: str) -> list[RecallHit]:
    texts = [h.entry.text() for h in hits]
    return [hits[i] for i in rank(hits, Terms(query.split()), texts)]


def test_terms_match_by_stems_as_whole_words_and_phrases():
    terms = Terms(["retries", "eu-west-1", "..."])
    assert terms.phrases == ("retri", "eu west 1")
    assert terms.matched("Retrying in EU-WEST-1 now") == {"retri", "eu west 1"}
    assert terms.matched("eu-west-12 retrieval") == frozenset()  # whole words only


def test_more_of_the_query_first_then_the_newer_of_near_equal_matches():
    hits = [
        _hit("deploy failed in eu", 1),
        _hit("deploy failed in eu again", 2),
        _hit("deploy failed in eu with a timeout", 3),
        _hit("nothing about it: failed", 4),
    ]
    # the sources' order is kept for what tells the hits apart: coverage first
    assert _ids(_ranked(hits, "deploy timeout")) == ["e3", "e2", "e1", "e4"]
    # e1 and e2 match the same terms (near-equal): the later one first
    assert _ids(_ranked(hits[:2], "deploy eu")) == ["e2", "e1"]


def test_neighbouring_terms_are_held_together_in_either_order_only_side_by_side():
    terms = Terms(["auth", "sessions", "totals"], adjacent=True)
    assert terms.phrases == ("auth", "session", "total", "auth session", "session total")
    assert terms.matched("M  src/auth/sessions/totals.py") == set(terms.phrases)
    assert terms.matched("sessions of auth") == {"auth", "session"}  # apart: words only
    assert terms.matched("session auth") == {"auth", "session", "auth session"}  # swapped
    assert Terms(["auth", "auth"], adjacent=True).phrases == ("auth",)  # no pair with itself
    assert Terms(["auth", "sessions"]).pairs == {}  # off unless asked


def test_words_side_by_side_rank_a_path_before_an_output_holding_them_apart():
    """Issue 35's paraphrase tier: "auth sessions file that adds up sums" asks for
    src/auth/sessions/totals.py; newer test outputs hold auth and sessions too, far apart,
    and as the same set of terms the newer came first."""
    fact = _hit("M  src/auth/sessions/totals.py  (+12 -3)\nM  src/auth/sessions/models.py", 0)
    rivals = [
        _hit(f"tests/test_auth.py::test_ledger_{k} PASSED\ntests/test_sessions.py::t PASSED", k)
        for k in range(1, 5)
    ]
    hits = [*rivals, fact]  # the sources' order: the outputs first
    texts = [h.entry.text() for h in hits]
    query = ["auth", "sessions", "file", "that", "adds", "up", "sums"]
    assert _ids([hits[i] for i in rank(hits, Terms(query), texts)])[0] != "e0"
    assert _ids([hits[i] for i in rank(hits, Terms(query, adjacent=True), texts)])[0] == "e0"


def _docstrings(name: str, k: int, extra: str = "") -> str:
    """A file read whose docstrings all hold ``how many`` (as a batch of reads does)."""
    return f'''(tool result for id=read_{k})
def save_{name}(items: list[dict]) -> int:
    """Save the {name}s and return how many changed."""{extra}'''


def test_rarity_is_the_inverse_document_frequency_among_what_was_searched():
    assert rarity(1, 8) > rarity(4, 8) > rarity(7, 8) > 0
    assert rarity(8, 8) == 0 and rarity(0, 8) == 0
    terms = Terms(["payments", "how", "many"])
    weighed = terms.weighed([frozenset({"payment", "how"}), frozenset({"how"})])
    assert weighed.weights == {"payment": rarity(1, 2), "how": 0.0, "mani": 0.0}
    assert terms.weights == dict.fromkeys(terms.phrases, 1.0)  # a copy: the query's stay 1


def test_a_rare_term_outweighs_two_words_most_hits_hold():
    """Issue 35's paraphrase tier: "payments how many retries" put file reads holding
    payments, how and many before the setting holding payments and retry (3 terms of 4
    against 2); how and many are in nearly every hit, retry in one."""
    fact = _hit("Now set payments.retry_limit to 42.", 0)
    rivals = [
        _hit(_docstrings("payment" if k < 3 else f"invoice{k}", k), k + 1, role="user")
        for k in range(8)
    ]
    ranked = _ranked([*rivals, fact], "payments how many retries")
    assert _ids(ranked)[0] == "e0"
    # the same for a fact holding one term: "search how many documents per chunk"
    setting = _hit("Now set search.batch_size to 38.", 0)
    assert _ids(_ranked([*rivals, setting], "search how many documents per chunk"))[0] == "e0"


def test_a_setting_changed_later_is_marked_and_ranked_after_its_successor():
    hits = [
        _hit("Please set timeout to 30 for this work.", 1),
        _hit("Change of plan: set timeout to 60.", 2),
        _hit("Now set timeout to 45.", 3),
        _hit("retries=3 and timeout = 45", 4, role="assistant"),
    ]
    marked = supersede(hits, [])
    assert [h.superseded for h in marked] == [{"timeout": "45"}, {"timeout": "45"}, {}, {}]
    order = _ranked(marked, "timeout")
    assert _ids(order)[:2] == ["e4", "e3"] and set(_ids(order)[2:]) == {"e1", "e2"}
    # what the model still sees is newer than anything archived
    still = [Entry(id="now", role="user", content="set timeout to 90")]
    assert all(h.superseded == {"timeout": "90"} for h in supersede(hits, still))


def test_tool_output_is_not_a_setting_and_an_equal_value_supersedes_nothing():
    result = Entry(
        id="r",
        role="user",
        content=[ToolResultBlock(tool_use_id="t", content="ERROR job=nightly region=eu")],
    )
    assert assignments(result) == {}
    said = Entry(id="a", role="assistant", content=[TextBlock(text="I set LIMIT to 5.")])
    assert assignments(said) == {"limit": "5"}
    hits = [_hit("set limit to 5", 1), _hit("set limit to 5", 2)]
    assert all(not h.superseded for h in supersede(hits, []))


def test_near_identical_means_the_same_words_or_a_long_text_barely_changed():
    assert near_identical("Deploy FAILED: eu.", "deploy failed eu")
    # short lines that differ by a job and a region are different facts
    assert not near_identical("ERROR job=a-nightly region=eu: x", "ERROR job=b-hourly region=us: x")
    long = " ".join(f"line{n} of the file" for n in range(40))
    assert near_identical(long, long.replace("line7 ", "line7b "))
    assert not near_identical(long, " ".join(f"other{n} text here" for n in range(40)))
    assert MIN_FUZZY_WORDS > 10


_TEXTS = st.sampled_from(
    [
        "set timeout to 30",
        "set timeout to 60",
        "deploy failed in eu",
        "Deploy failed in EU!",
        "timeout=45 retries=2",
        "the ledger drifts",
        "nothing relevant",
    ]
)


@given(
    st.lists(st.tuples(_TEXTS, st.integers(0, 5)), max_size=12),
    st.sampled_from(["timeout", "deploy eu", "ledger timeout", "retries deploy failed"]),
)
def test_ranking_is_a_deterministic_permutation(items, query):
    hits = supersede([_hit(t, n, at=float(at)) for n, (t, at) in enumerate(items)], [])
    texts = [h.entry.text() for h in hits]
    order = rank(hits, Terms(query.split()), texts)
    assert sorted(order) == list(range(len(hits)))
    assert order == rank(hits, Terms(query.split()), texts)
    # coverage, each term weighed by its rarity among these hits, never increases
    terms = Terms(query.split())
    held = [terms.matched(t) for t in texts]
    weighed = terms.weighed(held)
    covered = [weighed.weight(held[i]) for i in order]
    assert covered == sorted(covered, reverse=True)


@given(
    st.lists(st.tuples(_TEXTS, st.integers(0, 5)), min_size=1, max_size=12),
    st.sampled_from(["timeout", "deploy eu", "ledger timeout", "retries deploy failed"]),
    st.sampled_from(["zephyr", "zephyr-9", "ZEPHYRS"]),
)
def test_a_term_every_hit_holds_does_not_change_the_order(items, query, common):
    hits = supersede([_hit(t, n, at=float(at)) for n, (t, at) in enumerate(items)], [])
    texts = [h.entry.text() for h in hits]
    before = rank(hits, Terms(query.split()), texts)
    held = [f"{t} {common}" for t in texts]
    assert rank(hits, Terms([*query.split(), common]), held) == before


@given(st.lists(_TEXTS, max_size=12))
def test_dedupe_is_idempotent_and_keeps_one_of_each_near_identical_group(texts):
    hits = [_hit(t, n) for n, t in enumerate(texts)]
    kept, left = dedupe(hits, texts)
    kept_texts = [h.entry.text() for h in kept]
    assert left == len(hits) - len(kept)
    assert dedupe(kept, kept_texts) == (kept, 0)
    for t in texts:  # every text is represented by one kept hit
        assert any(near_identical(t, k) for k in kept_texts)


@given(
    st.lists(st.tuples(_TEXTS, st.integers(0, 5)), max_size=12),
    st.sampled_from(["timeout ledger", "eu deploy", "drifts timeout", "failed retries"]),
)
def test_pairs_no_hit_holds_leave_the_order_and_the_shares_as_they_were(items, query):
    """Queries whose neighbouring words no text of :data:`_TEXTS` has side by side."""
    hits = supersede([_hit(t, n, at=float(at)) for n, (t, at) in enumerate(items)], [])
    texts = [h.entry.text() for h in hits]
    alone, paired = Terms(query.split()), Terms(query.split(), adjacent=True)
    assert rank(hits, paired, texts) == rank(hits, alone, texts)
    held = [alone.matched(t) for t in texts]
    assert [paired.matched(t) for t in texts] == held
    assert held_share(paired.weighed(held), held) == held_share(alone.weighed(held), held)


def test_a_pair_weighs_only_the_weight_its_ranking_gave_it():
    terms = Terms(["auth", "sessions", "sums"], adjacent=True)
    assert terms.reweighed({"auth session": 2.5}).weights == {
        "auth": 1.0, "session": 1.0, "sum": 1.0, "auth session": 2.5, "session sum": 0.0
    }  # fmt: skip
