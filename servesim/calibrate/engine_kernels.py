"""Engine kernel calibration: AIConfigurator tables -> tidy frames -> kernel formulas -> fitted parameters.

Data: per-kernel latencies measured by NVIDIA's AIConfigurator inside vLLM 0.14.0, SGLang 0.5.9,
TensorRT-LLM (1.2.0rc5 on H100, 1.0.0 on A100) and NCCL 2.27.3, on H100 SXM and A100 SXM, each
kernel replayed in a CUDA graph (so without host launch cost), shipped as a subset under
``servesim/calibrate/data/aiconfigurator/`` (Apache-2.0; its README says what was kept). The frame
readers read that copy by GPU and engine name, or any ``<engine>-<version>`` folder in
AIConfigurator's layout (``folder=``: plain ``<table>.csv`` as AIConfigurator writes them, or
``<table>.csv.gz``), keeping the rows the formulas describe (``ROW_FILTERS``).

The formulas are ``servesim.costmodel.kernels``'s, imported and called, never re-derived here:

- GEMM (``gemm_time_nb``): ``gemm_max``, ``gemm_hbm_fraction``, ``gemm_latency_us``,
  ``gemm_splitk_latency_us``, ``gemm_tile_overhead_k`` per GPU (bf16, pooled over the engines, which
  all call cuBLAS for a bf16 linear layer); fp8 per-tensor rows add ``gemm_fp8_max`` (fraction of
  the fp8 peak), ``gemm_fp8_latency_us`` (the fixed time of the call: quantisation and GEMM kernels)
  and ``gemm_fp8_quant_bytes`` (the activation quantisation's HBM bytes per element of X[m, k] at
  the weight-streaming rate: its cost in m k, apart from the GEMM's in m n k) per engine.
- prefill attention (``prefill_attention_time_nb``): ``attn_prefill_max``,
  ``attn_prefill_hbm_fraction``, ``attn_prefill_block_overhead``, ``attn_prefill_latency_us``.
- decode attention (``decode_attention_time_nb``): ``attn_decode_hbm_fraction``,
  ``attn_decode_block_us``, ``attn_decode_latency_us``, ``attn_decode_split_us`` (the split-KV combine
  kernel when the KV is split and fewer than 0.8 x SMs (sequence, KV head) blocks run),
  ``attn_decode_split_seqs`` (sequences x splits the split heuristic aims at per KV head) and
  ``attn_decode_block_GBps`` (one thread block's KV read rate).
- the engine's all-reduce (``engine_allreduce_time_nb`` / ``engine_allreduce_eager_time_nb``):
  ``allreduce_latency_us``, ``allreduce_bw_fraction``, ``allreduce_step_latency_us``,
  ``allreduce_eager_launch_us``.
- fused MoE (``moe_experts_time_nb``): ``moe_efficiency``, ``moe_latency_us`` (bf16) and
  ``moe_fp8_efficiency``, ``moe_fp8_latency_us`` (fp8 per-tensor), and ``moe_pair_us`` (per routed
  token-expert pair, both dtypes), with the GPU's GEMM parameters.
- NCCL all-reduce: ``servesim.costmodel.collectives.allreduce_time_nb`` with the hardware
  profile's link parameters (``scaleup_bw_fraction``, ``scaleup_latency_us``,
  ``collective_base_latency_us``), as the simulator prices it today.
- eager GEMMs (Vidur's PyTorch timings): ``gemm_time_nb`` + ``launch_us`` per kernel.

Fits minimise a soft-L1 loss (scipy ``least_squares``, f_scale 0.1) of log(pred / measured) inside
physical bounds (fractions in (0, 1], latencies >= 0), as ``operators.fit_gemm`` does, so kernel
selection outliers do not pull the bulk. Held-out errors come from refits with whole groups left
out (``group_folds``): GEMM shapes (n, k), attention head configurations (heads, kv_heads),
all-reduce GPU counts, MoE model shapes.
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from numba import njit
from scipy.optimize import least_squares

from servesim.calibrate import data_dir
from servesim.costmodel import kernels as kn
from servesim.costmodel.collectives import AUTO, allreduce_time_nb
from servesim.errors import ConfigError
from servesim.jit import JIT

# AIConfigurator folder name of each GPU -> servesim hardware profile.
GPUS = {"h100_sxm": "h100-sxm", "a100_sxm": "a100-sxm-80gb", "h200_sxm": "h200-sxm", "b200_sxm": "b200"}
# Engine -> its folder (engine-version) per GPU.
ENGINES = {
    "h100_sxm": {"vllm": "vllm-0.14.0", "sglang": "sglang-0.5.9", "trtllm": "trtllm-1.2.0rc5"},
    "a100_sxm": {"vllm": "vllm-0.14.0", "sglang": "sglang-0.5.9", "trtllm": "trtllm-1.0.0"},
    "h200_sxm": {"vllm": "vllm-0.14.0"},
    "b200_sxm": {"vllm": "vllm-0.19.0"},
}
# NCCL folder per GPU
NCCL = {"h100_sxm": "nccl-2.27.3", "a100_sxm": "nccl-2.27.3", "h200_sxm": "nccl-2.26.2", "b200_sxm": "nccl-2.27.3"}
TABLES = ("gemm_perf", "context_attention_perf", "generation_attention_perf", "custom_allreduce_perf",
          "nccl_perf", "moe_perf")
HEAD_DIM = 128.0  # every shipped attention row (the subset keeps head_dim 128)

GEMM_PARAMS = ("gemm_max", "gemm_hbm_fraction", "gemm_latency_us", "gemm_splitk_latency_us", "gemm_tile_overhead_k",
               "gemm_mem_latency_us")
GEMM_FP8_PARAMS = ("gemm_fp8_max", "gemm_fp8_latency_us", "gemm_fp8_quant_bytes")
PREFILL_PARAMS = ("attn_prefill_max", "attn_prefill_hbm_fraction", "attn_prefill_block_overhead",
                  "attn_prefill_latency_us")
DECODE_PARAMS = ("attn_decode_hbm_fraction", "attn_decode_block_us", "attn_decode_latency_us", "attn_decode_split_us",
                 "attn_decode_split_seqs", "attn_decode_block_GBps")
ALLREDUCE_PARAMS = ("allreduce_latency_us", "allreduce_bw_fraction", "allreduce_step_latency_us",
                    "allreduce_eager_launch_us")
MOE_PARAMS = ("moe_efficiency", "moe_latency_us")
MOE_FP8_PARAMS = ("moe_fp8_efficiency", "moe_fp8_latency_us")
MOE_SHARED_PARAMS = ("moe_pair_us",)
MOE_TILE_PARAMS = ("moe_tile_ridge", "moe_stream_bytes")   # engines whose fused-MoE tiles are known (moe_configs)
NCCL_PARAMS = ("scaleup_bw_fraction", "scaleup_latency_us", "collective_base_latency_us")
LAUNCH_PARAMS = ("launch_us",)
# Physical bounds (file units): fractions of a datasheet figure, microseconds, K steps, key blocks.
BOUNDS = {
    "gemm_max": (0.05, 1.0), "gemm_hbm_fraction": (0.05, 1.0), "gemm_latency_us": (0.0, 50.0),
    "gemm_mem_latency_us": (0.0, 30.0),
    "gemm_splitk_latency_us": (0.0, 50.0), "gemm_tile_overhead_k": (0.0, 4096.0),
    "gemm_fp8_max": (0.05, 1.0), "gemm_fp8_latency_us": (0.0, 100.0), "gemm_fp8_quant_bytes": (0.0, 128.0),
    "attn_prefill_max": (0.05, 1.0), "attn_prefill_hbm_fraction": (0.01, 1.0),
    "attn_prefill_block_overhead": (0.0, 50.0), "attn_prefill_latency_us": (0.0, 200.0),
    "attn_decode_hbm_fraction": (0.05, 1.0), "attn_decode_block_us": (0.0, 100.0),
    "attn_decode_latency_us": (0.0, 200.0), "attn_decode_split_us": (0.0, 100.0),
    "attn_decode_split_seqs": (1.0, 1024.0), "attn_decode_block_GBps": (1.0, 1000.0),
    "allreduce_latency_us": (0.0, 100.0), "allreduce_bw_fraction": (0.05, 1.0),
    "allreduce_step_latency_us": (0.0, 100.0), "allreduce_eager_launch_us": (0.0, 500.0),
    "moe_efficiency": (0.01, 1.0), "moe_latency_us": (0.0, 500.0),
    "moe_fp8_efficiency": (0.01, 1.0), "moe_fp8_latency_us": (0.0, 500.0), "moe_pair_us": (0.0, 1.0),
    "moe_tile_ridge": (1.0, 1000.0), "moe_stream_bytes": (16.0, 512.0),
    "scaleup_bw_fraction": (0.05, 1.0), "scaleup_latency_us": (0.0, 50.0),
    "collective_base_latency_us": (0.0, 100.0),
    "launch_us": (0.0, 100.0),
    "mla_decode_max": (0.01, 1.0), "mla_decode_hbm_fraction": (0.02, 1.0), "mla_decode_block_us": (0.0, 100.0),
    "mla_decode_latency_us": (0.0, 200.0), "mla_decode_fp8_max": (0.01, 1.0), "mla_decode_fp8_hbm_fraction": (0.02, 1.0),
    "mla_prefill_max": (0.05, 1.0), "mla_prefill_hbm_fraction": (0.01, 1.0), "mla_prefill_block_overhead": (0.0, 50.0),
    "mla_prefill_latency_us": (0.0, 200.0), "eager_floor_us": (0.0, 2000.0),
}
START = {
    "gemm_max": 0.85, "gemm_hbm_fraction": 0.8, "gemm_latency_us": 2.5, "gemm_splitk_latency_us": 2.5,
    "gemm_mem_latency_us": 1.0,
    "gemm_tile_overhead_k": 150.0, "gemm_fp8_max": 0.6, "gemm_fp8_latency_us": 5.0, "gemm_fp8_quant_bytes": 5.0,
    "attn_prefill_max": 0.6, "attn_prefill_hbm_fraction": 0.5, "attn_prefill_block_overhead": 0.5,
    "attn_prefill_latency_us": 10.0, "attn_decode_hbm_fraction": 0.8, "attn_decode_block_us": 3.0,
    "attn_decode_latency_us": 10.0, "attn_decode_split_us": 2.0, "attn_decode_split_seqs": 16.0, "attn_decode_block_GBps": 50.0,
    "allreduce_latency_us": 4.0, "allreduce_bw_fraction": 0.7,
    "allreduce_step_latency_us": 5.0, "allreduce_eager_launch_us": 20.0, "moe_efficiency": 0.8,
    "moe_latency_us": 20.0, "moe_fp8_efficiency": 0.2, "moe_fp8_latency_us": 20.0, "moe_pair_us": 0.01,
    "moe_tile_ridge": 100.0, "moe_stream_bytes": 100.0,
    "scaleup_bw_fraction": 0.7, "scaleup_latency_us": 1.0, "collective_base_latency_us": 10.0,
    "launch_us": 5.0,
    "mla_decode_max": 0.5, "mla_decode_hbm_fraction": 0.8, "mla_decode_block_us": 3.0, "mla_decode_latency_us": 10.0,
    "mla_decode_fp8_max": 0.5, "mla_decode_fp8_hbm_fraction": 0.8, "mla_prefill_max": 0.6,
    "mla_prefill_hbm_fraction": 0.5, "mla_prefill_block_overhead": 0.5, "mla_prefill_latency_us": 10.0,
    "eager_floor_us": 150.0,
}
LOSS = {"loss": "soft_l1", "f_scale": 0.1}
# Serving range kept in the fits and error tables (rows outside are reported on their own lines):
GEMM_MIN_NK = 128        # n or k below 128: pathological split-K / GEMV paths, no LLM layer has them
MAX_GQA_GROUP = 16       # heads / kv_heads; larger groups (old MQA models) hit other kernels
MOE_MAX_TOKENS = 8192    # the engines' default token budget per step
GEMM_MAX_M = 8192        # GEMM tokens beyond one serving step (the shipped subset stops here)
# Rows a formula describes, applied where a table has the column (a full AIConfigurator table; the
# shipped subset holds only these rows already): column -> accepted values. ``kernel_source`` of
# moe_perf: the gated-expert kernels (not TensorRT-LLM's non-gated one).
ROW_FILTERS = {
    "gemm_perf": {"gemm_dtype": ("bfloat16", "fp8")},
    "context_attention_perf": {"head_dim": (128,), "attn_dtype": ("bfloat16",), "window_size": (0,),
                               "beam_width": (1,), "kv_cache_dtype": ("bfloat16", "fp8")},
    "generation_attention_perf": {"head_dim": (128,), "attn_dtype": ("bfloat16",), "window_size": (0,),
                                  "beam_width": (1,), "kv_cache_dtype": ("bfloat16", "fp8")},
    "moe_perf": {"distribution": ("balanced",), "moe_dtype": ("bfloat16", "fp8"),
                 "kernel_source": ("vllm_fused_moe", "moe_torch_flow_cutlass", "sglang_fused_moe_triton")},
}
# Columns each table must have (after restoring constant columns, see read_folder_table).
TABLE_COLUMNS = {
    "gemm_perf": ("gemm_dtype", "m", "n", "k", "latency"),
    "context_attention_perf": ("batch_size", "isl", "num_heads", "num_key_value_heads", "kv_cache_dtype", "latency"),
    "generation_attention_perf": ("batch_size", "step", "num_heads", "num_key_value_heads", "kv_cache_dtype",
                                  "latency"),
    "custom_allreduce_perf": ("num_gpus", "message_size", "latency"),
    "nccl_perf": ("num_gpus", "message_size", "latency"),
    "moe_perf": ("moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
                 "moe_ep_size", "latency"),
}


def aiconfigurator_dir() -> Path:
    """The shipped AIConfigurator subset: ``<gpu>/<engine-version>/<table>.csv.gz``."""
    return data_dir() / "aiconfigurator"


def table_file(folder, table: str) -> Path | None:
    """``<table>.csv`` (as AIConfigurator writes it) or ``<table>.csv.gz`` (as servesim ships it) in
    ``folder``; None when neither is there."""
    for suffix in (".csv", ".csv.gz"):
        path = Path(folder) / f"{table}{suffix}"
        if path.is_file():
            return path
    return None


def _constant_columns(folder: Path, table: str) -> dict:
    """Columns a source tree keeps out of its tables because they hold one value (``INDEX.csv`` two
    levels up, column ``constant_columns``: ``k=v;k=v``), as the AIConfigurator copies in shared/
    are cut; {} without such an index."""
    index = folder.parent.parent / "INDEX.csv"
    if not index.is_file():
        return {}
    ix = pd.read_csv(index, dtype=str)
    need = {"gpu", "framework", "table", "constant_columns"}
    if not need <= set(ix.columns):
        return {}
    row = ix[(ix["gpu"] == folder.parent.name) & (ix["framework"] == folder.name) & (ix["table"] == f"{table}.csv")]
    if row.empty or pd.isna(row["constant_columns"].iloc[0]):
        return {}
    out = {}
    for kv in row["constant_columns"].iloc[0].split(";"):
        key, _, value = kv.partition("=")
        out[key] = value
    return out


def read_folder_table(folder, table: str) -> pd.DataFrame:
    """One table (``table`` without suffix, e.g. ``gemm_perf``) of an AIConfigurator
    ``<engine>-<version>`` folder: ``.csv`` or ``.csv.gz``, constant columns restored from the tree's
    ``INDEX.csv`` where it has one; a missing table or column is a ConfigError naming it."""
    folder = Path(folder)
    path = table_file(folder, table)
    if path is None:
        raise ConfigError(f"{folder}: no {table}.csv or {table}.csv.gz")
    try:
        t = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as exc:
        raise ConfigError(f"{path}: not a readable CSV ({exc})") from None
    for key, value in _constant_columns(folder, table).items():
        if key not in t.columns:
            t[key] = value
    missing = [c for c in TABLE_COLUMNS.get(table, ()) if c not in t.columns]
    if missing:
        raise ConfigError(f"{path}: missing column(s) {', '.join(missing)}; AIConfigurator's {table} has "
                          f"{', '.join(TABLE_COLUMNS[table])}")
    return t


def _formula_rows(t: pd.DataFrame, table: str) -> pd.DataFrame:
    """The rows of ``t`` that ``ROW_FILTERS[table]`` accepts (columns the table lacks are not checked)."""
    keep = np.ones(len(t), dtype=bool)
    for col, accepted in ROW_FILTERS.get(table, {}).items():
        if col not in t.columns:
            continue
        if isinstance(accepted[0], str):
            keep &= t[col].astype(str).isin(accepted).to_numpy()
        else:
            keep &= pd.to_numeric(t[col], errors="coerce").isin(accepted).to_numpy()
    return t[keep].reset_index(drop=True)


def read_table(gpu: str, folder: str, table: str) -> pd.DataFrame:
    """One shipped table (``table`` without suffix, e.g. ``gemm_perf``) of ``gpu``/``folder``."""
    path = aiconfigurator_dir() / gpu / folder / f"{table}.csv.gz"
    if not path.is_file():
        raise ConfigError(f"{path}: not shipped; see servesim/calibrate/data/aiconfigurator/README.md")
    return pd.read_csv(path)


def _table(gpu: str, engine: str, table: str, folder) -> pd.DataFrame:
    """``table``'s formula rows: of ``folder`` when given, else of the shipped copy of ``gpu``/``engine``."""
    t = read_folder_table(folder, table) if folder is not None else read_table(gpu, engine_folders(gpu)[engine], table)
    return _formula_rows(t, table)


