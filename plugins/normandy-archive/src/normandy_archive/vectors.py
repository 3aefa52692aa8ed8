"""Vectors as the archive keeps them (little-endian float32 BLOBs) and their ranking.

Ranking needs NumPy (the embedders that make vectors run on it); it is imported only
when a recall ranks by meaning. A session's vectors are held in memory between recalls
(:class:`Held`, by the archive's :class:`HeldSessions`), read from the archive once and
then only those written since.
"""

from __future__ import annotations

import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from normandy_archive.errors import ArchiveError

__all__ = ["Held", "HeldSessions", "nearest", "pack"]


def pack(vector: Sequence[float]) -> bytes:
    """``vector`` as a little-endian float32 BLOB."""
    values = array("f", vector)
    if sys.byteorder != "little":  # pragma: no cover - big-endian machines
        values.byteswap()
    return values.tobytes()


def _numpy() -> Any:
    try:
        import numpy as np
    except ImportError as exc:  # pragma: no cover - every embedder brings NumPy
        raise ArchiveError(
            "recall by meaning ranks vectors with NumPy, which is not installed "
            "(pip install numpy, or an embedder distribution such as normandy-embed-bert)"
        ) from exc
    return np


class Held:
    """One session's vectors of one embedder, unit length, as one matrix."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.matrix: Any = None
        self.top = 0
        """The highest archive order read."""

    def extend(self, rows: Sequence[tuple[int, bytes]]) -> None:
        """Add ``rows`` (``(seq, BLOB)``, in archive order); a vector of another length
        than those held is left out."""
        if not rows:
            return
        np = _numpy()
        self.top = max(self.top, rows[-1][0])
        width = len(rows[0][1]) if self.matrix is None else self.matrix.shape[1] * 4
        fit = [(k, b) for k, b in rows if len(b) == width]
        if not fit:
            return
        new = np.frombuffer(b"".join(b for _, b in fit), dtype="<f4").reshape(len(fit), -1)
        new = new / np.maximum(np.linalg.norm(new, axis=1, keepdims=True), 1e-12)
        self.matrix = new if self.matrix is None else np.vstack([self.matrix, new])
        self.seqs += [k for k, _ in fit]

    def nearest(self, query: Sequence[float], limit: int) -> list[int]:
        """The ``limit`` archive orders whose vectors have the highest cosine with
        ``query``, highest first (the archive order among ties)."""
        if self.matrix is None or limit <= 0:
            return []
        np = _numpy()
        q = np.asarray(query, dtype=np.float32)
        if q.size != self.matrix.shape[1]:
            return []
        scores = self.matrix @ (q / max(float(np.linalg.norm(q)), 1e-12))
        top = min(limit, len(self.seqs))
        picked = np.argpartition(-scores, top - 1)[:top]
        ordered = sorted(picked.tolist(), key=lambda i: (-float(scores[i]), i))
        return [self.seqs[i] for i in ordered]


def nearest(query: Sequence[float], held: Sequence[tuple[int, bytes]], limit: int) -> list[int]:
    """The ``limit`` keys of ``held`` (``(key, BLOB)``) whose vectors have the highest
    cosine with ``query``, highest first.

    :raises ArchiveError: NumPy is not installed.
    """
    found = Held()
    found.extend(held)
    return found.nearest(query, limit)


class HeldSessions:
    """The vectors an archive holds in memory between recalls, per embedder and session:
    at most :attr:`MAX_SESSIONS`, the least recently recalled dropped first."""

    MAX_SESSIONS = 16

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: OrderedDict[tuple[str, str | None], Held] = OrderedDict()

    def get(self, embedder: str, session_id: str | None, last: int) -> Held:
        """The vectors held for ``embedder`` and ``session_id``; started afresh when the
        archive's highest vector, ``last``, is below what they hold (another file at the
        path, or pruned)."""
        key = (embedder, session_id)
        with self._lock:
            found = self._held.pop(key, None)
            if found is None or last < found.top:
                found = Held()
            self._held[key] = found
            while len(self._held) > self.MAX_SESSIONS:
                self._held.popitem(last=False)
            return found
