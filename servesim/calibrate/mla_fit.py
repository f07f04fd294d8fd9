"""MLA (DeepSeek-V2/V3 multi-head latent attention) kernels against AIConfigurator's MLA tables.

Data: ``generation_mla_perf`` (one absorbed decode step of ``batch_size`` sequences with ``step``
cached tokens each, ``num_heads`` query heads on the GPU, one latent KV head) and
``context_mla_perf`` (prefill of ``batch_size`` sequences of ``isl`` tokens, no cached prefix), in
DeepSeek-V3's MLA geometry (kv_lora_rank 512, qk_rope 64, qk_nope 128, v 128: AIConfigurator
``sdk/models/deepseek.py`` sizes its MLA operators so), measured by NVIDIA's AIConfigurator inside
vLLM 0.14.0 (H100, H200, A100), SGLang 0.5.9 (H100) and TensorRT-LLM (1.2.0rc5 H100, 1.0.0 A100).
AIConfigurator's model composes them as the attention of an MLA layer: for TensorRT-LLM and SGLang
``GenerationMLA`` ("MQA part") between the absorption BMMs, ``ContextMLA`` after the q_b / kv_b
projections (aiconfigurator-core 0.12.0, ``sdk/models/deepseek.py``). Shipped as a subset beside
the other AIConfigurator copies (``<table>.csv.gz``; `refresh_mla_data` cuts it).

Formulas: ``costmodel.kernels.mla_decode_time_nb`` and ``mla_prefill_time_nb``, imported and
called. Parameters per (GPU, engine), fitted as ``engine_kernels.fit_params`` does (soft-L1 on
log(pred / measured), physical bounds):

- decode, 16-bit latent cache: ``mla_decode_max``, ``mla_decode_hbm_fraction``,
  ``mla_decode_block_us``, ``mla_decode_latency_us``; fp8 latent cache: ``mla_decode_fp8_max`` and
  ``mla_decode_fp8_hbm_fraction`` with the 16-bit block and latency (the fp8 rows of a kernel that
  dequantises the cache run at other rates);
- prefill (16-bit latent cache rows): ``mla_prefill_max``, ``mla_prefill_hbm_fraction``,
  ``mla_prefill_block_overhead``, ``mla_prefill_latency_us``.

vLLM's MLA tables are not graph replays of the kernel alone: every row sits on a floor of
100-200 us whatever the batch and context (its ``generation_attention_perf`` floor is ~10 us), an
eager call's host time. Their rows are priced max(floor, pre + kernel), the floor fitted per table
(``eager_floor_us``, reported, never shipped: vLLM serves MLA under CUDA graphs) and the fitted
latency standing for the host's work before the kernel starts plus the kernel's own; the cost model
takes these tables' fractions, and the fixed times of a graph-replayed MLA table of another engine
(`FIXED_FROM`, `serving_keys`). Held out: each head count in turn (``heads``, the TP degree's shard of the 128 heads)
and long contexts from short ones (fit on context <= 2,048, predict >= 8,192).
"""
from __future__ import annotations

import gzip
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from numba import njit

from ..costmodel import kernels as kn
from ..errors import ConfigError
from . import engine_kernels as ek
from servesim.jit import JIT

DECODE_TABLE = "generation_mla_perf"
PREFILL_TABLE = "context_mla_perf"
# (GPU, engine) whose AIConfigurator folders hold both MLA tables (B200 has only whole-module MLA tables;
# SGLang on A100 only the absorption BMMs).
MLA_SOURCES = {"h100_sxm": ("vllm", "sglang", "trtllm"), "h200_sxm": ("vllm",), "a100_sxm": ("vllm", "trtllm")}
EAGER = ("vllm",)          # engines whose MLA tables are eager calls (see the module docstring)
# the graph-replayed MLA table whose fixed times an eager table's kernel takes, per GPU
FIXED_FROM = {"h100_sxm": ("h100_sxm", "sglang"), "h200_sxm": ("h100_sxm", "sglang"), "a100_sxm": ("a100_sxm", "trtllm")}
DECODE_PARAMS = ("mla_decode_max", "mla_decode_hbm_fraction", "mla_decode_block_us", "mla_decode_latency_us")
DECODE_FP8_PARAMS = ("mla_decode_fp8_max", "mla_decode_fp8_hbm_fraction")
PREFILL_PARAMS = ("mla_prefill_max", "mla_prefill_hbm_fraction", "mla_prefill_block_overhead", "mla_prefill_latency_us")
FIXED = ("mla_decode_block_us", "mla_decode_latency_us", "mla_prefill_latency_us")
FLOOR = "eager_floor_us"
SHORT_CTX = 2048           # context extrapolation: fit on <= this ...
LONG_CTX = 8192            # ... predict >= this
_KEEP = ("kernel_source", "kv_cache_dtype", "num_heads", "batch_size", "isl", "step", "tp_size", "latency")


