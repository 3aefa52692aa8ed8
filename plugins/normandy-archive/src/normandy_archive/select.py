"""Which archive the hook and the commands use: PostgreSQL when a URL says so, else SQLite.

``NORMANDY_ARCHIVE_URL=postgresql://user@host/db`` (read at every compaction) sends
every archived compaction to that database (:class:`~normandy_archive.pg.PostgresArchive`,
imported only then, so psycopg is needed only then). Unset or empty, the SQLite file
of :func:`~normandy_archive.archive_path` is used, as before.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from normandy_archive.paths import archive_path
from normandy_archive.store import Archive

if TYPE_CHECKING:
    from normandy_archive.pg import PostgresArchive

__all__ = ["ENV_URL", "AnyArchive", "archive_for", "archive_url", "current", "unavailable"]

#: Environment variable naming a PostgreSQL archive (wins over ``NORMANDY_ARCHIVE_PATH``).
ENV_URL = "NORMANDY_ARCHIVE_URL"

AnyArchive: TypeAlias = "Archive | PostgresArchive"


def archive_url() -> str | None:
    """``$NORMANDY_ARCHIVE_URL``, or ``None`` when it is unset or empty."""
    return os.environ.get(ENV_URL, "").strip() or None


def archive_for(url: str | None = None, path: str | os.PathLike[str] | None = None) -> AnyArchive:
    """The archive at ``url`` (PostgreSQL) or ``path`` (SQLite); neither: the environment's.

    Without either, ``NORMANDY_ARCHIVE_URL`` when set, else :func:`archive_path`.
    A URL that is not ``postgresql://`` (or ``postgres://``) is a :class:`ValueError`.
    """
    if url is None and path is None:
        url = archive_url()
    if url is not None:
        if not url.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"{ENV_URL} or --url must be a postgresql:// URL")
        from normandy_archive.pg import PostgresArchive

        return PostgresArchive(url)
    return Archive(Path(path) if path is not None else archive_path())


_lock = threading.Lock()
_current: dict[str, AnyArchive] = {}  # only the archive in use: its connections stay open


def current() -> AnyArchive:
    """The archive the hook writes to now, kept open while the target stays the same."""
    url = archive_url()
    key = f"url:{url}" if url else f"path:{archive_path()}"
    with _lock:
        hit = _current.get(key)
        if hit is None:
            _current.clear()  # a target no longer in use releases its connections
            hit = _current[key] = archive_for(url) if url else Archive(archive_path())
        return hit


def unavailable() -> tuple[type[Exception], ...]:
    """The errors that say an archive cannot be used, for ``except`` (psycopg-free).

    :class:`~normandy_archive.pg.PostgresArchiveError` once that module is loaded.
    """
    pg = sys.modules.get("normandy_archive.pg")
    return () if pg is None else (pg.PostgresArchiveError,)
