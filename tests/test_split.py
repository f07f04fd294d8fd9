"""Independent replicas on threads (engine/split.py) against the whole run: the same lowered inputs run
whole and split into one sub-run per replica must give the same EngineOutput byte for byte (every
per-request array, the gap histogram, the decimated iteration log in the whole run's row order, every
statistic of every pool), across routers, layouts, policies, preemption, speculative decoding, a
clock stopped by --duration and an overloaded run; the summary (CIs, saturation verdict) through the
API with any --threads; and a run whose replicas are coupled is never split."""
from __future__ import annotations

import json

import numpy as np
import pytest

import servesim
from servesim import metrics
from servesim.engine import codes as C
from servesim.engine import split
from servesim.engine import state as K
from servesim.engine.kernel import simulate_pools
from servesim.engine.run import run
from servesim.errors import ConfigError

from engineout import assert_same_output, lowered_inputs


_inputs = lowered_inputs


CASES = {
    "round-robin, 4 replicas": dict(replicas=4, rate=40, num_requests=1500, seed=1),
    "random, 3 replicas": dict(replicas=3, router="random", rate=30, num_requests=1200, seed=2),
    "TP2 PP2": dict(replicas=2, tp=2, pp=2, rate=40, num_requests=800, seed=3),
    "recompute preemption": dict(replicas=2, num_gpu_blocks=300, rate=30, num_requests=400, isl=200, osl=300,
                                 seed=4),
    "swap preemption, random": dict(replicas=3, router="random", num_gpu_blocks=300, rate=30, num_requests=400,
                                    isl=200, osl=300, preemption="swap", seed=5),
    "static batching": dict(replicas=2, scheduler="static", rate=10, num_requests=300, seed=6),
    "sarathi, no fast-forward": dict(replicas=2, scheduler="sarathi", rate=20, num_requests=400, fast_forward=False,
                                     seed=7),
    "mixed pools of two hardwares": dict(pool=("h100-sxm:tp1:x2", "a100-sxm-80gb:tp2:pp2:x1"), router="random",
                                         rate=30, num_requests=600, seed=8),
    "speculative": dict(replicas=2, rate=10, num_requests=300, speculative="eagle:k=3:acceptance=0.7", seed=9),
    "clock stopped mid-run, warm-up": dict(replicas=3, rate=40, num_requests=2000, duration=20.0, warmup=3.0,
                                           seed=10),
    "overloaded": dict(replicas=2, rate=400, num_requests=1500, seed=11),
    "offline (every arrival at once)": dict(replicas=3, offline=True, num_requests=900, seed=19),
}


@pytest.mark.parametrize("name", list(CASES))
def test_split_gives_the_whole_runs_output(monkeypatch, name):
    inputs = _inputs(monkeypatch, **CASES[name])
    assert split.whole_reason(inputs) == ""
    assert_same_output(simulate_pools(*inputs), split.simulate_split(inputs, 3))


@pytest.mark.parametrize("log_size", [2, 3, 101, 4096])
def test_the_decimated_log_over_many_windows_and_drains(monkeypatch, log_size):
    """Small windows and a small sub-run log (many pauses and drains) and logs that halve many times,
    odd sizes included: the whole run's samples, in its order."""
    inputs = _inputs(monkeypatch, replicas=4, router="random", rate=60, num_requests=3000, seed=12)
    inputs = inputs._replace(cfg=inputs.cfg._replace(log_size=log_size))
    monkeypatch.setattr(split, "WINDOW", 97)
    monkeypatch.setattr(split, "SUB_LOG", 61)
    whole = simulate_pools(*inputs)
    assert whole.log_count <= max(log_size, 2)
    assert_same_output(whole, split.simulate_split(inputs, 2))


@pytest.mark.parametrize("kw", [dict(router="random"), dict(speculative="eagle:k=2:acceptance=0.6")],
                         ids=["random", "round-robin, speculative"])
def test_a_short_split_run(monkeypatch, kw):
    """A short run through every part of the split (windows, drains, a halving log, the API's --threads),
    quick enough for the CI's run with the JIT off (.ci/run: the kernel's Python under coverage)."""
    inputs = _inputs(monkeypatch, replicas=3, rate=30, num_requests=150, osl=20, seed=17, **kw)
    monkeypatch.setattr(split, "SPLIT_MIN", 100)
    monkeypatch.setattr(split, "WINDOW", 40)
    monkeypatch.setattr(split, "SUB_LOG", 16)
    inputs = inputs._replace(cfg=inputs.cfg._replace(log_size=50))
    calls = []
    real = split.simulate_split
    monkeypatch.setattr(split, "simulate_split", lambda *a: (calls.append(1), real(*a))[1])
    whole = run(inputs, threads=1)
    assert whole.log_count < whole.stats[K.STAT_ITERATIONS]     # (the log halved)
    assert_same_output(whole, run(inputs, threads=2))
    assert calls == [1]


