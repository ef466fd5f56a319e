"""E-mail reduction, near-duplicate removal and the seeded stratified split."""

import io
import tarfile
from email.message import EmailMessage

from modpipe.textmodel import data
from modpipe.textmodel.data import Example


def _plain_mail() -> bytes:
    msg = EmailMessage()
    msg["From"] = "alice@example.org"
    msg["To"] = "bob@example.org"
    msg["Subject"] = "Lunch on Friday?"
    msg["Received"] = "from mx.example.org by localhost"
    msg.set_content("Hi Bob,\n\nare we still on   for lunch?\n\nAlice")
    return msg.as_bytes()


def test_reduce_plain_mail_keeps_subject_and_body_drops_headers():
    text = data.reduce_email(_plain_mail())
    assert text.startswith("Lunch on Friday?\n")
    assert "are we still on for lunch?" in text
    assert "alice@example.org" not in text and "Received" not in text and "mx.example.org" not in text


def test_reduce_html_only_mail_strips_tags_scripts_and_entities():
    msg = EmailMessage()
    msg["Subject"] = "WIN BIG"
    msg.set_content("<html><head><style>p{color:red}</style></head><body><p>Click&nbsp;<a href='http://x.y'>"
                    "here</a> &amp; win</p><script>var a=1;</script></body></html>", subtype="html")
    text = data.reduce_email(msg.as_bytes())
    assert text.splitlines()[0] == "WIN BIG"
    assert "Click" in text and "here" in text and "& win" in text
    assert "<" not in text and "color:red" not in text and "var a" not in text


def test_reduce_multipart_prefers_plain_and_skips_attachments():
    msg = EmailMessage()
    msg["Subject"] = "report"
    msg.set_content("plain body text")
    msg.add_alternative("<p>html body text</p>", subtype="html")
    msg.add_attachment(b"ATTACHMENTBYTES", maintype="application", subtype="octet-stream", filename="a.bin")
    text = data.reduce_email(msg.as_bytes())
    assert "plain body text" in text
    assert "html body text" not in text
    assert "ATTACHMENT" not in text


def test_reduce_survives_unknown_charset():
    raw = (b"Subject: hello\nContent-Type: text/plain; charset=x-unknown-charset\n\n"
           b"caf\xe9 body\n")
    text = data.reduce_email(raw)
    assert text.startswith("hello") and "body" in text


def test_load_spamassassin_reads_the_npm_layout(tmp_path):
    tgz = tmp_path / "sa.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        for name, body in [("package/data/spam-1/00001.abc.txt", b"Subject: cheap pills\n\nbuy now"),
                           ("package/data/easy-ham-1/00001.def.txt", b"Subject: meeting\n\nsee you at 3"),
                           ("package/data/easy-ham-1/00001.def.json", b"{}"),
                           ("package/README.md", b"readme")]:
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    exs = data.load_spamassassin(tgz)
    assert sorted((e.label, e.text) for e in exs) == [(0, "meeting\nsee you at 3"), (1, "cheap pills\nbuy now")]
    assert {e.dataset for e in exs} == {"spamassassin"}


def test_near_duplicates_collapse():
    a = Example("WINNER!! Call 09061701461 now to claim your prize http://win.example.com/a1", 1, "sms")
    b = Example("winner  call 09061701999 NOW to claim your prize   http://other.example/zz!", 1, "sms")
    c = Example("Winner: call 0800 now, to claim your prize www.prize.example", 1, "sms")
    d = Example("see you at the cinema", 0, "sms")
    kept, stats = data.dedup([a, b, c, d])
    assert kept == [a, d]
    assert stats["duplicates_removed"] == 2


def test_conflicting_labels_are_dropped():
    kept, stats = data.dedup([Example("ok see you", 0, "sms"), Example("OK, see you!", 1, "sms"),
                              Example("hello", 0, "sms")])
    assert [e.text for e in kept] == ["hello"]
    assert stats["label_conflicts_dropped"] == 1


def _corpus(n=400):
    out = []
    for i in range(n):
        ds = "sms" if i % 2 else "spamassassin"
        label = int(i % 5 == 0)
        out.append(Example(f"text number {'abcdefghij'[i % 10]} {' '.join('xyz'[j % 3] * (j + 1) for j in range(i % 7))}"
                           f" word{'q' * (i // 10)}", label, ds))
    kept, _ = data.dedup(out)
    return kept


