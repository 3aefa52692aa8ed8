"""The cache of decoded tokenizer vocabularies, so a new process skips the decode.

Building cl100k for exact counts decodes its vocabulary file (100,256 base64 lines) into
the ``bytes -> rank`` table tiktoken is handed: about a fifth of the instructions of a
process's first compaction. The first process stores the decoded table (Python's
``marshal`` format) in the cache directory; every later process loads it in about half
the instructions, then builds the same tiktoken encoding from it.

**Where.** Only where ``NORMANDY_CACHE_DIR`` names a directory (for instance
``~/.cache/normandy``): the cache is off by default, so Normandy writes nothing outside
the archive unless asked. On a quiet machine the first exact compaction of a process
took 310 ms with the cache and 300 ms without it (benchmarks, section 11): the
instructions it saves are not a wall-clock gain there, so it is left to whoever
measures one on their machine.

**Correctness.** A cache file is named by the SHA-256 of the vocabulary file it was
decoded from, and by the Python version and marshal format that wrote it, so another
vocabulary or interpreter never reads it. It carries the CRC-32 of its own content,
checked at every load: a file damaged or cut short is ignored (and replaced), never
used. It is written to a temporary file in the same directory and renamed into place,
so a reader never sees it half-written. A directory that cannot be created or written
only means no cache (said once at DEBUG): counting never fails because of it.
"""

from __future__ import annotations

import contextlib
import logging
import marshal
import os
import sys
import tempfile
import zlib
from pathlib import Path

__all__ = ["CACHE_ENV", "cache_dir", "cache_path", "load_ranks", "store_ranks"]

log = logging.getLogger("normandy_core.vocabcache")

#: The environment variable naming the cache directory (``off`` disables the cache).
CACHE_ENV = "NORMANDY_CACHE_DIR"
_OFF = ("off", "0", "false", "no", "none")
_MAGIC = b"normandy-ranks-2\n"
_DIGEST = 4  # CRC-32, big-endian


def cache_dir() -> Path | None:
    """The directory ``NORMANDY_CACHE_DIR`` names, or ``None`` (the cache is off: unset,
    or ``off``, ``0``, ``false``)."""
    value = os.environ.get(CACHE_ENV, "").strip()
    if not value or value.lower() in _OFF:
        return None
    return Path(value).expanduser()


def cache_path(name: str, source_sha256: str) -> Path | None:
    """Where the table decoded from the vocabulary ``name`` (whose file has the SHA-256
    ``source_sha256``) is cached by this interpreter; ``None`` when the cache is off."""
    folder = cache_dir()
    if folder is None:
        return None
    v = sys.version_info
    return folder / f"{name}-{source_sha256[:32]}-py{v.major}{v.minor}-m{marshal.version}.ranks"


def load_ranks(name: str, source_sha256: str, size: int) -> dict[bytes, int] | None:
    """The cached table of ``name``, when a file for this vocabulary and interpreter is
    there, intact, and holds a table of ``size`` tokens; otherwise ``None``."""
    path = cache_path(name, source_sha256)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    head = len(_MAGIC) + _DIGEST
    if not data.startswith(_MAGIC) or len(data) <= head:
        log.debug("ignoring the vocabulary cache %s: not a cache file", path)
        return None
    payload = memoryview(data)[head:]
    if zlib.crc32(payload).to_bytes(_DIGEST, "big") != data[len(_MAGIC) : head]:
        log.debug("ignoring the vocabulary cache %s: its content does not match its hash", path)
        return None
    try:
        ranks = marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None
    if not isinstance(ranks, dict) or len(ranks) != size:
        log.debug("ignoring the vocabulary cache %s: not a table of %d tokens", path, size)
        return None
    return ranks


def store_ranks(name: str, source_sha256: str, ranks: dict[bytes, int]) -> Path | None:
    """Write the table decoded from ``name``'s file to the cache; the file written, or
    ``None`` when the cache is off or could not be written (said at DEBUG)."""
    path = cache_path(name, source_sha256)
    if path is None:
        return None
    payload = marshal.dumps(ranks)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + zlib.crc32(payload).to_bytes(_DIGEST, "big") + payload)
        os.replace(tmp, path)
    except OSError as error:
        log.debug("vocabulary cache not written to %s: %s", path, error)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return None
    log.debug("decoded vocabulary %s cached in %s", name, path)
    return path
