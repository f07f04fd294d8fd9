"""servesim.order.stable_argsort: NumPy's stable argsort, index for index, through the buckets."""
from __future__ import annotations

import numpy as np

from servesim import order as O


def test_stable_argsort_is_numpys_stable_argsort():
    """Ties (equal values keep index order), +-0, values bunched into one bucket (merge-sorted), a
    nearly sorted series (finish times), a constant one, NaNs (left to NumPy), short series."""
    rng = np.random.default_rng(3)
    n = O.JIT_ABOVE + 4321
    bunched = np.r_[np.zeros(n - 5), rng.random(5) * 1e9]
    signed = rng.random(n)
    signed[:100], signed[100:200] = -0.0, 0.0
    with_nan = rng.random(n)
    with_nan[::97] = np.nan
    cases = [rng.random(n), np.round(rng.random(n), 3), np.round(rng.lognormal(size=n) * 100), bunched, signed,
             np.cumsum(rng.random(n)) + rng.normal(0, 50, n), np.full(n, 2.5), with_nan, rng.random(500),
             -rng.lognormal(size=n)]
    for x in cases:
        got = O.stable_argsort(x)
        assert got.dtype == np.int64
        assert np.array_equal(got, np.argsort(x, kind="stable"))
