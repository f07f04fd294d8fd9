"""The squared overlapping batch means of a long series in one jitted pass (`intervals._se_of`).

NumPy needs a prefix sum (`np.cumsum`, ~3 ns a value here: each sum is stored and read back) and
four more passes over a temporary per series; this loop keeps the two running sums it needs in
registers and writes each squared batch mean once. The arithmetic is NumPy's, operation for
operation (the sums in the same order, no fused or reordered operations), so the values are the
same to the last bit (tests/test_intervals.py checks it).
"""
from __future__ import annotations

from numba import njit

from .jit import JIT


@njit(nogil=True, **JIT)    # (nogil: the summary's series are computed on threads, metrics.each)
def batch_squares_nb(x, shift, m, indicator, b, out):
    """out[j] = ((c[j + b] - c[j]) / b) ** 2 for j = 0 .. n - b, c the prefix sums of v (c[0] = 0,
    c[i + 1] = c[i] + v[i], as np.cumsum) for v = x - shift or, with ``indicator``, v = 1{x <= shift}
    - m (a 0.0 / 1.0 indicator less its mean m)."""
    n = x.shape[0]
    one, zero = 1.0 - m, 0.0 - m      # the indicator's two centred values, as NumPy's ``ind - m``
    hi = 0.0                            # c[j + b]
    for i in range(b):
        v = (one if x[i] <= shift else zero) if indicator else x[i] - shift
        hi = v if i == 0 else hi + v
    lo = 0.0                            # c[j]
    for j in range(n - b + 1):
        q = (hi - lo) / b
        out[j] = q * q
        if j + b < n:
            v = (one if x[j] <= shift else zero) if indicator else x[j] - shift
            lo = v if j == 0 else lo + v
            w = x[j + b]
            hi += (one if w <= shift else zero) if indicator else w - shift
    return n - b + 1
