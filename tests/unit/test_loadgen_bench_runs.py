"""A run's posts: the same texts under every pass's run id."""

from __future__ import annotations

from modpipe.loadgen.bench.runs import bench_posts


def test_bench_posts_give_the_same_texts_under_another_run_id():
    texts = [{"text": f"ham text number {i}", "label": "ham"} for i in range(30)] + \
            [{"text": f"WIN cash now {i}", "label": "spam"} for i in range(10)]
    a = bench_posts(texts, 50, "run-a")
    b = bench_posts(texts, 50, "run-b")
    assert len(a) == len(b) == 50 and all(ev.kind == "post" for ev in a)
    assert [ev.payload["text"] for ev in a] == [ev.payload["text"] for ev in b]
    assert all(ev.payload["post_id"].startswith("run-a-") for ev in a)
    assert not {ev.payload["post_id"] for ev in a} & {ev.payload["post_id"] for ev in b}
