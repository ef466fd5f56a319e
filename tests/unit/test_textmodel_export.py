"""ONNX export of a tiny DistilBERT: contract (names, dtypes, dynamic axes), PyTorch match, int8, metrics."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

from modpipe.textmodel import evaluate, export, train  # noqa: E402
from modpipe.textmodel.data import Example  # noqa: E402
from modpipe.textmodel.tokenize import BatchTokenizer  # noqa: E402


def tiny_model(d, words: str, layers: int = 2):
    """A WordPiece tokenizer over `words` (saved as d/tokenizer.json) and a random tiny DistilBERT exported to
    d/model.fp32.onnx: (model, onnx path, tokenizer path)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words.split()
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2),
                                                                                              ("[SEP]", 3)])
    tok.save(str(d / "tokenizer.json"))
    torch.manual_seed(0)
    cfg = DistilBertConfig(vocab_size=len(vocab), dim=32, n_layers=layers, n_heads=4, hidden_dim=64,
                           max_position_embeddings=64, num_labels=2)
    model = DistilBertForSequenceClassification(cfg).eval()
    return model, export.export_onnx(model, d / "model.fp32.onnx"), d / "tokenizer.json"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    model, path, tok_path = tiny_model(d, "free win prize call now hello see you at the lunch")
    return model, path, tok_path, d


TEXTS = ["free prize call now", "hello see you at the lunch", "win", "unknownword hello free " * 5]


def test_onnx_contract(tiny):
    import onnx

    _, path, _, _ = tiny
    m = onnx.load(str(path))
    assert [i.name for i in m.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in m.graph.output] == ["logits"]
    for i in m.graph.input:
        assert i.type.tensor_type.elem_type == onnx.TensorProto.INT64
        dims = i.type.tensor_type.shape.dim
        assert dims[0].dim_param and dims[1].dim_param  # dynamic batch and sequence
    out = m.graph.output[0].type.tensor_type
    assert out.elem_type == onnx.TensorProto.FLOAT and out.shape.dim[1].dim_value == 2
    assert max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")) >= 14


def test_onnx_matches_torch_and_int8_runs(tiny):
    model, path, tok, d = tiny
    window = BatchTokenizer(tok, 16)
    check = export.compare_with_torch(model, path, window, TEXTS, batch_size=3)
    assert check["ok"] and check["max_abs_diff"] <= 1e-4
    q = export.quantize_int8(path, d / "model.int8.onnx", window, TEXTS * 3)
    prob = evaluate.onnx_spam_proba(q, window, TEXTS, batch_size=2)
    assert prob.shape == (4,) and np.all((prob >= 0) & (prob <= 1))
    # static scales: a text's probability does not depend on what it is batched with
    alone = evaluate.onnx_spam_proba(q, window, TEXTS, batch_size=1)
    together = evaluate.onnx_spam_proba(q, window, TEXTS, batch_size=len(TEXTS))
    assert np.max(np.abs(alone - together)) <= 1e-6
    prob32 = evaluate.onnx_spam_proba(path, window, TEXTS, batch_size=2)
    ref = train.predict_proba(model, window.ids(TEXTS))
    assert np.allclose(prob32, ref, atol=1e-5)


def test_classification_metrics():
    m = evaluate.classification_metrics([0, 0, 1, 1, 1], [0.1, 0.7, 0.8, 0.4, 0.9], 0.5)
    assert m["confusion"] == {"tn": 1, "fp": 1, "fn": 1, "tp": 2}
    assert m["precision"] == pytest.approx(2 / 3, abs=1e-4) and m["recall"] == pytest.approx(2 / 3, abs=1e-4)
    assert m["f1"] == pytest.approx(2 / 3, abs=1e-4) and m["accuracy"] == 0.6
    assert m["roc_auc"] == pytest.approx(5 / 6, abs=1e-4)
    json.dumps(m)


def test_baseline_and_table():
    tr = [Example(t, lab, "sms") for t, lab in [("win a free prize now", 1), ("free cash call now", 1),
                                                ("see you at lunch", 0), ("hello how are you", 0)] * 3]
    b = evaluate.Baseline().fit(tr)
    assert list(b.decision(["free prize", "see you"]) > 0) == [True, False]
    entry = {"model": evaluate.classification_metrics([0, 1], [0.2, 0.9], 0.5),
             "baseline": evaluate.classification_metrics([0, 1], [-1.0, 1.0], 0.0)}
    table = evaluate.format_table({"sms": entry})
    assert "sms" in table and "baseline" in table and "roc_auc" in table


def test_bucketed_batches_cover_everything_once():
    import random

    lengths = [random.Random(i).randint(3, 128) for i in range(1000)]
    batches = train.bucketed_batches(lengths, 32, random.Random(0), chunk=10)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(1000))
    # within a batch lengths are close (sorted inside chunks of 320)
    spread = np.mean([max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches])
    assert spread < 20


