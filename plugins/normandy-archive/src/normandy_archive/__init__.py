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

from normandy_archive.errors import (
    ArchiveConfigError as ArchiveConfigError,
    ArchiveError as ArchiveError,
    NotAnArchiveError as NotAnArchiveError,
)

if TYPE_CHECKING:  # for type checkers: at run time each is imported at first access
    from normandy_archive.backend import (
        ArchiveBackend as ArchiveBackend,
        open_archive as open_archive,
    )
    from normandy_archive.cli import main as main, register_cli as register_cli
    from normandy_archive.paths import (
        archive_path as archive_path,
        set_archive_path as set_archive_path,
    )
    from normandy_archive.settings import (
        ENV_BUSY_TIMEOUT as ENV_BUSY_TIMEOUT,
        ENV_PATH as ENV_PATH,
        ENV_REQUIRED as ENV_REQUIRED,
        ENV_SESSION as ENV_SESSION,
        ENV_URL as ENV_URL,
        OFF as OFF,
        ArchiveSettings as ArchiveSettings,
        archive_settings as archive_settings,
        configure as configure,
        current_settings as current_settings,
        default_archive_path as default_archive_path,
    )
    from normandy_archive.store import (
        Archive as Archive,
        ArchivedEntry as ArchivedEntry,
        CompactionRecord as CompactionRecord,
        Recorded as Recorded,
        searchable_text as searchable_text,
    )

#: The public names besides the errors above, by the module that defines them. They are
#: imported at first access, not with the package: the hook plugin loads at an agent's
#: first compaction, and a boundary that archives nothing (the conversation fits) needs
#: neither SQLite nor the settings model; the command line (argparse, datetime) waits
#: for a command.
_LAZY = {
    **dict.fromkeys(("ArchiveBackend", "open_archive"), "backend"),
    **dict.fromkeys(("main", "register_cli"), "cli"),
    **dict.fromkeys(("archive_path", "set_archive_path"), "paths"),
    **dict.fromkeys(
        ("ENV_BUSY_TIMEOUT", "ENV_PATH", "ENV_REQUIRED", "ENV_SESSION", "ENV_URL", "OFF"),
        "settings",
    ),
    **dict.fromkeys(
        ("ArchiveSettings", "archive_settings", "configure", "current_settings"), "settings"
    ),
    **dict.fromkeys(("default_archive_path",), "settings"),
    **dict.fromkeys(
        ("Archive", "ArchivedEntry", "CompactionRecord", "Recorded", "searchable_text"),
        "store",
    ),
}

__all__ = sorted([*_LAZY, "ArchiveConfigError", "ArchiveError", "NotAnArchiveError"])


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"normandy_archive.{module}"), name)
    globals()[name] = value  # later accesses do not come back here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
