"""Labelled text of today's platforms: eight public corpora named by repository, commit, path and sha256.

The project never holds a copy. Each file is read from a local copy (MODPIPE_CORPORA_DIR, or
`../shared/corpora` beside the repository's root when that setting is empty), else from
`$MODPIPE_CACHE_DIR/corpora/`, where a machine that reaches GitHub downloads it once from the pinned commit
(raw.githubusercontent.com); every file is checked against the sha256 pinned here before it is read, and a
missing or different file is an error that names it and every place looked.

Registers (one data set each; `Corpus.trainable` says which licences allow training a model any platform may
run: CC-BY, MIT, none stated; the non-commercial ones are evaluated only):

- youtube: YouTube comments 2013-15, spam (self-promotion) and ordinary (CC-BY-4.0)
- instagram: Instagram comments under finance posts 2023, investment/crypto scams and ordinary (MIT)
- x_posts: X posts 2026, scam/phishing-type labels vs clean or topic-only; promotion-only rows, rows with
  placeholder provenance and "@bankrbot deploy" token requests (labelled scam, not scam text) left out (MIT)
- sms_2022: SMS smishing/spam/ham of 2022, only the rows that are neither in the UCI SMS collection the build
  already trains on nor a near twin of one (word-set Jaccard >= 0.7) (CC-BY-4.0, unverified)
- phishing_pot: phishing e-mail 2023-26, subject + body (CC-BY-NC-4.0: evaluation only)
- tweeteval: ordinary tweets (no spam labels; ham) (none stated)
- airline: customers' tweets at airlines 2015, latin-1 (CC-BY-NC-SA-4.0: evaluation only)
- reviews: Amazon / Yelp / IMDb review sentences (ham) (CC-BY-4.0)
"""

from __future__ import annotations

import csv
import hashlib
import html
import io
import json
import math
import os
import re
import urllib.request
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from modpipe import log
from modpipe.textmodel.mail import MAX_TEXT_CHARS, clean_text, reduce_email

_log = log.get(__name__)
csv.field_size_limit(1 << 27)

SIDES = ("train", "validation", "test")
SIDE_SHARES = (0.70, 0.15, 0.15)
SPLIT_SALT = "platforms-split-v1"  # a new salt is a new split (and sample): numbers measured on the old are void

RAW_URL = "https://raw.githubusercontent.com/{repository}/{commit}/{path}"
DOWNLOAD_TIMEOUT_S = 120


@dataclass(frozen=True)
class CorpusFile:
    path: str  # inside the corpus's folder of the local copy (and of the download cache)
    sha256: str
    source_path: str = ""  # inside the source repository at the commit; default: `path`
    archive: str = ""  # source path of a zip in the repository that holds the file (as `path`'s name)

    @property
    def in_repository(self) -> str:
        return self.source_path or self.path


@dataclass(frozen=True)
class Corpus:
    folder: str  # its folder in the local copy
    register: str  # the data set name its texts carry
    repository: str  # GitHub owner/name
    commit: str
    license: str  # SPDX
    trainable: bool  # the licence allows training a model any platform may run
    files: tuple[CorpusFile, ...]
    description: str = ""
    # a set of many files pinned by one digest: sha256 over "<sha256>  <path>\n" lines sorted by path
    members: tuple[str, ...] = ()
    members_sha256: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def url(self) -> str:
        return f"https://github.com/{self.repository}/tree/{self.commit}"


# phishing_pot: email/sample-N.eml for N a multiple of 5 up to 7910, but those whose blob is over 100 kB or
# missing from the snapshot the copy was taken from (this list), 1,483 files.
_PHISHING_POT_LEFT_OUT = frozenset((
    120, 185, 190, 310, 350, 405, 505, 585, 630, 670, 700, 705, 725, 730, 735, 780, 785, 800, 815, 820, 925, 1000,
    1005, 1075, 1135, 1245, 1250, 1340, 1345, 1405, 1530, 1845, 1880, 1910, 1920, 1935, 1970, 1975, 1980, 2025, 2030,
    2055, 2110, 2115, 2145, 2165, 2200, 2280, 2285, 2310, 2360, 2365, 2415, 2545, 2555, 2575, 2580, 2595, 2600, 2605,
    2610, 2630, 2635, 2675, 2685, 2705, 2710, 2725, 2735, 2740, 2745, 2755, 2800, 2815, 2845, 3050, 3100, 3140, 3375,
    4010, 4205, 4630, 4635, 4655, 5300, 5845, 6005, 6030, 6160, 6230, 6260, 6370, 6390, 6445, 6560, 6570, 6615, 6930,
    6985))
