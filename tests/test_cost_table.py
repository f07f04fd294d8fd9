"""The cost parameters as one table (costmodel/fields.py): every field of a lowered CostParams read back
exactly from its packed table, by Python and by jitted code; rows of several tables zero-padded."""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from servesim.costmodel import fields as F
from servesim.costmodel.fields import CostParams, array_nb, table, tables
from servesim.costmodel.params import Layout


@njit(cache=False)
def _read_nb(p):
    return p[F.g_max], p[F.tp], array_nb(p, F.attn_k), array_nb(p, F.tab_comm)


@pytest.fixture(scope="module")
def lowered():
    from servesim.config import load_hardware, load_model
    from servesim.config.engine import load_engine
    from servesim.costmodel.params import lower
    hw, eng = load_hardware("h200-sxm"), load_engine("vllm")
    # dense; MLA with wide EP and a power-law skew table; MoE with the fused-MoE tile table
    return [lower(load_model("llama-3.1-8b"), hw, Layout(tp=2), eng, max_tokens=512),
            lower(load_model("deepseek-v3"), hw, Layout(tp=4, attn_dp=2, ep=8, dtype="fp8", expert_skew=1.01), eng,
                  max_tokens=256),
            lower(load_model("mixtral-8x7b"), hw, Layout(tp=2), eng, max_tokens=256)]


def test_every_field_has_its_own_slot():
    slots = [getattr(F, f) for f in CostParams._fields]
    assert slots[:len(F.SCALARS)] == list(range(len(F.SCALARS)))
    assert slots[len(F.SCALARS):] == list(range(len(F.SCALARS), F.HEADER, 2))   # start, length
    assert len(F.SCALARS) + len(F.ARRAYS) == len(CostParams._fields)


def test_the_table_holds_every_field_exactly(lowered):
    assert lowered[1].skew_grid.size > 0 and lowered[1].mla == 1.0 and lowered[2].moe_tile_keys.size > 0
    for p in lowered:
        t = table(p)
        assert t.dtype == np.float64 and t.ndim == 1 and t.flags.c_contiguous
        for f in F.SCALARS:
            assert t[getattr(F, f)] == getattr(p, f), f
        for f in F.ARRAYS:
            want = np.asarray(getattr(p, f), np.float64)
            got = array_nb(t, getattr(F, f))
            assert got.shape == want.shape and np.array_equal(got, want), f
            assert got.base is not None                     # a view into the table, not a copy
        assert t.shape[0] == F.HEADER + sum(np.size(getattr(p, f)) for f in F.ARRAYS)


def test_jitted_code_reads_the_same_values(lowered):
    p = lowered[0]
    g_max, tp, attn_k, tab_comm = _read_nb(table(p))
    assert (g_max, tp) == (p.g_max, p.tp)
    assert np.array_equal(attn_k, p.attn_k) and np.array_equal(tab_comm, p.tab_comm)


def test_rows_of_several_tables_are_zero_padded_to_the_longest(lowered):
    t = tables(lowered)
    rows = [table(p) for p in lowered]
    assert t.shape == (3, max(r.shape[0] for r in rows))
    for k, r in enumerate(rows):
        assert np.array_equal(t[k, :r.shape[0]], r) and not t[k, r.shape[0]:].any()
        assert np.array_equal(array_nb(t[k], F.tab_gemm), lowered[k].tab_gemm)


def test_the_per_count_tables_price_every_step_as_the_direct_formulas(lowered):
    """The step cost read from the lowered per-count tables (layer costs, the LM head by sampled rows) is,
    float for float, the one computed without them (every table emptied: the direct path), for dense
    TP, wide EP with DP attention and MoE; counts inside and beyond the tables, whole and fractional
    sampled rows (a DP attention rank's share)."""
    from servesim.costmodel.features import features
    from servesim.costmodel.iteration import iteration_components_nb
    empty = {f: np.zeros(0) for f in F.ARRAYS if f.startswith("tab_")}
    rng = np.random.default_rng(3)
    for p in lowered:
        t, direct = table(p), table(p._replace(**empty))
        fs = features(t)
        assert array_nb(t, F.tab_lm).shape[0] > 0 and array_nb(direct, F.tab_lm).shape[0] == 0
        for _ in range(300):
            n_pf = float(rng.integers(0, 3))
            tp_tok = float(rng.integers(1, 400)) * n_pf
            n_dec = float(rng.integers(0 if n_pf else 1, 120))
            n_logit = n_dec + (n_pf if rng.random() < 0.5 else rng.random() * n_pf)
            ctx = float(rng.integers(0, 3000))
            agg = (tp_tok, n_pf, n_logit, tp_tok * (ctx + 1.0), n_pf * ctx + tp_tok, n_dec,
                   n_dec * float(rng.integers(1, 4000)))
            assert iteration_components_nb(t, *fs, *agg) == iteration_components_nb(direct, *fs, *agg), agg
