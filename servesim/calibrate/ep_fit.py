"""Expert parallelism against AIConfigurator's tables (`servesim/costmodel/ep.py`).

- **All-to-all**: NCCL ``alltoall`` rows (fp16, 2, 4, 8 GPUs of one node, ``message_size`` elements of
  the whole per-rank buffer): alpha + (n - 1)/n S / (scale-up bw x fraction), two values per GPU
  fitted on two GPU counts and checked on the third, each in turn (`fit_alltoall`, `alltoall_holdout`).
  There are no DeepEP tables in the AIConfigurator data, so the engines' own dispatch/combine kernels
  are priced as NCCL's all-to-all.
- **MoE under EP**: every ``moe_perf`` row with ``moe_ep_size > 1`` (balanced and power-law routed,
  bf16 and fp8 per-tensor, the gated kernels) predicted with the engine's fused-MoE parameters, which
  were fitted on the EP = 1 balanced rows only (``experiments/fit_engine_kernels.py``), so every EP row
  is held out; the slowest rank's pairs from `ep.rank_load_nb` at the row's routing (power law: the
  table's generator, ``DEFICIT``), the remote pairs an
  expert-map kernel walks (``moe_ep_masked``) priced as `ep.masked_pairs_time_nb` (`predict_moe_ep`).

The rows are a subset shipped beside the other AIConfigurator copies (``moe_perf_ep.csv.gz``,
``nccl_alltoall_perf.csv.gz``; `refresh_ep_data` cuts them from a source tree).
"""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError
from . import engine_kernels as ek

EP_TABLE = "moe_perf_ep"
A2A_TABLE = "nccl_alltoall_perf"
EP_KERNELS = {"vllm": "vllm_fused_moe", "sglang": "sglang_fused_moe_triton", "trtllm": "moe_torch_flow_cutlass"}
MAX_TOKENS = ek.MOE_MAX_TOKENS
# Where each table's power-law generator deals the pairs its rounding leaves over (costmodel/ep.py,
# DEFICIT_FIRST / DEFICIT_SPREAD), read off the tables' 1-2 token rows: the B200 vLLM 0.19 rows cost
# what the balanced rows cost ("spread"); every other table's hottest rank holds all T k pairs ("first").
DEFICIT = {"vllm-0.19.0": "spread"}
DEFICIT_DEFAULT = "first"
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)   # the shipped token counts (powers of 2)


def _write_gz(df: pd.DataFrame, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, compresslevel=9, mtime=0) as gz:
        gz.write(df.to_csv(index=False).encode())


def refresh_ep_data(src: Path, dst: Path | None = None) -> list:
    """Cut the EP subsets from an AIConfigurator data tree ``src``: per (GPU, engine) the moe_perf rows
    with EP > 1 at the token counts TOKENS (powers of 2 up to MAX_TOKENS) of the gated bf16 / fp8 kernels (every distribution),
    per GPU the NCCL fp16 alltoall rows. Values unchanged, rows sorted; gzip with mtime 0."""
    dst = Path(dst or ek.aiconfigurator_dir())
    written = []
    for gpu, engines in ek.ENGINES.items():
        for engine, folder in engines.items():
            path = ek.table_file(Path(src) / gpu / folder, "moe_perf")
            if path is None:
                continue
            t = ek.read_folder_table(Path(src) / gpu / folder, "moe_perf")
            if "kernel_source" not in t.columns or "moe_ep_size" not in t.columns:
                continue
            for col in ("moe_ep_size", "num_tokens", "moe_tp_size"):
                t[col] = pd.to_numeric(t[col])
            keep = (t["kernel_source"].astype(str) == EP_KERNELS[engine]) & t["moe_dtype"].isin(["bfloat16", "fp8"]) \
                & (t["moe_ep_size"] > 1) & t["num_tokens"].isin(TOKENS)
            cols = ["moe_dtype", "distribution", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
                    "moe_tp_size", "moe_ep_size", "latency"]
            s = t.loc[keep, cols].sort_values(cols[:-1]).reset_index(drop=True)
            if len(s):
                _write_gz(s, dst / gpu / folder / f"{EP_TABLE}.csv.gz")
                written.append((gpu, folder, EP_TABLE, len(t), len(s)))
        nccl = ek.NCCL[gpu]
        t = ek.read_folder_table(Path(src) / gpu / nccl, "nccl_perf")
        s = t[(t["op_name"] == "alltoall") & (t["nccl_dtype"] == "half")][["num_gpus", "message_size", "latency"]]
        s = s.sort_values(["num_gpus", "message_size"]).reset_index(drop=True)
        _write_gz(s, dst / gpu / nccl / f"{A2A_TABLE}.csv.gz")
        written.append((gpu, nccl, A2A_TABLE, len(t), len(s)))
    return written


