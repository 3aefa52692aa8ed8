"""Owned files only: the archive never writes into a file another user owns or may open.

In a directory others may write to, another user can plant ``archive.sqlite3`` (or its
``-wal``) with mode 0666 before the agent first runs; an archive written into it would be
readable by that user. Such a file is refused, with an error naming it, its owner and
its mode, and is left as it was; so is one of ours others may read (whoever could read it
may hold it open already).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest
from reliability_counts import PLANTED_FILES

from normandy_archive import Archive, ArchiveError
from normandy_core import Entry

ENTRY = Entry(id="secret", role="user", content="the agent's own words")
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _write_and_close(path: Path) -> None:
    archive = Archive(path)
    archive.record([Entry(id="old", role="user", content="old")], session_id="s")
    archive.close()
    assert not Path(f"{path}-wal").exists()  # the last connection closed: no log left


def _plant(path: Path, kind: str) -> tuple[Path, str, int]:
    """Plant the file ``kind`` names; it, the owner and the mode the error must name."""
    if kind == "0666 database":
        path.touch()
        path.chmod(0o666)
        return path, rf"uid {os.getuid()}\b", 0o666
    _write_and_close(path)
    if kind == "0666 -wal":
        wal = Path(f"{path}-wal")
        wal.touch()
        wal.chmod(0o666)
        return wal, rf"uid {os.getuid()}\b", 0o666
    if kind == "own 0644 database":
        path.chmod(0o644)
        return path, rf"uid {os.getuid()}\b", 0o644
    assert kind == "0600 database another user owns"
    if not ROOT:
        pytest.skip("only root can give a file to another user")
    os.chown(path, 65534, 65534)
    return path, r"uid 65534\b", 0o600


@pytest.mark.parametrize("kind", PLANTED_FILES)
def test_a_planted_file_is_refused_and_left_as_it_was(tmp_path, kind):
    path = tmp_path / "a.sqlite3"
    planted, owner, mode = _plant(path, kind)
    before = planted.read_bytes()
    with pytest.raises(ArchiveError) as info:
        Archive(path).record([ENTRY], session_id="s")
    message = str(info.value)
    assert repr(str(planted)) in message, message
    assert re.search(f"owned by {owner}", message), message
    assert f"mode {mode:04o}; refusing to write" in message, message
    assert planted.read_bytes() == before  # nothing of ours written into it
    assert stat.S_IMODE(planted.stat().st_mode) == mode  # nor its mode changed
