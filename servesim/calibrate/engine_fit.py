"""`servesim calibrate --aiconfigurator DIR`: fit an engine profile's kernel keys on one GPU's
AIConfigurator tables, and write the engine profile.

Input: a folder in AIConfigurator's layout for one GPU, either ``<gpu>/`` holding
``<engine>-<version>/`` folders (the one of the base engine is taken) or one ``<engine>-<version>/``
folder; tables ``gemm_perf``, ``context_attention_perf``, ``generation_attention_perf``,
``custom_allreduce_perf``, ``moe_perf`` as ``.csv`` (as AIConfigurator writes them) or ``.csv.gz``
(as servesim ships them). Read and fitted by ``engine_kernels`` (the frame readers, fit functions,
``group_folds`` and ``cross_validate`` of ``experiments/fit_engine_kernels.py``), class by class:

===================  =========================================  ============================================
class                table (rows) -> keys                       held out
===================  =========================================  ============================================
GEMM bf16            gemm_perf -> GEMM_PARAMS                   k-fold by (n, k) shape
GEMM fp8             gemm_perf fp8, GPUs with an fp8 peak       k-fold by (n, k) shape
                     -> GEMM_FP8_PARAMS
prefill attention    context_attention_perf, bf16 KV            k-fold by (heads, kv_heads)
                     -> PREFILL_PARAMS
decode attention     generation_attention_perf, bf16 KV         k-fold by (heads, kv_heads)
                     -> DECODE_PARAMS
all-reduce           custom_allreduce_perf -> ALLREDUCE_PARAMS  one GPU count at a time
                     (the eager launch only with eager rows)
fused MoE            moe_perf, balanced router -> MOE_PARAMS /  k-fold by (hidden, inter, experts, topk)
                     MOE_FP8_PARAMS (dtypes present), pair
===================  =========================================  ============================================

k = 5, or the number of groups when fewer (seed 0, as the experiment). Fp8, all-reduce and MoE use
the GEMM keys just fitted (the base profile's without a GEMM table). Keys no table gives (and every
class whose table is absent or has no usable rows) keep the base engine profile's values for the
GPU, and the table's ``fit_source`` names them.
"""
from __future__ import annotations

import math
import re
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.calibrate import engine_kernels as ek
from servesim.errors import ConfigError

FOLDS = 5
SEED = 0
FAMILIES = ("vllm", "sglang", "trtllm")
TABLES = ("gemm_perf", "context_attention_perf", "generation_attention_perf", "custom_allreduce_perf", "moe_perf")
IMPLAUSIBLE_LOG_RES = math.log(3.0)   # a fitted class a median 3x off its rows: not the formula's kernel or units


@dataclass
class KernelFit:
    folder: str                       # the <engine>-<version> folder read
    values: dict                      # fitted keys, file units
    fitted: list                      # "class (n rows)" per fitted class
    kept: list                        # "class: why" per class that kept the base values
    residuals: pd.DataFrame           # kind, group, label, source, measured, predicted, rel_error
    holdout: list = field(default_factory=list)
    warnings: list = field(default_factory=list)


def _show(path) -> str:
    from servesim.calibrate.operators import _show as show
    return show(path)


def family(name: str) -> str | None:
    """The engine family (vllm, sglang, trtllm) of an engine profile or folder name: the name itself,
    its prefix before ``-``, or a family named inside it (``my-vllm``); None when none fits."""
    low = name.lower()
    head = low.split("-")[0]
    if head in FAMILIES:
        return head
    found = [f for f in FAMILIES if f in low]
    return found[0] if len(found) == 1 else None


def _has_tables(folder: Path) -> bool:
    return any(ek.table_file(folder, t) is not None for t in TABLES)


