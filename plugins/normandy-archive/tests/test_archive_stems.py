"""Full-text search by word stems: a word finds the entries holding it in any inflection,
indexed or not yet, and an archive indexed before stemming is indexed again, losing nothing.

``data/unstemmed-archive`` was written by the version before stemming (``make.py`` there,
run with main's code at ``ebcc5a8``): an index of the words as written, and no mark.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from normandy_archive import Archive, open_archive, searchable_text
from normandy_core import Entry
from normandy_core.conversation.stems import stem_text, words

DATA = Path(__file__).parent / "data" / "unstemmed-archive"


def _ids(hits: list) -> list[str]:
    return [h.entry.id for h in hits]


def _entries() -> list[Entry]:
    return [
        Entry(id="a", role="user", content="The deployment retries failed twice."),
        Entry(id="b", role="assistant", content="Connections are timing out in eu-west-1."),
        Entry(id="c", role="user", content="Unrelated: the invoice totals look right."),
    ]


@pytest.mark.parametrize("indexed", [True, False])
def test_a_word_finds_its_other_inflections_indexed_or_not_yet(tmp_path, indexed):
    archive = Archive(tmp_path / "a.sqlite3")
    try:
        archive.record(_entries(), session_id="s", index=indexed)
        assert _ids(archive.search("deploying retry")) == ["a"]
        assert _ids(archive.search("connection timed")) == ["b"]  # "time", as "timing"
        assert _ids(archive.search("connection timeout")) == []  # another word: "timeout"
        assert _ids(archive.search("EU-WEST-1")) == ["b"]  # a phrase of its words' stems
        assert _ids(archive.search("failing invoices", match="any")) in (["a", "c"], ["c", "a"])
        assert archive.search("...") == []  # no word at all: nothing, and no error
    finally:
        archive.close()


def test_a_raw_query_is_searched_by_its_words_stems(tmp_path):
    archive = Archive(tmp_path / "a.sqlite3")
    try:
        archive.record(_entries(), session_id="s")
        assert set(_ids(archive.search("retrying OR connecting", raw=True))) == {"a", "b"}
        assert _ids(archive.search('"deployments retry"', raw=True)) == ["a"]
        assert _ids(archive.search("deploy NOT failed", raw=True)) == []
    finally:
        archive.close()


def _copy(tmp_path: Path) -> Path:
    shutil.copyfile(DATA / "archive.sqlite3", tmp_path / "archive.sqlite3")
    (tmp_path / "archive.sqlite3").chmod(0o600)
    return tmp_path / "archive.sqlite3"


def _state(path: Path) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT key, value FROM archive_state").fetchall())
    finally:
        conn.close()


def test_an_archive_indexed_before_stemming_is_indexed_again_by_its_first_writer(tmp_path):
    path = _copy(tmp_path)
    assert "stemmed" not in _state(path)
    archive = Archive(path)
    try:
        before = archive.count()
        # read as it is: the words as written still find their entries, the stems not yet
        assert _ids(archive.search("retries")) == ["w1"]
        assert _ids(archive.search("Rebuilding caches")) == ["w3"]  # not indexed yet
        assert archive.search("retry") == []
        archive.index()  # the first write: the index of stems is built, then w3 indexed
        assert _state(path)["stemmed"] == 1 and _state(path)["indexed_seq"] == before
        assert archive.count() == before  # every entry kept
        assert _ids(archive.search("retry deploying")) == ["w1"]
        assert _ids(archive.search("timeouts connection", match="any")) == ["w2"]
        assert _ids(archive.search("cache rebuild")) == ["w3"]
        every = {e.entry.id for e in archive.list(limit=1000)}
        for entry in archive.list(limit=1000):  # each entry is found by its own words
            found = _ids(archive.search(" ".join(words(entry.entry.text())[:3]), limit=1000))
            assert entry.entry.id in found or not words(entry.entry.text())
        assert len(every) == before
    finally:
        archive.close()
    conn = sqlite3.connect(path)
    try:
        conn.execute("INSERT INTO entries_fts (entries_fts) VALUES ('integrity-check')")
    finally:
        conn.close()


_WORDS = st.sampled_from(
    ["deploy", "connect", "retry", "cache", "invoice", "region", "build", "fail", "time"]
)
_SUFFIXES = st.sampled_from(["", "s", "ed", "ing", "ion", "ment", "er"])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(_WORDS, _SUFFIXES), min_size=1, max_size=8), st.data())
def test_every_word_of_an_entry_finds_it_whatever_the_inflection(tmp_path_factory, pairs, data):
    text = " ".join(w + s for w, s in pairs)
    path = tmp_path_factory.mktemp("stems") / "a.sqlite3"
    archive = Archive(path)
    try:
        archive.record([Entry(id="x", role="user", content=text)], session_id="s")
        word = data.draw(st.sampled_from(words(text)))
        assert _ids(archive.search(word)) == ["x"]
        # another inflection with the same stem finds it too
        same = [f"{w}{s}" for w, s in pairs if stem_text(f"{w}{s}") == stem_text(word)]
        assert _ids(archive.search(data.draw(st.sampled_from(same)).upper())) == ["x"]
    finally:
        archive.close()


def _backend(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    if kind == "sqlite":
        return Archive(tmp_path / "a.sqlite3")
    return open_archive(request.getfixturevalue("pg_url"))


#: The shared fixture's queries and what each finds, by SQLite's FTS5 and PostgreSQL alike.
_SHARED = [
    ("deploying retry", "all", {"a"}),
    ("connection timed", "all", {"b"}),
    ("eu-west-1", "all", {"b"}),
    ("failing invoices", "any", {"a", "c"}),
    ("totaled looking", "all", {"c"}),
    ("timeout", "all", set()),
]


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def test_sqlite_and_postgresql_find_the_same_entries_by_the_same_stems(kind, tmp_path, request):
    archive = _backend(kind, tmp_path, request)
    try:
        archive.record(_entries(), session_id="s")
        for query, match, expected in _SHARED:
            assert set(_ids(archive.search(query, match=match))) == expected, query
        # bm25 and ts_rank agree here: the entry holding both words first
        both = archive.search("retry invoice deployment", match="any")
        assert _ids(both)[0] == "a"
    finally:
        archive.close()


@pytest.mark.slow
def test_a_postgresql_schema_indexed_before_stemming_is_moved_by_the_first_write(pg_url):
    psycopg = pytest.importorskip("psycopg")
    archive = open_archive(pg_url)
    archive.record(_entries(), session_id="s")
    with psycopg.connect(pg_url) as conn:  # as version 2 wrote it: the words, punctuation blank
        for seq, data in conn.execute("SELECT seq, entry_json FROM normandy.entries").fetchall():
            text = searchable_text(Entry.model_validate_json(data))
            words_only = re.sub(r"[!-/:-@\[-`{-~]", " ", text)
            conn.execute("UPDATE normandy.entries SET text = %s WHERE seq = %s", (words_only, seq))
        conn.execute("UPDATE normandy.schema_version SET version = 2")
    old = open_archive(pg_url)
    assert _ids(old.search("retries")) == ["a"]  # read as it is: the words as written
    assert old.search("retry") == []
    old.record([Entry(id="d", role="user", content="Rebuilding caches")], session_id="s")
    with psycopg.connect(pg_url) as conn:
        versions = conn.execute("SELECT version FROM normandy.schema_version ORDER BY 1")
        assert versions.fetchall() == [(2,), (3,)]
    moved = open_archive(pg_url)
    assert moved.count() == 4
    assert _ids(moved.search("retry deploying")) == ["a"]
    assert _ids(moved.search("cache rebuild")) == ["d"]
