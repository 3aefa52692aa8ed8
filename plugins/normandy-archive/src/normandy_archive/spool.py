"""The spool: a compaction made durable by one append to a file of its process.

A compaction's dropped entries are committed in the boundary by appending one *frame* to
this process's spool file beside the archive (``<archive>.spool-<pid>-<random>``,
owner-only, locked by its process while it lives): one ``write`` (and an ``fdatasync``
with ``sync="full"``), instead of a SQLite transaction. The background writer then
moves the frames into the archive's journal, in its own transactions, and empties the
file once every frame is moved. So the boundary never waits for the database's lock.

Nothing committed is only in memory: a frame is in the file before the compaction takes
effect. Readers (:meth:`~normandy_archive.Archive.list`, ``search``...) read every
spool file of the archive, read-only, and see its frames as journal rows; the next
writer to open the archive moves the frames a process left when it ended without moving
them (killed, crashed, or the archive locked at exit) and removes its file.

A frame: ``MAGIC``, the header's and body's sizes in bytes, the CRC-32 of both, the header
(a JSON array: the journal row and each entry's size in characters), then the body (the
entries' JSON, one after the other: their ids, roles, content hashes and caller's ids are
read from it). A torn or damaged frame at the end of a file (a crash in the middle of a
write) ends what is read of it: its compaction was never committed.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import json
import logging
import os
import secrets
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CAN_SPOOL",
    "Frame",
    "Spool",
    "decode",
    "encode",
    "in_order",
    "orphans",
    "read_frames",
    "spool_files",
]

log = logging.getLogger("normandy_archive")

MAGIC = b"NSP1"
_HEAD = struct.Struct("<4sIII")
#: What a spool file's name adds to the archive's.
SUFFIX = ".spool-"
#: What the name of a spool file being made adds to the archive's (it is linked to its
#: spool file name once locked; readers and writers never look at such a file).
NEW = ".spoolnew-"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_datasync = getattr(os, "fdatasync", os.fsync)
#: Whether this system has the file locks that tell a live process's spool from one
#: left by a process that ended (without them, compactions are written directly).
CAN_SPOOL = fcntl is not None

#: A ``journal_entries`` row without its journal row's id: entry id, content hash, turn
#: id, role, the entry's JSON, its caller's ids as JSON.
EntryRow = tuple[str, str, "str | None", str, str, "str | None"]


@dataclass(frozen=True)
class Frame:
    """One compaction as the spool holds it."""

    journal: tuple[Any, ...]
    """Its ``journal`` row without ``id`` and ``entry_count``: compaction id, session,
    compactor, strategy, model, mid-round flag, time, tokens before and after, the meta's
    JSON, dropped count, and ``seen`` (a JSON array of the hashes of content it dropped
    again while that content was still in the journal, or ``None``)."""
    entries: tuple[EntryRow, ...]
    """The content it dropped (but what is named in ``seen``), as ``journal_entries``
    rows without the journal row's id."""

    @property
    def compaction_id(self) -> str:
        """The id of the compaction it commits."""
        return str(self.journal[0])


def encode(frame: Frame) -> bytes:
    """``frame`` as the bytes one append writes (an entry's other columns are read from
    its JSON when the frame is decoded)."""
    head = json.dumps([frame.journal, [len(e[4]) for e in frame.entries]]).encode()
    body = "".join([e[4] for e in frame.entries]).encode()
    crc = zlib.crc32(body, zlib.crc32(head))
    return b"".join((_HEAD.pack(MAGIC, len(head), len(body), crc), head, body))


def decode(data: bytes) -> tuple[list[Frame], int]:
    """The whole frames at the start of ``data``, and how many bytes they take: a torn or
    damaged frame ends them."""
    frames: list[Frame] = []
    pos = 0
    while pos + _HEAD.size <= len(data):
        magic, head_size, body_size, crc = _HEAD.unpack_from(data, pos)
        start = pos + _HEAD.size
        end = start + head_size + body_size
        if magic != MAGIC or end > len(data):
            break
        head = data[start : start + head_size]
        body = data[start + head_size : end]
        if zlib.crc32(body, zlib.crc32(head)) != crc:
            break
        try:
            journal, sizes = json.loads(head)
            text = body.decode()
            entries: list[EntryRow] = []
            at = 0
            for size in sizes:
                entries.append(_row(text[at : at + size]))
                at += size
        except (ValueError, TypeError, UnicodeDecodeError):
            break
        frames.append(Frame(tuple(journal), tuple(entries)))
        pos = end
    return frames, pos


def _row(data: str) -> EntryRow:
    """The ``journal_entries`` row of the entry whose JSON is ``data``, as it was written."""
    from normandy_archive.base import entry_row
    from normandy_archive.schema import source_ids
    from normandy_core import Entry

    entry = Entry.model_validate_json(data)
    return entry_row(entry, data, source_ids(entry))


def spool_files(archive: str | os.PathLike[str]) -> list[Path]:
    """The spool files of the archive at ``archive``, by name: regular files (not links)
    of this user that no one else may write (in a directory others may write to, a file
    planted there is not read, nor moved into the archive)."""
    archive = Path(archive)
    prefix = archive.name + SUFFIX
    try:
        with os.scandir(archive.parent) as found:
            return sorted(
                Path(e.path)
                for e in found
                if e.name.startswith(prefix) and e.is_file(follow_symlinks=False) and _ours(e)
            )
    except (FileNotFoundError, NotADirectoryError):
        return []


def _ours(entry: os.DirEntry[str]) -> bool:
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    return st.st_uid == _EUID and not st.st_mode & 0o022


_EUID = os.geteuid() if hasattr(os, "geteuid") else 0


