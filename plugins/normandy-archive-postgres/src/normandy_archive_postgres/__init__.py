"""Normandy's archive on PostgreSQL: one database for a fleet of agents.

:class:`PostgresArchive` is an archive backend of ``normandy-archive`` (the same API and
records as its SQLite archive). Installing this distribution registers it as the
backend of ``postgresql://`` URLs (entry point ``postgresql`` in the group
``normandy_archive.backends``), so ``NORMANDY_ARCHIVE_URL`` (or the ``url`` setting)
chooses it for the archive hook, ``open_archive()`` and the ``normandy archive``
commands::

    from normandy_archive_postgres import PostgresArchive
    archive = PostgresArchive("postgresql://agent@db.internal/agents")
"""

from __future__ import annotations

from normandy_archive_postgres.archive import (
    SCHEMA_VERSION as SCHEMA_VERSION,
    PostgresArchive as PostgresArchive,
    PostgresArchiveError as PostgresArchiveError,
    is_postgres_url as is_postgres_url,
)

__all__ = ["SCHEMA_VERSION", "PostgresArchive", "PostgresArchiveError", "is_postgres_url"]
