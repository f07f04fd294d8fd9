"""The step cost compiled in two shapes (costmodel/features.py): which one a run gets, that the plain
one leaves the MoE, MLA, EP and weight-only code out of what numba compiles, and that both price every
step alike, function by function and through the event loop."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import servesim
from servesim.config import load_hardware, load_model
from servesim.config.engine import load_engine
from servesim.costmodel import Layout, lower
from servesim.costmodel.features import FULL, PLAIN, features
from servesim.costmodel.fields import table
from servesim.costmodel.iteration import iteration_components_nb, layer_tables_nb


def _table(model="llama-3.1-8b", hw="h100-sxm", engine="vllm", max_tokens=512, **layout):
    p = lower(load_model(model), load_hardware(hw), Layout(**({"tp": 1} | layout)), load_engine(engine),
              max_num_seqs=64, max_tokens=max_tokens)
    return table(p)


def test_a_dense_model_gets_the_plain_shape_and_any_optional_part_the_full_one():
    dense = _table()
    assert features(dense) == PLAIN
    assert features(_table(tp=2, pp=2, dtype="fp8")) == PLAIN
    assert features(_table(dtype="int4")) == FULL                          # weight-only GEMMs
    assert features(_table("mixtral-8x7b", tp=2)) == FULL                  # MoE layers
    assert features(_table("deepseek-v3", "h200-sxm", tp=8, dtype="fp8")) == FULL   # MoE and MLA
    ep = _table("deepseek-v3", "h200-sxm", tp=8, dtype="fp8", ep=8)
    assert features(ep) == FULL
    # the shape covers every table a run prices: pools (rows of one array) and drafts
    assert features(np.vstack([dense, dense])) == PLAIN
    assert features(dense, None, dense) == PLAIN
    assert features(dense, ep[None, :]) == FULL


# dense layouts: TP (custom all-reduce and NCCL), PP, fp8, an eager engine, a PCIe card
DENSE = [dict(), dict(tp=2), dict(tp=4, engine="sglang"), dict(pp=2), dict(tp=2, dtype="fp8", engine="trtllm"),
         dict(hw="a100-sxm-80gb", tp=2), dict(hw="h100-pcie", tp=2), dict(model="qwen2.5-7b", tp=2)]


@pytest.mark.parametrize("layout", DENSE, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()) or "default")
def test_plain_and_full_price_every_dense_step_alike(layout):
    """Exactly the same floats: the shapes compile the same formulas, the plain one without the
    branches a dense table never takes. Steps beyond the per-token tables (512 tokens) take the
    direct path."""
    t = _table(**layout)
    n = 300
    plain, full = (layer_tables_nb(t, s.moe, s.ep, s.wo, n) for s in (PLAIN, FULL))
    assert all(np.array_equal(a, b) for a, b in zip(plain, full))
    rng = np.random.default_rng(7)
    for _ in range(200):
        n_pf = float(rng.integers(0, 4))
        tp_tok = float(rng.integers(1, 900)) * n_pf
        n_dec = float(rng.integers(0, 200))
        kv_dec = n_dec * float(rng.integers(1, 8000))
        ctx = float(rng.integers(0, 4000))
        pairs = tp_tok * (ctx + (tp_tok / max(n_pf, 1.0) + 1.0) / 2.0)
        kv_pf = n_pf * ctx + tp_tok
        agg = (tp_tok, n_pf, n_dec + n_pf, pairs, kv_pf, n_dec, kv_dec)
        assert iteration_components_nb(t, *PLAIN, *agg) == iteration_components_nb(t, *FULL, *agg), agg


def test_a_dense_run_compiles_none_of_the_optional_code(tmp_path):
    """In a fresh process with an empty numba cache, lowering a dense replica and pricing a step
    compile the plain shape only: none of the MoE, MLA, EP, all-to-all or weight-only functions."""
    code = """
import json
from servesim.config import load_hardware, load_model
from servesim.config.engine import load_engine
from servesim.costmodel import Layout, lower
from servesim.costmodel import ep, iteration, kernels, collectives
from servesim.costmodel.fields import table
p = table(lower(load_model("llama-3.1-8b"), load_hardware("h100-sxm"), Layout(2, 1, "bf16"), load_engine("vllm")))
iteration.iteration_components(p, 300.0, 1.0, 9.0, 300 * 150.5, 300.0, 8.0, 8000.0)
left_out = [iteration.routed_experts_nb, iteration._moe_nb, iteration.mla_attention_nb, iteration.rank_share_nb,
            iteration.alltoall_layer_nb, kernels.moe_experts_time_nb, kernels.weight_only_gemm_time_nb,
            kernels.mla_decode_time_nb, kernels.mla_prefill_time_nb, ep.rank_load_nb, ep.dispatch_combine_nb,
            ep.alltoall_nb, ep.busiest_share_nb, collectives.all_to_all_time_nb]
print(json.dumps({"compiled": [f.__name__ for f in left_out if f.signatures],
                  "step": [str(s) for s in iteration.iteration_components_nb.signatures]}))
"""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(Path(servesim.__file__).resolve().parent.parent))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["compiled"] == []
    assert len(out["step"]) == 1 and out["step"][0].count("none") == 4


def test_the_plain_kernel_gives_the_records_of_the_full_one(monkeypatch):
    """The suite compiles the event loop with the full step cost (SERVESIM_KERNEL_UNION, conftest.py); a
    user's dense run compiles it with the plain one. Same records, request by request and step by step."""
    runs = {}
    for union in ("1", "0"):
        monkeypatch.setenv("SERVESIM_KERNEL_UNION", union)
        runs[union] = [servesim.simulate(num_requests=150, seed=3, **kw) for kw in (dict(), dict(tp=2, pp=2))]
    for full, plain in zip(runs["1"], runs["0"]):
        assert plain.to_json() == full.to_json()
        assert plain.requests.equals(full.requests)
        assert plain.iterations.equals(full.iterations)