PHISHING_POT_EMAILS = tuple(f"email/sample-{n}.eml" for n in range(5, 7911, 5) if n not in _PHISHING_POT_LEFT_OUT)

_YT = "YouTube-Spam-Collection-v1"
_TE = "datasets"

CORPORA: tuple[Corpus, ...] = (
    Corpus("youtube-spam-collection", "youtube", "aidenerdogan/Data-Science-and-Machine-Learning-Tutorial",
           "679aca85cc098e1f04911cb3255c7d37715ba895", "CC-BY-4.0", True, tuple(
               CorpusFile(f"{_YT}/{name}", sha, archive=f"{_YT}.zip") for name, sha in (
                   ("Youtube01-Psy.csv", "19797e6c77690e3c8809cfd2853ae7341390636367ba66cf5d4f4083f0b88535"),
                   ("Youtube02-KatyPerry.csv", "902c614f8ef24f987d6f614d7e6111aa5160b89a0646b68e007bd6044a3d123b"),
                   ("Youtube03-LMFAO.csv", "702ef589860a1831956f527760a3d9737ef8a07ab36c7de35b92b8898b8c3928"),
                   ("Youtube04-Eminem.csv", "92f54eb6b22fdf3b7ae85e1f500e5aa7442edd025e504b988a97078756187e76"),
                   ("Youtube05-Shakira.csv", "1d8ab47b71e8037c51183b2fc62f0591a48a4b54f3a4f5d9d3043113b274e98e"))),
           "YouTube comments 2013-15 (TubeSpam, Alberto et al. 2015)"),
    Corpus("instagram-scamspot-2023", "instagram", "ScamSpot/scamspot_ml-models",
           "398eb6a4e9e43d55590f80bada254ad979806038", "MIT", True, (
               CorpusFile("comments-rating.csv", "c9cf8b6dd0d16d3bc7941d19a323677bc4ecff619ca5161127356e629f7796a6",
                          "dataset/comments-rating.csv"),
               CorpusFile("LICENSE", "e6470d81b82844cc7404ba2f051690d4929f82655c076aff03538c83c6abd09b")),
           "Instagram comments under finance posts, 2023 (ScamSpot, Erben 2023)"),
    Corpus("x-crypto-scam-janitr-2026", "x_posts", "janitrai/janitr", "a5b1e746e8826ffd800725536c782abc61818455",
           "MIT", True, (
               CorpusFile("sample.jsonl", "831bfb27b35776133ef1af67a61253251c8849c74c836e05e446217538b1d26d",
                          "data/sample.jsonl"),
               CorpusFile("LICENSE", "f9ec3649b78dac995d496c7417d6ebc2f63510c39f289eba774347fdd2fac02a")),
           "X posts 2026, scam/phishing vs clean (Janitr)"),
    Corpus("sms-phishing-mishra-soni-2022", "sms_2022", "MarazMia/SMISH_DT", "7e4b3ef14ae219434dfd49e26e0743721d03674f",
           "CC-BY-4.0", True, (
               CorpusFile("Mendeley_Dataset_5971.csv", "649844f1c62a6b27e145eaf17a65f7010c56c390e11a794ea8329993a05ba71e",
                          "Dataset/Mendeley_Dataset_5971.csv"),),
           "SMS smishing/spam/ham 2022 (Mishra & Soni), rows new to the UCI collection",
           notes=("licence per the Mendeley Data record, unverified",)),
    Corpus("phishing-pot-2023-2026-subset", "phishing_pot", "rf-peixoto/phishing_pot",
           "8e207b5f465bf72c2326551b1a9b2ba67f3b4ef6", "CC-BY-NC-4.0", False, (
               CorpusFile("LICENSE", "41003d4a74749c0220e33dd415042164b5a1093ed401f36277234f772d22d3d0"),),
           "phishing e-mail 2023-26 from honeypots (Phishing Pot), subject + body",
           members=PHISHING_POT_EMAILS,
           members_sha256="731b949f312e2183c1adb1a90a36a7f2113cafbd91d8819b6a34eee9406487cf"),
    Corpus("tweeteval", "tweeteval", "cardiffnlp/tweeteval", "4fbd22cd78421f05b1ecdb4fc5725bc7a7bd8f66",
           "NOASSERTION", True, tuple(CorpusFile(f"{_TE}/{p}", sha) for p, sha in (
               ("emotion/test_text.txt", "7e1070f5d3e3fcece5bc73680bff9981e90d8f7b2f1009bfe7a01d059d1c6091"),
               ("emotion/train_text.txt", "2c62f67aeb3eac1aea0e5a9c3d0f4bc337992581f3f858061786a1fb4d79d95e"),
               ("emotion/val_text.txt", "e2e30c86b8cbb97944d6543aedc06eace3bb275cb2f381aba787b838b4f23ca5"),
               ("irony/test_text.txt", "53103da934a7308eee82f05f2a9781a8ea3e88604fdc1e02d3101108505c64be"),
               ("irony/train_text.txt", "a888125a44f7dfaa25b026318748d0e62cc9a300d20f66eafd62011a19eaea23"),
               ("irony/val_text.txt", "8806cf3793e300a485cfae34892fc3a0a2f9a183deb06c750c6531515c83051e"),
               ("sentiment/test_text.txt", "09a93a55c63fd93f97485ef7302889d7edb4091cd49733aa37da094f0bfa0675"),
               ("sentiment/val_text.txt", "e5b021e6fc45064c260b09814b803d8f56cada519c4d952d72f43d48a350a964"))),
           "ordinary tweets 2013-17 (TweetEval: sentiment, emotion, irony)",
           notes=('README: "released without any restrictions" (no SPDX licence); Twitter terms apply',)),
    Corpus("airline-sentiment-tweets-2015", "airline", "vitormariath/Airline-Sentiment",
           "8b94042692517f80dc066109ac682e5fb46b03a2", "CC-BY-NC-SA-4.0", False, (
               CorpusFile("Airline-Sentiment-2-w-AA.csv",
                          "77f230e2355fca746e8fab63799853c9b4c19315a723c287234d060a21f2cfbb"),),
           "customers' tweets at US airlines, Feb 2015 (CrowdFlower)"),
    Corpus("sentiment-labelled-sentences-uci", "reviews", "rushabh7cr/Sentiment-Classifier-using-naive-bayes",
           "60b3211cf920faf6ee7e6c68114b3c272cfa4421", "CC-BY-4.0", True, tuple(CorpusFile(p, sha) for p, sha in (
               ("amazon_cells_labelled.txt", "49df8059de0eb9c2c13253f9d33a579bc56efc0f620dde2f6be1ec74c59893cb"),
               ("yelp_labelled.txt", "c76468b7b5c6e56a0804d728345c5f84aa2142ddb214420f61cc9cfd4c00d2ea"),
               ("imdb_labelled.txt", "aef2e49e3da25714d61175e3a6e68eeef74a20a2f914318dc3be9947ea86512d"))),
           "Amazon / Yelp / IMDb review sentences (Kotzias et al. 2015)"),
)
BY_REGISTER = {c.register: c for c in CORPORA}
# registers whose licence allows evaluation only (non-commercial): never trained on, by the text model or by the
# decision model that learns from traffic made of held-out texts
EVAL_ONLY = frozenset(c.register for c in CORPORA if not c.trainable)
SPAM_REGISTERS = ("youtube", "instagram", "x_posts", "sms_2022", "phishing_pot")
HAM_REGISTERS = ("tweeteval", "airline", "reviews")


