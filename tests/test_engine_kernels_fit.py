"""Engine kernel calibration (servesim/calibrate/engine_kernels.py): fits recover known parameters,
the shipped AIConfigurator subset loads, and held-out groups are never fitted."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from servesim.calibrate import engine_kernels as ek
from servesim.config import load_hardware
from servesim.errors import ConfigError

H100 = load_hardware("h100-sxm")
TRUE_GEMM = {"gemm_max": 0.83, "gemm_hbm_fraction": 0.78, "gemm_latency_us": 2.4, "gemm_splitk_latency_us": 3.1,
             "gemm_tile_overhead_k": 180.0}


def close(fitted: dict, true: dict, rel: float = 0.03):
    for k, v in true.items():
        assert fitted[k] == pytest.approx(v, rel=rel, abs=1e-3), (k, fitted[k], v)


def quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


# -- recovery of known parameters from synthetic rows ------------------------------------------

def synthetic_gemm() -> pd.DataFrame:
    ms = [1, 8, 64, 129, 256, 512, 1024, 2048, 4096, 8192]
    shapes = [(128, 8192), (256, 4096), (1024, 1024), (4096, 4096), (8192, 1024), (5120, 12288), (14336, 4096),
              (65536, 8192), (384, 16384)]
    rows = [{"m": float(m), "n": float(n), "k": float(k), "dtype": "bf16"} for m in ms for n, k in shapes]
    f = pd.DataFrame(rows)
    f["time_s"] = ek.predict_gemm(f, H100, TRUE_GEMM)
    return f


def test_gemm_fit_recovers_known_parameters():
    f = synthetic_gemm()
    close(quiet(ek.fit_gemm, f, H100), TRUE_GEMM)


def test_fp8_fit_recovers_known_parameters():
    f = synthetic_gemm().assign(dtype="fp8")
    true8 = {"gemm_fp8_max": 0.55, "gemm_fp8_latency_us": 6.0, "gemm_fp8_quant_bytes": 12.0}
    f["time_s"] = ek.predict_gemm(f, H100, TRUE_GEMM, true8)
    close(quiet(ek.fit_gemm_fp8, f, H100, TRUE_GEMM), true8)


def test_fp8_quantisation_is_a_term_in_m_k_apart_from_the_gemm():
    # by hand: the quantisation adds m k q / (hbm_bw gemm_hbm_fraction) to the fp8 GEMM alone
    f = pd.DataFrame([{"m": 4096.0, "n": 8192.0, "k": 4096.0, "dtype": "fp8"}])
    base = {"gemm_fp8_max": 0.7, "gemm_fp8_latency_us": 5.0}
    t0 = ek.predict_gemm(f, H100, TRUE_GEMM, {**base, "gemm_fp8_quant_bytes": 0.0})[0]
    t1 = ek.predict_gemm(f, H100, TRUE_GEMM, {**base, "gemm_fp8_quant_bytes": 5.0})[0]
    assert t1 - t0 == pytest.approx(4096 * 4096 * 5.0 / (H100.hbm_bw * TRUE_GEMM["gemm_hbm_fraction"]), rel=1e-9)


def test_attention_fits_recover_known_parameters():
    grid = [(b, s, h, kv) for b in (1, 4, 32) for s in (16, 256, 2048, 8192) for h, kv in ((8, 1), (32, 8), (64, 8))]
    pf = pd.DataFrame([{"seqs": float(b), "chunk": float(s), "ctx": 0.0, "heads": float(h), "kv_heads": float(kv),
                        "kv_bytes": 2.0} for b, s, h, kv in grid])
    true_p = {"attn_prefill_max": 0.58, "attn_prefill_hbm_fraction": 0.45, "attn_prefill_block_overhead": 0.8,
              "attn_prefill_latency_us": 11.0}
    pf["time_s"] = ek.predict_prefill(pf, H100, true_p)
    close(quiet(ek.fit_prefill, pf, H100), true_p)
    df = pd.DataFrame([{"seqs": float(b), "kv_tokens": float(b * t), "heads": float(h), "kv_heads": float(kv),
                        "kv_bytes": 2.0} for b in (1, 4, 16, 256, 2048) for t in (2, 128, 4096, 65536)
                       for h, kv in ((4, 1), (8, 2), (32, 8))])
    true_d = {"attn_decode_hbm_fraction": 0.9, "attn_decode_block_us": 3.0, "attn_decode_latency_us": 11.0,
              "attn_decode_split_us": 2.0, "attn_decode_split_seqs": 16.0, "attn_decode_block_GBps": 60.0}
    df["time_s"] = ek.predict_decode(df, H100, true_d)
    close(quiet(ek.fit_decode, df, H100), true_d)


def test_allreduce_and_moe_fits_recover_known_parameters():
    ar = pd.DataFrame([{"n": float(n), "nbytes": 2.0 * 2 ** e, "eager": eager}
                       for n in (2, 4, 8) for e in range(7, 30, 2) for eager in (False, True)])
    true_ar = {"allreduce_latency_us": 4.5, "allreduce_bw_fraction": 0.7, "allreduce_step_latency_us": 6.0,
               "allreduce_eager_launch_us": 16.0}
    ar["time_s"] = ek.predict_allreduce(ar, H100, true_ar, 0.8)
    close(quiet(ek.fit_allreduce, ar, H100, 0.8), true_ar)
    rows = []
    for tokens in (1, 16, 128, 1024, 8192):
        for hidden, inter, experts, topk, ep in ((7168, 2048, 256, 8, 1), (4096, 14336, 8, 2, 1), (2048, 768, 128, 8, 4)):
            a = tokens * topk / ep
            for dtype in ("bf16", "fp8"):
                rows.append({"dtype": dtype, "assignments": a, "touched": min(experts / ep, a),
                             "pairs": float(tokens * topk), "hidden": float(hidden), "inter": float(inter)})
    moe = pd.DataFrame(rows)
    true_m = {"moe_efficiency": 0.3, "moe_latency_us": 25.0, "moe_fp8_efficiency": 0.2, "moe_fp8_latency_us": 30.0,
              "moe_pair_us": 0.02}
    moe["time_s"] = ek.predict_moe(moe, H100, TRUE_GEMM, true_m)
    close(quiet(ek.fit_moe, moe, H100, TRUE_GEMM), true_m)


# -- the shipped data ---------------------------------------------------------------------------

def test_shipped_subset_loads_for_every_gpu_and_engine():
    root = ek.aiconfigurator_dir()
    assert "Apache License" in (root / "LICENSE").read_text()
    assert "aiconfigurator" in (root / "SOURCE").read_text()
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert size < 6e6
    for gpu in ek.GPUS:
        g = ek.gemm_frame(gpu)
        assert set(g["engine"]) == set(ek.ENGINES[gpu]) and (g["time_s"] > 0).all()
        assert g["m"].max() <= 8192 and set(g["dtype"]) <= {"bf16", "fp8"}
        for engine in ek.ENGINES[gpu]:
            for frame in (ek.prefill_frame(gpu, engine), ek.decode_frame(gpu, engine), ek.allreduce_frame(gpu, engine)):
                assert len(frame) > 50 and (frame["time_s"] > 0).all()
        assert len(ek.nccl_frame(gpu)) > 50
    assert ek.moe_frame("a100_sxm", "vllm") is None          # no balanced-router rows for A100
    moe = ek.moe_frame("h100_sxm", "vllm")
    assert (moe["touched"] <= moe["experts"] / moe["ep"]).all() and set(moe["dtype"]) == {"bf16", "fp8"}
    ar = ek.allreduce_frame("h100_sxm", "vllm")
    assert ar["eager"].any() and (~ar["eager"]).any()
    with pytest.raises(ConfigError, match="unknown AIConfigurator GPU"):
        ek.gemm_frame("b200")


# -- held-out groups are never fitted -----------------------------------------------------------

def test_group_folds_keep_each_group_in_one_fold():
    groups = np.array([f"{n}x{k}" for n in range(12) for k in range(5) for _ in range(3)])
    folds = ek.group_folds(groups, 5, seed=0)
    assert set(folds) == {0, 1, 2, 3, 4}
    for f in range(5):
        assert not set(groups[folds == f]) & set(groups[folds != f])
    assert (ek.group_folds(groups, 5, seed=0) == folds).all()   # deterministic
    with pytest.raises(ConfigError):
        ek.group_folds(np.array(["a", "b"]), 5)


def test_cross_validation_never_fits_a_held_out_group():
    f = ek.gemm_frame("h100_sxm", engines=("vllm",))
    f = f[f["in_range"] & (f["dtype"] == "bf16") & (f["m"] <= 64)].reset_index(drop=True)
    folds = ek.group_folds(f["shape"], 5, seed=0)
    seen = []

    def fit(train):
        seen.append(set(train["shape"]))
        return TRUE_GEMM

    def predict(test, params):
        held = set(test["shape"])
        assert not held & seen[-1]
        return ek.predict_gemm(test, H100, params)

    pred, fitted = ek.cross_validate(f, folds, fit, predict)
    assert len(fitted) == 5 and np.isfinite(pred).all()
    assert set().union(*seen) == set(f["shape"])
