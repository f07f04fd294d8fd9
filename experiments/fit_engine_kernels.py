"""Fit the engine kernel formulas (servesim/costmodel/kernels.py) to AIConfigurator's per-kernel latencies.

    python experiments/fit_engine_kernels.py                  # fit, cross-validate, write report + JSON
    python experiments/fit_engine_kernels.py --no-write       # fit and print the summary only
    python experiments/fit_engine_kernels.py --refresh-data /work/shared/calibration/aiconfigurator
                                                              # re-cut the shipped subset first

Per GPU (h100-sxm, a100-sxm-80gb): the GEMM parameters on the bf16 rows of all three engines (5-fold
cross-validation over (n, k) shapes), fp8 GEMMs per engine (the bf16 parameters alone, then two fp8
parameters, 5-fold by shape); per (GPU, engine): prefill and decode attention (5-fold over
(heads, kv_heads) configurations, fp8-KV rows predicted with the bf16-KV fit), the engine's
all-reduce (fit on two GPU counts, check the third, each in turn), fused MoE (5-fold over
(hidden, inter, experts, topk) shapes; H100 only: the A100 tables have no balanced-router rows);
NCCL all-reduce with the profile's Vidur-fitted link values (and a refit, leave one GPU count out);
Vidur's eager GEMMs with the GEMM formula + one launch gap per GPU, fitted on the Llama family.
Writes experiments/results/engine_kernels_validation.md and engine_kernels_fit.json.
"""
from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from servesim.calibrate import engine_kernels as ek  # noqa: E402
from servesim.calibrate import vidur_dir  # noqa: E402
from servesim.calibrate.operators import error_summary, predict_gemm as vidur_predict_gemm, read_vidur_mlp  # noqa: E402
from servesim.config import load_hardware  # noqa: E402

RESULTS = REPO / "experiments" / "results"
REPORT = RESULTS / "engine_kernels_validation.md"
FIT_JSON = RESULTS / "engine_kernels_fit.json"
FOLDS = 5
SEED = 0
VIDUR_GPU = {"h100_sxm": "h100", "a100_sxm": "a100"}
VIDUR_FIT_ORG = "meta-llama"
VIDUR_CLASS = {"gemm_qkv": "GEMM QKV", "gemm_attn_out": "GEMM attention out", "gemm_mlp_up": "GEMM MLP up",
               "gemm_mlp_down": "GEMM MLP down"}
TARGET = 0.10
# Decimal places of each parameter in the JSON and the report (the errors use the rounded values).
DECIMALS = {"_us": 2, "_k": 0, "block_overhead": 2}


def rnd(params: dict) -> dict:
    out = {}
    for k, v in params.items():
        d = next((n for suffix, n in DECIMALS.items() if k.endswith(suffix)), 3)
        out[k] = round(float(v), d) if d else float(round(v))
    return out