class CorpusMissing(FileNotFoundError):
    """A corpus file that is nowhere to be read (or differs from its pinned sha256); the message names it,
    every place looked and what a download said."""


# ---------------------------------------------------------------- where the files are

def default_local_dir() -> Path:
    """`../shared/corpora` relative to the repository's root (the checkout this package runs from)."""
    return Path(__file__).resolve().parents[2].parent / "shared" / "corpora"


def local_dir(configured: str = "") -> Path:
    return Path(configured).expanduser() if configured else default_local_dir()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def members_digest(hashes: dict[str, str]) -> str:
    """One sha256 for a set of files: over `<sha256>  <path>` lines sorted by path."""
    return hashlib.sha256("".join(f"{hashes[p]}  {p}\n" for p in sorted(hashes)).encode()).hexdigest()


def _download(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
        return response.read()


def _place(dest: Path, raw: bytes) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    tmp.write_bytes(raw)
    os.replace(tmp, dest)


class Locator:
    """Finds a corpus's files: the local copy first, then the download cache, then (when `download`) GitHub
    at the pinned commit into the cache. `fetch` is the downloader (tests give their own)."""

    def __init__(self, local: Path, cache_dir: Path | None = None, download: bool = True,
                 fetch: Callable[[str], bytes] = _download):
        self.local = Path(local)
        self.cache = Path(cache_dir) / "corpora" if cache_dir is not None else None
        self.download = download and self.cache is not None
        self.fetch = fetch
        self._checked: dict[Path, str] = {}

    def _roots(self, corpus: Corpus) -> list[Path]:
        roots = [self.local / corpus.folder]
        if self.cache is not None:
            roots.append(self.cache / corpus.folder)
        return roots

    def _sha(self, path: Path) -> str:
        if path not in self._checked:
            self._checked[path] = file_sha256(path)
        return self._checked[path]

    def path(self, corpus: Corpus, f: CorpusFile) -> Path:
        """The file's path, checked against its pinned sha256."""
        looked, problems = [], []
        for root in self._roots(corpus):
            p = root / f.path
            looked.append(str(p))
            if p.is_file():
                if self._sha(p) == f.sha256:
                    return p
                problems.append(f"{p} has sha256 {self._sha(p)[:16]}..., not the pinned {f.sha256[:16]}...")
        if self.download:
            try:
                return self._fetch_file(corpus, f)
            except (OSError, ValueError, zipfile.BadZipFile) as exc:
                problems.append(f"download from {corpus.repository}@{corpus.commit[:12]} failed: {exc}")
        raise CorpusMissing(
            f"corpus {corpus.folder} ({corpus.repository}@{corpus.commit[:12]}): {f.path} (sha256 {f.sha256[:16]}...) "
            f"not found; looked in {', '.join(looked)}"
            + (f"; {'; '.join(problems)}" if problems else "")
            + ". Set MODPIPE_CORPORA_DIR to a copy of the corpora, or let the machine reach GitHub.")

    def _fetch_file(self, corpus: Corpus, f: CorpusFile) -> Path:
        assert self.cache is not None
        dest = self.cache / corpus.folder / f.path
        if f.archive:
            url = RAW_URL.format(repository=corpus.repository, commit=corpus.commit, path=f.archive)
            with zipfile.ZipFile(io.BytesIO(self.fetch(url))) as z:
                names = {Path(n).name: n for n in z.namelist()}
                name = Path(f.path).name
                if name not in names:
                    raise ValueError(f"{url} holds no {name}")
                raw = z.read(names[name])
        else:
            url = RAW_URL.format(repository=corpus.repository, commit=corpus.commit, path=f.in_repository)
            raw = self.fetch(url)
        got = hashlib.sha256(raw).hexdigest()
        if got != f.sha256:
            raise ValueError(f"{url}: sha256 {got[:16]}..., not the pinned {f.sha256[:16]}...")
        _log.info("corpus file downloaded", extra={"corpus": corpus.folder, "file": f.path, "bytes": len(raw)})
        _place(dest, raw)
        return dest

    def members(self, corpus: Corpus) -> list[Path]:
        """A corpus's many-file set (phishing_pot's e-mails), checked as a whole against `members_sha256`."""
        if not corpus.members:
            return []
        looked = []
        for root in self._roots(corpus):
            looked.append(str(root))
            paths = {m: root / m for m in corpus.members}
            if all(p.is_file() for p in paths.values()):
                digest = members_digest({m: self._sha(p) for m, p in paths.items()})
                if digest == corpus.members_sha256:
                    return [paths[m] for m in corpus.members]
        problems = []
        if self.download:
            try:
                return self._fetch_members(corpus)
            except (OSError, ValueError) as exc:
                problems.append(f"download from {corpus.repository}@{corpus.commit[:12]} failed: {exc}")
        missing = [m for m in corpus.members if not (self.local / corpus.folder / m).is_file()]
        raise CorpusMissing(
            f"corpus {corpus.folder} ({corpus.repository}@{corpus.commit[:12]}): its {len(corpus.members)} files "
            f"(one digest {corpus.members_sha256[:16]}...) are not all there or differ; looked in {', '.join(looked)}"
            + (f"; {len(missing)} missing from the local copy, e.g. {missing[0]}" if missing else "")
            + (f"; {'; '.join(problems)}" if problems else "")
            + ". Set MODPIPE_CORPORA_DIR to a copy of the corpora, or let the machine reach GitHub.")

    def _fetch_members(self, corpus: Corpus) -> list[Path]:
        assert self.cache is not None
        root, hashes = self.cache / corpus.folder, {}
        for m in corpus.members:
            dest = root / m
            if not dest.is_file():
                _place(dest, self.fetch(RAW_URL.format(repository=corpus.repository, commit=corpus.commit, path=m)))
            hashes[m] = file_sha256(dest)
        if members_digest(hashes) != corpus.members_sha256:
            raise ValueError(f"the downloaded files' digest differs from the pinned {corpus.members_sha256[:16]}...")
        return [root / m for m in corpus.members]

    def files(self, corpus: Corpus) -> dict[str, Path]:
        """{path in the corpus: checked local path} of every file the corpus is read from."""
        out = {f.path: self.path(corpus, f) for f in corpus.files}
        out.update(dict(zip(corpus.members, self.members(corpus), strict=True)))
        return out


def pinned_digest() -> str:
    """One sha256 over every pinned file of every corpus (a build's key holds it)."""
    lines = [f"{c.repository}@{c.commit} {f.path} {f.sha256}" for c in CORPORA for f in c.files]
    lines += [f"{c.repository}@{c.commit} members {c.members_sha256}" for c in CORPORA if c.members]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def locator(settings, download: bool = True) -> Locator:
    return Locator(local_dir(settings.corpora_dir), settings.cache_dir, download)


def available(settings) -> bool:
    """Whether every corpus can be read without a download (what tests on the real files skip by)."""
    loc = Locator(local_dir(settings.corpora_dir), settings.cache_dir, download=False)
    try:
        for c in CORPORA:
            loc.files(c)
    except CorpusMissing:
        return False
    return True


# ---------------------------------------------------------------- parsers: bytes in, (text, label) out

_BR = re.compile(r"<\s*br\s*/?\s*>", re.I)
_TAGS = re.compile(r"<[^>]{0,200}>")
_INVISIBLE = str.maketrans("", "", "\ufeff\u200b")


def tidy(text: str) -> str:
    """HTML entities and tags of a web comment made text, byte-order marks dropped, whitespace collapsed."""
    text = html.unescape(_TAGS.sub(" ", _BR.sub("\n", text))).translate(_INVISIBLE)
    return clean_text(text)[:MAX_TEXT_CHARS]


def _csv(raw: bytes, encoding: str = "utf-8") -> Iterator[dict]:
    return csv.DictReader(io.StringIO(raw.decode(encoding, errors="replace"), newline=""))


def parse_youtube(raw: bytes) -> Iterator[tuple[str, int]]:
    """COMMENT_ID,AUTHOR,DATE,CONTENT,CLASS (1 spam)."""
    for row in _csv(raw):
        text, label = tidy(row.get("CONTENT") or ""), (row.get("CLASS") or "").strip()
        if text and label in ("0", "1"):
            yield text, int(label)


def parse_instagram(raw: bytes) -> Iterator[tuple[str, int]]:
    """number,scam,msg_length,msg (scam 1)."""
    for row in _csv(raw):
        text, label = tidy(row.get("msg") or ""), (row.get("scam") or "").strip()
        if text and label in ("0", "1"):
            yield text, int(label)


# LABELS.md's security & fraud group: what the register calls a scam
X_SCAM_LABELS = frozenset(("scam", "phishing", "malware", "impersonation", "fake_support", "recovery_scam",
                           "job_scam", "romance_scam", "account_compromise"))
# LABELS.md's spam/promotion group (its 3-class scheme folds these into "scam"): neither scam nor clean here
X_PROMO_LABELS = frozenset(("spam", "reply_spam", "dm_spam", "promo", "affiliate", "lead_gen", "engagement_bait",
                            "follow_train", "giveaway", "bot"))
_BANKRBOT = re.compile(r"^\s*@bankrbot\s+deploy\b", re.I)


def x_placeholder(row: dict) -> bool:
    """Rows whose provenance is a placeholder (source_id x_mock_*, source_url x.com/example/...): not real."""
    return (str(row.get("source_id") or "").startswith("x_mock")
            or "/example/" in str(row.get("source_url") or "").lower())


def parse_x(raw: bytes) -> Iterator[tuple[str, int]]:
    """sample.jsonl: a scam-group label -> 1; no scam- or promotion-group label -> 0; promotion-only rows,
    placeholder rows and "@bankrbot deploy" token requests (scam by label, not scam text) left out."""
    for line in raw.decode("utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        labels = set(row.get("labels") or ())
        text = tidy(row.get("text") or "")
        if not text or x_placeholder(row) or _BANKRBOT.match(text):
            continue
        if labels & X_SCAM_LABELS:
            yield text, 1
        elif not labels & X_PROMO_LABELS:
            yield text, 0


def parse_sms_2022(raw: bytes) -> Iterator[tuple[str, int]]:
    """LABEL,TEXT,URL,EMAIL,PHONE: ham 0; spam and smishing (any case) 1. Not yet de-duplicated against UCI."""
    for row in _csv(raw):
        label = (row.get("LABEL") or "").strip().lower()
        text = tidy(row.get("TEXT") or "")
        if text and label in ("ham", "spam", "smishing"):
            yield text, int(label != "ham")


def parse_phishing_email(raw: bytes) -> Iterator[tuple[str, int]]:
    text = reduce_email(raw)
    if text:
        yield text, 1


def parse_lines_ham(raw: bytes) -> Iterator[tuple[str, int]]:
    """One text per line (TweetEval), all legitimate."""
    for line in raw.decode("utf-8", errors="replace").splitlines():
        text = tidy(line)
        if text:
            yield text, 0


def parse_airline(raw: bytes) -> Iterator[tuple[str, int]]:
    """The CrowdFlower export: latin-1 (CP1252 bytes), the tweet in `text`; all legitimate."""
    for row in _csv(raw, "latin-1"):
        text = tidy(row.get("text") or "")
        if text:
            yield text, 0


def parse_reviews(raw: bytes) -> Iterator[tuple[str, int]]:
    """`sentence<TAB>sentiment` per line, no header; all legitimate (the label is sentiment)."""
    for line in raw.decode("utf-8", errors="replace").splitlines():
        text, _, sentiment = line.rpartition("\t")
        text = tidy(text)
        if text and sentiment.strip() in ("0", "1"):
            yield text, 0


PARSERS: dict[str, Callable[[bytes], Iterator[tuple[str, int]]]] = {
    "youtube": parse_youtube, "instagram": parse_instagram, "x_posts": parse_x, "sms_2022": parse_sms_2022,
    "phishing_pot": parse_phishing_email, "tweeteval": parse_lines_ham, "airline": parse_airline,
    "reviews": parse_reviews,
}


def _data_files(corpus: Corpus, files: dict[str, Path]) -> list[Path]:
    """The files holding texts (licences and readmes are pinned, not parsed)."""
    return [p for name, p in files.items() if Path(name).name not in ("LICENSE", "README.md")]


def read(corpus: Corpus, files: dict[str, Path]) -> list[tuple[str, int]]:
    """Every (text, label) of the corpus, in file order."""
    parse = PARSERS[corpus.register]
    return [pair for p in _data_files(corpus, files) for pair in parse(p.read_bytes())]


# ---------------------------------------------------------------- near duplicates

_WORD = re.compile(r"[a-z0-9]+")
NEAR_DUPLICATE_JACCARD = 0.7


def words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text.lower()))