def engine_folders(gpu: str) -> dict:
    if gpu not in ENGINES:
        raise ConfigError(f"unknown AIConfigurator GPU {gpu!r}; known: {', '.join(ENGINES)}")
    return ENGINES[gpu]


# -- tidy frames --------------------------------------------------------------------------------

def gemm_frame(gpu: str, engines=None, folder=None) -> pd.DataFrame:
    """GEMM rows of ``gpu`` (all engines by default): ``engine, dtype (bf16|fp8), m, n, k, time_s,
    shape ("n x k", the held-out group), in_range`` (n, k >= GEMM_MIN_NK, m <= GEMM_MAX_M).
    ``folder``: read that ``<engine>-<version>`` folder instead, its rows labelled ``engines[0]``."""
    parts = []
    sources = ({engines[0] if engines else Path(folder).name.split("-")[0]: None} if folder is not None
               else engine_folders(gpu))
    for engine in sources:
        if folder is None and engines is not None and engine not in engines:
            continue
        t = _table(gpu, engine, "gemm_perf", folder)
        parts.append(pd.DataFrame({
            "engine": engine, "dtype": t["gemm_dtype"].map({"bfloat16": "bf16", "fp8": "fp8"}).to_numpy(),
            "m": t["m"].to_numpy(np.float64), "n": t["n"].to_numpy(np.float64), "k": t["k"].to_numpy(np.float64),
            "time_s": t["latency"].to_numpy(np.float64) * 1e-3}))
    f = pd.concat(parts, ignore_index=True)
    f["shape"] = f["n"].astype(int).astype(str) + "x" + f["k"].astype(int).astype(str)
    f["in_range"] = (f["n"] >= GEMM_MIN_NK) & (f["k"] >= GEMM_MIN_NK) & (f["m"] <= GEMM_MAX_M)
    return f