def geometry() -> dict:
    """DeepSeek-V3's MLA widths (the tables' geometry), from the shipped model file."""
    from ..config.model import load_model
    m = load_model("deepseek-v3").mla
    return {"latent": float(m.kv_lora_rank), "rope": float(m.qk_rope_head_dim),
            "qk": float(m.qk_nope_head_dim + m.qk_rope_head_dim), "v": float(m.v_head_dim)}


def _write_gz(df: pd.DataFrame, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, compresslevel=9, mtime=0) as gz:
        gz.write(df.to_csv(index=False).encode())


def refresh_mla_data(src: Path, dst: Path | None = None) -> list:
    """Cut the MLA subset from an AIConfigurator data tree ``src``: every row of the two MLA tables of
    each (GPU, engine) in MLA_SOURCES, columns ``_KEEP`` that the table has (constant columns restored
    from the tree's INDEX.csv), values unchanged, rows sorted; gzip with mtime 0."""
    dst = Path(dst or ek.aiconfigurator_dir())
    written = []
    for gpu, engines in MLA_SOURCES.items():
        for engine in engines:
            folder = ek.engine_folders(gpu)[engine]
            for table in (DECODE_TABLE, PREFILL_TABLE):
                t = ek.read_folder_table(Path(src) / gpu / folder, table)
                cols = [c for c in _KEEP if c in t.columns]
                s = t[cols].sort_values(cols[:-1]).reset_index(drop=True)
                _write_gz(s, dst / gpu / folder / f"{table}.csv.gz")
                written.append((gpu, folder, table, len(t), len(s)))
    return written


def _read(gpu: str, engine: str, table: str) -> pd.DataFrame:
    if engine not in MLA_SOURCES.get(gpu, ()):
        raise ConfigError(f"no MLA tables shipped for {gpu}/{engine}; shipped: "
                          + ", ".join(f"{g}/{e}" for g, es in MLA_SOURCES.items() for e in es))
    return ek.read_table(gpu, ek.engine_folders(gpu)[engine], table)


def _common(t: pd.DataFrame, gpu: str, engine: str) -> pd.DataFrame:
    source = t["kernel_source"].astype(str) if "kernel_source" in t.columns else pd.Series(["default"] * len(t))
    return pd.DataFrame({
        "gpu": gpu, "engine": engine, "kernel": source.to_numpy(),
        "seqs": t["batch_size"].to_numpy(np.float64), "heads": t["num_heads"].to_numpy(np.float64),
        "kv_dtype": t["kv_cache_dtype"].map({"bfloat16": "bf16", "fp8": "fp8"}).to_numpy(),
        "kv_bytes": np.where(t["kv_cache_dtype"].to_numpy() == "fp8", 1.0, 2.0),
        "time_s": t["latency"].to_numpy(np.float64) * 1e-3})


def decode_frame(gpu: str, engine: str) -> pd.DataFrame:
    """Decode rows: ``seqs`` sequences with ``ctx`` = step + 1 tokens of latent cache each (the step's
    own included), ``kv_tokens`` = seqs ctx."""
    t = _read(gpu, engine, DECODE_TABLE)
    f = _common(t, gpu, engine)
    f["ctx"] = t["step"].to_numpy(np.float64) + 1.0
    f["kv_tokens"] = f["seqs"] * f["ctx"]
    return f


