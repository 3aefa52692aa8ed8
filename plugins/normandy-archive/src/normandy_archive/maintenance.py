"""The archive's background writer: what follows a durable write, off the hot path.

The hook commits a compaction's dropped entries in the boundary (that is what makes
them durable: SQLite, one transaction into the tables); indexing them (full text,
caller ids), checkpointing the write-ahead log,
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
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from normandy_archive.store import Archive
    from normandy_core import Entry

__all__ = [
    "DRAIN_TIMEOUT",
    "PRUNE_AT",
    "PRUNE_EVERY",
    "PRUNE_TO",
    "Limits",
    "drain",
    "hold",
    "prune",
    "schedule",
]

log = logging.getLogger("normandy_archive")

#: Seconds the interpreter's exit waits for the background writer to finish.
DRAIN_TIMEOUT = 10.0
#: Seconds between two prunings of one archive past its limits.
PRUNE_EVERY = 60.0
#: Seconds without a write the background writer waits for before it indexes.
IDLE = 0.01
#: The longest it waits for such a pause, in seconds, before it indexes anyway.
MAX_DELAY = 2.0
#: Share of ``max_bytes`` the archive's file and log may take on the disk before it is
#: pruned at once (not waiting for :data:`PRUNE_EVERY`, nor for a pause), and the share of
#: it the pages in use are pruned down to then: the file, which reuses the pages pruning
#: frees, and the log, cut back to nothing after it, stay within ``max_bytes``.
PRUNE_AT = 0.75
PRUNE_TO = 0.7
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
        # The entries the next compaction may drop are serialized at once, not after the
        # pause (an agent compacting again soon finds them ready), and so are those of
        # every compaction scheduled while it waits for the pause.
        self.prepare(archive, upcoming)
        if not _over(archive, limits, PRUNE_AT):
            limits = self.wait_for_a_pause(archive, limits)
        self.index(archive)
        if limits is None:
            return
        now = time.monotonic()
        over = _over(archive, limits, PRUNE_AT)
        if not over and now - self.pruned.get(archive.location, -math.inf) < PRUNE_EVERY:
            return
        self.pruned[archive.location] = now
        prune(archive, limits)

    def wait_for_a_pause(self, archive: Archive, limits: Limits | None) -> Limits | None:
        """Wait for a pause in the compactions, but not for ever (:data:`IDLE`,
        :data:`MAX_DELAY`), preparing what compactions scheduled meanwhile may drop; the
        latest limits."""
        latest = time.monotonic() + MAX_DELAY
        while not self.hurry:
            now = time.monotonic()
            pause = now - archive.last_write
            if pause >= IDLE or now >= latest or _over(archive, limits, PRUNE_AT):
                break
            with self.cond:
                newer = self.pending.pop(id(archive), None)
                if newer is None:
                    self.cond.wait(min(IDLE - pause, latest - now))
                    newer = self.pending.pop(id(archive), None)
            if newer is not None:
                limits = newer[1]
                self.prepare(archive, newer[2])
        return limits

    @staticmethod
    def index(archive: Archive) -> None:
        """Index what was committed and checkpoint the log (a failure is logged: it is
        tried again next time)."""
        from normandy_archive.store import ArchiveBusyError

        try:
            archive.index(yield_to_writers=True)
            archive.checkpoint(if_over=archive.WAL_CHECKPOINT_BYTES)
        except ArchiveBusyError:  # another process is writing: it indexes, or we do later
            log.debug("archive %s: busy, indexing later", archive.location)
        except Exception as exc:
            log.error("archive %s: indexing failed (tried again later): %s", archive.location, exc)


def prune(archive: Archive, limits: Limits) -> None:
    """Prune ``archive`` to ``limits`` (``max_bytes`` down to :data:`PRUNE_TO` of it, the
    log then cut to nothing); a failure is logged."""
    try:
        archive.prune(
            max_bytes=None if limits.max_bytes is None else int(limits.max_bytes * PRUNE_TO),
            max_age_seconds=limits.max_age_seconds,
            max_sessions=limits.max_sessions,
        )
        if limits.max_bytes is not None:  # the log counts too: cut it back to nothing
            archive.checkpoint(if_over=0, truncate=True)
    except Exception as exc:
        log.error("archive %s: pruning to its limits failed: %s", archive.location, exc)


def hold(archive: Archive, limits: Limits | None) -> None:
    """Prune ``archive`` at once when its file and log take more than :data:`PRUNE_AT`
    of ``max_bytes`` (the hook calls it after a compaction's write: at a rate the
    background writer cannot keep up with, the boundary prunes)."""
    if limits is not None and _over(archive, limits, PRUNE_AT):
        prune(archive, limits)


def _over(archive: Archive, limits: Limits | None, share: float) -> bool:
    """Whether the archive's file and log together take more than ``share`` of
    ``max_bytes`` on the disk."""
    if limits is None or limits.max_bytes is None:
        return False
    return archive.disk_bytes() > limits.max_bytes * share


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


def _after_fork() -> None:
    global _writer
    _writer = _Writer()  # the parent's thread does not exist here


atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
