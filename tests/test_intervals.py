"""servesim.intervals: batch-means intervals over a batch size chosen from the autocorrelation,
checked against slow direct twins and by coverage on AR(1) series whose mean and quantiles are known."""
from __future__ import annotations

import json
import math

import numpy as np
from scipy import stats

import servesim
from servesim import intervals as I
from servesim.render import summary_table


def ar1(n: int, phi: float, rng) -> np.ndarray:
    """Stationary Gaussian AR(1): x_t = phi x_{t-1} + e_t, Var x = 1 / (1 - phi^2), rho_j = phi^j."""
    e = rng.standard_normal(n)
    x = np.empty(n)
    x[0] = e[0] / math.sqrt(1 - phi * phi)
    for t in range(1, n):
        x[t] = phi * x[t - 1] + e[t]
    return x


def test_autocorrelation_matches_direct_sums():
    x = np.random.default_rng(0).exponential(size=500)
    d = x - x.mean()
    direct = np.array([d[: len(d) - j] @ d[j:] for j in range(60)]) / (d @ d)
    assert np.allclose(I.autocorrelation(x)[:60], direct, rtol=0, atol=1e-12)


def test_batch_corr_matches_the_covariance_of_batch_sums():
    """Correlation of adjacent batch means, from rho truncated at m, against the full covariance matrix."""
    m, phi = 30, 0.8
    rho = np.r_[1.0, phi ** np.arange(1, 200)]
    for b in (1, 2, 7, 20, 45):
        n = 2 * b
        lag = np.abs(np.subtract.outer(np.arange(n), np.arange(n)))
        cov = np.where(lag <= m, rho[np.minimum(lag, len(rho) - 1)], 0.0)
        w1, w2 = np.r_[np.ones(b), np.zeros(b)], np.r_[np.zeros(b), np.ones(b)]
        direct = (w1 @ cov @ w2) / (w1 @ cov @ w1)
        assert math.isclose(I.batch_corr(rho, m, np.array([b]))[0], direct, rel_tol=1e-9), b


def test_cutoff_lag_finds_the_end_of_a_moving_average():
    """MA(5) with equal weights: rho_j = (6 - j) / 6 up to lag 5, zero beyond."""
    e = np.random.default_rng(1).standard_normal(20_005)
    x = np.convolve(e, np.ones(6), "valid")
    assert 4 <= I.cutoff_lag(I.autocorrelation(x), x.size) <= 7
    iid = np.random.default_rng(2).standard_normal(20_000)
    assert I.cutoff_lag(I.autocorrelation(iid), iid.size) <= 1


