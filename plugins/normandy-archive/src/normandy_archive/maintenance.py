"""The archive's background writer: what follows a durable write, off the hot path.

The hook commits a compaction's dropped entries in the boundary (that is what makes
them durable: SQLite, one frame appended to the process's spool file); moving them into
the journal and the indexed tables and
indexing them (full text, caller ids), checkpointing the write-ahead log,
pruning past the retention limits and serializing the entries the next compaction will
drop (so that it does not have to) happen afterwards, in one daemon thread per
process (:func:`schedule`). It waits for a pause in the compactions (:data:`IDLE`
seconds without a write, at most :data:`MAX_DELAY` seconds after being asked), so a
busy agent batches many compactions into few transactions, and it works in small
transactions on the archive's own write connection, under the same lock as the hook's
writes, letting a waiting compaction go first between two batches. It is drained when
the interpreter exits (at most
:data:`DRAIN_TIMEOUT` seconds, :func:`drain`); what a killed process left unindexed is
indexed by the next writer, and searches meanwhile also look at the rows not yet
indexed. A failure is logged (``normandy_archive`` logger) and tried again next time:
nothing committed depends on it.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from normandy_archive.store import Archive
    from normandy_core import Entry

__all__ = ["DRAIN_TIMEOUT", "PRUNE_EVERY", "Limits", "drain", "schedule"]

log = logging.getLogger("normandy_archive")

#: Seconds the interpreter's exit waits for the background writer to finish.
DRAIN_TIMEOUT = 10.0
#: Seconds between two prunings of one archive past its limits.
PRUNE_EVERY = 60.0
#: Seconds without a write the background writer waits for before it indexes.
IDLE = 0.01
#: The longest it waits for such a pause, in seconds, before it indexes anyway.
MAX_DELAY = 2.0
#: Entries it serializes ahead between two chances for another thread to run.
PREPARE_STEP = 8


@dataclass(frozen=True)
class Limits:
    """Retention limits to prune an archive to (``None``: no such limit)."""

    max_bytes: int | None = None
    max_age_seconds: float | None = None
    max_sessions: int | None = None


class _Writer:
    """One daemon thread serving every archive of the process that has work."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        """The condition's lock, taken directly where no wait follows (no Python frame)."""
        self.cond = threading.Condition(self.lock)
        self.pending: dict[int, tuple[Archive, Limits | None, Sequence[Entry]]] = {}
        self.busy = False
        self.thread: threading.Thread | None = None
        """The writer thread; ``None`` before it starts and once its loop has ended."""
        self.pruned: dict[str, float] = {}
        self.hurry = False  # draining: no waiting for a pause

    def schedule(self, archive: Archive, limits: Limits | None, upcoming: Sequence[Entry]) -> None:
        with self.lock:
            self.pending[id(archive)] = (archive, limits, upcoming)
            if self.thread is None:  # not started, or its loop ended (it raised)
                self.thread = threading.Thread(
                    target=self.run, name="normandy-archive-writer", daemon=True
                )
                self.thread.start()
            self.cond.notify_all()

    def drain(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            self.hurry = True
            self.cond.notify_all()  # a writer waiting for a pause stops waiting
            try:
                while self.pending or self.busy:
                    left = deadline - time.monotonic()
                    if left <= 0 or self.thread is None or not self.thread.is_alive():
                        return not (self.pending or self.busy)
                    self.cond.wait(left)
            finally:
                self.hurry = False
        return True

    def run(self) -> None:
        try:
            self.loop()
        finally:
            with self.lock:
                if self.thread is threading.current_thread():
                    self.thread = None  # the next schedule() starts another

    def loop(self) -> None:
        while True:
            with self.cond:
                while not self.pending:
                    self.cond.wait()
                work = list(self.pending.values())
                self.pending.clear()
                self.busy = True
            try:
                for archive, limits, upcoming in work:
                    self.serve(archive, limits, upcoming)
            finally:
                with self.cond:
                    self.busy = False
                    self.cond.notify_all()

    @staticmethod
    def prepare(archive: Archive, upcoming: Sequence[Entry]) -> None:
        """Serialize ``upcoming`` ahead (:func:`~normandy_archive.base.prepare`), a few at
        a time, letting a waiting thread take the interpreter between two (a boundary
        running meanwhile does not wait for the whole batch)."""
        from normandy_archive.base import prepare

        try:
            for start in range(0, len(upcoming), PREPARE_STEP):
                if prepare(upcoming[start : start + PREPARE_STEP]):
                    time.sleep(0)
        except Exception as exc:  # pragma: no cover - serializing a checked entry
            log.error("archive %s: preparing entries failed: %s", archive.location, exc)

    def serve(self, archive: Archive, limits: Limits | None, upcoming: Sequence[Entry]) -> None:
        from normandy_archive.store import ArchiveBusyError

        latest = time.monotonic() + MAX_DELAY
        # The entries the next compaction may drop are serialized at once, not after the
        # pause (an agent compacting again soon finds them ready), and so are those of
        # every compaction scheduled while it waits for the pause.
        self.prepare(archive, upcoming)
        while not self.hurry:  # wait for a pause in the compactions, but not for ever
            now = time.monotonic()
            pause = now - archive.last_write
            if pause >= IDLE or now >= latest:
                break
            with self.cond:
                newer = self.pending.pop(id(archive), None)
                if newer is None:
                    self.cond.wait(min(IDLE - pause, latest - now))
                    newer = self.pending.pop(id(archive), None)
            if newer is not None:
                limits = newer[1]
                self.prepare(archive, newer[2])
        interrupted = archive.interrupted
        try:
            archive.index(yield_to_writers=True)
            archive.checkpoint(if_over=archive.WAL_CHECKPOINT_BYTES)
        except ArchiveBusyError:  # another process is writing: it indexes, or we do later
            log.debug("archive %s: busy, indexing later", archive.location)
            if archive.interrupted != interrupted:  # a compaction of ours went first
                with self.cond:  # again after the next pause (nothing to prepare)
                    self.pending.setdefault(id(archive), (archive, limits, ()))
        except Exception as exc:
            log.error("archive %s: indexing failed (tried again later): %s", archive.location, exc)
        if limits is None:
            return
        now = time.monotonic()
        if now - self.pruned.get(archive.location, -math.inf) < PRUNE_EVERY:
            return
        self.pruned[archive.location] = now
        try:
            archive.prune(
                max_bytes=limits.max_bytes,
                max_age_seconds=limits.max_age_seconds,
                max_sessions=limits.max_sessions,
            )
        except Exception as exc:
            log.error("archive %s: pruning to its limits failed: %s", archive.location, exc)


_writer = _Writer()


def schedule(
    archive: Archive, limits: Limits | None = None, upcoming: Sequence[Entry] = ()
) -> None:
    """Index what ``archive`` committed, checkpoint it, prune it past ``limits``, and
    serialize ``upcoming`` (the entries a compaction may drop next): soon, in the
    background writer thread."""
    _writer.schedule(archive, limits, upcoming)


def drain(timeout: float = DRAIN_TIMEOUT) -> bool:
    """Wait (at most ``timeout`` seconds) until the background writer has nothing left
    to do; whether it finished."""
    return _writer.drain(timeout)


def _at_exit() -> None:
    if not drain(DRAIN_TIMEOUT):
        log.warning(
            "the archive's background writer did not finish within %g s; what it left "
            "unindexed is indexed by the next write",
            DRAIN_TIMEOUT,
        )
    store = sys.modules.get("normandy_archive.store")
    if store is not None:  # spool files left empty are removed (the others, moved later)
        store.close_spools()


def _after_fork() -> None:
    global _writer
    _writer = _Writer()  # the parent's thread does not exist here


atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
