"""What every archive backend offers, and the one function that opens the one in force.

:class:`ArchiveBackend` is the public API both backends implement: the embedded SQLite
:class:`~normandy_archive.Archive` and, for fleets of agents, the PostgreSQL
``PostgresArchive`` (module ``normandy_archive.pg``, imported only when a
``postgresql://`` URL asks for it, so psycopg is needed only then).
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from normandy_archive.errors import ArchiveError
from normandy_archive.settings import current_settings, is_url

if TYPE_CHECKING:
    from normandy_archive.store import ArchivedEntry, CompactionRecord
    from normandy_core import Entry

__all__ = ["ArchiveBackend", "open_archive"]


@runtime_checkable
class ArchiveBackend(Protocol):
    """The archive's public API, as the hook and the ``normandy archive`` commands use it.

    Additions to it are keyword arguments with defaults, so callers written for the
    first API keep working with every backend.
    """

    @property
    def location(self) -> str:
        """Where the archive is, for messages (a file path, or a URL without password)."""
        ...

    def record(
        self,
        dropped: Sequence[Entry],
        *,
        session_id: str,
        compactor: str | None = None,
        strategy: str | None = None,
        model: str | None = None,
        mid_round: bool | None = None,
        meta: Mapping[str, Any] | None = None,
        compaction_id: str | None = None,
        at: float | None = None,
    ) -> str:
        """Archive one compaction's dropped entries in one committed transaction; its id."""
        ...

    def recall(self, entry_id: str, session_id: str | None = None) -> Entry | None:
        """The entry as it was first dropped, or ``None``."""
        ...

    def versions(
        self, entry_id: str, session_id: str | None = None
    ) -> builtins.list[ArchivedEntry]:
        """Every archived version of ``entry_id``, oldest first."""
        ...

    def list(
        self, session_id: str | None = None, limit: int = 50, offset: int = 0
    ) -> builtins.list[ArchivedEntry]:
        """Archived entries in archive order (oldest first), a page at a time."""
        ...

    def search(
        self,
        query: str,
        *,
        session_id: str | None = None,
        limit: int = 50,
        offset: int = 0,
        raw: bool = False,
    ) -> builtins.list[ArchivedEntry]:
        """Full-text search, best match first."""
        ...

    def compactions(
        self, session_id: str | None = None, limit: int = 50, offset: int = 0
    ) -> builtins.list[CompactionRecord]:
        """Archived compactions, oldest first."""
        ...

    def count(self, session_id: str | None = None) -> int:
        """How many entries are archived (in ``session_id``, or in all sessions)."""
        ...

    def prune(
        self,
        *,
        max_age_seconds: float | None = None,
        max_sessions: int | None = None,
        max_bytes: int | None = None,
        dry_run: bool = False,
    ) -> int:
        """Remove whole sessions, oldest first, past the limits; entries removed."""
        ...

    def close(self) -> None:
        """Release the connections (the next call opens new ones)."""
        ...


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
