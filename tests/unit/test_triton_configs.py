"""The Triton model repository templates: every config parses with Triton's own ModelConfig protobuf,
the cpu, cuda and tensorrt spam_text share one contract, assembly wires a build in (the cuda variant laid over
the cpu one, on the CPU where there is no GPU), the TensorRT command is right."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from modpipe.serving import charhead, repository, tensorrt
from modpipe.textmodel import lexical
from modpipe.textmodel.artifacts import INPUT_NAMES, OUTPUT_NAME, ModelBuild

ROOT = Path(__file__).resolve().parents[2] / "triton_models"
CONFIGS = sorted(ROOT.rglob("config.pbtxt"))
T = mc.DataType


def parse(path: Path) -> mc.ModelConfig:
    return text_format.Parse(path.read_text(), mc.ModelConfig())


def io(config: mc.ModelConfig) -> tuple:
    return (config.name, config.max_batch_size,
            tuple((i.name, i.data_type, tuple(i.dims)) for i in config.input),
            tuple((o.name, o.data_type, tuple(o.dims)) for o in config.output))


def test_templates_found_from_the_package():
    assert repository.source_dir() == ROOT
    assert len(CONFIGS) == 7


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_config_parses_and_names_its_directory(path):
    config = parse(path)
    assert config.name == path.parent.name
    # 128 rows: a worker's request (MODPIPE_MAX_BATCH 64) merged with one more; a GPU merges more
    assert config.max_batch_size == (512 if path.parent.parent.name == "cuda" else 128)
    assert config.backend in ("python", "fil") or config.platform in ("tensorrt_plan", "ensemble")
    if config.backend == "python":  # the cuda variant's code is cpu/spam_text's, laid under it
        assert (path.parent / "1" / "model.py").exists() or (ROOT / "cpu" / path.parent.name / "1" / "model.py").exists()
    assert (path.parent / "MODEL_CARD.md").exists()


@pytest.mark.parametrize("variant", ["cpu", "cuda", "tensorrt"])
def test_spam_text_contract(variant):
    config = parse(ROOT / variant / "spam_text" / "config.pbtxt")
    assert config.name == "spam_text"
    assert [i.name for i in config.input] == list(INPUT_NAMES)
    assert all(i.data_type == T.TYPE_INT64 and list(i.dims) == [-1] for i in config.input)
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [(OUTPUT_NAME, T.TYPE_FP32, [2])]
    db = config.dynamic_batching
    assert db.preferred_batch_size and max(db.preferred_batch_size) < config.max_batch_size  # no lone-request wait
    assert 0 < db.max_queue_delay_microseconds <= 5000
    assert config.model_warmup
    kind = mc.ModelInstanceGroup.KIND_CPU if variant == "cpu" else mc.ModelInstanceGroup.KIND_GPU
    assert {g.kind for g in config.instance_group} == {kind}


def test_cpu_and_gpu_spam_text_share_name_and_io():
    cpu = parse(ROOT / "cpu" / "spam_text" / "config.pbtxt")
    gpu = parse(ROOT / "tensorrt" / "spam_text" / "config.pbtxt")
    cuda = parse(ROOT / "cuda" / "spam_text" / "config.pbtxt")
    strip = [(n, tuple((a, t, d) for a, t, d in ins), outs) for n, _, ins, outs in [io(cpu), io(gpu), io(cuda)]]
    assert strip[0] == strip[1] == strip[2]
    assert cpu.parameters["runtime"].string_value == "onnxruntime" and cuda.parameters["runtime"].string_value == "torch"
    assert all(i.allow_ragged_batch for i in cuda.input)
    assert cpu.backend == "python" and gpu.platform == "tensorrt_plan"
    # CPU merges requests of different lengths (model.py pads them); TensorRT cannot take ragged input.
    assert all(i.allow_ragged_batch for i in cpu.input)
    assert not any(i.allow_ragged_batch for i in gpu.input)
    assert cpu.parameters["intra_op_threads"].string_value == "2"


def test_tokenizer_and_ensemble():
    tok = parse(ROOT / "common" / "spam_tokenizer" / "config.pbtxt")
    assert [(i.name, i.data_type, list(i.dims)) for i in tok.input] == [("text", T.TYPE_STRING, [1])]
    assert [(o.name, o.data_type, list(o.dims)) for o in tok.output] == \
        [("input_ids", T.TYPE_INT64, [-1]), ("attention_mask", T.TYPE_INT64, [-1]),
         ("normalized", T.TYPE_STRING, [1])]
    ens = parse(ROOT / "common" / "spam_text_ensemble" / "config.pbtxt")
    assert ens.platform == "ensemble"
    assert [s.model_name for s in ens.ensemble_scheduling.step] == \
        ["spam_tokenizer", "spam_text", "spam_postprocess"]
    assert {o.name for o in ens.output} == {"logits", "spam_probability"}
    # every tensor a step consumes is produced by an earlier step or is an ensemble input
    available = {i.name for i in ens.input}
    for step in ens.ensemble_scheduling.step:
        assert set(step.input_map.values()) <= available, step.model_name
        available |= set(step.output_map.values())
    assert {o.name for o in ens.output} <= available
    # the stack reads the text spam_tokenizer normalised: the normaliser runs once a text
    assert dict(ens.ensemble_scheduling.step[2].input_map)["normalized"] == \
        dict(ens.ensemble_scheduling.step[0].output_map)["normalized"]


@pytest.fixture
def fake_build(tmp_path) -> ModelBuild:
    """A build directory with the contract's files (contents irrelevant to assembly)."""
    build = tmp_path / "build"
    build.mkdir()
    (build / "model.onnx").write_bytes(b"onnx")
    (build / "tokenizer.json").write_text("{}")
    (build / "served.json").write_text(json.dumps({"version": "v-test", "precision": "int8", "max_seq_len": 96,
                                                       "tail_tokens": 32}))
    return ModelBuild(build)


