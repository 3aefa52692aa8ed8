"""Archive write throughput: SQLite and PostgreSQL side by side.

One writer records compactions one after another, each in its own transaction, as the
``archive`` hook does: every compaction's entries are fresh (new ids, content of their
own: both backends store a content once), taken from the
generated workload (real tool outputs, thinking and code). Both backends run with their
durable defaults: SQLite in WAL with ``synchronous=FULL``, PostgreSQL with ``fsync`` and
``synchronous_commit`` on. PostgreSQL is the server at ``NORMANDY_BENCH_POSTGRES_URL``,
else a PostgreSQL 16 started with pgserver in a temporary directory on this machine
(Unix socket); without either, its rows say so.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from normandy_core import Entry, TextBlock
from normandy_core.app.workload import generate_session

__all__ = ["postgres_server", "write_throughput"]


@contextlib.contextmanager
def postgres_server() -> Iterator[str | None]:
    """A PostgreSQL URL for the run (``None`` when there is no server to be had)."""
    given = os.environ.get("NORMANDY_BENCH_POSTGRES_URL")
    if given:
        yield given
        return
    runtime = tempfile.mkdtemp(prefix="normandy-bench-run-")
    data = tempfile.mkdtemp(prefix="normandy-bench-pg-")
    old = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = runtime  # pgserver's lock file, not in the home directory
    srv: Any = None
    try:
        try:
            import pgserver

            srv = pgserver.get_server(data, cleanup_mode="delete")
        except Exception:  # no wheel for this platform, or the server would not start
            srv = None
        finally:
            if old is None:
                os.environ.pop("XDG_RUNTIME_DIR", None)
            else:
                os.environ["XDG_RUNTIME_DIR"] = old
        yield None if srv is None else str(srv.get_uri())
    finally:
        if srv is not None:
            srv.cleanup()
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


def _fresh(e: Entry, c: int, k: int) -> Entry:
    """``e`` under a fresh id, with content of its own (both archives store a content
    once, and the workload repeats some): a text block (or a line) naming the compaction
    and the entry's place in it added."""
    mark = f"compaction {c}, entry {k}"
    content = (
        e.content + f"\n{mark}"
        if isinstance(e.content, str)
        else (*e.content, TextBlock(text=mark))
    )
    return e.model_copy(update={"id": f"c{c}-{e.id}", "content": content})


def _batches(compactions: int, size: int) -> list[list[Entry]]:
    """``compactions`` lists of ``size`` workload entries, each fresh (ids and content)."""
    pool = generate_session(11, max(size, 200)).entries()
    out = []
    for c in range(compactions):
        start = (c * size) % max(len(pool) - size, 1)
        out.append([_fresh(e, c, k) for k, e in enumerate(pool[start : start + size])])
    return out


def _fresh_database(url: str, name: str) -> str:
    """A new, empty database ``name`` beside ``url``'s; its URL."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def _drop_database(url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _time_writes(archive: Any, batches: list[list[Entry]]) -> float:
    archive.record(batches[0], session_id="warm-up")  # schema, connection
    t0 = time.perf_counter()
    for n, batch in enumerate(batches[1:]):
        archive.record(batch, session_id=f"s{n % 4}", compactor="window_manager")
    return time.perf_counter() - t0


def write_throughput(compactions: int, sizes: list[int]) -> list[dict[str, Any]]:
    """Per backend and entries per compaction: compactions/s, entries/s, ms per compaction."""
    from normandy_archive import Archive

    rows: list[dict[str, Any]] = []
    with postgres_server() as server:
        for size in sizes:
            batches = _batches(compactions + 1, size)
            tmp = Path(tempfile.mkdtemp(prefix="normandy-bench-archive-"))
            try:
                lite = Archive(tmp / "archive.sqlite3")
                rows.append(
                    _row("SQLite (WAL, synchronous=FULL)", size, compactions, lite, batches)
                )
                lite.close()
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            if server is None:
                rows.append({"backend": "PostgreSQL", "size": size, "skipped": True})
                continue
            from normandy_archive_postgres import PostgresArchive

            name = f"normandy_bench_{os.getpid()}_{size}"
            url = _fresh_database(server, name)
            try:
                pg = PostgresArchive(url)
                label = "PostgreSQL 16 (local socket, fsync on)"
                if os.environ.get("NORMANDY_BENCH_POSTGRES_URL"):
                    label = "PostgreSQL (NORMANDY_BENCH_POSTGRES_URL)"
                rows.append(_row(label, size, compactions, pg, batches))
                pg.close()
            finally:
                _drop_database(server, name)
    return rows


def _row(
    label: str, size: int, compactions: int, archive: Any, batches: list[list[Entry]]
) -> dict[str, Any]:
    seconds = _time_writes(archive, batches)
    expected = compactions * size + size
    assert archive.count() == expected, (label, archive.count(), expected)
    return {
        "backend": label,
        "size": size,
        "compactions": compactions,
        "seconds": seconds,
        "compactions_per_s": compactions / seconds,
        "entries_per_s": compactions * size / seconds,
        "per_compaction": seconds / compactions,
        "skipped": False,
    }
