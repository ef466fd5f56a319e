"""Build cache: key stability and sensitivity, reuse of complete builds, atomic links, CLI wiring."""

import json

import pytest

from modpipe.settings import Settings
from modpipe.textmodel import build as B
from modpipe.textmodel import convert, data

KEY_ARGS = dict(sources="s" * 64, profile=B.PROFILES["full"].to_dict(), seed=0,
                data={"sms": "a" * 64, "spamassassin": "b" * 64}, base="c" * 64)


def test_cache_key_is_stable():
    assert B.cache_key(**KEY_ARGS) == B.cache_key(**json.loads(json.dumps(KEY_ARGS)))
    assert len(B.cache_key(**KEY_ARGS)) == 16
    assert B.source_hash() == B.source_hash()


@pytest.mark.parametrize("change", [
    {"sources": "t" * 64},
    {"profile": B.PROFILES["demo"].to_dict()},
    {"seed": 1},
    {"data": {"sms": "a" * 64, "spamassassin": "d" * 64}},
    {"base": "e" * 64},
    {"device": "cuda"},
])
def test_cache_key_changes_with_each_input(change):
    assert B.cache_key(**{**KEY_ARGS, **change}) != B.cache_key(**KEY_ARGS)


@pytest.mark.parametrize("name", ["full", "demo"])
def test_cpu_profiles_are_one_recipe_on_every_cpu(name):
    profile = B.PROFILES[name]
    # issue #13: the step budget ends a build; bf16 autocast only where a CPU has it made other weights, and a
    # wall-clock cap ended the demo build at 67 of its 90 steps on a slow CPU
    assert not profile.train.bf16
    assert profile.train.max_train_seconds >= 90 * 60  # a safety net outside CI's whole budget, never the end
    assert profile.train.max_train_seconds + profile.post_train_reserve_s <= profile.build_budget_s
    assert B.PROFILES["full"].train.max_seq_len == 128 and B.PROFILES["demo"].train.max_seq_len == 64


def test_gpu_profile_reads_longer_texts_and_trains_the_embeddings():
    gpu, full = B.PROFILES["gpu"], B.PROFILES["full"]
    assert gpu.train.max_seq_len == 512 and not gpu.train.freeze_word_embeddings
    assert gpu.train.epochs > full.train.epochs
    assert B.link_name("gpu") == "current-gpu" and B.link_name("full") == "current"


def test_gpu_profile_on_a_machine_without_gpu_needs_the_cpu_asked_for(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(B.BuildError, match="--device cpu"):
        B.resolve_device("auto", "gpu")
    with pytest.raises(B.BuildError, match="no CUDA device"):
        B.resolve_device("cuda", "full")
    with pytest.raises(B.BuildError, match="unknown device"):
        B.resolve_device("tpu", "full")
    assert B.resolve_device("cpu", "gpu") == "cpu"
    assert B.resolve_device("auto", "full") == "cpu"


def test_every_profile_trains_on_todays_platforms_and_the_flag_builds_without_them(tmp_path, monkeypatch):
    """The platform corpora are part of every recipe (and its key); `--no-platforms` is another key, and
    `--leave-out` without the platforms is refused before any work."""
    assert all(p.platforms for p in B.PROFILES.values())
    without = B.PROFILES["full"].to_dict() | {"platforms": False}
    assert B.cache_key(**{**KEY_ARGS, "profile": without}) != B.cache_key(**KEY_ARGS)
    settings = Settings.from_env({}, cache_dir=tmp_path / "cache")
    with pytest.raises(B.BuildError, match="needs a build with the platforms"):
        B.build(settings, "demo", platforms=False, leave_out=("youtube",))


def test_the_full_recipe_sees_every_email_once_and_fits_the_ci_budget():
    """SpamAssassin's e-mails at 128 tokens cost most of a step budget: the full recipe reads each once per epoch,
    for one epoch (SMS, short and cheap, three times); CI's whole run has 60 minutes on a 2-core CPU."""
    full = B.PROFILES["full"].train
    assert full.epochs == 1.0 and full.oversample == {"sms": 3}
    assert full.max_seq_len == 128 and full.batch_size == 32


def _fake_inputs(tmp_path, monkeypatch):
    sms = tmp_path / "sms.csv"
    sms.write_text("ham\thello\nspam\twin now\n")
    sa = tmp_path / "sa.tgz"
    sa.write_bytes(b"not really a tarball")
    monkeypatch.setattr(data, "data_files", lambda cache_dir, extra=None: {
        "sms": sms, "spamassassin": sa, **({"extra": extra} if extra else {})})
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    (base / "vocab.txt").write_text("[PAD]\n")
    return {"sms": data.file_sha256(sms), "spamassassin": data.file_sha256(sa)}, base


class _PresentCorpora:
    """A locator whose every platform corpus is present (the key holds their pinned digest, not the files)."""

    def files(self, corpus):
        return {}


def _fake_complete(path):
    path.mkdir(parents=True)
    for name in B.COMPLETE_FILES:
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text("{}")


def test_complete_build_with_same_key_is_reused(tmp_path, monkeypatch, capsys):
    from modpipe.textmodel import platforms

    hashes, base = _fake_inputs(tmp_path, monkeypatch)
    monkeypatch.setattr(platforms, "locator", lambda settings: _PresentCorpora())
    hashes["platforms"] = platforms.pinned_digest()
    settings = Settings.from_env({}, cache_dir=tmp_path / "cache")
    key = B.cache_key(sources=B.source_hash(), profile=B.PROFILES["demo"].to_dict(), seed=3, data=hashes,
                      base=convert.hash_dir(base))
    root = tmp_path / "cache" / "models"
    _fake_complete(root / key)

    def boom(*a, **k):
        raise AssertionError("must not build")

    monkeypatch.setattr(B, "_build_into", boom)
    got = B.build(settings, "demo", base=base, seed=3)
    assert got == root / key
    assert (root / "current-demo").resolve() == (root / key).resolve()
    assert "reusing cached build" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="must not build"):  # another seed is another key
        B.build(settings, "demo", base=base, seed=4)
    with pytest.raises(AssertionError, match="must not build"):  # so is the recipe without the platforms
        B.build(settings, "demo", base=base, seed=3, platforms=False)
    extra = tmp_path / "labels.jsonl"
    extra.write_text('{"text": "win now", "label": "spam"}\n{"text": "hi", "label": "ham"}\n')
    with pytest.raises(AssertionError, match="must not build"):  # the platform's texts are another key
        B.build(settings, "demo", base=base, seed=3, extra=extra)
    extra.write_text('{"text": "win now", "label": "spam"}\n')
    with pytest.raises(data.ExtraDataError, match="same label"):  # checked before any work
        B.build(settings, "demo", base=base, seed=3, extra=extra)
    assert not list(root.glob(".tmp-*")), "failed builds leave no temp dir"