def resolve_folder(path, engine_name: str) -> Path:
    """The ``<engine>-<version>`` folder of ``--aiconfigurator path`` for base engine ``engine_name``."""
    path = Path(path)
    opt = f"--aiconfigurator {path}"
    if not path.is_dir():
        raise ConfigError(f"{opt}: no such folder; give an AIConfigurator <gpu>/ folder or one of its "
                          f"<engine>-<version>/ folders")
    want = family(engine_name)
    tables = ", ".join(f"{t}.csv" for t in TABLES)
    if _has_tables(path):
        have = family(path.name)
        if want and have and have != want:
            raise ConfigError(f"{opt}: holds {have} tables but --engine is {engine_name}; pass --engine {have} "
                              f"or the {want}-<version> folder")
        return path
    subs = sorted(p for p in path.iterdir() if p.is_dir() and _has_tables(p))
    if not subs:
        raise ConfigError(f"{opt}: no AIConfigurator tables ({tables}, or .csv.gz) in it or in its "
                          f"<engine>-<version>/ folders")
    names = ", ".join(p.name for p in subs)
    if want is None:
        if len(subs) == 1:
            return subs[0]
        raise ConfigError(f"{opt}: holds {names}; the engine of --engine {engine_name} is not one of "
                          f"{', '.join(FAMILIES)}, so pass the folder to fit")
    match = [p for p in subs if family(p.name) == want]
    if not match:
        raise ConfigError(f"{opt}: no {want}-<version> folder; it holds {names}; pass --engine for one of "
                          f"them or another folder")
    if len(match) > 1:
        raise ConfigError(f"{opt}: several {want} folders ({', '.join(p.name for p in match)}); pass one of them")
    return match[0]


# -- fitting ------------------------------------------------------------------------------------

