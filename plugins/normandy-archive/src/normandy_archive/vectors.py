"""Vectors as the SQLite archive keeps them (little-endian float32 BLOBs, one per entry holding
the vectors of its parts) and their ranking.

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
from normandy_core.contract.recall_parts import MAX_PARTS

__all__ = ["Held", "HeldSessions", "nearest", "pack", "pack_parts"]


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
    """One session's vectors of one embedder, unit length, as one matrix: a row per part
    of each entry (:func:`~normandy_core.contract.recall_parts.parts`), an entry's parts
    one after another in its BLOB."""

    def __init__(self) -> None:
        self.owners: list[tuple[int, int]] = []
        """Each row's archive order and part."""
        self.matrix: Any = None
        self.top = 0
        """The highest archive order read."""

    def extend(self, rows: Sequence[tuple[int, bytes]], width: int) -> None:
        """Add ``rows`` (``(seq, BLOB)``, in archive order), each BLOB the vectors of
        ``width`` floats of an entry's parts; a BLOB of another size than a whole number
        of such vectors, or of more vectors than an entry has parts, is left out."""
        if not rows:
            return
        np = _numpy()
        self.top = max(self.top, rows[-1][0])
        size = 4 * width
        if self.matrix is not None and self.matrix.shape[1] != width:
            return  # the query's model is not the one these vectors were made by
        fit = [(k, b) for k, b in rows if b and len(b) % size == 0 and len(b) <= MAX_PARTS * size]
        if not fit:
            return
        new = np.frombuffer(b"".join(b for _, b in fit), dtype="<f4").reshape(-1, width)
        new = new / np.maximum(np.linalg.norm(new, axis=1, keepdims=True), 1e-12)
        self.matrix = new if self.matrix is None else np.vstack([self.matrix, new])
        self.owners += [(k, p) for k, b in fit for p in range(len(b) // size)]

    def nearest(self, query: Sequence[float], limit: int) -> list[tuple[int, int, float]]:
        """The ``limit`` entries whose closest part has the highest cosine with ``query``,
        highest first (the archive order among ties): ``(seq, part, cosine)``."""
        if self.matrix is None or limit <= 0:
            return []
        np = _numpy()
        q = np.asarray(query, dtype=np.float32)
        if q.size != self.matrix.shape[1]:
            return []
        scores = self.matrix @ (q / max(float(np.linalg.norm(q)), 1e-12))
        best: dict[int, tuple[int, float]] = {}
        for row in np.lexsort((np.arange(len(scores)), -scores)).tolist():
            seq, part = self.owners[row]
            if seq not in best:
                best[seq] = (part, float(scores[row]))
                if len(best) >= limit:
                    break
        return [(seq, part, cos) for seq, (part, cos) in best.items()]


def nearest(
    query: Sequence[float], held: Sequence[tuple[int, bytes]], limit: int
) -> list[tuple[int, int, float]]:
    """:meth:`Held.nearest` of the vectors ``held`` (``(seq, BLOB)``): the ``limit``
    entries whose closest part is closest to ``query``, ``(seq, part, cosine)``.

    :raises ArchiveError: NumPy is not installed.
    """
    found = Held()
    found.extend(held, len(query))
    return found.nearest(query, limit)


def pack_parts(vectors: Sequence[Sequence[float]]) -> bytes:
    """The vectors of an entry's parts as one BLOB, in order."""
    return b"".join(pack(v) for v in vectors)


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