def prefill_frame(gpu: str, engine: str) -> pd.DataFrame:
    """Prefill rows: ``seqs`` prompts of ``ctx`` = isl tokens, no cached prefix."""
    t = _read(gpu, engine, PREFILL_TABLE)
    f = _common(t, gpu, engine)
    f["ctx"] = t["isl"].to_numpy(np.float64)
    return f


@njit(**JIT)
def _decode_many_nb(seqs, kv_tokens, heads, kv_bytes, latent, rope, peak, hbm_bw, sms, cmax, hfrac, block, lat, floor):
    out = np.empty(seqs.shape[0])
    for i in range(seqs.shape[0]):
        out[i] = max(floor, kn.mla_decode_time_nb(seqs[i], 1.0, kv_tokens[i], heads[i], latent, rope, kv_bytes[i], peak,
                                                  hbm_bw, sms, cmax[i], hfrac[i], block, lat))
    return out


@njit(**JIT)
def _prefill_many_nb(seqs, chunk, heads, kv_bytes, qk, v, latent_width, peak, hbm_bw, sms, amax, hfrac, overhead, lat,
                     floor):
    out = np.empty(seqs.shape[0])
    for i in range(seqs.shape[0]):
        out[i] = max(floor, kn.mla_prefill_time_nb(seqs[i], chunk[i], 0.0, heads[i], qk, v, latent_width * kv_bytes[i],
                                                   peak, hbm_bw, sms, amax, hfrac, overhead, lat))
    return out


def _f(frame: pd.DataFrame, name: str) -> np.ndarray:
    return frame[name].to_numpy(np.float64)


def predict_decode(frame: pd.DataFrame, hw, p: dict) -> np.ndarray:
    """Seconds per decode row (``p`` in file units; fp8-cache rows at the fp8 fractions when ``p`` has
    them; ``eager_floor_us`` when given)."""
    g = geometry()
    fp8 = (frame["kv_dtype"] == "fp8").to_numpy()
    cmax = np.where(fp8, p.get("mla_decode_fp8_max", p["mla_decode_max"]), p["mla_decode_max"])
    hfrac = np.where(fp8, p.get("mla_decode_fp8_hbm_fraction", p["mla_decode_hbm_fraction"]),
                     p["mla_decode_hbm_fraction"])
    return _decode_many_nb(_f(frame, "seqs"), _f(frame, "kv_tokens"), _f(frame, "heads"), _f(frame, "kv_bytes"),
                           g["latent"], g["rope"], hw.peak_flops["bf16"], hw.hbm_bw, float(hw.sm_count), cmax, hfrac,
                           p["mla_decode_block_us"] * 1e-6, p["mla_decode_latency_us"] * 1e-6,
                           p.get(FLOOR, 0.0) * 1e-6)


def predict_prefill(frame: pd.DataFrame, hw, p: dict) -> np.ndarray:
    """Seconds per prefill row."""
    g = geometry()
    return _prefill_many_nb(_f(frame, "seqs"), _f(frame, "ctx"), _f(frame, "heads"), _f(frame, "kv_bytes"), g["qk"],
                            g["v"], g["latent"] + g["rope"], hw.peak_flops["bf16"], hw.hbm_bw, float(hw.sm_count),
                            p["mla_prefill_max"], p["mla_prefill_hbm_fraction"], p["mla_prefill_block_overhead"],
                            p["mla_prefill_latency_us"] * 1e-6, p.get(FLOOR, 0.0) * 1e-6)


