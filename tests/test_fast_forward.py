"""Decode fast-forward (engine/span.py) against the step-by-step loop it shortcuts: the same inputs run
both ways must give the same records byte for byte (every per-request array, the gap histogram, the
iteration log, every statistic), across policies, pools, prefill/decode transfers, prefix caching
with a CPU tier, sessions, PP > 1, both preemption modes, async admission, speculative decoding,
closed loops and a clock stopped mid-span; and the fast-forward must actually run spans where it can."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import servesim
from servesim.engine.run import run

from engineout import assert_same_output, lowered_inputs

GOLDEN = Path(__file__).parent / "golden"


_inputs = lowered_inputs


def _both(inputs):
    """(fast-forward, step by step) outputs of the same inputs."""
    ff = run(inputs._replace(cfg=inputs.cfg._replace(fast_forward=1)))
    step = run(inputs._replace(cfg=inputs.cfg._replace(fast_forward=0)))
    return ff, step


def _assert_identical(ff, step):
    assert step.span_iterations == 0
    assert_same_output(ff, step, skip=("span_iterations",))


# each golden scenario (tests/golden: defaults, mixed pools, P/D pools, prefix cache with a CPU tier,
# sessions, PP 2 with swap preemption, MoE) and the cases they leave out
CASES = {
    **{p.stem: json.loads(p.read_text())["scenario"] for p in sorted(GOLDEN.glob("*.json"))},
    "four replicas": dict(replicas=4, rate=40, num_requests=1500, seed=1),
    "recompute preemption": dict(num_gpu_blocks=300, rate=30, num_requests=400, isl=200, osl=300, seed=2),
    "swap preemption, least-kv": dict(num_gpu_blocks=300, rate=30, num_requests=400, isl=200, osl=300, seed=3,
                                      preemption="swap", replicas=2, router="least-kv"),
    "sarathi": dict(scheduler="sarathi", rate=20, num_requests=400, seed=4),
    "orca": dict(scheduler="orca", rate=20, num_requests=400, seed=5),
    "vllm-v0": dict(scheduler="vllm-v0", rate=20, num_requests=400, seed=6),
    "static": dict(scheduler="static", rate=10, num_requests=200, seed=7),
    "closed loop, warm-up": dict(concurrency=24, num_requests=600, warmup=5.0, seed=8),
    "clock stopped mid-span": dict(rate=20, num_requests=2000, duration=30.0, seed=9),
    "speculative": dict(rate=10, num_requests=300, speculative="eagle:k=3:acceptance=0.7", seed=10),
    "pd, prefix-aware, CPU tier": dict(pool=("h100-sxm:tp1:x2:prefill", "h100-sxm:tp1:x2:decode"),
                                       num_system_prompts=3, users_per_system_prompt=4, system_prompt_len=300,
                                       cpu_kv_gib=0.5, router="prefix-aware", rate=15, num_requests=500,
                                       num_gpu_blocks=800, seed=11),
    "sglang (synchronous admission)": dict(engine="sglang", rate=20, num_requests=400, seed=12),
}


# the default run keeps the golden scenarios and three more; the rest is `slow` (the 4-minute budget)
DEFAULT_RUN = {p.stem for p in GOLDEN.glob("*.json")} | {"four replicas", "recompute preemption",
                                                        "clock stopped mid-span"}


@pytest.mark.parametrize("name", [n if n in DEFAULT_RUN else pytest.param(n, marks=pytest.mark.slow) for n in CASES])
def test_fast_forward_gives_the_step_loops_records(monkeypatch, name):
    ff, step = _both(_inputs(monkeypatch, **CASES[name]))
    _assert_identical(ff, step)


def test_spans_run_where_the_batch_holds_still(monkeypatch):
    """Most iterations of a lightly loaded replica are spans; none with PP > 1 (not implemented for a
    pipeline: its micro-batches hold different members), static batching or speculative decoding."""
    ff, _ = _both(_inputs(monkeypatch, rate=2, num_requests=200, seed=0))
    assert ff.span_iterations > 0.8 * ff.stats[0]
    for name in ("pp", "static"):
        ff, _ = _both(_inputs(monkeypatch, **CASES[name]))
        assert ff.span_iterations == 0, name
    for name in ("pd", "prefix", "sessions", "recompute preemption"):
        ff, _ = _both(_inputs(monkeypatch, **CASES[name]))
        assert ff.span_iterations > 0, name


@pytest.mark.slow
def test_no_spans_with_speculative_decoding(monkeypatch):
    """(its own kernel specialisation: behind the slow marker for the default run's compile time)"""
    ff, _ = _both(_inputs(monkeypatch, **CASES["speculative"]))
    assert ff.span_iterations == 0


def test_the_option_changes_nothing_but_the_speed():
    """`fast_forward=False` (`--no-fast-forward`) runs the reference loop: the same summary, request and
    iteration tables; the option is not echoed in the config (it changes how, not what, is simulated)."""
    kw = dict(replicas=2, rate=20, num_requests=300, seed=3)
    a = servesim.simulate(**kw)
    b = servesim.simulate(fast_forward=False, **kw)
    assert a.to_json() == b.to_json()
    assert a.requests.equals(b.requests) and a.iterations.equals(b.iterations)
    assert "fast_forward" not in a.summary["config"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
def test_random_configurations_agree(monkeypatch, seed):
    """Random policies, routers, replica counts, KV capacities (down to preemption), loads and lengths,
    with and without prefill/decode pools: fast-forward and step loop give the same records."""
    rng = np.random.default_rng(seed)
    kw = dict(scheduler=str(rng.choice(["vllm", "sarathi", "orca", "vllm-v0"])),
              router=str(rng.choice(["round-robin", "least-requests", "least-kv", "power-of-two", "random"])),
              preemption=str(rng.choice(["recompute", "swap"])), num_gpu_blocks=int(rng.integers(120, 2000)),
              max_num_seqs=int(rng.choice([2, 16, 64, 256])), isl=int(rng.integers(16, 600)),
              osl=int(rng.integers(2, 400)), rate=float(rng.uniform(2, 60)), num_requests=300, seed=seed)
    if rng.random() < 0.3:
        kw["pool"] = ("h100-sxm:tp1:x1:prefill", "h100-sxm:tp1:x2:decode")
        kw.pop("scheduler")
    else:
        kw["replicas"] = int(rng.integers(1, 4))
    ff, step = _both(_inputs(monkeypatch, **kw))
    _assert_identical(ff, step)