def _attention_common(t: pd.DataFrame, engine: str) -> pd.DataFrame:
    heads = t["num_heads"].to_numpy(np.float64)
    kv = t["num_key_value_heads"].to_numpy(np.float64)
    return pd.DataFrame({
        "engine": engine, "seqs": t["batch_size"].to_numpy(np.float64), "heads": heads, "kv_heads": kv,
        "kv_dtype": t["kv_cache_dtype"].map({"bfloat16": "bf16", "fp8": "fp8"}).to_numpy(),
        "kv_bytes": np.where(t["kv_cache_dtype"].to_numpy() == "fp8", 1.0, 2.0),
        "time_s": t["latency"].to_numpy(np.float64) * 1e-3,
        "heads_group": [f"{int(a)}/{int(b)}" for a, b in zip(heads, kv)],
        "in_range": heads / kv <= MAX_GQA_GROUP,
    })


def prefill_frame(gpu: str, engine: str, folder=None) -> pd.DataFrame:
    """Context-attention rows: ``seqs`` sequences of ``chunk`` tokens, no cached prefix (``ctx`` 0)."""
    t = _table(gpu, engine, "context_attention_perf", folder)
    f = _attention_common(t, engine)
    f.insert(2, "chunk", t["isl"].to_numpy(np.float64))
    f.insert(3, "ctx", 0.0)
    return f


