"""Vectors as the archive keeps them (little-endian float32 BLOBs) and their ranking.

Ranking needs NumPy (the embedders that make vectors run on it); it is imported only
when a recall ranks by meaning.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

from normandy_archive.errors import ArchiveError

__all__ = ["nearest", "pack"]


def pack(vector: Sequence[float]) -> bytes:
    """``vector`` as a little-endian float32 BLOB."""
    values = array("f", vector)
    if sys.byteorder != "little":  # pragma: no cover - big-endian machines
        values.byteswap()
    return values.tobytes()


def nearest(query: Sequence[float], held: Sequence[tuple[int, bytes]], limit: int) -> list[int]:
    """The ``limit`` keys of ``held`` (``(key, BLOB)``) whose vectors have the highest
    cosine with ``query``, highest first (the archive order among ties); vectors of
    another length than the query's are left out.

    :raises ArchiveError: NumPy is not installed.
    """
    try:
        import numpy as np
    except ImportError as exc:  # pragma: no cover - every embedder brings NumPy
        raise ArchiveError(
            "recall by meaning ranks vectors with NumPy, which is not installed "
            "(pip install numpy, or an embedder distribution such as normandy-embed-bert)"
        ) from exc
    q = np.asarray(query, dtype=np.float32)
    width = q.size * 4
    fit = [(k, b) for k, b in held if len(b) == width]
    if not fit or limit <= 0:
        return []
    matrix = np.frombuffer(b"".join(b for _, b in fit), dtype="<f4").reshape(len(fit), q.size)
    norms = np.linalg.norm(matrix, axis=1) * max(float(np.linalg.norm(q)), 1e-12)
    scores = (matrix @ q) / np.maximum(norms, 1e-12)
    top = min(limit, len(fit))
    picked = np.argpartition(-scores, top - 1)[:top]
    ordered = sorted(picked.tolist(), key=lambda i: (-float(scores[i]), i))
    return [fit[i][0] for i in ordered]
