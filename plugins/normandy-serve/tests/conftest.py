"""Each serve test gets an archive file of its own and no compaction memo left by another."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import normandy_archive
from normandy_core.transcripts import continuation


@pytest.fixture(autouse=True)
def archive_file(tmp_path: Path) -> Iterator[Path]:
    """This test's archive (and no compaction memo left by another test)."""
    path = tmp_path / "archive.sqlite3"
    normandy_archive.configure(path=str(path))
    continuation.clear()
    yield path
    normandy_archive.configure(path=None)
    continuation.clear()
