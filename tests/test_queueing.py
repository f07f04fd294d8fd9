"""The engine as a queueing system: with one replica, batch size one and one output token, each
request is a single prefill iteration, so the replica is a FIFO single-server queue with Poisson
arrivals. Service times come from the cost model (per-iteration overhead included)."""
from __future__ import annotations

import numpy as np
import pytest

from servesim.costmodel.fields import table
import servesim
from servesim.config import load_hardware, load_model
from servesim.costmodel import Layout, build_replica
from servesim.costmodel.iteration import iteration_components
from servesim.engine import codes as C
from servesim.engine.lower import EngineOptions, engine_config, one_pool_inputs
from servesim.engine.run import run

SEEDS = range(6)
N = 20000


@pytest.fixture(scope="module")
def rc():
    return build_replica(load_model("llama-3.1-8b"), load_hardware("h100-sxm"), Layout(1, 1, "bf16"), 0.9)


def prefill_time(params, isl: int) -> float:
    """Latency of one iteration that prefills a whole `isl`-token prompt and samples one token."""
    return iteration_components(table(params), float(isl), 1.0, 1.0, isl * (isl + 1) / 2.0, float(isl), 0.0, 0.0).latency


def lindley(arrival, service):
    """Start times of a FIFO single server: start_n = max(arrival_n, start_{n-1} + S_{n-1})."""
    start = np.empty_like(arrival)
    free_at = -np.inf
    for k in range(arrival.shape[0]):
        start[k] = max(arrival[k], free_at)
        free_at = start[k] + service[k]
    return start


def md1_run(rho, seed, S, isl=512, n=N):
    return servesim.simulate(max_num_seqs=1, isl=isl, osl=1, rate=rho / S, num_requests=n, seed=seed).requests


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_md1_mean_wait(rc, rho):
    """M/D/1: Wq = rho S / (2 (1 - rho)) (Pollaczek-Khinchine with deterministic service)."""
    S = prefill_time(rc.params, 512)
    waits = []
    for seed in SEEDS:
        df = md1_run(rho, seed, S)
        assert (df.status == "done").all()
        waits.append((df.scheduled_s - df.engine_arrival_s).mean())   # the engine's queue
        # every request is one iteration of exactly S
        np.testing.assert_array_equal(df.finish_s, df.scheduled_s + S)
    theory = rho * S / (2.0 * (1.0 - rho))
    tol = 0.05 if rho == 0.5 else 0.08
    assert np.mean(waits) == pytest.approx(theory, rel=tol)


def test_md1_path_is_lindley(rc):
    """Request by request, start times follow Lindley's recursion on the same arrivals."""
    S = prefill_time(rc.params, 512)
    df = md1_run(0.8, 11, S, n=3000)
    arrival = df.engine_arrival_s.to_numpy()
    start = lindley(arrival, np.full(arrival.shape, S))
    np.testing.assert_array_equal(df.scheduled_s.to_numpy(), start)


def test_mg1_pollaczek_khinchine(rc):
    """M/G/1 with uniform prompt lengths: Wq = lambda E[S^2] / (2 (1 - rho))."""
    lo, hi = 32, 2048
    support = np.arange(lo, hi + 1)
    s_of = np.array([prefill_time(rc.params, int(x)) for x in support])
    ES, ES2 = s_of.mean(), (s_of ** 2).mean()     # exact moments of the discrete uniform length
    assert s_of.std() / ES > 0.3                   # service is genuinely variable
    rho = 0.7
    lam = rho / ES
    cfg = engine_config(EngineOptions(max_num_seqs=1, max_num_batched_tokens=8192), rc)
    waits = []
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        arrival = np.concatenate(([0.0], np.cumsum(rng.exponential(1.0 / lam, N - 1))))
        prompt = rng.integers(lo, hi + 1, N).astype(np.int64)
        output = np.ones(N, np.int64)
        out = run(one_pool_inputs(rc.params, cfg, arrival, prompt, output, seed))
        assert (out.status == C.DONE).all()
        service = s_of[prompt - lo]
        np.testing.assert_array_equal(out.finish, out.scheduled + service)
        if seed == 0:
            np.testing.assert_array_equal(out.scheduled, lindley(arrival, service))
        waits.append(np.mean(out.scheduled - arrival))
    theory = lam * ES2 / (2.0 * (1.0 - rho))
    assert np.mean(waits) == pytest.approx(theory, rel=0.08)


def time_average_in_system(enter, leave, t0, t1):
    """Time-average of N(t) = #{enter <= t < leave} over [t0, t1], by sweeping the events."""
    times = np.concatenate([enter, leave])
    steps = np.concatenate([np.ones_like(enter), -np.ones_like(leave)])
    order = np.lexsort((steps, times))            # a departure before an arrival at the same instant
    times, steps = times[order], steps[order]
    n_after = np.cumsum(steps)                    # N just after each event
    t_clipped = np.clip(times, t0, t1)
    area = np.sum(n_after[:-1] * np.diff(t_clipped))
    return area / (t1 - t0)


def test_littles_law(rc):
    """L = lambda W on the output records, for the whole system and for the queue."""
    S = prefill_time(rc.params, 512)
    rho = 0.8
    df = md1_run(rho, 3, S)
    a = df.engine_arrival_s.to_numpy()   # the engine as the queueing system
    s = df.scheduled_s.to_numpy()
    f = df.finish_s.to_numpy()
    # over the whole path (empty at both ends) Little's law holds exactly
    T0, T1 = a.min(), f.max()
    L = time_average_in_system(a, f, T0, T1)
    assert L == pytest.approx(len(a) / (T1 - T0) * np.mean(f - a), rel=1e-9)
    # in a window of the steady state it holds approximately
    t0, t1 = np.quantile(a, [0.25, 0.75])
    inside = (a >= t0) & (a < t1)
    lam = inside.sum() / (t1 - t0)
    assert time_average_in_system(a, f, t0, t1) == pytest.approx(lam * np.mean((f - a)[inside]), rel=0.05)
    Lq = time_average_in_system(a, s, t0, t1)
    assert Lq == pytest.approx(lam * np.mean((s - a)[inside]), rel=0.05)
    # and the M/D/1 numbers: L = rho + Lq, Lq = rho^2 / (2 (1 - rho))
    assert L == pytest.approx(rho + rho ** 2 / (2 * (1 - rho)), rel=0.1)
    # the engine's own utilisation is rho
    r = servesim.simulate(max_num_seqs=1, isl=512, osl=1, rate=rho / S, num_requests=N, seed=3)
    assert r.summary["utilization"]["busy_fraction"] == pytest.approx(rho, rel=0.03)
    assert r.summary["utilization"]["mean_batch_size"] == 1.0