def test_bias_calibration_keeps_or_improves_validation_f1(tiny):
    import copy

    from tokenizers import Tokenizer

    model, _, tok_path, _ = tiny
    model = copy.deepcopy(model)
    tok = Tokenizer.from_file(str(tok_path))
    texts = ["free prize call now", "win free prize", "call now win", "hello see you", "see you at the lunch",
             "hello", "the lunch", "see you"]
    exs = [Example(t, int(i < 3), "sms") for i, t in enumerate(texts)]
    seqs = [e.ids for e in tok.encode_batch(texts)]
    labels = np.array([e.label for e in exs])
    before = train.spam_f1(labels, train.predict_proba(model, seqs))
    bias = model.classifier.bias.detach().clone()
    shift, info = train.calibrate_bias(model, seqs, exs)
    after = train.spam_f1(labels, train.predict_proba(model, seqs))
    assert after >= before - 1e-9
    assert info["shift"] == shift and shift in train.SHIFT_GRID
    delta = model.classifier.bias.detach() - bias
    assert float(delta[1] - delta[0]) == pytest.approx(shift, abs=1e-6)


def test_robustness_report_fields_on_a_tiny_model(tiny):
    """`model eval --robustness` on a tiny build: every form, both systems, gaps, FP rate, before/after."""
    import shutil

    from modpipe.textmodel import attacks, robustness
    from modpipe.textmodel.artifacts import ModelBuild

    _, path, tok_path, d = tiny
    build_dir = d / "build"
    build_dir.mkdir(exist_ok=True)
    shutil.copy(path, build_dir / "model.onnx")
    shutil.copy(tok_path, build_dir / "tokenizer.json")
    (build_dir / "served.json").write_text(json.dumps({"version": "tiny-1", "max_seq_len": 64}))
    build = ModelBuild(build_dir)
    spam = ["free prize call now", "win free prize now", "call now to win"]
    ham = ["hello see you at the lunch", "see you at the lunch", "hello there see you"]
    train_exs = [Example(t, 1, ds) for t in spam for ds in ("sms", "spamassassin")] + \
        [Example(t, 0, ds) for t in ham for ds in ("sms", "spamassassin")]
    test = train_exs[::-1]
    result = robustness.report(build, train_exs, test, seed=5, rate=1.0, before=build)
    assert result["forms"] == ["clean", *attacks.FORMS]
    for system in ("model", "baseline", "before"):
        rep = result[system]
        assert set(rep["forms"]) == set(result["forms"])
        for per in rep["forms"].values():
            assert set(per) == {"sms", "spamassassin", "all"}
            assert per["all"]["n"] == len(test) and 0 <= per["all"]["accuracy"] <= 1
        assert set(rep["accuracy_gap"]) == set(attacks.FORMS)
        assert rep["worst_gap"] == max(g for per in rep["accuracy_gap"].values() for g in per.values())
        fp = rep["forms"]["clean"]["all"]["confusion"]["fp"]
        assert rep["clean_ham_false_positive_rate"]["all"] == round(fp / len(ham) / 2, 4)
    # the same build before and after: the same numbers, and the target follows the worst gap
    assert result["before"]["forms"] == result["model"]["forms"]
    assert result["clean_ham_false_positive_rate"]["before"] == result["clean_ham_false_positive_rate"]["after"]
    assert result["targets"]["met"] == (result["model"]["worst_gap"] <= robustness.MAX_GAP)
    # attacked texts differ from the clean ones (seeded), so the forms are not the clean set re-scored
    sets = robustness.attack_sets(test, seed=5, rate=1.0)
    assert all(sets[f] != sets["clean"] for f in ("leet", "spaced", "lookalike"))
    assert "target met" in robustness.format_report(result)


def test_int8_quantizes_every_matmul_but_the_lower_ffn_outputs(tmp_path):
    """4 layers: every MatMul (linear layers and attention's two products) reads both inputs through a
    DequantizeLinear, except lin2 of layers 0 and 1, which stay fp32."""
    import onnx

    model, path, tok = tiny_model(tmp_path, "free win prize call now hello see you at the lunch", layers=4)
    window = BatchTokenizer(tok, 16)
    lower = [f"/model/distilbert/transformer/layer.{i}/ffn/lin2/MatMul" for i in (0, 1)]
    assert export.fp32_nodes(path) == lower
    q = export.quantize_int8(path, tmp_path / "model.int8.onnx", window, TEXTS * 3)
    graph = onnx.load(str(q)).graph
    dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    fed = {n.name: sum(i in dequantized for i in n.input) for n in graph.node if n.op_type == "MatMul"}
    assert len(fed) == 4 * 8
    assert {name for name, k in fed.items() if k == 0} == set(lower)
    assert all(k == 2 for name, k in fed.items() if name not in lower)
