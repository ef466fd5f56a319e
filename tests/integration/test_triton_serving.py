"""The text model served by a REAL tritonserver (started by modpipe.serving) and the real model build."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from modpipe.services.process import ServiceError, free_port
from modpipe.serving.client import SyncTextModelClient, TextModelClient, spam_probability
from modpipe.serving.server import TritonServer, triton_endpoint
from modpipe.settings import Settings
from modpipe.textmodel.artifacts import ModelBuild
from modpipe.textmodel.tokenize import BatchTokenizer

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[2]
EDGE_TEXTS = ["", "x" * 100_000, "免费赢取iPhone！立即点击链接领取奖品", "مرحبا، هل نلتقي غدا؟", "😀🎉🔥 win 💰💰💰",
              "   \n\t ", "a"]


@pytest.fixture(scope="module")
def tok(model_build):
    return BatchTokenizer.for_build(model_build)


@pytest.fixture(scope="module")
def client(triton_url):
    # generous timeout: a 128x128 batch on 2 busy cores can take seconds, and a timed-out request keeps
    # running in the server (and then gets merged with the next test's requests)
    with SyncTextModelClient(triton_url, timeout_s=120) as c:
        yield c


def is_spam(label) -> bool:
    """heldout.jsonl labels are 1/0 (or "spam"/"ham")."""
    return label in (1, "1", "spam", True)


@pytest.fixture(scope="module")
def labelled(model_build):
    """The first 20 spam and 20 ham texts of the build's held-out test split (file order, no cherry-picking)."""
    rows = model_build.heldout()
    spam = [r["text"] for r in rows if is_spam(r["label"])][:20]
    ham = [r["text"] for r in rows if not is_spam(r["label"])][:20]
    assert len(spam) == 20 and len(ham) == 20, "heldout.jsonl needs >= 20 spam and 20 ham texts"
    return spam, ham


def batch_tolerance(build) -> float:
    """How far a text's probability may move with what it is batched with.

    fp32: float noise only. int8 is static (scales fixed at build time, export.quantize_int8), so a text's
    score must not depend on its batch neighbours either: the build serves it only within
    BATCH_INVARIANCE_TOLERANCE, and the dynamic batcher merges concurrent requests, so a looser bound here
    would let a verdict near a threshold flip with traffic."""
    from modpipe.textmodel.build import BATCH_INVARIANCE_TOLERANCE

    return 1e-5 if build.served.get("precision", "fp32") == "fp32" else BATCH_INVARIANCE_TOLERANCE


