"""Streamed runs (`--stream`): the chunked kernel against the kernel in one piece, request by request;
chunked request draws against `build_requests`; the log-binned quantiles within their stated bound;
the streamed summary against the exact one; records written in chunks; refusals; the backlog stop."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

import servesim
from servesim import loghist as H
from servesim.cli.main import main
from servesim.engine import codes as C
from servesim.engine import stream as S
from servesim.engine.kernel import simulate_pools
from servesim.engine.lower import EngineOptions, engine_config, one_pool_inputs, router_chunks, router_draws
from servesim.intervals import sorted_quantile
from servesim.workload import build_requests, load_workload
from servesim.workload.stream import arrival_marks, request_chunks

from clihelp import one_line_error

FIELDS = ("arrival", "scheduled", "first_token", "finish", "preemptions", "replica", "status", "max_gap")


def _chunked(inp, chunk):
    n = inp.prompt.shape[0]
    for a in range(0, n, chunk):
        yield tuple(x[a:a + chunk] for x in (inp.arrival, inp.prompt, inp.output, inp.u1, inp.u2))


@pytest.mark.parametrize("opts, rate, chunk, blocks, max_time", [
    (dict(replicas=2), 20.0, 256, None, math.inf),
    (dict(replicas=2), 60.0, 100, 300, math.inf),                         # preemption (recompute)
    (dict(replicas=2, preemption="swap"), 200.0, 64, 200, math.inf),      # overload, swapping
    (dict(replicas=2, scheduler="sarathi"), 20.0, 256, None, math.inf),
    (dict(replicas=1, scheduler="static"), 20.0, 256, None, math.inf),
    (dict(replicas=3, router="random"), 40.0, 256, None, 50.0),           # cut by --duration
])
def test_chunked_kernel_equals_one_piece(replica_cost, opts, rate, chunk, blocks, max_time):
    _check_chunked(replica_cost, opts, rate, chunk, blocks, max_time, 1500)


def test_chunked_kernel_short_run(replica_cost):
    """A short run with preemption, small enough for CI's run with numba's JIT off (coverage)."""
    full = _check_chunked(replica_cost, dict(replicas=2), 60.0, 40, 300, math.inf, 250)
    assert full.preemptions.sum() > 0


def test_stream_refuses_other_feature_sets(replica_cost):
    rc = replica_cost()
    cfg = engine_config(EngineOptions(max_num_seqs=8), rc)._replace(concurrency=4)
    inp = one_pool_inputs(rc.params, cfg, np.zeros(4), np.full(4, 10), np.full(4, 5), 0)
    with pytest.raises(ValueError, match="plain feature set"):
        S.run_stream(inp.ps, cfg, inp.pools, _chunked(inp, 2), lambda r, b: None)


def _check_chunked(replica_cost, opts, rate, chunk, blocks, max_time, n):
    rc = replica_cost()
    cfg = engine_config(EngineOptions(max_num_seqs=32, **opts), rc)._replace(max_time=max_time)
    if blocks:
        cfg = cfg._replace(num_blocks=blocks, watermark_blocks=1)
    rng = np.random.default_rng(1)
    arrival = np.concatenate(([0.0], np.cumsum(rng.exponential(1.0 / rate, n - 1))))
    inp = one_pool_inputs(rc.params, cfg, arrival, rng.integers(1, 3000, n), rng.integers(1, 400, n), 3)
    full = simulate_pools(*inp)
    got = []
    end = S.run_stream(inp.ps, cfg, inp.pools, _chunked(inp, chunk), lambda r, b: got.append((b, r.copy())))
    starts = [b for b, _ in got]
    rec = np.concatenate([r for _, r in got])
    assert starts == list(np.cumsum([0] + [len(r) for _, r in got])[:-1])     # in order, each request once
    assert end.chunks > 4 and end.loaded == len(rec)
    for f in FIELDS:
        assert np.array_equal(getattr(full, f)[:len(rec)], rec[f], equal_nan=True), f
    assert np.all(full.status[len(rec):] == C.NOT_ARRIVED)        # cut: the requests never loaded never arrived
    assert np.array_equal(full.stats, end.stats) and np.array_equal(full.gap_hist, end.gap_hist)
    assert np.array_equal(full.log_time, end.log[0]) and np.array_equal(full.log_seqs, end.log[2])
    return full


def test_backlog_stops_the_run(replica_cost):
    rc = replica_cost()
    cfg = engine_config(EngineOptions(max_num_seqs=8), rc)
    n = 4000
    inp = one_pool_inputs(rc.params, cfg, np.arange(n) / 500.0, np.full(n, 2000), np.full(n, 200), 0)
    got = []
    end = S.run_stream(inp.ps, cfg, inp.pools, _chunked(inp, 128), lambda r, b: got.append(len(r)), max_window=600)
    assert end.backlog and 600 <= end.peak_window < 600 + 128 and end.loaded < n and sum(got) == end.loaded


@pytest.mark.parametrize("workload", ["chat", "code", "long-context"])
@pytest.mark.parametrize("process, cv", [("poisson", 1.0), ("gamma", 2.0), ("deterministic", 1.0)])
def test_request_chunks_equal_build_requests(workload, process, cv):
    spec = load_workload(workload)
    for n, chunk in ((1001, 64), (5000, 998), (7, 2)):
        one = build_requests(spec, n, 5, rate=3.0, process=process, cv=cv, max_len=8192, osl=None)
        parts = list(request_chunks(spec, n, 5, rate=3.0, process=process, cv=cv, max_len=8192, chunk=chunk))
        for k, name in enumerate(("arrival", "prompt", "output")):
            assert np.array_equal(np.concatenate([p[k] for p in parts]), getattr(one, name)), name
        for warmup in (0.0, 10.0):
            a = one.arrival
            j0 = int(np.searchsorted(a, warmup))
            want = (j0, a[j0 + (n - j0) // 2], a[-1]) if j0 < n else (n, a[-1], a[-1])    # (none measured)
            assert arrival_marks(n, 5, rate=3.0, process=process, cv=cv, warmup=warmup, chunk=chunk) == want
    u1, u2 = router_draws(1001, 7)
    parts = list(router_chunks(1001, 7, 64))
    assert np.array_equal(np.concatenate([p[0] for p in parts]), u1)
    assert np.array_equal(np.concatenate([p[1] for p in parts]), u2)


def test_log_histogram_quantiles_within_the_stated_bound():
    # the bound: a bin spans a factor 1 + w and stands for its geometric middle, so sqrt(1 + w) - 1
    assert H.REL_ERROR == pytest.approx(math.sqrt(1.01) - 1) and H.REL_ERROR < 0.005
    rng = np.random.default_rng(0)
    worst = 0.0
    for trial in range(200):
        x = rng.lognormal(rng.normal(-3, 1.5), rng.uniform(0.1, 2.5), int(rng.integers(1, 3000)))
        x = x[(x >= H.LO) & (x <= H.HI)]
        if trial % 5 == 0:
            x[: x.size // 3] = 0.0          # zeros (a queueing delay) are counted exactly
        counts = np.bincount(H.bin_of(x), minlength=H.NBINS)
        half = np.bincount(H.bin_of(x[: x.size // 2]), minlength=H.NBINS) + \
            np.bincount(H.bin_of(x[x.size // 2:]), minlength=H.NBINS)
        assert np.array_equal(counts, half)         # mergeable: the counts of two parts add up
        xs = np.sort(x)
        for q in (0.0, 0.5, 0.9, 0.95, 0.99, 1.0):
            exact, got = sorted_quantile(xs, q), H.quantile(counts, q)
            worst = max(worst, abs(got - exact) / exact if exact > 0 else abs(got))
    assert worst <= H.REL_ERROR


def _flat(d, p=""):
    if isinstance(d, dict):
        return {k2: v2 for k, v in d.items() for k2, v2 in _flat(v, f"{p}.{k}" if p else k).items()}
    if isinstance(d, list):
        return {k2: v2 for i, v in enumerate(d) for k2, v2 in _flat(v, f"{p}[{i}]").items()}
    return {p: d}


def compare_summaries(exact: dict, streamed: dict) -> None:
    """Every figure the same, but the percentiles (within REL_ERROR), the intervals (other batches)
    and the figures summed in another order (to rounding)."""
    fa, fb = _flat(exact), _flat(streamed)
    for k, va in fa.items():
        if k.startswith("config") or ".ci95." in k:
            continue
        vb = fb[k]
        if isinstance(va, float) and re_pct(k):
            assert vb == pytest.approx(va, rel=H.REL_ERROR), k
        elif isinstance(va, float):
            assert vb == pytest.approx(va, rel=1e-9, abs=1e-12), k
        else:
            assert vb == va, k
    assert streamed["stream"]["quantile_relative_error"] == H.REL_ERROR


def re_pct(key: str) -> bool:
    last = key.rsplit(".", 1)[-1]
    return (last.startswith("p") and last[1:].isdigit() and not key.startswith("itl_ms")) or \
        key.endswith("value_ms")


def test_streamed_summary_matches_the_exact_one():
    kw = dict(num_requests=6000, rate=30.0, replicas=3, seed=1, slo="ttft_p99=300ms,tpot_p99=40ms", warmup=5.0)
    exact = servesim.simulate(stream=False, **kw)
    streamed = servesim.simulate(stream=True, **kw)
    assert streamed.requests is None and "stream" not in exact.summary
    assert streamed.summary["saturation_verdict"] == "stable"
    compare_summaries(exact.summary, streamed.summary)
    # the intervals: from other batches, still around the estimate and near the exact ones
    for m in ("ttft_ms", "e2e_ms"):
        lo, hi = streamed.summary[m]["ci95"]["mean"]
        elo, ehi = exact.summary[m]["ci95"]["mean"]
        assert lo < streamed.summary[m]["mean"] < hi and (hi - lo) == pytest.approx(ehi - elo, rel=0.5)
    assert servesim.simulate(stream=True, **kw).to_json() == streamed.to_json()      # deterministic
    from servesim.render import summary_table
    assert "(streamed: percentiles within 0.5% of the exact ones" in summary_table(streamed.summary)
    assert "streamed" not in summary_table(exact.summary)


def test_streamed_overload_is_saturated():
    kw = dict(num_requests=4000, rate=200.0, seed=2)
    exact, streamed = (servesim.simulate(stream=s, **kw).summary for s in (False, True))
    assert exact["saturation_verdict"] == streamed["saturation_verdict"] == "saturated"
    compare_summaries(exact, streamed)


def test_backlog_stop_is_reported_saturated(monkeypatch):
    monkeypatch.setattr(S, "MAX_WINDOW", 1000)
    monkeypatch.setattr(S, "CHUNK", 256)
    s = servesim.simulate(num_requests=200_000, rate=400.0, seed=0, stream=True).summary
    assert s["saturation_verdict"] == "saturated" and s["saturated"]
    assert s["saturation_reason"].startswith("the backlog reached") and s["num_requests"] == 200_000


def test_automatic_above_the_budget(monkeypatch):
    import servesim.engine.budget as B
    monkeypatch.setattr(B, "STREAM_ABOVE_BYTES", 1)
    s = servesim.simulate(num_requests=300, rate=5.0).summary
    assert s["config"]["stream"] is True and "stream" in s
    s = servesim.simulate(num_requests=300, rate=5.0, workload="sessions").summary     # cannot stream: exact
    assert "stream" not in s


def test_streamed_records_are_the_request_table(tmp_path):
    kw = dict(num_requests=3000, rate=20.0, seed=3)
    exact = servesim.simulate(**kw)
    servesim.simulate(stream=True, records=tmp_path / "r.csv", **kw)
    exact.requests.to_csv(tmp_path / "e.csv")
    assert (tmp_path / "r.csv").read_bytes() == (tmp_path / "e.csv").read_bytes()


@pytest.mark.slow       # ~9 s: the figures of two runs
def test_cli_stream_writes_the_same_records(tmp_path):
    args = ["simulate", "--num-requests", "3000", "--rate", "20", "--seed", "3", "--format", "json"]
    a = CliRunner().invoke(main, args + ["-o", str(tmp_path / "a")])
    b = CliRunner().invoke(main, args + ["--stream", "-o", str(tmp_path / "b")])
    assert a.exit_code == 0 and b.exit_code == 0, b.output
    assert (tmp_path / "a" / "requests.csv").read_bytes() == (tmp_path / "b" / "requests.csv").read_bytes()
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["stream"]["records"].endswith("requests.csv") and summary["config"]["stream"] is True
    assert not any(p.name.startswith(".servesim-partial") for p in (tmp_path / "b").iterdir())


@pytest.mark.parametrize("extra, names", [
    (["--pool", "h100-sxm:tp1:x2"], "--pool"),
    (["--concurrency", "4"], "--concurrency"),
    (["--workload", "sessions"], "sessions"),
    (["--arrival", "bursty"], "--arrival bursty"),
])
def test_stream_refused_in_one_line(extra, names):
    one_line_error("simulate", "--num-requests", "100", "--stream", *extra, must_contain=("--stream", names))


@pytest.mark.slow
def test_million_requests_quantiles_within_the_bound():
    kw = dict(num_requests=1_000_000, rate=80.0, replicas=4, seed=0, slo="ttft_p99=300ms")
    exact = servesim.simulate(stream=False, **kw).summary
    streamed = servesim.simulate(stream=True, **kw).summary
    compare_summaries(exact, streamed)
