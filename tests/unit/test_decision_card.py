"""modpipe.decision.card: the decision model's card names what it learned from and where the licences are."""

from modpipe.decision.card import render


def test_the_card_counts_the_texts_by_data_set_and_names_the_text_model():
    texts = [{"text": "a", "label": "spam", "dataset": "sms"}, {"text": "b", "label": "ham", "dataset": "sms"},
             {"text": "c", "label": "ham", "dataset": "tweets"}, {"text": "d", "label": "ham", "dataset": "tweets"}]
    meta = {"profile": "full", "seed": 0, "key": "k1", "train_seconds": 54.0, "policy": {"text_floor": 0.97},
            "rounds": [{"valid_f1": 0.98, "text_floor": {"chosen": 0.97}}], "importance_gain": {"b": 1.0, "a": 3.0}}
    text = render(version="lgbm-abc", meta=meta, features=["a", "b"], text_model_version="full-123", texts=texts)
    assert text.startswith("# Decision model lgbm-abc")
    assert "| sms | ham | 1 |" in text and "| tweets | ham | 2 |" in text and "| sms | spam | 1 |" in text
    assert "`full-123`" in text and "Sources and" in text and "valid_f1 0.98" in text
    assert text.index("`a` 3") < text.index("`b` 1")  # largest gain first