def alltoall_frame(gpu: str) -> pd.DataFrame:
    """NCCL alltoall rows of ``gpu``: ``n`` GPUs, ``nbytes`` of each rank's buffer, ``time_s``."""
    t = ek.read_table(gpu, ek.NCCL[gpu], A2A_TABLE)
    return pd.DataFrame({"n": t["num_gpus"].to_numpy(np.float64), "nbytes": t["message_size"].to_numpy(np.float64) * 2.0,
                         "time_s": t["latency"].to_numpy(np.float64) * 1e-3})


def predict_alltoall(frame: pd.DataFrame, link_bw: float, fraction: float, latency_s: float) -> np.ndarray:
    """alpha + (n - 1)/n S / (link_bw fraction): `costmodel.ep.alltoall_nb` inside one domain."""
    n = frame["n"].to_numpy(np.float64)
    return latency_s + (n - 1.0) / n * frame["nbytes"].to_numpy(np.float64) / (link_bw * fraction)


def fit_alltoall(frame: pd.DataFrame, link_bw: float) -> tuple:
    """(fraction, latency s) minimising the soft-L1 log error (``ek.LOSS``) over ``frame``."""
    from scipy.optimize import least_squares
    if len(frame) < 4:
        raise ConfigError(f"fit_alltoall: {len(frame)} rows")
    logm = np.log(frame["time_s"].to_numpy(np.float64))

    def residual(x):
        return np.log(predict_alltoall(frame, link_bw, x[0], x[1] * 1e-6)) - logm

    res = least_squares(residual, np.array([0.6, 10.0]), bounds=([0.05, 0.0], [1.0, 200.0]), **ek.LOSS)
    return float(res.x[0]), float(res.x[1]) * 1e-6


def alltoall_holdout(frame: pd.DataFrame, link_bw: float) -> pd.DataFrame:
    """Each GPU count predicted by the fit on the others: rows with ``pred_s`` and ``err``."""
    out = []
    for n in sorted(frame["n"].unique()):
        train, test = frame[frame["n"] != n], frame[frame["n"] == n].copy()
        frac, lat = fit_alltoall(train, link_bw)
        test["pred_s"] = predict_alltoall(test, link_bw, frac, lat)
        out.append(test)
    f = pd.concat(out, ignore_index=True)
    f["err"] = f["pred_s"] / f["time_s"] - 1.0
    return f


def moe_ep_frame(gpu: str, engine: str) -> pd.DataFrame | None:
    """The shipped EP rows of ``gpu``/``engine`` (None where there are none), with the slowest rank's
    pairs and touched experts at the row's routing (``alpha`` 0: balanced; power law: the table's own
    generator, ``DEFICIT``)."""
    from ..costmodel import ep as ep_model
    folder = ek.engine_folders(gpu)[engine]
    path = ek.aiconfigurator_dir() / gpu / folder / f"{EP_TABLE}.csv.gz"
    if not path.is_file():
        return None
    t = pd.read_csv(path)
    alpha = t["distribution"].map(lambda d: 0.0 if d == "balanced" else float(str(d).rsplit("_", 1)[-1]))
    pairs = np.zeros(len(t))
    touched = np.zeros(len(t))
    tables: dict = {}
    for i, (tok, e, k, ep, a) in enumerate(zip(t["num_tokens"], t["num_experts"], t["topk"], t["moe_ep_size"], alpha)):
        key = (int(e), int(k), int(ep), float(a))
        if key not in tables:
            tables[key] = ep_model.skew_table(int(e), int(k), int(ep), float(a), MAX_TOKENS,
                                              DEFICIT.get(folder, DEFICIT_DEFAULT))
        g, pa, to = tables[key]
        pairs[i], touched[i] = ep_model.rank_load_nb(float(tok), float(e), float(k), float(ep), g, pa, to)
    f = pd.DataFrame({
        "engine": engine, "dtype": t["moe_dtype"].map({"bfloat16": "bf16", "fp8": "fp8"}).to_numpy(),
        "distribution": t["distribution"].to_numpy(), "alpha": alpha.to_numpy(np.float64),
        "tokens": t["num_tokens"].to_numpy(np.float64), "hidden": t["hidden_size"].to_numpy(np.float64),
        "inter": (t["inter_size"] / t["moe_tp_size"]).to_numpy(np.float64), "topk": t["topk"].to_numpy(np.float64),
        "experts": t["num_experts"].to_numpy(np.float64), "tp": t["moe_tp_size"].to_numpy(np.float64),
        "ep": t["moe_ep_size"].to_numpy(np.float64), "assignments": pairs, "touched": touched,
        "time_s": t["latency"].to_numpy(np.float64) * 1e-3})
    f["shape"] = [f"{int(h)}/{int(i)}/{int(e)}/{int(k)}" for h, i, e, k in
                  zip(f["hidden"], t["inter_size"], f["experts"], f["topk"])]
    f["tile_m"], f["tile_n"], f["tile_k"] = ek.moe_tiles(engine, ek.GPUS.get(gpu, gpu), f)
    return f


