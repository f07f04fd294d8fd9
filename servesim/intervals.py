"""95% confidence intervals for means, quantiles and ratios of one run's autocorrelated series.

Requests that arrive close together share the engine's state (queue, batch, KV cache), so their
latencies are correlated and order-statistic or i.i.d. intervals are too narrow under load. Here:
batch means (Law & Kelton, Simulation Modeling and Analysis, 5th ed., sec. 9.5.3), overlapping
(`_se`), over a batch size chosen from the series' autocorrelation (`batch_size`), with Student-t
critical values. Series are in arrival order; the caller drops NaN values.
"""
from __future__ import annotations

import bisect
import functools
import math

import numpy as np

from .long_runs import LONG_ABOVE
from .t975 import T975

K_MIN = 3           # fewest batches: with fewer the t critical value explodes (t_1 = 12.7)
K_MAX = 30          # most batches: 10 to 30 batches lose little width and keep the bias small
                    # (Schmeiser 1982, "Batch size effects in the analysis of simulation output",
                    # Operations Research 30(3):556-568)
MAX_BATCH_CORR = 0.02  # batch size: adjacent batch means correlated at most this much; with
                       # lag-1 correlation r the batch-means variance is low by a factor ~1 + 2r
                       # (Law & Kelton sec. 9.5.3), so the half-width by ~2%
MIN_VALUES = 3 * K_MIN  # fewer values: no interval (None)
GROUP_ABOVE = 1 << 16  # longer series: the batch size is chosen on means of groups of g values (below)
JIT_ABOVE = LONG_ABOVE  # longer series: the batch means in one jitted pass (`_se_of`)
BRACKET_ABOVE = 1 << 16  # longer series: order statistics read from bands bracketed by a sample (`Ranked`)
SAMPLE = 8192          # ... of about this many values


def autocorrelation(x: np.ndarray) -> np.ndarray:
    """Sample autocorrelation rho_0..rho_{n-1} (biased estimator, divisor n), by FFT."""
    n = x.shape[0]
    size = 1 << (2 * n - 2).bit_length()      # a power of two >= 2n - 1: no circular wrap-around
    f = np.fft.rfft(x - x.mean(), size)       # (NumPy's FFT: scipy.fft costs ~0.1 s to import)
    acov = np.fft.irfft(f * np.conj(f), size)[:n]
    return acov / acov[0] if acov[0] > 0 else np.zeros(n)


def cutoff_lag(rho: np.ndarray, n: int) -> int:
    """Last lag of significant autocorrelation: the smallest m after which K_n = max(5, sqrt(log10 n))
    lags in a row have |rho| < 2 sqrt(log10(n) / n) (Politis & White 2004, Econometric Reviews
    23(1):53-70, sec. 3.2, after Politis 2003)."""
    c = 2.0 * math.sqrt(math.log10(n) / n)
    kn = max(5, math.ceil(math.sqrt(math.log10(n))))
    small = np.abs(rho[1:]) < c            # small[j - 1]: lag j
    if small.size < kn:
        return int(small.size)
    runs = np.convolve(small.astype(np.int64), np.ones(kn, np.int64), "valid")  # runs[i]: lags i+1..i+kn
    hit = np.flatnonzero(runs == kn)
    return int(hit[0]) if hit.size else int(small.size)


def batch_corr(rho: np.ndarray, m: int, b: np.ndarray) -> np.ndarray:
    """Correlation of adjacent means of batches of size b, for autocorrelations rho_1..rho_m (zero beyond):
    Var = (1/b^2) sum_{|j|<b} (b - |j|) rho_j, Cov = (1/b^2) sum_{j=1}^{2b-1} min(j, 2b - j) rho_j."""
    r = np.zeros(max(2 * int(b.max()), m) + 1)
    r[1:m + 1] = rho[1:m + 1]
    j = np.arange(r.size)
    cr, cs = np.cumsum(r), np.cumsum(j * r)         # R(t) = sum_{j<=t} rho_j, S(t) = sum_{j<=t} j rho_j
    var = b + 2.0 * (b * cr[b - 1] - cs[b - 1])
    cov = cs[b] + 2.0 * b * (cr[2 * b - 1] - cr[b]) - (cs[2 * b - 1] - cs[b])
    return cov / np.maximum(var, 1e-300)


