"""normandy-embed-bert: the ``bert`` embedder, recall by meaning with a BERT-family
sentence-transformers model on disk, in NumPy on the CPU (no PyTorch, no network).

Select it in the archive's settings: ``embedder = "bert"`` and
``embedder_options = {path = "/models/all-MiniLM-L6-v2"}`` under
``[tool.normandy.archive]`` (docs/plugins/embed-bert.md).
"""

from __future__ import annotations

from normandy_embed_bert.embedder import ENV_MODEL, BertEmbedder, BertOptions, make_embedder
from normandy_embed_bert.encoder import BertConfig, BertEncoder
from normandy_embed_bert.weights import WeightsError, read_safetensors

__all__ = [
    "ENV_MODEL",
    "BertConfig",
    "BertEmbedder",
    "BertEncoder",
    "BertOptions",
    "WeightsError",
    "make_embedder",
    "read_safetensors",
]
