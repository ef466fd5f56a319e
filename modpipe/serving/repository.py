"""Triton model repository: templates in `triton_models/` + a model build -> a runnable repository.

`triton_models/` (in git) holds configs and python-backend code only, in three groups:

- `common/`  spam_tokenizer, spam_postprocess, spam_text_ensemble (the same for both deployments)
- `cpu/`     spam_text as ONNX Runtime inside the python backend (what runs here)
- `gpu/`     spam_text as a TensorRT plan, spam_decision on the FIL backend (NVIDIA's Triton container)

Weights never enter git. `assemble()` copies a variant's templates into a directory, links (or
copies) the build's `model.onnx` / `tokenizer.json` into the version directories, and writes the
build's identity into each config's `parameters` (build_version, build_path, max_seq_len, tail_tokens), which
clients read back through Triton's model-config API.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

import modpipe
from modpipe.textmodel.artifacts import ModelBuild

# Env override of where the templates live (e.g. a deployment that ships them elsewhere).
REPO_SRC_ENV = "MODPIPE_TRITON_REPO_SRC"
TEXT_MODEL = "spam_text"
TOKENIZER_MODEL = "spam_tokenizer"
POSTPROCESS_MODEL = "spam_postprocess"
ENSEMBLE_MODEL = "spam_text_ensemble"
DECISION_MODEL = "spam_decision"
VARIANTS = {"cpu": ("common", "cpu"), "gpu": ("common", "gpu")}
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "MODEL_CARD.md", ".gitkeep")


class RepositoryError(RuntimeError):
    """The model repository templates are missing or inconsistent."""


def source_dir() -> Path:
    """`triton_models/` of the source checkout (works for editable installs), or $MODPIPE_TRITON_REPO_SRC."""
    override = os.environ.get(REPO_SRC_ENV, "")
    path = Path(override).expanduser() if override else Path(modpipe.__file__).resolve().parents[1] / "triton_models"
    if not (path / "common").is_dir():
        raise RepositoryError(f"Triton model templates not found at {path}; set {REPO_SRC_ENV} to the "
                              "`triton_models` directory of a modpipe checkout")
    return path


def template_models(variant: str = "cpu", src: Path | None = None) -> dict[str, Path]:
    """Model name -> template directory for a variant (a later group overrides an earlier one)."""
    if variant not in VARIANTS:
        raise RepositoryError(f"unknown variant {variant!r}; expected one of {sorted(VARIANTS)}")
    src = src or source_dir()
    models: dict[str, Path] = {}
    for group in VARIANTS[variant]:
        for config in sorted((src / group).glob("*/config.pbtxt")):
            models[config.parent.name] = config.parent
    return models


def read_config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(Path(path).read_text(), model_config_pb2.ModelConfig())


def _set_params(config: model_config_pb2.ModelConfig, **params: object) -> None:
    for key, value in params.items():
        config.parameters[key].string_value = str(value)


def _place(src: Path, dest: Path, link: bool) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink() or dest.exists():
        dest.unlink()
    if link:
        try:
            dest.symlink_to(src.resolve())
            return
        except OSError:
            pass
    shutil.copy2(src, dest)


def assemble(dest: Path, build: ModelBuild, variant: str = "cpu", model_name: str = TEXT_MODEL,
             link: bool = True, plan: Path | None = None, decision_model: Path | None = None) -> Path:
    """Write a complete Triton model repository for `build` into `dest` (replaced if it exists).

    `model_name` renames the text model (MODPIPE_TRITON_MODEL); the ensemble follows it.
    `link=False` copies weights instead of symlinking them (a repository to ship elsewhere).
    For the gpu variant, `model.onnx` is placed beside the (absent) `model.plan` for trtexec,
    or `plan` is copied in when already built; `decision_model` (a `modpipe decision train` directory)
    provides spam_decision's model.txt.
    """
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    served = build.served
    identity = {"build_version": build.version, "build_path": str(build.path),
                "max_seq_len": build.max_seq_len, "tail_tokens": build.tail_tokens,
                "precision": served.get("precision", "")}
    for name, template in template_models(variant).items():
        config = read_config(template / "config.pbtxt")
        target_name = model_name if name == TEXT_MODEL else name
        out = dest / target_name
        shutil.copytree(template, out, ignore=_IGNORE)
        version = out / "1"
        version.mkdir(exist_ok=True)
        config.name = target_name
        if name == TEXT_MODEL:
            _set_params(config, **identity)
            if config.backend == "python":
                _set_params(config, onnx_file="model.onnx")
                _place(build.onnx, version / "model.onnx", link)
            elif config.platform == "tensorrt_plan":
                # TensorRT cannot parse ONNX Runtime's dynamic-quantization ops (MatMulInteger,
                # DynamicQuantizeLinear): the engine is built from the fp32 export, in FP16.
                fp32 = build.path / "model.fp32.onnx"
                _place(fp32 if fp32.exists() else build.onnx, version / "model.onnx", link)
                if plan is not None:
                    _place(Path(plan), version / "model.plan", link=False)
        elif name == DECISION_MODEL:
            if decision_model is not None:
                _place(Path(decision_model) / "model.txt", version / "model.txt", link)
        elif name == TOKENIZER_MODEL:
            _set_params(config, **identity)
            _place(build.tokenizer, version / "tokenizer.json", link)
        elif config.platform == "ensemble":
            for step in config.ensemble_scheduling.step:
                if step.model_name == TEXT_MODEL:
                    step.model_name = model_name
            _set_params(config, build_version=build.version)
        (out / "config.pbtxt").write_text(text_format.MessageToString(config))
    return dest
