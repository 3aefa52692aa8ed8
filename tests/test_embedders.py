"""The embedders group (issue 35 item 2): names resolved, unknown ones refused by name,
and reciprocal rank fusion's order."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, strategies as st

from normandy_core.contract.embedders import (
    EMBEDDER_GROUP,
    UnknownEmbedderError,
    installed_embedders,
    resolve_embedder,
)
from normandy_core.contract.recall_rank import fuse


def test_unknown_embedder_is_refused_naming_it_and_the_installed_ones():
    with pytest.raises(UnknownEmbedderError, match=r"unknown embedder 'berrt'") as err:
        resolve_embedder("berrt")
    assert EMBEDDER_GROUP in str(err.value)
    assert err.value.installed == installed_embedders()


rankings = st.lists(st.integers(0, 30), unique=True, max_size=20)


@given(rankings)
def test_one_ranking_is_kept(ranking):
    assert fuse(ranking) == ranking


@given(rankings, rankings)
def test_fusion_is_every_item_once(a, b):
    fused = fuse(a, b)
    assert sorted(fused) == sorted(set(a) | set(b))


@given(rankings, rankings)
def test_first_in_both_comes_first(a, b):
    if a and b and a[0] == b[0]:
        assert fuse(a, b)[0] == a[0]


@given(rankings, rankings)
def test_held_by_both_beats_held_by_one_at_the_same_place(a, b):
    fused = fuse(a, b)
    both, only = set(a) & set(b), set(a) - set(b)
    for x in both:
        for y in only:
            if a.index(x) <= a.index(y):
                assert fused.index(x) < fused.index(y)


def test_a_meaning_only_hit_first_by_similarity_rises_above_weak_lexical_ones():
    lexical = [1, 2, 3, 4, 5]
    similar = [9, 3, 1]
    fused = fuse(lexical, similar)
    assert fused[:2] == [1, 3]
    assert fused.index(9) < fused.index(4)


@given(rankings, rankings)
def test_weights_of_one_are_no_weights(a, b):
    assert fuse(a, b, weights=({i: 1.0 for i in a},)) == fuse(a, b)


def test_a_weak_keyword_hit_falls_below_a_close_meaning():
    lexical = [1, 2, 3]  # 1 holds one word of a long question, 3 holds most of it
    similar = [9, 3]
    plain = fuse(lexical, similar)
    assert plain.index(1) < plain.index(9)  # alike at the same place: the keyword one first
    fused = fuse(lexical, similar, weights=({1: 0.1, 2: 0.1, 3: 0.8},))
    assert fused[:2] == [3, 9]
    assert fused.index(9) < fused.index(1)


_TERMS = st.lists(st.sampled_from(["how", "many", "retry", "payments", "chunk"]), min_size=1)


@given(_TERMS, st.lists(st.sets(st.sampled_from(["how", "many", "retri", "payment"])), max_size=8))
def test_the_share_of_the_query_a_hit_holds_is_between_0_and_1(query, sets):
    from normandy_core.contract.recall_rank import Terms, held_share

    asked = Terms(query)
    matched = [frozenset(s) & frozenset(asked.phrases) for s in sets]  # what texts can hold
    shares = held_share(asked.weighed(matched), matched)
    assert len(shares) == len(matched)
    assert all(0.0 <= x <= 1.0 + 1e-9 for x in shares)


def test_a_hit_holding_only_common_words_of_a_question_holds_little_of_it():
    from normandy_core.contract.recall_rank import Terms, held_share

    asked = Terms(["how", "many", "documents", "per", "chunk"])
    matched = [frozenset({"how", "mani"})] * 9 + [frozenset({"how"})]
    shares = held_share(asked.weighed(matched), matched)
    assert max(shares) < 0.2  # three of the five words are in no hit: a question in other words
    exact = Terms(["payments", "retry"])
    hits = [frozenset({"payment", "retri"}), frozenset({"payment"}), frozenset()]
    assert held_share(exact.weighed(hits), hits)[0] == 1.0


def _said_hit(n: int, text: str, superseded: dict[str, str] | None = None):
    from normandy_core import Entry, RecallHit

    return RecallHit(Entry(id=f"e{n}", role="user", content=text), superseded=superseded or {})


def test_a_stale_value_ranked_first_by_meaning_goes_after_its_successor():
    from normandy_core.contract.recall_rank import successors_first

    hits = [
        _said_hit(0, "set cache.ttl to 10", {"cache.ttl": "30"}),
        _said_hit(1, "the cache is warm"),
        _said_hit(2, "set cache.ttl to 20", {"cache.ttl": "30"}),
        _said_hit(3, "Now set cache.ttl to 30."),
    ]
    assert successors_first(hits, [0, 1, 2, 3]) == [1, 3, 0, 2]
    assert successors_first(hits, [3, 0, 1, 2]) == [3, 0, 2, 1]  # the stale ones beside it
    assert successors_first(hits[:3], [0, 1, 2]) == [0, 1, 2]  # no successor found: kept


@given(st.permutations(range(4)))
def test_moving_stale_values_keeps_every_hit_once(order):
    from normandy_core.contract.recall_rank import successors_first

    hits = [
        _said_hit(0, "set a to 1", {"a": "3"}),
        _said_hit(1, "set a to 2 and b=5", {"a": "3", "b": "6"}),
        _said_hit(2, "set a to 3", {"b": "6"}),
        _said_hit(3, "b=6"),
    ]
    got = successors_first(hits, list(order))
    assert sorted(got) == [0, 1, 2, 3]
    assert got.index(0) > got.index(2) and got.index(1) > got.index(3)


def test_when_every_hit_holds_every_term_the_share_counts_terms():
    from normandy_core.contract.recall_rank import Terms, held_share

    asked = Terms(["invoice", "declined"])
    matched = [frozenset({"invoic", "declin"})]
    assert held_share(asked.weighed(matched), matched) == [1.0]


_COSINES = st.lists(st.floats(-1.0, 1.0, allow_nan=False), max_size=24)


@given(_COSINES, st.floats(-0.5, 0.5, allow_nan=False))
def test_a_hit_by_meaning_weighs_how_it_stands_out_whatever_the_level(cosines, shift):
    from normandy_core.contract.recall_rank import standout

    got = standout(cosines)
    assert len(got) == len(cosines) and all(w >= 0.0 for w in got)
    for (a, wa), (b, wb) in itertools.pairwise(zip(cosines, got, strict=True)):
        assert (a <= b) <= (wa <= wb)  # closer never weighs less
    assert sum(w == 0.0 for w in got) >= len(cosines) / 2  # the median and below: nothing
    shifted = standout([c + shift for c in cosines])
    assert all(abs(x - y) < 1e-9 for x, y in zip(shifted, got, strict=True))


def test_a_source_without_similarities_leaves_its_places_to_speak():
    from normandy_core.contract.recall_rank import standout

    assert standout([0.9, None, 0.1]) == [1.0, 1.0, 1.0]
    assert standout([]) == []


def test_a_flat_ranking_by_meaning_leaves_the_order_to_the_keywords():
    """Issue 35's paraphrase tier: a small model gives texts that share only the query's
    topic cosines of about 0.5, and weighed by them, those pushed the listing holding
    the path out of the bound; weighed by how they stand out, they do not."""
    from normandy_core.contract.recall_rank import standout

    lexical, shares = [1, 2, 3], {1: 0.3, 2: 0.3, 3: 0.25}
    similar, flat = [9, 8, 7, 6, 5], [0.54, 0.53, 0.52, 0.51, 0.50]
    raw = fuse(lexical, similar, weights=(shares, dict(zip(similar, flat, strict=True))))
    assert raw[0] == 9 and raw.index(3) > 3
    stands = dict(zip(similar, standout(flat), strict=True))
    assert fuse(lexical, similar, weights=(shares, stands))[:3] == [1, 2, 3]
    clear = dict(zip(similar, standout([0.8, 0.4, 0.39, 0.38, 0.37]), strict=True))
    assert fuse(lexical, similar, weights=(shares, clear))[0] == 9
