"""Recall by meaning over the SQLite archive: vectors kept in the archive (version 3, a
version-2 archive moved at open), computed at recall time once per entry, surviving a
reopen; recall fusing them with the keyword ranking only when an embedder is configured."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest
from archive_helpers import MEANING_FACT, Concepts, meaning_entries

from normandy_archive import Archive
from normandy_archive.hooks import recall_similar
from normandy_archive.vectors import HeldSessions, nearest, pack
from normandy_core import Entry, RecallError, hookimpl, recall, register_hook, unregister_hook
from normandy_core.contract.recall_parts import PART_CHARS, parts_key

FACT = MEANING_FACT


@pytest.fixture
def archived(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "archive.sqlite3"
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(path))
    monkeypatch.delenv("NORMANDY_ARCHIVE_URL", raising=False)
    monkeypatch.delenv("NORMANDY_ARCHIVE_SESSION", raising=False)
    for var in ("NORMANDY_RECALL_EMBEDDER", "NORMANDY_RECALL_EMBEDDER_OPTS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NORMANDY_CONFIG", "off")
    archive = Archive(path)
    archive.record(meaning_entries(), session_id="s1")
    archive.close()
    return path


def test_the_hook_ranks_by_meaning_and_embeds_each_entry_once(archived):
    emb = Concepts()
    hits = recall_similar(query="money problem", session_id="s1", limit=2, embedder=emb)
    assert hits[0].entry.content == FACT  # no word of the query is in it
    assert len(emb.embedded) == 4 + 1  # every entry, then the query
    recall_similar(query="disk", session_id="s1", limit=2, embedder=emb)
    assert emb.embedded[5:] == ["disk"]  # kept: only the query is embedded again
    assert recall_similar(query="money", session_id="other", limit=2, embedder=emb) == []


def test_vectors_survive_an_archive_reopen(archived):
    emb = Concepts()
    recall_similar(query="money", session_id="s1", limit=2, embedder=emb)
    reopened = Archive(archived)
    key = parts_key(emb.key)
    held = reopened.vectors(key, "s1")
    assert len(held) == 4
    assert reopened.unembedded(key, "s1") == []
    assert reopened.vectors(parts_key("another-model"), "s1") == []
    assert len(reopened.unembedded(parts_key("another-model"), "s1")) == 4
    (money,) = emb.embed(["money"])
    ((seq, part, cos),) = nearest(money, held, 1)
    assert 0.5 < cos <= 1.0
    assert reopened.by_seq([seq])[0].entry.content == FACT and part == 0


def test_a_version_2_archive_gains_the_vectors_table_when_opened(archived):
    with sqlite3.connect(archived) as conn:
        conn.execute("DROP TABLE vectors")
        conn.execute("PRAGMA user_version = 2")
    reader = Archive(archived)
    assert len(reader.unembedded("concepts-test:1", "s1")) == 4  # read-only: no table yet
    assert reader.vectors("concepts-test:1", "s1") == []
    assert reader.store_vectors("concepts-test:1", {1: [[1.0, 0.0]]}) == 1  # a writer
    with sqlite3.connect(archived) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
        assert conn.execute("SELECT count(*) FROM entries").fetchone()[0] == 4
    assert [s for s, _ in Archive(archived).vectors("concepts-test:1", "s1")] == [1]


def test_pruned_entries_take_their_vectors_with_them(archived):
    emb = Concepts()
    recall_similar(query="money", session_id="s1", limit=2, embedder=emb)
    archive = Archive(archived)
    archive.record([Entry(id="x", role="user", content="other session")], session_id="s2")
    archive.prune(max_sessions=1)
    assert archive.vectors(parts_key(emb.key)) == []


def test_recall_fuses_meaning_only_when_an_embedder_is_given(archived):
    lexical = recall("money problem", session="s1")
    assert lexical.hits == ()  # no word of the fact: keywords alone find nothing
    found = recall("money problem", session="s1", embedder=Concepts())
    assert found.hits[0].entry.content == FACT
    # a keyword hit stays first when both rankings hold it
    both = recall("declined invoice", session="s1", embedder=Concepts())
    assert both.hits[0].entry.content == FACT


class _Tripwire:
    """A source of the meaning ranking that must not be asked."""

    @hookimpl
    def recall_similar(self, query: str) -> list[Entry]:
        raise AssertionError("asked for a ranking by meaning with no embedder configured")


def test_with_no_embedder_configured_recall_is_the_keyword_ranking_exactly(archived):
    name = register_hook(_Tripwire(), name="tripwire-similar")
    try:
        plain = recall("README headings tidy", session="s1", nonce="QQ77")
        off = recall("README headings tidy", session="s1", nonce="QQ77", embedder="off")
    finally:
        unregister_hook(name)
    assert plain == off
    # each holds every word, and two of them side by side: equal, in the archive's order
    assert [h.entry.id for h in plain.hits] == ["u1", "a2"]


def test_the_configured_embedder_is_found_by_name_and_an_unknown_one_is_named(
    archived, monkeypatch
):
    monkeypatch.setenv("NORMANDY_RECALL_EMBEDDER", "no-such-embedder")
    with pytest.raises(RecallError, match=r"embedder 'no-such-embedder'.*unknown embedder"):
        recall("money problem", session="s1")
    assert recall("README", session="s1", embedder="off").hits  # off: keywords only


def test_an_embedder_whose_model_files_are_missing_is_named(archived, monkeypatch, tmp_path):
    monkeypatch.setenv("NORMANDY_RECALL_EMBEDDER", "bert")
    monkeypatch.setenv("NORMANDY_RECALL_EMBEDDER_OPTS", f'{{"path": "{tmp_path}"}}')
    with pytest.raises(RecallError, match=r"embedder 'bert'.*holds no config.json"):
        recall("money problem", session="s1")


def test_the_background_writer_embeds_what_recall_would_rank_a_pass_at_a_time(archived):
    from normandy_archive.maintenance import embed_pending

    emb = Concepts()
    archive = Archive(archived)
    assert embed_pending(archive, emb, "s1", most=3)  # one left for the next pass
    assert len(archive.unembedded(parts_key(emb.key), "s1")) == 1
    assert not embed_pending(archive, emb, "s1")
    assert archive.unembedded(parts_key(emb.key), "s1") == []
    recall_similar(query="money", session_id="s1", limit=1, embedder=emb)
    assert emb.embedded[-1] == "money" and len(emb.embedded) == 5  # recall embeds the query only


class _Failing(Concepts):
    key = "failing:1"

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        raise RuntimeError("the model fell over")


def test_a_failing_search_by_meaning_leaves_the_keyword_ranking_and_says_so(archived):
    got = recall("README headings tidy", session="s1", embedder=_Failing())
    keywords = recall("README headings tidy", session="s1", embedder="off")
    assert [h.entry.id for h in got.hits] == [h.entry.id for h in keywords.hits] != []
    assert any("by meaning (failing:1)" in e and "fell over" in e for e in got.errors)


def test_held_vectors_are_bounded_and_start_afresh_below_what_they_hold() -> None:
    held = HeldSessions()
    first = held.get("e", "s0", 0)
    first.extend([(5, pack([1.0, 0.0]))], 2)
    assert held.get("e", "s0", 5) is first  # kept between recalls
    oldest = held.get("e", "s1", 0)
    for n in range(2, HeldSessions.MAX_SESSIONS):
        held.get("e", f"s{n}", 0)
    assert held.get("e", "s0", 5) is first  # recalled last: s1 is now the least recent
    held.get("e", "another", 0)  # one session too many: s1 goes
    assert held.get("e", "s0", 5) is first
    assert held.get("e", "s1", 0) is not oldest
    assert held.get("e", "s0", 4) is not first  # the archive's highest is below: afresh


def _long_output(fact_line: str, at: int) -> str:
    """A log of many unrelated lines with ``fact_line`` at line ``at``."""
    lines = [f"step {i}: README heading {i} tidied and rendered" for i in range(120)]
    lines.insert(at, fact_line)
    return "\n".join(lines)


def test_a_fact_deep_in_a_long_entry_is_found_by_its_part_and_shown(archived):
    """One vector of the whole entry would be its first lines; the part holding the fact
    finds it, and the excerpt shows that part, not the entry's start."""
    fact = "ERROR the card was declined and the charge failed"
    archive = Archive(archived)
    archive.record(
        [Entry(id="log", role="assistant", content=_long_output(fact, 100))], session_id="s1"
    )
    archive.close()
    emb = Concepts()
    (hit, *_) = recall_similar(query="payment trouble", session_id="s1", limit=5, embedder=emb)
    assert hit.entry.id in ("a1", "log")
    by_id = {
        h.entry.id: h
        for h in recall_similar(query="payment trouble", session_id="s1", limit=5, embedder=emb)
    }
    assert by_id["log"].near is not None and fact in by_id["log"].near
    assert len(by_id["log"].near) <= PART_CHARS
    got = recall("payment trouble", session="s1", embedder=emb, limit_tokens=400)
    assert fact in got.text  # the part, though no word of the query is in the entry
    assert "step 0:" not in got.text  # not the entry cut from its start


