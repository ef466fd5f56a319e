"""MiniLM (BERT) -> DistilBERT conversion: the converted encoder computes the same hidden states."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from modpipe.textmodel import convert  # noqa: E402

TEXTS = [
    "Free entry in 2 a wkly comp to win FA Cup final tkts 21st May 2005. Text FA to 87121",
    "Nah I don't think he goes to usf, he lives around here though",
    "Re: [SAtalk] razor 2 and spamassassin -- does anyone have this working with the new release?",
    "a",
]


@pytest.fixture(scope="module")
def models():
    try:
        src = convert.minilm_dir()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    distil = convert.convert_minilm(src).eval()
    bert = transformers.BertModel.from_pretrained(str(src)).eval()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=128)
    return distil, bert, tok


def _batch(tok, texts):
    encs = tok.encode_batch(texts)
    width = max(len(e.ids) for e in encs)
    ids = torch.zeros((len(encs), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(encs):
        ids[i, :len(e.ids)] = torch.tensor(e.ids)
        mask[i, :len(e.ids)] = 1
    return ids, mask


def test_hidden_states_match_bert(models):
    distil, bert, tok = models
    ids, mask = _batch(tok, TEXTS)  # padded batch: the attention mask must be honoured identically
    with torch.no_grad():
        ours = distil.distilbert(input_ids=ids, attention_mask=mask).last_hidden_state
        ref = bert(input_ids=ids, attention_mask=mask).last_hidden_state
    valid = mask.bool()
    diff = (ours - ref).abs()[valid].max().item()
    assert diff <= 1e-4, diff


def test_architecture_is_the_requested_distilbert(models):
    distil, _, _ = models
    cfg = distil.config
    assert (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.hidden_dim, cfg.activation, cfg.vocab_size) == \
        (384, 6, 12, 1536, "gelu", 30522)
    assert type(distil).__name__ == "DistilBertForSequenceClassification"
    assert distil.config.num_labels == 2


def test_position_embeddings_fold_in_token_type_zero():
    bert = {
        "embeddings.word_embeddings.weight": torch.zeros(5, 2),
        "embeddings.position_embeddings.weight": torch.ones(3, 2),
        "embeddings.token_type_embeddings.weight": torch.tensor([[0.5, -1.0], [9.0, 9.0]]),
        "embeddings.LayerNorm.weight": torch.ones(2),
        "embeddings.LayerNorm.bias": torch.zeros(2),
    }
    out = convert.bert_to_distilbert_state(bert, n_layers=0)
    assert torch.equal(out["embeddings.position_embeddings.weight"], torch.tensor([[1.5, 0.0]] * 3))


def test_saved_base_loads_back_as_base(models, tmp_path):
    distil, _, _ = models
    src = convert.minilm_dir()
    convert.save_base(distil, src, tmp_path / "base")
    loaded, tok_dir = convert.load_base(tmp_path / "base")
    assert tok_dir == tmp_path / "base"
    sd_a, sd_b = distil.state_dict(), loaded.state_dict()
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)


def test_kept_layers_are_evenly_spaced_with_both_ends():
    assert convert.kept_layers(12, 6) == [0, 2, 4, 7, 9, 11]  # the layers DistilBERT was initialised from
    assert convert.kept_layers(6, 3) == [0, 2, 5]
    assert convert.kept_layers(6, 0) == list(range(6)) and convert.kept_layers(6, 9) == list(range(6))
    assert convert.kept_layers(12, 1) == [11]


def _tiny_bert(path, layers=4):
    """A random 4-layer BERT checkpoint directory with a tokenizer vocabulary (a `--base` candidate)."""
    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=64)
    torch.manual_seed(1)
    bert = transformers.BertModel(config).eval()
    bert.save_pretrained(path)
    (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + [f"w{i}" for i in range(36)]))
    return bert


def test_a_bert_base_cut_to_every_other_layer_computes_those_layers(tmp_path):
    bert = _tiny_bert(tmp_path / "bert")
    model, tok_dir = convert.load_base(tmp_path / "bert", layers=2)
    assert tok_dir == tmp_path / "bert" and model.config.n_layers == 2
    picked = convert.kept_layers(4, 2)  # [0, 3]
    # the cut model equals BERT whose encoder runs only the picked layers
    bert.encoder.layer = torch.nn.ModuleList(bert.encoder.layer[i] for i in picked)
    ids = torch.tensor([[2, 5, 9, 3, 0], [2, 7, 3, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        ours = model.eval().distilbert(input_ids=ids, attention_mask=mask).last_hidden_state
        ref = bert(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (ours - ref).abs()[mask.bool()].max().item() <= 1e-4
    whole, _ = convert.load_base(tmp_path / "bert")
    assert whole.config.n_layers == 4


def test_a_distilbert_base_can_be_cut_and_other_models_are_refused(tmp_path):
    _tiny_bert(tmp_path / "bert")
    model, _ = convert.load_base(tmp_path / "bert")
    convert.save_base(model, tmp_path / "bert", tmp_path / "distil")
    cut, _ = convert.load_base(tmp_path / "distil", layers=2)
    assert cut.config.n_layers == 2 and len(cut.distilbert.transformer.layer) == 2
    assert torch.equal(cut.distilbert.transformer.layer[1].ffn.lin1.weight,
                       model.distilbert.transformer.layer[3].ffn.lin1.weight)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"model_type": "mpnet"}')
    (tmp_path / "other" / "vocab.txt").write_text("[PAD]\n")
    with pytest.raises(ValueError, match="mpnet"):
        convert.load_base(tmp_path / "other")