class NearIndex:
    """Word sets, and which of them a new set shares a Jaccard similarity >= `threshold` with. Exact, with the
    prefix filter: under one order of the words (rarest first), two sets that similar share a word among the
    first len - ceil(t*len) + 1 of each, so only those are indexed and probed."""

    def __init__(self, sets: Iterable[frozenset[str]], threshold: float = NEAR_DUPLICATE_JACCARD):
        self.sets = list(sets)
        self.t = threshold
        self.df: dict[str, int] = {}
        for s in self.sets:
            for w in s:
                self.df[w] = self.df.get(w, 0) + 1
        # word -> set size -> sets: a set of n words is only probed against sizes in [t*n, n/t]
        self.postings: dict[str, dict[int, list[int]]] = {}
        for i, s in enumerate(self.sets):
            for w in self._prefix(s):
                self.postings.setdefault(w, {}).setdefault(len(s), []).append(i)

    def _prefix(self, s: frozenset[str]) -> list[str]:
        n = len(s) - math.ceil(self.t * len(s)) + 1
        return sorted(s, key=lambda w: (self.df.get(w, 0), w))[:max(1, n)]

    def matches(self, s: frozenset[str]) -> list[int]:
        """Indices of the indexed sets with Jaccard >= threshold to `s` (empty sets match nothing)."""
        if not s:
            return []
        n = len(s)
        lo, hi = math.ceil(self.t * n - 1e-9), math.floor(n / self.t + 1e-9)
        cands: set[int] = set()
        for w in self._prefix(s):
            for size, ids in self.postings.get(w, {}).items():
                if lo <= size <= hi:
                    cands.update(ids)
        out = []
        for i in cands:
            o = self.sets[i]
            inter = len(o & s)
            if inter / (len(o) + n - inter) >= self.t:
                out.append(i)
        return sorted(out)