def decode_frame(gpu: str, engine: str, folder=None) -> pd.DataFrame:
    """Generation-attention rows: ``seqs`` sequences with ``step`` cached tokens each plus the new one;
    ``kv_tokens`` = seqs (step + 1), the KV the step reads."""
    t = _table(gpu, engine, "generation_attention_perf", folder)
    f = _attention_common(t, engine)
    f.insert(2, "step", t["step"].to_numpy(np.float64))
    f.insert(3, "kv_tokens", f["seqs"] * (t["step"].to_numpy(np.float64) + 1.0))
    return f


def allreduce_frame(gpu: str, engine: str, folder=None) -> pd.DataFrame:
    """The engine's all-reduce rows: ``n`` GPUs, ``nbytes`` per GPU (bf16 elements x 2), ``eager``
    (``kernel_source`` ending in ``eager``; a table without the column is all under a graph)."""
    t = _table(gpu, engine, "custom_allreduce_perf", folder)
    source = t["kernel_source"] if "kernel_source" in t.columns else pd.Series([""] * len(t))
    return pd.DataFrame({
        "engine": engine, "n": t["num_gpus"].to_numpy(np.float64),
        "nbytes": t["message_size"].to_numpy(np.float64) * 2.0,
        "eager": source.astype(str).str.lower().str.endswith("eager").to_numpy(),
        "time_s": t["latency"].to_numpy(np.float64) * 1e-3,
    })


def nccl_frame(gpu: str) -> pd.DataFrame:
    """NCCL all-reduce rows (fp16, ``message_size`` elements x 2 bytes) inside one NVSwitch node."""
    t = read_table(gpu, NCCL[gpu], "nccl_perf")
    return pd.DataFrame({"engine": "nccl", "n": t["num_gpus"].to_numpy(np.float64),
                         "nbytes": t["message_size"].to_numpy(np.float64) * 2.0,
                         "time_s": t["latency"].to_numpy(np.float64) * 1e-3})


def moe_frame(gpu: str, engine: str, folder=None) -> pd.DataFrame | None:
    """Fused-MoE rows (balanced router) or None where the GPU's table has none: per GPU
    ``assignments`` = tokens top_k / EP, ``touched`` = balanced_experts_nb(assignments, E / EP),
    ``inter`` = intermediate / TP; ``shape`` (hidden/inter/experts/topk) is the held-out group."""
    where = Path(folder) if folder is not None else aiconfigurator_dir() / gpu / engine_folders(gpu)[engine]
    if table_file(where, "moe_perf") is None:
        return None
    t = _formula_rows(read_folder_table(where, "moe_perf"), "moe_perf")
    if t.empty:
        return None
    tokens = t["num_tokens"].to_numpy(np.float64)
    topk = t["topk"].to_numpy(np.float64)
    experts = t["num_experts"].to_numpy(np.float64)
    ep = t["moe_ep_size"].to_numpy(np.float64)
    assignments = tokens * topk / ep
    local = experts / ep
    f = pd.DataFrame({
        "engine": engine, "dtype": t["moe_dtype"].map({"bfloat16": "bf16", "fp8": "fp8"}).to_numpy(),
        "tokens": tokens, "hidden": t["hidden_size"].to_numpy(np.float64),
        "inter": t["inter_size"].to_numpy(np.float64) / t["moe_tp_size"].to_numpy(np.float64),
        "topk": topk, "experts": experts, "tp": t["moe_tp_size"].to_numpy(np.float64), "ep": ep,
        "assignments": assignments, "touched": np.minimum(local, assignments), "pairs": tokens * topk,
        "time_s": t["latency"].to_numpy(np.float64) * 1e-3,
    })
    f["shape"] = [f"{int(h)}/{int(i)}/{int(e)}/{int(k)}" for h, i, e, k in
                  zip(f["hidden"], t["inter_size"], f["experts"], f["topk"])]
    # the tile the engine's kernel runs for each row (vLLM's tuned configs or its default; 0: not known)
    f["tile_m"], f["tile_n"], f["tile_k"] = moe_tiles(engine, GPUS.get(gpu, gpu), f)
    # serving range: the token budget of a step, experts sharded by TP only (expert parallelism is
    # not modelled in serving yet; its rows are reported apart)
    f["in_range"] = (f["tokens"] <= MOE_MAX_TOKENS) & (f["ep"] == 1.0)
    return f


