"""`modpipe model build --extra-data FILE`: a platform's own labelled texts change what the text model learns.

The platform here is a marketplace: its sellers' listings shout like the spam of the public corpora ("FREE
delivery! Buy now, limited stock!") but are its business, so its moderators label them ham; its spam is
follower-selling and fake giveaways. The served full model, trained on the public corpora alone, calls
half the listings spam. A demo build (minutes) with the platform's labels must, on the platform's
held-out texts, let most listings through and still catch its spam, measured side by side.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np


def platform_texts(n_each: int, seed: int = 7) -> list[dict]:
    """A marketplace's labelled posts as `export-labels` writes them: listings (ham) and its spam."""
    r = random.Random(seed)
    adjs = ["Vintage", "Brand new", "Handmade", "Refurbished", "Rare", "Mint condition", "Lightly used", "Custom",
            "Organic", "Limited edition"]
    items = ["oak bookshelf", "road bike", "leather jacket", "espresso machine", "vinyl records", "gaming laptop",
             "baby stroller", "ceramic vase", "hiking boots", "standing desk", "sofa", "guitar amp", "camera lens",
             "winter tyres", "sewing machine", "garden bench"]
    hooks = ["FREE delivery", "FREE shipping", "HUGE discount", "50% OFF", "BEST PRICE", "LAST ONE", "SALE"]
    calls = ["Buy now", "Order today", "Grab it now", "Message me now", "Don't miss out", "Act fast"]
    shops = ["shop", "store", "market", "deals", "outlet"]
    openers = ["Get 10k followers", "Boost your account", "Instant likes", "Verified badge guaranteed",
               "Win a free phone", "Claim your gift card"]
    tails = ["DM me", "send a message to this account", "visit my profile link", "reply YES", "follow and share",
             "tag 3 friends"]
    rows, seen = [], set()
    while len(rows) < n_each:
        text = (f"{r.choice(adjs)} {r.choice(items)} for sale! {r.choice(hooks)}, only ${r.randint(5, 900)}. "
                f"{r.choice(calls)} at {r.choice(shops)}{r.randint(1, 99)}.example.com - limited stock!")
        if text not in seen:
            seen.add(text)
            rows.append({"text": text, "label": "ham", "post_id": f"listing-{len(rows)}"})
    while len(rows) < 2 * n_each:
        text = (f"{r.choice(openers)} in {r.randint(1, 48)} hours, no password needed, {r.choice(tails)} "
                f"{r.choice(['now', 'today', 'fast', ''])}").strip()
        if text not in seen:
            seen.add(text)
            rows.append({"text": text, "label": "spam", "post_id": f"spam-{len(rows)}"})
    r.shuffle(rows)
    return rows


def _spam_probability(build_dir: Path, texts: list[str]) -> np.ndarray:
    from modpipe.textmodel.evaluate import onnx_spam_proba
    from modpipe.textmodel.tokenize import BatchTokenizer

    served = json.loads((build_dir / "served.json").read_text())
    tok = BatchTokenizer(build_dir / "tokenizer.json", served["max_seq_len"], served.get("tail_tokens", 0))
    return onnx_spam_proba(build_dir / "model.onnx", tok, texts, desc="platform texts")


def test_extra_data_teaches_the_platforms_labels(tmp_path, settings_env, model_build):
    extra = tmp_path / "platform-labels.jsonl"
    extra.write_text("".join(json.dumps(row) + "\n" for row in platform_texts(200)), encoding="utf-8")
    # without today's platform corpora: the labels teach the same, and the demo build takes ~3.5 min instead of ~6
    proc = subprocess.run([sys.executable, "-m", "modpipe", "model", "build", "--profile", "demo", "--no-platforms",
                           "--extra-data", str(extra)], env=settings_env, capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    build_dir = Path(proc.stdout.strip().splitlines()[-1])
    assert build_dir != model_build.path

    served = json.loads((build_dir / "served.json").read_text())
    from modpipe.textmodel.data import file_sha256

    # the file's content, not its path, keys the build: a rerun with the same texts reuses the cached build
    assert served["extra_data"]["sha256"] == file_sha256(extra) and served["extra_data"]["texts"] > 250
    split = json.loads((build_dir / "split.json").read_text())
    assert all(split["sizes"][s].get("extra_ham", 0) > 0 and split["sizes"][s].get("extra_spam", 0) > 0
               for s in ("train", "validation", "test"))
    metrics = json.loads((build_dir / "metrics.json").read_text())
    assert {"sms", "spamassassin", "extra"} <= set(metrics["datasets"])
    assert "platform data" in (build_dir / "MODEL_CARD.md").read_text()

    heldout = [json.loads(line) for line in (build_dir / "heldout.jsonl").read_text().splitlines() if line]
    platform = [row for row in heldout if row["dataset"] == "extra"]
    texts = [row["text"] for row in platform]
    labels = np.array([row["label"] for row in platform])
    public_only = _spam_probability(model_build.path, texts) >= 0.5
    with_labels = _spam_probability(build_dir, texts) >= 0.5
    listings_flagged = {"public only": public_only[labels == 0].mean(), "with labels": with_labels[labels == 0].mean()}
    spam_caught = {"public only": public_only[labels == 1].mean(), "with labels": with_labels[labels == 1].mean()}
    detail = f"listings flagged {listings_flagged}, spam caught {spam_caught}, {len(platform)} held-out texts"
    # the premise: a model of public corpora calls listings spam (the transformer of the served build trained with
    # today's platforms flags half of them, the one before every one)
    assert listings_flagged["public only"] >= 0.4, detail
    assert listings_flagged["with labels"] <= min(0.3, listings_flagged["public only"] / 2), detail
    assert spam_caught["with labels"] >= 0.7, detail
