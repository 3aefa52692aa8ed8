"""Normandy's archive: every entry a compaction drops, kept in SQLite and recallable.

The ``archive`` hook plugin (:mod:`normandy_archive.hooks`) is loaded automatically once
this distribution is installed. Read the archive back with :class:`Archive`::

    from normandy_archive import Archive
    entry = Archive().recall(entry_id)          # as it was dropped
    page = Archive().list(session_id, limit=50, offset=0)
    hits = Archive().search("TypeError billing")

The file is :func:`archive_path`: :func:`set_archive_path`, else ``$NORMANDY_ARCHIVE_PATH``,
else ``~/.local/share/normandy/archive.sqlite3``.
"""

from __future__ import annotations

from normandy_archive.cli import main, register_cli
from normandy_archive.paths import ENV_PATH, archive_path, default_archive_path, set_archive_path
from normandy_archive.store import Archive, ArchivedEntry, CompactionRecord, searchable_text

__all__ = [
    "ENV_PATH",
    "Archive",
    "ArchivedEntry",
    "CompactionRecord",
    "archive_path",
    "default_archive_path",
    "main",
    "register_cli",
    "searchable_text",
    "set_archive_path",
]