def test_assemble_cpu_links_weights_and_writes_identity(tmp_path, fake_build):
    repo = repository.assemble(tmp_path / "repo", fake_build, variant="cpu")
    assert sorted(p.name for p in repo.iterdir()) == \
        ["spam_postprocess", "spam_text", "spam_text_ensemble", "spam_tokenizer"]
    assert (repo / "spam_text" / "1" / "model.onnx").resolve() == fake_build.onnx.resolve()
    assert (repo / "spam_tokenizer" / "1" / "tokenizer.json").read_text() == "{}"
    assert (repo / "spam_text_ensemble" / "1").is_dir()
    assert not list(repo.rglob("MODEL_CARD.md")) and not list(repo.rglob("__pycache__"))
    params = parse(repo / "spam_text" / "config.pbtxt").parameters
    assert params["build_version"].string_value == "v-test"
    assert params["max_seq_len"].string_value == "96"
    tokenizer_params = parse(repo / "spam_tokenizer" / "config.pbtxt").parameters
    assert tokenizer_params["max_seq_len"].string_value == "96" and tokenizer_params["tail_tokens"].string_value == "32"


def test_assemble_gives_spam_postprocess_the_builds_lexical_stack(tmp_path, fake_build):
    """With a lexical_head.json the postprocess step gets it, the tokenizer whose normalizer it reads text
    through, and lexical.py itself (copied: the repository may be shipped); without one, nothing."""
    plain = repository.assemble(tmp_path / "plain", fake_build, variant="cpu")
    assert not (plain / "spam_postprocess" / "1" / "lexical.py").exists()
    (fake_build.path / "lexical_head.json").write_text("{}")
    repo = repository.assemble(tmp_path / "repo", fake_build, variant="tensorrt", link=False)
    version = repo / "spam_postprocess" / "1"
    assert (version / "lexical_head.json").read_text() == "{}" and (version / "tokenizer.json").read_text() == "{}"
    assert (version / "lexical.py").read_text() == Path(lexical.__file__).read_text()
    assert (version / "charhead.py").read_text() == Path(charhead.__file__).read_text()  # its numpy margins
    assert not (version / "lexical.py").is_symlink()
    inputs = {i.name: i.optional for i in parse(repo / "spam_postprocess" / "config.pbtxt").input}
    assert inputs == {"logits": False, "text": False, "normalized": True}  # text only: normalised there


def test_assemble_renames_text_model_and_ensemble_follows(tmp_path, fake_build):
    repo = repository.assemble(tmp_path / "repo", fake_build, model_name="spam_text_v2")
    assert parse(repo / "spam_text_v2" / "config.pbtxt").name == "spam_text_v2"
    steps = parse(repo / "spam_text_ensemble" / "config.pbtxt").ensemble_scheduling.step
    assert "spam_text_v2" in [s.model_name for s in steps]


def test_assemble_gpu_copies_onnx_for_trtexec(tmp_path, fake_build):
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"plan")
    repo = repository.assemble(tmp_path / "repo", fake_build, variant="tensorrt", link=False, plan=plan)
    version = repo / "spam_text" / "1"
    assert not (version / "model.onnx").is_symlink() and (version / "model.onnx").read_bytes() == b"onnx"
    assert (version / "model.plan").read_bytes() == b"plan"
    assert parse(repo / "spam_text" / "config.pbtxt").platform == "tensorrt_plan"
    assert (repo / "spam_tokenizer" / "1" / "model.py").exists()


def _with_torch_weights(build: ModelBuild) -> ModelBuild:
    (build.torch_dir).mkdir()
    (build.torch_dir / "config.json").write_text("{}")
    (build.torch_dir / "model.safetensors").write_bytes(b"weights")
    return build


