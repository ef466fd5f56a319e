"""Hostile-text normalisation (tokenizer.json), the attack generators, and the obfuscation measures."""

import random

import pytest
from modpipe.features.obfuscation import (
    OBFUSCATION_FEATURES,
    confusable_to_ascii,
    is_invisible,
    lookalikes_of,
    obfuscation_features,
    skeleton,
)

from modpipe.textmodel import attacks, hostile
from modpipe.textmodel.data import Example
from modpipe.textmodel.tokenize import BatchTokenizer, collapse_punctuation_runs, encode_ids, prepare


@pytest.fixture(scope="module")
def base_json():
    from modpipe.textmodel import convert

    return (convert.minilm_dir() / "tokenizer.json").read_text()


def _tok(base_json, harden=True, fold_leet=False):
    from tokenizers import Tokenizer

    tok = prepare(Tokenizer.from_str(base_json), 128, 0)
    collapse_punctuation_runs(tok)
    if harden:
        hostile.harden(tok, fold_leet)
    return tok


def _norm(tok, text):
    return tok.normalizer.normalize_str(text)


# ------------------------------------------------------------------ Unicode facts

def test_confusables_come_from_unicode_data_and_fold_to_ascii():
    table = confusable_to_ascii()
    assert len(table) > 1000  # UTS #39 lists ~6,300 confusables; >1,000 of them read as ASCII
    assert table["а"] == "a" and table["А"] == "A" and table["е"] == "e" and table["ѕ"] == "s"  # Cyrillic
    assert table["ο"] == "o" and table["Ι"] == "I"  # Greek: capital iota reads as capital I, not l
    assert table["𝟎"] == "0"  # a digit stays a digit ({0, O} share a skeleton)
    assert all(not k.isascii() for k in table)  # ASCII is never folded (1/l, 0/O are leet's question)
    assert skeleton("раураl") == skeleton("paypal")
    assert "а" in lookalikes_of()["a"]


def test_invisible_characters_are_the_default_ignorables():
    for ch in "\u200b\u200c\u200d\u2060\u00ad\ufeff\u2800\u3164":
        assert is_invisible(ch), hex(ord(ch))
    for ch in "a \n\t.é":
        assert not is_invisible(ch)


# ------------------------------------------------------------------ tokenizer rules, one by one

def test_invisible_characters_are_removed(base_json):
    tok = _tok(base_json)
    assert _norm(tok, "f\u200br\u200ce\u2060e c\u00adash\ufeff") == "free cash"


def test_fullwidth_mathematical_and_lookalike_letters_read_as_ascii(base_json):
    tok = _tok(base_json)
    for hostile_text in ("ｆｒｅｅ ｍｏｎｅｙ", "𝐟𝐫𝐞𝐞 𝐦𝐨𝐧𝐞𝐲", "frее mоnеy", "FRЕЕ MОNЕY"):  # Cyrillic е, о, Е, О
        assert _norm(tok, hostile_text) == "free money", hostile_text


def test_letter_spaced_words_are_rejoined_but_short_runs_stay(base_json):
    tok = _tok(base_json)
    assert _norm(tok, "M a k e $5000 from h o m e") == "make $5000 from home"
    assert _norm(tok, "f.r.e.e f-r-e-e F*R*E*E") == "free free free"
    assert _norm(tok, "how r u") == "how r u"  # a run of two: SMS-speak, not a disguise
    assert _norm(tok, "plan B is ok, I am a fan") == "plan b is ok, i am a fan"


def test_marks_inside_words_are_dropped_but_leet_symbols_stay(base_json):
    tok = _tok(base_json)
    assert _norm(tok, "ha,v.e a p*ri'ze, c*a,ll fr.-ee") == "have a prize, call free"
    assert _norm(tok, "don't e-mail cnet.com") == "dont email cnetcom"  # the price: training sees it too
    assert _norm(tok, "p@ss cl4!m 12.50, end. Next") == "p@ss cl4!m 12.50, end. next"


def test_leet_fold_between_letters_and_at_a_start_that_cannot_be_a_number(base_json):
    tok = _tok(base_json, fold_leet=True)
    assert _norm(tok, "h4d gr347 f4rm3r5 m0ney") == "had great farmers money"
    assert _norm(tok, "at 5pm for 24hrs, $5000, 4 sale, call 0800 123") == "at 5pm for 24hrs, $5000, 4 sale, call 0800 123"
    # a word's first digit: before three letters, or before a letter with another leet digit in the word
    assert _norm(tok, "7h3 0n3 0u7 7his 7ravel 5ervice 4lmo5t") == "the one out this travel service almost"
    # numbers with units and ordinals keep their digits; so do words that hold one leet digit and two letters
    assert _norm(tok, "4th 1st 3rd 7pm 5km 3x 4u 4nd 2nd") == "4th 1st 3rd 7pm 5km 3x 4u 4nd 2nd"
    # the between-letters rule's cost, as trained on: a digit between a leet digit and a letter is folded
    assert _norm(tok, "10am 150p/msg") == "1oam 1sopmsg"
    assert _norm(_tok(base_json), "h4d m0ney") == "h4d m0ney"  # without fold_leet leet is left to training


