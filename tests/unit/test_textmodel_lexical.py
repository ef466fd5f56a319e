"""The lexical stack (modpipe/textmodel/lexical.py): scikit-learn's TF-IDF + LinearSVC reproduced in numpy, the
stack's probability, its file, and the module's independence (it runs inside Triton's python stub)."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, normalizers

from modpipe.textmodel import lexical

TRAIN = [("WIN a FREE prize now, call 0906 to claim your cash", 1), ("free entry: text WIN to 80086 now", 1),
         ("Cheap meds online, no prescription, buy now buy now", 1), ("claim your free holiday, reply YES", 1),
         ("see you at lunch tomorrow?", 0), ("the meeting notes are attached, thanks", 0),
         ("can you pick up milk on the way home", 0), ("great game last night, what a finish", 0),
         ("Héllo wörld — café at 5?", 0), ("patch v2: fix the race in the free list", 0)]
PROBE = ["win win win free cash", "lunch at the café?", "", "   ", "!!!", "completely unseen vocabulary here",
         "buy now " * 50, "a b c", "日本語のテキスト free"]


@pytest.fixture(scope="module")
def sklearn_pair():
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.svm import LinearSVC

    texts, labels = zip(*TRAIN, strict=True)
    vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, lowercase=True)
    svm = LinearSVC(random_state=0).fit(vec.fit_transform(texts), labels)
    return vec, svm


def test_numpy_head_reproduces_scikit_learn(sklearn_pair):
    vec, svm = sklearn_pair
    vocabulary = sorted(vec.vocabulary_, key=vec.vocabulary_.__getitem__)
    head = lexical.LexicalHead(vocabulary, vec.idf_, svm.coef_[0], svm.intercept_[0])
    want = svm.decision_function(vec.transform(PROBE + [t for t, _ in TRAIN]))
    np.testing.assert_allclose(head.margins(PROBE + [t for t, _ in TRAIN]), want, rtol=0, atol=1e-9)
    assert head.margin("") == pytest.approx(svm.intercept_[0])  # no known term: the intercept alone


def test_character_terms_are_scikit_learns_char_wb():
    from sklearn.feature_extraction.text import TfidfVectorizer

    analyse = TfidfVectorizer(analyzer="char_wb", ngram_range=lexical.CHAR_NGRAMS).build_analyzer()
    # short words (a word no longer than n gives itself once), runs of whitespace of every kind, non-Latin scripts
    texts = PROBE + [t for t, _ in TRAIN] + ["a", "ab", "abc", "x\u3000y\tz\n\nw", "\u00a0nbsp", "İstanbul ß ǅ"]
    for text in texts:
        assert lexical.char_terms(text) == analyse(text), text
    assert lexical.char_terms("Ab") == [" a", "ab", "b ", " ab", "ab ", " ab "]


def test_numpy_character_head_reproduces_scikit_learn():
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.svm import LinearSVC

    texts, labels = zip(*TRAIN, strict=True)
    vec = TfidfVectorizer(analyzer="char_wb", ngram_range=lexical.CHAR_NGRAMS, sublinear_tf=True, min_df=2)
    svm = LinearSVC(random_state=0).fit(vec.fit_transform(texts), labels)
    head = lexical.fit_head(texts, labels, analyzer="char_wb")
    assert head.analyzer == "char_wb" and len(head.vocabulary) == len(vec.vocabulary_)
    want = svm.decision_function(vec.transform(PROBE + list(texts)))
    np.testing.assert_allclose(head.margins(PROBE + list(texts)), want, rtol=0, atol=1e-9)
    # a misspelling the word model has never seen still shares most of its character n-grams
    assert head.margin("freee priize") > head.margin("lunch notes")
    with pytest.raises(ValueError, match="analyzer 'bytes'"):
        lexical.fit_head(texts, labels, analyzer="bytes")


def test_fit_head_is_seeded_and_separates_its_training_data():
    texts, labels = zip(*TRAIN, strict=True)
    a, b = lexical.fit_head(texts, labels), lexical.fit_head(texts, labels)
    np.testing.assert_array_equal(a.coef, b.coef)
    margins = a.margins(texts)
    assert ((margins >= 0) == np.array(labels, dtype=bool)).all()


def _tokenizer_json(directory: Path) -> None:
    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.save(str(directory / "tokenizer.json"))


def _stack(head: lexical.LexicalHead) -> lexical.StackedScorer:
    return lexical.StackedScorer(head, model_coef=0.6, lexical_coef=3.0, intercept=-0.4,
                                 info={"threshold": {"shift": 0.25}})


def test_stack_probability_and_missing_values():
    texts, labels = zip(*TRAIN, strict=True)
    stack = _stack(lexical.fit_head(texts, labels))
    model = np.array([0.9, 0.2, np.nan, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5])
    got = stack.spam_proba(PROBE, model)
    margins = stack.margins(PROBE)
    z = 0.6 * np.log(np.clip(model, 1e-7, 1 - 1e-7) / (1 - np.clip(model, 1e-7, 1 - 1e-7))) + 3.0 * margins - 0.4
    ok = ~np.isnan(model)
    np.testing.assert_allclose(got[ok], 1 / (1 + np.exp(-z[ok])), rtol=1e-12)
    assert math.isnan(got[2])  # the text model off or unavailable stays missing for the decision model
    # a saturated float32 1.0 is clipped, not infinite
    assert np.isfinite(got).sum() == len(PROBE) - 1
    # more model confidence never lowers the served probability (positive model coefficient)
    rising = stack.spam_proba(["same text"] * 5, np.array([0.01, 0.2, 0.5, 0.8, 0.99]))
    assert (np.diff(rising) > 0).all()
    with pytest.raises(ValueError, match="2 texts, 1 model"):
        stack.spam_proba(["a", "b"], np.array([0.5]))


def test_saved_stack_loads_with_the_builds_normalizer(tmp_path):
    texts, labels = zip(*TRAIN, strict=True)
    norm = lambda t: t.lower()  # noqa: E731 - what the test tokenizer's normalizer does to ASCII
    stack = _stack(lexical.fit_head([norm(t) for t in texts], labels))
    stack._normalize = norm
    _tokenizer_json(tmp_path)
    assert lexical.StackedScorer.load(str(tmp_path)) is None  # no head file: the transformer alone
    stack.save(str(tmp_path))
    doc = json.loads((tmp_path / lexical.HEAD_FILE).read_text())
    assert doc["format"] == lexical.FORMAT and doc["stack"]["threshold"] == {"shift": 0.25}
    loaded = lexical.StackedScorer.load(str(tmp_path))
    model = np.linspace(0.05, 0.95, len(PROBE))
    # the file keeps float32 weights: the served probability moves by far less than a decision could notice
    np.testing.assert_allclose(loaded.spam_proba(PROBE, model), stack.spam_proba(PROBE, model), atol=1e-6)
    # the tokenizer's normalizer is applied: NFKC folds the fullwidth word to the one the head knows
    assert loaded.margins(["ＷＩＮ free cash"])[0] == pytest.approx(loaded.margins(["win free cash"])[0])
    # texts normalised by the caller (the worker's tokenizer) give the same probability without a second pass
    normalized = loaded.normalized(PROBE + ["ＷＩＮ ＦＲＥＥ cash"])
    model = np.linspace(0.05, 0.95, len(normalized))
    np.testing.assert_array_equal(loaded.spam_proba(PROBE + ["ＷＩＮ ＦＲＥＥ cash"], model, normalized=normalized),
                                  loaded.spam_proba(PROBE + ["ＷＩＮ ＦＲＥＥ cash"], model))
    with pytest.raises(ValueError, match="2 texts, 1 normalised"):
        loaded.spam_proba(["a", "b"], np.array([0.5, 0.5]), normalized=["a"])
    doc["format"] = 99
    (tmp_path / lexical.HEAD_FILE).write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="format 99"):
        lexical.StackedScorer.load(str(tmp_path))


def test_a_character_stack_names_its_analyzer_and_older_files_read_as_word_heads(tmp_path):
    texts, labels = zip(*TRAIN, strict=True)
    _tokenizer_json(tmp_path)
    stack = _stack(lexical.fit_head([t.lower() for t in texts], labels, analyzer="char_wb"))
    stack.save(str(tmp_path))
    doc = json.loads((tmp_path / lexical.HEAD_FILE).read_text())
    assert doc["format"] == 2 and doc["analyzer"]["kind"] == "char_wb" and doc["analyzer"]["ngram_range"] == [2, 5]
    loaded = lexical.StackedScorer.load(str(tmp_path))
    assert loaded.head.analyzer == "char_wb"
    model = np.linspace(0.05, 0.95, len(PROBE))
    np.testing.assert_allclose(loaded.spam_proba(PROBE, model), stack.spam_proba(PROBE, model), atol=1e-6)
    doc["analyzer"]["ngram_range"] = [1, 4]  # n-grams this code does not compute are refused, not misread
    (tmp_path / lexical.HEAD_FILE).write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"character n-grams \[1, 4\]"):
        lexical.StackedScorer.load(str(tmp_path))
    # a file of format 1 (builds before the analyzer was named) holds a word head
    word = _stack(lexical.fit_head([t.lower() for t in texts], labels))
    word.save(str(tmp_path))
    doc = json.loads((tmp_path / lexical.HEAD_FILE).read_text())
    doc["format"] = 1
    doc["analyzer"] = {"token_pattern": lexical.TOKEN_PATTERN, "ngram_range": [1, 2]}
    (tmp_path / lexical.HEAD_FILE).write_text(json.dumps(doc))
    old = lexical.StackedScorer.load(str(tmp_path))
    assert old.head.analyzer == "word"
    np.testing.assert_allclose(old.spam_proba(PROBE, model), word.spam_proba(PROBE, model), atol=1e-6)


def test_lexical_module_imports_nothing_of_modpipe():
    """spam_postprocess imports lexical.py from its version directory, where modpipe is not installed."""
    tree = ast.parse(Path(lexical.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not {m for m in imported if m.split(".")[0] in ("modpipe", "streams", "features")}
    assert {m.split(".")[0] for m in imported} <= {"__future__", "json", "math", "os", "re", "collections",
                                                   "numpy", "tokenizers", "sklearn"}
