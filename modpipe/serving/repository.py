"""Triton model repository: templates in `triton_models/` + a model build -> a runnable repository.

`triton_models/` (in git) holds configs and python-backend code only, in four groups:

- `common/`    spam_tokenizer, spam_postprocess, spam_text_ensemble (the same for every deployment)
- `cpu/`       spam_text as ONNX Runtime inside the python backend (what runs here and in CI)
- `cuda/`      spam_text as PyTorch inside the python backend, fp16 on a GPU: config and card only, laid
               over `cpu/spam_text` (same model.py, `runtime: torch`); runs on nvidia-pytriton's tritonserver
- `tensorrt/`  spam_text as a TensorRT plan, spam_decision on the FIL backend (NVIDIA's Triton container)

A variant is a list of groups; a model directory of a later group is laid over the same model's directory
of an earlier one (its files replace theirs). Weights never enter git. `assemble()` copies a variant's
templates into a directory, links (or copies) the build's weights (`model.onnx`, `torch/`, `tokenizer.json`,
`lexical_head.json` with `modpipe/textmodel/lexical.py` for spam_postprocess) into the version directories, and writes the build's identity into each config's `parameters`
(build_version, build_path, max_seq_len, tail_tokens), which clients read back through Triton's model-config
API.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from modpipe import triton_models
from modpipe.serving import charhead
from modpipe.textmodel import lexical
from modpipe.textmodel.artifacts import TORCH_DIR, TORCH_FILES, ModelBuild

# Env override of where the templates live (e.g. a deployment that ships them elsewhere).
REPO_SRC_ENV = "MODPIPE_TRITON_REPO_SRC"
TEXT_MODEL = "spam_text"
TOKENIZER_MODEL = "spam_tokenizer"
POSTPROCESS_MODEL = "spam_postprocess"
ENSEMBLE_MODEL = "spam_text_ensemble"
DECISION_MODEL = "spam_decision"
VARIANTS = {"cpu": ("common", "cpu"), "cuda": ("common", "cpu", "cuda"), "tensorrt": ("common", "tensorrt")}
# Variants the embedded launcher (nvidia-pytriton's tritonserver: python backend only) can serve.
EMBEDDED_VARIANTS = ("cpu", "cuda")
INSTANCE_KINDS = ("auto", "gpu", "cpu")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "MODEL_CARD.md", ".gitkeep")


class RepositoryError(RuntimeError):
    """The model repository templates are missing or inconsistent."""


def source_dir() -> Path:
    """The templates installed with modpipe (`modpipe.triton_models`), or $MODPIPE_TRITON_REPO_SRC."""
    override = os.environ.get(REPO_SRC_ENV, "")
    path = Path(override).expanduser() if override else triton_models.ROOT
    if not (path / "common").is_dir():
        raise RepositoryError(f"Triton model templates not found at {path}; set {REPO_SRC_ENV} to the "
                              "`triton_models` directory of a modpipe checkout")
    return path


def template_layers(variant: str = "cpu", src: Path | None = None) -> dict[str, list[Path]]:
    """Model name -> its template directories for a variant, earliest group first (later ones laid over)."""
    if variant not in VARIANTS:
        raise RepositoryError(f"unknown variant {variant!r}; expected one of {sorted(VARIANTS)}")
    src = src or source_dir()
    models: dict[str, list[Path]] = {}
    for group in VARIANTS[variant]:
        for config in sorted((src / group).glob("*/config.pbtxt")):
            models.setdefault(config.parent.name, []).append(config.parent)
    return models


def template_models(variant: str = "cpu", src: Path | None = None) -> dict[str, Path]:
    """Model name -> the template directory whose config.pbtxt a variant uses (the last layer)."""
    return {name: layers[-1] for name, layers in template_layers(variant, src).items()}


def gpu_names() -> list[str]:
    """The NVIDIA GPUs nvidia-smi lists ("NVIDIA H100 80GB HBM3", ...); none without it. No torch import on
    the serving path."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return parse_gpu_list(out.stdout)


def parse_gpu_list(text: str) -> list[str]:
    """`nvidia-smi -L` lines ("GPU 0: NVIDIA H200 (UUID: GPU-...)") -> the names."""
    names = []
    for line in text.splitlines():
        head, sep, rest = line.partition(": ")
        if sep and head.startswith("GPU "):
            names.append(rest.split(" (UUID:")[0].strip())
    return names


