"""Where the archive lives: set in code, ``NORMANDY_ARCHIVE_PATH``, or the user data dir."""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["ENV_PATH", "archive_path", "default_archive_path", "set_archive_path"]

#: Environment variable naming the archive file.
ENV_PATH = "NORMANDY_ARCHIVE_PATH"

_configured: list[Path] = []


def default_archive_path() -> Path:
    """``$XDG_DATA_HOME/normandy/archive.sqlite3`` (``~/.local/share`` when unset).

    On Windows, ``%LOCALAPPDATA%\\normandy\\archive.sqlite3``.
    """
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        base = Path(os.environ["LOCALAPPDATA"])
    else:
        xdg = os.environ.get("XDG_DATA_HOME")
        base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "normandy" / "archive.sqlite3"


def set_archive_path(path: str | os.PathLike[str] | None) -> None:
    """Pin the archive file for this process (``None`` goes back to the environment/default)."""
    _configured.clear()
    if path is not None:
        _configured.append(Path(path).expanduser())


def archive_path() -> Path:
    """The archive file: :func:`set_archive_path`, else ``NORMANDY_ARCHIVE_PATH``, else the default.

    Read at every call, so a change of the environment variable takes effect at once.
    """
    if _configured:
        return _configured[0]
    env = os.environ.get(ENV_PATH)
    if env:
        return Path(env).expanduser()
    return default_archive_path()
