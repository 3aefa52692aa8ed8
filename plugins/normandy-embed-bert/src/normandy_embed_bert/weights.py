"""Reading a ``.safetensors`` file into NumPy arrays, without the ``safetensors`` package.

The format is an 8-byte little-endian header length, a JSON header naming each tensor's
dtype, shape and byte range, then the raw little-endian data; the file is mapped, and
each tensor is a view of the map converted to float32 once.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = ["WeightsError", "read_safetensors"]

#: The dtypes of the format this reader takes, as NumPy dtypes (little-endian).
_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "I32": "<i4"}


class WeightsError(ValueError):
    """A weights file that cannot be read (not safetensors, or a dtype not supported)."""


def read_safetensors(path: Path) -> dict[str, npt.NDArray[np.float32]]:
    """Every tensor of the file at ``path``, by name, as float32 arrays.

    :raises WeightsError: the file is not a safetensors file, or holds a dtype other
        than F32, F16, F64, I64 or I32 (bfloat16 has no NumPy dtype).
    """
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if len(data) < 8:
            raise WeightsError(f"{path}: not a safetensors file (too short)")
        (size,) = struct.unpack("<Q", data[:8])
        try:
            header = json.loads(data[8 : 8 + size])
        except ValueError as exc:
            raise WeightsError(f"{path}: not a safetensors file ({exc})") from exc
        base = 8 + size
        out: dict[str, npt.NDArray[np.float32]] = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = _DTYPES.get(info["dtype"])
            if dtype is None:
                raise WeightsError(f"{path}: tensor {name!r} is {info['dtype']}, not supported")
            start, end = info["data_offsets"]
            raw = np.frombuffer(data[base + start : base + end], dtype=dtype)
            out[name] = raw.astype(np.float32).reshape(info["shape"])
        return out
