"""The numeric input of the decision model: a batch's matrix equals the maps' vectors one by one."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from modpipe.features.vector import to_matrix, to_vector

NAMES = ("a", "b", "c", "d", "e")
VALUE = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70), st.floats(allow_nan=True, allow_infinity=True),
                  st.sampled_from(["1.5", "", "nan", "x"]), st.floats(allow_nan=True).map(np.float64),
                  st.integers(-5, 5).map(np.int64))


@settings(max_examples=400, deadline=None, database=None)
@given(st.lists(st.dictionaries(st.sampled_from(NAMES + ("other",)), VALUE, max_size=6), min_size=1, max_size=6))
def test_a_batchs_matrix_is_each_maps_vector(maps):
    got = to_matrix(maps, NAMES)
    want = np.array([to_vector(m, NAMES) for m in maps], dtype=np.float64)
    assert got.shape == want.shape == (len(maps), len(NAMES)) and got.dtype == np.float64
    assert np.array_equal(got, want, equal_nan=True)
    numbers = ~np.isnan(want)
    assert np.array_equal(np.signbit(got[numbers]), np.signbit(want[numbers]))  # -0.0 stays -0.0


def test_strings_are_missing_not_parsed_and_infinities_are_missing():
    x = to_matrix([{"a": "1.5", "b": math.inf, "c": -math.inf, "d": True, "e": None}, {"a": 2, "b": 0.25}], NAMES)
    assert np.isnan(x[0, [0, 1, 2, 4]]).all() and x[0, 3] == 1.0
    assert x[1, 0] == 2.0 and x[1, 1] == 0.25 and np.isnan(x[1, 2:]).all()
    assert to_matrix([], NAMES).shape == (0, len(NAMES))