def test_any_threads_give_the_same_summary_through_the_api(monkeypatch):
    """The summary (percentiles, their CIs, the saturation verdict) and the records, with --threads 1, 2, 5
    (the summary's series on threads too: metrics.each)."""
    monkeypatch.setattr(metrics, "THREADS_ABOVE", 0)
    kw = dict(replicas=5, rate=60, num_requests=split.SPLIT_MIN + 500, seed=13)
    res = [servesim.simulate(threads=t, **kw) for t in (1, 2, 5)]
    assert res[0].to_json() == res[1].to_json() == res[2].to_json()
    for r in res[1:]:
        assert r.requests.equals(res[0].requests) and r.iterations.equals(res[0].iterations)
    over = [json.loads(servesim.simulate(threads=t, replicas=2, rate=500, num_requests=3000, seed=14).to_json())
            for t in (1, 2)]
    assert over[0] == over[1] and over[0]["saturated"]


COUPLED = {
    "least-requests router": dict(replicas=2, router="least-requests"),
    "power-of-two router": dict(replicas=2, router="power-of-two"),
    "prefill and decode pools": dict(pool=("h100-sxm:tp1:x1:prefill", "h100-sxm:tp1:x1:decode")),
    "closed loop": dict(replicas=2, concurrency=8),
    "sessions": dict(replicas=2, workload="sessions"),
    "prefix cache": dict(replicas=2, prefix_caching=True, num_system_prompts=2, system_prompt_len=64),
    "one replica": dict(replicas=1),
}


@pytest.mark.parametrize("name", list(COUPLED))
def test_a_coupled_run_is_never_split(monkeypatch, name):
    kw = dict(num_requests=split.SPLIT_MIN, seed=15, **COUPLED[name])
    inputs = _inputs(monkeypatch, **kw if "concurrency" in kw else dict(kw, rate=20))
    assert split.whole_reason(inputs) != ""
    monkeypatch.setattr(split, "simulate_split", lambda *a: pytest.fail("a coupled run was split"))
    run(inputs, threads=4)


def test_whole_reason_names_each_coupling(monkeypatch):
    """Each condition of the rule, one at a time, on the inputs of a separable run (quick: also run by
    the CI with the JIT off)."""
    inputs = _inputs(monkeypatch, replicas=2, num_requests=20, rate=20, seed=18)
    cfg, pools, chains = inputs.cfg, inputs.pools, inputs.chains
    assert split.whole_reason(inputs) == ""
    later = chains.next_turn.copy()
    later[0] = 1
    backwards = inputs.arrival.copy()
    backwards[[3, 4]] = backwards[[4, 3]] + [1.0, 0.0]
    coupled = {
        "one replica": inputs._replace(cfg=cfg._replace(replicas=1)),
        "decode pools": inputs._replace(pools=pools._replace(role=np.array([C.DECODE]))),
        "the router": inputs._replace(cfg=cfg._replace(router=C.LEAST_REQUESTS)),
        "closed loop": inputs._replace(cfg=cfg._replace(concurrency=4)),
        "sessions": inputs._replace(chains=chains._replace(next_turn=later)),
        "prefix cache": inputs._replace(cfg=cfg._replace(prefix_caching=1), chains=chains._replace(ids=np.arange(3))),
        "out of time order": inputs._replace(arrival=backwards),
    }
    for what, bad in coupled.items():
        assert split.whole_reason(bad) != "", what
    assert split.whole_reason(inputs._replace(cfg=cfg._replace(router=C.RANDOM))) == ""
    assert split.whole_reason(inputs._replace(cfg=cfg._replace(prefix_caching=1))) == ""    # (no chain to share)


def test_a_separable_run_is_split(monkeypatch):
    inputs = _inputs(monkeypatch, replicas=2, num_requests=split.SPLIT_MIN, rate=20, seed=16)
    calls = []
    real = split.simulate_split
    monkeypatch.setattr(split, "simulate_split", lambda *a: (calls.append(1), real(*a))[1])
    run(inputs, threads=2)
    assert calls == [1]
    run(inputs, threads=1)          # (one thread: the whole run)
    assert calls == [1]


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_bad_threads_are_refused(bad):
    with pytest.raises(ConfigError, match="threads"):
        servesim.simulate(threads=bad, num_requests=10)


def test_default_threads_share_the_cores(monkeypatch):
    monkeypatch.setattr(split, "usable_cores", lambda: 8)
    assert split.default_threads(4) == 4 and split.default_threads(16) == 8
    monkeypatch.setattr(split, "SHARING", 4)        # one of 4 sweep workers
    assert split.default_threads(16) == 2
    monkeypatch.setattr(split, "SHARING", 16)
    assert split.default_threads(16) == 1