def modpipe(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modpipe", *args], env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_heldout_spam_and_ham_are_classified_right(client, tok, labelled, model_build):
    spam, ham = labelled
    probs = client.spam_probabilities(*tok(spam + ham))
    right = int((probs[:20] >= 0.5).sum() + (probs[20:] < 0.5).sum())
    detail = f"{right}/40 right; spam {np.round(probs[:20], 3)}, ham {np.round(probs[20:], 3)}"
    if model_build.served.get("demo_quality"):
        # A demo build (minutes of training, `make model-demo`) ranks but is not calibrated at 0.5: check
        # that Triton serves a model that separates the classes (pairwise ranking, i.e. AUC on these 40).
        auc = float(np.mean([s > h for s in probs[:20] for h in probs[20:]]))
        assert auc >= 0.8, f"demo build: AUC {auc:.2f} on 20+20 held-out texts; {detail}"
    else:
        assert right >= 36, detail


def test_batch_equals_single(client, tok, labelled, model_build):
    texts = labelled[0][:8] + labelled[1][:8] + EDGE_TEXTS
    batch = client.spam_probabilities(*tok(texts))
    single = np.array([client.spam_probabilities(*tok([t]))[0] for t in texts])
    np.testing.assert_allclose(batch, single, atol=batch_tolerance(model_build))


def test_triton_matches_in_process_onnxruntime(client, tok, labelled, model_build):
    ids, mask = tok(labelled[0][:10] + labelled[1][:10])
    expected = ort.InferenceSession(str(model_build.onnx)).run(["logits"], {"input_ids": ids,
                                                                              "attention_mask": mask})[0]
    np.testing.assert_allclose(client.logits(ids, mask), expected, atol=1e-4)


def test_fixed_padding_gives_the_same_probabilities(client, tok, labelled):
    texts = labelled[0][:5] + labelled[1][:5]
    np.testing.assert_allclose(client.spam_probabilities(*tok(texts, pad_to_max=True)),
                               client.spam_probabilities(*tok(texts)), atol=1e-5)


def test_edge_texts_are_handled(client, tok):
    for probs in (client.spam_probabilities(*tok(EDGE_TEXTS)), client.spam_probabilities_text(EDGE_TEXTS)):
        assert probs.shape == (len(EDGE_TEXTS),)
        assert np.all(np.isfinite(probs)) and np.all((probs >= 0) & (probs <= 1))


def test_empty_batch_and_big_batch(client, tok, labelled, model_build):
    empty = np.zeros((0, 4), dtype=np.int64)
    assert client.spam_probabilities(empty, empty).shape == (0,)
    assert client.spam_probabilities_text([]).shape == (0,)
    texts = (labelled[0] + labelled[1]) * 5  # 200 rows: above max_batch_size, sent as two requests
    probs = client.spam_probabilities(*tok(texts))
    np.testing.assert_allclose(probs[:40], probs[40:80], atol=batch_tolerance(model_build))


def test_ensemble_matches_client_side_tokenization(client, tok, labelled, model_build):
    texts = labelled[0][:10] + labelled[1][:10] + EDGE_TEXTS
    np.testing.assert_allclose(client.model_probabilities_text(texts), client.spam_probabilities(*tok(texts)),
                               atol=batch_tolerance(model_build))


def test_ensemble_serves_the_builds_lexical_stack(client, tok, labelled, model_build):
    """spam_postprocess applies the build's lexical stack to the text (lexical.py copied beside it): the
    ensemble's probability is the worker's (the transformer's from spam_text, stacked on the client), and it
    is not the transformer's alone."""
    stack = model_build.stack()
    assert stack is not None, f"build {model_build.version} has no {model_build.path / 'lexical_head.json'}"
    texts = labelled[0][:10] + labelled[1][:10] + EDGE_TEXTS
    model = client.spam_probabilities(*tok(texts))
    served = client.spam_probabilities_text(texts)
    np.testing.assert_allclose(served, stack.spam_proba(texts, model), atol=max(batch_tolerance(model_build), 1e-5))
    assert np.max(np.abs(served - model)) > 0.01, "the ensemble served the transformer's probability alone"


def test_server_side_tokenizer_applies_the_builds_normalizer(client, tok, model_build):
    """The client and spam_tokenizer both read the build's tokenizer.json: in a full build it cuts runs of one
    punctuation character to three, so the ensemble scores a text with long runs as the client scores it cut."""
    if "Replace" not in json.dumps(json.loads(model_build.tokenizer.read_text())["normalizer"]):
        pytest.skip("this build's tokenizer has no punctuation-run rules (demo profile)")
    long, cut = "WIN!!!!!!!!!!!! " + "=" * 60 + " claim your prize....... now", "WIN!!! === claim your prize... now"
    np.testing.assert_array_equal(tok([long])[0], tok([cut])[0])
    np.testing.assert_allclose(client.model_probabilities_text([long]), client.spam_probabilities(*tok([cut])),
                               atol=batch_tolerance(model_build))


def test_server_side_tokenizer_folds_hostile_text(client, tok, model_build):
    """Invisible characters, fullwidth / mathematical / Cyrillic look-alikes and letter-spaced words: the client
    and spam_tokenizer (the same tokenizer.json) read the hostile text as its clean form, so the ensemble
    scores it exactly as the client scores the clean text."""
    hostile = "ｗｉｎ a 𝐟𝐫𝐞𝐞 iPhonе: C L A I M c\u200ba\u200bs\u200bh now"  # Cyrillic е in iPhonе
    clean = "win a free iPhone: CLAIM cash now"
    np.testing.assert_array_equal(tok([hostile])[0], tok([clean])[0])
    np.testing.assert_allclose(client.model_probabilities_text([hostile, clean]),
                               client.spam_probabilities(*tok([clean, clean])), atol=batch_tolerance(model_build))


def test_server_side_tokenizer_keeps_the_builds_head_and_tail(client, tok, model_build):
    """Texts longer than the window: spam_tokenizer keeps the same head and tail tokens as the client, so the
    ensemble scores them as the client does; with a tail, a change at a long text's end reaches the model."""
    body = "Hello all, the meeting notes from last week are attached below. " * 40
    texts = [body + "Thanks, see you on Monday. Bob", body + "To be removed from our list click here and reply REMOVE"]
    ids, mask = tok(texts)
    assert ids.shape[1] == model_build.max_seq_len
    served = client.model_probabilities_text(texts)
    np.testing.assert_allclose(served, client.spam_probabilities(ids, mask), atol=batch_tolerance(model_build))
    ends_differ = not np.array_equal(ids[0], ids[1])
    assert ends_differ == (model_build.tail_tokens > 0)
    if ends_differ:
        assert served[0] != served[1]


def test_model_versions_name_the_build(client, model_build):
    assert client.model_versions() == {"model": "spam_text", "triton_version": "1",
                                       "build_version": model_build.version}


def test_concurrent_requests_of_different_lengths_are_merged(triton_url, tok, labelled, model_build):
    """The dynamic batcher merges requests of different sequence lengths (allow_ragged_batch) and model.py
    pads them together: results must equal each request alone, in fewer executions than requests."""
    texts = labelled[0] + labelled[1]
    batches = [tok(texts[4 * k:4 * k + n]) for k, n in enumerate([1, 2, 3, 4, 1, 2, 3, 4, 2, 3])]
    session = ort.InferenceSession(str(model_build.onnx))
    expected = [spam_probability(session.run(["logits"], {"input_ids": i, "attention_mask": m})[0])
                for i, m in batches]

    async def run():
        async with TextModelClient(triton_url, timeout_s=120) as c:
            before = (await c.client.get_inference_statistics("spam_text", as_json=True))["model_stats"][0]
            got = []
            for _ in range(3):
                got = await asyncio.gather(*(c.spam_probabilities(i, m) for i, m in batches))
            after = (await c.client.get_inference_statistics("spam_text", as_json=True))["model_stats"][0]
            return got, int(after["execution_count"]) - int(before.get("execution_count", 0))

    got, executions = asyncio.run(run())
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, atol=max(batch_tolerance(model_build), 1e-5))
    assert executions < 3 * len(batches), "requests of different lengths were never batched together"


