"""A decode span's step cost from its count terms kept per decode count (costmodel.iteration.decode_cost_nb):
the same floats as the step cost computed whole, for the first step of a count and for the later ones
that read the kept terms, across the cost model's shapes (CUDA graphs and eager, TP, PP, MoE, MLA,
weight-only), and the kept terms are what a later step reads."""
from __future__ import annotations

import numpy as np
import pytest

from servesim.config import load_hardware, load_model
from servesim.config.engine import load_engine
from servesim.costmodel import Layout, lower
from servesim.costmodel.features import features
from servesim.costmodel.fields import table
from servesim.costmodel.iteration import N_COUNT_TERMS, decode_cost_nb, iteration_components_nb

MAX_SEQS = 600      # beyond the per-token tables (512 tokens) and the largest captured graph


def _table(model="llama-3.1-8b", hw="h100-sxm", engine="vllm", **layout):
    p = lower(load_model(model), load_hardware(hw), Layout(**({"tp": 1} | layout)), load_engine(engine),
              max_num_seqs=64, max_tokens=512)
    return table(p)


SHAPES = [dict(), dict(tp=2), dict(tp=4, engine="sglang"), dict(pp=2), dict(tp=2, dtype="fp8", engine="trtllm"),
          dict(dtype="int4"), dict(model="mixtral-8x7b", tp=2), dict(model="deepseek-v3", hw="h200-sxm", tp=8, dtype="fp8")]


@pytest.mark.parametrize("layout", SHAPES, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()) or "default")
def test_decode_steps_priced_from_kept_terms_equal_the_whole_step_cost(layout):
    t = _table(**layout)
    fs = features(t)
    memo = np.zeros((MAX_SEQS + 1, 1 + N_COUNT_TERMS))
    rng = np.random.default_rng(3)
    counts = np.concatenate([np.arange(1, 70), rng.integers(70, MAX_SEQS + 1, 40)])
    for n in counts:
        for _ in range(3):      # the first step of a count computes its terms, the later ones read them
            kv = int(n) * int(rng.integers(1, 8000))
            got = decode_cost_nb(t, *fs, memo, int(n), kv)
            want = iteration_components_nb(t, *fs, 0.0, 0.0, float(n), 0.0, 0.0, float(n), float(kv))
            assert np.array(got).tobytes() == np.array(want).tobytes(), (n, kv)
    assert np.all(memo[counts, 0] == 1.0)      # kept for each count priced, and only for those
    assert np.all(memo[np.setdiff1d(np.arange(MAX_SEQS + 1), counts), 0] == 0.0)


def test_a_later_step_reads_the_kept_terms():
    t = _table()
    fs = features(t)
    memo = np.zeros((65, 1 + N_COUNT_TERMS))
    first = decode_cost_nb(t, *fs, memo, 64, 64 * 900)
    memo[64, 2] += 1.0          # the kept GEMM time (`counts_part_nb`'s second term), changed
    later = decode_cost_nb(t, *fs, memo, 64, 64 * 900)
    assert later.gemm == first.gemm + 1.0 and later.latency > first.latency
    assert memo[63, 0] == 0.0   # other counts untouched