def moe_tuned(engine: str, hw_name: str, f: pd.DataFrame) -> np.ndarray:
    """True where ``engine`` ships a tuned fused-MoE config for the row's shape on ``hw_name``."""
    from servesim.config.engine import list_engines, load_engine
    from servesim.costmodel.moe_tiles import tile_table
    if engine not in list_engines():
        return np.zeros(len(f), dtype=bool)
    eng = load_engine(engine)
    local = (f["experts"] / f["ep"]).round().astype(int).to_numpy()
    width = f["inter"].round().astype(int).to_numpy()
    dtype = f["dtype"].to_numpy()
    return np.array([d == "bf16" and tile_table(eng, hw_name, "16bit", e, n)[4] for e, n, d in zip(local, width, dtype)],
                    dtype=bool)


def moe_tiles(engine: str, hw_name: str, f: pd.DataFrame) -> tuple:
    """(tile_m, tile_n, tile_k) per row of a MoE frame: the tile ``engine``'s profile says its kernel
    picks on ``hw_name`` for the row's local experts, width per GPU, dtype and tokens (zeros where the
    profile has no tile data)."""
    from servesim.config.engine import list_engines, load_engine
    from servesim.costmodel.moe_tiles import pick_tile_nb, tile_table
    tm = np.zeros(len(f))
    tn = np.zeros(len(f))
    tk = np.zeros(len(f))
    if engine not in list_engines():
        return tm, tn, tk
    eng = load_engine(engine)
    local = (f["experts"] / f["ep"]).round().astype(int).to_numpy()
    width = f["inter"].round().astype(int).to_numpy()
    dtype = f["dtype"].to_numpy()
    cache: dict = {}
    for i, (e, n, d, tok) in enumerate(zip(local, width, dtype, f["tokens"].to_numpy())):
        if d != "bf16":   # tiles of the 16-bit Triton kernel only (the engine runs fp8 W8A8 MoE elsewhere)
            continue
        key = (e, n, "16bit")
        if key not in cache:
            cache[key] = tile_table(eng, hw_name, "16bit", e, n)
        keys, bm, bn, bk, _ = cache[key]
        tm[i], tn[i], tk[i] = pick_tile_nb(keys, bm, bn, bk, float(tok))
    return tm, tn, tk


# -- vectorised predictions (each calls the kernel formula row by row) ---------------------------

@njit(**JIT)
def _gemm_many_nb(m, n, k, w_bytes, a_bytes, peak, hbm_bw, sm_count, gmax, hbm_frac, lat, lat_sk, k0, extra,
                  mem_lat):
    out = np.empty(m.shape[0])
    for i in range(m.shape[0]):
        out[i] = kn.gemm_time_nb(m[i], k[i], n[i], w_bytes[i], a_bytes[i], peak[i], hbm_bw, sm_count,
                                 gmax[i], hbm_frac, lat + extra[i], lat_sk, k0, mem_lat)
    return out


@njit(**JIT)
def _prefill_many_nb(seqs, chunk, ctx, heads, kv_heads, kv_bytes, head_dim, peak, hbm_bw, sm_count, amax, hbm_frac,
                     overhead, lat):
    out = np.empty(seqs.shape[0])
    for i in range(seqs.shape[0]):
        out[i] = kn.prefill_attention_time_nb(seqs[i], chunk[i], ctx[i], heads[i], kv_heads[i], head_dim, 2.0,
                                              kv_bytes[i], peak, hbm_bw, sm_count, amax, hbm_frac, overhead, lat)
    return out


@njit(**JIT)
def _decode_many_nb(seqs, kv_tokens, heads, kv_heads, kv_bytes, head_dim, hbm_bw, sm_count, frac, block, lat, split,
                    split_seqs, block_bw):
    out = np.empty(seqs.shape[0])
    for i in range(seqs.shape[0]):
        out[i] = kn.decode_attention_time_nb(seqs[i], kv_tokens[i], heads[i], kv_heads[i], head_dim, 2.0,
                                             kv_bytes[i], hbm_bw, sm_count, frac, block, lat, split, split_seqs,
                                             block_bw)
    return out


@njit(**JIT)
def _allreduce_many_nb(nbytes, n, eager, link_bw, frac, lat, step, launch, hbm_bw, hbm_frac):
    out = np.empty(nbytes.shape[0])
    for i in range(nbytes.shape[0]):
        if eager[i]:
            out[i] = kn.engine_allreduce_eager_time_nb(nbytes[i], n[i], link_bw, frac, lat, step, launch, hbm_bw,
                                                       hbm_frac)
        else:
            out[i] = kn.engine_allreduce_time_nb(nbytes[i], n[i], link_bw, frac, lat, step)
    return out


@njit(**JIT)
def _nccl_many_nb(nbytes, n, bw, alpha, base, algorithm):
    out = np.empty(nbytes.shape[0])
    for i in range(nbytes.shape[0]):
        out[i] = base + allreduce_time_nb(nbytes[i], n[i], bw, alpha, algorithm)
    return out


