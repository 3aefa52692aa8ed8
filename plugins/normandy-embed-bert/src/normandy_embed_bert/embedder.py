"""The ``bert`` embedder: a sentence-transformers BERT model in a directory on disk.

The directory is the one such a model is published as: ``config.json``,
``model.safetensors``, ``tokenizer.json``, and optionally ``modules.json`` (whether the
vectors are normalized), ``1_Pooling/config.json`` (mean or CLS pooling) and
``sentence_bert_config.json`` (the longest input in tokens).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from normandy_embed_bert.encoder import BertConfig, BertEncoder
from normandy_embed_bert.weights import read_safetensors

__all__ = ["ENV_MODEL", "BertEmbedder", "BertOptions", "make_embedder"]

#: Environment variable naming the model directory when the ``path`` option is not given.
ENV_MODEL = "NORMANDY_EMBED_BERT_MODEL"


class BertOptions(BaseModel):
    """The ``bert`` embedder's options (``embedder_options`` of the archive's settings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str | None = None
    """The model's directory; default: :data:`ENV_MODEL`."""
    max_tokens: int = Field(default=256, ge=8, le=512)
    """Tokens of each text embedded (the rest is cut); the model's own limit caps it."""
    batch: int = Field(default=16, ge=1, le=1024)
    """Texts run through the model together."""


class BertEmbedder:
    """Texts to unit vectors with a BERT model read from ``options.path``."""

    def __init__(self, options: BertOptions) -> None:
        raw = options.path or os.environ.get(ENV_MODEL)
        if not raw:
            raise ValueError(f"no model directory: give the 'path' option or set {ENV_MODEL}")
        root = Path(raw).expanduser()
        for needed in ("config.json", "model.safetensors", "tokenizer.json"):
            if not (root / needed).is_file():
                raise ValueError(f"{root} holds no {needed}: not a BERT model directory")
        from tokenizers import Tokenizer

        config = BertConfig.from_json(json.loads((root / "config.json").read_text("utf-8")))
        self.encoder = BertEncoder(config, read_safetensors(root / "model.safetensors"))
        limit = min(options.max_tokens, _model_limit(root), config.max_position_embeddings)
        self.tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        self.tokenizer.enable_truncation(limit)
        self.tokenizer.no_padding()
        self.batch = options.batch
        self.cls_pooling = _pooling(root) == "cls"
        self.normalize = _normalizes(root)
        #: What identifies these vectors: the model's directory name and settings that
        #: change them (vectors of another model are never compared with these).
        self.key = f"bert:{root.name}:{limit}:{'cls' if self.cls_pooling else 'mean'}"
        self.dimensions = config.hidden_size

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order (unit length when the model normalizes).

        The texts run in batches of like length (sorted by their token count), so a short
        text is not padded to a long one's width: attention costs the square of it."""
        if not texts:
            return []
        encoded = self.tokenizer.encode_batch([t or " " for t in texts])
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].ids))
        out = np.empty((len(encoded), self.dimensions), dtype=np.float32)
        for start in range(0, len(order), self.batch):
            rows = order[start : start + self.batch]
            out[rows] = self._batch([encoded[i].ids for i in rows])
        vectors: list[list[float]] = out.tolist()
        return vectors

    def embed_array(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """:meth:`embed` as one float32 array, ``(len(texts), dimensions)``."""
        return np.asarray(self.embed(texts), dtype=np.float32).reshape(-1, self.dimensions)

    def _batch(self, rows: Sequence[Sequence[int]]) -> npt.NDArray[np.float32]:
        width = max(len(r) for r in rows)
        ids = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for row, r in enumerate(rows):
            ids[row, : len(r)] = r
            mask[row, : len(r)] = 1
        hidden = self.encoder(ids, mask)
        if self.cls_pooling:
            pooled = hidden[:, 0]
        else:
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)
        if self.normalize:
            pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled.astype(np.float32)


def _model_limit(root: Path) -> int:
    """The longest input the model was trained for (``sentence_bert_config.json``)."""
    found = root / "sentence_bert_config.json"
    if found.is_file():
        return int(json.loads(found.read_text("utf-8")).get("max_seq_length", 512))
    return 512


def _pooling(root: Path) -> str:
    """``cls`` or ``mean``: how the model's token states become one vector."""
    found = root / "1_Pooling" / "config.json"
    if found.is_file() and json.loads(found.read_text("utf-8")).get("pooling_mode_cls_token"):
        return "cls"
    return "mean"


def _normalizes(root: Path) -> bool:
    """Whether the model's modules end with a Normalize (else: not normalized)."""
    found = root / "modules.json"
    if not found.is_file():
        return True  # cosine similarity is what recall compares by: unit vectors
    modules = json.loads(found.read_text("utf-8"))
    return any(str(m.get("type", "")).endswith("Normalize") for m in modules)


def make_embedder(**options: Any) -> BertEmbedder:
    """The entry point: a :class:`BertEmbedder` of ``options`` (:class:`BertOptions`).

    :raises ValueError: an unknown option, a bad value, or a directory that is not a
        BERT model's.
    """
    try:
        checked = BertOptions(**options)
    except ValidationError as exc:
        raise ValueError(str(exc)) from None
    return BertEmbedder(checked)
