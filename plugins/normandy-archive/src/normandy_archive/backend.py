"""What every archive backend offers, and the one function that opens the one in force.

:class:`ArchiveBackend` (defined in :mod:`normandy_archive.base`) is the public API both
backends implement, and the base class they share: the embedded SQLite
:class:`~normandy_archive.Archive` and, for fleets of agents, the PostgreSQL
``PostgresArchive`` (module ``normandy_archive.pg``, imported only when a
``postgresql://`` URL asks for it, so psycopg is needed only then).
"""

from __future__ import annotations

import os
from pathlib import Path

from normandy_archive.base import ArchiveBackend
from normandy_archive.errors import ArchiveError
from normandy_archive.settings import current_settings, is_url

__all__ = ["ArchiveBackend", "open_archive"]


def _postgres(url: str) -> ArchiveBackend:
    try:
        from normandy_archive import pg  # type: ignore[attr-defined,unused-ignore]
    except ImportError as exc:
        raise ArchiveError(
            f"a PostgreSQL archive was asked for, but its backend cannot be imported "
            f"({exc}): install normandy-archive with the PostgreSQL backend and psycopg 3, "
            "pip install 'normandy-archive[postgres]'"
        ) from exc
    backend: ArchiveBackend = pg.PostgresArchive(url)
    return backend


def open_archive(
    target: str | os.PathLike[str] | None = None,
    *,
    timeout: float | None = None,
    sync: str | None = None,
) -> ArchiveBackend:
    """The archive at ``target``: a ``postgresql://`` URL, or an SQLite file path.

    Without ``target``, the one the settings name (``NORMANDY_ARCHIVE_URL``, else
    ``NORMANDY_ARCHIVE_PATH``, else the user data directory; see
    :func:`~normandy_archive.current_settings`). ``timeout`` is the SQLite archive's busy
    wait and ``sync`` how its commits reach the disk (default: the ``busy_timeout`` and
    ``sync`` settings).

    :raises ArchiveError: the archive is off, or PostgreSQL was asked for and its backend
        (``normandy_archive.pg``, psycopg 3) is not installed.
    """
    from normandy_archive.store import Archive

    if target is None:
        settings = current_settings()
        if settings.off:
            raise ArchiveError(
                f"the archive is off (set by {settings.source}); name the archive explicitly"
            )
        if settings.url is not None:
            return _postgres(settings.url)
        assert settings.path is not None
        return Archive(settings.path, timeout=timeout, sync=sync)
    if isinstance(target, str) and is_url(target):
        return _postgres(target)
    return Archive(Path(target), timeout=timeout, sync=sync)
