"""np.argsort(x, kind="stable") of a long series of finite floats, in about three passes over it.

The metrics sort the completions by finish time (`metrics._throughput_ci`); NumPy's stable sort
(timsort) took ~40 ms for a million of them here. The values are spread over a known range, so a
bucket sort (Knuth, The Art of Computer Programming vol. 3, sec. 5.2.5; Cormen et al., Introduction
to Algorithms, 3rd ed., sec. 8.4) does it in linear time: each value goes to bucket
floor((x - min) / (max - min) * buckets), a nondecreasing function of x, by a counting sort that
keeps the index order, and each bucket (a few values) is then sorted by insertion, which keeps it
too. A stable sort's result is unique (equal values in index order), so it is NumPy's, index for
index (tests/test_order.py).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .jit import JIT
from .long_runs import LONG_ABOVE

JIT_ABOVE = LONG_ABOVE  # longer series go through the buckets; shorter ones through np.argsort
PER_BUCKET = 4          # values per bucket on average
INSERTION_MAX = 64      # a larger bucket (values bunched together) is merge-sorted instead


def stable_argsort(x: np.ndarray) -> np.ndarray:
    """np.argsort(x, kind="stable") (int64 indices)."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    n = x.shape[0]
    if n <= JIT_ABOVE or not np.isfinite(x).all():
        return np.argsort(x, kind="stable")
    lo, hi = float(x.min()), float(x.max())
    if not hi > lo:
        return np.arange(n, dtype=np.int64)     # all equal: index order
    buckets = n // PER_BUCKET
    out = np.empty(n, np.int64)
    bucket_argsort_nb(x, lo, buckets / (hi - lo), buckets, out)
    return out


@njit(**JIT)
def bucket_argsort_nb(x, lo, scale, buckets, out):
    """`stable_argsort` of finite x >= lo into ``out``: bucket floor((x - lo) * scale) (at most
    buckets - 1), buckets in order, each in x order, equal values in index order."""
    n = x.shape[0]
    start = np.zeros(buckets + 1, np.int64)
    for i in range(n):
        start[min(int((x[i] - lo) * scale), buckets - 1) + 1] += 1
    for k in range(buckets):
        start[k + 1] += start[k]
    fill = start[:buckets].copy()
    for i in range(n):      # counting sort: index order within a bucket (the bucket computed again)
        k = min(int((x[i] - lo) * scale), buckets - 1)
        out[fill[k]] = i
        fill[k] += 1
    for k in range(buckets):
        a, b = start[k], start[k + 1]
        if b - a > INSERTION_MAX:
            seg = out[a:b].copy()
            out[a:b] = seg[np.argsort(x[seg], kind="mergesort")]     # (numba's merge sort: stable)
            continue
        for j in range(a + 1, b):   # insertion: a value moves only past larger ones
            v = out[j]
            xv = x[v]
            i = j - 1
            while i >= a and x[out[i]] > xv:
                out[i + 1] = out[i]
                i -= 1
            out[i + 1] = v
