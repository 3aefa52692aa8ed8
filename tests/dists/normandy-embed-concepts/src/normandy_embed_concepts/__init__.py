"""A test embedder: each text becomes a unit vector over a few concepts, each concept
matched by any of its words, so texts that share no word can still be close."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

CONCEPTS: dict[str, tuple[str, ...]] = {
    "money": ("money", "invoice", "billing", "payment", "charge", "refund", "paid"),
    "failure": ("trouble", "failed", "declined", "error", "crash", "broke", "problem"),
    "network": ("network", "connection", "socket", "timeout", "unreachable"),
    "storage": ("disk", "storage", "volume", "full", "space"),
}

#: How many texts this process embedded (tests check what is embedded once).
CALLS: list[int] = []


class ConceptEmbedder:
    """Texts to unit vectors over :data:`CONCEPTS` (a text with none: a small constant)."""

    def __init__(self, scale: float = 1.0) -> None:
        self.key = f"concepts:{scale:g}"
        self.scale = scale

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        CALLS.append(len(texts))
        out = []
        for text in texts:
            words = set(re.findall(r"[a-z]+", text.lower()))
            v = [float(len(words & set(ws))) * self.scale for ws in CONCEPTS.values()]
            v.append(0.1)  # never the zero vector
            n = math.sqrt(sum(x * x for x in v))
            out.append([x / n for x in v])
        return out


def make(**options: Any) -> ConceptEmbedder:
    """The entry point: ``scale`` is the one option."""
    unknown = set(options) - {"scale"}
    if unknown:
        raise ValueError(f"unknown options {sorted(unknown)}")
    return ConceptEmbedder(float(options.get("scale", 1.0)))
