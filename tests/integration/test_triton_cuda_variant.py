"""The cuda variant of spam_text (PyTorch in Triton's python backend) through a REAL tritonserver.

There is no GPU here, so the launcher puts its instance on the CPU (`instance_kind` auto), where the same
model.py runs the build's `torch/` weights in fp32: what is checked is that this path serves the same model
as the ONNX path (issue #13: within 1e-3), over client-side and server-side tokenization."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import numpy as np
import onnxruntime as ort
import pytest

from modpipe.services.process import free_port
from modpipe.serving.client import SyncTextModelClient, spam_probability
from modpipe.serving.server import TritonServer
from modpipe.settings import Settings
from modpipe.textmodel.tokenize import BatchTokenizer

pytestmark = pytest.mark.integration
AGREEMENT = 1e-3  # the bound between the cuda variant and the ONNX path, on spam probabilities


@pytest.fixture(scope="module")
def cuda_server(tmp_path_factory, model_build):
    if not (model_build.torch_dir / "model.safetensors").exists():
        pytest.fail(f"{model_build.path} has no torch/ weights (built before the cuda variant): rebuild it with "
                    "`modpipe model build --force`", pytrace=False)
    settings = Settings.from_env(state_dir=tmp_path_factory.mktemp("triton-cuda"), triton_url="")
    server = TritonServer(settings, model_build, http_port=free_port(), grpc_port=free_port(),
                          metrics_port=free_port(), variant="cuda", instance_kind="auto")
    server.start(timeout=240)
    pgid = os.getpgid(server.pid)
    yield server
    server.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


@pytest.fixture(scope="module")
def texts(model_build):
    """Held-out texts of every length (the first 24 spam and 24 ham, file order) and the edge cases."""
    rows = model_build.heldout()
    spam = [r["text"] for r in rows if r["label"] in (1, "1", "spam")][:24]
    ham = [r["text"] for r in rows if r["label"] not in (1, "1", "spam")][:24]
    return spam + ham + ["", "a", "😀🎉🔥 win 💰💰💰", "x" * 20_000]


def onnx_fp32_logits(build, ids, mask):
    """The fp32 export in process: the model the torch weights were exported to (the served model.onnx
    may be int8)."""
    path = build.path / "model.fp32.onnx"
    return ort.InferenceSession(str(path if path.exists() else build.onnx)).run(
        ["logits"], {"input_ids": ids, "attention_mask": mask})[0]


def test_cuda_variant_runs_torch_on_the_cpu_here(cuda_server):
    url = f"{cuda_server.http_url}/v2/models/{cuda_server.model_name}/config"
    with urllib.request.urlopen(url, timeout=10) as resp:
        config = json.loads(resp.read())
    assert config["parameters"]["runtime"]["string_value"] == "torch"
    assert [g["kind"] for g in config["instance_group"]] == ["KIND_CPU"]  # no GPU on this machine
    assert cuda_server.info()["variant"] == "cuda"


def test_cuda_variant_agrees_with_the_onnx_path(cuda_server, model_build, texts):
    tok = BatchTokenizer.for_build(model_build)
    ids, mask = tok(texts)
    expected = onnx_fp32_logits(model_build, ids, mask)
    with SyncTextModelClient(cuda_server.grpc_url, timeout_s=120) as client:
        logits = client.logits(ids, mask)
        one_by_one = np.concatenate([client.logits(*tok([t])) for t in texts[:6]])
        ensemble = client.model_probabilities_text(texts)  # server-side tokenization, then spam_text
    assert logits.shape == expected.shape == (len(texts), 2)
    got, want = spam_probability(logits), spam_probability(expected)
    assert np.max(np.abs(got - want)) <= AGREEMENT, np.max(np.abs(got - want))
    assert np.max(np.abs(logits - expected)) <= 1e-2  # logits too, not just the saturated probabilities
    assert np.max(np.abs(spam_probability(one_by_one) - want[:6])) <= AGREEMENT
    assert np.max(np.abs(np.asarray(ensemble) - want)) <= AGREEMENT
    assert ((got >= 0.5) == (want >= 0.5)).all()


def test_bench_model_sweeps_concurrency_against_the_torch_ceiling(cuda_server, model_build, settings_env):
    """`modpipe bench model --url` at any Triton: request size x in-flight grid, PyTorch's in-process ceiling."""
    env = dict(settings_env, MODPIPE_MODEL_DIR=str(model_build.path), TRITON_URL="")
    out = subprocess.run([sys.executable, "-m", "modpipe", "bench", "model", "--json", "--no-progress",
                          "--url", cuda_server.grpc_url, "--texts", "12", "--batch-sizes", "1,4", "--inflight", "1,3",
                          "--ceiling", "torch"], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["url"] == cuda_server.grpc_url and report["ceiling"] == "torch" and report["inflight"] == [1, 3]
    grid = {(r["batch"], r["inflight"], r["padding"]) for r in report["triton"]}
    assert grid == {(b, i, p) for b in (1, 4) for i in (1, 3) for p in ("batch", "fixed")}
    assert {(r["target"], r["device"]) for r in report["ceiling_rows"]} == {("torch", "cpu")}
    assert len(report["ceiling_rows"]) == 4
    for row in report["triton"] + report["ceiling_rows"]:
        assert row["texts_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"]
    # the seed's request shape: one text padded to the window
    seed = [r for r in report["triton"] if r["batch"] == 1 and r["padding"] == "fixed"]
    assert seed and all(r["mean_width"] == model_build.max_seq_len for r in seed)
    assert report["ratios"]["per_batch"]["4"]["triton_vs_ceiling"] > 0