def test_assemble_cuda_lays_its_config_over_the_cpu_code_and_links_torch_weights(tmp_path, fake_build):
    repo = repository.assemble(tmp_path / "repo", _with_torch_weights(fake_build), variant="cuda",
                               instance_kind="gpu")
    version = repo / "spam_text" / "1"
    assert (version / "model.py").read_text() == (ROOT / "cpu" / "spam_text" / "1" / "model.py").read_text()
    assert (version / "torch" / "model.safetensors").read_bytes() == b"weights"
    assert not (version / "model.onnx").exists()
    config = parse(repo / "spam_text" / "config.pbtxt")
    assert config.parameters["runtime"].string_value == "torch" and config.max_batch_size == 512
    assert config.parameters["max_seq_len"].string_value == "96"
    assert [(g.kind, g.count) for g in config.instance_group] == [(mc.ModelInstanceGroup.KIND_GPU, 2)]
    assert "spam_decision" not in [p.name for p in repo.iterdir()]


def test_cuda_instances_move_to_the_cpu_where_there_is_no_gpu(tmp_path, fake_build, monkeypatch):
    build = _with_torch_weights(fake_build)
    on_cpu = repository.assemble(tmp_path / "cpu", build, variant="cuda", instance_kind="cpu")
    assert [(g.kind, g.count) for g in parse(on_cpu / "spam_text" / "config.pbtxt").instance_group] == \
        [(mc.ModelInstanceGroup.KIND_CPU, 1)]
    monkeypatch.setattr(repository, "gpu_present", lambda: False)
    auto = repository.assemble(tmp_path / "auto", build, variant="cuda", instance_kind="auto")
    assert parse(auto / "spam_text" / "config.pbtxt").instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    monkeypatch.setattr(repository, "gpu_present", lambda: True)
    auto = repository.assemble(tmp_path / "auto", build, variant="cuda", instance_kind="auto")
    assert parse(auto / "spam_text" / "config.pbtxt").instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU
    # the cpu variant's groups are CPU ones already: untouched by any kind
    cpu = repository.assemble(tmp_path / "plain", build, variant="cpu", instance_kind="cpu")
    assert parse(cpu / "spam_text" / "config.pbtxt").instance_group == \
        parse(ROOT / "cpu" / "spam_text" / "config.pbtxt").instance_group


def test_cuda_variant_needs_a_build_with_torch_weights(tmp_path, fake_build):
    with pytest.raises(repository.RepositoryError, match="no PyTorch weights"):
        repository.assemble(tmp_path / "repo", fake_build, variant="cuda")
    with pytest.raises(repository.RepositoryError, match="unknown variant"):
        repository.assemble(tmp_path / "repo", fake_build, variant="gpu")


def test_trtexec_command():
    argv = tensorrt.trtexec_command("in.onnx", "out.plan")
    assert argv[:3] == ["trtexec", "--onnx=in.onnx", "--saveEngine=out.plan"]
    assert "--minShapes=input_ids:1x1,attention_mask:1x1" in argv
    assert "--optShapes=input_ids:64x64,attention_mask:64x64" in argv
    assert "--maxShapes=input_ids:128x128,attention_mask:128x128" in argv
    assert "--fp16" in argv
    assert "--fp16" not in tensorrt.trtexec_command("a", "b", fp16=False)
    with pytest.raises(ValueError):
        tensorrt.trtexec_command("a", "b", opt_batch=256)


def test_trt_build_script_is_valid_bash_and_matches_the_config():
    script = tensorrt.build_script()
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    gpu = parse(ROOT / "tensorrt" / "spam_text" / "config.pbtxt")
    assert f"input_ids:{gpu.max_batch_size}x128" in script
    assert "spam_text/1/model.plan" in script and "--fp16" in script
    assert tensorrt.TRITON_RELEASE in script


def test_fil_decision_config_matches_the_feature_list(tmp_path, fake_build):
    from modpipe.decision.model import DECISION_FEATURES

    config = parse(ROOT / "tensorrt" / "spam_decision" / "config.pbtxt")
    assert config.backend == "fil" and config.parameters["model_type"].string_value == "lightgbm"
    assert config.parameters["predict_proba"].string_value == "true"
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("input__0", T.TYPE_FP32, [len(DECISION_FEATURES)])]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [("output__0", T.TYPE_FP32, [2])]
    assert "spam_decision" not in repository.template_models("cpu")  # the local stack decides in process
    trained = tmp_path / "decision"
    trained.mkdir()
    (trained / "model.txt").write_text("tree\n")
    repo = repository.assemble(tmp_path / "repo", fake_build, variant="tensorrt", link=False, decision_model=trained)
    assert (repo / "spam_decision" / "1" / "model.txt").read_text() == "tree\n"


def test_gpu_names_from_nvidia_smi_list():
    listing = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0f3e9a41-1b2c-4d5e-8f90-123456789abc)\n"
               "GPU 1: NVIDIA H200 (UUID: GPU-aa)\n")
    assert repository.parse_gpu_list(listing) == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert repository.parse_gpu_list("No devices were found\n") == []
