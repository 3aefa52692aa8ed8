"""Recall by meaning on the PostgreSQL archive, against a real server with pgvector
(pgserver ships the ``vector`` extension): one row per part, ranked in SQL by cosine
distance, scoped to the session, removed with its entry, and named when it is missing."""

from __future__ import annotations

import itertools
import math
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from archive_helpers import MEANING_FACT, Concepts, meaning_entries
from hypothesis import HealthCheck, given, settings, strategies as st

from normandy_archive.hooks import recall_similar
from normandy_archive.maintenance import embed_pending
from normandy_archive_postgres import PostgresArchive, PostgresArchiveError
from normandy_core import Entry, recall
from normandy_core.contract.recall_parts import PART_CHARS, parts_key

pytestmark = pytest.mark.slow  # each test starts (or shares) a PostgreSQL server

FACT = MEANING_FACT


@pytest.fixture
def archived(pg_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[str]:
    """The database's URL, in force as the archive, holding :func:`_entries` in ``s1``."""
    monkeypatch.setenv("NORMANDY_ARCHIVE_URL", pg_url)
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(tmp_path / "unused.sqlite3"))
    monkeypatch.setenv("NORMANDY_CONFIG", "off")
    for var in ("NORMANDY_ARCHIVE_SESSION", "NORMANDY_RECALL_EMBEDDER"):
        monkeypatch.delenv(var, raising=False)
    archive = PostgresArchive(pg_url)
    archive.record(meaning_entries(), session_id="s1")
    archive.close()
    yield pg_url
    assert not (tmp_path / "unused.sqlite3").exists()


