"""Held-out checks of the vLLM end-to-end fit: the splits, and the figures read from their rows.

The fit (``experiments/fit_vllm_host.py``) refits the engine's end-to-end parameters once per fold of
each split and predicts the rows left out; it writes every prediction to
``experiments/results/vllm_validation_rows.csv`` (shipped), which ``servesim validate --suite vllm``
reports and ``--check`` checks (``check``), and from which the model-error intervals are taken
(``servesim/model_error.py``). Splits, each a test of extrapolation rather than recall:

- ``lodo``: leave one deployment out (13 folds);
- ``stage``: fit on stage 0 of every deployment (the lower rate), predict stage 1 (the higher rate);
- ``workload``: leave one workload kind out (general-lite, codegen, roleplay, reasoning-lite);
- ``family``: leave one model family out (dense, MoE).
"""
from __future__ import annotations

import hashlib
import json
import math

import pandas as pd

from servesim.errors import ConfigError

SPLITS = ("lodo", "stage", "workload", "family")
SPLIT_TEXT = {
    "lodo": "leave one deployment out, each predicted with the parameters fitted on the other 12",
    "stage": "fitted on stage 0 of every deployment (the lower rate), stage 1 predicted (the higher rate)",
    "workload": "leave one workload kind out (general-lite, codegen, roleplay, reasoning-lite)",
    "family": "leave one model family out (dense: 9 deployments, MoE: the 4 Llama-4-Scout ones)",
}
WORKLOADS = ("general-lite", "codegen", "roleplay", "reasoning-lite")
MOE_MODELS = ("llama-4-scout",)
# --check tolerances on held-out medians (issue #23): split -> {metric: tolerance}; signed bias per load stage
TOLERANCE = {"lodo": {"e2e_mean": 0.10, "ttft_mean": 0.15, "itl_mean": 0.10},
             "stage": {"e2e_mean": 0.10, "ttft_mean": 0.15, "itl_mean": 0.10}}
STAGE_BIAS = 0.05
ROWS_FILE = "vllm_validation_rows.csv"
PROFILE_KEYS = ("graph_overlap", "step_gpu_us", "host_step_us", "host_per_seq_us", "frontend_us")


def workload_of(experiment: str) -> str:
    name = str(experiment)
    for w in sorted(WORKLOADS, key=len, reverse=True):
        if w in name:
            return w
    raise ConfigError(f"vllm suite: no workload kind in the experiment name {name!r}; known: {', '.join(WORKLOADS)}")


def family_of(experiment: str) -> str:
    return "moe" if any(m in str(experiment) for m in MOE_MODELS) else "dense"


def folds(df: pd.DataFrame, split: str):
    """(fold name, fitted (experiment, stage) keys, held-out keys) of one split over the suite's rows."""
    keys = sorted({(e, int(s)) for e, s in zip(df.experiment, df.stage)})
    if split == "lodo":
        for e in sorted({k[0] for k in keys}):
            yield e, {k for k in keys if k[0] != e}, {k for k in keys if k[0] == e}
    elif split == "stage":
        yield "stage0->stage1", {k for k in keys if k[1] == 0}, {k for k in keys if k[1] == 1}
    elif split in ("workload", "family"):
        label = workload_of if split == "workload" else family_of
        for g in sorted({label(k[0]) for k in keys}):
            yield g, {k for k in keys if label(k[0]) != g}, {k for k in keys if label(k[0]) == g}
    else:
        raise ConfigError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")


def pct(x) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def spct(x) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:+.1f}%"


def medians(rows: pd.DataFrame) -> dict:
    """Median |error| per metric, signed medians of E2E and ITL, and the number of (run, stage) rows."""
    out = {"n": int(rows.groupby(["experiment", "stage"]).ngroups) if len(rows) else 0}
    for m in ("e2e_mean", "ttft_mean", "itl_mean", "e2e_p90", "ttft_p90"):
        e = rows[rows.metric == m].rel_error.astype(float)
        out[m] = float(e.abs().median()) if len(e) else float("nan")
    for m in ("e2e_mean", "itl_mean"):
        e = rows[rows.metric == m].rel_error.astype(float)
        out[f"signed_{m}"] = float(e.median()) if len(e) else float("nan")
    return out


