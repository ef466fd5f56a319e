"""One decision per post, whatever its created_at, through a running worker on Apache Kafka with Triton: 300 posts of
one account, then posts dated hours, days and a year before its first (below every id its user table keeps), then
re-sends of old, recent and backdated posts. Each post gets one decision on `decisions`, no re-send gets one, and
every table equals modpipe.features.offline's."""

from __future__ import annotations

import collections
import random

import pytest
from modpipe.loadgen.chaos import compare_tables, offline_tables, streaming_tables
from modpipe.loadgen.posts import make_post

from modpipe import schema
from tests.fixtures.waiting import wait_for
from tests.integration.test_commit_stall import decisions, produce_plainly, wait_decided

pytestmark = pytest.mark.integration

T0 = 1_790_000_000_000
HOUR_MS, DAY_MS = 3_600_000, 86_400_000
BACKDATED = {"1h": HOUR_MS, "5h": 5 * HOUR_MS, "3d": 3 * DAY_MS, "1y": 365 * DAY_MS}


def backdated_posts(n: int = 300) -> tuple[list[dict], list[str]]:
    """The account's `n` posts a minute apart, the backdated ones, one dated between two of its first posts, the
    next one; then re-sends (the same records again). Returns (every post sent, in order; the ids sent again)."""
    rng = random.Random(76)

    def post(pid: str, ts: int, text: str) -> dict:
        p = make_post(rng, pid, text, user_id="busy-account", now_ms=T0)
        p.update(created_at=schema.rfc3339(ts), url="https://news.example.org/a", ip="192.0.2.7")
        p.pop("url_reputation", None)
        return p

    posts = [post(f"p{i:03d}", T0 + i * 60_000, f"post number {i} of a busy account") for i in range(n)]
    posts += [post(f"back-{age}", T0 - ms, f"a post dated {age} before the first") for age, ms in BACKDATED.items()]
    posts += [post("between", T0 + 10 * 60_000 + 30_000, "dated between two old posts"),
              post("after", T0 + n * 60_000, "the next post")]
    again = ["p000", f"p{n // 2:03d}", f"p{n - 1:03d}", "between", "after", *(f"back-{age}" for age in BACKDATED)]
    first = {p["post_id"]: p for p in posts}
    return posts + [first[pid] for pid in again], again


@pytest.mark.parametrize("local_hops", ["on", "off"])
def test_backdated_posts_are_decided_once_and_resends_never(local_stack, pipeline_settings, local_hops):
    settings = pipeline_settings
    # off: every hop through its stage topic, the post table's answer included
    stack = local_stack(workers=1, modpipe_local_hops=local_hops)
    sent, again = backdated_posts()
    produce_plainly(stack.bootstrap, stack.topics.posts, sent)  # keyed by the account: one partition, in order
    ids = {p["post_id"] for p in sent}
    wait_decided(stack, settings, ids, timeout=180)
    # the re-sends at the end of the partition are read and committed: none of them can still be decided
    wait_for(lambda: stack.group_lag() == 0, 60, "every input committed", interval=1.0)
    made = decisions(settings, stack.bootstrap, stack.topics.decisions)
    per_post = collections.Counter(d["post_id"] for d in made)
    assert len(ids) == 306 and per_post == dict.fromkeys(ids, 1), {p: n for p, n in per_post.items() if n != 1}
    metrics = stack.scrape()
    assert metrics.get("modpipe_posts_resent_total") == len(again)
    # the four backdated posts and the one between two evicted posts, then the re-sends of those and of the first
    assert metrics.get("modpipe_posts_checked_total") == 5 + 6
    tables = compare_tables(streaming_tables(settings, stack.bootstrap),
                            offline_tables([("post", p) for p in sent], made, {p["post_id"]: p for p in sent}))
    assert tables["equal"], tables
