"""A BERT encoder's forward pass in NumPy: embeddings, the transformer layers, pooling.

It runs the checkpoints that sentence-transformers publishes for the BERT family
(``all-MiniLM-L6-v2`` and the like): post-layer-norm BERT with absolute positions and
GELU, its weights named as ``transformers`` saves a ``BertModel`` (with or without the
``bert.`` prefix). Inference only, float32, on the CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["BertConfig", "BertEncoder"]

Array = npt.NDArray[np.float32]


@dataclass(frozen=True)
class BertConfig:
    """The shape of the model, from its ``config.json``."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    layer_norm_eps: float = 1e-12
    max_position_embeddings: int = 512

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BertConfig:
        """The config of a ``config.json``.

        :raises ValueError: not a BERT model with GELU and absolute positions.
        """
        if data.get("model_type", "bert") != "bert":
            raise ValueError(f"model_type {data.get('model_type')!r} is not 'bert'")
        if data.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"hidden_act {data.get('hidden_act')!r} is not 'gelu'")
        if data.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        return cls(
            hidden_size=int(data["hidden_size"]),
            num_hidden_layers=int(data["num_hidden_layers"]),
            num_attention_heads=int(data["num_attention_heads"]),
            layer_norm_eps=float(data.get("layer_norm_eps", 1e-12)),
            max_position_embeddings=int(data.get("max_position_embeddings", 512)),
        )


def _layer_norm(x: Array, weight: Array, bias: Array, eps: float) -> Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    out: Array = (x - mean) / np.sqrt(var + eps) * weight + bias
    return out


def _gelu(x: Array) -> Array:
    """The exact (erf) GELU BERT was trained with, not the tanh approximation, in place
    (``x`` is overwritten and returned), a cache-sized slice at a time: the error
    function's dozen steps over whole layer-sized arrays cost as much as the dense layers
    themselves, from the temporaries alone."""
    flat = x.reshape(-1)
    for start in range(0, flat.size, _CHUNK):
        part = flat[start : start + _CHUNK]
        part *= _gelu_factor(part)
    return x


#: Elements of one slice of :func:`_gelu`: its temporaries stay in the CPU's cache.
_CHUNK = 1 << 15


def _gelu_factor(x: Array) -> Array:
    """``0.5 * (1 + erf(x / sqrt 2))``, within 1.5e-7 of erf (Abramowitz and Stegun
    7.1.26): finer than float32 needs, and NumPy has no erf of its own."""
    z = x * np.float32(1.0 / math.sqrt(2.0))
    a = np.abs(z)
    t = a * np.float32(0.3275911)
    t += np.float32(1.0)
    np.reciprocal(t, out=t)
    poly = t * np.float32(1.061405429)
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += np.float32(c)
        poly *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a  # 1 - erf(|z|)
    # 0.5 * (1 + sign(z) * (1 - poly)): 1 - poly/2 where z >= 0, poly/2 where z < 0
    poly *= np.float32(0.5)
    out: Array = np.where(z >= 0, np.float32(1.0) - poly, poly)
    return out


class BertEncoder:
    """The forward pass of one BERT model, its weights held as float32 arrays."""

    def __init__(self, config: BertConfig, weights: dict[str, Array]) -> None:
        self.config = config
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in weights else ""
        self._w = {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}
        self._t: dict[str, Array] = {}
        missing = [k for k in self._names() if k not in self._w]
        if missing:
            raise ValueError(f"the weights lack {len(missing)} tensors, first {missing[0]!r}")

    def _names(self) -> list[str]:
        names = [
            "embeddings.word_embeddings.weight",
            "embeddings.position_embeddings.weight",
            "embeddings.token_type_embeddings.weight",
            "embeddings.LayerNorm.weight",
            "embeddings.LayerNorm.bias",
        ]
        for i in range(self.config.num_hidden_layers):
            for part in _LAYER_PARTS:
                names += [f"encoder.layer.{i}.{part}.weight", f"encoder.layer.{i}.{part}.bias"]
        return names

    def __call__(self, ids: npt.NDArray[np.int64], mask: npt.NDArray[np.int64]) -> Array:
        """The last hidden states, ``(batch, tokens, hidden)``, of token ``ids`` padded
        per ``mask`` (1: a token, 0: padding)."""
        w, cfg = self._w, self.config
        positions = np.arange(ids.shape[1])
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][positions][None]
            + w["embeddings.token_type_embeddings.weight"][0][None, None]
        )
        x = _layer_norm(
            x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], cfg.layer_norm_eps
        )
        # padding may not be attended to: a large negative score before the softmax
        bias = ((1.0 - mask[:, None, None, :].astype(np.float32)) * -1e9).astype(np.float32)
        for i in range(cfg.num_hidden_layers):
            x = self._layer(x, bias, f"encoder.layer.{i}.")
        return x

    def _dense(self, x: Array, name: str) -> Array:
        # one 2-D product against the weight transposed once: a stacked product with a
        # transposed view misses BLAS and costs tens of times more
        key = f"{name}.weight"
        weight = self._t.get(key)
        if weight is None:
            weight = self._t[key] = np.ascontiguousarray(self._w[key].T)
        flat = x.reshape(-1, x.shape[-1]) @ weight + self._w[f"{name}.bias"]
        out: Array = flat.reshape(*x.shape[:-1], weight.shape[1])
        return out

    def _layer(self, x: Array, bias: Array, p: str) -> Array:
        cfg, w = self.config, self._w
        b, t, h = x.shape
        heads = cfg.num_attention_heads
        size = h // heads

        def split(y: Array) -> Array:
            # contiguous per head: NumPy's stacked matmul reaches BLAS only then (a
            # strided view made attention ten times slower than the dense layers)
            return np.ascontiguousarray(y.reshape(b, t, heads, size).transpose(0, 2, 1, 3))

        q = split(self._dense(x, p + "attention.self.query"))
        k = split(self._dense(x, p + "attention.self.key"))
        v = split(self._dense(x, p + "attention.self.value"))
        q *= np.float32(1.0 / math.sqrt(size))
        scores = q @ np.ascontiguousarray(k.transpose(0, 1, 3, 2))
        # the softmax in place: these are the largest arrays of the pass
        scores += bias
        scores -= scores.max(-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(-1, keepdims=True)
        context = (scores @ v).transpose(0, 2, 1, 3).reshape(b, t, h)
        eps = cfg.layer_norm_eps
        attended = self._dense(context, p + "attention.output.dense") + x
        x = _layer_norm(
            attended,
            w[p + "attention.output.LayerNorm.weight"],
            w[p + "attention.output.LayerNorm.bias"],
            eps,
        )
        inner = _gelu(self._dense(x, p + "intermediate.dense"))
        out = self._dense(inner, p + "output.dense") + x
        return _layer_norm(
            out, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps
        )


_LAYER_PARTS = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "attention.output.LayerNorm",
    "intermediate.dense",
    "output.dense",
    "output.LayerNorm",
)
