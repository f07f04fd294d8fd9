"""Per-operator calibration: Vidur timings -> tidy frames -> cost-model predictions -> fitted efficiencies.

Data: per-operator GPU timings measured by the Vidur project (Agrawal et al., "Vidur: A Large-Scale
Simulation Framework for LLM Inference", MLSys 2024; MIT licence), shipped under
``servesim/calibrate/data/vidur/`` (see its README for what was trimmed).

The formulas are the cost model's own, imported and called, never re-derived here:

- GEMM: ``servesim.costmodel.roofline.gemm_time_nb`` (roofline with a saturating efficiency curve
  ``gemm_max * M / (M + gemm_half_tokens)``, plus a fixed per-kernel latency).
- all-reduce / send-recv: ``servesim.costmodel.collectives.allreduce_time_nb`` (alpha-beta, ring or
  tree, ``auto`` = the faster) and ``p2p_time_nb``.
- elementwise kernels (norms, rope, activation, residual add): bytes per token from
  ``servesim.costmodel.elementwise`` at ``hbm_bw`` times the kernel kind's fraction, plus
  ``elementwise_latency_us`` per kernel; evaluated here with ``roofline_time_nb`` with zero FLOPs.
- send-recv over the scale-up link: ``p2p_time_nb`` with ``p2p_bw_fraction`` and ``p2p_latency_us``, and
  ``p2p_large_bw_fraction`` for messages above ``p2p_large_message_mib``.

Fits minimise ``sum log(pred / measured)^2`` with ``scipy.optimize.least_squares`` inside physical
bounds, so every row counts by its relative error whatever its absolute size.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from numba import njit
from scipy.optimize import least_squares

from servesim.costmodel import elementwise as elem
from servesim.costmodel.collectives import AUTO, allreduce_time_nb, link_for_group, p2p_time_nb
from servesim.costmodel.roofline import gemm_time_nb
from servesim.errors import ConfigError
from servesim.jit import JIT

# Vidur op name -> servesim operator class, with the GEMM shape per GPU (Megatron-style TP sharding,
# Shoeybi et al. 2019, sec. 3): QKV and MLP-up are column-parallel (N / TP), attention-out and
# MLP-down are row-parallel (K / TP).
GEMM_OPS = {
    "attn_pre_proj": "gemm_qkv",       # K = h, N = (heads + 2 kv_heads) * head_dim / TP
    "attn_post_proj": "gemm_attn_out",  # K = heads * head_dim / TP, N = h
    "mlp_up_proj": "gemm_mlp_up",      # K = h, N = (2 if gated else 1) * f / TP
    "mlp_down_proj": "gemm_mlp_down",  # K = f / TP, N = h
}
ELEMENTWISE_OPS = ("input_layernorm", "attn_rope", "mlp_act", "add")
OPTIONAL_OPS = ("post_attention_layernorm", "emb")
# Vidur elementwise op -> kernel kind of servesim.costmodel.elementwise
ELEMENTWISE_KIND = {"input_layernorm": "norm", "post_attention_layernorm": "norm", "attn_rope": "rope",
                    "mlp_act": "activation", "add": "stream"}
SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp",
                 "num_tokens", "num_tensor_parallel_workers")
NETWORK_COLUMNS = ("collective", "num_workers", "size", "devices_per_node")
COLLECTIVES = ("all_reduce", "send_recv")

GEMM_PARAMS = ("gemm_max", "gemm_half_tokens", "kernel_latency_us", "hbm_fraction")
COLLECTIVE_PARAMS = ("scaleup_bw_fraction", "scaleup_latency_us", "collective_base_latency_us")
P2P_PARAMS = ("p2p_bw_fraction", "p2p_latency_us", "p2p_large_bw_fraction")
# file key of each elementwise kind's fraction ("stream" = residual add / copy: the GEMMs' hbm_fraction);
# fractions carry no unit, so the file keys are the Efficiency field names of the cost model's table
KIND_PARAM = dict(elem.KIND_FIELD)
ELEMENTWISE_PARAMS = tuple(v for k, v in KIND_PARAM.items() if k != "stream") + ("elementwise_latency_us",)
# Physical bounds of the fitted parameters: fractions of a datasheet figure, a token count, microseconds.
BOUNDS = {
    "gemm_max": (0.05, 1.0),
    "gemm_half_tokens": (1.0, 4096.0),
    "kernel_latency_us": (0.0, 50.0),
    "hbm_fraction": (0.05, 1.0),
    "scaleup_bw_fraction": (0.05, 1.0),
    "scaleup_latency_us": (0.0, 50.0),
    "collective_base_latency_us": (0.0, 100.0),
    "norm_hbm_fraction": (0.05, 1.0),
    "rope_hbm_fraction": (0.05, 1.0),
    "activation_hbm_fraction": (0.05, 1.0),
    "elementwise_latency_us": (0.0, 50.0),
    "p2p_bw_fraction": (0.05, 1.0),
    "p2p_latency_us": (0.0, 100.0),
    "p2p_large_bw_fraction": (0.05, 1.0),
}
FP16_BYTES = 2.0
# Bytes per unit of the Vidur network CSVs' ``size`` column. The shared README calls it "elements of
# fp16" (2 bytes each), but read that way the measured send-recv and 2-GPU all-reduce move data faster
# than the datasheet NVLink bandwidth per direction (A100 send-recv ~450 GB/s vs 300 GB/s; H100
# ~720 GB/s vs 450 GB/s), which is physically impossible; read as bytes every file is below the link
# rate and H100 send-recv is predicted within a few percent from all-reduce-fitted link parameters.
# experiments/fit_costmodel.py reports both readings.
VIDUR_NETWORK_BYTES_PER_SIZE = 1.0


def _median_col(op: str) -> str:
    return f"time_stats.{op}.median"


def _show(path) -> str:
    try:
        return Path(path).resolve().relative_to(Path(__file__).resolve().parents[2]).as_posix()
    except ValueError:
        return str(path)


def _read_csv(path, required: list[str]) -> pd.DataFrame:
    path = Path(path)
    try:
        raw = pd.read_csv(path)
    except FileNotFoundError:
        raise ConfigError(f"{_show(path)}: file not found") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{_show(path)}: not a readable CSV ({exc})") from None
    missing = [c for c in required if c not in raw.columns]
    if missing:
        raise ConfigError(f"{_show(path)}: missing required column(s) {', '.join(missing)}; "
                          f"a Vidur profiling CSV has them (see servesim/calibrate/data/vidur/README.md)")
    for c in required:
        if c != "collective" and c != "use_gated_mlp" and not pd.api.types.is_numeric_dtype(raw[c]):
            raise ConfigError(f"{_show(path)}: column {c} must be numeric, got dtype {raw[c].dtype}")
    return raw


def _as_bool(series: pd.Series, path) -> np.ndarray:
    if series.dtype == bool:
        return series.to_numpy()
    text = series.astype(str).str.strip().str.lower()
    bad = ~text.isin(["true", "false", "1", "0"])
    if bad.any():
        raise ConfigError(f"{_show(path)}: column use_gated_mlp must be True/False, got {series[bad].iloc[0]!r}")
    return text.isin(["true", "1"]).to_numpy()


# -- readers ------------------------------------------------------------------------------------

def read_vidur_mlp(path, gpu: str | None = None, model: str | None = None) -> pd.DataFrame:
    """A Vidur ``compute/<gpu>/<org>/<model>/mlp.csv`` as a tidy frame, one row per (measurement, op).

    Columns: ``gpu, model, row, op, op_class, num_tokens, tp, n_head, n_kv_head, n_embd,
    n_expanded_embd, use_gated_mlp, m, k, n, time_s``. ``time_s`` is the median in seconds (the file
    is in milliseconds); ``m, k, n`` are the per-GPU GEMM shape (NaN for non-GEMM ops); ``row`` is the
    CSV row, so the ops of one measurement can be put back together. ``gpu`` and ``model`` default to
    the path (``.../<gpu>/<org>/<model>/mlp.csv``).
    """
    path = Path(path)
    ops = list(GEMM_OPS) + list(ELEMENTWISE_OPS)
    raw = _read_csv(path, list(SHAPE_COLUMNS) + [_median_col(op) for op in ops])
    ops += [op for op in OPTIONAL_OPS if _median_col(op) in raw.columns]
    if gpu is None:
        gpu = path.parents[2].name if len(path.parents) > 2 else ""
    if model is None:
        model = f"{path.parents[1].name}/{path.parent.name}" if len(path.parents) > 1 else path.stem
    tokens = raw["num_tokens"].to_numpy(dtype=np.float64)
    tp = raw["num_tensor_parallel_workers"].to_numpy(dtype=np.float64)
    heads = raw["n_head"].to_numpy(dtype=np.float64)
    kv_heads = raw["n_kv_head"].to_numpy(dtype=np.float64)
    h = raw["n_embd"].to_numpy(dtype=np.float64)
    f = raw["n_expanded_embd"].to_numpy(dtype=np.float64)
    gated = _as_bool(raw["use_gated_mlp"], path)
    if (tp < 1).any() or (heads < 1).any() or (h < 1).any():
        raise ConfigError(f"{_show(path)}: num_tensor_parallel_workers, n_head and n_embd must be >= 1")
    head_dim = h / heads
    shapes = {
        "attn_pre_proj": (h, (heads + 2.0 * kv_heads) * head_dim / tp),
        "attn_post_proj": (heads * head_dim / tp, h),
        "mlp_up_proj": (h, np.where(gated, 2.0, 1.0) * f / tp),
        "mlp_down_proj": (f / tp, h),
    }
    base = pd.DataFrame({
        "gpu": gpu, "model": model, "row": np.arange(len(raw)),
        "num_tokens": tokens, "tp": tp.astype(np.int64), "n_head": heads.astype(np.int64),
        "n_kv_head": kv_heads.astype(np.int64), "n_embd": h, "n_expanded_embd": f, "use_gated_mlp": gated,
    })
    parts = []
    nan = np.full(len(raw), np.nan)
    for op in ops:
        part = base.copy()
        part.insert(3, "op", op)
        part.insert(4, "op_class", GEMM_OPS.get(op, op))
        k, n = shapes.get(op, (nan, nan))
        part["m"] = tokens if op in GEMM_OPS else nan
        part["k"] = k
        part["n"] = n
        part["time_s"] = raw[_median_col(op)].to_numpy(dtype=np.float64) * 1e-3
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def elementwise_frame(mlp: pd.DataFrame) -> pd.DataFrame:
    """The elementwise-kernel rows of a ``read_vidur_mlp`` frame, one per (measurement, op), with the
    kernel ``kind`` (``ELEMENTWISE_KIND``) and ``nbytes``, the bytes the cost model charges it
    (``servesim.costmodel.elementwise``: norm 4 h, add 6 h, rope 4 (q + kv heads) d / TP, activation
    2 (g + 1) f / TP per token). ``op_class`` is ``"elementwise"``."""
    _need(mlp, ("op", "num_tokens", "n_embd", "n_expanded_embd", "tp", "n_head", "n_kv_head",
                "use_gated_mlp", "time_s"), "elementwise_frame")
    e = mlp[mlp["op"].isin(list(ELEMENTWISE_KIND))].copy()
    tokens = e["num_tokens"].to_numpy(np.float64)
    h = e["n_embd"].to_numpy(np.float64)
    tp = e["tp"].to_numpy(np.float64)
    head_dim = h / e["n_head"].to_numpy(np.float64)
    kv_gpu = np.maximum(e["n_kv_head"].to_numpy(np.float64) / tp, 1.0)
    rope_width = (e["n_head"].to_numpy(np.float64) / tp + kv_gpu) * head_dim
    f_gpu = e["n_expanded_embd"].to_numpy(np.float64) / tp
    per_token = {"norm": elem.norm_bytes(h), "stream": elem.add_bytes(h), "rope": elem.rope_bytes(rope_width),
                 "activation": np.where(e["use_gated_mlp"].to_numpy(bool), elem.activation_bytes(f_gpu, True),
                                        elem.activation_bytes(f_gpu, False))}
    e["kind"] = e["op"].map(ELEMENTWISE_KIND).to_numpy()
    nbytes = np.zeros(len(e))
    for kind, b in per_token.items():
        nbytes = np.where(e["kind"].to_numpy() == kind, b, nbytes)
    e["nbytes"] = tokens * nbytes
    e["op_class"] = "elementwise"
    return e.reset_index(drop=True)


def layer_sums(frame: pd.DataFrame, cols=("time_s", "pred_s")) -> pd.DataFrame:
    """Per (gpu, model, row): the elementwise work of one layer, the sum of ``cols`` over its six
    kernels: input norm + pre-MLP norm + rope + activation + 2 residual adds
    (``post_attention_layernorm`` where measured, else the input norm twice: phi-2's files)."""
    keys = ["gpu", "model", "row"]
    cols = [c for c in cols if c in frame.columns]
    wide = frame.pivot_table(index=keys, columns="op", values=cols, aggfunc="first")
    out = {}
    for c in cols:
        w = wide[c]
        second = w["input_layernorm"]
        if "post_attention_layernorm" in w:
            second = w["post_attention_layernorm"].fillna(second)
        out[c] = w["input_layernorm"] + second + w["attn_rope"] + w["mlp_act"] + 2.0 * w["add"]
    shape_cols = ["num_tokens", "tp", "n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp"]
    shapes = frame.drop_duplicates(keys).set_index(keys)[shape_cols]
    res = shapes.join(pd.DataFrame(out)).reset_index()
    res.insert(3, "op", "elementwise")
    res.insert(4, "op_class", "elementwise")
    return res


def read_vidur_network(path, system: str | None = None,
                       bytes_per_size: float = VIDUR_NETWORK_BYTES_PER_SIZE) -> pd.DataFrame:
    """A Vidur ``network/<system>/{all_reduce,send_recv}.csv`` as a tidy frame.

    Columns: ``system, collective, op_class, num_workers, devices_per_node, intra_node, size, nbytes,
    time_s``. ``nbytes = bytes_per_size * size`` (see ``VIDUR_NETWORK_BYTES_PER_SIZE`` for why the
    default is 1); ``time_s`` is the median in seconds; ``intra_node`` is true when all workers sit
    in one node (``num_workers <= devices_per_node``); ``system`` defaults to the folder name.
    """
    if not bytes_per_size > 0:
        raise ConfigError(f"read_vidur_network: bytes_per_size must be > 0, got {bytes_per_size!r}")
    path = Path(path)
    try:
        head = pd.read_csv(path, nrows=1)
    except FileNotFoundError:
        raise ConfigError(f"{_show(path)}: file not found") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{_show(path)}: not a readable CSV ({exc})") from None
    collective = str(head["collective"].iloc[0]) if "collective" in head.columns and len(head) else path.stem
    if collective not in COLLECTIVES:
        raise ConfigError(f"{_show(path)}: collective {collective!r} is not one of {', '.join(COLLECTIVES)}")
    raw = _read_csv(path, list(NETWORK_COLUMNS) + [_median_col(collective)])
    if (raw["collective"] != collective).any():
        raise ConfigError(f"{_show(path)}: column collective mixes values; one collective per file")
    workers = raw["num_workers"].to_numpy(dtype=np.int64)
    per_node = raw["devices_per_node"].to_numpy(dtype=np.int64)
    size = raw["size"].to_numpy(dtype=np.float64)
    return pd.DataFrame({
        "system": system if system is not None else path.parent.name,
        "collective": collective, "op_class": collective,
        "num_workers": workers, "devices_per_node": per_node, "intra_node": workers <= per_node,
        "size": size, "nbytes": bytes_per_size * size,
        "time_s": raw[_median_col(collective)].to_numpy(dtype=np.float64) * 1e-3,
    })


# -- predictions --------------------------------------------------------------------------------

@njit(**JIT)
def _gemm_times_nb(m, k, n, w_bytes, a_bytes, peak, hbm_bw, gemm_max, half_tokens, hbm_fraction, latency):
    out = np.empty(m.shape[0])
    for i in range(m.shape[0]):
        out[i] = gemm_time_nb(m[i], k[i], n[i], w_bytes, a_bytes, peak, hbm_bw,
                              gemm_max, half_tokens, hbm_fraction, latency)
    return out


@njit(**JIT)
def _collective_times_nb(is_allreduce, nbytes, workers, bw, alpha, bw_large, large_bytes, algorithm):
    out = np.empty(nbytes.shape[0])
    for i in range(nbytes.shape[0]):
        if is_allreduce[i]:
            out[i] = allreduce_time_nb(nbytes[i], workers[i], bw[i], alpha[i], algorithm)
        else:
            out[i] = p2p_time_nb(nbytes[i], bw[i], alpha[i], bw_large[i], large_bytes[i])
    return out


def profile_params(profile) -> dict:
    """The fitted-key values of a hardware profile, in file units (``_us`` keys in microseconds)."""
    e = profile.efficiency
    return {"gemm_max": e.gemm_max, "gemm_half_tokens": e.gemm_half_tokens,
            "kernel_latency_us": e.kernel_latency_s * 1e6, "hbm_fraction": e.hbm_fraction,
            "scaleup_bw_fraction": e.scaleup_bw_fraction, "scaleup_latency_us": e.scaleup_latency_s * 1e6,
            "collective_base_latency_us": e.collective_base_latency_s * 1e6,
            "p2p_bw_fraction": e.p2p_bw_fraction, "p2p_latency_us": e.p2p_latency_s * 1e6,
            "p2p_large_bw_fraction": e.p2p_large_bw_fraction,
            "p2p_large_message_mib": e.p2p_large_message_bytes / 2.0 ** 20,
            "norm_hbm_fraction": e.norm_hbm_fraction, "rope_hbm_fraction": e.rope_hbm_fraction,
            "activation_hbm_fraction": e.activation_hbm_fraction,
            "elementwise_latency_us": e.elementwise_latency_s * 1e6}


def _params(profile, params) -> dict:
    merged = profile_params(profile)
    if params:
        unknown = set(params) - set(merged)
        if unknown:
            raise ConfigError(f"unknown calibration parameter(s) {', '.join(sorted(unknown))}; "
                              f"known: {', '.join(merged)}")
        merged.update(params)
    return merged


def _need(frame: pd.DataFrame, cols, what: str) -> None:
    missing = [c for c in cols if c not in frame.columns]
    if missing:
        raise ConfigError(f"{what}: frame lacks column(s) {', '.join(missing)}")


def predict_gemm(frame: pd.DataFrame, profile, params: dict | None = None) -> np.ndarray:
    """Cost-model GEMM time (s) of each row (fp16 weights and activations) from columns m, k, n."""
    _need(frame, ("m", "k", "n"), "predict_gemm")
    p = _params(profile, params)
    return _gemm_times_nb(frame["m"].to_numpy(np.float64), frame["k"].to_numpy(np.float64),
                          frame["n"].to_numpy(np.float64), FP16_BYTES, FP16_BYTES,
                          profile.peak_flops["fp16"], profile.hbm_bw, p["gemm_max"], p["gemm_half_tokens"],
                          p["hbm_fraction"], p["kernel_latency_us"] * 1e-6)


def _kind_fractions(kinds: np.ndarray, p: dict) -> np.ndarray:
    out = np.full(kinds.shape[0], np.nan)
    for kind, key in KIND_PARAM.items():
        out = np.where(kinds == kind, p[key], out)
    if np.isnan(out).any():
        raise ConfigError(f"elementwise rows: unknown kernel kind(s) {sorted(set(kinds[np.isnan(out)]))}; "
                          f"known: {', '.join(KIND_PARAM)}")
    return out


def predict_elementwise(frame: pd.DataFrame, profile, params: dict | None = None) -> np.ndarray:
    """Cost-model time (s) of each elementwise kernel row (columns ``kind``, ``nbytes``):
    ``elementwise_latency + nbytes / (hbm_bw * fraction of its kind)``."""
    _need(frame, ("kind", "nbytes"), "predict_elementwise")
    p = _params(profile, params)
    frac = _kind_fractions(frame["kind"].to_numpy(), p)
    return p["elementwise_latency_us"] * 1e-6 + frame["nbytes"].to_numpy(np.float64) / (profile.hbm_bw * frac)


def predict_collectives(frame: pd.DataFrame, profile, params: dict | None = None,
                        algorithm: int = AUTO) -> np.ndarray:
    """Cost-model time (s) of each all-reduce (``algorithm``, default auto) or send-recv row, over the
    link ``costmodel.collectives.link_for_group`` picks for its ``num_workers``. Scale-up link:
    all-reduce at bw = scaleup_bw * scaleup_bw_fraction, alpha = scaleup_latency per step, plus
    collective_base_latency once; send-recv at p2p_latency + nbytes / (scaleup_bw * p2p_bw_fraction),
    or at p2p_large_bw_fraction for messages above p2p_large_message_mib. Groups that leave the
    scale-up domain (PCIe inside a node, the NIC across nodes) use the profile's own pcie / scaleout
    figures (not fitted here)."""
    _need(frame, ("collective", "nbytes", "num_workers"), "predict_collectives")
    p = _params(profile, params)
    is_ar = (frame["collective"] == "all_reduce").to_numpy()
    nbytes = frame["nbytes"].to_numpy(np.float64)
    n = frame["num_workers"].to_numpy(np.float64)
    sizes, row = np.unique(n, return_inverse=True)
    links = [link_for_group(profile, int(v)) for v in sizes]  # the cost model's routing, per group size
    scaleup = np.array([name == "scaleup" for name, _, _ in links])[row]
    bw = np.where(scaleup, np.where(is_ar, p["scaleup_bw_fraction"], p["p2p_bw_fraction"]) * profile.scaleup_bw,
                  np.array([b for _, b, _ in links])[row])
    alpha = np.where(scaleup, np.where(is_ar, p["scaleup_latency_us"], p["p2p_latency_us"]) * 1e-6,
                     np.array([a for _, _, a in links])[row])
    bw_large = np.where(scaleup & ~is_ar, p["p2p_large_bw_fraction"] * profile.scaleup_bw, bw)
    large_bytes = np.where(scaleup & ~is_ar, p["p2p_large_message_mib"] * 2.0 ** 20, np.inf)
    t = _collective_times_nb(is_ar, nbytes, n, bw, alpha, bw_large, large_bytes, int(algorithm))
    return t + np.where(is_ar, p["collective_base_latency_us"] * 1e-6, 0.0)


# -- fitting ------------------------------------------------------------------------------------

def _fit(names, residual, x0s, n_rows: int, what: str, loss: str = "linear", f_scale: float = 1.0) -> dict:
    if n_rows < len(names) + 2:
        raise ConfigError(f"{what}: {n_rows} usable row(s); fitting {len(names)} parameters needs at "
                          f"least {len(names) + 2}")
    lo = np.array([BOUNDS[k][0] for k in names])
    hi = np.array([BOUNDS[k][1] for k in names])
    best = None
    for x0 in x0s:
        x0 = np.clip(np.asarray(x0, dtype=np.float64), lo + 1e-9 * (hi - lo), hi - 1e-9 * (hi - lo))
        res = least_squares(residual, x0, bounds=(lo, hi), x_scale=np.maximum(np.abs(x0), 1e-2 * (hi - lo)),
                            method="trf", diff_step=1e-4, xtol=1e-10, ftol=1e-10, gtol=1e-10, max_nfev=2000,
                            loss=loss, f_scale=f_scale)
        if best is None or res.cost < best.cost:
            best = res
    fitted = {k: float(v) for k, v in zip(names, best.x)}
    for k, v in fitted.items():
        b_lo, b_hi = BOUNDS[k]
        tol = 1e-4 * (b_hi - b_lo)
        if v - b_lo <= tol or b_hi - v <= tol:
            side = "lower" if v - b_lo <= tol else "upper"
            warnings.warn(f"{what}: {k} = {v:.4g} sits at its {side} bound "
                          f"{b_lo if side == 'lower' else b_hi:g}; the formula cannot follow the data "
                          f"there without leaving the physical range", stacklevel=3)
    return fitted


def _usable(frame: pd.DataFrame, mask: np.ndarray) -> pd.DataFrame:
    sub = frame[mask]
    t = sub["time_s"].to_numpy(np.float64)
    return sub[np.isfinite(t) & (t > 0.0)]


# Robust loss for the GEMM fit: tile/wave quantisation gives a saw-tooth residual with long tails that a
# smooth efficiency curve cannot follow; soft-L1 (scipy least_squares, residuals beyond f_scale in log
# time count linearly) keeps those rows from pulling the curve off the bulk.
GEMM_LOSS = {"loss": "soft_l1", "f_scale": 0.1}


def fit_gemm(frame: pd.DataFrame, profile) -> dict:
    """Fit (gemm_max, gemm_half_tokens, kernel_latency_us, hbm_fraction) to the GEMM rows of ``frame``
    (``op_class`` starting ``gemm_``, positive ``time_s``), fp16, on ``profile``'s peak and bandwidth.

    Returns a dict in profile-file units. Warns when a parameter ends at a bound.
    """
    _need(frame, ("op_class", "m", "k", "n", "time_s"), "fit_gemm")
    sub = _usable(frame, frame["op_class"].astype(str).str.startswith("gemm_").to_numpy())
    sub = sub[sub["m"] >= 1]
    log_meas = np.log(sub["time_s"].to_numpy(np.float64))
    m, k, n = (sub[c].to_numpy(np.float64) for c in ("m", "k", "n"))
    peak, bw = profile.peak_flops["fp16"], profile.hbm_bw

    def residual(x):
        t = _gemm_times_nb(m, k, n, FP16_BYTES, FP16_BYTES, peak, bw, x[0], x[1], x[3], x[2] * 1e-6)
        return np.log(t) - log_meas

    start = profile_params(profile)
    x0s = [[start[p] for p in GEMM_PARAMS], [0.7, 64.0, 5.0, 0.8], [0.9, 256.0, 2.0, 0.6]]
    return _fit(GEMM_PARAMS, residual, x0s, len(sub), f"fit_gemm({profile.name})", **GEMM_LOSS)


def fit_collectives(frame: pd.DataFrame, profile, algorithm: int = AUTO) -> dict:
    """Fit the scale-up link to the collective rows of ``frame``: ``COLLECTIVE_PARAMS`` to the
    all-reduce rows (``algorithm``, default auto) and ``P2P_PARAMS`` to the send-recv rows, each
    where such rows exist (they share no parameter). Of the two send-recv rates only those with
    rows on their side of ``p2p_large_message_mib`` (not fitted) are fitted. Dict in file units."""
    _need(frame, ("collective", "nbytes", "num_workers", "time_s"), "fit_collectives")
    sub = _usable(frame, frame["collective"].isin(COLLECTIVES).to_numpy())
    start = profile_params(profile)
    out = {}
    for collective in COLLECTIVES:
        rows = sub[sub["collective"] == collective]
        if rows.empty:
            continue
        names = (COLLECTIVE_PARAMS if collective == "all_reduce"
                 else _p2p_free(rows, start["p2p_large_message_mib"] * 2.0 ** 20))
        x0s = [[LINK_STARTS[k][j] for k in names] for j in (0, 1)]
        log_meas = np.log(rows["time_s"].to_numpy(np.float64))

        def residual(x, rows=rows, names=names, log_meas=log_meas):
            return np.log(predict_collectives(rows, profile, {**start, **dict(zip(names, x))}, algorithm)) - log_meas

        out.update(_fit(names, residual, [[start[k] for k in names]] + x0s, len(rows),
                        f"fit_collectives({profile.name}, {collective})"))
    if not out:
        raise ConfigError(f"fit_collectives({profile.name}): no all_reduce or send_recv rows")
    return out


# Two start points per link parameter, besides the profile's value (the fit keeps the best of the three).
LINK_STARTS = {"scaleup_bw_fraction": (0.5, 0.9), "scaleup_latency_us": (5.0, 1.0),
               "collective_base_latency_us": (10.0, 20.0), "p2p_bw_fraction": (0.5, 0.9),
               "p2p_latency_us": (5.0, 10.0), "p2p_large_bw_fraction": (0.5, 0.9)}


def _p2p_free(rows: pd.DataFrame, large_bytes: float) -> tuple:
    """The send-recv parameters the rows can pin down: each rate only with rows on its side of the step."""
    big = rows["nbytes"].to_numpy(np.float64) > large_bytes
    return tuple(k for k, keep in (("p2p_bw_fraction", (~big).any()), ("p2p_latency_us", True),
                                   ("p2p_large_bw_fraction", big.any())) if keep)


def kind_fractions_present(kinds) -> list:
    """The fitted fraction keys of the kernel kinds in ``kinds`` (not ``stream``: that is hbm_fraction)."""
    return [key for kind, key in KIND_PARAM.items() if kind in kinds and kind != "stream"]


def fit_elementwise(frame: pd.DataFrame, profile, params: dict | None = None, free=None) -> dict:
    """Fit the elementwise parameters to kernel rows (``elementwise_frame``, or copy rows of kind
    ``stream``): the fraction of each kind present and ``elementwise_latency_us``; ``free`` overrides
    which (e.g. add ``hbm_fraction`` when only copies were measured). Other values come from
    ``params`` (default: the profile). Dict in file units."""
    _need(frame, ("time_s", "kind", "nbytes"), "fit_elementwise")
    sub = _usable(frame, np.ones(len(frame), dtype=bool))
    if free is None:
        present = set(sub["kind"])
        free = kind_fractions_present(present) + ["elementwise_latency_us"]
    names = tuple(free)
    base = _params(profile, params)
    log_meas = np.log(sub["time_s"].to_numpy(np.float64))

    def residual(x):
        return np.log(predict_elementwise(sub, profile, {**base, **dict(zip(names, x))})) - log_meas

    x0s = [[base[k] for k in names], [0.5 if k != "elementwise_latency_us" else 3.0 for k in names]]
    return _fit(names, residual, x0s, len(sub), f"fit_elementwise({profile.name})")


# -- errors -------------------------------------------------------------------------------------

def relative_errors(pred, meas) -> np.ndarray:
    """Signed relative error pred / meas - 1 (0.1 = predicted 10% slower than measured)."""
    pred = np.asarray(pred, dtype=np.float64)
    meas = np.asarray(meas, dtype=np.float64)
    return pred / meas - 1.0


def error_summary(frame: pd.DataFrame, by, pred: str = "pred_s", meas: str = "time_s") -> pd.DataFrame:
    """Per group: n, median and p90 of |pred/meas - 1|, and the median signed error (bias)."""
    err = relative_errors(frame[pred], frame[meas])
    work = frame[list(by)].copy()
    work["abs_err"] = np.abs(err)
    work["err"] = err
    g = work.groupby(list(by), sort=False)
    return pd.DataFrame({
        "n": g.size(),
        "median_rel_err": g["abs_err"].median(),
        "p90_rel_err": g["abs_err"].quantile(0.9),
        "median_signed_err": g["err"].median(),
    }).reset_index()


__all__ = ["BOUNDS", "VIDUR_NETWORK_BYTES_PER_SIZE", "COLLECTIVE_PARAMS", "ELEMENTWISE_PARAMS", "GEMM_OPS",
           "GEMM_PARAMS", "KIND_PARAM", "P2P_PARAMS", "elementwise_frame", "layer_sums",
           "error_summary", "fit_collectives", "fit_gemm", "predict_collectives", "predict_elementwise",
           "predict_gemm", "profile_params", "read_vidur_mlp", "read_vidur_network", "relative_errors"]