def test_batch_size_grows_with_the_correlation():
    rng = np.random.default_rng(3)
    sizes = [I.batch_size(ar1(5000, phi, rng)) for phi in (0.0, 0.5, 0.9)]
    assert sizes[0] <= 2 < sizes[1] < sizes[2]
    # the size the true AR(1) autocorrelation asks for, up to estimation: within a factor 2
    rho = 0.9 ** np.arange(5000 // 3 + 1)
    b = np.arange(1, 5000 // 3 + 1)
    true = int(b[np.flatnonzero(I.batch_corr(rho, len(rho) - 1, b) <= I.MAX_BATCH_CORR)[0]])
    assert true / 2 <= sizes[2] <= 2 * true, (sizes, true)


def test_long_series_choose_the_batch_count_of_the_ungrouped_search(monkeypatch):
    """Above GROUP_ABOVE values the batch size is searched on group means; the intervals see it only
    through num_batches, which must equal that of the search on every value, weak to strong correlation
    (the true AR(1) batch size ranges from 1 to beyond n / 3 here)."""
    rng = np.random.default_rng(5)
    n = 2 * I.GROUP_ABOVE + 123
    for phi in (0.0, 0.9, 0.999, 0.99995):
        x = ar1(n, phi, rng)
        grouped = I.num_batches(n, I.batch_size(x))
        with monkeypatch.context() as m:
            m.setattr(I, "GROUP_ABOVE", 10 * n)
            direct = I.num_batches(n, I.batch_size(x))
        assert grouped == direct, (phi, grouped, direct)


def test_intervals_cover_an_autocorrelated_series():
    """AR(1), phi = 0.9 (integrated autocorrelation time 19), 2,000 values, 300 seeds: the batch-means
    intervals hold the true mean and quantiles in 90-99% of seeds; i.i.d. ones would not."""
    phi, n = 0.9, 2000
    sd = 1 / math.sqrt(1 - phi * phi)
    rng = np.random.default_rng(4)
    hit = {"mean": [], 0.5: [], 0.9: [], "iid mean": [], "iid p90": []}
    for _ in range(300):
        x = ar1(n, phi, rng)
        xs = np.sort(x)
        b = I.batch_size(x)
        lo, hi = I.mean_ci(x, b)
        hit["mean"].append(lo <= 0.0 <= hi)
        for q in (0.5, 0.9):
            lo, hi = I.quantile_ci(x, xs, q, b)
            hit[q].append((lo is None or lo <= sd * stats.norm.ppf(q)) and (hi is None or sd * stats.norm.ppf(q) <= hi))
        half = 1.96 * x.std(ddof=1) / math.sqrt(n)
        hit["iid mean"].append(abs(x.mean()) <= half)
        r = 1.96 * math.sqrt(n * 0.9 * 0.1)
        hit["iid p90"].append(xs[math.floor(0.9 * n - r)] <= sd * stats.norm.ppf(0.9) <= xs[math.ceil(0.9 * n + r)])
    cov = {k: float(np.mean(v)) for k, v in hit.items()}
    for k in ("mean", 0.5, 0.9):
        assert 0.90 <= cov[k] <= 0.99, cov
    assert cov["iid mean"] < 0.6 and cov["iid p90"] < 0.7, cov


def test_ratio_interval_covers():
    rng = np.random.default_rng(5)
    hits = []
    for _ in range(300):
        den = rng.integers(1, 400, 1000).astype(float)
        num = den * rng.exponential(0.02, 1000)        # ratio sum(num) / sum(den) -> E[X] = 0.02
        lo, hi = I.ratio_ci(num, den, 1)
        hits.append(lo <= 0.02 <= hi)
    assert 0.90 <= np.mean(hits) <= 0.99


def test_few_values_give_no_bound_rather_than_a_narrow_one():
    x = np.arange(1.0, 6.0)
    assert I.mean_ci(x, 1) == (None, None)
    assert I.quantile_ci(x, x, 0.5, 1) == (None, None)
    y = np.random.default_rng(6).exponential(size=50)
    lo, hi = I.quantile_ci(y, np.sort(y), 0.99, 1)
    assert hi is None and lo is not None and lo <= np.quantile(y, 0.99)   # rank 49.5 + 2.3 beyond 50 values


def test_summary_reports_ci95_for_every_latency_and_the_table_shows_it():
    r = servesim.simulate(num_requests=300, seed=2)
    s = json.loads(json.dumps(r.summary))            # plain floats and None only
    for key in ("ttft_ms", "tpot_ms", "e2e_ms", "queue_ms"):
        for stat in ("mean", "p50", "p90", "p95", "p99"):
            lo, hi = s[key]["ci95"][stat]
            assert (lo is None or lo <= s[key][stat]) and (hi is None or s[key][stat] <= hi), (key, stat)
    lo, hi = s["itl_ms"]["ci95"]["mean"]
    assert lo < s["itl_ms"]["mean"] < hi
    assert s["itl_ms"]["ci95"]["p99"] == [None, None]
    t = s["throughput"]
    for key in ("requests_per_s", "input_tokens_per_s", "output_tokens_per_s", "output_tokens_per_s_per_gpu",
                "total_tokens_per_s"):
        lo, hi = t["ci95"][key]
        assert lo < t[key] < hi, key
    table = summary_table(r.summary)
    assert table.count("95% CI") == 5
    lo, hi = t["ci95"]["requests_per_s"]
    assert f"req/s [{lo:.2f}, {hi:.2f}]" in table


def test_ranked_reads_the_sorted_values_without_a_sort():
    rng = np.random.default_rng(7)
    for x in (rng.lognormal(size=5001), rng.integers(0, 20, 3000).astype(np.float64), np.ones(10)):
        xs = np.sort(x)
        r = I.Ranked(x, [0, len(x) - 1])
        ranks = list(rng.integers(0, len(x), 40)) + [len(x) // 2]
        r.need(ranks[:20])
        r.need(ranks[20:] + [-1, len(x)])            # beyond the sample: ignored
        for i in [0, len(x) - 1] + ranks:
            assert r[i] == xs[i]
        for q in (0.5, 0.9, 0.99):
            assert I.quantile_ranks(len(x), q)[0] == int(np.floor((len(x) - 1) * q))
            assert I.sorted_quantile(I.Ranked(x, I.quantile_ranks(len(x), q)), q) == I.sorted_quantile(xs, q)
            lo, hi = I.quantile_ci(x, xs, q, 10)
            r.need(I.quantile_ranks(len(x), q) + I.quantile_ci_ranks(x, I.sorted_quantile(xs, q), q, 10))
            assert (lo, hi) == I.quantile_ci(x, r, q, 10)


def test_describe_equals_the_sorted_computation():
    """metrics.describe reads order statistics by partition: the same figures as from np.sort."""
    from servesim.metrics import PCTS, describe
    x = np.random.default_rng(3).gamma(2.0, 0.05, 20_000)
    got = describe(x, 25)
    xs = np.sort(x)
    for p in PCTS:
        assert got[f"p{p}"] == I.sorted_quantile(xs, p / 100) * 1e3
        want = [None if v is None else v * 1e3 for v in I.quantile_ci(x, xs, p / 100, 25)]
        assert got["ci95"][f"p{p}"] == want


def test_t_table_is_scipys_stdtrit_for_every_df_used():
    """servesim/t975.py (experiments/t975_table.py) holds stdtrit(df, 0.975) exactly, for every df the
    intervals can ask for: 1.5 (k - 1) and k - 1 batches of K_MIN..K_MAX; other df still go to scipy."""
    from scipy.special import stdtrit
    from servesim.t975 import T975
    used = {1.5 * (k - 1) for k in range(I.K_MIN, I.K_MAX + 1)} | {float(k - 1) for k in range(I.K_MIN, I.K_MAX + 1)}
    assert used == set(I.table_dfs()) == set(T975)
    for df in sorted(used):
        assert T975[df] == float(stdtrit(df, 0.975)), df
        assert I._t(df) == float(stdtrit(df, 0.975))
    assert I._t(100.0) == float(stdtrit(100.0, 0.975)) and 100.0 not in T975


def _numpy_batch_squares(v: np.ndarray, b: int) -> np.ndarray:
    """The squared overlapping batch means of v as NumPy computes them (prefix sums, differences)."""
    c = np.concatenate(([0.0], np.cumsum(v)))
    bm = (c[b:] - c[:-b]) / b
    return bm * bm


def test_jitted_batch_means_are_numpys_to_the_last_bit():
    """batchmeans.batch_squares_nb (series longer than JIT_ABOVE) gives NumPy's values bit for bit,
    for a series less its mean and for a centred indicator, at every batch size the intervals use."""
    from servesim.batchmeans import batch_squares_nb
    rng = np.random.default_rng(11)
    for trial in range(60):
        n = int(rng.integers(I.MIN_VALUES, 5000)) if trial < 50 else int(rng.integers(100_000, 300_000))
        x = rng.lognormal(size=n) * 10.0 ** rng.integers(-3, 4)
        if trial % 3 == 0:
            x = np.round(x, 1)          # ties
        b = n // I.num_batches(n, int(rng.integers(1, n)))
        out = np.empty(n)
        mu = float(x.mean())
        k = batch_squares_nb(x, mu, 0.0, False, b, out)
        assert np.array_equal(out[:k], _numpy_batch_squares(x - mu, b)), (n, b)
        xq = float(x[rng.integers(n)])
        ind = (x <= xq).astype(np.float64)
        m = np.count_nonzero(x <= xq) / n
        assert m == ind.mean()
        k = batch_squares_nb(x, xq, m, True, b, out)
        assert np.array_equal(out[:k], _numpy_batch_squares(ind - ind.mean(), b)), (n, b)


def test_intervals_are_the_same_through_numpy_and_the_jitted_pass(monkeypatch):
    """mean, quantile and ratio intervals of a long series: the same floats with and without the jit."""
    rng = np.random.default_rng(12)
    x = ar1(I.JIT_ABOVE + 4321, 0.7, rng) + 5.0
    den = rng.exponential(size=x.size)
    b = I.batch_size(x)

    def figures():
        xs = np.sort(x)
        return (I.mean_ci(x, b), I.ratio_ci(x, den, b), I._se(x, 7)) + tuple(
            I.quantile_ci_ranks(x, I.sorted_quantile(xs, q), q, b) for q in (0.5, 0.9, 0.99))

    jitted = figures()
    monkeypatch.setattr(I, "JIT_ABOVE", x.size)
    assert figures() == jitted


def test_ranked_reads_a_long_series_from_bands_as_a_sort_would():
    """Over BRACKET_ABOVE values Ranked reads ranks from sample-bracketed bands: the same values as
    np.sort, with ties, NaNs (sorted last), a series in order or drifting (the sample every s-th
    value), and ranks the first band missed (a later band, or the partition when none holds it)."""
    rng = np.random.default_rng(13)
    n = I.BRACKET_ABOVE + 12_345
    cases = [rng.lognormal(size=n), np.round(rng.lognormal(size=n), 1), np.sort(rng.random(n)),
             np.cumsum(rng.standard_normal(n)), rng.integers(0, 3, n).astype(np.float64)]
    cases[0][rng.integers(0, n, 50)] = np.nan
    for x in cases:
        xs = np.sort(x)
        r = I.Ranked(x, [n // 2, n // 2 + 1, int(0.99 * n)])
        asked = [n // 2, n // 2 + 1, int(0.99 * n)]
        for _ in range(3):
            more = [int(k) for k in rng.integers(0, n, 6)] + [0, n - 1, n // 2 + 700]
            r.need(more)
            asked += more
        assert r._bands, "the long series' path"
        for k in asked:
            assert r[k] == xs[k] or (np.isnan(r[k]) and np.isnan(xs[k])), k
