"""Normandy's archive: every entry a compaction drops, kept in SQLite and recallable.

The ``archive`` hook plugin (:mod:`normandy_archive.hooks`) loads automatically once this
distribution is installed; :class:`Archive` reads the archive back::

    from normandy_archive import Archive
    entry = Archive().recall(entry_id)          # as it was dropped
    hits = Archive().search("TypeError billing")

Where it is and whether it is required: :func:`current_settings` (docs/plugins/archive.md).
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
    from normandy_archive.settings import (
        ENV_BUSY_TIMEOUT as ENV_BUSY_TIMEOUT,
        ENV_PATH as ENV_PATH,
        ENV_REQUIRED as ENV_REQUIRED,
        ENV_SESSION as ENV_SESSION,
        ENV_URL as ENV_URL,
        OFF as OFF,
        ArchiveSettings as ArchiveSettings,
        archive_path as archive_path,
        archive_settings as archive_settings,
        configure as configure,
        current_settings as current_settings,
        default_archive_path as default_archive_path,
        set_archive_path as set_archive_path,
    )
    from normandy_archive.store import (
        Archive as Archive,
        ArchivedEntry as ArchivedEntry,
        CompactionRecord as CompactionRecord,
        Recorded as Recorded,
        searchable_text as searchable_text,
    )

#: The public names besides the errors above, by the module that defines them, imported
#: at first access: a boundary that archives nothing needs neither SQLite nor the
#: settings, and the command line (argparse, datetime) waits for a command.
_MODULES = {
    "backend": ("ArchiveBackend", "open_archive"),
    "cli": ("main", "register_cli"),
    "settings": (
        "ENV_BUSY_TIMEOUT",
        "ENV_PATH",
        "ENV_REQUIRED",
        "ENV_SESSION",
        "ENV_URL",
        "OFF",
        "ArchiveSettings",
        "archive_path",
        "archive_settings",
        "configure",
        "current_settings",
        "default_archive_path",
        "set_archive_path",
    ),
    "store": ("Archive", "ArchivedEntry", "CompactionRecord", "Recorded", "searchable_text"),
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names}

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
