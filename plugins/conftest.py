"""Fixtures of the archive's tests: a real PostgreSQL server (pgserver) and a database per test.

Here, above both distributions' tests, so one server serves normandy-archive-postgres's
own tests and normandy-archive's tests that run on both backends.

One server for the whole run, started the first time a test asks for it and stopped at
the end; every test that asks for ``pg_url`` gets an empty database of its own. Set
``NORMANDY_TEST_POSTGRES_URL`` to use another server instead (a database there is
created and dropped per test, so the role needs ``CREATEDB``). Without
normandy-archive-postgres, or without a pgserver wheel for this platform and no such
URL, those tests are skipped.
"""

from __future__ import annotations

import itertools
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_PGSERVER_WHEELS = sys.version_info < (3, 13) and (
    platform.machine() in ("x86_64", "AMD64") or sys.platform == "darwin"
)

_SERVER_LOG: list[Path] = []  # pgserver's log file, while it runs


def _psycopg() -> Any:
    pytest.importorskip(
        "normandy_archive_postgres", reason="normandy-archive-postgres is not installed"
    )
    return pytest.importorskip("psycopg")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A PostgreSQL server's URL (its ``postgres`` database); stopped at the end."""
    _psycopg()
    given = os.environ.get("NORMANDY_TEST_POSTGRES_URL")
    if given:
        yield given
        return
    if not _PGSERVER_WHEELS:
        pytest.skip("pgserver has no wheel here: set NORMANDY_TEST_POSTGRES_URL")
    # pgserver keeps a lock file in the user runtime directory, read when it is imported:
    # a private one, so nothing is written to the home directory
    runtime = tempfile.mkdtemp(prefix="normandy-pg-run-")
    old = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = runtime
    try:
        import pgserver

        data = tempfile.mkdtemp(prefix="normandy-pg-")
        srv = pgserver.get_server(data, cleanup_mode="delete")
    finally:
        if old is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = old
    _SERVER_LOG[:] = [srv.log]
    try:
        yield srv.get_uri()
    finally:
        _SERVER_LOG.clear()
        srv.cleanup()
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture
def pg_server_log(pg_server: str) -> Path | None:
    """The server's log file (``None`` for a server given by URL)."""
    return _SERVER_LOG[0] if _SERVER_LOG else None


_names = itertools.count()


def with_db(url: str, db: str) -> str:
    """``url`` naming the database ``db`` instead."""
    psycopg = _psycopg()
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = db
    host = info.pop("host", None)
    user = info.get("user") or ""
    port = f":{info['port']}" if info.get("port") else ""
    if host and str(host).startswith("/"):
        return f"postgresql://{user}@{port}/{db}?host={host}"
    return f"postgresql://{user}@{host or ''}{port}/{db}"


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A fresh, empty database on the server."""
    psycopg = _psycopg()
    name = f"normandy_test_{os.getpid()}_{next(_names)}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield with_db(pg_server, name)
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")
