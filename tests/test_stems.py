"""Word stems: what the archive indexes and searches, and recall's excerpts look for."""

from __future__ import annotations

import threading

from hypothesis import given, strategies as st

from normandy_core.conversation.stems import WORD, stem_text, stem_words, words


def test_inflections_share_a_stem_and_punctuation_separates_words():
    assert stem_text("Retries retrying RETRY") == "retri retri retri"
    assert stem_text("timeout=30, eu-west-1/job_7") == "timeout 30 eu west 1 job 7"
    assert stem_text("...") == ""
    assert words("Café Übersicht") == ["café", "übersicht"]


@given(st.text())
def test_a_stemmed_text_is_its_words_stems_separated_by_single_spaces(text):
    found = words(text)
    stems = stem_words(found)
    assert len(stems) == len(found)
    assert stem_text(text) == " ".join(stems)
    # nothing but words and single spaces: safe inside an FTS5 or web-search phrase
    assert all(WORD.fullmatch(s) for s in stems)


@given(st.lists(st.sampled_from(["run", "runs", "running", "cache", "caches", "x1"])))
def test_each_word_is_stemmed_alone_whatever_is_beside_it(found):
    assert stem_words(found) == [stem_words([w])[0] for w in found]


def test_threads_stem_at_once_without_sharing_a_stemmer():
    text = " ".join(f"connections{n} retrying deployments" for n in range(200))
    expected = stem_text(text)
    results: list[str] = []

    def work() -> None:
        results.extend(stem_text(text) for _ in range(50))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 200