def _read(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def in_order(files: Sequence[list[Frame]]) -> list[Frame]:
    """The frames of several spool files as one list: each file's in its order, the
    files' merged by compaction time."""
    return list(heapq.merge(*files, key=lambda f: f.journal[6]))


def read_frames(archive: str | os.PathLike[str]) -> list[Frame]:
    """Every whole frame of every spool file of ``archive``, read-only (:func:`in_order`):
    frames not moved yet, or moved by a writer that has not emptied its file yet (the
    caller leaves out those the archive holds)."""
    files: list[list[Frame]] = []
    for path in spool_files(archive):
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
        except OSError:  # emptied and removed meanwhile
            continue
        try:
            files.append(decode(_read(fd))[0])
        except OSError as exc:  # what it holds is read by the next writer, or later
            log.warning("spool file %s could not be read: %s", path, exc)
        finally:
            os.close(fd)
    return in_order(files)


@contextlib.contextmanager
def orphans(archive: Path) -> Iterator[list[tuple[Path, list[Frame]]]]:
    """The spool files of ``archive`` no live process holds (their process ended before
    it moved them), locked, with their frames; removed when the block ends without
    error (the caller has moved the frames), unlocked either way."""
    held: list[tuple[Path, int, list[Frame]]] = []
    try:
        for path in spool_files(archive):
            try:
                fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
            except OSError:
                continue
            try:
                if fcntl is not None:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(fd).st_nlink == 0:  # another writer moved it first
                    raise BlockingIOError
            except OSError:  # held by its live process
                os.close(fd)
                continue
            held.append((path, fd, decode(_read(fd))[0]))
        yield [(path, frames) for path, _, frames in held]
        for path, _, _ in held:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    finally:
        for _, fd, _ in held:
            os.close(fd)


class Spool:
    """This process's spool file for one archive, and its frames not moved yet.

    Not thread-safe: the archive calls it under its write lock.
    """

    def __init__(self, archive: Path, *, full_sync: bool) -> None:
        self.archive = archive
        self.full_sync = full_sync
        self.pid = os.getpid()
        self.pending: collections.deque[tuple[Frame, bytes]] = collections.deque()
        """The frames not moved yet, oldest first, each with its bytes."""
        self.pending_bytes = 0
        self.size = 0
        self.fd = -1
        self.path, self.fd = self._create()

    def _create(self) -> tuple[Path, int]:
        """A new spool file, owner-only, locked before it appears under its name: it is
        made under a name spool files never have (:data:`NEW`), locked, then linked to its
        spool file name (which fails rather than replace a file), so another process
        looking for ended processes' files never finds it unlocked."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | _NOFOLLOW | _CLOEXEC
        for _ in range(16):
            tail = f"{os.getpid()}-{secrets.token_hex(4)}"
            path = self.archive.parent / f"{self.archive.name}{SUFFIX}{tail}"
            new = self.archive.parent / f"{self.archive.name}{NEW}{tail}"
            try:
                fd = os.open(new, flags, 0o600)  # new, so owner-only whatever the umask
            except FileExistsError:
                continue
            try:
                if fcntl is not None:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                try:
                    os.link(new, path)
                except FileExistsError:
                    os.close(fd)
                    continue
                except OSError:  # no hard links on this file system: renamed instead
                    if os.path.lexists(path):
                        os.close(fd)
                        continue
                    os.replace(new, path)
                finally:
                    with contextlib.suppress(OSError):
                        new.unlink()
                if self.full_sync:
                    _sync_directory(self.archive.parent)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.close(fd)
                with contextlib.suppress(OSError):
                    path.unlink()
                raise
            return path, fd
        raise FileExistsError(f"no free spool file name beside {self.archive}")

    def append(self, frame: Frame, data: bytes) -> None:
        """Commit ``frame`` (its bytes ``data``): in the file when this returns (synced
        with ``full_sync``); on failure the file is as it was, and the error raised."""
        if os.fstat(self.fd).st_nlink == 0:  # removed under us: a new file, whole
            self._renew()
        self._write([data])
        self.pending.append((frame, data))
        self.pending_bytes += len(data)

    def _write(self, chunks: Sequence[bytes]) -> None:
        start = self.size
        try:
            for data in chunks:
                view = memoryview(data)
                while view:
                    view = view[os.write(self.fd, view) :]
            if self.full_sync:
                _datasync(self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, start)
            raise
        self.size = start + sum(len(d) for d in chunks)

    def _renew(self) -> None:
        """Move to a new file holding every frame not moved yet (the old one was removed)."""
        old = self.fd
        self.path, self.fd = self._create()
        self.size = 0
        os.close(old)
        self._write([data for _, data in self.pending])

    def moved(self, count: int) -> None:
        """The ``count`` oldest frames are in the archive: forget them, and empty the file
        once none is left (a frame moved and still in the file is moved again at
        worst, and then skipped: the archive holds its compaction)."""
        for _ in range(count):
            _, data = self.pending.popleft()
            self.pending_bytes -= len(data)
        if not self.pending and self.size:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
                self.size = 0

    def __del__(self) -> None:  # dropped unclosed: another writer may move what is left
        if self.fd >= 0 and self.pid == os.getpid():
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        """Close the file; remove it when every frame is moved (else the next writer
        moves what is left)."""
        if self.pid != os.getpid():  # the parent's, inherited over fork
            return
        if not self.pending:
            with contextlib.suppress(OSError):
                self.path.unlink()
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1


def _sync_directory(path: Path) -> None:
    """Make a new file's name durable (``sync="full"``)."""
    with contextlib.suppress(OSError):  # pragma: no cover - not every system opens them
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