def _capture(fn, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [str(w.message) for w in caught]


def _quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


def _held_out(kind: str, frame: pd.DataFrame, groups, what: str, fit, predict, leave_one: bool = False) -> dict:
    """Held-out error of one class: refits with whole groups left out (``group_folds``, or one group
    at a time with ``leave_one``), each predicting the rows it never saw."""
    groups = np.asarray(groups).astype(str)
    uniq = sorted(set(groups))
    if len(uniq) < 2:
        return {"kind": kind, "held_out": what, "n": len(frame), "median_rel_err": np.nan, "p90_rel_err": np.nan,
                "note": "one group only: no held-out check"}
    if leave_one:
        folds = np.array([uniq.index(g) for g in groups], dtype=np.int64)
        label = f"one {what} at a time"
    else:
        k = min(FOLDS, len(uniq))
        folds = ek.group_folds(groups, k, SEED)
        label = f"{k}-fold by {what}"
    try:
        pred, _ = ek.cross_validate(frame, folds, lambda tr: _quiet(fit, tr), predict)
    except ConfigError as e:
        return {"kind": kind, "held_out": label, "n": len(frame), "median_rel_err": np.nan, "p90_rel_err": np.nan,
                "note": str(e)}
    err = np.abs(pred / frame["time_s"].to_numpy() - 1.0)
    return {"kind": kind, "held_out": label, "n": len(frame), "median_rel_err": float(np.median(err)),
            "p90_rel_err": float(np.quantile(err, 0.9)), "note": ""}


def _residuals(kind: str, frame: pd.DataFrame, pred: np.ndarray, group: str, label_cols, source: str):
    label = frame[label_cols].astype(str).agg(" ".join, axis=1)
    meas = frame["time_s"].to_numpy()
    log_res = np.log(pred / meas)
    med = float(np.median(np.abs(log_res)))
    if med > IMPLAUSIBLE_LOG_RES:
        raise ConfigError(f"{source}: the {kind} fit is a median {math.exp(med):.0f}x off its rows; AIConfigurator's "
                          f"latency column is milliseconds per call: check the units; no profile written")
    return pd.DataFrame({"kind": kind, "group": frame[group].astype(str).to_numpy(), "label": label.to_numpy(),
                         "source": source, "measured": meas, "predicted": pred, "rel_error": pred / meas - 1.0})


def fit_kernels(folder, hw, base: dict, engine: str, holdout: bool = True) -> KernelFit:
    """Fit every class whose table is in ``folder`` on hardware ``hw``; ``base``: the base engine
    profile's values for the GPU (file units, every FIT_KEYS key), used for what is not fitted."""
    folder = Path(folder)
    src = _show(folder)
    gpu = folder.parent.name or "gpu"
    values, fitted, kept, res, hold, warn = {}, [], [], [], [], []

    def absent(cls, table, why=None):
        kept.append(f"{cls}: {why or f'no {table} table'}")

    def run(kind, frame, keys, fit, predict, group, what, labels, leave_one=False):
        params, w = _capture(fit, frame)
        warn.extend(f"{kind}: {m}" for m in w)
        res.append(_residuals(kind, frame, predict(frame, params), group, labels, src))
        if holdout:
            hold.append(_held_out(kind, frame, frame[group], what, fit, predict, leave_one))
        values.update({k: params[k] for k in keys if k in params})
        fitted.append(f"{kind} ({len(frame)} rows)")
        return params

    gemm = {k: base[k] for k in ek.GEMM_PARAMS}
    if ek.table_file(folder, "gemm_perf") is None:
        absent("GEMM", "gemm_perf")
    else:
        f = ek.gemm_frame(gpu, engines=(engine,), folder=folder)
        f = f[f["in_range"]]
        bf = f[f["dtype"] == "bf16"]
        if bf.empty:
            absent("GEMM bf16", "gemm_perf", "no bf16 rows in gemm_perf")
        else:
            gemm = run("GEMM bf16", bf, ek.GEMM_PARAMS, lambda tr: ek.fit_gemm(tr, hw),
                       lambda te, p: ek.predict_gemm(te, hw, p), "shape", "(n, k) shape", ["m", "n", "k"])
            gemm = {k: gemm[k] for k in ek.GEMM_PARAMS}
        f8 = f[f["dtype"] == "fp8"]
        if f8.empty:
            absent("GEMM fp8", "gemm_perf", "no fp8 rows in gemm_perf")
        elif hw.peak_flops["fp8"] <= 0.0:
            absent("GEMM fp8", "gemm_perf", f"{hw.name} has no fp8 peak")
        else:
            run("GEMM fp8", f8, ek.GEMM_FP8_PARAMS, lambda tr: ek.fit_gemm_fp8(tr, hw, gemm),
                lambda te, p: ek.predict_gemm(te, hw, gemm, p), "shape", "(n, k) shape", ["m", "n", "k"])

    for cls, table, reader, fit, predict, labels in (
            ("prefill attention", "context_attention_perf", ek.prefill_frame, ek.fit_prefill, ek.predict_prefill,
             ["seqs", "chunk", "heads", "kv_heads"]),
            ("decode attention", "generation_attention_perf", ek.decode_frame, ek.fit_decode, ek.predict_decode,
             ["seqs", "kv_tokens", "heads", "kv_heads"])):
        if ek.table_file(folder, table) is None:
            absent(cls, table)
            continue
        f = reader(gpu, engine, folder=folder)
        f = f[f["in_range"] & (f["kv_dtype"] == "bf16")]
        if f.empty:
            absent(cls, table, f"no bf16-KV rows with heads / kv_heads <= {ek.MAX_GQA_GROUP} in {table}")
            continue
        keys = ek.PREFILL_PARAMS if table.startswith("context") else ek.DECODE_PARAMS
        run(cls, f, keys, lambda tr, fit=fit: fit(tr, hw), lambda te, p, predict=predict: predict(te, hw, p),
            "heads_group", "(heads, kv_heads)", labels)

    if ek.table_file(folder, "custom_allreduce_perf") is None:
        absent("all-reduce", "custom_allreduce_perf")
    elif hw.scaleup_bw <= 0.0:
        absent("all-reduce", "custom_allreduce_perf", f"{hw.name} has no scale-up link to price it on")
    else:
        f = ek.allreduce_frame(gpu, engine, folder=folder)
        hf = gemm["gemm_hbm_fraction"]
        run("all-reduce", f, ek.ALLREDUCE_PARAMS, lambda tr: ek.fit_allreduce(tr, hw, hf),
            lambda te, p: ek.predict_allreduce(te, hw, p, hf), "n", "GPU count", ["n", "nbytes", "eager"],
            leave_one=True)
        if not f["eager"].any():
            kept.append("allreduce_eager_launch_us: no eager rows in custom_allreduce_perf")

    if ek.table_file(folder, "moe_perf") is None:
        absent("fused MoE", "moe_perf")
    else:
        f = ek.moe_frame(gpu, engine, folder=folder)
        f = None if f is None else f[f["in_range"]]
        if f is None or f.empty:
            absent("fused MoE", "moe_perf", "no balanced-router bf16 or fp8 rows in moe_perf")
        else:
            if (f["dtype"] == "fp8").any() and hw.peak_flops["fp8"] <= 0.0:
                f = f[f["dtype"] == "bf16"]
                kept.append(f"fused MoE fp8: {hw.name} has no fp8 peak")
            run("fused MoE", f, ek.MOE_PARAMS + ek.MOE_FP8_PARAMS + ek.MOE_SHARED_PARAMS,
                lambda tr: ek.fit_moe(tr, hw, gemm), lambda te, p: ek.predict_moe(te, hw, gemm, p), "shape",
                "(hidden, inter, experts, topk) shape", ["dtype", "tokens", "shape"])
            for dtype in ("bf16", "fp8"):
                if not (f["dtype"] == dtype).any():
                    kept.append(f"fused MoE {dtype}: no {dtype} rows in moe_perf")
    if not fitted:
        raise ConfigError(f"--aiconfigurator {src}: no class could be fitted ({'; '.join(kept)}); "
                          f"no profile written")
    empty = pd.DataFrame(columns=["kind", "group", "label", "source", "measured", "predicted", "rel_error"])
    return KernelFit(folder=src, values=values, fitted=fitted, kept=kept,
                     residuals=pd.concat(res, ignore_index=True) if res else empty, holdout=hold, warnings=warn)


# -- the engine profile file --------------------------------------------------------------------

def file_values(fit) -> dict:
    """An EngineFit's values in file units, keyed by the FIT_KEYS file keys."""
    from servesim.config.engine import FIT_KEYS
    out = {}
    for key, fld, _ in FIT_KEYS:
        out[key] = getattr(fit, fld) * (1e6 if key.endswith("_us") else 1.0)
    return out


def si_values(values: dict) -> dict:
    """File-unit FIT_KEYS values -> EngineFit fields (SI)."""
    from servesim.config.engine import FIT_KEYS
    field_of = {key: fld for key, fld, _ in FIT_KEYS}
    return {field_of[k]: v * (1e-6 if k.endswith("_us") else 1.0) for k, v in values.items()}


def check_engine_output(output, force: bool) -> Path:
    from servesim.config.engine import list_engines
    out = Path(output)
    if out.suffix != ".toml":
        raise ConfigError(f"--engine-output {output}: an engine profile must end in .toml")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", out.stem):
        raise ConfigError(f"--engine-output {output}: name the file with letters, digits, '.', '_' and '-' only")
    if out.exists() and not force:
        raise ConfigError(f"--engine-output {output}: file exists; pass --force to overwrite it")
    if out.stem in list_engines() and not force:
        raise ConfigError(f"--engine-output {output}: {out.stem!r} is a shipped engine name; choose another "
                          f"name or pass --force")
    return out


def engine_profile_text(base_path, name: str, table: str, values: dict, fit_source: str) -> str:
    """Text of a new engine profile: a copy of ``base_path`` named ``name`` whose ``[hardware.<table>]``
    holds ``values`` (file units, every FIT_KEYS key), checked by loading it before anything is written."""
    from servesim.calibrate.profile_io import update_engine_profile
    from servesim.config.engine import load_engine
    text = Path(base_path).read_text()
    text, n = re.subn(r'^name\s*=\s*"[^"\n]*"', lambda _: f'name = "{name}"', text, count=1, flags=re.M)
    if n != 1:
        raise ConfigError(f"{base_path}: no name line")
    with tempfile.TemporaryDirectory() as tmp:
        trial = Path(tmp) / f"{name}.toml"
        trial.write_text(text)
        text = update_engine_profile(trial, table, values, fit_source)
        trial.write_text(text)
        load_engine(str(trial))
    return text


__all__ = ["KernelFit", "check_engine_output", "engine_profile_text", "family", "file_values", "fit_kernels",
           "resolve_folder", "si_values"]
