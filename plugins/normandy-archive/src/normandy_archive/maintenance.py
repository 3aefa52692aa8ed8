"""The archive's background writer: what follows a compaction's commit, off the hot path.

One daemon thread per process (:func:`schedule`) serializes the entries the next
compaction may drop, then indexes what was committed, embeds it when recall ranks by
meaning (:func:`embed_pending`), checkpoints the write-ahead log and prunes past the
retention limits, in small transactions that let a waiting compaction go
first. A failure is logged (``normandy_archive`` logger) and tried again next time: nothing
committed depends on it. It is drained at exit (:func:`drain`).
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from normandy_archive.base import ArchiveBackend, Limits, prepare
from normandy_archive.store import Archive, ArchiveBusyError

if TYPE_CHECKING:
    from normandy_core import Entry
    from normandy_core.contract.embedders import Embedder

__all__ = [
    "DRAIN_TIMEOUT",
    "PRUNE_AT",
    "PRUNE_EVERY",
    "PRUNE_TO",
    "EMBED_PER_PASS",
    "drain",
    "embed_pending",
    "hold",
    "prune",
    "schedule",
]

log = logging.getLogger("normandy_archive")

#: Seconds the interpreter's exit waits for the background writer to finish.
DRAIN_TIMEOUT = 10.0
#: Seconds between two prunings of one archive past its limits.
PRUNE_EVERY = 60.0
#: Share of ``max_bytes`` the file and log may take before the archive is pruned at once,
#: and the share its pages in use are pruned down to then (the log is cut to nothing).
PRUNE_AT = 0.75
PRUNE_TO = 0.7

#: Entries one pass of the background writer embeds (about ten seconds of a small model
#: on one core); more are left to the next pass, scheduled at once.
EMBED_PER_PASS = 64

#: What recall by meaning embeds with (made when the writer first needs it: loading a
#: model takes a second, never on the compaction's path; ``None``: none), and the
#: session it recalls from.
Embedding = tuple[Callable[[], "Embedder | None"], "str | None"]
_Work = tuple[Archive, "Limits | None", Sequence["Entry"], "Embedding | None"]


class _Writer:
    """One daemon thread serving every archive of the process that has work."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start afresh (in a child made by ``fork``: the parent's thread is not there)."""
        self.cond = threading.Condition()
        self.pending: dict[int, _Work] = {}
        self.busy = False
        self.thread: threading.Thread | None = None  # None: not running
        self.pruned: dict[str, float] = {}

    def schedule(
        self,
        archive: Archive,
        limits: Limits | None,
        upcoming: Sequence[Entry],
        embedding: Embedding | None = None,
    ) -> None:
        with self.cond:
            self.pending[id(archive)] = (archive, limits, upcoming, embedding)
            if self.thread is None:  # not started, or its loop ended (it raised)
                self.thread = threading.Thread(
                    target=self.run, name="normandy-archive-writer", daemon=True
                )
                self.thread.start()
            self.cond.notify_all()

    def drain(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while (self.pending or self.busy) and self.thread and self.thread.is_alive():
                if not self.cond.wait(deadline - time.monotonic()):
                    break
            return not (self.pending or self.busy)

    def run(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self.pending:
                        self.cond.wait()
                    work = list(self.pending.values())
                    self.pending.clear()
                    self.busy = True
                try:
                    for archive, limits, upcoming, embedding in work:
                        self.serve(archive, limits, upcoming, embedding)
                finally:
                    with self.cond:
                        self.busy = False
                        self.cond.notify_all()
        finally:
            with self.cond:
                if self.thread is threading.current_thread():
                    self.thread = None  # the next schedule() starts another

    def serve(
        self,
        archive: Archive,
        limits: Limits | None,
        upcoming: Sequence[Entry],
        embedding: Embedding | None = None,
    ) -> None:
        try:
            prepare(upcoming)  # first: an agent compacting again soon finds them
            archive.index(yield_to_writers=True)
            archive.checkpoint(if_over=archive.WAL_CHECKPOINT_BYTES)
        except ArchiveBusyError:  # another process is writing: it indexes, or we do later
            log.debug("archive %s: busy, indexing later", archive.location)
        except Exception as exc:
            log.error("archive %s: indexing failed (tried again later): %s", archive.location, exc)
        if embedding is not None:
            try:
                made, session = embedding
                embedder = made()
                more = embedder is not None and embed_pending(
                    archive, embedder, session, most=EMBED_PER_PASS
                )
            except Exception as exc:
                log.error("archive %s: embedding failed (recall embeds): %s", archive.location, exc)
            else:
                if more:
                    with self.cond:  # the rest next pass: a compaction's work goes first
                        self.pending.setdefault(id(archive), (archive, None, (), embedding))
        now = time.monotonic()
        last = self.pruned.get(archive.location, -math.inf)
        if limits is not None and (_over(archive, limits) or now - last >= PRUNE_EVERY):
            self.pruned[archive.location] = now
            prune(archive, limits)


def embed_pending(
    archive: ArchiveBackend,
    embedder: Embedder,
    session_id: str | None,
    *,
    most: int | None = None,
) -> bool:
    """Embed (and keep) the entries of ``session_id`` that have no vectors of ``embedder``
    yet, on any backend, at most ``most`` of them, 16 at a time: a vector per part of
    each one's searchable text (:func:`~normandy_archive.base.searchable_parts`);
    whether some are left. One call at a time in the process: a recall waits for the
    background writer's pass rather than embed the same entries beside it."""
    from normandy_archive.base import searchable_parts
    from normandy_core.contract.recall_parts import parts_key

    key = parts_key(embedder.key)
    with _EMBEDDING:
        missing = archive.unembedded(key, session_id)
        todo = missing if most is None else missing[:most]
        for start in range(0, len(todo), 16):
            batch = todo[start : start + 16]
            split = [searchable_parts(a.entry) for a in batch]
            made = iter(embedder.embed([p for ps in split for p in ps]))
            kept = {a.seq: [next(made) for _ in ps] for a, ps in zip(batch, split, strict=True)}
            archive.store_vectors(key, kept)
        return len(missing) > len(todo)


#: Held while entries are embedded (:func:`embed_pending`).
_EMBEDDING = threading.Lock()


def _over(archive: Archive, limits: Limits) -> bool:
    """Whether the file and log take more than :data:`PRUNE_AT` of ``max_bytes``."""
    most = limits.max_bytes
    return most is not None and archive.disk_bytes() > most * PRUNE_AT


def prune(archive: Archive, limits: Limits) -> None:
    """Prune ``archive`` to ``limits`` (``max_bytes`` down to :data:`PRUNE_TO` of it, the
    log then cut to nothing); a failure is logged."""
    most = limits.max_bytes
    try:
        archive.prune(
            max_bytes=None if most is None else int(most * PRUNE_TO),
            max_age_seconds=limits.max_age_seconds,
            max_sessions=limits.max_sessions,
        )
        if most is not None:  # the log counts too
            archive.checkpoint(truncate=True)
    except Exception as exc:
        log.error("archive %s: pruning to its limits failed: %s", archive.location, exc)


def hold(archive: Archive, limits: Limits | None) -> None:
    """Prune ``archive`` at once when it is past :data:`PRUNE_AT` of ``max_bytes`` (after a
    compaction's write: at a rate the background writer cannot keep up with)."""
    if limits is not None and _over(archive, limits):
        prune(archive, limits)


def schedule(
    archive: Archive,
    limits: Limits | None = None,
    upcoming: Sequence[Entry] = (),
    embedding: Embedding | None = None,
) -> None:
    """Soon, in the background writer: index and checkpoint ``archive``, prune it past
    ``limits``, serialize ``upcoming`` (the entries a compaction may drop next), and with
    ``embedding`` (what makes the embedder, and a session) embed what recall would rank
    by meaning."""
    _writer.schedule(archive, limits, upcoming, embedding)


def drain(timeout: float = DRAIN_TIMEOUT) -> bool:
    """Wait at most ``timeout`` seconds for the background writer to finish its work;
    whether it did."""
    return _writer.drain(timeout)


def _at_exit() -> None:
    if not drain(DRAIN_TIMEOUT):
        log.warning(
            "the archive's background writer did not finish within %g s; what it left "
            "unindexed is indexed by the next write",
            DRAIN_TIMEOUT,
        )


_writer = _Writer()
atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_writer.reset)
