"""Where the archive lives: per call, set in code, ``NORMANDY_ARCHIVE_PATH``, or the user data dir.

Kept for the first API (:func:`set_archive_path`, :func:`archive_path`); the settings
themselves live in :mod:`normandy_archive.settings`.
"""

from __future__ import annotations

import os
from pathlib import Path

from normandy_archive.errors import ArchiveError
from normandy_archive.settings import ENV_PATH, configure, current_settings, default_archive_path

__all__ = ["ENV_PATH", "archive_path", "default_archive_path", "set_archive_path"]


def set_archive_path(path: str | os.PathLike[str] | None) -> None:
    """Pin the archive file for this process (``"off"``: no archive; ``None`` goes back
    to the environment/default). Same as ``configure(path=path)``."""
    configure(path=path)


def archive_path() -> Path:
    """The archive file in force (see :func:`~normandy_archive.current_settings`).

    Read at every call, so a change of the environment variable takes effect at once.

    :raises ArchiveError: the archive is off (``NORMANDY_ARCHIVE_PATH=off``).
    """
    settings = current_settings()
    if settings.path is None:
        raise ArchiveError(
            f"the archive is off (path 'off', set by {settings.source}); name the archive "
            "file explicitly"
        )
    return settings.path
