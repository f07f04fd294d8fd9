"""fp8 (W8A8) priced from the kernel tables: the activation quantisation apart from the fp8 GEMM, and a
compute-bound fp8 GEMM never slower than bf16 where the measured tables say fp8 is faster."""
from __future__ import annotations

import numpy as np
import pytest

from servesim.calibrate import engine_kernels as ek
from servesim.config import load_hardware, load_model
from servesim.config.engine import load_engine
from servesim.costmodel.fields import table
from servesim.costmodel.iteration import _gemm_nb
from servesim.costmodel.params import Layout, lower


def _params(dtype: str):
    return lower(load_model("llama-3.1-8b"), load_hardware("h100-sxm"), Layout(dtype=dtype), load_engine("vllm"),
                 max_num_seqs=8, max_tokens=8)


def test_compute_bound_fp8_gemm_not_slower_where_the_tables_say_so():
    """Every (n, k) shape of vLLM's H100 table whose fp8 rows are faster than its bf16 rows at m = 2048,
    4096 and 8192 (compute-bound) is also faster in fp8 in the model the simulator runs (the engine
    profile's fp8 keys, through the same `_gemm_nb` the step cost calls)."""
    frame = ek.gemm_frame("h100_sxm", ["vllm"])
    frame = frame[frame["m"].isin([2048.0, 4096.0, 8192.0]) & (frame["n"] >= 1024) & (frame["k"] >= 1024)]
    wide = frame.pivot_table(index=["m", "n", "k"], columns="dtype", values="time_s").dropna()
    faster = wide[wide["fp8"] < wide["bf16"]]
    assert len(faster) >= 50          # the tables do show fp8 ahead on many compute-bound shapes
    p16, p8 = _params("bf16"), _params("fp8")
    for (m, n, k) in faster.index:
        assert _gemm_nb(table(p8), None, m, k, n) <= _gemm_nb(table(p16), None, m, k, n), (m, n, k)   # (no int4)


def test_fp8_quantisation_priced_per_activation_element():
    """A W8A8 GEMM = the fp8 GEMM + quantising X[m, k]: gemm_fp8_quant_bytes per element at the weight-
    streaming rate, so two GEMMs that differ only in m differ in quantisation by (m2 - m1) k q / bw."""
    fit = load_engine("vllm").fit_for(load_hardware("h100-sxm"))
    p8 = _params("fp8")
    assert fit.gemm_fp8_quant_bytes > 0.0
    assert p8.g_quant == pytest.approx(fit.gemm_fp8_quant_bytes / (load_hardware("h100-sxm").hbm_bw
                                                                  * fit.gemm_hbm_fraction))
    assert _params("bf16").g_quant == 0.0


def test_fp8_prefill_faster_than_bf16_on_h100():
    """The 8B 4,096-token prefill of issue #25 (118.9 ms fp8 vs 95.0 ms bf16 before): fp8 now faster."""
    from servesim.workflows.cost import cost
    t = {dt: cost("llama-3.1-8b", "h100-sxm", dtype=dt, prefill_tokens=4096).summary["time_ms"] for dt in ("bf16", "fp8")}
    assert t["fp8"] < 0.85 * t["bf16"]
    assert np.isfinite(t["fp8"])
