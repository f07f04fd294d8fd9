"""The jitted engine and the pure-Python reference agree exactly, request by request."""
from __future__ import annotations

import math

import numpy as np
import pytest

from servesim.costmodel import speculative as S
from servesim.engine import codes as C
from servesim.engine import kernel as K
from servesim.engine import state as ST
from servesim.engine.lower import spec_inputs

POLICIES = list(C.POLICIES)
ROUTERS = list(C.ROUTERS)
PER_REQUEST = ("arrival", "scheduled", "first_token", "finish", "preemptions", "replica", "status",
               "max_gap", "gap_hist")


def assert_agree(out, ref):
    for name in PER_REQUEST:
        np.testing.assert_array_equal(getattr(out, name), ref[name], err_msg=name)
    s = out.stats
    assert s[K.STAT_ITERATIONS] == ref["iterations"]
    assert s[K.STAT_END_TIME] == ref["end_time"]
    assert s[K.STAT_BUSY] == ref["busy"]
    assert s[K.STAT_STAGE_BUSY] == ref["stage_busy"]
    assert s[K.STAT_INFLIGHT_TIME] == ref["inflight_time"]
    assert s[K.STAT_KV_MAX] == ref["kv_max"]
    assert s[K.STAT_SWAP_TIME] == ref["swap_time"]
    assert s[K.STAT_PREEMPTIONS] == ref["total_preemptions"] == out.preemptions.sum()


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("policy", POLICIES)
def test_policy_by_router(policy, router, replica_cost, small_engine, small_workload, run_both):
    rc = replica_cost()
    cfg = small_engine(rc, scheduler=policy, router=router, replicas=3)
    arrival, prompt, output = small_workload(n=150, seed=1, rate=120.0)
    out, ref = run_both(rc, cfg, arrival, prompt, output, seed=7)
    assert_agree(out, ref)
    assert set(np.unique(out.status)) <= {C.DONE, C.REJECTED}
    assert len(np.unique(out.replica)) == 3


@pytest.mark.parametrize("preemption", list(C.PREEMPTION))
@pytest.mark.parametrize("policy", POLICIES)
def test_preemption(policy, preemption, replica_cost, small_engine, small_workload, run_both):
    rc = replica_cost()
    cfg = small_engine(rc, num_blocks=40, scheduler=policy, preemption=preemption)
    arrival, prompt, output = small_workload(n=80, seed=2, rate=50.0, max_prompt=400, max_output=80)
    out, ref = run_both(rc, cfg, arrival, prompt, output)
    assert_agree(out, ref)
    if policy == "static":
        assert out.preemptions.sum() == 0   # static reserves every block up front
    else:
        assert out.preemptions.sum() > 0, "the scenario must preempt, or the test is vacuous"
        if preemption == "swap":
            assert ref["swap_time"] > 0.0


@pytest.mark.parametrize("pp", [1, 2, 4])
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("policy", POLICIES)
def test_layouts(policy, tp, pp, replica_cost, small_engine, small_workload, run_both):
    rc = replica_cost(tp, pp)
    # a tight token budget, so partial prefills and decodes compete for it across micro-batches
    cfg = small_engine(rc, scheduler=policy, router="least-requests", replicas=2,
                       max_num_batched_tokens=192, chunk_size=96)
    assert cfg.pp == pp
    arrival, prompt, output = small_workload(n=100, seed=3, rate=150.0)
    out, ref = run_both(rc, cfg, arrival, prompt, output)
    assert_agree(out, ref)
    if pp > 1 and policy != "static":
        assert out.preemptions.sum() > 0


@pytest.mark.parametrize("concurrency", [3, 12])
@pytest.mark.parametrize("policy", POLICIES)
def test_closed_loop(policy, concurrency, replica_cost, small_engine, small_workload, run_both):
    rc = replica_cost()
    cfg = small_engine(rc, scheduler=policy, concurrency=concurrency, replicas=2, router="least-kv")
    _, prompt, output = small_workload(n=60, seed=4)
    out, ref = run_both(rc, cfg, np.zeros(60), prompt, output)
    assert_agree(out, ref)
    # the first `concurrency` requests are sent at once, the rest when a client frees up
    assert np.all(out.arrival[:concurrency] == 0.0)
    assert np.all(out.arrival[concurrency:] > 0.0)
    assert np.all(np.diff(out.arrival) >= 0.0)


