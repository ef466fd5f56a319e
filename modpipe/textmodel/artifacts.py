"""The contract of a text-model build: what files a build directory holds and how to find the served one.

A build directory (``$MODPIPE_CACHE_DIR/models/<key>/``) holds:

- ``model.onnx``          the served model (a copy of the fp32 or int8 export, per ``served.json``)
- ``model.fp32.onnx``     fp32 export; inputs ``input_ids``, ``attention_mask`` (int64 [batch, seq]),
                          output ``logits`` (float32 [batch, 2]; index 1 = spam)
- ``model.int8.onnx``     static int8 variant (calibrated scales, batch-invariant), evaluated beside fp32
- ``tokenizer.json``      the fast (WordPiece, uncased) tokenizer
- ``served.json``         {"version", "precision", "max_seq_len", "tail_tokens", "labels", "profile",
                          "built_at", "threshold", "stack", ...}
- ``lexical_head.json``   the lexical model and the stack's coefficients (lexical.py): the served probability is
                          the transformer's stacked with it (builds without the file serve the transformer's)
- ``metrics.json``        evaluation of the served model and the TF-IDF + linear SVM baseline, per data set
- ``split.json``          how the data was split (seed, sizes, hashes of each split's texts)
- ``heldout.jsonl``       the test-split texts {"text", "label", "dataset"}; drawn on by smoke tests and the demo
- ``MODEL_CARD.md``       sources, licenses, metrics, intended use, known limits
- ``torch/``              the trained weights for PyTorch (``config.json``, ``model.safetensors``): what
                          Triton's cuda variant serves (fp16 on a GPU, fp32 on a CPU)

``$MODPIPE_CACHE_DIR/models/current`` is a symlink to the newest complete full build,
``$MODPIPE_CACHE_DIR/models/current-demo`` to the newest demo build, ``current-gpu`` to the newest gpu-profile build.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from modpipe.settings import Settings

LABELS = ("ham", "spam")
SPAM_INDEX = 1
INPUT_NAMES = ("input_ids", "attention_mask")
OUTPUT_NAME = "logits"
REQUIRED_FILES = ("model.onnx", "tokenizer.json", "served.json")
TORCH_DIR = "torch"
TORCH_FILES = (f"{TORCH_DIR}/config.json", f"{TORCH_DIR}/model.safetensors")


class ModelNotBuilt(FileNotFoundError):
    """No usable model build was found."""


@dataclass(frozen=True)
class ModelBuild:
    path: Path

    @property
    def onnx(self) -> Path:
        return self.path / "model.onnx"

    @property
    def tokenizer(self) -> Path:
        return self.path / "tokenizer.json"

    @property
    def torch_dir(self) -> Path:
        """PyTorch weights (builds before the cuda variant have none: rebuild to serve it)."""
        return self.path / TORCH_DIR

    @property
    def served(self) -> dict:
        return json.loads((self.path / "served.json").read_text())

    @property
    def version(self) -> str:
        return self.served["version"]

    @property
    def max_seq_len(self) -> int:
        return int(self.served.get("max_seq_len", 128))

    @property
    def tail_tokens(self) -> int:
        """Tokens of a long text's end kept in the window (0: only its start; builds before head + tail)."""
        return int(self.served.get("tail_tokens", 0))

    def stack(self):
        """The lexical stack the build serves (`lexical.StackedScorer`), or None for a build without one."""
        return _load_stack(self.path)

    def heldout(self) -> list[dict]:
        """Test-split texts as {"text", "label": "spam"|"ham", "dataset"} (labels stored as 0/1 or names)."""
        path = self.path / "heldout.jsonl"
        if not path.exists():
            return []
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for row in rows:
            if not isinstance(row["label"], str):
                row["label"] = LABELS[int(row["label"])]
        return rows


@functools.lru_cache(maxsize=4)
def _load_stack(path: Path):
    from modpipe.textmodel.lexical import StackedScorer

    return StackedScorer.load(str(path))


def models_root(settings: Settings) -> Path:
    return settings.cache_dir / "models"


def resolve_model(settings: Settings) -> ModelBuild:
    """The build to serve: MODPIPE_MODEL_DIR if set, else the newest full build, else the newest demo build."""
    candidates = [Path(settings.model_dir).expanduser()] if settings.model_dir else [
        models_root(settings) / "current", models_root(settings) / "current-demo"]
    for path in candidates:
        if all((path / f).exists() for f in REQUIRED_FILES):
            return ModelBuild(path.resolve())
    where = ", ".join(str(p) for p in candidates)
    raise ModelNotBuilt(f"no text-model build found at {where}; run `modpipe model build` (or `make model`)")
