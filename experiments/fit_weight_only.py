"""Fit the weight-only (int4) GEMM to AIConfigurator's A100 TensorRT-LLM int4 rows.

    python experiments/fit_weight_only.py                    # fit, write the report
    python experiments/fit_weight_only.py --no-write         # print only
    python experiments/fit_weight_only.py --refresh-data /work/shared/calibration/aiconfigurator
                                                             # re-cut the shipped subset first

Model (``servesim.costmodel.kernels.weight_only_gemm_time_nb``): the engine's bf16 GEMM with the
weights read at 0.5 + 2/128 bytes per element (int4 and one 16-bit scale per group of 128), a
16-row tile up to 16 tokens, and a longer fixed time. The bf16 parameters are the A100 TensorRT-LLM
fit in engines/trtllm.toml (fitted on the same GPU and engine, cuBLAS rows); the free fit adds the
weight-only kernel's compute and bandwidth fractions as ratios to the bf16 ones, and its latency.
The shipped model keeps both ratios at 1 (the free fit finds them within a few per cent of 1, so the
data show no compute penalty of the dequantisation) and fits the latency alone; servesim adds
``latency - harness - bf16 latency`` to an engine's bf16 GEMM latency (``WEIGHT_ONLY_EXTRA_LATENCY_US``
in servesim/costmodel/dtypes.py). ``harness``: the int4 rows are TensorRT plugins timed in a
TensorRT engine (``trt_flow``), whose floor (the fastest SmoothQuant row, also a plugin) lies above
the cuBLAS rows' floor (``torch_flow``) by the engine's enqueue, which a serving engine's CUDA graph
does not pay.
Writes experiments/results/weight_only_validation.md.
"""
from __future__ import annotations

import argparse
import gzip
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from numba import njit
from scipy.optimize import least_squares

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from servesim.calibrate import data_dir  # noqa: E402
from servesim.config import load_hardware  # noqa: E402
from servesim.config.engine import load_engine  # noqa: E402
from servesim.costmodel import kernels as kn  # noqa: E402
from servesim.costmodel.memory import weight_bytes_per_param  # noqa: E402

DATA = data_dir() / "weight_only"
SUBSET = DATA / "a100_sxm_trtllm-1.0.0_gemm_int4_wo.csv.gz"
FLOORS = DATA / "a100_sxm_trtllm-1.0.0_floors.csv"
REPORT = REPO / "experiments" / "results" / "weight_only_validation.md"
MIN_NK, MAX_NK = 1024, 16384     # LLM layer shapes (the table also has n, k of 128-512 and 65536)
LOSS = {"loss": "soft_l1", "f_scale": 0.1}


def refresh_data(src: Path) -> None:
    """Cut the int4 rows (n, k in [MIN_NK, MAX_NK]) and the floors of the three kernel sources from
    ``src``/a100_sxm/trtllm-1.0.0/gemm_perf.csv; values unchanged, gzip with mtime 0."""
    d = pd.read_csv(src / "a100_sxm" / "trtllm-1.0.0" / "gemm_perf.csv")
    w = d[(d.gemm_dtype == "int4_wo") & d.n.between(MIN_NK, MAX_NK) & d.k.between(MIN_NK, MAX_NK)]
    w = w[["m", "n", "k", "latency"]].sort_values(["m", "n", "k"], kind="mergesort")
    DATA.mkdir(parents=True, exist_ok=True)
    with open(SUBSET, "wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, compresslevel=9,
                                                 mtime=0) as gz:
        gz.write(w.to_csv(index=False).encode())
    floors = d.groupby("gemm_dtype").latency.min().rename("min_latency_ms").reset_index()
    floors.to_csv(FLOORS, index=False)
    shutil.copyfile(src / "LICENSE", DATA / "LICENSE")
    shutil.copyfile(src / "SOURCE", DATA / "SOURCE")


def bf16_rows() -> pd.DataFrame:
    """The shipped A100 TensorRT-LLM cuBLAS bf16 rows (for the ratio columns)."""
    b = pd.read_csv(data_dir() / "aiconfigurator" / "a100_sxm" / "trtllm-1.0.0" / "gemm_perf.csv.gz")
    return b[b.gemm_dtype == "bfloat16"][["m", "n", "k", "latency"]]


@njit
def _wo_many_nb(m, n, k, wb, peak, bw, sms, gmax, hbm, lat, sk, k0, ml):
    out = np.empty(m.shape[0])
    for i in range(m.shape[0]):
        out[i] = kn.weight_only_gemm_time_nb(m[i], k[i], n[i], wb, peak, bw, sms, gmax, hbm, lat, sk, k0, ml)
    return out