def new_to(texts: list[tuple[str, int]], known: Iterable[str], key: Callable[[str], str],
           threshold: float = NEAR_DUPLICATE_JACCARD) -> tuple[list[tuple[str, int]], dict]:
    """The pairs whose text is neither a normalised copy (`key`) nor a near twin (word-set Jaccard >=
    threshold) of a `known` text; and counts of what was dropped."""
    known = list(known)
    keys = {key(t) for t in known}
    index = NearIndex((words(t) for t in known), threshold)
    kept, exact, near = [], 0, 0
    for text, label in texts:
        if key(text) in keys:
            exact += 1
        elif index.matches(words(text)):
            near += 1
        else:
            kept.append((text, label))
    return kept, {"read": len(texts), "in_known_exact": exact, "in_known_near": near, "kept": len(kept)}


# ---------------------------------------------------------------- the registers

def dedup_pairs(pairs: list[tuple[str, int]], key: Callable[[str], str]) -> tuple[list[tuple[str, int]], dict]:
    """The first of each normalised text; every copy of a text seen with both labels dropped."""
    first: dict[str, tuple[str, int]] = {}
    labels: dict[str, set[int]] = {}
    for text, label in pairs:
        k = key(text)
        first.setdefault(k, (text, label))
        labels.setdefault(k, set()).add(label)
    kept = [first[k] for k in first if len(labels[k]) == 1]
    return kept, {"read": len(pairs), "unique": len(first), "label_conflicts_dropped": len(first) - len(kept)}