def predict_moe_ep(frame: pd.DataFrame, hw, engine) -> np.ndarray:
    """Seconds per row: the engine's fused-MoE formula at the slowest rank's pairs; an expert-map
    kernel (``engine.moe_ep_masked``) also walks every routed pair and pays the remote pairs' traffic
    (`costmodel.ep.masked_pairs_time_nb`'s bytes at the engine's GEMM bandwidth)."""
    fit = engine.fit_for(hw)
    gemm = {k: (getattr(fit, k.replace("_us", "_s")) * 1e6 if k.endswith("_us") else getattr(fit, k))
            for k in ek.GEMM_PARAMS + ("gemm_fp8_max", "gemm_fp8_latency_us")}
    p = {k: (getattr(fit, k.replace("_us", "_s")) * 1e6 if k.endswith("_us") else getattr(fit, k))
         for k in ek.MOE_PARAMS + ek.MOE_FP8_PARAMS + ek.MOE_SHARED_PARAMS + ek.MOE_TILE_PARAMS}
    f = frame.copy()
    walked = f["tokens"] * f["topk"]
    f["pairs"] = walked if engine.moe_ep_masked else f["assignments"]
    pred = ek.predict_moe(f, hw, gemm, p)
    if engine.moe_ep_masked:
        a = np.where(f["dtype"] == "fp8", 1.0, 2.0)
        remote = (walked - f["assignments"]).to_numpy(np.float64)
        nbytes = remote * a * (2.0 * 2.0 * f["inter"] + f["inter"] + 2.0 * f["hidden"]).to_numpy(np.float64)
        pred = pred + nbytes / (hw.hbm_bw * fit.gemm_hbm_fraction)
    return pred


__all__ = ["A2A_TABLE", "EP_TABLE", "alltoall_frame", "alltoall_holdout", "fit_alltoall", "moe_ep_frame",
           "predict_alltoall", "predict_moe_ep", "refresh_ep_data"]


def held_out_ep_rows() -> pd.DataFrame:
    """Every shipped EP > 1 ``moe_perf`` row of every (GPU, engine) with a fit, with its prediction
    (``pred_s``), relative error (``err``) and GPU: all held out, the engines' fused-MoE parameters
    being fitted on EP = 1 rows only."""
    import warnings

    from ..config import load_hardware
    from ..config.engine import load_engine
    rows = []
    for gpu, engines in ek.ENGINES.items():
        hw = load_hardware(ek.GPUS[gpu])
        for engine in engines:
            f = moe_ep_frame(gpu, engine)
            if f is None:
                continue
            eng = load_engine(engine)
            try:
                eng.fit_for(hw)
            except ConfigError:      # no fit of this engine on this GPU
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                f["pred_s"] = predict_moe_ep(f, hw, eng)
            f["err"] = f["pred_s"] / f["time_s"] - 1.0
            f["gpu"] = hw.name
            rows.append(f)
    return pd.concat(rows, ignore_index=True)
