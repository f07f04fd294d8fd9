"""Pipeline parallelism: micro-batches leave the pipeline in the order they entered it.

Hand-derived case (PP = 2, one replica): a heavy prefill micro-batch H enters at t = 0 and holds the
first stage for I_H; a light one L enters at I_H. Stage 2 spends d = latency - interval on each (the
cost model's per-stage split). Stage 2 takes L only when it has finished H, so L comes out at
I_H + d_H + d_L, after H (at I_H + d_H), not at I_H + latency_L, which would be before H.
"""
from __future__ import annotations

import numpy as np
import pytest

from servesim.costmodel.fields import table
from servesim.costmodel.iteration import iteration_components
from servesim.engine import kernel as K


def _prefill(p, c):
    """(latency, interval) of one micro-batch holding one whole c-token prompt, as the kernel prices it."""
    r = iteration_components(table(p), float(c), 1.0, 1.0, c * (c + 1.0) / 2.0, float(c), 0.0, 0.0)
    return r.latency, r.interval


def test_light_micro_batch_waits_for_the_heavy_one(replica_cost, small_engine, run_both):
    rc = replica_cost(1, 2)
    cfg = small_engine(rc, num_blocks=1000, max_num_batched_tokens=8192)
    assert cfg.pp == 2
    arrival = np.array([0.0, 1e-9])         # H is scheduled alone at t = 0; L arrives just after
    prompt = np.array([8000, 8])
    output = np.array([1, 1])               # one token each: done when its prefill comes out
    out, ref = run_both(rc, cfg, arrival, prompt, output)
    lat_h, int_h = _prefill(rc.params, 8000)
    lat_l, int_l = _prefill(rc.params, 8)
    d_h, d_l = lat_h - int_h, lat_l - int_l
    assert int_h + lat_l < lat_h, "the scenario must be one where L would overtake H"
    assert out.finish[0] == pytest.approx(lat_h, rel=1e-12)
    assert out.finish[1] == pytest.approx(int_h + d_h + d_l, rel=1e-12)
    assert out.finish[1] > out.finish[0]
    s = out.stats
    assert s[K.STAT_BUSY] == pytest.approx(int_h + int_l, rel=1e-12)          # first stage
    assert s[K.STAT_STAGE_BUSY] == pytest.approx(d_h + d_l, rel=1e-12)        # stage 2
    assert s[K.STAT_INFLIGHT_TIME] == pytest.approx(out.finish[1], rel=1e-12)  # work from 0 to the end
    np.testing.assert_array_equal(out.finish, ref["finish"])

