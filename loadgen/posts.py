"""Valid posts built from labelled texts, and malformed records that must end in the dead-letter topic."""

from __future__ import annotations

import random
from collections.abc import Iterator

from modpipe import schema

DOMAINS = ["example.com", "news.example.org", "shop.example.net", "blog.example.co.uk"]
EMAIL_DOMAINS = ["gmail.com", "yahoo.com", "outlook.com", "proton.me", "example.org"]


def make_post(rng: random.Random, post_id: str, text: str, *, user_id: str | None = None,
              now_ms: int | None = None) -> dict:
    now_ms = now_ms or schema.now_ms()
    user_id = user_id or f"u{rng.randrange(10_000)}"
    post = {
        "schema_version": schema.SCHEMA_VERSION,
        "post_id": post_id,
        "user_id": user_id,
        "created_at": schema.rfc3339(now_ms),
        "text": text,
        "url": f"https://{rng.choice(DOMAINS)}/p/{rng.randrange(1000)}" if rng.random() < 0.3 else None,
        "ip": f"203.0.113.{rng.randrange(1, 255)}",
        "user": {
            "created_at": schema.rfc3339(now_ms - rng.randrange(1, 2000) * 86_400_000),
            "email_domain": rng.choice(EMAIL_DOMAINS),
            "friends": rng.randrange(500),
            "followers": rng.randrange(2000),
            "verified": rng.random() < 0.05,
        },
        # A human journey: typing takes ~0.1-0.3 s per character (the feature agents flag faster ones).
        "journey": [{"step": "open_composer", "ms": rng.randrange(200, 3000)},
                    {"step": "type", "ms": min(600_000, len(text) * rng.randrange(100, 300))},
                    {"step": "submit", "ms": rng.randrange(100, 1500)}],
    }
    if post["url"] and rng.random() < 0.5:
        post["url_reputation"] = {"age_days": rng.randrange(3000), "wot_score": rng.randrange(100),
                                  "google_risk": round(rng.random(), 3)}
    return post


def labelled_posts(texts: list[dict], n: int, run_id: str, seed: int = 7) -> Iterator[tuple[dict, str]]:
    """n posts cycling through `texts` ({'text', 'label'}); yields (post, label)."""
    rng = random.Random(seed)
    if not texts:
        raise ValueError("no texts to build posts from")
    order = list(range(len(texts)))
    rng.shuffle(order)
    for i in range(n):
        item = texts[order[i % len(order)]]
        yield make_post(rng, f"{run_id}-{i}", item["text"]), item["label"]


def malformed_records(run_id: str) -> list[tuple[str, bytes]]:
    """(expected dead-letter reason, raw bytes) for each kind of bad input; each carries `run_id`."""
    rng = random.Random(0)
    good = make_post(rng, f"{run_id}-bad", "valid text")
    marker = run_id.encode()

    def variant(**changes) -> bytes:
        post = {**good, **changes}
        return schema.dumps({k: v for k, v in post.items() if v is not ...})

    return [
        ("bad_json", b'{"post_id": "' + marker + b'", "text": '),
        ("invalid_utf8", b'{"schema_version": 1, "post_id": "' + marker + b'", "text": "\xff\xfe"}'),
        ("not_an_object", b'["' + marker + b'"]'),
        ("missing_field", variant(user_id=...)),
        ("wrong_type", variant(user={**good["user"], "friends": "many"})),
        ("text_too_long", variant(text="x" * 10_001)),
        ("unknown_schema_version", variant(schema_version=99)),
        ("invalid_value", variant(created_at="yesterday")),
    ]