@pytest.mark.parametrize("policy", POLICIES)
def test_duration_cutoff(policy, replica_cost, small_engine, small_workload, run_both):
    rc = replica_cost()
    arrival, prompt, output = small_workload(n=200, seed=5, rate=200.0)
    cfg = small_engine(rc, scheduler=policy, duration=0.3)
    out, ref = run_both(rc, cfg, arrival, prompt, output)
    assert_agree(out, ref)
    assert out.stats[K.STAT_END_TIME] <= 0.3
    unfinished = ~np.isin(out.status, [C.DONE, C.REJECTED])
    assert unfinished.any()
    assert np.all(np.isnan(out.finish[unfinished]))


@pytest.mark.parametrize("policy", POLICIES)
def test_rejection_and_warmup(policy, replica_cost, small_engine, small_workload, run_both):
    rc = replica_cost()
    arrival, prompt, output = small_workload(n=100, seed=6, rate=60.0, max_prompt=900, max_output=40)
    cfg = small_engine(rc, num_blocks=50, watermark_blocks=3, scheduler=policy, warmup_time=0.3,
                       replicas=2, router="power-of-two")
    out, ref = run_both(rc, cfg, arrival, prompt, output, seed=3)
    assert_agree(out, ref)
    rejected = out.status == C.REJECTED
    too_big = -(-(prompt + output) // cfg.block_size) > cfg.num_blocks - cfg.watermark_blocks
    np.testing.assert_array_equal(rejected, too_big)
    assert rejected.any()
    assert np.all(out.finish[rejected] == out.arrival[rejected])
    assert np.all(np.isnan(out.scheduled[rejected]))


def test_generated_tokens_match(replica_cost, small_engine, small_workload, run_both):
    rc = replica_cost()
    arrival, prompt, output = small_workload(n=100, seed=8, rate=80.0)
    out, ref = run_both(rc, small_engine(rc, preemption="swap"), arrival, prompt, output)
    assert_agree(out, ref)
    done = out.status == C.DONE
    assert done.all()
    np.testing.assert_array_equal(ref["generated"][done], output[done])
    assert not math.isnan(out.finish.max())


# -- speculative decoding (servesim/costmodel/speculative.py): a decode verifies k drafts, yields the drawn tokens

def _spec(rc, text, output, seed=0):
    spec, dps = spec_inputs(S.parse_speculative(text), [rc], output, seed)
    return spec, None if dps is None else dps[0]


def _agree_spec(out, ref):
    assert_agree(out, ref)
    for k in (ST.STAT_DRAFT, ST.STAT_VERIFY, ST.STAT_SPEC_STEPS, ST.STAT_SPEC_TOKENS):
        assert out.stats[k] == ref["stats"][k], k


# (speculative decoding compiles its own kernel specialisation: behind the slow marker, for the default
# run's time; CI runs them)
@pytest.mark.slow
@pytest.mark.parametrize("text", ["eagle:k=3:acceptance=0.7", "ngram:k=4:acceptance=0.5",
                                  "mtp:k=2:acceptance=0.8:delta=0.9"])
@pytest.mark.parametrize("policy", ["vllm", "sarathi", "orca", "vllm-v0"])
def test_kernel_equals_reference(policy, text, replica_cost, small_engine, small_workload, run_both):
    rc = replica_cost()
    cfg = small_engine(rc, scheduler=policy, replicas=2)
    arrival, prompt, output = small_workload(n=120, seed=3, rate=80.0)
    spec, dp = _spec(rc, text, output, seed=5)
    out, ref = run_both(rc, cfg, arrival, prompt, output, seed=5, spec=spec, dp=dp)
    _agree_spec(out, ref)
    assert out.stats[ST.STAT_SPEC_STEPS] > 0


@pytest.mark.slow
@pytest.mark.parametrize("preemption", list(C.PREEMPTION))
def test_kernel_equals_reference_with_preemption_and_pp(preemption, replica_cost, small_engine, small_workload,
                                                         run_both):
    rc = replica_cost(pp=2)
    cfg = small_engine(rc, num_blocks=40, preemption=preemption)
    arrival, prompt, output = small_workload(n=80, seed=2, rate=50.0, max_prompt=400, max_output=80)
    spec, dp = _spec(rc, "eagle:k=4:acceptance=0.8", output, seed=1)
    out, ref = run_both(rc, cfg, arrival, prompt, output, spec=spec, dp=dp)
    _agree_spec(out, ref)
    assert out.preemptions.sum() > 0, "the scenario must preempt, or the test is vacuous"
