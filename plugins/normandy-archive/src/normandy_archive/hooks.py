"""The ``archive`` hook plugin (entry point in ``normandy_core.hooks``): archive what was dropped.

Loaded automatically once the distribution is installed; exclude it with
``NORMANDY_DISABLE_PLUGINS=archive`` (which leaves the ``normandy archive`` command, the
entry point ``archive-cli``), or turn it off with ``NORMANDY_ARCHIVE_PATH=off``.

*Required* (the default): :func:`before_commit` commits the compaction's dropped entries
before the compaction takes effect, in one transaction (SQLite or PostgreSQL). When that
fails (disk full, the lock held past the busy wait, no permission, a file others may
open, not an archive), it raises with the archive's own error and the
boundary refuses the compaction: the conversation is kept as it was, so nothing is
removed without a record.

*Best effort* (``required=false``: ``NORMANDY_ARCHIVE_REQUIRED=0``, or
``configure(required=False)``): :func:`after_compact` writes after the compaction took
effect; a failure is reported in ``meta["hook_errors"]`` with the number of entries
that were not archived.

:func:`recall_entries` answers the ``recall`` tool: a full-text search of what the
session dropped (:meth:`~normandy_archive.ArchiveBackend.search` with ``match="any"``,
on SQLite or PostgreSQL alike), a single word also looked up as an entry id or a
tool-use id.

Only the durable part runs in the boundary (SQLite: one transaction per compaction):
indexing for full-text search, checkpoints
and pruning past a retention limit (``max_bytes``, ``max_age_days``, ``max_sessions``)
follow in the background writer (:mod:`normandy_archive.maintenance`), scheduled by
:func:`after_compact` and drained when the interpreter exits.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from normandy_archive.errors import ArchiveError
from normandy_core import RecallHit, hookimpl

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from normandy_archive.backend import ArchiveBackend
    from normandy_archive.base import ArchivedEntry
    from normandy_archive.settings import ArchiveSettings
    from normandy_archive.store import Archive
    from normandy_core import AgentConfig, CompactionContext

__all__ = ["after_compact", "before_commit", "recall_entries"]


class _ArchiveInUse:
    """The archive the hooks write to: opened for the settings in force, kept open
    between compactions, closed when the settings name another one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Only the archive in use: its connection stays open between compactions.
        self._open: dict[tuple[Path | str, float, str], ArchiveBackend] = {}
        #: The settings :meth:`get` was last given and the archive it returned, replaced
        #: whole (read without the lock): the settings resolved once serve every compaction.
        self._last: tuple[ArchiveSettings, ArchiveBackend] | None = None

    def get(self, settings: ArchiveSettings) -> ArchiveBackend:
        """The archive ``settings`` name, opened on first use."""
        last = self._last
        if last is not None and last[0] is settings:
            return last[1]
        target = settings.target
        assert target is not None
        key = (target, settings.busy_timeout, settings.sync)
        with self._lock:
            hit = self._open.get(key)
            if hit is None:
                from normandy_archive.backend import open_archive

                self._close_all()  # a target no longer in use releases its connection
                hit = self._open[key] = open_archive(
                    target, timeout=settings.busy_timeout, sync=settings.sync
                )
            self._last = (settings, hit)
            return hit

    def close(self) -> None:
        """Close the archive in use; the next :meth:`get` opens a fresh one."""
        with self._lock:
            self._close_all()

    def _close_all(self) -> None:
        for old in self._open.values():
            old.close()
        self._open.clear()
        self._last = None


_IN_USE = _ArchiveInUse()


# The backend (SQLite), the settings model and the background writer are imported by
# the hooks when a compaction drops something (or a recall comes), not when the plugin
# loads: a boundary with nothing to drop does not pay for them. Each is imported once
# (``import`` of a module already loaded still costs about half a microsecond).


@functools.cache
def _settings_reader() -> Callable[[], ArchiveSettings]:
    """:func:`normandy_archive.settings.current_settings`, imported at first use."""
    from normandy_archive.settings import current_settings

    return current_settings


@functools.cache
def _background() -> tuple[ModuleType, type[Archive]]:
    """The background writer's module, and the SQLite backend's class (the one it
    serves), imported at first use."""
    import normandy_archive.maintenance as maintenance
    from normandy_archive.store import Archive

    return maintenance, Archive


def _record(
    settings: ArchiveSettings, acc: AgentConfig, ctx: CompactionContext, meta: Mapping[str, Any]
) -> dict[str, Any]:
    """Write the compaction; the note saying where it went."""
    strategy = meta.get("strategy")
    archive = _IN_USE.get(settings)
    dropped = meta["dropped"]
    session = settings.session or acc.session_id
    cid = archive.record(
        dropped,
        session_id=session,
        compactor=acc.compactor,
        strategy=strategy if isinstance(strategy, str) else None,
        model=ctx.model,
        mid_round=ctx.mid_round,
        meta=meta,
        index=False,  # SQLite indexes afterwards, in the background writer
    )
    stored, existing = cid.entries, cid.existing
    said = f"{stored} new, {existing} already there" if existing else "all new"
    where = archive.location
    return {
        "path": where,
        "session": session,
        "entries": len(dropped),
        "stored": stored,
        "existing": existing,
        "compaction_id": str(cid) if stored else None,
        "required": settings.required,
        "message": f"{len(dropped)} dropped entries archived to {where} "
        f"({said}; session {session})",
    }


