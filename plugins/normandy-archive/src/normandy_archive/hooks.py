"""The ``archive`` hook plugin (entry point in ``normandy_core.hooks``): archive what was dropped.

*Required* (the default): :func:`before_commit` commits a compaction's dropped entries in
one transaction before the compaction takes effect, or raises the archive's error and the
boundary refuses the compaction. *Best effort* (``required=false``): :func:`after_compact`
writes them afterwards; a failure is reported in ``meta["hook_errors"]`` with the number
of entries not archived. :func:`recall_entries` answers the ``recall`` tool, and
:func:`recall_similar` its ranking by meaning when an embedder is configured. Indexing,
checkpoints and retention run in the background writer (:mod:`normandy_archive.maintenance`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from normandy_archive.errors import ArchiveError
from normandy_core import RecallHit, hookimpl

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from normandy_archive.backend import ArchiveBackend
    from normandy_archive.base import ArchivedEntry
    from normandy_archive.maintenance import Embedding
    from normandy_archive.settings import ArchiveSettings
    from normandy_core import AgentConfig, CompactionContext
    from normandy_core.contract.embedders import Embedder

__all__ = ["after_compact", "before_commit", "recall_entries", "recall_similar"]


class _ArchiveInUse:
    """The archive the hooks write to, kept open between compactions and closed when the
    settings name another one."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._key: tuple[Path | str, float, str] | None = None
        self._archive: ArchiveBackend | None = None

    def get(self, settings: ArchiveSettings) -> ArchiveBackend:
        """The archive ``settings`` name, opened on first use."""
        assert settings.target is not None
        key = (settings.target, settings.busy_timeout, settings.sync)
        with self._lock:
            if self._archive is None or self._key != key:
                from normandy_archive.backend import open_archive

                self.close()  # a target no longer in use releases its connection
                self._archive = open_archive(key[0], timeout=key[1], sync=key[2])
                self._key = key
            return self._archive

    def close(self) -> None:
        """Close the archive in use; the next :meth:`get` opens a fresh one."""
        with self._lock:
            if self._archive is not None:
                self._archive.close()
                self._archive = None


_IN_USE = _ArchiveInUse()


def _settings() -> ArchiveSettings:
    # imported here: a boundary that drops nothing never loads the settings or SQLite
    from normandy_archive.settings import current_settings

    return current_settings()


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