@njit
def _bf16_many_nb(m, n, k, peak, bw, sms, gmax, hbm, lat, sk, k0, ml):
    out = np.empty(m.shape[0])
    for i in range(m.shape[0]):
        out[i] = kn.gemm_time_nb(m[i], k[i], n[i], 2.0, 2.0, peak, bw, sms, gmax, hbm, lat, sk, k0, ml)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--refresh-data", type=Path)
    args = ap.parse_args(argv)
    if args.refresh_data:
        refresh_data(args.refresh_data)
    hw = load_hardware("a100-sxm-80gb")
    fit = load_engine("trtllm").fit_for(hw)
    w = pd.read_csv(SUBSET)
    cols = [w[c].to_numpy(np.float64) for c in ("m", "n", "k")]
    t = w.latency.to_numpy() * 1e-3
    common = (hw.peak_flops["bf16"], hw.hbm_bw, float(hw.sm_count))
    wb = weight_bytes_per_param("int4")

    def pred(e_max, e_hbm, lat_us):
        return _wo_many_nb(*cols, wb, *common, fit.gemm_max * e_max, fit.gemm_hbm_fraction * e_hbm, lat_us * 1e-6,
                           fit.gemm_splitk_latency_s, fit.gemm_tile_overhead_k, fit.gemm_mem_latency_s)

    free = least_squares(lambda x: np.log(pred(*x)) - np.log(t), [1.0, 1.0, 5.0],
                         bounds=([0.3, 0.3, 0.0], [1.5, 1.5, 60.0]), **LOSS).x
    lat = least_squares(lambda x: np.log(pred(1.0, 1.0, x[0])) - np.log(t), [5.0], bounds=([0.0], [60.0]),
                        **LOSS).x[0]
    floors = pd.read_csv(FLOORS).set_index("gemm_dtype").min_latency_ms * 1e3
    harness = floors["sq"] - floors["bfloat16"]
    extra = lat - harness - fit.gemm_latency_s * 1e6
    err = pred(1.0, 1.0, lat) / t - 1.0
    err_free = pred(*free) / t - 1.0
    # the bf16 fit on the same shapes, and the measured vs predicted int4 / bf16 ratio
    j = w.merge(bf16_rows(), on=["m", "n", "k"], suffixes=("", "_bf16"))
    jc = [j[c].to_numpy(np.float64) for c in ("m", "n", "k")]
    tb = j.latency_bf16.to_numpy() * 1e-3
    pb = _bf16_many_nb(*jc, *common, fit.gemm_max, fit.gemm_hbm_fraction, fit.gemm_latency_s,
                       fit.gemm_splitk_latency_s, fit.gemm_tile_overhead_k, fit.gemm_mem_latency_s)
    pw = _wo_many_nb(*jc, wb, *common, fit.gemm_max, fit.gemm_hbm_fraction, lat * 1e-6, fit.gemm_splitk_latency_s,
                     fit.gemm_tile_overhead_k, fit.gemm_mem_latency_s)
    j["err"] = pw / (j.latency.to_numpy() * 1e-3) - 1.0
    j["err_bf16"] = pb / tb - 1.0
    j["ratio"] = j.latency / j.latency_bf16
    j["ratio_pred"] = pw / pb
    big = j[j.n * j.k >= 8192 * 8192]
    by_m = j.groupby("m").agg(rows=("err", "size"), med_abs_err=("err", lambda s: s.abs().median()),
                              med_abs_err_bf16=("err_bf16", lambda s: s.abs().median()))
    by_m = by_m.join(big.groupby("m").agg(ratio=("ratio", "median"), ratio_pred=("ratio_pred", "median")))

    def q(e):
        a = np.abs(e)
        return f"median |error| {100 * np.median(a):.1f}%, p90 {100 * np.quantile(a, 0.9):.1f}%"

    lines = [
        "# Weight-only int4 GEMMs: fit and errors",
        "",
        "Written by `experiments/fit_weight_only.py`. Data: AIConfigurator's A100-SXM4-80GB TensorRT-LLM 1.0.0",
        "`int4_wo` rows (`WeightOnlyQuantMatmul` plugin, int4 weights, fp16 activations), n and k in "
        f"{MIN_NK}-{MAX_NK}, {len(w)} rows (`servesim/calibrate/data/weight_only/`, Apache-2.0); the bf16",
        "rows are the cuBLAS (`torch_flow`) rows of the same table. Model: "
        "`servesim.costmodel.kernels.weight_only_gemm_time_nb`",
        "with the A100 TensorRT-LLM bf16 fit of engines/trtllm.toml.",
        "",
        f"- free fit: compute fraction x {free[0]:.3f}, bandwidth fraction x {free[1]:.3f} of the bf16 fit, "
        f"latency {free[2]:.2f} us; {q(err_free)}",
        f"- shipped: both ratios 1, latency {lat:.2f} us; {q(err)}; the bf16 fit on the same shapes: "
        f"{q(j.err_bf16)}",
        f"- harness: fastest SmoothQuant plugin row {floors['sq']:.2f} us - fastest cuBLAS row "
        f"{floors['bfloat16']:.2f} us = {harness:.2f} us (TensorRT engine enqueue)",
        f"- extra fixed time of a weight-only GEMM over the engine's bf16 GEMM: {lat:.2f} - {harness:.2f} - "
        f"{fit.gemm_latency_s * 1e6:.2f} = **{extra:.2f} us** (`WEIGHT_ONLY_EXTRA_LATENCY_US`)",
        "",
        "Per m: rows, median |error| of the shipped model and of the bf16 fit on the bf16 rows of the same",
        "shapes; median int4 / bf16 time ratio, measured and predicted, over shapes with n k >= 8192^2",
        "(ratio 0.25 would be the weight bytes alone: 0.5 + 2/128 against 2 bytes).",
        "",
        "| m | rows | error | bf16 error | int4/bf16 measured | predicted |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for m, r in by_m.iterrows():
        lines.append(f"| {m} | {int(r.rows)} | {100 * r.med_abs_err:.1f}% | {100 * r.med_abs_err_bf16:.1f}% | "
                     f"{r.ratio:.2f} | {r.ratio_pred:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        REPORT.write_text(text)
        print(f"wrote {REPORT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