# The large ham sets are sampled (a fixed sample: the smallest hashes of the normalised texts) before anything
# else: ~24,000 tweets and ~14,000 airline tweets would triple the build's training steps and the
# near-duplicate search, and a few thousand measure a false-positive share to within ~0.5 points.
SAMPLE_CAPS = {"tweeteval": 3000, "airline": 3000}


def fixed_sample(pairs: list[tuple[str, int]], cap: int, key: Callable[[str], str]) -> list[tuple[str, int]]:
    """At most `cap` pairs: those whose normalised text hashes smallest (the same on every machine); order kept.
    Another hash than `side_of`'s: the sample must not pick a side."""
    if len(pairs) <= cap:
        return pairs
    rank = sorted(range(len(pairs)), key=lambda i: hashlib.sha256(f"sample:{SPLIT_SALT}:{key(pairs[i][0])}".encode()).digest())
    keep = set(rank[:cap])
    return [p for i, p in enumerate(pairs) if i in keep]


def load_registers(loc: Locator, key: Callable[[str], str], known_sms: Iterable[str],
                   registers: Iterable[str] | None = None) -> tuple[dict[str, list[tuple[str, int]]], dict]:
    """{register: de-duplicated (text, label) pairs} of every corpus (or those named), and per register
    what was read and kept. sms_2022 keeps only texts new to `known_sms` (the UCI collection), near twins too;
    the registers of SAMPLE_CAPS are sampled."""
    wanted = set(registers) if registers is not None else set(BY_REGISTER)
    out, stats = {}, {}
    for corpus in CORPORA:
        if corpus.register not in wanted:
            continue
        pairs, st = dedup_pairs(read(corpus, loc.files(corpus)), key)
        if corpus.register == "sms_2022":
            pairs, st["uci"] = new_to(pairs, known_sms, key)
        if corpus.register in SAMPLE_CAPS:
            pairs = fixed_sample(pairs, SAMPLE_CAPS[corpus.register], key)
        st["kept"] = len(pairs)
        st["spam"] = sum(label for _, label in pairs)
        out[corpus.register], stats[corpus.register] = pairs, st
    return out, stats


