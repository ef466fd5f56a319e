"""Platform corpora (platforms.py): each file found, checked against its pinned sha256 or downloaded from its
pinned commit, the parsers of every set on small inline samples, the near-duplicate index; and, where the
local copy is present, the real files."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile

import pytest

from modpipe.settings import Settings
from modpipe.textmodel import data, platforms
from modpipe.textmodel.platforms import Corpus, CorpusFile, CorpusMissing, Locator


def _sha(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def _corpus(files: tuple[CorpusFile, ...], **kw) -> Corpus:
    return Corpus("demo-set", "youtube", "owner/repo", "c0ffee" * 6 + "abcd", "MIT", True, files, **kw)


# ---------------------------------------------------------------- locating and checking


def test_local_copy_is_read_when_its_sha256_matches(tmp_path):
    raw = b"a,b\n"
    (tmp_path / "local" / "demo-set").mkdir(parents=True)
    (tmp_path / "local" / "demo-set" / "x.csv").write_bytes(raw)
    loc = Locator(tmp_path / "local", tmp_path / "cache", download=False)
    assert loc.files(_corpus((CorpusFile("x.csv", _sha(raw)),))) == {"x.csv": tmp_path / "local/demo-set/x.csv"}


def test_missing_file_error_names_the_file_and_every_place_looked(tmp_path):
    loc = Locator(tmp_path / "local", tmp_path / "cache", download=False)
    with pytest.raises(CorpusMissing) as err:
        loc.files(_corpus((CorpusFile("sub/x.csv", "ab" * 32),)))
    msg = str(err.value)
    assert "demo-set" in msg and "sub/x.csv" in msg and "owner/repo" in msg
    assert str(tmp_path / "local/demo-set/sub/x.csv") in msg and str(tmp_path / "cache/corpora/demo-set/sub/x.csv") in msg
    assert "MODPIPE_CORPORA_DIR" in msg


def test_a_changed_local_file_is_refused(tmp_path):
    (tmp_path / "local" / "demo-set").mkdir(parents=True)
    (tmp_path / "local" / "demo-set" / "x.csv").write_bytes(b"changed")
    loc = Locator(tmp_path / "local", None, download=False)
    with pytest.raises(CorpusMissing, match="not the pinned"):
        loc.files(_corpus((CorpusFile("x.csv", _sha(b"original")),)))


def test_download_from_the_pinned_commit_checked_and_cached(tmp_path):
    raw, asked = b"text,label\n", []

    def fetch(url):
        asked.append(url)
        return raw

    corpus = _corpus((CorpusFile("x.csv", _sha(raw), "data/x.csv"),))
    loc = Locator(tmp_path / "local", tmp_path / "cache", fetch=fetch)
    path = loc.files(corpus)["x.csv"]
    assert asked == [f"https://raw.githubusercontent.com/owner/repo/{corpus.commit}/data/x.csv"]
    assert path == tmp_path / "cache/corpora/demo-set/x.csv" and path.read_bytes() == raw
    Locator(tmp_path / "local", tmp_path / "cache", fetch=lambda url: pytest.fail("fetched twice")).files(corpus)


def test_a_download_with_another_sha256_is_refused_and_not_kept(tmp_path):
    loc = Locator(tmp_path / "local", tmp_path / "cache", fetch=lambda url: b"tampered")
    with pytest.raises(CorpusMissing, match="download .* failed: .*not the pinned"):
        loc.files(_corpus((CorpusFile("x.csv", _sha(b"original")),)))
    assert not (tmp_path / "cache/corpora/demo-set/x.csv").exists()


def test_a_file_inside_a_zip_of_the_repository(tmp_path):
    raw = b"COMMENT_ID,AUTHOR,DATE,CONTENT,CLASS\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("Youtube01-Psy.csv", raw)
    corpus = _corpus((CorpusFile("V1/Youtube01-Psy.csv", _sha(raw), archive="V1.zip"),))
    loc = Locator(tmp_path / "l", tmp_path / "cache", fetch=lambda url: buf.getvalue() if url.endswith("/V1.zip") else b"")
    assert loc.files(corpus)["V1/Youtube01-Psy.csv"].read_bytes() == raw


def test_many_files_pinned_by_one_digest(tmp_path):
    files = {"email/a.eml": b"A", "email/b.eml": b"B"}
    root = tmp_path / "local" / "demo-set"
    for name, raw in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(raw)
    digest = platforms.members_digest({n: _sha(r) for n, r in files.items()})
    corpus = _corpus((), members=tuple(files), members_sha256=digest)
    assert Locator(tmp_path / "local", None, download=False).members(corpus) == [root / n for n in files]
    (root / "email/b.eml").write_bytes(b"changed")
    with pytest.raises(CorpusMissing, match="2 files"):
        Locator(tmp_path / "local", None, download=False).members(corpus)


def test_the_local_copy_defaults_beside_the_repository_and_a_setting_moves_it(tmp_path):
    assert platforms.local_dir("") == platforms.default_local_dir()
    assert platforms.default_local_dir().parts[-2:] == ("shared", "corpora")
    s = Settings.from_env({"MODPIPE_CORPORA_DIR": str(tmp_path)})
    assert platforms.locator(s, download=False).local == tmp_path


def test_every_corpus_is_pinned_completely():
    assert len(platforms.CORPORA) == 8 and set(platforms.PARSERS) == set(platforms.BY_REGISTER)
    for c in platforms.CORPORA:
        assert len(c.commit) == 40 and c.license and c.repository.count("/") == 1
        assert all(len(f.sha256) == 64 for f in c.files)
    assert {c.register for c in platforms.CORPORA if not c.trainable} == {"phishing_pot", "airline"}
    assert len(platforms.PHISHING_POT_EMAILS) == 1483


# ---------------------------------------------------------------- parsers


def test_youtube_comments_lose_entities_tags_and_bom():
    raw = ('COMMENT_ID,AUTHOR,DATE,CONTENT,CLASS\n'
           'a,x,2013,"Check out my channel&#39;s video<br />now\ufeff",1\n'
           'b,y,2014,"love this song \ufeff",0\n'
           'c,z,2014,"",1\n').encode()
    assert list(platforms.parse_youtube(raw)) == [("Check out my channel's video\nnow", 1), ("love this song", 0)]


def test_instagram_comments():
    raw = b"number,scam,msg_length,msg\n0,1,10,\"dm me to invest, 10x\"\n1,0,4,yup!\n"
    assert list(platforms.parse_instagram(raw)) == [("dm me to invest, 10x", 1), ("yup!", 0)]


def test_x_posts_scam_vs_clean_without_placeholders_promotions_or_token_requests():
    rows = [
        {"source_id": "x_mock_0001", "source_url": "", "text": "placeholder scam", "labels": ["scam"]},
        {"source_id": "1", "source_url": "https://x.com/example/status/1", "text": "fake", "labels": ["clean"]},
        {"source_id": "2", "source_url": "https://x.com/a/status/2", "text": "DM for RECOVERY", "labels": ["recovery_scam"]},
        {"source_id": "3", "source_url": "https://x.com/a/status/3", "text": "claim airdrop", "labels": ["phishing", "topic_crypto"]},
        {"source_id": "4", "source_url": "https://x.com/a/status/4", "text": "50% off", "labels": ["promo", "affiliate"]},
        {"source_id": "5", "source_url": "https://x.com/a/status/5", "text": "@bankrbot deploy $X", "labels": ["scam"]},
        {"source_id": "6", "source_url": "", "text": "gm, bags are heavy", "labels": ["topic_crypto"]},
        {"source_id": "7", "source_url": "", "text": "a fine day", "labels": []},
    ]
    raw = "\n".join(json.dumps(r) for r in rows).encode()
    assert list(platforms.parse_x(raw)) == [("DM for RECOVERY", 1), ("claim airdrop", 1), ("gm, bags are heavy", 0),
                                            ("a fine day", 0)]


def test_sms_2022_labels_any_case():
    raw = (b"LABEL,TEXT,URL,EMAIL,PHONE\nham,see you,No,No,No\nSmishing,kyc now,Yes,No,No\nSpam,win,No,No,No\n"
           b"other,x,No,No,No\n")
    assert list(platforms.parse_sms_2022(raw)) == [("see you", 0), ("kyc now", 1), ("win", 1)]


def test_airline_file_is_latin1():
    raw = "_unit_id,airline_sentiment,text\n1,neutral,@united caf\xe9 \x9d ok\n".encode("latin-1")
    assert list(platforms.parse_airline(raw)) == [("@united caf\xe9 \x9d ok", 0)]


def test_review_sentences_and_tweet_lines_are_ham():
    assert list(platforms.parse_reviews(b"Good case, value.\t1\nBad.\t0\nno label line\n")) == [
        ("Good case, value.", 0), ("Bad.", 0)]
    assert list(platforms.parse_lines_ham(b"@user hi there\n\n  \nsecond\n")) == [("@user hi there", 0), ("second", 0)]


def test_phishing_email_is_subject_and_body():
    raw = b"Subject: Your account is on hold\nContent-Type: text/plain\n\nVerify here now.\n"
    assert list(platforms.parse_phishing_email(raw)) == [("Your account is on hold\nVerify here now.", 1)]


# ---------------------------------------------------------------- near duplicates


def test_near_index_finds_exactly_the_pairs_over_the_threshold():
    known = ["free entry in a weekly competition to win cup final tickets",
             "ok see you later",
             "call me when you get home tonight please"]
    index = platforms.NearIndex([platforms.words(t) for t in known], 0.7)
    assert index.matches(platforms.words("FREE entry in a weekly competition to win the cup final tickets!")) == [0]
    assert index.matches(platforms.words("ok see you")) == [1]  # 3 of 4 words: Jaccard 0.75
    assert index.matches(platforms.words("ok see you later then bye")) == []  # 4 of 6: 0.67
    assert index.matches(platforms.words("ok you")) == []  # 0.5
    assert index.matches(frozenset()) == []


def test_sms_rows_in_the_uci_collection_or_near_it_are_dropped():
    known = ["Free entry in 2 a wkly comp to win FA Cup final tkts 21st May 2005", "Ok lar... Joking wif u oni..."]
    rows = [("FREE entry in 2 a wkly comp to win FA Cup final tkts 21st May 2006!", 1),  # exact after normalising
            ("Free entry in a wkly comp to win FA Cup final tkts 21st May", 1),  # near
            ("Dear customer your wallet is on hold complete your kyc", 1)]
    kept, stats = platforms.new_to(rows, known, data.normalise)
    assert kept == [rows[2]]
    assert stats == {"read": 3, "in_known_exact": 1, "in_known_near": 1, "kept": 1}


def test_dedup_drops_copies_and_texts_seen_with_both_labels():
    pairs = [("Hello there", 0), ("hello THERE!", 0), ("buy now", 1), ("Buy now.", 0), ("x", 1)]
    kept, stats = platforms.dedup_pairs(pairs, data.normalise)
    assert kept == [("Hello there", 0), ("x", 1)] and stats["label_conflicts_dropped"] == 1


# ---------------------------------------------------------------- the real files, where present

_SETTINGS = Settings.from_env()
real = pytest.mark.skipif(not platforms.available(_SETTINGS),
                          reason=f"platform corpora not at {platforms.local_dir(_SETTINGS.corpora_dir)} "
                                 "(set MODPIPE_CORPORA_DIR to a copy)")


@real
def test_real_files_match_their_pins_and_parse():
    loc = platforms.locator(_SETTINGS, download=False)
    counts = {}
    for c in platforms.CORPORA:
        pairs = platforms.read(c, loc.files(c))
        counts[c.register] = (len(pairs), sum(label for _, label in pairs))
    # rows per label as SOURCE.md counts them, less what the parsers leave out by rule
    assert counts["youtube"] == (1956, 1005)
    assert counts["instagram"] == (3586, 1288)
    assert counts["sms_2022"] == (5971, 1127)
    assert counts["phishing_pot"] == (1483, 1483)
    assert counts["reviews"] == (3000, 0) and counts["airline"] == (14640, 0)
    assert counts["tweeteval"][1] == 0 and counts["tweeteval"][0] > 23_000
    x_total, x_spam = counts["x_posts"]
    assert 300 < x_spam < 575 - 200 + 100 and x_total < 4281 - 74 - 400


@real
def test_real_sms_2022_keeps_only_rows_new_to_the_uci_collection():
    loc = platforms.locator(_SETTINGS, download=False)
    regs, stats = platforms.load_registers(loc, data.normalise, [e.text for e in data.load_sms()], ["sms_2022"])
    uci = stats["sms_2022"]["uci"]
    assert uci["in_known_exact"] > 4000 and uci["in_known_near"] > 0 and uci["kept"] == len(regs["sms_2022"]) < 1500
    known = {data.normalise(e.text) for e in data.load_sms()}
    assert not any(data.normalise(t) in known for t, _ in regs["sms_2022"])


# ---------------------------------------------------------------- the fixed held-out split


def test_side_is_a_fixed_function_of_the_normalised_text():
    assert platforms.side_of("free entry") == platforms.side_of("free entry")
    sides = [platforms.side_of(f"text {i}") for i in range(4000)]
    shares = {s: sides.count(s) / len(sides) for s in platforms.SIDES}
    assert abs(shares["train"] - 0.70) < 0.03 and abs(shares["test"] - 0.15) < 0.03


def test_near_twins_and_copies_across_sets_share_one_cluster():
    texts = ["Check out my channel for free gift cards now", "check out my channel for FREE gift cards now!!",
             "check out my channel for free gift cards", "totally unrelated sentence about lunch"]
    c = platforms.clusters(texts, data.normalise)
    assert c[0] == c[1] == c[2] != c[3]
    assert c[0] == min(data.normalise(t) for t in texts[:3])
    assert platforms.clusters(list(reversed(texts)), data.normalise) == list(reversed(c))  # order-free


def _find_text_on(side: str, n: int = 1) -> list[str]:
    out = [f"plain sentence number {w} about weather" for w in ("one two three four five six seven eight nine ten "
                                                              "eleven twelve thirteen fourteen fifteen").split()]
    return [t for t in out if platforms.side_of(data.normalise(t)) == side][:n]


def test_held_out_registers_go_to_test_but_twins_of_trained_texts_are_dropped():
    trained = _find_text_on("train")[0]
    regs = {"youtube": [(trained, 1), ("Subscribe to my channel please", 1)],
            "airline": [(trained.upper() + "!", 0), ("@united my bag is lost", 0)]}
    rows, stats = platforms.assign_sides(regs, data.normalise, trainable={"youtube"})
    airline = [r for r in rows if r.register == "airline"]
    assert [r.text for r in airline] == ["@united my bag is lost"] and airline[0].side == "test"
    assert stats["airline"]["twin_of_trained_dropped"] == 1
    yt = {r.text: r.side for r in rows if r.register == "youtube"}
    assert yt[trained] == "train"


def test_a_twin_in_another_trainable_set_lands_on_the_same_side():
    regs = {"youtube": [("Check out my channel for free gift cards now", 1)],
            "instagram": [("check out my channel for free gift cards now!", 1)],
            "x_posts": [("check out my new channel for free gift cards now", 1)]}
    rows, _ = platforms.assign_sides(regs, data.normalise, trainable=set(regs))
    assert len({r.side for r in rows}) == 1


def test_fixed_sample_does_not_pick_a_side():
    def letters(i: int) -> str:  # digits normalise away
        return "".join(chr(97 + int(d)) for d in str(i))

    pairs = [(f"tweet {letters(i)} about nothing", 0) for i in range(3000)]
    kept = platforms.fixed_sample(pairs, 1000, data.normalise)
    assert len(kept) == 1000 and kept == platforms.fixed_sample(list(pairs), 1000, data.normalise)
    sides = [platforms.side_of(data.normalise(t)) for t, _ in kept]
    assert 0.6 < sides.count("train") / 1000 < 0.8


@real
def test_real_split_is_fixed_and_no_held_out_text_has_a_twin_in_training():
    loc = platforms.locator(_SETTINGS, download=False)
    regs, _ = platforms.load_registers(loc, data.normalise, [e.text for e in data.load_sms()])
    trainable = {c.register for c in platforms.CORPORA if c.trainable}
    rows, stats = platforms.assign_sides(regs, data.normalise, trainable)
    # the split is a function of the texts alone: these counts change only with the data or SPLIT_SALT
    assert {r: (s["train"], s["validation"], s["test"]) for r, s in stats.items()} == {
        "airline": (0, 0, 3000), "instagram": (2060, 439, 447), "phishing_pot": (0, 0, 1331),
        "reviews": (2074, 431, 467), "sms_2022": (739, 154, 147), "tweeteval": (2082, 457, 461),
        "x_posts": (2468, 487, 566), "youtube": (1131, 217, 252)}
    train = [r.text for r in rows if r.side == "train"]
    keys = {data.normalise(t) for t in train}
    index = platforms.NearIndex([platforms.words(t) for t in train])
    held = [r.text for r in rows if r.side == "test"]
    assert not [t for t in held if data.normalise(t) in keys or index.matches(platforms.words(t))]


# ---------------------------------------------------------------- training beside the old corpora


def test_platform_rows_join_the_corpus_on_their_own_sides():
    from modpipe.textmodel.data import Example, add_platforms

    splits = {"train": [Example("old sms text", 0, "sms")], "validation": [], "test": []}
    rows = [platforms.Row("win a prize now", 1, "youtube", "train"),
            platforms.Row("OLD SMS text!", 0, "tweeteval", "train"),  # already in the corpus
            platforms.Row("my bag is lost", 0, "airline", "test"),
            platforms.Row("invest with me", 1, "instagram", "validation"),
            platforms.Row("dm me", 1, "instagram", "test")]
    added = add_platforms(splits, rows, leave_out=frozenset({"instagram"}))
    assert [e.dataset for e in splits["train"]] == ["sms", "youtube"]
    assert [(e.text, e.dataset) for e in splits["test"]] == [("my bag is lost", "airline"), ("dm me", "instagram")]
    assert splits["validation"] == []
    assert added["tweeteval"]["in_corpus_dropped"] == 1 and added["instagram"]["left_out"] == 1


def test_platform_report_scores_recall_and_flagged_against_targets_and_baseline():
    import numpy as np

    from modpipe.textmodel import platform_report

    regs = ["youtube"] * 4 + ["tweeteval"] * 4
    labels = np.array([1, 1, 0, 0, 0, 0, 0, 0])
    model = np.array([0.9, 0.95, 0.1, 0.2, 0.1, 0.6, 0.1, 0.1])
    baseline = np.array([1.0, -1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0])
    out = platform_report.score(regs, labels, model, baseline)
    assert out["youtube"]["recall"] == {"model": 1.0, "baseline": 0.5}
    assert out["youtube"]["targets"] == {"recall": True, "flagged": True}
    assert out["tweeteval"]["flagged"] == {"model": 0.25, "baseline": 0.5}
    assert out["tweeteval"]["targets"] == {"flagged": False}  # 25% > 2%, though under the baseline


def test_card_lists_every_platform_corpus_with_its_licence_and_rows():
    from modpipe.textmodel import card

    summary = {"leave_out": ["x_posts"], "registers": {
        "youtube": {"read": 10, "kept": 9, "added": {"train": 6, "validation": 1, "test": 2}},
        "airline": {"read": 5, "kept": 5, "added": {"train": 0, "validation": 0, "test": 5}},
        "x_posts": {"read": 4, "kept": 4, "added": {"train": 0, "validation": 0, "test": 1}}}}
    doc = card.platform_rows_doc(summary)
    assert doc["youtube"]["license"] == "CC-BY-4.0" and doc["youtube"]["train"] == 6
    assert doc["airline"]["use"].startswith("eval only") and doc["airline"]["license"] == "CC-BY-NC-SA-4.0"
    assert doc["x_posts"]["use"].startswith("left out")
    rows = card._platform_rows({"platforms": doc})
    assert rows.count("\n") == 3 and "trained 6, validation 1, test 2" in rows and "CC-BY-NC-SA-4.0" in rows


def test_build_refuses_leave_out_without_platforms(capsys):
    from modpipe.cli import main

    assert main(["model", "build", "--no-platforms", "--leave-out", "youtube"]) == 2
    assert "--leave-out needs the platforms" in capsys.readouterr().err
    assert main(["model", "build", "--leave-out", "myspace"]) == 2
    assert "--leave-out needs the platforms and a register of" in capsys.readouterr().err