def test_ordinary_text_is_unchanged(base_json):
    plain, hard = _tok(base_json, harden=False), _tok(base_json)
    for text in ("Hello, you have WON £1000 (call 0800-123)! Café: naïve?", "Ok lar... Joking wif u oni...",
                 "Meeting at 5pm - see you, 12.50 each", "免费赢取iPhone", "مرحبا", "😀🎉 win 💰"):
        assert hard.encode(text).ids == plain.encode(text).ids, text


def test_same_ids_in_training_client_and_tokenizer_json(base_json, tmp_path):
    """Training encodes with the in-memory tokenizer, the client and Triton's spam_tokenizer load the saved
    tokenizer.json: a hostile text gets the same ids in all, and the ids of its clean form."""
    tok = _tok(base_json)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    texts = ["ｆｒｅｅ 𝐦𝐨𝐧𝐞𝐲 frее F R E E c\u200ba\u200bs\u200bh", "free money free FREE cash"]
    training = encode_ids(tok, texts, 128, 0)
    client = BatchTokenizer(path, 128).ids(texts)
    assert training == client
    assert client[0] == client[1]
    assert "Precompiled" in path.read_text()  # the look-alike table travels inside tokenizer.json


# ------------------------------------------------------------------ attacks

TEXT = "WINNER!! You have won a FREE prize of £1000 cash. Call 09061701461 now to claim, valid 12hrs only."


@pytest.mark.parametrize("form", attacks.FORMS)
def test_each_attack_changes_words_and_is_seeded(form):
    a = attacks.attacked([TEXT], form, seed=1, rate=1.0)[0]
    assert a != TEXT
    assert a == attacks.attacked([TEXT], form, seed=1, rate=1.0)[0]
    assert "09061701461" in a  # numbers are not words: phone numbers and prices survive
    # a text is disguised alike wherever it stands: builds that test the same texts in another order compare
    others = ["Are we still on for lunch tomorrow at noon?", "Your parcel could not be delivered, reply now"]
    assert attacks.attacked([*others, TEXT], form, seed=1, rate=1.0)[2] == a
    assert attacks.attacked([TEXT], form, seed=2, rate=1.0)[0] != a  # another seed, another disguise


def test_attacks_are_undone_by_the_normaliser_where_they_can_be(base_json):
    tok = _tok(base_json)
    clean = _norm(tok, TEXT)
    for form in ("lookalike", "invisible"):
        assert _norm(tok, attacks.attacked([TEXT], form, seed=3, rate=1.0)[0]) == clean, form


def test_unknown_form_is_refused():
    with pytest.raises(ValueError, match="unknown attack form"):
        attacks.obfuscate("x", "rot13", random.Random(0))


def test_augment_replaces_a_share_of_both_classes_deterministically():
    exs = [Example(f"free cash prize number {i} call now", i % 2, "sms") for i in range(400)]
    out, info = attacks.augment(exs, 0.3, seed=0)
    again, _ = attacks.augment(exs, 0.3, seed=0)
    assert out == again and len(out) == len(exs)
    changed = [o for o, e in zip(out, exs, strict=True) if o.text != e.text]
    assert 80 < info["replaced"] < 160 and len(changed) <= info["replaced"]
    assert info["by_label"]["spam"] > 30 and info["by_label"]["ham"] > 30
    assert [o.label for o in out] == [e.label for e in exs]
    assert attacks.augment(exs, 0.0, seed=0)[0] == exs


# ------------------------------------------------------------------ obfuscation measures

def test_obfuscation_features_measure_each_trick_and_not_foreign_scripts():
    clean = obfuscation_features("Free money, call now to claim your prize")
    assert set(clean) == set(OBFUSCATION_FEATURES) and not any(clean.values())
    assert obfuscation_features("Привет, как дела?")["text_lookalike_share"] == 0  # Russian is not a disguise
    assert obfuscation_features("frее mоney")["text_lookalike_share"] > 0.2
    assert obfuscation_features("f\u200br\u200be\u200be")["text_invisible_share"] > 0.5
    assert obfuscation_features("M a k e money f.r.e.e")["text_spaced_share"] > 0.4
    assert obfuscation_features("how r u")["text_spaced_share"] == 0
    assert obfuscation_features("h4d gr347 m0ney")["text_leet_share"] > 0.1
    assert obfuscation_features("at 5pm for 24hrs")["text_leet_share"] == 0
    assert obfuscation_features(None) == dict.fromkeys(OBFUSCATION_FEATURES, 0.0)


# ------------------------------------------------------------------ command line

def test_eval_robustness_options_need_robustness(capsys):
    from modpipe.cli import main

    assert main(["model", "eval", "--attack-seed", "3"]) == 2
    assert "need --robustness" in capsys.readouterr().err
    assert main(["model", "eval", "--robustness", "--attack-rate", "1.5"]) == 2
    assert "--attack-rate" in capsys.readouterr().err
