"""The CPU spam_text model's length bucketing (triton_models/cpu/spam_text/1/model.py), without Triton.

model.py imports Triton's `triton_python_backend_utils`, which exists only inside the python backend;
the pure helpers under test do not use it, so an empty stand-in module is enough to import the file."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

MODEL_PY = Path(__file__).resolve().parents[2] / "triton_models" / "cpu" / "spam_text" / "1" / "model.py"


def _load():
    sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    spec = importlib.util.spec_from_file_location("spam_text_cpu_model", MODEL_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


model = _load()


def test_real_lengths_reads_the_mask():
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert model.real_lengths(mask).tolist() == [3, 1, 0, 4]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 128), min_size=1, max_size=200), st.sampled_from([1, 64, 512, 2048, 10_000]))
def test_length_runs_cover_every_row_once_within_budget(lengths, budget):
    lengths = np.array(lengths)
    runs = list(model.length_runs(lengths, budget))
    rows = np.concatenate([r for r, _ in runs])
    assert sorted(rows.tolist()) == list(range(len(lengths)))  # every row exactly once
    previous_width = 0
    for run_rows, width in runs:
        assert width >= max(1, int(lengths[run_rows].max()))  # nobody is truncated
        assert width == max(1, int(lengths[run_rows].max()))  # and nobody pays for a longer run's padding
        assert len(run_rows) == 1 or width * len(run_rows) <= budget
        assert width >= previous_width  # shortest first
        previous_width = width


def test_mixed_batch_computes_far_fewer_tokens_than_padding_to_the_longest():
    lengths = np.array([20] * 48 + [128] * 16)  # chat lines and e-mails in one streamed batch
    padded = sum(len(r) * w for r, w in model.length_runs(lengths, 2048))
    assert padded == 48 * 20 + 16 * 128
    assert padded < 0.4 * len(lengths) * 128


def _cost(runs, overhead):
    return sum(overhead + len(rows) * width for rows, width in runs)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 128), min_size=1, max_size=9), st.sampled_from([1, 64, 256, 2048]),
       st.sampled_from([1, 12, 100]))
def test_cheapest_runs_are_the_cheapest_contiguous_split(lengths, budget, overhead):
    lengths = np.array(lengths)
    runs = list(model.length_runs(lengths, budget, overhead))
    rows = np.concatenate([r for r, _ in runs])
    assert sorted(rows.tolist()) == list(range(len(lengths)))
    widths = sorted(max(1, int(x)) for x in lengths)
    previous_width = 0
    for run_rows, width in runs:
        assert width == max(1, int(lengths[run_rows].max()))
        assert len(run_rows) == 1 or width * len(run_rows) <= budget
        assert width >= previous_width
        previous_width = width
    # every split of the sorted rows into consecutive runs within the budget, tried by brute force
    n, best = len(widths), float("inf")
    for mask in range(1 << (n - 1)):
        cuts = [0] + [i + 1 for i in range(n - 1) if mask >> i & 1] + [n]
        spans = list(zip(cuts, cuts[1:], strict=False))
        if all(e - s == 1 or (e - s) * widths[e - 1] <= budget for s, e in spans):
            best = min(best, sum(overhead + (e - s) * widths[e - 1] for s, e in spans))
    assert _cost(runs, overhead) == best
    assert _cost(runs, overhead) <= _cost(list(model.length_runs(lengths, budget)), overhead)


def test_a_chat_line_is_not_padded_to_an_e_mail_when_a_call_of_its_own_costs_less():
    # a call counted as 12 tokens of compute already splits these (the served config counts 48: MODEL_CARD.md)
    assert [w for _, w in model.length_runs(np.array([128, 40]), 2048, 12)] == [40, 128]
    assert [w for _, w in model.length_runs(np.array([128, 40]), 2048)] == [128]  # without: one run
    assert [w for _, w in model.length_runs(np.array([40, 32]), 2048, 12)] == [40]  # close lengths stay together
    mixed = np.array([20] * 48 + [128] * 16)
    assert [(len(r), w) for r, w in model.length_runs(mixed, 2048, 12)] == [(48, 20), (16, 128)]
