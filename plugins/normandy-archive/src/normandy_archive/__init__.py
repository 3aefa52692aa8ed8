"""Normandy's archive: every entry a compaction drops, kept in SQLite and recallable.

The ``archive`` hook plugin (:mod:`normandy_archive.hooks`) is loaded automatically once
this distribution is installed. Read the archive back with :class:`Archive`::

    from normandy_archive import Archive
    entry = Archive().recall(entry_id)          # as it was dropped
    page = Archive().list(session_id, limit=50, offset=0)
    hits = Archive().search("TypeError billing")

The file is :func:`archive_path`: a per-call :func:`archive_settings`, else
:func:`configure` (or :func:`set_archive_path`), else ``$NORMANDY_ARCHIVE_PATH``, else the
``[archive]`` table of ``normandy.toml`` (``[tool.normandy.archive]`` of
``pyproject.toml``), else ``~/.local/share/normandy/archive.sqlite3``; ``off`` turns the
archive off. By default the archive is *required*: a compaction whose dropped entries
cannot be written durably is refused (``NORMANDY_ARCHIVE_REQUIRED=0`` makes it
best-effort).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from normandy_archive.errors import ArchiveConfigError, ArchiveError, NotAnArchiveError

if TYPE_CHECKING:
    from normandy_archive.backend import ArchiveBackend, open_archive
    from normandy_archive.cli import main, register_cli
    from normandy_archive.paths import archive_path, set_archive_path
    from normandy_archive.settings import (
        ENV_BUSY_TIMEOUT,
        ENV_PATH,
        ENV_REQUIRED,
        ENV_SESSION,
        ENV_URL,
        OFF,
        ArchiveSettings,
        archive_settings,
        configure,
        current_settings,
        default_archive_path,
    )
    from normandy_archive.store import (
        Archive,
        ArchivedEntry,
        CompactionRecord,
        Recorded,
        searchable_text,
    )

__all__ = [
    "ENV_BUSY_TIMEOUT",
    "ENV_PATH",
    "ENV_REQUIRED",
    "ENV_SESSION",
    "ENV_URL",
    "OFF",
    "Archive",
    "ArchiveBackend",
    "ArchiveConfigError",
    "ArchiveError",
    "ArchiveSettings",
    "ArchivedEntry",
    "CompactionRecord",
    "NotAnArchiveError",
    "Recorded",
    "archive_path",
    "archive_settings",
    "configure",
    "current_settings",
    "default_archive_path",
    "main",
    "open_archive",
    "register_cli",
    "searchable_text",
    "set_archive_path",
]


#: Where each public name lives. They are imported at first access, not with the package:
#: the hook plugin loads at an agent's first compaction, and a boundary that archives
#: nothing (the conversation fits) needs neither SQLite nor the settings model; the
#: command line (argparse, datetime) waits for a command.
_LAZY = {
    "ArchiveBackend": "backend",
    "open_archive": "backend",
    "main": "cli",
    "register_cli": "cli",
    "archive_path": "paths",
    "set_archive_path": "paths",
    **dict.fromkeys(
        (
            "ENV_BUSY_TIMEOUT",
            "ENV_PATH",
            "ENV_REQUIRED",
            "ENV_SESSION",
            "ENV_URL",
            "OFF",
            "ArchiveSettings",
            "archive_settings",
            "configure",
            "current_settings",
            "default_archive_path",
        ),
        "settings",
    ),
    **dict.fromkeys(
        ("Archive", "ArchivedEntry", "CompactionRecord", "Recorded", "searchable_text"),
        "store",
    ),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"normandy_archive.{module}"), name)
    globals()[name] = value  # later accesses do not come back here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