# ---------------------------------------------------------------- the fixed held-out split



def side_of(key: str) -> str:
    """train / validation / test by a hash of a normalised text (a cluster's smallest key): fixed, seedless."""
    x = int(hashlib.sha256(f"{SPLIT_SALT}:{key}".encode()).hexdigest()[:12], 16) / float(1 << 48)
    if x < SIDE_SHARES[0]:
        return "train"
    return "validation" if x < SIDE_SHARES[0] + SIDE_SHARES[1] else "test"


def clusters(texts: list[str], key: Callable[[str], str], threshold: float = NEAR_DUPLICATE_JACCARD) -> list[str]:
    """Per text, the smallest normalised key of its cluster: texts with one normalised form, and near twins
    (word-set Jaccard >= threshold), joined transitively (union-find)."""
    keys = [key(t) for t in texts]
    parent = list(range(len(texts)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i: int, j: int) -> None:
        a, b = find(i), find(j)
        if a != b:
            parent[max(a, b)] = min(a, b)

    first: dict[str, int] = {}
    for i, k in enumerate(keys):
        union(i, first.setdefault(k, i))
    reps = sorted(first.values())  # one text per normalised form is enough for the near twins
    sets = [words(texts[i]) for i in reps]
    index = NearIndex(sets, threshold)
    for n, i in enumerate(reps):
        for m in index.matches(sets[n]):
            if m != n:
                union(i, reps[m])
    smallest: dict[int, str] = {}
    for i, k in enumerate(keys):
        r = find(i)
        if r not in smallest or k < smallest[r]:
            smallest[r] = k
    return [smallest[find(i)] for i in range(len(texts))]


@dataclass(frozen=True)
class Row:
    text: str
    label: int
    register: str
    side: str  # train | validation | test


def assign_sides(registers: dict[str, list[tuple[str, int]]], key: Callable[[str], str],
                 trainable: set[str]) -> tuple[list[Row], dict]:
    """Every text's side: its cluster's (`clusters`, across all registers, so a near twin or a copy in another
    set lands on the same side). Registers not in `trainable` are held out whole (side test), but for texts
    whose cluster holds a trained text (train side, trainable register): those are dropped (counted)."""
    flat = [(text, label, reg) for reg in sorted(registers) for text, label in registers[reg]]
    cluster = clusters([t for t, _, _ in flat], key)
    side = [side_of(c) for c in cluster]
    trained = {c for c, s, (_, _, reg) in zip(cluster, side, flat, strict=True) if s == "train" and reg in trainable}
    rows, stats = [], {}
    for (text, label, reg), c, s in zip(flat, cluster, side, strict=True):
        st = stats.setdefault(reg, {"train": 0, "validation": 0, "test": 0, "twin_of_trained_dropped": 0})
        if reg not in trainable:
            if c in trained:
                st["twin_of_trained_dropped"] += 1
                continue
            s = "test"
        st[s] += 1
        rows.append(Row(text, label, reg, s))
    return rows, stats