def test_split_is_reproducible_and_leak_free():
    exs = _corpus()
    s1 = data.split(exs, seed=7)
    s2 = data.split(list(reversed(exs)), seed=7)  # input order does not matter
    assert {k: [e.key for e in v] for k, v in s1.items()} == {k: [e.key for e in v] for k, v in s2.items()}
    keys = [set(e.key for e in s1[s]) for s in data.SPLITS]
    assert not (keys[0] & keys[1]) and not (keys[0] & keys[2]) and not (keys[1] & keys[2])
    assert sum(len(v) for v in s1.values()) == len(exs)
    s3 = data.split(exs, seed=8)
    assert [e.key for e in s3["test"]] != [e.key for e in s1["test"]]


def test_split_is_stratified_70_15_15():
    exs = _corpus()
    s = data.split(exs, seed=0)
    for ds in ("sms", "spamassassin"):
        for label in (0, 1):
            n = sum(1 for e in exs if e.dataset == ds and e.label == label)
            n_test = sum(1 for e in s["test"] if e.dataset == ds and e.label == label)
            n_val = sum(1 for e in s["validation"] if e.dataset == ds and e.label == label)
            assert abs(n_test - 0.15 * n) <= 1 and abs(n_val - 0.15 * n) <= 1


def test_split_summary_hashes_identify_the_split():
    exs = _corpus()
    s = data.split(exs, seed=0)
    summary = data.split_summary(s, 0, {"input": len(exs)})
    assert summary["sha256"]["test"] == data.split_hash(s["test"])
    assert summary["sizes"]["train"]["total"] == len(s["train"])
    assert len(set(summary["sha256"].values())) == 3


def test_jsonl_roundtrip_with_odd_line_separators(tmp_path):
    exs = [Example("line\u2028separator and \u0085 next-line", 1, "sms"), Example("plain", 0, "spamassassin")]
    data.write_jsonl(tmp_path / "x.jsonl", exs)
    assert data.read_jsonl(tmp_path / "x.jsonl") == exs
    # the artifacts contract reads heldout.jsonl with str.splitlines(): each record must stay on one line
    assert len((tmp_path / "x.jsonl").read_text().splitlines()) == 2


def test_extra_data_reads_text_and_label_in_every_spelling(tmp_path):
    path = tmp_path / "labels.jsonl"
    path.write_text('{"text": "Free phone, reply YES", "label": "spam", "post_id": "p1"}\n\n'
                    '{"text": "  see you at  noon ", "label": "HAM"}\n{"text": "win big", "label": 1}\n'
                    '{"text": "lunch?", "label": false}\n', encoding="utf-8")
    got = data.load_extra(path)
    assert [(e.text, e.label, e.dataset) for e in got] == [
        ("Free phone, reply YES", 1, "extra"), ("see you at noon", 0, "extra"), ("win big", 1, "extra"),
        ("lunch?", 0, "extra")]


def test_extra_data_errors_name_the_line(tmp_path):
    import pytest

    cases = {
        '{"text": "a", "label": "spam"}\nnot json\n': ":2: not JSON",
        '{"text": "", "label": "spam"}\n': ":1: text missing or empty",
        '{"text": "a", "label": "maybe"}\n': ":1: label 'maybe' is not spam/ham",
        '["a", "spam"]\n': ":1: expected an object",
        '{"text": "a", "label": "spam"}\n{"text": "b", "label": "spam"}\n': "same label",
        "\n": "no labelled texts",
    }
    for n, (content, message) in enumerate(cases.items()):
        path = tmp_path / f"bad{n}.jsonl"
        path.write_text(content, encoding="utf-8")
        with pytest.raises(data.ExtraDataError, match=message.replace("?", r"\?")):
            data.load_extra(path)
    with pytest.raises(data.ExtraDataError, match="cannot read"):
        data.load_extra(tmp_path / "missing.jsonl")


def test_the_platforms_label_beats_a_public_copy_of_its_text():
    public = [Example("Call 0800 123 now to claim", 1, "sms"), Example("see you later", 0, "sms")]
    extra = [Example("call 0900 555 NOW to claim!", 0, "extra")]  # the same text once normalised, labelled ham
    merged, dropped = data.prefer_extra(public, extra)
    kept, stats = data.dedup(merged)
    assert dropped == 1 and stats["label_conflicts_dropped"] == 0
    assert sorted((e.dataset, e.label) for e in kept) == [("extra", 0), ("sms", 0)]
