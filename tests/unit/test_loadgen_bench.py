"""`modpipe bench`: command-line routing (no target: the end-to-end comparison of loadgen/bench/)."""

from __future__ import annotations

import pytest

from modpipe.cli import build_parser


@pytest.mark.parametrize("argv, handler", [
    (["bench", "--json"], "_bench_e2e"),
    (["bench", "--posts", "50", "--workers", "2", "--markdown", "x.md"], "_bench_e2e"),
    (["bench", "model", "--json"], "_bench_model"),
    (["bench", "features", "--posts", "5"], "_bench_features"),
    (["bench", "transport", "--records", "2000", "--intervals", "100", "--json"], "_bench_transport"),
])
def test_bench_without_target_is_the_end_to_end_comparison(argv, handler):
    args = build_parser().parse_args(argv)
    assert args.func.__name__ == handler
    if handler == "_bench_e2e":
        assert args.json == ("--json" in argv) and args.load == 0.5 and args.low_rate == 5.0
    if argv[1] == "features":
        assert args.posts == 5 and args.workers == 1  # the target's own defaults win over bench's
    if argv[1] == "transport":
        assert args.records == 2000 and args.intervals == "100" and args.json and args.paced_rate == 1000


def test_bench_help_explains_the_three_paths(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["bench", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for word in ("pipeline", "seed", "ceiling", "padded to 128", "pipeline/seed", "pipeline/ceiling", "model",
                 "features", "--markdown", "--low-rate", "sorted ceiling", "capacity"):
        assert word in out, word