def stage_bias(rows: pd.DataFrame) -> pd.DataFrame:
    """Signed median error per load stage (0, 1) of mean E2E, TTFT and ITL."""
    r = rows[rows.stage >= 0]
    if r.empty:
        return pd.DataFrame()
    p = r.pivot_table(index="stage", columns="metric", values="rel_error", aggfunc="median")
    p["n"] = r[r.metric == "e2e_mean"].groupby("stage").size()
    return p


def profile_key(values: dict) -> str:
    """Short hash of the end-to-end values a set of rows was produced with."""
    text = json.dumps({k: round(float(values[k]), 6) for k in PROFILE_KEYS}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def current_key() -> str:
    """``profile_key`` of the shipped vllm h100-sxm table."""
    from servesim.config import load_hardware
    from servesim.config.engine import load_engine
    f = load_engine("vllm").fit_for(load_hardware("h100-sxm"))
    return profile_key({"graph_overlap": f.graph_overlap, "step_gpu_us": f.step_gpu_s * 1e6,
                        "host_step_us": f.host_step_s * 1e6, "host_per_seq_us": f.host_per_seq_s * 1e6,
                        "frontend_us": f.frontend_s * 1e6})


def load_rows() -> pd.DataFrame:
    """The shipped held-out rows (experiments/results/vllm_validation_rows.csv)."""
    from servesim.paths import results_dir
    path = results_dir() / ROWS_FILE
    if not path.is_file():
        raise ConfigError(f"{path}: missing; run python experiments/fit_vllm_host.py")
    return pd.read_csv(path)


def summary(rows: pd.DataFrame | None = None) -> dict:
    """Per split: medians of whole runs and of load stages; the signed bias per load stage (LODO rows); whether the
    rows were produced with the shipped profile (``stale`` when not); ``failed``: what --check refuses."""
    rows = load_rows() if rows is None else rows
    out = {"splits": {}, "failed": []}
    stale = "profile" in rows and rows["profile"].iloc[0] != current_key()
    out["stale"] = bool(stale)
    for split in ("fitted",) + SPLITS:
        part = rows[rows.split == split]
        if part.empty:
            continue
        out["splits"][split] = {"whole": medians(part[part.stage == -1]), "stages": medians(part[part.stage >= 0]),
                                "text": SPLIT_TEXT.get(split, "all 13 fitted, in sample")}
    for split, tol in TOLERANCE.items():
        s = out["splits"].get(split)
        if s is None:
            out["failed"].append(f"{split}: no held-out rows")
            continue
        block = s["stages"] if split == "stage" else s["whole"]
        for metric, t in tol.items():
            if not block[metric] <= t:
                out["failed"].append(f"{split} {metric} median {pct(block[metric])} > {pct(t)}")
    bias = stage_bias(rows[rows.split == "lodo"])   # each load stage of each deployment, held out
    out["stage_bias"] = {int(st): {m: float(r[m]) for m in ("e2e_mean", "ttft_mean", "itl_mean")}
                         for st, r in bias.iterrows()} if len(bias) else {}
    for st, b in out["stage_bias"].items():
        for m, v in b.items():
            if not abs(v) <= STAGE_BIAS:
                out["failed"].append(f"stage {st} signed {m} {spct(v)} beyond +-{pct(STAGE_BIAS)}")
    if stale:
        out["failed"].append("held-out rows were produced with other end-to-end values than the shipped profile; "
                             "rerun python experiments/fit_vllm_host.py")
    return out


__all__ = ["SPLITS", "SPLIT_TEXT", "STAGE_BIAS", "TOLERANCE", "current_key", "family_of", "folds", "load_rows",
           "medians", "pct", "profile_key", "spct", "stage_bias", "summary", "workload_of"]