@njit(**JIT)
def _moe_many_nb(assignments, touched, pairs, hidden, inter, w_bytes, peak, hbm_bw, sm_count, gmax, hbm_frac, k0, eff,
                 lat, pair_time, tile_m, tile_n, ridge, tile_k, stream):
    out = np.empty(assignments.shape[0])
    for i in range(assignments.shape[0]):
        a = 2.0 if w_bytes[i] == 2.0 else 1.0
        out[i] = kn.moe_experts_time_nb(assignments[i], touched[i], pairs[i], hidden[i], inter[i], True, w_bytes[i], a,
                                        peak[i], hbm_bw, sm_count, gmax, hbm_frac, k0, eff[i], lat[i], pair_time,
                                        tile_m[i], tile_n[i], ridge, tile_k[i], stream)
    return out


def _col(frame: pd.DataFrame, name: str) -> np.ndarray:
    return frame[name].to_numpy(np.float64)


def predict_gemm(frame: pd.DataFrame, hw, gemm: dict, fp8: dict | None = None) -> np.ndarray:
    """GEMM time (s) of each row (columns m, n, k, dtype): bf16 at ``peak_bf16`` with 2-byte operands;
    fp8 (W8A8) as two parts, the quantisation of the activation X[m, k] (``gemm_fp8_quant_bytes`` per
    element at the weight-streaming rate ``gemm_hbm_fraction``: a term in m k that no tile count
    shows) and the fp8 GEMM at ``gemm_fp8_max`` of ``peak_fp8`` with 1-byte operands (bf16 output
    counted as 1 byte per element of activations, the kernel's dominant traffic being the weights),
    ``gemm_fp8_latency_us`` the fixed time of the whole call (both kernels) in place of
    ``gemm_latency_us``. Without ``fp8`` params fp8 rows use the bf16 ``gemm_max`` and latency and no
    quantisation (the pure transfer)."""
    is8 = (frame["dtype"] == "fp8").to_numpy()
    if is8.any() and hw.peak_flops["fp8"] <= 0.0:
        raise ConfigError(f"predict_gemm: {hw.name} has no fp8 peak")
    fp8 = fp8 or {"gemm_fp8_max": gemm["gemm_max"], "gemm_fp8_latency_us": gemm["gemm_latency_us"]}
    nbytes = np.where(is8, 1.0, 2.0)
    peak = np.where(is8, hw.peak_flops["fp8"], hw.peak_flops["bf16"])
    gmax = np.where(is8, fp8["gemm_fp8_max"], gemm["gemm_max"])
    extra = np.where(is8, (fp8["gemm_fp8_latency_us"] - gemm["gemm_latency_us"]) * 1e-6, 0.0)
    quant = np.where(is8, _col(frame, "m") * _col(frame, "k") * fp8.get("gemm_fp8_quant_bytes", 0.0)
                     / (hw.hbm_bw * gemm["gemm_hbm_fraction"]), 0.0)
    return quant + _gemm_many_nb(_col(frame, "m"), _col(frame, "n"), _col(frame, "k"), nbytes, nbytes, peak,
                                 hw.hbm_bw, float(hw.sm_count), gmax, gemm["gemm_hbm_fraction"],
                                 gemm["gemm_latency_us"] * 1e-6, gemm["gemm_splitk_latency_us"] * 1e-6,
                                 gemm["gemm_tile_overhead_k"], extra, gemm.get("gemm_mem_latency_us", 0.0) * 1e-6)


def predict_prefill(frame: pd.DataFrame, hw, p: dict) -> np.ndarray:
    """Prefill-attention time (s) of each row (bf16 q/o, KV at ``kv_bytes``) at the bf16 peak."""
    return _prefill_many_nb(_col(frame, "seqs"), _col(frame, "chunk"), _col(frame, "ctx"), _col(frame, "heads"),
                            _col(frame, "kv_heads"), _col(frame, "kv_bytes"), HEAD_DIM, hw.peak_flops["bf16"],
                            hw.hbm_bw, float(hw.sm_count), p["attn_prefill_max"], p["attn_prefill_hbm_fraction"],
                            p["attn_prefill_block_overhead"], p["attn_prefill_latency_us"] * 1e-6)


def predict_decode(frame: pd.DataFrame, hw, p: dict) -> np.ndarray:
    """Decode-attention time (s) of each row."""
    return _decode_many_nb(_col(frame, "seqs"), _col(frame, "kv_tokens"), _col(frame, "heads"),
                           _col(frame, "kv_heads"), _col(frame, "kv_bytes"), HEAD_DIM, hw.hbm_bw,
                           float(hw.sm_count), p["attn_decode_hbm_fraction"], p["attn_decode_block_us"] * 1e-6,
                           p["attn_decode_latency_us"] * 1e-6, p.get("attn_decode_split_us", 0.0) * 1e-6,
                           p.get("attn_decode_split_seqs", 0.0), p.get("attn_decode_block_GBps", 0.0) * 1e9)


def predict_allreduce(frame: pd.DataFrame, hw, p: dict, gemm_hbm_fraction: float) -> np.ndarray:
    """Engine all-reduce time (s) of each row over the profile's scale-up link (one direction);
    eager rows add ``allreduce_eager_launch_us`` and the input copy at ``gemm_hbm_fraction``."""
    return _allreduce_many_nb(_col(frame, "nbytes"), _col(frame, "n"), frame["eager"].to_numpy(bool), hw.scaleup_bw,
                              p["allreduce_bw_fraction"], p["allreduce_latency_us"] * 1e-6,
                              p["allreduce_step_latency_us"] * 1e-6, p.get("allreduce_eager_launch_us", 0.0) * 1e-6,
                              hw.hbm_bw, gemm_hbm_fraction)


def nccl_profile_params(hw) -> dict:
    """The hardware profile's scale-up collective values (fitted on Vidur's eager NCCL timings)."""
    e = hw.efficiency
    return {"scaleup_bw_fraction": e.scaleup_bw_fraction, "scaleup_latency_us": e.scaleup_latency_s * 1e6,
            "collective_base_latency_us": e.collective_base_latency_s * 1e6}


def predict_nccl(frame: pd.DataFrame, hw, p: dict | None = None) -> np.ndarray:
    """NCCL all-reduce time (s) as the simulator prices it: collective_base_latency +
    ``collectives.allreduce_time_nb`` (auto: ring or tree) over scaleup_bw x scaleup_bw_fraction with
    scaleup_latency per step; ``p`` defaults to the profile's values."""
    p = p or nccl_profile_params(hw)
    return _nccl_many_nb(_col(frame, "nbytes"), _col(frame, "n"), hw.scaleup_bw * p["scaleup_bw_fraction"],
                         p["scaleup_latency_us"] * 1e-6, p["collective_base_latency_us"] * 1e-6, AUTO)