def _maintain(settings: ArchiveSettings, acc: AgentConfig) -> None:
    """Have the background writer index, checkpoint and prune an SQLite archive, and
    prepare the entries the conversation keeps (PostgreSQL indexes as it writes)."""
    from normandy_archive import maintenance
    from normandy_archive.base import Limits
    from normandy_archive.store import Archive

    archive = _IN_USE.get(settings)
    if not isinstance(archive, Archive):
        return
    limits = None
    if settings.limited:
        days = settings.max_age_days
        limits = Limits(
            max_bytes=settings.max_bytes,
            max_age_seconds=None if days is None else days * 86_400,
            max_sessions=settings.max_sessions,
        )
    # the log counts toward max_bytes too: its bound is a tenth of it
    bound, most = archive.WAL_MAX_BYTES, settings.max_bytes
    archive.wal_bound = bound if most is None else min(bound, most // 10)
    maintenance.hold(archive, limits)
    maintenance.schedule(archive, limits, acc.memory.entries(), _embedding(settings, acc))


def _embedding(settings: ArchiveSettings, acc: AgentConfig) -> Embedding | None:
    """What makes the embedder ``acc``'s recall ranks by meaning with (configured by
    name; made by the background writer, off the compaction's path) and the session it
    recalls from; ``None``: no recall. An embedder that cannot be made is skipped there:
    recall itself says what is wrong with it, where the model asks."""
    recall = acc.recall_settings
    if recall is None or recall.embedder == "off":
        return None

    def made() -> Embedder | None:
        from normandy_core.contract.recall_embed import embedder_for

        try:
            return embedder_for(recall.embedder, recall.embedder_options)
        except Exception:
            return None

    session = None if recall.scope == "all" else (settings.session or acc.session_id)
    return made, session


@hookimpl
def before_commit(
    acc: AgentConfig, ctx: CompactionContext, meta: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Required mode: write every dropped entry durably, or raise to refuse the compaction.

    A compaction that offloaded tool results at arrival (``meta["offloaded"]``) is written
    here in either mode, and refused with the archive off: nothing else holds them.
    Returns the note saying where they went (``meta["hook_notes"]``).
    """
    if not meta.get("dropped"):
        return None
    settings = _settings()
    offloaded = bool(meta.get("offloaded"))
    if settings.off and offloaded:
        # an offloaded result exists nowhere else: without the archive it stays whole
        raise ArchiveError(
            f"the archive is off (set by {settings.source}): the tool results offloaded at "
            "arrival would be lost, so they are kept whole"
        )
    if settings.off or not (settings.required or offloaded):
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
    settings = _settings()
    if settings.off:
        return {
            "path": None,
            "entries": 0,
            "message": f"{len(dropped)} dropped entries not archived: the archive is off "
            f"(set by {settings.source})",
        }
    if settings.required or meta.get("offloaded"):  # written by before_commit
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
    """The archived entries matching ``query`` best (any of its terms), in the session
    compactions are archived under (the ``session`` setting, else ``session_id``;
    ``None``: every session). A one-word query is first looked up as an entry id and a
    tool-use id; each hit names the tools whose results it holds.

    :raises ArchiveError: the archive is off, or cannot be read.
    """
    from normandy_archive.store import Archive

    settings = _settings()
    if settings.off:
        raise ArchiveError(
            f"the archive is off (set by {settings.source}): what compaction dropped was "
            "not kept, so nothing can be recalled"
        )
    archive = _IN_USE.get(settings)
    # a recall often follows the compaction that dropped what it wants: index it now, so
    # it is ranked with the rest (unindexed rows are found by substring only, last)
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
    hits: dict[int, RecallHit] = {}
    for a in found:
        if a.seq not in hits:
            names = _tool_names(archive, a.entry.tool_results, session)
            hits[a.seq] = RecallHit(a.entry, a.session_id, a.archived_at, names, a.seq)
    return list(hits.values())[:limit]


@hookimpl
def recall_similar(
    query: str, session_id: str | None, limit: int, embedder: Embedder
) -> list[RecallHit]:
    """The archived entries (of the session, as :func:`recall_entries` takes it) whose
    closest part is closest to ``query``, by cosine, closest first; each hit's ``near``
    is that part.

    Entries with no vectors of ``embedder.key`` yet are embedded now (a vector per part
    of their searchable text, :func:`~normandy_archive.base.searchable_parts`) and
    kept in the archive (:meth:`~normandy_archive.base.ArchiveBackend.store_vectors`), so
    each entry is embedded once; the compaction's path never waits for it. The archive
    ranks them (:meth:`~normandy_archive.base.ArchiveBackend.nearest`: NumPy over the
    SQLite file's vectors, pgvector's cosine distance in PostgreSQL).

    :raises ArchiveError: the archive is off, or cannot be read or written; the SQLite
        archive without NumPy, or a PostgreSQL server without the ``vector`` extension.
    """
    from normandy_archive import maintenance
    from normandy_archive.base import searchable_parts
    from normandy_core.contract.recall_parts import parts_key

    settings = _settings()
    if settings.off:
        raise ArchiveError(
            f"the archive is off (set by {settings.source}): nothing can be recalled"
        )
    archive = _IN_USE.get(settings)
    session = None if session_id is None else (settings.session or session_id)
    key = parts_key(embedder.key)
    # what the background writer has not embedded yet
    maintenance.embed_pending(archive, embedder, session)
    (asked,) = embedder.embed([query])
    closest = {seq: (part, cos) for seq, part, cos in archive.nearest(key, session, asked, limit)}
    hits: list[RecallHit] = []
    for a in archive.by_seq(list(closest)):
        names = _tool_names(archive, a.entry.tool_results, session)
        found = searchable_parts(a.entry)
        part, cos = closest[a.seq]
        near = found[part] if part < len(found) else None
        hit = RecallHit(a.entry, a.session_id, a.archived_at, names, a.seq)
        hits.append(dataclasses.replace(hit, near=near, similarity=cos))
    return hits


def _tool_names(
    archive: ArchiveBackend, results: Sequence[Any], session: str | None
) -> dict[str, str]:
    """The names of the tools whose ``results`` these are, from their archived calls."""
    return {
        use.id: use.name
        for r in results
        for a in archive.by_source_id(r.tool_use_id, session)
        for use in a.entry.tool_uses
        if use.id == r.tool_use_id
    }