def test_classify_cli_json(triton_env):
    texts = ["WINNER!! Claim your free prize now, call 09061701461", "ok see you at lunch", "", "你好 😀"]
    out = modpipe("classify", "--json", *texts, env=triton_env)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [d["text"] for d in lines] == texts
    for d in lines:
        assert set(d) == {"text", "spam_probability", "label"}
        assert 0 <= d["spam_probability"] <= 1
        assert d["label"] == ("spam" if d["spam_probability"] >= 0.5 else "ham")
    ens = modpipe("classify", "--json", "--ensemble", *texts, env=triton_env)
    assert ens.returncode == 0, ens.stderr
    for a, b in zip(lines, map(json.loads, ens.stdout.splitlines()), strict=True):
        assert abs(a["spam_probability"] - b["spam_probability"]) < 1e-5


def _pids_mentioning(needle: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def test_classify_starts_and_stops_its_own_server(settings_env, model_build, tmp_path):
    env = dict(settings_env, MODPIPE_STATE_DIR=str(tmp_path / "state"), MODPIPE_MODEL_DIR=str(model_build.path),
               TRITON_URL="", TRITON_HTTP_PORT=str(free_port()), TRITON_GRPC_PORT=str(free_port()),
               TRITON_METRICS_PORT=str(free_port()))
    out = modpipe("classify", "--json", "hello there", env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["text"] == "hello there"
    assert "tritonserver" in out.stderr  # it logged where the server log went
    assert not _pids_mentioning(str(tmp_path / "state")), "tritonserver or a stub outlived `modpipe classify`"


def test_bench_model_json_small(triton_env):
    out = modpipe("bench", "model", "--json", "--texts", "16", "--batch-sizes", "1,8", "--no-progress",
                  env=triton_env)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["texts"] == 16 and report["batch_sizes"] == [1, 8] and report["ceiling"] == "ort"
    assert len(report["triton"]) == 4 and len(report["ceiling_rows"]) == 4
    for row in report["triton"] + report["ceiling_rows"]:
        assert row["texts_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["padding"] in ("batch", "fixed")
        limit = report["max_seq_len"]
        assert row["mean_width"] == limit if row["padding"] == "fixed" else row["mean_width"] <= limit
    assert report["ratios"]["per_batch"]["8"]["triton_vs_ceiling"] > 0
    assert report["model"]["model"] == "spam_text"
    stack = report["stack"]  # the build's lexical stack, timed on the same texts
    assert stack["texts"] == 16 and stack["texts_per_s"] > 0 and stack["share_of_ceiling_time"] > 0
    cpu = stack["client_cpu_us_per_text"]  # the worker's tokenize + stack, the normaliser run twice and once
    assert cpu["separate"] > 0 and cpu["shared"] > 0
    assert stack["shared_over_separate"] == round(cpu["shared"] / cpu["separate"], 3)


def test_server_stops_with_no_orphan(model_build, tmp_path, triton_server):
    settings = Settings.from_env(state_dir=tmp_path / "state", triton_url="")
    server = TritonServer(settings, model_build, http_port=free_port(), grpc_port=free_port(),
                          metrics_port=free_port()).start()
    pgid = os.getpgid(server.pid)
    group = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _pgid(p) == pgid]
    assert len(group) >= 2, "expected tritonserver plus its python backend stubs in one process group"
    assert server.ready()
    server.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert not [p for p in group if Path(f"/proc/{p}").exists()]
    assert not _pids_mentioning(str(tmp_path / "state"))
    # a second server on a port in use fails fast and clearly
    busy = TritonServer(settings, model_build, http_port=triton_server.http_port, grpc_port=free_port(),
                        metrics_port=free_port())
    with pytest.raises(ServiceError, match="already in use"):
        busy.start()


def _pgid(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def test_endpoint_uses_triton_url_without_starting(tmp_path):
    settings = Settings.from_env(state_dir=tmp_path / "state", triton_url="example.invalid:8001")
    with triton_endpoint(settings) as url:
        assert url == "example.invalid:8001"
    assert not (tmp_path / "state").exists()


def test_broken_build_fails_fast_with_the_reason_and_no_orphan(model_build, tmp_path):
    broken = tmp_path / "broken-build"
    broken.mkdir()
    for name in ("tokenizer.json", "served.json"):
        (broken / name).write_bytes((model_build.path / name).read_bytes())
    (broken / "model.onnx").write_bytes(b"not an onnx model")
    settings = Settings.from_env(state_dir=tmp_path / "state", triton_url="")
    server = TritonServer(settings, ModelBuild(broken), http_port=free_port(), grpc_port=free_port(),
                          metrics_port=free_port())
    with pytest.raises(ServiceError, match="failed to load 'spam_text'"):
        server.start(timeout=120)
    assert not _pids_mentioning(str(tmp_path / "state"))
