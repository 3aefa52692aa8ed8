"""The ``bert`` embedder, real: resolved by name from its installed entry point, run on
a tiny BERT model the test writes (random weights, the published file layout), and on
all-MiniLM-L6-v2 when ``NORMANDY_EMBED_BERT_MODEL`` names it."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from normandy_core.contract.embedders import EmbedderError, resolve_embedder

_WORDS = ["[PAD]", "[UNK]", "the", "build", "failed", "nightly", "job", "region", "cat", "sat"]


def _write_model(root: Path, hidden: int = 8, layers: int = 1) -> Path:
    root.mkdir()
    rng = np.random.default_rng(7)
    shapes = {
        "embeddings.word_embeddings.weight": (len(_WORDS), hidden),
        "embeddings.position_embeddings.weight": (16, hidden),
        "embeddings.token_type_embeddings.weight": (2, hidden),
        "embeddings.LayerNorm.weight": (hidden,),
        "embeddings.LayerNorm.bias": (hidden,),
    }
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for part, out, inp in [
            ("attention.self.query", hidden, hidden),
            ("attention.self.key", hidden, hidden),
            ("attention.self.value", hidden, hidden),
            ("attention.output.dense", hidden, hidden),
            ("intermediate.dense", 4 * hidden, hidden),
            ("output.dense", hidden, 4 * hidden),
        ]:
            shapes[f"{p}{part}.weight"], shapes[f"{p}{part}.bias"] = (out, inp), (out,)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[f"{p}{norm}.weight"], shapes[f"{p}{norm}.bias"] = (hidden,), (hidden,)
    header, blobs, at = {}, [], 0
    for name, shape in shapes.items():
        data = rng.standard_normal(shape).astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    head = json.dumps(header).encode()
    (root / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    config = {"model_type": "bert", "hidden_size": hidden, "num_hidden_layers": layers,
              "num_attention_heads": 2, "max_position_embeddings": 16}  # fmt: skip
    (root / "config.json").write_text(json.dumps(config))
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(_WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(root / "tokenizer.json"))
    return root


def test_found_by_name_and_embeds_unit_vectors(tmp_path):
    model = _write_model(tmp_path / "tiny")
    embedder = resolve_embedder("bert", {"path": str(model)})
    a, b, c = embedder.embed(["the build failed", "the build failed", "the cat sat"])
    assert len(a) == 8
    assert np.isclose(np.linalg.norm(a), 1.0, atol=1e-5)
    assert a == b
    assert a != c
    again = resolve_embedder("bert", {"path": str(model)})
    assert again.embed(["the cat sat"])[0] == pytest.approx(c, abs=1e-6)
    assert embedder.key == again.key


def test_wrong_options_are_refused_naming_the_embedder(tmp_path):
    with pytest.raises(EmbedderError, match=r"embedder 'bert' .*normandy-embed-bert.*colour"):
        resolve_embedder("bert", {"path": str(tmp_path), "colour": "red"})
    with pytest.raises(EmbedderError, match=r"embedder 'bert'.*holds no config.json"):
        resolve_embedder("bert", {"path": str(tmp_path)})


@pytest.mark.skipif(
    not os.environ.get("NORMANDY_EMBED_BERT_MODEL"), reason="no model directory named"
)
def test_minilm_gives_its_published_similarity():
    embedder = resolve_embedder("bert", {})
    a, b, c = np.array(
        embedder.embed(["A man is eating food.", "A man is eating a piece of bread.", "A cat."])
    )
    assert float(a @ b) == pytest.approx(0.755, abs=0.01)
    assert float(a @ c) < 0.4
