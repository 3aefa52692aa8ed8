"""``normandy archive list`` says when it shows part of the archive, and ``search`` says
why it found nothing (issue 33 item 6): ``list`` printed its 50 rows with no hint that
the archive held more, and ``search "ValueError AND"`` printed nothing and said nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from normandy_archive.cli import main
from normandy_core import compact

MESSAGES = [
    message
    for i in range(40)
    for message in (
        {"role": "user", "content": f"question {i} about a ValueError " + "x " * 100},
        {"role": "assistant", "content": f"answer {i} " + "y " * 100},
    )
]


@pytest.fixture
def archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A real SQLite archive holding what one compaction dropped."""
    path = tmp_path / "a.sqlite3"
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(path))
    result = compact(
        MESSAGES, model="gpt-4o", window=2_000, opts={"reserved_tokens": 100}, fresh=True
    )
    assert result.error is None and len(result.dropped) > 10
    return str(path)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_list_says_it_shows_part_of_the_archive(
    archive: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = _run(capsys, "list", "--path", archive, "--json", "--limit", "1000")
    total = len(out.splitlines())
    assert status == 0 and err == "" and total > 50  # everything shown: nothing to say
    status, out, err = _run(capsys, "list", "--path", archive)  # the default, 50
    assert status == 0 and len(out.splitlines()) == 51  # the header and 50 rows
    assert f"showing 50 of {total} entries (1 to 50)" in err, err
    status, out, err = _run(capsys, "list", "--path", archive, "--json", "--limit", "5")
    assert status == 0 and len(out.splitlines()) == 5
    assert err == (
        f"normandy-archive list: showing 5 of {total} entries (1 to 5); "
        "--limit N and --offset N show others\n"
    )
    last = ("--offset", str(total - 3))  # the last page: still only part of the archive
    status, out, err = _run(capsys, "list", "--path", archive, "--json", *last)
    assert len(out.splitlines()) == 3
    assert f"showing 3 of {total} entries ({total - 2} to {total})" in err, err


def test_an_empty_search_says_the_words_are_anded_and_how_to_or_them(
    archive: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = _run(capsys, "search", "--path", archive, "ValueError AND")
    assert status == 0 and out == ""
    assert "no archived entry holds all of the words 'ValueError', 'AND'" in err, err
    assert "ANDed" in err and "--any" in err and "OR" in err and err.count("\n") == 1, err
    status, out, err = _run(capsys, "search", "--path", archive, "--any", "ValueError", "AND")
    assert status == 0 and out and err == ""
    status, out, err = _run(capsys, "search", "--path", archive, "nowhere")
    assert status == 0 and out == ""
    assert "no archived entry matches 'nowhere'" in err and "ANDed" not in err, err