def test_vectors_of_another_length_or_too_many_parts_are_left_out() -> None:
    held = HeldSessions().get("e", "s", 0)
    held.extend([(1, pack([1.0, 0.0]) + pack([0.0, 1.0])), (2, pack([1.0, 0.0, 0.0]))], 2)
    assert held.owners == [(1, 0), (1, 1)]  # 12 bytes is no whole number of 2-vectors
    assert held.nearest([0.0, 1.0], 5) == [(1, 1, 1.0)]  # the entry by its closest part, once
    assert held.nearest([0.0, 1.0, 0.0], 5) == []  # another model's query


def test_no_part_runs_across_two_results_of_a_batch(archived):
    from normandy_archive.base import searchable_parts
    from normandy_core import ToolResultBlock

    results = [
        ToolResultBlock(tool_use_id=f"t{i}", content=f"# {name}.yaml\nservice: {name}")
        for i, name in enumerate(("catalog", "checkout"))
    ]
    batch = Entry(id="b", role="user", content=results)
    assert searchable_parts(batch) == [
        "# catalog.yaml\nservice: catalog",
        "# checkout.yaml\nservice: checkout",
    ]
    assert searchable_parts(Entry(id="e", role="user", content="")) == [""]


def test_a_hit_holding_the_whole_query_is_shown_by_its_keyword_lines(archived):
    """Found by both rankings: the lines holding every word of the query are the evidence,
    and the part closest by meaning (elsewhere in the entry) is not shown beside them."""
    lines = [f"step {i}: README heading {i} tidied and rendered" for i in range(120)]
    lines[10] = "invoice INV-9 declined: trouble"
    lines[100] = "the payment failed"
    archive = Archive(archived)
    log = Entry(id="log", role="assistant", content="\n".join(lines))
    archive.record([log, Entry(id="w", role="user", content="fine weather")], session_id="s2")
    archive.close()
    emb = Concepts()
    by_meaning = {h.entry.id: h for h in recall_similar("invoice declined", "s2", 9, emb)}
    assert "payment failed" in (by_meaning["log"].near or "")  # closest elsewhere
    got = recall("invoice declined", session="s2", embedder=emb, limit_tokens=1500)
    assert "invoice INV-9 declined" in got.text
    assert "payment failed" not in got.text
