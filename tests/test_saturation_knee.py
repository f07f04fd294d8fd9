"""The saturation verdict near the knee: a statement about the simulated system that holds on every
seed. At 90% of the simulated capacity every seed is stable; at 110% every seed is saturated
(queueing delay grows (lambda / mu - 1) s per s, twice the 0.05 threshold), per engine profile."""
from dataclasses import replace

import pytest

from servesim.api import SimConfig, simulate
from servesim.planning.capacity import capacity

SEEDS = range(20)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_verdict_is_right_on_every_seed_at_90_and_110_percent_of_capacity(engine):
    cfg = SimConfig(model="llama-3.1-8b", hardware="h100-sxm", engine=engine, workload="chat", num_requests=4000)
    # the capacity found on seed 0, bisected to 1% (the default 5% leaves the knee unresolved); 4000
    # requests: with 2000 the capacity of one seed is ~8% above the 4000-request one and one seed in 20
    # queues at 90% of it
    top = capacity(cfg, 10.0, tol=0.01)["max_sustainable_rate"]
    assert top and top > 1.0
    below = [simulate(replace(cfg, rate=0.9 * top, seed=s)).summary["saturation_verdict"] for s in SEEDS]
    above = [simulate(replace(cfg, rate=1.1 * top, seed=s)).summary["saturation_verdict"] for s in SEEDS]
    assert below == ["stable"] * len(SEEDS), below
    assert above == ["saturated"] * len(SEEDS), above