def quietly(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


# -- the shipped subset -------------------------------------------------------------------------

SUBSET_M = {1, 2, 4, 8, 16, 32, 33, 48, 64, 65, 80, 96, 128, 129, 160, 192, 193, 256, 257, 384, 512, 513, 768, 769,
            1024, 1025, 1536, 1537, 2048, 2049, 3072, 3073, 4096, 4097, 8192}
SUBSET_MOE_KERNELS = ("vllm_fused_moe", "moe_torch_flow_cutlass", "sglang_fused_moe_triton")


def _constants(index: pd.DataFrame, gpu: str, folder: str, table: str) -> dict:
    row = index[(index["gpu"] == gpu) & (index["framework"] == folder) & (index["table"] == table)]
    if row.empty or pd.isna(row["constant_columns"].iloc[0]):
        return {}
    return dict(kv.split("=", 1) for kv in row["constant_columns"].iloc[0].split(";"))


def _subset(gpu: str, folder: str, table: str, d: pd.DataFrame):
    """The rows and columns shipped of one source table (None: nothing)."""
    num = lambda c: pd.to_numeric(d[c])  # noqa: E731
    if table == "gemm_perf.csv":
        keep = d["gemm_dtype"].isin(["bfloat16", "fp8"]) & num("m").isin(SUBSET_M)
        if "kernel_source" in d and folder.startswith("trtllm") and gpu == "a100_sxm":
            keep &= d["kernel_source"] == "torch_flow"
        return d[keep][["gemm_dtype", "m", "n", "k", "latency"]]
    if table in ("context_attention_perf.csv", "generation_attention_perf.csv"):
        keep = (num("head_dim") == 128) & (d["attn_dtype"] == "bfloat16") & d["kv_cache_dtype"].isin(["bfloat16", "fp8"])
        if "window_size" in d:
            keep &= num("window_size") == 0
        lengths = "isl" if table.startswith("context") else "step"
        return d[keep][["batch_size", lengths, "num_heads", "num_key_value_heads", "kv_cache_dtype", "latency"]]
    if table == "custom_allreduce_perf.csv":
        return d[["kernel_source", "num_gpus", "message_size", "latency"]]
    if table == "nccl_perf.csv":
        return d[(d["op_name"] == "all_reduce") & (d["nccl_dtype"] == "half")][["num_gpus", "message_size", "latency"]]
    if table == "moe_perf.csv":
        keep = ((d["distribution"] == "balanced") & d["moe_dtype"].isin(["bfloat16", "fp8"])
                & d["kernel_source"].isin(SUBSET_MOE_KERNELS))
        if not keep.any():
            return None
        return d[keep][["kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
                        "moe_tp_size", "moe_ep_size", "latency"]]
    return None


def refresh_data(src: Path) -> pd.DataFrame:
    """Re-cut ``servesim/calibrate/data/aiconfigurator`` from the AIConfigurator tree at ``src`` (the
    layout of shared/calibration/aiconfigurator: INDEX.csv, LICENSE, SOURCE, <gpu>/<folder>/*.csv).
    Values are copied unchanged; gzip with mtime 0, so the files are byte-reproducible."""
    dst = ek.aiconfigurator_dir()
    index = pd.read_csv(src / "INDEX.csv")
    if dst.exists():
        for p in dst.glob("*_sxm"):
            shutil.rmtree(p)
    rows = []
    for gpu, engines in ek.ENGINES.items():
        for folder in list(engines.values()) + [ek.NCCL]:
            for table in ek.TABLES:
                path = src / gpu / folder / f"{table}.csv"
                if not path.is_file():
                    continue
                d = pd.read_csv(path)
                for k, v in _constants(index, gpu, folder, table + ".csv").items():
                    if k not in d.columns:
                        d[k] = v
                s = _subset(gpu, folder, table + ".csv", d)
                if s is None or s.empty:
                    continue
                s = s.sort_values(list(s.columns[:-1]), kind="mergesort").reset_index(drop=True)
                out = dst / gpu / folder / f"{table}.csv.gz"
                out.parent.mkdir(parents=True, exist_ok=True)
                with open(out, "wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, compresslevel=9,
                                                          mtime=0) as gz:
                    gz.write(s.to_csv(index=False).encode())
                rows.append({"gpu": gpu, "folder": folder, "table": table, "rows_source": len(d),
                             "rows_shipped": len(s), "bytes": out.stat().st_size})
    shutil.copyfile(src / "LICENSE", dst / "LICENSE")
    shutil.copyfile(src / "SOURCE", dst / "SOURCE")
    manifest = pd.DataFrame(rows)
    manifest.to_csv(dst / "MANIFEST.csv", index=False)
    return manifest


# -- error tables -------------------------------------------------------------------------------

def summarise(frame: pd.DataFrame, gpu: str, engine: str, cls: str, split: str) -> dict:
    err = frame["pred_s"].to_numpy() / frame["time_s"].to_numpy() - 1.0
    a = np.abs(err)
    return {"gpu": ek.GPUS[gpu], "engine": engine, "class": cls, "split": split, "n": len(frame),
            "median": float(np.median(a)), "p90": float(np.quantile(a, 0.9)), "signed": float(np.median(err))}


# -- per class ----------------------------------------------------------------------------------

def run_gemm(gpu: str, hw, out_rows: list, fitted: dict) -> dict:
    frame = ek.gemm_frame(gpu)
    rng = frame[frame["in_range"]]
    bf = rng[rng["dtype"] == "bf16"].copy()
    gemm = rnd(quietly(ek.fit_gemm, bf, hw))
    fitted[(gpu, "gemm")] = gemm
    folds = ek.group_folds(bf["shape"], FOLDS, SEED)
    bf["pred_s"], fold_params = ek.cross_validate(bf, folds, lambda tr: rnd(quietly(ek.fit_gemm, tr, hw)),
                                                  lambda te, p: ek.predict_gemm(te, hw, p))
    fitted[(gpu, "gemm_folds")] = fold_params
    for engine, part in bf.groupby("engine"):
        out_rows.append(summarise(part, gpu, engine, "GEMM bf16", f"held out: {FOLDS}-fold by (n, k) shape"))
        fit_part = part.assign(pred_s=ek.predict_gemm(part, hw, gemm))
        out_rows.append(summarise(fit_part, gpu, engine, "GEMM bf16", "fitted (all shapes)"))
    outside = frame[~frame["in_range"] & (frame["dtype"] == "bf16")]
    if len(outside):
        outside = outside.assign(pred_s=ek.predict_gemm(outside, hw, gemm))
        for engine, part in outside.groupby("engine"):
            out_rows.append(summarise(part, gpu, engine, "GEMM bf16", "outside range: n or k < 128 (not fitted)"))
    fp8 = rng[rng["dtype"] == "fp8"]
    for engine, part in fp8.groupby("engine"):
        part = part.copy()
        transfer = part.assign(pred_s=ek.predict_gemm(part, hw, gemm))
        out_rows.append(summarise(transfer, gpu, engine, "GEMM fp8",
                                  "held out: whole dtype, bf16 parameters at the fp8 peak"))
        p8 = rnd(quietly(ek.fit_gemm_fp8, part, hw, gemm))
        fitted[(gpu, engine, "gemm_fp8")] = p8
        folds = ek.group_folds(part["shape"], FOLDS, SEED)
        part["pred_s"], _ = ek.cross_validate(part, folds, lambda tr: rnd(quietly(ek.fit_gemm_fp8, tr, hw, gemm)),
                                              lambda te, p: ek.predict_gemm(te, hw, gemm, p))
        out_rows.append(summarise(part, gpu, engine, "GEMM fp8",
                                  f"held out: {FOLDS}-fold by shape, + gemm_fp8_max, gemm_fp8_latency_us"))
    return gemm


def run_attention(gpu: str, hw, engine: str, kind: str, out_rows: list, fitted: dict):
    frame = ek.prefill_frame(gpu, engine) if kind == "prefill" else ek.decode_frame(gpu, engine)
    fit = ek.fit_prefill if kind == "prefill" else ek.fit_decode
    predict = ek.predict_prefill if kind == "prefill" else ek.predict_decode
    cls = "prefill attention" if kind == "prefill" else "decode attention"
    rng = frame[frame["in_range"]]
    bf = rng[rng["kv_dtype"] == "bf16"].copy()
    params = rnd(quietly(fit, bf, hw))
    fitted[(gpu, engine, kind)] = params
    folds = ek.group_folds(bf["heads_group"], FOLDS, SEED)
    bf["pred_s"], _ = ek.cross_validate(bf, folds, lambda tr: rnd(quietly(fit, tr, hw)),
                                        lambda te, p: predict(te, hw, p))
    out_rows.append(summarise(bf, gpu, engine, cls, f"held out: {FOLDS}-fold by (heads, kv_heads)"))
    out_rows.append(summarise(bf.assign(pred_s=predict(bf, hw, params)), gpu, engine, cls, "fitted (all rows)"))
    f8 = rng[rng["kv_dtype"] == "fp8"]
    if len(f8):
        out_rows.append(summarise(f8.assign(pred_s=predict(f8, hw, params)), gpu, engine, cls,
                                  "held out: fp8 KV cache, bf16-KV parameters"))
    outside = frame[~frame["in_range"] & (frame["kv_dtype"] == "bf16")]
    if len(outside):
        out_rows.append(summarise(outside.assign(pred_s=predict(outside, hw, params)), gpu, engine, cls,
                                  f"outside range: heads / kv_heads > {ek.MAX_GQA_GROUP} (not fitted)"))
    return bf


def run_allreduce(gpu: str, hw, engine: str, gemm: dict, out_rows: list, fitted: dict):
    frame = ek.allreduce_frame(gpu, engine).copy()
    hf = gemm["gemm_hbm_fraction"]
    params = rnd(quietly(ek.fit_allreduce, frame, hw, hf))
    fitted[(gpu, engine, "allreduce")] = params
    frame["pred_s"], _ = ek.cross_validate(frame, frame["n"].to_numpy().astype(int),
                                           lambda tr: rnd(quietly(ek.fit_allreduce, tr, hw, hf)),
                                           lambda te, p: ek.predict_allreduce(te, hw, p, hf))
    for eager, part in frame.groupby("eager"):
        cls = "all-reduce eager" if eager else "all-reduce (CUDA graph)"
        out_rows.append(summarise(part, gpu, engine, cls, "held out: one GPU count, fitted on the other two"))
        out_rows.append(summarise(part.assign(pred_s=ek.predict_allreduce(part, hw, params, hf)), gpu, engine, cls,
                                  "fitted (2, 4, 8 GPUs)"))


def run_moe(gpu: str, hw, engine: str, gemm: dict, out_rows: list, fitted: dict):
    frame = ek.moe_frame(gpu, engine)
    if frame is None:
        return
    rng = frame[frame["in_range"]].copy()
    params = rnd(quietly(ek.fit_moe, rng, hw, gemm))
    fitted[(gpu, engine, "moe")] = params
    for dtype, part in rng.groupby("dtype"):
        part = part.copy()
        folds = ek.group_folds(part["shape"], FOLDS, SEED)
        part["pred_s"], _ = ek.cross_validate(part, folds, lambda tr: rnd(quietly(ek.fit_moe, tr, hw, gemm)),
                                              lambda te, p: ek.predict_moe(te, hw, gemm, p))
        cls = f"fused MoE {dtype}"
        out_rows.append(summarise(part, gpu, engine, cls, f"held out: {FOLDS}-fold by (hidden, inter, experts, topk)"))
        out_rows.append(summarise(part.assign(pred_s=ek.predict_moe(part, hw, gemm, params)), gpu, engine, cls,
                                  "fitted (all shapes)"))
    outside = frame[~frame["in_range"]]
    for dtype, part in outside.groupby("dtype"):
        out_rows.append(summarise(part.assign(pred_s=ek.predict_moe(part, hw, gemm, params)), gpu, engine,
                                  f"fused MoE {dtype}", f"outside range: tokens > {ek.MOE_MAX_TOKENS} (not fitted)"))


def run_nccl(gpu: str, hw, out_rows: list, fitted: dict):
    frame = ek.nccl_frame(gpu).copy()
    frame["pred_s"] = ek.predict_nccl(frame, hw)
    out_rows.append(summarise(frame, gpu, "nccl", "NCCL all-reduce",
                              "profile values (fitted on Vidur eager NCCL), nothing fitted here"))
    refit = rnd(quietly(ek.fit_nccl, frame, hw))
    fitted[(gpu, "nccl")] = refit
    cv = frame.copy()
    cv["pred_s"], _ = ek.cross_validate(cv, cv["n"].to_numpy().astype(int), lambda tr: rnd(quietly(ek.fit_nccl, tr, hw)),
                                        lambda te, p: ek.predict_nccl(te, hw, p))
    out_rows.append(summarise(cv, gpu, "nccl", "NCCL all-reduce", "refit, held out: one GPU count"))


def run_vidur(gpu: str, hw, gemm: dict, out_rows: list, fitted: dict) -> pd.DataFrame:
    files = sorted((vidur_dir() / "profiling" / "compute" / VIDUR_GPU[gpu]).glob("*/*/mlp.csv"))
    mlp = pd.concat([read_vidur_mlp(f) for f in files], ignore_index=True)
    g = mlp[mlp["op_class"].str.startswith("gemm_") & (mlp["num_tokens"] >= 1)].copy()
    g["split"] = np.where(g["model"].str.startswith(VIDUR_FIT_ORG + "/"), "fitted", "held-out")
    launch = rnd(quietly(ek.fit_launch, g[g["split"] == "fitted"], hw, gemm))
    fitted[(gpu, "launch")] = launch
    eager = {**gemm, "gemm_latency_us": gemm["gemm_latency_us"] + launch["launch_us"]}
    g["pred_s"] = ek.predict_gemm(g.assign(dtype="bf16"), hw, eager)
    g["today_s"] = vidur_predict_gemm(g, hw)
    rows = []
    for (cls, split), part in g.groupby(["op_class", "split"]):
        new = summarise(part, gpu, "eager PyTorch (Vidur)", VIDUR_CLASS[cls], split)
        old = summarise(part.assign(pred_s=part["today_s"]), gpu, "", "", "")
        rows.append({**new, "today_median": old["median"], "today_p90": old["p90"], "today_signed": old["signed"]})
    return pd.DataFrame(rows)


# -- report -------------------------------------------------------------------------------------

def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def spct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def fitted_json(fitted: dict) -> dict:
    out = {"meta": {
        "generated_by": "experiments/fit_engine_kernels.py",
        "formulas": "servesim/costmodel/kernels.py",
        "data": "servesim/calibrate/data/aiconfigurator (NVIDIA AIConfigurator, Apache-2.0; see its README)",
        "engines": {ek.GPUS[g]: dict(e) for g, e in ek.ENGINES.items()},
        "units": "fractions of the hardware profile's datasheet figure; *_us microseconds; gemm_tile_overhead_k in "
                 "K elements; attn_prefill_block_overhead in 128-key blocks",
    }}
    for gpu in ek.GPUS:
        d = {"gemm": {**fitted[(gpu, "gemm")], **fitted[(gpu, "launch")]}, "nccl": fitted[(gpu, "nccl")]}
        for engine in ek.ENGINES[gpu]:
            flat = {}
            for part in ("gemm_fp8", "prefill", "decode", "allreduce", "moe"):
                flat.update(fitted.get((gpu, engine, part), {}))
            d[engine] = flat
        out[ek.GPUS[gpu]] = d
    return out


def fitted_table(fitted: dict) -> list:
    lines = ["| gpu | engine | parameter | value | bounds | bound hit |", "|---|---|---|---|---|---|"]
    for gpu in ek.GPUS:
        blocks = [("all (cuBLAS bf16)", fitted[(gpu, "gemm")]), ("eager PyTorch (Vidur)", fitted[(gpu, "launch")]),
                  ("nccl (refit; not adopted, see NCCL)", fitted[(gpu, "nccl")])]
        for engine in ek.ENGINES[gpu]:
            for part in ("gemm_fp8", "prefill", "decode", "allreduce", "moe"):
                if (gpu, engine, part) in fitted:
                    blocks.append((engine, fitted[(gpu, engine, part)]))
        for engine, params in blocks:
            hit = set(ek.bounds_hit(params))
            for k, v in params.items():
                lo, hi = ek.BOUNDS[k]
                lines.append(f"| {ek.GPUS[gpu]} | {engine} | `{k}` | {v:g} | [{lo:g}, {hi:g}] | "
                             f"{'**yes**' if k in hit else ''} |")
    return lines


def write_report(errors: pd.DataFrame, vidur: pd.DataFrame, fitted: dict, timing: float, manifest_bytes: int) -> str:
    L = ["# Engine kernel formulas against AIConfigurator's per-kernel latencies", "",
         "Generated by `experiments/fit_engine_kernels.py`; do not edit by hand. Data: NVIDIA AIConfigurator's "
         "per-kernel latencies measured inside vLLM 0.14.0, SGLang 0.5.9, TensorRT-LLM (1.2.0rc5 on H100, 1.0.0 on "
         "A100) and NCCL 2.27.3, each kernel replayed in a CUDA graph (no host launch cost), shipped as a subset in "
         f"`servesim/calibrate/data/aiconfigurator/` ({manifest_bytes / 1e6:.2f} MB, Apache-2.0; its README says what "
         "was kept). Error = |predicted / measured - 1| per row; 'signed' is the median of predicted / measured - 1 "
         "(> 0: the formula is slower than the measurement). Formulas: `servesim/costmodel/kernels.py`; fitting: "
         "`servesim/calibrate/engine_kernels.py`.", ""]
    L += ["## Formulas", "",
          "- **GEMM** X[m,k] W[n,k]^T: `latency + max(waves x 2 Tm Tn (k/s + k0) / (peak gemm_max / SMs), "
          "(n k w + m (n+k) a) / (hbm_bw gemm_hbm_fraction))`, waves = ceil(ceil(m/Tm) ceil(n/Tn) s / SMs), "
          "minimised over Tm in {64, 128} (Tn = 128) and, when the tiles do not fill the SMs, split-K "
          "s = min(floor(SMs/tiles), k/256) at `+ gemm_splitk_latency_us`; k0 = `gemm_tile_overhead_k` is a tile's "
          "prologue/epilogue in K steps. Roofline (Williams et al., CACM 2009); tile and wave quantisation (NVIDIA "
          "Matrix Multiplication Background User's Guide); split-K (CUTLASS 'Efficient GEMM in CUDA'). fp8 "
          "per-tensor: the same at `gemm_fp8_max` of the fp8 peak, 1-byte operands, `+ gemm_fp8_latency_us` "
          "(activation quantisation kernel).",
          "- **Prefill attention** (causal FlashAttention, `seqs` chunks of c tokens after ctx cached ones): "
          "`latency + sum over waves of per_block (keys_j / 128 + attn_prefill_block_overhead) + bytes / (hbm_bw "
          "attn_prefill_hbm_fraction)`, one block per (sequence, head, 128-query block) run heaviest first in waves "
          "of one per SM, a wave as long as its heaviest block, block j attending to ctx + min(128 j, c) keys, "
          "per_block = 4 x 128 x 128 x d / (peak attn_prefill_max / SMs); bytes = c (2 h d 2 + 4 kv d kvb) + ctx "
          "2 kv d kvb per sequence (Dao et al. 2022; Shah et al. 2024). Compute and memory add (see Misses).",
          "- **Decode attention**: `latency + seqs kv_heads attn_decode_block_us / SMs + (kv_tokens 2 kv_heads d "
          "kvb + seqs 2 h d 2) / (hbm_bw attn_decode_hbm_fraction)` (PagedAttention, Kwon et al. 2023; "
          "Flash-Decoding).",
          "- **Engine all-reduce** (CUDA graph): `allreduce_latency_us + min((n-1) S / B, allreduce_step_latency_us "
          "+ 2 (n-1)/n S / B)`, B = one direction of the scale-up link x `allreduce_bw_fraction` (one-shot / "
          "two-shot custom all-reduce, vLLM `custom_all_reduce.cuh`; ring volume, Patarasuk & Yuan 2009). Eager: "
          "`+ allreduce_eager_launch_us + 2 S / (hbm_bw gemm_hbm_fraction)` (host launch, and the copy of the "
          "input into the registered buffer).",
          "- **Fused MoE**: `moe_latency_us + grouped(up) + grouped(down)`, each a GEMM roofline over touched x "
          "ceil(m/Tm) ceil(n/128) tiles with m = assignments / touched, at `moe_efficiency x gemm_max` (fp8: "
          "`moe_fp8_*` at the fp8 peak); assignments = tokens top_k / EP, touched = distinct local experts given "
          "by the caller's router model (these tables: balanced, min(E/EP, tokens top_k / EP); uniform random "
          "routing: E (1 - (1 - k/E)^T)).",
          "- **NCCL all-reduce**: the simulator's `collective_base_latency + collectives.allreduce_time_nb` (ring "
          "or tree, Thakur et al. 2005) with the profile's Vidur-fitted `scaleup_bw_fraction`, `scaleup_latency_us`.",
          "- **Eager GEMM** (Vidur, PyTorch without CUDA graphs): the GEMM formula with `gemm_latency_us + "
          "launch_us`.", ""]
    L += ["## Rows and ranges", "",
          f"- GEMM: m in 1..8192 on the shipped grid; n, k >= {ek.GEMM_MIN_NK} fitted (n or k of 32-64 run GEMV / "
          "split-K paths no LLM linear layer has; their error is listed as 'outside range'). bf16 parameters are "
          "one set per GPU for all three engines (each calls cuBLAS for a bf16 linear layer); held-out rows are "
          "whole (n, k) shapes, left out of the fit in all engines at once.",
          f"- Attention: head_dim 128, no sliding window, bf16 queries; GQA groups heads / kv_heads <= "
          f"{ek.MAX_GQA_GROUP} fitted (larger groups, MQA of older models, run other kernels in TensorRT-LLM; "
          "listed as 'outside range'). Held out: whole (heads, kv_heads) configurations. fp8-KV rows are predicted "
          "with the bf16-KV parameters (only the bytes change).",
          "- All-reduce: bf16, message 128 .. 512 Mi elements, 2 / 4 / 8 GPUs of one NVSwitch node; graph and eager "
          "rows share one fit (eager adds its launch and copy).",
          f"- MoE: balanced router, bf16 and fp8 per-tensor, gated experts, tokens <= {ek.MOE_MAX_TOKENS} (the "
          "engines' default token budget per step). The A100 tables have only power-law routed rows, so there is "
          "no A100 MoE fit.", ""]
    L += ["## Held-out error per class", "",
          f"Target: median < {pct(TARGET)} on held-out rows.", "",
          "| gpu | engine | class | rows | n | median | p90 | signed |", "|---|---|---|---|---:|---:|---:|---:|"]
    for _, r in errors.iterrows():
        flag = " **miss**" if r["split"].startswith("held out") and r["median"] >= TARGET else ""
        L.append(f"| {r['gpu']} | {r['engine']} | {r['class']} | {r['split']} | {r['n']} | {pct(r['median'])}{flag} | "
                 f"{pct(r['p90'])} | {spct(r['signed'])} |")
    L += ["", "## Eager GEMMs (Vidur) with the CUDA-graph formula + one launch gap", "",
          "Vidur's per-operator GEMM timings (eager PyTorch, fp16; `servesim/calibrate/data/vidur/`) predicted by "
          "the AIConfigurator-fitted GEMM formula of the same GPU plus `launch_us`, one number per GPU fitted on "
          "the Llama family (`meta-llama/*`), the other models held out. 'today' = the profile's current "
          "saturating-efficiency GEMM (`roofline.gemm_time_nb`, fitted to these same rows by "
          "`experiments/fit_costmodel.py`).", "",
          "| gpu | class | split | n | median | p90 | signed | today median | today p90 |",
          "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for _, r in vidur.iterrows():
        L.append(f"| {r['gpu']} | {r['class']} | {r['split']} | {r['n']} | {pct(r['median'])} | {pct(r['p90'])} | "
                 f"{spct(r['signed'])} | {pct(r['today_median'])} | {pct(r['today_p90'])} |")
    L += ["", "## Fitted values", "",
          "Rounded as shown; the errors above use the rounded values. Per-fold values of the cross-validation are "
          "not shown (they are refits on 4/5 of the groups).", ""]
    L += fitted_table(fitted)
    L += ["", f"Runtime of this script: {timing:.0f} s.", ""]
    return "\n".join(L)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-write", action="store_true", help="print the summary only")
    ap.add_argument("--refresh-data", type=Path, help="re-cut the shipped subset from this AIConfigurator tree")
    args = ap.parse_args(argv)
    if args.refresh_data:
        print(refresh_data(args.refresh_data).to_string())
    manifest = pd.read_csv(ek.aiconfigurator_dir() / "MANIFEST.csv")
    t0 = time.time()
    rows, fitted, vidur = [], {}, []
    for gpu, profile in ek.GPUS.items():
        hw = load_hardware(profile)
        gemm = run_gemm(gpu, hw, rows, fitted)
        for engine in ek.ENGINES[gpu]:
            run_attention(gpu, hw, engine, "prefill", rows, fitted)
            run_attention(gpu, hw, engine, "decode", rows, fitted)
            run_allreduce(gpu, hw, engine, gemm, rows, fitted)
            run_moe(gpu, hw, engine, gemm, rows, fitted)
        run_nccl(gpu, hw, rows, fitted)
        vidur.append(run_vidur(gpu, hw, gemm, rows, fitted))
        print(f"{profile}: done at {time.time() - t0:.0f} s", flush=True)
    errors = pd.DataFrame(rows)
    vidur = pd.concat(vidur, ignore_index=True)
    timing = time.time() - t0
    held = errors[errors["split"].str.startswith("held out")]
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(held[["gpu", "engine", "class", "split", "n", "median", "p90"]].to_string(index=False))
        print(vidur[["gpu", "class", "split", "n", "median", "p90", "today_median", "today_p90"]].to_string(index=False))
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        REPORT.write_text(write_report(errors, vidur, fitted, timing, int(manifest["bytes"].sum())))
        FIT_JSON.write_text(json.dumps(fitted_json(fitted), indent=2, sort_keys=False) + "\n")
        print(f"wrote {REPORT.relative_to(REPO)} and {FIT_JSON.relative_to(REPO)}")
    print(f"{timing:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
