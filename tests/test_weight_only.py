"""Weight-only int4 GEMMs read 4-bit weights and compute at the bf16 peak; fp4 only on fp4 tensor cores."""
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import servesim
from servesim.calibrate import data_dir
from servesim.cli import main
from servesim.config import load_hardware, load_model
from servesim.config.engine import load_engine
from servesim.costmodel import Batch, Layout, lower
from servesim.costmodel import kernels as kn
from servesim.costmodel.dtypes import WEIGHT_ONLY_EXTRA_LATENCY_US
from servesim.costmodel.explain import breakdown
from servesim.errors import ConfigError

H100 = load_hardware("h100-sxm")
VLLM = load_engine("vllm")
INT4_BYTES = 0.5 + 2.0 / 128.0          # 4-bit weights + one 16-bit scale per group of 128 (AWQ/GPTQ)


def _gemm(model, hw, dtype, batch, engine=VLLM):
    return breakdown(lower(load_model(model), hw, Layout(dtype=dtype), engine), batch).parts_s["gemm"]


def test_small_batch_weight_only_gemm_is_its_weight_bytes_over_bandwidth():
    # one MLP up projection of Llama-3.1-8B at 1 token: memory-bound, so by hand
    # latency + ramp + (n k bytes + m (n + k) 2) / (hbm_bw x fraction): no 64-row tile of padded math
    fit = VLLM.fit_for(H100)
    n, k = 2 * 14336.0, 4096.0
    lat = fit.gemm_latency_s + WEIGHT_ONLY_EXTRA_LATENCY_US * 1e-6
    by_hand = lat + fit.gemm_mem_latency_s + (n * k * INT4_BYTES + (n + k) * 2.0) / (
        H100.hbm_bw * fit.gemm_hbm_fraction)
    t = kn.weight_only_gemm_time_nb(1.0, k, n, INT4_BYTES, H100.peak_flops["bf16"], H100.hbm_bw,
                                    float(H100.sm_count), fit.gemm_max, fit.gemm_hbm_fraction, lat,
                                    fit.gemm_splitk_latency_s, fit.gemm_tile_overhead_k, fit.gemm_mem_latency_s)
    assert t == pytest.approx(by_hand, rel=1e-12)


def test_batch1_decode_gemms_approach_the_weight_bytes_ratio():
    # Llama-3.1-8B: the LM head (vocab x hidden) stays 16-bit, every other weight is int4
    m = load_model("llama-3.1-8b")
    head = m.lm_head_params()
    body = m.param_count() - m.embedding_params() - head
    ratio = (body * INT4_BYTES + head * 2.0) / ((body + head) * 2.0)   # ~0.31
    decode = Batch(decode=(1000,))
    t16, t4 = _gemm("llama-3.1-8b", H100, "bf16", decode), _gemm("llama-3.1-8b", H100, "int4", decode)
    # above the bytes ratio by the dequantisation's fixed time per GEMM (7.9 us, the part a CUDA graph does
    # not hide: 1 - graph_overlap of it), 128 GEMMs of ~1-5 us of bytes each
    assert ratio < t4 / t16 < 1.6 * ratio
    # and never faster than streaming the int4 bytes at the full HBM bandwidth
    assert t4 > (body * INT4_BYTES + head * 2.0) / H100.hbm_bw


def test_large_batch_prefill_is_no_faster_than_bf16():
    prefill = Batch(prefill=((8192, 0),))
    t16, t4 = _gemm("llama-3.1-8b", H100, "bf16", prefill), _gemm("llama-3.1-8b", H100, "int4", prefill)
    assert t16 <= t4 < 1.05 * t16          # bf16 tensor cores plus the dequantising kernel's fixed time
    m = load_model("llama-3.1-8b")
    assert t4 > 2.0 * m.param_count() * 8192 / H100.peak_flops["bf16"]


def test_fp4_needs_fp4_tensor_cores():
    r = CliRunner().invoke(main, ["cost", "--hardware", "h100-sxm", "--dtype", "fp4", "--decode-seqs", "1"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    line, = r.output.strip().splitlines()
    assert "--dtype fp4" in line and "h100-sxm has no fp4 tensor cores" in line
    assert line.endswith("use one of bf16, fp16, fp8, int8, int4")
    with pytest.raises(ConfigError, match="a100-sxm-80gb has no fp4 tensor cores.*bf16, fp16, int8, int4$"):
        servesim.simulate(hardware="a100-sxm-80gb", dtype="fp4", num_requests=5)
    # B200 has them: fp4 GEMMs of a long prefill run at its fp4 peak, 4x the bf16 one
    b200 = load_hardware("b200")
    assert b200.peak_flops["fp4"] == 4 * b200.peak_flops["bf16"]
    prefill = Batch(prefill=((8192, 0),))
    assert _gemm("llama-3.1-8b", b200, "fp4", prefill) < 0.5 * _gemm("llama-3.1-8b", b200, "bf16", prefill)


def test_fit_reproduces_the_measured_int4_over_bf16_ratio():
    # AIConfigurator A100 TensorRT-LLM: measured int4 and bf16 GEMMs of the large layer shapes at 1 token;
    # the model (the engine's bf16 fit + int4 bytes + the fitted latency) gives their ratio to 0.05
    hw, fit = load_hardware("a100-sxm-80gb"), load_engine("trtllm").fit_for(load_hardware("a100-sxm-80gb"))
    w = pd.read_csv(data_dir() / "weight_only" / "a100_sxm_trtllm-1.0.0_gemm_int4_wo.csv.gz")
    b = pd.read_csv(data_dir() / "aiconfigurator" / "a100_sxm" / "trtllm-1.0.0" / "gemm_perf.csv.gz")
    j = w.merge(b[b.gemm_dtype == "bfloat16"], on=["m", "n", "k"], suffixes=("", "_bf16"))
    j = j[(j.m == 1) & (j.n * j.k >= 8192 * 8192)]
    assert len(j) >= 20
    args = (hw.peak_flops["bf16"], hw.hbm_bw, float(hw.sm_count), fit.gemm_max, fit.gemm_hbm_fraction)
    rest = (fit.gemm_splitk_latency_s, fit.gemm_tile_overhead_k, fit.gemm_mem_latency_s)
    lat_wo = fit.gemm_latency_s + WEIGHT_ONLY_EXTRA_LATENCY_US * 1e-6
    pred = [kn.weight_only_gemm_time_nb(1.0, r.k, r.n, INT4_BYTES, *args, lat_wo, *rest)
            / kn.gemm_time_nb(1.0, r.k, r.n, 2.0, 2.0, *args, fit.gemm_latency_s, *rest) for r in j.itertuples()]
    measured = (j.latency / j.latency_bf16).to_numpy()
    assert abs(np.median(pred) - np.median(measured)) < 0.05
    assert np.median(measured) < 0.45      # the data themselves: int4 streams 4x fewer bytes