def _current_settings() -> ArchiveSettings:
    """The settings in force (:func:`~normandy_archive.settings.current_settings`)."""
    return _settings_reader()()


def _maintain(settings: ArchiveSettings, acc: AgentConfig) -> None:
    """Index, checkpoint and prune in the background writer, and serialize the entries
    the conversation keeps, the next compaction's dropped ones among them (SQLite;
    PostgreSQL indexes as it writes)."""
    maintenance, sqlite = _background()
    archive = _IN_USE.get(settings)
    if not isinstance(archive, sqlite):
        return
    limits = None
    if settings.limited:
        days = settings.max_age_days
        limits = maintenance.Limits(
            max_bytes=settings.max_bytes,
            max_age_seconds=None if days is None else days * 86_400,
            max_sessions=settings.max_sessions,
        )
    # the log counts toward max_bytes too: its bound is a tenth of it
    bound, most = archive.WAL_MAX_BYTES, settings.max_bytes
    archive.wal_bound = bound if most is None else min(bound, most // 10)
    maintenance.hold(archive, limits)
    maintenance.schedule(archive, limits, acc.memory.entries())


@hookimpl
def before_commit(
    acc: AgentConfig, ctx: CompactionContext, meta: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Required mode: write every dropped entry durably, or raise to refuse the compaction.

    Returns the note saying where they went (``meta["hook_notes"]``).
    """
    if not meta.get("dropped"):
        return None
    settings = _current_settings()
    if settings.off or not settings.required:
        return None
    return _record(settings, acc, ctx, meta)


@hookimpl
def after_compact(
    acc: AgentConfig, ctx: CompactionContext, meta: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Best-effort mode: write every dropped entry now; a failure names how many were lost.

    With the archive off, the note says the dropped entries were not archived.
    """
    dropped = meta.get("dropped")
    if not dropped:
        return None
    settings = _current_settings()
    if settings.off:
        return {
            "path": None,
            "entries": 0,
            "message": f"{len(dropped)} dropped entries not archived: the archive is off "
            f"(set by {settings.source})",
        }
    if settings.required:
        _maintain(settings, acc)
        return None
    try:
        note = _record(settings, acc, ctx, meta)
    except ArchiveError as exc:
        raise ArchiveError(
            f"{len(dropped)} dropped entries were NOT archived (the archive is best-effort, "
            f"required=false, so the compaction stands): {exc}"
        ) from exc
    _maintain(settings, acc)
    return note


@hookimpl
def recall_entries(query: str, session_id: str | None, limit: int) -> list[RecallHit]:
    """The archived entries matching ``query`` best (any of its terms), in ``session_id``.

    The session is the one compactions are archived under: the ``session`` setting
    (``NORMANDY_ARCHIVE_SESSION``) when set, else ``session_id``; ``None`` searches
    every session. A query of one word is first looked up as an entry id and as a
    tool-use id (the call and its result), then searched. Each hit names the tools whose
    results it holds, found by their tool-use ids in the same session. On SQLite, what
    the background writer has not indexed yet is indexed first, so it is ranked too.

    :raises ArchiveError: the archive is off, or cannot be read.
    """
    from normandy_archive.settings import current_settings
    from normandy_archive.store import Archive

    settings = current_settings()
    if settings.off:
        raise ArchiveError(
            f"the archive is off (set by {settings.source}): what compaction dropped was "
            "not kept, so nothing can be recalled"
        )
    archive = _IN_USE.get(settings)
    # SQLite indexes what a compaction wrote in the background writer, shortly after it.
    # A recall often comes right after the compaction that dropped what it wants: index
    # the rest now, so those entries are ranked with the others (rows not indexed yet are
    # found by substring only, after every ranked hit, and a bounded result then leaves
    # them out). Best effort: on failure the search still finds them that way.
    if isinstance(archive, Archive):
        with contextlib.suppress(ArchiveError):
            archive.index()
    session = None if session_id is None else (settings.session or session_id)
    found: list[ArchivedEntry] = []
    terms = query.split()
    if len(terms) == 1:
        found += archive.versions(terms[0], session)[:1]
        found += archive.by_source_id(terms[0], session)
    found += archive.search(query, session_id=session, limit=limit, match="any", seen=True)
    hits: list[RecallHit] = []
    seen: set[int] = set()
    for a in found:
        if a.seq in seen:
            continue
        seen.add(a.seq)
        hits.append(
            RecallHit(
                entry=a.entry,
                session_id=a.session_id,
                archived_at=a.archived_at,
                tool_names=_tool_names(archive, a.entry.tool_results, session),
            )
        )
    return hits[:limit]


def _tool_names(
    archive: ArchiveBackend, results: Sequence[Any], session: str | None
) -> dict[str, str]:
    """The names of the tools whose ``results`` these are, from their archived calls."""
    names: dict[str, str] = {}
    for r in results:
        for a in archive.by_source_id(r.tool_use_id, session):
            for use in a.entry.tool_uses:
                if use.id == r.tool_use_id:
                    names[use.id] = use.name
    return names