def fit_decode(frame: pd.DataFrame, hw, eager: bool = False) -> dict:
    """The decode keys on the 16-bit-cache rows (an eager table adds its floor), then the fp8-cache
    fractions on the fp8 rows with the rest held (an eager table's fp8 floor fitted apart)."""
    names = list(DECODE_PARAMS) + ([FLOOR] if eager else [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = ek.fit_params(names, lambda f, q: predict_decode(f, hw, q), frame[frame["kv_dtype"] == "bf16"],
                          f"mla_fit.fit_decode({hw.name})")
        fp8 = frame[frame["kv_dtype"] == "fp8"]
        if len(fp8):
            hold = {k: v for k, v in p.items() if k != FLOOR}
            q = ek.fit_params(list(DECODE_FP8_PARAMS) + ([FLOOR] if eager else []),
                              lambda f, q: predict_decode(f, hw, q), fp8, f"mla_fit.fit_decode_fp8({hw.name})", fixed=hold)
            p.update({k: q[k] for k in DECODE_FP8_PARAMS})
            if eager:
                p[FLOOR + "_fp8"] = q[FLOOR]
    return p


def fit_prefill(frame: pd.DataFrame, hw, eager: bool = False) -> dict:
    """The prefill keys on the 16-bit-cache rows (an eager table adds its floor)."""
    names = list(PREFILL_PARAMS) + ([FLOOR] if eager else [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ek.fit_params(names, lambda f, q: predict_prefill(f, hw, q), frame[frame["kv_dtype"] == "bf16"],
                             f"mla_fit.fit_prefill({hw.name})")


def serving_keys(fits: dict, gpu: str, engine: str) -> dict:
    """The MLA keys a (GPU, engine) fit gives the cost model (file units). An eager table's fixed times
    are its host's work before the kernel, not the kernel's, which a CUDA graph replay does not pay:
    its ``FIXED`` keys come from the graph-replayed table ``FIXED_FROM`` names."""
    p = {k: v for k, v in fits[(gpu, engine)].items() if not k.startswith(FLOOR)}
    if engine in EAGER:
        src = fits[FIXED_FROM[gpu]]
        p.update({k: src[k] for k in FIXED})
    return p


def predict_rows(frame: pd.DataFrame, hw, p: dict, kind: str) -> np.ndarray:
    """Either kind's prediction; an fp8 row of an eager table on its own floor."""
    if kind == "decode":
        pred = predict_decode(frame, hw, {k: v for k, v in p.items() if k != FLOOR + "_fp8"})
        if FLOOR + "_fp8" in p:
            fp8 = (frame["kv_dtype"] == "fp8").to_numpy()
            raw = predict_decode(frame, hw, {**p, FLOOR: 0.0})
            pred = np.where(fp8, np.maximum(raw, p[FLOOR + "_fp8"] * 1e-6), pred)
        return pred
    return predict_prefill(frame, hw, p)


def fit_kind(frame: pd.DataFrame, hw, kind: str, eager: bool) -> dict:
    return (fit_decode if kind == "decode" else fit_prefill)(frame, hw, eager)


def heads_holdout(frame: pd.DataFrame, hw, kind: str, eager: bool) -> np.ndarray:
    """Each head count predicted by the fit on the others (prefill: its 16-bit rows are the fitted ones;
    fp8 rows are predicted with the 16-bit keys in every case)."""
    pred = np.full(len(frame), np.nan)
    for h in sorted(frame["heads"].unique()):
        test = (frame["heads"] == h).to_numpy()
        p = fit_kind(frame[~test], hw, kind, eager)
        pred[test] = predict_rows(frame[test], hw, p, kind)
    return pred


def context_holdout(frame: pd.DataFrame, hw, kind: str, eager: bool) -> pd.DataFrame:
    """Rows of context >= LONG_CTX predicted by the fit on context <= SHORT_CTX (column ``pred_s``)."""
    p = fit_kind(frame[frame["ctx"] <= SHORT_CTX], hw, kind, eager)
    test = frame[frame["ctx"] >= LONG_CTX].copy()
    test["pred_s"] = predict_rows(test, hw, p, kind)
    return test


__all__ = ["DECODE_FP8_PARAMS", "DECODE_PARAMS", "DECODE_TABLE", "EAGER", "FIXED_FROM", "FLOOR", "MLA_SOURCES",
           "PREFILL_PARAMS", "PREFILL_TABLE", "context_holdout", "decode_frame", "fit_decode", "fit_kind",
           "fit_prefill", "geometry", "heads_holdout", "predict_decode", "predict_prefill", "predict_rows",
           "prefill_frame", "refresh_mla_data", "serving_keys"]
