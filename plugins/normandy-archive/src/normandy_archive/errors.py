"""The archive's errors: one message naming the archive and the real cause."""

from __future__ import annotations

from normandy_core.errors import SettingsError

__all__ = ["ArchiveConfigError", "ArchiveError", "ArchiveQueryError", "NotAnArchiveError"]


class ArchiveError(Exception):
    """The archive could not be read or written; the message names it and the cause (the
    underlying error, such as ``sqlite3.OperationalError``, chained as ``__cause__``)."""


class NotAnArchiveError(ArchiveError):
    """The file at the archive path is not a Normandy archive (another application's file)."""


class ArchiveConfigError(ArchiveError, SettingsError):
    """A setting of the archive (a variable, a settings file's ``[archive]`` table, an
    argument) has a bad value or an unknown key: a :class:`~normandy_core.SettingsError`
    (so a ``ValueError``) that is also the archive's own error."""


class ArchiveQueryError(ArchiveError, ValueError):
    """A read was asked something it cannot answer: a full-text query SQLite's FTS5
    refuses (with ``raw``), a limit or offset out of range."""
