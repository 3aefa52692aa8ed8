"""The parts of an entry recall by meaning embeds, and the excerpt centred on the closest."""

from __future__ import annotations

from hypothesis import given, strategies as st

from normandy_core.contract.recall_excerpt import Excerpts
from normandy_core.contract.recall_parts import MAX_PARTS, PART_CHARS, parts, parts_key
from normandy_core.contract.recall_rank import Terms

_LINE = st.one_of(
    st.text(st.characters(blacklist_characters="\n"), max_size=80),
    st.sampled_from(["", "   ", "x" * (PART_CHARS + 7), "y" * (3 * PART_CHARS)]),
)


@given(st.lists(_LINE, max_size=60).map("\n".join))
def test_parts_are_bounded_runs_of_the_text_and_cover_it(text):
    got = parts(text)
    assert 1 <= len(got) <= MAX_PARTS
    assert all(len(p) <= PART_CHARS for p in got) or got == [text]
    assert parts(text) == got  # a function of the text alone: named again at recall time
    if len(got) < MAX_PARTS and any(c.strip() for c in text):
        # every character but blanks is in a part, in order
        assert "".join("".join(got).split()) == "".join(text.split())


def test_a_part_is_whole_lines_unless_a_line_is_longer_than_a_part():
    lines = [f"line {i}: " + "w" * 40 for i in range(40)]
    got = parts("\n".join(lines))
    assert all(set(p.split("\n")) <= set(lines) for p in got)
    long = parts("a\n" + "z" * (2 * PART_CHARS + 5) + "\nb")
    assert long == ["a", "z" * PART_CHARS, "z" * PART_CHARS, "z" * 5 + "\nb"]
    assert parts("") == [""] and parts("\n \n") == ["\n \n"]
    assert len(parts("\n".join(["q" * 500] * (3 * MAX_PARTS)))) == MAX_PARTS


def test_the_key_names_the_part_size_so_older_vectors_are_not_compared():
    assert parts_key("bert:m") != parts_key("bert:n")
    assert str(PART_CHARS) in parts_key("bert:m")


def test_an_excerpt_shows_the_closest_part_even_without_a_keyword_after_the_best_line():
    lines = [f"step {i}: heading {i} tidied" for i in range(200)]
    lines[150] = "the card was declined"
    text = "\n".join(lines)
    near = "\n".join(lines[149:152])
    got = Excerpts(text, Terms(["money"]), near).within(300)
    assert got is not None and "the card was declined" in got and "step 0:" not in got
    assert Excerpts(text, Terms(["money"])).within(300) is None  # no keyword, no part
    # the best keyword line, then the part, then the other keyword lines
    one = Excerpts(text, Terms(["heading 3"]), near).within(200)
    assert one is not None and "heading 3 " in one and "declined" not in one
    both = Excerpts(text, Terms(["heading 3"]), near).within(400)
    assert both is not None and "declined" in both and "heading 3 " in both
    lines[10] = "step 10: heading 10 tidied twice"
    twice = "\n".join(lines)
    best = Excerpts(twice, Terms(["tidied", "twice"]), near).within(400)
    assert best is not None and "tidied twice" in best and "declined" in best
    assert "heading 3 " not in best  # lines holding less of the query come after the part
    # a part cut from one long line: that line, cut around nothing better
    long = "a\n" + "z" * 900 + " declined " + "z" * 900 + "\nb"
    piece = parts(long)[1]
    assert Excerpts(long, Terms(["money"]), piece).within(400) is not None
