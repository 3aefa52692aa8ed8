"""Open the archive in force: the SQLite :class:`~normandy_archive.Archive`, or a backend
another distribution registers by URL scheme under :data:`BACKENDS_GROUP` (``postgresql``:
``normandy-archive-postgres``), imported only when a URL asks for it."""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from pathlib import Path

from normandy_archive.base import ArchiveBackend
from normandy_archive.errors import ArchiveError
from normandy_archive.settings import current_settings, is_url

__all__ = ["BACKENDS_GROUP", "ArchiveBackend", "open_archive"]

#: The entry-point group of archive backends by URL scheme: each names a class (an
#: :class:`ArchiveBackend`) called with the URL.
BACKENDS_GROUP = "normandy_archive.backends"
#: The distribution that provides each scheme's backend, for the error when it is missing.
_PROVIDERS = {"postgresql": "normandy-archive-postgres"}


def _by_url(url: str) -> ArchiveBackend:
    """The backend registered for ``url``'s scheme (``postgres`` is ``postgresql``)."""
    scheme = url.partition("://")[0].lower()
    scheme = "postgresql" if scheme == "postgres" else scheme
    found = sorted(entry_points(group=BACKENDS_GROUP, name=scheme), key=lambda ep: ep.value)
    if not found:
        hint = _PROVIDERS.get(scheme, f"a distribution providing {scheme!r}")
        raise ArchiveError(
            f"a {scheme}:// archive was asked for, but no archive backend {scheme!r} is "
            f"installed (entry point group {BACKENDS_GROUP}): pip install {hint}"
        )
    ep = found[0]
    dist = getattr(ep, "dist", None)
    what = f"archive backend {scheme!r} (group {BACKENDS_GROUP}) from " + (
        f"{dist.name} {dist.version}" if dist is not None else ep.value
    )
    try:
        backend = ep.load()(url)
    except ArchiveError:
        raise
    except Exception as exc:
        raise ArchiveError(f"{what} failed to load: {type(exc).__name__}: {exc}") from exc
    if not isinstance(backend, ArchiveBackend):
        raise ArchiveError(f"{what} made a {type(backend).__name__}, not an ArchiveBackend")
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
    :func:`~normandy_archive.current_settings`). ``timeout`` and ``sync`` are the SQLite
    archive's busy wait and commit mode (default: the ``busy_timeout`` and ``sync`` settings).

    :raises ArchiveError: the archive is off, or no backend of a URL's scheme is installed.
    """
    from normandy_archive.store import Archive

    if target is None:
        settings = current_settings()
        if settings.off:
            raise ArchiveError(
                f"the archive is off (set by {settings.source}); name the archive explicitly"
            )
        if settings.url is not None:
            return _by_url(settings.url)
        assert settings.path is not None
        target = settings.path
    if isinstance(target, str) and is_url(target):
        return _by_url(target)
    return Archive(Path(target), timeout=timeout, sync=sync)