def predict_moe(frame: pd.DataFrame, hw, gemm: dict, p: dict) -> np.ndarray:
    """Fused-MoE time (s) of each row: bf16 rows at ``moe_efficiency`` / ``moe_latency_us``, fp8 rows
    at the fp8 peak with 1-byte weights and activations, ``moe_fp8_efficiency`` / ``moe_fp8_latency_us``;
    every row adds ``moe_pair_us`` per routed pair (column ``pairs``). Rows with a known tile (columns
    ``tile_m``, ``tile_n`` > 0) run it, capped by ``moe_tile_ridge``, its weights streamed at
    ``moe_stream_fraction_nb(tile_k, w, moe_stream_bytes)`` of the GEMM rate. The fp8 rows' activation
    quantisation is inside ``moe_fp8_latency_us`` and ``moe_fp8_efficiency``: a separate term at the
    GEMM fit's ``gemm_fp8_quant_bytes`` per element fitted worse (held out 14.7% against 13.4% on H100)."""
    is8 = (frame["dtype"] == "fp8").to_numpy()
    if is8.any() and not {"moe_fp8_efficiency", "moe_fp8_latency_us"} <= set(p):
        raise ConfigError("predict_moe: fp8 rows need moe_fp8_efficiency and moe_fp8_latency_us")
    eff = np.where(is8, p.get("moe_fp8_efficiency", 0.0), p.get("moe_efficiency", 0.0))
    lat = np.where(is8, p.get("moe_fp8_latency_us", 0.0), p.get("moe_latency_us", 0.0)) * 1e-6
    peak = np.where(is8, hw.peak_flops["fp8"], hw.peak_flops["bf16"])
    return _moe_many_nb(_col(frame, "assignments"), _col(frame, "touched"), _col(frame, "pairs"), _col(frame, "hidden"),
                        _col(frame, "inter"), np.where(is8, 1.0, 2.0), peak, hw.hbm_bw, float(hw.sm_count),
                        gemm["gemm_max"], gemm["gemm_hbm_fraction"], gemm["gemm_tile_overhead_k"], eff, lat,
                        p.get("moe_pair_us", 0.0) * 1e-6, _tiles(frame, "tile_m"), _tiles(frame, "tile_n"),
                        p.get("moe_tile_ridge", 0.0), _tiles(frame, "tile_k"), p.get("moe_stream_bytes", 0.0))


def _tiles(frame: pd.DataFrame, name: str) -> np.ndarray:
    return frame[name].to_numpy(np.float64) if name in frame.columns else np.zeros(len(frame))


# -- fitting ------------------------------------------------------------------------------------

def fit_params(names, predict, frame: pd.DataFrame, what: str, start: dict | None = None,
               fixed: dict | None = None) -> dict:
    """Least squares (soft-L1 on log(pred / measured), ``LOSS``) of parameters ``names`` within
    ``BOUNDS``; ``predict(frame, params)`` returns seconds, ``fixed`` holds the other parameters.
    Starts from ``start`` (default ``START``) and from the bounds' midpoints in log space, keeps the
    best. Warns for a parameter that ends on a bound. Dict in file units."""
    names = tuple(names)
    fixed = dict(fixed or {})
    t = frame["time_s"].to_numpy(np.float64)
    ok = np.isfinite(t) & (t > 0.0)
    sub = frame[ok]
    if len(sub) < len(names) + 2:
        raise ConfigError(f"{what}: {len(sub)} usable row(s) for {len(names)} parameters")
    log_meas = np.log(sub["time_s"].to_numpy(np.float64))
    lo = np.array([BOUNDS[k][0] for k in names])
    hi = np.array([BOUNDS[k][1] for k in names])

    def residual(x):
        return np.log(predict(sub, {**fixed, **dict(zip(names, x))})) - log_meas

    first = start or START
    starts = [np.array([first.get(k, START[k]) for k in names])]
    starts.append(np.array([0.5 * (a + b) if a <= 0.0 else math.sqrt(a * b) for a, b in zip(lo, hi)]))
    best = None
    for x0 in starts:
        x0 = np.clip(x0, lo + 1e-6 * (hi - lo), hi - 1e-6 * (hi - lo))
        res = least_squares(residual, x0, bounds=(lo, hi), x_scale=np.maximum(np.abs(x0), 1e-2 * (hi - lo)),
                            method="trf", diff_step=1e-4, xtol=1e-8, ftol=1e-8, gtol=1e-8, max_nfev=300, **LOSS)
        if best is None or res.cost < best.cost:
            best = res
    out = {k: float(v) for k, v in zip(names, best.x)}
    for k, v in out.items():
        b_lo, b_hi = BOUNDS[k]
        tol = 1e-3 * (b_hi - b_lo)
        if v - b_lo <= tol or b_hi - v <= tol:
            warnings.warn(f"{what}: {k} = {v:.4g} ends on its {'lower' if v - b_lo <= tol else 'upper'} bound",
                          stacklevel=2)
    return out


def bounds_hit(params: dict) -> list:
    """Names of parameters within 0.1% of the bound range of a bound."""
    hit = []
    for k, v in params.items():
        if k in BOUNDS:
            lo, hi = BOUNDS[k]
            if v - lo <= 1e-3 * (hi - lo) or hi - v <= 1e-3 * (hi - lo):
                hit.append(k)
    return hit


def group_folds(groups, k: int, seed: int = 0) -> np.ndarray:
    """Fold index (0..k-1) of each row: the distinct groups, sorted then shuffled with
    ``numpy.random.default_rng(seed)``, are dealt round-robin into k folds, so every row of a group
    lands in the same fold (a held-out group is never fitted)."""
    groups = np.asarray(groups).astype(str)
    uniq = np.array(sorted(set(groups)))
    if k < 2 or len(uniq) < k:
        raise ConfigError(f"group_folds: {len(uniq)} group(s) cannot make {k} folds")
    order = np.random.default_rng(seed).permutation(len(uniq))
    fold_of = {g: i % k for i, g in enumerate(uniq[order])}
    return np.array([fold_of[g] for g in groups], dtype=np.int64)