def gpu_present() -> bool:
    """Whether this machine has an NVIDIA GPU (nvidia-smi lists one)."""
    return bool(gpu_names())


def _instance_kind(config: model_config_pb2.ModelConfig, kind: str) -> None:
    """`cpu` turns GPU instance groups into one CPU instance (a python-backend model then runs on the CPU);
    `auto` does so only when this machine has no GPU; `gpu` keeps the template's groups."""
    if kind not in INSTANCE_KINDS:
        raise RepositoryError(f"unknown instance kind {kind!r}; expected one of {INSTANCE_KINDS}")
    gpu_groups = [g for g in config.instance_group if g.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU]
    if not gpu_groups or kind == "gpu" or (kind == "auto" and gpu_present()):
        return
    del config.instance_group[:]
    config.instance_group.add(count=1, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)


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
             link: bool = True, plan: Path | None = None, decision_model: Path | None = None,
             instance_kind: str = "gpu") -> Path:
    """Write a complete Triton model repository for `build` into `dest` (replaced if it exists).

    `model_name` renames the text model (MODPIPE_TRITON_MODEL); the ensemble follows it.
    `link=False` copies weights instead of symlinking them (a repository to ship elsewhere).
    For the tensorrt variant, `model.onnx` is placed beside the (absent) `model.plan` for trtexec,
    or `plan` is copied in when already built; `decision_model` (a `modpipe decision train` directory)
    provides spam_decision's model.txt. For the cuda variant the build's `torch/` weights go in, and
    `instance_kind` decides where its instances run (`auto`: the GPU if this machine has one, else the CPU;
    an exported repository keeps `gpu`).
    """
    if variant == "cuda" and not all((build.path / f).exists() for f in TORCH_FILES):
        raise RepositoryError(f"build {build.version} at {build.path} has no PyTorch weights ({TORCH_DIR}/): it "
                              "predates the cuda variant; rebuild it with `modpipe model build --force`")
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    served = build.served
    identity = {"build_version": build.version, "build_path": str(build.path),
                "max_seq_len": build.max_seq_len, "tail_tokens": build.tail_tokens,
                "precision": served.get("precision", "")}
    for name, layers in template_layers(variant).items():
        config = read_config(layers[-1] / "config.pbtxt")
        target_name = model_name if name == TEXT_MODEL else name
        out = dest / target_name
        for template in layers:
            shutil.copytree(template, out, ignore=_IGNORE, dirs_exist_ok=True)
        version = out / "1"
        version.mkdir(exist_ok=True)
        config.name = target_name
        _instance_kind(config, instance_kind)
        if name == TEXT_MODEL:
            _set_params(config, **identity)
            runtime = config.parameters["runtime"].string_value if "runtime" in config.parameters else ""
            if config.backend == "python" and runtime == "torch":
                for f in TORCH_FILES:
                    _place(build.path / f, version / f, link)
            elif config.backend == "python":
                _set_params(config, onnx_file="model.onnx")
                _place(build.onnx, version / "model.onnx", link)
            elif config.platform == "tensorrt_plan":
                # The engine is built from the fp32 export, in FP16: the int8 export's scales were
                # calibrated and validated for ONNX Runtime on a CPU, not for TensorRT's kernels.
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
        elif name == POSTPROCESS_MODEL and (build.path / lexical.HEAD_FILE).exists():
            # the build's lexical stack: its head, the normalizer it reads text through, and the one
            # implementation of it (lexical.py has no modpipe imports, so it runs in Triton's stub as it is)
            _set_params(config, build_version=build.version)
            _place(build.path / lexical.HEAD_FILE, version / lexical.HEAD_FILE, link)
            _place(build.tokenizer, version / "tokenizer.json", link)
            _place(Path(lexical.__file__), version / "lexical.py", link=False)
            _place(Path(charhead.__file__), version / "charhead.py", link=False)  # its margins in numpy
        elif config.platform == "ensemble":
            for step in config.ensemble_scheduling.step:
                if step.model_name == TEXT_MODEL:
                    step.model_name = model_name
            _set_params(config, build_version=build.version)
        (out / "config.pbtxt").write_text(text_format.MessageToString(config))
    return dest