def test_reuse_any_takes_an_existing_full_build(tmp_path, monkeypatch, capsys):
    settings = Settings.from_env({}, cache_dir=tmp_path / "cache")
    root = tmp_path / "cache" / "models"
    _fake_complete(root / "0123456789abcdef")
    B.point_link(root, "current", root / "0123456789abcdef")
    monkeypatch.setattr(data, "data_files", lambda cache_dir: pytest.fail("must not touch data"))
    got = B.build(settings, "demo", reuse_any=True)
    assert got == (root / "0123456789abcdef").resolve()
    assert "--reuse-any" in capsys.readouterr().out


def test_incomplete_build_is_not_complete(tmp_path):
    _fake_complete(tmp_path / "b")
    assert B.is_complete(tmp_path / "b")
    (tmp_path / "b" / B.BUILD_MARKER).unlink()
    assert not B.is_complete(tmp_path / "b")


def test_point_link_replaces_atomically(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    B.point_link(tmp_path, "current", tmp_path / "one")
    B.point_link(tmp_path, "current", tmp_path / "two")
    assert (tmp_path / "current").resolve() == (tmp_path / "two").resolve()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_cli_help(capsys):
    from modpipe.cli import build_parser

    parser = build_parser()
    for argv in (["model", "--help"], ["model", "build", "--help"], ["model", "eval", "--help"]):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(argv)
        assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--reuse-any" in out and "--profile" in out and "--model-dir" in out and "--json" in out


def test_extra_data_trains_the_extra_set_more_often_and_changes_the_key():
    from modpipe.textmodel.build import PROFILES, with_extra

    full = PROFILES["full"]
    extra = with_extra(full, 3)
    assert extra.train.oversample == {**full.train.oversample, "extra": 3}
    assert "extra" not in full.train.oversample  # the plain recipe (and its key) is untouched
    assert extra.to_dict() != full.to_dict()


def _metrics(fp: int, fn: int, f1: float) -> dict:
    return {"f1": f1, "confusion": {"tn": 100, "fp": fp, "fn": fn, "tp": 50}}


def test_int8_is_kept_within_one_extra_error_a_data_set_and_the_f1_tolerance_over_all():
    fp32 = {"sms": _metrics(2, 4, 0.936), "spamassassin": _metrics(3, 3, 0.987), "all": _metrics(5, 7, 0.9456)}
    # one SMS message more misclassified: F1 there drops 0.007, over all 0.0017
    int8 = {"sms": _metrics(2, 5, 0.929), "spamassassin": _metrics(3, 3, 0.987), "all": _metrics(5, 8, 0.9439)}
    kept, drops, extra = B.int8_keeps_accuracy(fp32, int8)
    assert kept and drops == {"sms": 0.007, "spamassassin": 0.0, "all": 0.0017}
    assert extra == {"sms": 1, "spamassassin": 0}
    # two more on one data set: refused, whatever the F1 over all
    int8["sms"] = _metrics(3, 5, 0.922)
    assert not B.int8_keeps_accuracy(fp32, int8)[0]
    # within a text everywhere, but F1 over all drops by more than the tolerance: refused
    int8 = {"sms": _metrics(2, 5, 0.929), "spamassassin": _metrics(4, 3, 0.984), "all": _metrics(6, 8, 0.9420)}
    kept, drops, extra = B.int8_keeps_accuracy(fp32, int8)
    assert not kept and extra == {"sms": 1, "spamassassin": 1} and drops["all"] > B.INT8_MAX_F1_DROP
    # fewer errors than fp32 is never a reason to refuse
    better = {"sms": _metrics(1, 3, 0.95), "spamassassin": _metrics(3, 3, 0.987), "all": _metrics(4, 6, 0.955)}
    assert B.int8_keeps_accuracy(fp32, better) == (True, {"sms": -0.014, "spamassassin": 0.0, "all": -0.0094},
                                                        {"sms": -2, "spamassassin": 0})


def test_the_int8_refusal_names_only_the_limit_that_failed():
    # the headlines build's case: overall F1 rose, one data set lost 3 more texts
    drops, extra = {"sms": -0.01, "spamassassin": 0.006, "all": -0.001}, {"sms": -2, "spamassassin": 3}
    assert B.int8_failed_limits(drops, extra) == [
        f"errors beyond fp32's {{'spamassassin': 3}}, more than {B.INT8_MAX_EXTRA_ERRORS} a data set"]
    drops, extra = {"sms": 0.003, "spamassassin": 0.003, "all": 0.003}, {"sms": 1, "spamassassin": 1}
    assert B.int8_failed_limits(drops, extra) == [f"spam F1 over all drops 0.003, more than {B.INT8_MAX_F1_DROP}"]
    assert len(B.int8_failed_limits(drops, {"sms": 2, "spamassassin": 0})) == 2
    assert B.int8_failed_limits({"all": 0.0}, {"sms": 1}) == []


def test_robustness_before_compares_the_data_sets_tested_alike(monkeypatch, tmp_path):
    """`--before` compares two builds on the test texts they share: a data set's texts count when they are the
    same in both builds, whatever order each build wrote them in; a data set only one build tests, or tests on
    other texts, is left out; builds that share none are refused."""
    import argparse

    from modpipe.textmodel import cli, robustness

    sms = [data.Example(f"text {i}", i % 2, "sms") for i in range(6)]
    extra = [data.Example(f"headline {i}", 0, "headlines") for i in range(3)]
    tests = {"new": sms + extra, "reordered": sms[::-1], "other": sms[:5]}
    for name, examples in tests.items():
        (tmp_path / name).mkdir()
        data.write_jsonl(tmp_path / name / "heldout.jsonl", examples)
    monkeypatch.setattr(cli, "artifacts_build", lambda path: type("Build", (), {"path": path})())
    monkeypatch.setattr(cli, "build_splits", lambda path, settings: (sms, tests[path.name]))
    reports = []
    monkeypatch.setattr(robustness, "report", lambda build, train, test, seed, rate, before: reports.append(test) or
                        {"model": {"worst_gap": 0.0}, "targets": {"met": True}})
    args = lambda before: argparse.Namespace(model_dir=tmp_path / "new", before=tmp_path / before,  # noqa: E731
                                             attack_seed=None, attack_rate=None, json=True)
    assert cli._eval_robustness(args("reordered"), Settings.from_env()) == 0 and reports == [sms]
    assert cli._eval_robustness(args("other"), Settings.from_env()) == 2 and len(reports) == 1
    assert data.shared_datasets(sms + extra, sms[::-1] + extra[:2]) == {"sms"}


def test_robustness_attacks_only_the_data_sets_a_build_trains_on(monkeypatch):
    """The registers held out whole for their licence (phishing e-mail, airline tweets) are not attacked: no build
    learns them, and their 4,331 texts would double the report's cost."""
    from modpipe.textmodel import robustness

    test = [data.Example(f"text {i}", i % 2, ds) for i in range(4) for ds in ("sms", "phishing_pot", "airline")]
    seen = []
    monkeypatch.setattr(robustness, "model_report", lambda build, t, sets: seen.append(t) or {"worst_gap": 0.0})
    monkeypatch.setattr(robustness, "baseline_report", lambda train, t, sets: {})
    robustness.report(None, [], test)
    assert [{e.dataset for e in t} for t in seen] == [{"sms"}]
