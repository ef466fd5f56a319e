"""Training helpers without data: the weight average kept, validated and served by the full profile."""

import pytest

torch = pytest.importorskip("torch")

from modpipe.textmodel.train import WeightAverage  # noqa: E402


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    model[0].bias.requires_grad_(False)  # frozen parameters are not averaged
    return model


def test_average_follows_the_ramped_decay():
    model = _model()
    avg = WeightAverage(model, decay=0.9)
    w = model[1].weight
    expected = w.detach().clone()
    for n in range(1, 40):
        with torch.no_grad():
            w.add_(1.0)
        avg.update()
        d = min(0.9, (1 + n) / (10 + n))
        expected = d * expected + (1 - d) * w.detach()
    assert torch.allclose(avg.shadow["1.weight"], expected, atol=1e-5)
    assert "0.bias" not in avg.shadow
    # the average lags the live weights (which moved by 39) by about d/(1-d) steps
    assert float((w.detach() - avg.shadow["1.weight"]).min()) > 3


def test_swap_twice_restores_live_weights():
    model = _model()
    avg = WeightAverage(model, decay=0.5)
    start = model[1].weight.detach().clone()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    avg.update()
    live = {k: v.clone() for k, v in model.state_dict().items()}
    avg.swap()
    d = min(0.5, 2 / 11)
    assert torch.allclose(model[1].weight, d * start + (1 - d) * 3 * start)
    assert not torch.allclose(model[1].weight, live["1.weight"])
    assert torch.equal(model[0].bias, live["0.bias"])  # frozen: untouched
    avg.swap()
    for k, v in model.state_dict().items():
        assert torch.equal(v, live[k])


def test_param_groups_slow_down_lower_layers_and_skip_frozen_and_no_decay():
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    from modpipe.textmodel.train import TrainConfig, param_groups

    model = DistilBertForSequenceClassification(DistilBertConfig(vocab_size=20, dim=8, n_layers=2, n_heads=2,
                                                                 hidden_dim=16, max_position_embeddings=16))
    model.distilbert.embeddings.word_embeddings.weight.requires_grad_(False)
    cfg = TrainConfig(lr=1e-3, layer_lr_decay=0.5, weight_decay=0.01)
    where = {id(p): (g["lr"], g["weight_decay"]) for g in param_groups(model, cfg) for p in g["params"]}
    named = dict(model.named_parameters())
    assert id(named["distilbert.embeddings.word_embeddings.weight"]) not in where
    assert len(where) == sum(p.requires_grad for p in model.parameters())
    assert where[id(named["classifier.weight"])] == (1e-3, 0.01)
    assert where[id(named["distilbert.transformer.layer.1.ffn.lin1.weight"])] == (1e-3, 0.01)
    assert where[id(named["distilbert.transformer.layer.0.ffn.lin1.weight"])] == (5e-4, 0.01)
    assert where[id(named["distilbert.transformer.layer.0.ffn.lin1.bias"])] == (5e-4, 0.0)
    assert where[id(named["distilbert.embeddings.position_embeddings.weight"])] == (2.5e-4, 0.01)
    assert where[id(named["distilbert.embeddings.LayerNorm.weight"])] == (2.5e-4, 0.0)
    flat = {id(p) for g in param_groups(model, TrainConfig(lr=1e-3)) for p in g["params"]}
    assert flat == set(where)