def batch_size(x: np.ndarray) -> int:
    """Smallest batch size whose adjacent batch means correlate at most MAX_BATCH_CORR, from the
    autocorrelation of x truncated at its cutoff lag (`cutoff_lag`); 1 for fewer than MIN_VALUES.

    Above GROUP_ABOVE values the search runs on y, the means of consecutive groups of
    g = n // (GROUP_ABOVE / 2) values, in multiples of g: batches of k values of y are batches of g k
    values of x, so their adjacent correlation is the same quantity (Fishman 1978, "Grouping
    observations in digital simulation", Management Science 24(5):510-521). Only batch sizes above
    n / K_MAX change the interval (`num_batches`), and g stays below that, so nothing is lost; the
    autocorrelation's FFT shrinks from n values to 2^15."""
    n = x.shape[0]
    if n < MIN_VALUES:
        return 1
    g = n // (GROUP_ABOVE // 2) if n > GROUP_ABOVE else 1
    y = x[: n // g * g].reshape(-1, g).mean(axis=1) if g > 1 else x
    rho = autocorrelation(y)
    m = cutoff_lag(rho, y.shape[0])
    if m == 0:
        return g
    b = np.arange(1, y.shape[0] // K_MIN + 1)
    ok = np.flatnonzero(batch_corr(rho, m, b) <= MAX_BATCH_CORR)
    return g * int(b[ok[0]] if ok.size else b[-1])


def num_batches(n: int, b: int) -> int:
    """Batches for n values and batch size b: n // b, kept within [K_MIN, K_MAX]."""
    return int(min(max(n // max(b, 1), K_MIN), K_MAX))


def table_dfs() -> list[float]:
    """Every degrees of freedom the intervals use: 1.5 (k - 1) (`_se`) and k - 1 (separate batches,
    `totals_ratio_ci`, `metrics_stream`) for k = K_MIN..K_MAX batches."""
    return sorted({float(m * (k - 1)) for k in range(K_MIN, K_MAX + 1) for m in (1.0, 1.5)})


@functools.lru_cache(maxsize=256)
def _t(df: float) -> float:
    """Student-t 0.975 quantile: `t975.T975`'s value (scipy.special.stdtrit's, written ahead: importing
    scipy.special costs ~0.1 s of a run), else stdtrit's (lazy: scipy.stats costs ~1 s to import)."""
    t = T975.get(float(df))
    if t is not None:
        return t
    from scipy.special import stdtrit
    return float(stdtrit(df, 0.975))


def _se(x: np.ndarray, k: int) -> tuple[float, float]:
    """(standard error of the mean of x, degrees of freedom) by overlapping batch means of size
    b = n // k: var = n b / ((n - b + 1)(n - b)) sum_j (B_j - mean)^2 over all n - b + 1 batches, on
    1.5 (k - 1) degrees of freedom, 1.5 times those of k separate batches for the same bias (Meketon &
    Schmeiser 1984, "Overlapping batch means: something for nothing?", Proc. Winter Simulation Conf.)."""
    return _se_of(x, float(x.mean()), k)


def _se_of(x: np.ndarray, shift: float, k: int, m: float | None = None) -> tuple[float, float]:
    """`_se` of the series v = x - shift (``shift`` its mean) or, with ``m``, of the indicator
    v = 1{x <= shift} - m (m its mean), without making v. A series longer than JIT_ABOVE goes through
    `batchmeans.batch_squares_nb` (one pass, the same values to the last bit); a shorter one through
    NumPy, in place (two arrays of n values), sparing the compile of that loop to small runs."""
    n = x.shape[0]
    b = n // k
    if n > JIT_ABOVE:
        from .batchmeans import batch_squares_nb
        bm = np.empty(n - b + 1)
        batch_squares_nb(x, shift, 0.0 if m is None else m, m is not None, b, bm)
    else:
        c = np.empty(n + 1)
        v = c[1:]
        if m is None:
            np.subtract(x, shift, out=v)
        else:
            np.less_equal(x, shift, out=v)      # the indicator, as 0.0 / 1.0
            v -= m
        c[0] = 0.0
        np.cumsum(v, out=v)
        bm = c[b:] - c[:-b]
        bm /= b
        bm *= bm
    var = n * b / ((n - b + 1) * (n - b)) * float(np.sum(bm))
    return math.sqrt(var / n), 1.5 * (k - 1)


def sorted_quantile(sorted_x: np.ndarray, q: float) -> float:
    """np.quantile(x, q) (linear interpolation, h = (n - 1) q) of an already sorted array, without a copy."""
    h = (sorted_x.shape[0] - 1) * q
    i = int(math.floor(h))
    t = h - i
    a, b = sorted_x[i], sorted_x[min(i + 1, sorted_x.shape[0] - 1)]
    return float(b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t)   # as numpy's _lerp


def quantile_ranks(n: int, q: float) -> tuple[int, int]:
    """The two ranks (0-based, of n sorted values) `sorted_quantile` reads for the q-quantile."""
    i = int(math.floor((n - 1) * q))
    return i, min(i + 1, n - 1)


class Ranked:
    """The values np.sort(x) holds at the ranks asked for, read without sorting x; ``ranked[i]`` is
    then sorted(x)[i]. Stands in for the sorted array in `sorted_quantile` and `quantile_ci`.

    A series of up to BRACKET_ABOVE values: `need` partitions a copy of x around a batch of ranks
    (np.partition, O(n) where a sort is O(n log n)) and keeps the value at each. A rank known
    already splits the copy: the values before it are the smaller ones, so a later rank is found by
    partitioning only the stretch between the known ranks around it.

    A longer one: each rank is first looked for in a band of values bracketed from a sorted sample
    of x (every s-th value; the sample selection of Floyd & Rivest, "Expected time bounds for
    selection", CACM 18(3):165-172, 1975): with c values of x below the band, sorted(x)[r] is
    sorted(band)[r - c] when c <= r < c + len(band), else (a sample that misjudged x) the rank goes
    to the partitions above. The band is kept, so the intervals' bounds near a quantile are read
    from it. Each band costs a few passes over x and a partition of ~3% of it, where a partition of
    x visits it several times over."""

    def __init__(self, x: np.ndarray, ranks=()):
        self.shape, self._x = x.shape, np.asarray(x, dtype=np.float64)
        self._at, self._split, self._work = {}, [], None     # all ranks read; those that split the copy
        self._sample, self._bands = None, []    # bands: (values below, the band's values, lowest, highest)
        n = x.shape[0]
        if n > BRACKET_ABOVE:
            self._sample = np.sort(self._x[:: n // SAMPLE])
        self.need(ranks)

    def need(self, ranks) -> None:
        new = sorted({int(r) for r in ranks if 0 <= r < self.shape[0]} - self._at.keys())
        if self._sample is not None:
            new = self._from_bands(new)
        if not new:
            return
        if self._work is None:
            self._work = np.array(self._x)
        known = self._split
        stretches = {}      # (first, end) of a stretch between known ranks -> the new ranks in it
        for r in new:
            j = bisect.bisect(known, r)
            stretch = (known[j - 1] + 1 if j else 0, known[j] if j < len(known) else self.shape[0])
            stretches.setdefault(stretch, []).append(r)
        for (a, b), rs in stretches.items():
            self._work[a:b].partition([r - a for r in rs])
            self._at.update((r, self._work[r]) for r in rs)
        self._split = sorted(known + new)

    def _from_bands(self, ranks: list[int]) -> list[int]:
        """Reads ``ranks`` from bands (kept, or bracketed now); returns those no band holds."""
        n, m = self.shape[0], self._sample.shape[0]
        left, wanted = [], {}
        for r in ranks:
            band = next((bd for bd in self._bands if bd[0] <= r < bd[0] + bd[1].shape[0]), None)
            if band is None:
                q = r / (n - 1)
                w = int(3.0 * math.sqrt(m * q * (1.0 - q))) + 8     # ~3 sd of the sample's rank, and more
                j = int(q * (m - 1))
                band = self._band(self._sample[max(j - w, 0)], self._sample[min(j + w + 1, m - 1)])
                if not band[0] <= r < band[0] + band[1].shape[0]:
                    left.append(r)
                    continue
            wanted.setdefault(id(band), (band, []))[1].append(r)
        for (c, v, _, _), rs in wanted.values():
            v.partition([r - c for r in rs])
            self._at.update((r, v[r - c]) for r in rs)
        return left

    def _band(self, lo: float, hi: float):
        """x's values in [lo, hi], widened to take in the kept bands it overlaps, and kept."""
        overlap = [bd for bd in self._bands if bd[2] <= hi and lo <= bd[3]]
        for bd in overlap:
            lo, hi = min(lo, bd[2]), max(hi, bd[3])
        self._bands = [bd for bd in self._bands if not any(bd is o for o in overlap)]
        x = self._x
        below = int(np.count_nonzero(x < lo))      # (a NaN is neither below nor in: np.sort puts it last)
        inside = x >= lo
        inside &= x <= hi
        band = (below, x[inside], lo, hi)
        self._bands.append(band)
        return band

    def __getitem__(self, i: int):
        return self._at[int(i)]


def mean_ci(x: np.ndarray, b: int) -> tuple[float | None, float | None]:
    """Batch-means interval for the mean of x with batches of about b values."""
    n = x.shape[0]
    if n < MIN_VALUES:
        return None, None
    se, df = _se(x, num_batches(n, b))
    half = _t(df) * se
    mu = float(x.mean())
    return float(mu - half), float(mu + half)


def quantile_ci(x: np.ndarray, sorted_x: np.ndarray, q: float, b: int) -> tuple[float | None, float | None]:
    """Interval for the q-quantile: order statistics at ranks n q -/+ t n se, where se is the batch-means
    standard error of the mean of the indicator 1{x <= x_q} (for independent values
    se^2 = q (1 - q) / n, Conover 1999, Practical Nonparametric Statistics, sec. 3.2; for dependent
    ones the sample quantile's Bahadur representation, Sen 1972, J. Multivariate Analysis 2:77-95,
    gives the variance of F_n(x_q)). The standard error is never below the independent one. A rank
    beyond the sample gives None: too few values to bound the quantile on that side."""
    n = x.shape[0]
    if n < MIN_VALUES:
        return None, None
    lo, hi = quantile_ci_ranks(x, sorted_quantile(sorted_x, q), q, b)
    return (float(sorted_x[lo]) if lo >= 0 else None), (float(sorted_x[hi]) if hi <= n - 1 else None)


def quantile_ci_ranks(x: np.ndarray, xq: float, q: float, b: int) -> tuple[int, int]:
    """The ranks of `quantile_ci`'s bounds (beyond 0..n-1: no bound on that side), ``xq`` the
    q-quantile of x."""
    n = x.shape[0]
    m = np.count_nonzero(x <= xq) / n   # the indicator's mean (a sum of 0.0 / 1.0 is exact: as its .mean())
    se, df = _se_of(x, xq, num_batches(n, b), m)
    half = _t(df) * n * max(se, math.sqrt(q * (1 - q) / n))
    return math.floor(n * q - half), math.ceil(n * q + half)


def ratio_ci(num: np.ndarray, den: np.ndarray, b: int) -> tuple[float | None, float | None]:
    """Interval for sum(num) / sum(den) by the delta method on batch means: the standard error of
    the ratio R is that of mean(num - R den) / mean(den) (Asmussen & Glynn 2007, Stochastic
    Simulation, ch. III.3)."""
    n = num.shape[0]
    if n < MIN_VALUES or den.sum() <= 0:
        return None, None
    r = float(num.sum() / den.sum())
    d = r * den
    np.subtract(num, d, out=d)
    se, df = _se(d, num_batches(n, b))
    half = _t(df) * se / float(den.mean())
    return float(r - half), float(r + half)


def totals_ratio_se(num: np.ndarray, den: np.ndarray) -> tuple[float | None, float, int]:
    """(sum(num) / sum(den), its standard error, batches) from per-batch totals (a streamed run keeps
    totals, not the series): the delta method of `ratio_ci` with each batch one observation, over the
    batches with den > 0 (None with fewer than K_MIN)."""
    keep = den > 0
    k = int(keep.sum())
    if k < K_MIN or den.sum() <= 0:
        return None, 0.0, k
    r = float(num.sum() / den.sum())
    d = num[keep] - r * den[keep]
    return r, math.sqrt(float(np.var(d, ddof=1)) / k) / float(den[keep].mean()), k


def totals_ratio_ci(num: np.ndarray, den: np.ndarray) -> tuple[float | None, float | None]:
    """Interval for sum(num) / sum(den) from per-batch totals (`totals_ratio_se`), Student-t on k - 1
    degrees of freedom (separate batches: Law & Kelton sec. 9.5.3)."""
    r, se, k = totals_ratio_se(num, den)
    if r is None:
        return None, None
    half = _t(k - 1) * se
    return float(r - half), float(r + half)
