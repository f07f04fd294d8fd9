"""vLLM V1's async scheduling (engine/POOLS.md, "Async scheduling"): a step is planned when the step before
it is launched, so a request arriving while a step runs joins the step after the next one, unless the
engine is idle. Derived by hand on two requests, kernel and reference simulator alike."""
from __future__ import annotations

import numpy as np
import pytest

from servesim.config import load_hardware, load_model
from servesim.costmodel import Layout, build_replica
from servesim.costmodel.fields import table
from servesim.costmodel.iteration import iteration_components
from servesim.engine.lower import EngineOptions, engine_config, one_pool_inputs
from servesim.engine.run import run
from servesim.reference.sim import reference_run


@pytest.fixture(scope="module")
def rc():
    return build_replica(load_model("llama-3.1-8b"), load_hardware("h100-sxm"), Layout(1, 1, "bf16"), 0.9)


def _run(rc, overlap: float, arrival, prompt, output):
    p = rc.params._replace(host_overlap=overlap)
    cfg = engine_config(EngineOptions(max_num_seqs=8, max_num_batched_tokens=8192), rc)
    inputs = one_pool_inputs(p, cfg, arrival, prompt, output)
    return run(inputs), reference_run(inputs)


def test_a_request_arriving_during_a_step_waits_one_step_more(rc):
    """A (prompt 64, 50 tokens) runs alone: its prefill step P, then decode steps D. B (prompt 64)
    arrives half way through A's second decode step. Synchronously B joins the next step, at
    P + 2D; with async scheduling that step was planned at P + D, before B arrived, so B joins the
    one after, at P + 3D (both kernel and reference)."""
    for overlap, steps in ((0.0, 2), (1.0, 3)):
        p = rc.params._replace(host_overlap=overlap)
        P = iteration_components(table(p), 64.0, 1.0, 1.0, 64 * 65 / 2.0, 64.0, 0.0, 0.0).latency
        def D(ctx):   # a decode step of A alone over ctx cached tokens
            return iteration_components(table(p), 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, ctx).latency
        # A's context grows by a token a step (its KV read grows with it)
        start = P + sum(D(65.0 + i) for i in range(steps))
        out, ref = _run(rc, overlap, [0.0, P + D(65.0) + 0.5 * D(66.0)], [64, 64], [50, 5])
        assert out.scheduled[0] == 0.0
        assert out.scheduled[1] == pytest.approx(start, rel=1e-9), overlap
        np.testing.assert_array_equal(out.scheduled, ref["scheduled"])
        np.testing.assert_array_equal(out.finish, ref["finish"])


def test_an_idle_engine_admits_at_once(rc):
    """B arrives after A has finished: nothing runs, the engine schedules B when it arrives."""
    out, ref = _run(rc, 1.0, [0.0, 5.0], [64, 64], [3, 3])
    assert out.scheduled[1] == 5.0
    np.testing.assert_array_equal(out.scheduled, ref["scheduled"])
