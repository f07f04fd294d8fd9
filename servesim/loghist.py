"""Log-binned histograms of positive values: mergeable (counts add), with a stated quantile error.

Bin k >= 1 holds (LO (1 + w)^(k-1), LO (1 + w)^k] with relative width w = `REL_WIDTH`; bin 0 holds
zero (and the negative values, which latencies do not take). A bin stands for its geometric middle,
so every value in it is within a factor sqrt(1 + w) of that: `REL_ERROR` = sqrt(1 + w) - 1.

A quantile is read as the sorted sample's is (`intervals.sorted_quantile`, NumPy's linear rule):
the order statistics at ranks floor(h) and floor(h) + 1 interpolated, each replaced by its bin's
middle. Both are within REL_ERROR of the true order statistics and the interpolation is a convex
combination, so the quantile is within REL_ERROR of the exact one (for values in [LO, HI]; values
below LO, 0.1 us, are counted in the first bin, those above HI in the last).
"""
from __future__ import annotations

import math

import numpy as np

REL_WIDTH = 0.01                            # bin k spans a factor 1 + REL_WIDTH
REL_ERROR = math.sqrt(1.0 + REL_WIDTH) - 1.0  # 0.4988%: the bound on a quantile's relative error
LO, HI = 1e-7, 1e7                          # s
NBINS = 1 + math.ceil(math.log(HI / LO) / math.log1p(REL_WIDTH))
_LOG_STEP = math.log1p(REL_WIDTH)


def bin_of(x: np.ndarray) -> np.ndarray:
    """The bin of each value (finite values only)."""
    x = np.asarray(x, dtype=np.float64)
    k = np.floor(np.log(np.maximum(x, LO) / LO) / _LOG_STEP).astype(np.int64) + 1
    return np.where(x > 0.0, np.clip(k, 1, NBINS - 1), 0)


def middles() -> np.ndarray:
    """The value each bin stands for (bin 0: 0)."""
    k = np.arange(NBINS, dtype=np.float64)
    return np.where(k > 0, LO * np.exp((k - 0.5) * _LOG_STEP), 0.0)


def order_stat(cum: np.ndarray, mid: np.ndarray, r: int) -> float:
    """The value standing for the order statistic of rank r (0-based), from cumulative counts."""
    return float(mid[int(np.searchsorted(cum, r, side="right"))])


def quantile(counts: np.ndarray, q: float) -> float | None:
    """The q-quantile of the values counted (None: no values), within REL_ERROR of the exact one."""
    cum = np.cumsum(counts)
    n = int(cum[-1]) if cum.size else 0
    if n == 0:
        return None
    mid = middles()
    h = (n - 1) * q
    i = int(math.floor(h))
    t = h - i
    a, b = order_stat(cum, mid, i), order_stat(cum, mid, min(i + 1, n - 1))
    return float(b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t)     # as intervals.sorted_quantile