def _vector_rows(url: str) -> list[tuple[str, int, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT embedder, seq, part FROM normandy.vectors ORDER BY 1, 2, 3")
        return [(str(e), int(s), int(p)) for e, s, p in rows.fetchall()]


def test_recall_finds_by_meaning_an_entry_sharing_no_word_with_the_query(archived):
    assert recall("money problem", session="s1").hits == ()  # keywords alone: nothing
    found = recall("money problem", session="s1", embedder=Concepts())
    assert found.errors == ()
    assert found.hits[0].entry.content == FACT
    with psycopg.connect(archived) as conn:  # stored as pgvector's type
        (kind,) = conn.execute(
            "SELECT pg_typeof(vec)::text FROM normandy.vectors LIMIT 1"
        ).fetchone()
    assert kind == "vector"


def test_vectors_survive_a_reconnect_and_each_entry_is_embedded_once(archived):
    emb = Concepts()
    recall_similar(query="money", session_id="s1", limit=2, embedder=emb)
    assert len(emb.embedded) == 4 + 1  # each entry (one part each), then the query
    key = parts_key(emb.key)
    assert [r[0] for r in _vector_rows(archived)] == [key] * 4
    fresh = PostgresArchive(archived)  # another connection, another object
    assert fresh.unembedded(key, "s1") == []
    again = Concepts()
    assert not embed_pending(fresh, again, "s1") and again.embedded == []
    (money,) = emb.embed(["money"])
    ((seq, part, cos),) = fresh.nearest(key, "s1", money, 1)
    assert 0.5 < cos <= 1.0 + 1e-6
    assert fresh.by_seq([seq])[0].entry.content == FACT and part == 0
    recall_similar(query="disk", session_id="s1", limit=2, embedder=emb)
    assert emb.embedded[-1] == "disk" and len(emb.embedded) == 4 + 1 + 1 + 1


def test_another_embedders_vectors_are_never_compared(archived):
    emb = Concepts()
    recall_similar(query="money", session_id="s1", limit=1, embedder=emb)
    archive = PostgresArchive(archived)
    key, other = parts_key(emb.key), parts_key("another-model:1")
    (disk,) = emb.embed(["disk full"])
    by_id = {a.entry.id: a.seq for a in archive.list("s1")}
    # under another key, the README entry is given exactly the query's vector
    assert archive.store_vectors(other, {by_id["u1"]: [disk]}) == 1
    ranked = archive.nearest(key, "s1", disk, 4)
    assert ranked[0][:2] == (by_id["u2"], 0)  # the volume, by this key's own vectors
    assert [r[:2] for r in archive.nearest(other, "s1", disk, 4)] == [(by_id["u1"], 0)]
    assert archive.nearest(key, "s1", [1.0, 0.0], 4) == []  # another width: not compared
    assert len(archive.unembedded(other, "s1")) == 3


def test_pruning_takes_the_vectors_with_their_entries(archived):
    emb = Concepts()
    recall_similar(query="money", session_id="s1", limit=1, embedder=emb)
    archive = PostgresArchive(archived)
    archive.record([Entry(id="x", role="user", content="disk space")], session_id="s2")
    recall_similar(query="disk", session_id="s2", limit=1, embedder=emb)
    assert len(_vector_rows(archived)) == 5
    assert archive.prune(max_sessions=1) == 4  # s1 goes, s2 stays
    (kept,) = archive.list()
    assert [s for _, s, _ in _vector_rows(archived)] == [kept.seq]


def test_a_session_ranks_only_what_it_archived_or_dropped_last(archived):
    emb = Concepts()
    assert recall_similar(query="money", session_id="other", limit=3, embedder=emb) == []
    archive = PostgresArchive(archived)
    # the same content dropped by s2 is stored once, under s1, and s2 finds it
    archive.record([Entry(id="b1", role="assistant", content=FACT)], session_id="s2")
    archive.record([Entry(id="b2", role="user", content="billing paid")], session_id="s2")
    hits = recall_similar(query="payment trouble", session_id="s2", limit=5, embedder=emb)
    assert [h.entry.id for h in hits] == ["a1", "b2"]
    assert {h.entry.id for h in recall_similar("x", "s1", 9, emb)} == {"u1", "a1", "u2", "a2"}
    assert len(recall_similar(query="x", session_id=None, limit=9, embedder=emb)) == 5


def test_the_best_part_of_a_long_entry_is_named(archived):
    fact = "ERROR the card was declined and the charge failed"
    lines = [f"step {i}: README heading {i} tidied and rendered" for i in range(120)]
    lines.insert(100, fact)
    PostgresArchive(archived).record(
        [Entry(id="log", role="assistant", content="\n".join(lines))], session_id="s1"
    )
    emb = Concepts()
    hits = {h.entry.id: h for h in recall_similar("payment trouble", "s1", 5, emb)}
    near = hits["log"].near
    assert near is not None and fact in near and len(near) <= PART_CHARS
    assert "step 0:" not in near
    got = recall("payment trouble", session="s1", embedder=emb, limit_tokens=400)
    assert fact in got.text and "step 0:" not in got.text


def test_a_role_that_may_not_create_pgvector_is_told_what_to_install(pg_url):
    """The extension is not trusted: a role that is no superuser cannot create it. The
    archive and keyword recall work all the same; recall by meaning says what is missing."""
    role = f"agent_{uuid.uuid4().hex[:8]}"
    db = psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT CREATE ON DATABASE {db} TO {role}")
    url = _as_role(pg_url, role)
    mine = PostgresArchive(url, schema="agents")
    mine.record(meaning_entries(), session_id="s1")  # the schema is created, without vectors
    assert [a.entry.id for a in mine.search("invoice", session_id="s1")] == ["a1"]
    with pytest.raises(PostgresArchiveError, match=r"pgvector.*CREATE EXTENSION vector"):
        mine.unembedded(parts_key("concepts-test:1"), "s1")
    with pytest.raises(PostgresArchiveError, match="may not create the extension 'vector'"):
        mine.store_vectors("k", {1: [[1.0, 0.0]]})
    assert mine.nearest("k", "s1", [1.0, 0.0], 3) == []  # nothing to rank, no error


def _as_role(url: str, role: str) -> str:
    """``url`` connecting as ``role`` (the server trusts local connections)."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    host, port = str(info.get("host") or ""), info.get("port")
    where = f"?host={host}" if host.startswith("/") else ""
    at = "" if where else host
    return f"postgresql://{role}@{at}{f':{port}' if port else ''}/{info['dbname']}{where}"


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


_vectors = st.lists(st.integers(-4, 4), min_size=3, max_size=3).filter(any)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    stored=st.lists(st.lists(_vectors, min_size=1, max_size=4), min_size=1, max_size=4),
    query=_vectors,
    limit=st.integers(1, 5),
)
def test_nearest_is_each_entrys_closest_part_best_first(archived, stored, query, limit):
    """Against cosines computed here: the entries in order of their closest part, that
    part named, ``limit`` of them (float rounding aside: scores within 1e-6 may swap)."""
    archive = PostgresArchive(archived)
    key = f"hyp-{uuid.uuid4().hex}"  # each example its own vectors
    seqs = [a.seq for a in archive.list("s1")][: len(stored)]
    assert archive.store_vectors(key, dict(zip(seqs, stored, strict=True))) == len(seqs)
    best = {
        seq: max(_cosine([float(x) for x in v], [float(x) for x in query]) for v in vs)
        for seq, vs in zip(seqs, stored, strict=True)
    }
    got = archive.nearest(key, "s1", [float(x) for x in query], limit)
    assert len(got) == min(limit, len(seqs)) and len({s for s, _, _ in got}) == len(got)
    scores = [best[s] for s, _, _ in got]
    assert all(abs(cos - best[s]) < 1e-4 for s, _, cos in got)  # the cosine it reports
    assert all(a >= b - 1e-6 for a, b in itertools.pairwise(scores))
    left_out = [best[s] for s in seqs if s not in {g for g, _, _ in got}]
    assert all(s >= o - 1e-6 for s in scores for o in left_out)
    for s, p, _ in got:  # the part named is a closest one
        vs = stored[seqs.index(s)]
        assert _cosine([float(x) for x in vs[p]], [float(x) for x in query]) >= best[s] - 1e-6
