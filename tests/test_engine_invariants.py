"""Conservation and ordering invariants of the engine, checked with property-based tests.

The reference simulator raises `KVAccountingError` if KV blocks go negative, above capacity or do
not all return to the pool; the kernel must agree with it exactly, so its accounting is as sound.
"""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import servesim
from servesim.engine import codes as C
from servesim.engine import kernel as K
from servesim.reference.sim import KVAccountingError, KVCache

FIELDS = ("arrival", "scheduled", "first_token", "finish", "preemptions", "replica", "status", "max_gap")


@st.composite
def scenarios(draw):
    block_size = draw(st.sampled_from([1, 4, 16]))
    opts = dict(
        scheduler=draw(st.sampled_from(list(C.POLICIES))),
        router=draw(st.sampled_from(list(C.ROUTERS))),
        preemption=draw(st.sampled_from(list(C.PREEMPTION))),
        replicas=draw(st.integers(1, 3)),
        max_num_seqs=draw(st.integers(1, 12)),
        max_num_batched_tokens=draw(st.integers(8, 600)),
        chunk_size=draw(st.integers(8, 300)),
        block_size=block_size,
        concurrency=draw(st.sampled_from([0, 0, 1, 3, 8])),
    )
    scen = dict(
        pp=draw(st.sampled_from([1, 2, 4])),
        num_blocks=draw(st.integers(4, 60)) * 16 // block_size,
        watermark_blocks=draw(st.integers(0, 3)),
        n=draw(st.integers(1, 80)),
        seed=draw(st.integers(0, 2**16)),
        rate=draw(st.floats(5.0, 400.0)),
        max_prompt=draw(st.integers(1, 900)),
        max_output=draw(st.integers(1, 80)),
    )
    return opts, scen


@settings(max_examples=120, deadline=None)
@given(scenarios())
def test_conservation_and_ordering(replica_cost, small_engine, small_workload, run_both, scenario):
    opts, sc = scenario
    rc = replica_cost(1, sc["pp"])
    cfg = small_engine(rc, num_blocks=sc["num_blocks"], watermark_blocks=sc["watermark_blocks"], **opts)
    cfg = cfg._replace(max_time=1e4)    # far beyond any normal end: a livelock fails instead of hanging
    arrival, prompt, output = small_workload(sc["n"], sc["seed"], sc["rate"], sc["max_prompt"], sc["max_output"])
    out, ref = run_both(rc, cfg, arrival, prompt, output, seed=sc["seed"])   # the reference checks KV
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(out, name), ref[name], err_msg=name)
    event(f"preempted: {bool(out.preemptions.any())}")
    event(f"rejected: {bool((out.status == C.REJECTED).any())}")

    # every request ends exactly once, as done or rejected
    assert np.isin(out.status, [C.DONE, C.REJECTED]).all()
    assert np.isfinite(out.finish).all()
    done = out.status == C.DONE
    rej = ~done
    # rejected: exactly those that can never fit, at arrival, never scheduled
    too_big = -(-(prompt + output) // cfg.block_size) > cfg.num_blocks - cfg.watermark_blocks
    np.testing.assert_array_equal(rej, too_big)
    assert np.all(out.finish[rej] == out.arrival[rej])
    assert np.isnan(out.scheduled[rej]).all() and np.isnan(out.first_token[rej]).all()
    # done: tokens generated equal tokens asked, timestamps in order
    np.testing.assert_array_equal(ref["generated"][done], output[done])
    a, s, f1, f = out.arrival[done], out.scheduled[done], out.first_token[done], out.finish[done]
    assert np.all(a <= s) and np.all(s < f1) and np.all(f1 <= f)
    one = output[done] == 1
    assert np.all(f1[one] == f[one]) and np.all(out.max_gap[done][one] == 0.0)
    many = ~one
    span = (f - f1)[many]
    gaps = out.max_gap[done][many]
    assert np.all(gaps > 0.0) and np.all(gaps <= span * (1 + 1e-12))
    assert np.all(gaps * (output[done][many] - 1) >= span * (1 - 1e-12))   # max gap >= mean gap
    # gaps histogrammed: one per token after the first (warm-up 0)
    assert out.gap_hist.sum() == np.sum(output[done] - 1)
    # KV: never above capacity; every block back in the pool
    assert out.stats[K.STAT_KV_MAX] <= cfg.num_blocks
    assert np.all(ref["free_blocks"] == cfg.num_blocks)
    # closed loop: at most `concurrency` requests in the system at any time
    if cfg.concurrency > 0:
        events = sorted([(t, 1) for t in out.arrival] + [(t, -1) for t in out.finish])
        assert max(np.cumsum([d for _, d in events])) <= cfg.concurrency


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 50), st.lists(st.tuples(st.booleans(), st.integers(-3, 60)), max_size=60))
def test_kv_pool_never_negative_or_over(capacity, ops):
    pool = KVCache(capacity)       # without prefix-cache entries: a plain block pool
    held = 0
    for take, n in ops:
        ok = 0 <= n <= (capacity - held if take else held)
        if ok:
            (pool.take if take else pool.give_back)(n)
            held += n if take else -n
        else:
            with pytest.raises(KVAccountingError):
                (pool.take if take else pool.give_back)(n)
        assert pool.free == capacity - held and 0 <= pool.free <= capacity


@pytest.mark.parametrize("policy", ["vllm", "sarathi"])
def test_pipeline_preemption_terminates(policy, replica_cost, small_engine, small_workload, run_both):
    """Regression: with PP > 1 a request used to preempt itself while the request that took its
    blocks was in flight, and two long prompts could swap places forever (a livelock)."""
    rc = replica_cost(1, 4)
    cfg = small_engine(rc, num_blocks=48, watermark_blocks=0, scheduler=policy, router="least-requests",
                       replicas=2, duration=1e4)
    arrival, prompt, output = small_workload(100, 3, 150.0)
    out, ref = run_both(rc, cfg, arrival, prompt, output)
    assert np.isin(out.status, [C.DONE, C.REJECTED]).all()
    assert out.stats[K.STAT_END_TIME] < 60.0
    assert out.preemptions.sum() > 0
    np.testing.assert_array_equal(out.finish, ref["finish"])


def test_determinism():
    a = servesim.simulate(num_requests=200, seed=3).to_json()
    b = servesim.simulate(num_requests=200, seed=3).to_json()
    c = servesim.simulate(num_requests=200, seed=4).to_json()
    assert a == b
    assert a != c
    assert json.loads(a)["num_completed"] == 200


def test_overload_terminates_and_saturates():
    offline = servesim.simulate(num_requests=400, seed=0, offline=True)
    capacity = offline.summary["throughput"]["requests_per_s"]
    t = time.perf_counter()
    r = servesim.simulate(num_requests=2000, seed=0, rate=10 * capacity)
    assert time.perf_counter() - t < 30.0
    assert r.summary["saturated"] is True
    assert r.summary["num_completed"] + r.summary["num_rejected"] == 2000
    assert r.summary["queue_growth"]["fraction_of_arrivals"] > 0.5


def test_duration_cutoff_reports_saturation():
    r = servesim.simulate(num_requests=3000, seed=0, duration=5.0)
    s = r.summary
    assert s["saturated"] is True
    assert s["duration_s"] <= 5.0
    assert s["num_completed"] < 3000
    unfinished = ~r.requests.status.isin(["done", "rejected"])
    assert unfinished.any() and r.requests.finish_s[unfinished].isna().all()
