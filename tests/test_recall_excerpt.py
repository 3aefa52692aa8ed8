"""Excerpts: the lines of a long entry that match a recall best, within a bound."""

from __future__ import annotations

from hypothesis import given, strategies as st

from normandy_core.contract.recall_excerpt import MIN_EXCERPT_CHARS, excerpt
from normandy_core.contract.recall_rank import Terms


def test_the_best_matching_lines_come_with_their_neighbours_and_notes_of_the_rest():
    lines = [f"svc{n}: pod ready after {n} ms" for n in range(200)]
    lines[77] = "svc77: quota exceeded for billing, retries 5"
    got = excerpt("\n".join(lines), Terms(["quota", "billing", "svc12"]), 300)
    assert got is not None and len(got) <= 300
    assert got.split("\n") == [
        "[... 11 lines not shown ...]",
        *lines[11:14],
        "[... 62 lines not shown ...]",
        *lines[76:79],
        "[... 121 lines not shown ...]",
    ]


def test_a_line_too_long_is_cut_around_its_match_and_no_match_gives_none():
    got = excerpt("x" * 5000 + " quota " + "y" * 5000, Terms(["quota"]), 200)
    assert got is not None and len(got) <= 200 and " quota " in got
    assert excerpt("nothing here", Terms(["quota"]), 500) is None
    assert excerpt("quota", Terms(["quota"]), MIN_EXCERPT_CHARS - 1) is None


DOC = '''    """Save the invoices and return how many changed."""'''


def test_a_line_holding_a_rare_term_comes_before_lines_of_words_most_hits_hold():
    """Issue 35: "search how many documents per chunk" filled a result with the lines
    ``Save the invoices and return how many changed.`` of file reads (two terms each);
    the line holding ``search``, which few of the hits found hold, is the one to show."""
    lines = []
    for k in range(40):
        lines += [f"def save_{k}(items: list[dict]) -> int:", DOC, "    return 0"]
    lines[70] = "    index = search.open(items)"
    text = "\n".join(lines)
    query = ["search", "how", "many", "documents", "per", "chunk"]
    found = [frozenset({"search", "how", "mani"}), *[frozenset({"how", "mani"})] * 9]
    got = excerpt(text, Terms(query).weighed(found), 200)
    assert got is not None and "search.open" in got
    # each term weighing 1, the first docstring (two terms) wins and fills the bound
    unweighed = excerpt(text, Terms(query), 200)
    assert unweighed is not None and "search.open" not in unweighed and DOC in unweighed


_WORDS = st.sampled_from(["alpha", "beta", "quota", "billing", "ready", "pod", "x" * 300])


@given(
    st.lists(st.lists(_WORDS, max_size=12).map(" ".join), min_size=1, max_size=80),
    st.lists(st.sampled_from(["quota", "billing", "alpha"]), min_size=1, max_size=3),
    st.integers(MIN_EXCERPT_CHARS, 3000),
)
def test_an_excerpt_is_within_its_bound_and_holds_a_matched_term(lines, query, bound):
    text = "\n".join(lines)
    terms = Terms(query)
    got = excerpt(text, terms, bound)
    if not terms.matched(text):
        assert got is None
        return
    assert got is not None
    assert len(got) <= bound
    assert terms.matched(got)
    # what it shows is the text's own lines (or a window of one), in their order
    shown = [line for line in got.split("\n") if not line.startswith("[... ")]
    at = 0
    for line in shown:
        core = line.strip(".")
        found = text.find(core, at)
        assert found >= 0
        at = found
