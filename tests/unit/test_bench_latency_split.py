"""modpipe.loadgen.bench.latency_split without a broker: a decision record's times split into its parts."""

from modpipe.loadgen.bench.latency_split import format_text, row, summarise


def decision(post_id: str, revision: int, received: str, decided: str) -> dict:
    return {"post_id": post_id, "revision": revision, "received_at": received, "decided_at": decided}


def test_a_first_decision_splits_into_its_parts_and_a_later_revision_is_left_out():
    r = row(decision("p1", 1, "2026-12-06T10:00:00.000Z", "2026-12-06T10:00:00.040Z"),
            produced_ms=1_796_637_600_045.0, seen_ms=1_796_637_600_070.0)
    assert r["decided"] - r["posted"] == 40.0
    assert row(decision("p1", 2, "2026-12-06T10:00:00.000Z", "2026-12-06T10:00:01.000Z"), 0.0, 0.0) is None
    report = summarise([r])
    assert report["decisions"] == 1
    assert report["parts"]["post -> decided"]["p50"] == 40.0
    assert report["parts"]["total"]["max"] == round(r["seen"] - r["posted"], 1)


def test_quantiles_over_many_decisions_and_the_text_table():
    rows = [{"post_id": str(i), "posted": 0.0, "decided": float(i), "produced": float(i) + 1, "seen": float(i) + 3}
            for i in range(1, 101)]
    report = summarise(rows)
    assert report["parts"]["post -> decided"]["p50"] == 51.0
    assert report["parts"]["post -> decided"]["max"] == 100.0
    assert report["parts"]["produced -> seen"]["p99"] == 2.0
    text = format_text(report)
    assert text.splitlines()[0].startswith("100 decisions") and "produced -> seen" in text
