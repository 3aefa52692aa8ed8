"""A failure is reported once (issue 33 item 8): an archive that cannot be written, called
from code, gave an ERROR record with a traceback from the hook runner, the boundary's
WARNING, and ``result.error``. Now the boundary's one WARNING record (carrying what the
hook raised) is the log's report, and ``result.error`` the same text returned."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from normandy_core import compact

MESSAGES = [
    message
    for i in range(20)
    for message in (
        {"role": "user", "content": f"q{i} " + "x " * 300},
        {"role": "assistant", "content": "y " * 300},
    )
]


def test_an_unwritable_required_archive_is_reported_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("NORMANDY_ARCHIVE_PATH", str(tmp_path / "file" / "a.sqlite3"))
    monkeypatch.setenv("NORMANDY_ARCHIVE_REQUIRED", "1")
    with caplog.at_level(logging.DEBUG, logger="normandy_core"):
        result = compact(MESSAGES, model="gpt-4o", window=3_000, opts={"reserved_tokens": 100})
    assert result.error is not None and "could not record" in result.error
    assert result.messages is MESSAGES or result.messages == MESSAGES
    # every record at WARNING or above about the archive (the tokenizer may warn too)
    reports = [
        r for r in caplog.records if r.levelno >= logging.WARNING and "archive" in r.getMessage()
    ]
    assert len(reports) == 1, [(r.name, r.levelname, r.getMessage()) for r in reports]
    (report,) = reports
    assert report.levelno == logging.WARNING and report.getMessage().startswith(result.error)
    assert report.exc_info is not None and "Not a directory" in str(report.exc_info[1])