def cross_validate(frame: pd.DataFrame, folds: np.ndarray, fit, predict) -> tuple[np.ndarray, list]:
    """Held-out predictions: for each fold, ``fit(train_frame)`` -> params, then ``predict(test_frame,
    params)``. Returns (prediction per row, [params per fold])."""
    pred = np.full(len(frame), np.nan)
    fitted = []
    for f in sorted(set(folds.tolist())):
        test = folds == f
        params = fit(frame[~test])
        pred[test] = predict(frame[test], params)
        fitted.append(params)
    return pred, fitted


# -- per-class fits (each returns a dict of file-unit parameters) -------------------------------

def fit_gemm(frame: pd.DataFrame, hw, start: dict | None = None) -> dict:
    """``GEMM_PARAMS`` on bf16 rows."""
    rows = frame[frame["dtype"] == "bf16"]
    return fit_params(GEMM_PARAMS, lambda f, p: predict_gemm(f, hw, p), rows, f"fit_gemm({hw.name})", start)


def fit_gemm_fp8(frame: pd.DataFrame, hw, gemm: dict) -> dict:
    """``GEMM_FP8_PARAMS`` on fp8 rows, the bf16 GEMM parameters held fixed."""
    rows = frame[frame["dtype"] == "fp8"]
    return fit_params(GEMM_FP8_PARAMS, lambda f, p: predict_gemm(f, hw, gemm, p), rows, f"fit_gemm_fp8({hw.name})")


def fit_prefill(frame: pd.DataFrame, hw) -> dict:
    return fit_params(PREFILL_PARAMS, lambda f, p: predict_prefill(f, hw, p), frame, f"fit_prefill({hw.name})")


def fit_decode(frame: pd.DataFrame, hw) -> dict:
    return fit_params(DECODE_PARAMS, lambda f, p: predict_decode(f, hw, p), frame, f"fit_decode({hw.name})")


def fit_allreduce(frame: pd.DataFrame, hw, gemm_hbm_fraction: float) -> dict:
    """``ALLREDUCE_PARAMS`` (``allreduce_eager_launch_us`` only where eager rows exist)."""
    names = ALLREDUCE_PARAMS if frame["eager"].any() else ALLREDUCE_PARAMS[:3]
    return fit_params(names, lambda f, p: predict_allreduce(f, hw, p, gemm_hbm_fraction), frame,
                      f"fit_allreduce({hw.name})")


def fit_nccl(frame: pd.DataFrame, hw) -> dict:
    return fit_params(NCCL_PARAMS, lambda f, p: predict_nccl(f, hw, p), frame, f"fit_nccl({hw.name})",
                      start=nccl_profile_params(hw))


def fit_moe(frame: pd.DataFrame, hw, gemm: dict) -> dict:
    """One joint fit over the bf16 and fp8 rows present: ``MOE_PARAMS`` for bf16, ``MOE_FP8_PARAMS``
    for fp8, and ``moe_pair_us`` shared (routing and permutation do not depend on the expert dtype);
    with known tiles also ``MOE_TILE_PARAMS`` (``moe_stream_bytes`` 0 where the fit leaves every
    tile's K-step run at the full streaming rate)."""
    names = []
    for dtype, part in (("bf16", MOE_PARAMS), ("fp8", MOE_FP8_PARAMS)):
        if (frame["dtype"] == dtype).any():
            names += part
    if not names:
        raise ConfigError(f"fit_moe({hw.name}): no bf16 or fp8 rows")
    tiled = MOE_TILE_PARAMS if "tile_m" in frame.columns and (frame["tile_m"] > 0).any() else ()
    out = fit_params(tuple(names) + MOE_SHARED_PARAMS + tiled, lambda f, p: predict_moe(f, hw, gemm, p), frame,
                     f"fit_moe({hw.name})")
    if tiled:
        # a run per K step no tiled row is short of streams every tile at the full rate: no cap found (0)
        on = frame[frame["tile_m"] > 0]
        runs = on["tile_k"] * np.where(on["dtype"] == "fp8", 1.0, 2.0)
        if out["moe_stream_bytes"] <= runs.min():
            out["moe_stream_bytes"] = 0.0
    return out


def fit_launch(frame: pd.DataFrame, hw, gemm: dict) -> dict:
    """``launch_us``: the constant host gap of an eager PyTorch kernel, on top of the CUDA-graph GEMM
    formula with the GPU's GEMM parameters (frame: Vidur GEMM rows, columns m, n, k, time_s; fp16)."""
    rows = frame.assign(dtype="bf16")

    def predict(f, p):
        return predict_gemm(f, hw, {**gemm, "gemm_latency_us": gemm["gemm_latency_us"] + p["launch_us"]})

    return fit_params(LAUNCH_PARAMS, predict, rows, f"fit_launch({hw.name})")


__all__ = ["ALLREDUCE_PARAMS", "BOUNDS", "DECODE_PARAMS", "ENGINES", "GEMM_FP8_PARAMS", "GEMM_PARAMS", "GPUS",
           "LAUNCH_PARAMS", "MOE_FP8_PARAMS", "MOE_PARAMS", "MOE_SHARED_PARAMS", "MOE_TILE_PARAMS", "NCCL_PARAMS", "PREFILL_PARAMS",
           "ROW_FILTERS", "TABLE_COLUMNS", "aiconfigurator_dir",
           "allreduce_frame", "bounds_hit", "cross_validate", "decode_frame", "fit_allreduce", "fit_decode",
           "fit_gemm", "fit_gemm_fp8", "fit_launch", "fit_moe", "fit_nccl", "fit_params", "fit_prefill",
           "gemm_frame", "group_folds", "moe_frame", "moe_tiles", "moe_tuned", "nccl_frame", "nccl_profile_params", "predict_allreduce",
           "predict_decode", "predict_gemm", "predict_moe", "predict_nccl", "predict_prefill", "prefill_frame",
           "read_folder_table", "read_table", "table_file"]
