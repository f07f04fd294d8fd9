"""Residuals for the model-error intervals (servesim/model_error.py), and the coverage of those intervals.

    python experiments/model_error.py     # ~2 min on 2 cores; writes experiments/results/model_error.json and .md

Inputs, all predictions of rows the model was not fitted on:
- latency: experiments/results/vllm_validation_rows.csv (experiments/fit_vllm_host.py), every held-out
  split; each row gets the deployment's model family and the load of its stage relative to the capacity
  the shipped profile simulates for it (rho = stage rate / maximum sustainable rate of that stage's load
  as one Poisson stage; the whole run takes its highest stage's rho);
- throughput: experiments/results/serving_validation_rows.csv, the held-out TensorRT-LLM maximum-throughput
  rows (experiments/validate_serving.py);
- carry-over: whole steps (decode and mixed, every model and TP of experiments/step_table.py) of a100-sxm-80gb,
  h200-sxm and b200 priced with h100-sxm's vLLM kernel fit at their own datasheet figures, against their
  own kernel tables: the error of borrowing a GPU's efficiencies.
Coverage: each deployment's held-out residuals against the 80% interval built from the other deployments'.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servesim import model_error as me  # noqa: E402
from servesim.calibrate import step_check as sc  # noqa: E402
from servesim.calibrate import vllm_heldout as vh  # noqa: E402
from servesim.calibrate import vllm_serving as vs  # noqa: E402
from servesim.config import list_models, load_hardware  # noqa: E402
from servesim.config.engine import load_engine  # noqa: E402
from servesim.config.model import list_hf_models  # noqa: E402
from servesim.planning.capacity import capacity  # noqa: E402

RESULTS = ROOT / "experiments" / "results"
METRICS = ("e2e_mean", "ttft_mean", "itl_mean")


def stage_rho(df: pd.DataFrame) -> dict:
    """{(experiment, stage): offered / simulated capacity}, stage -1 the highest of its stages."""
    deps = vs.deployments(df)
    out = {}
    for row in deps.itertuples(index=False):
        stages = [s.split("x") for s in str(row.stages).split(";")]
        rhos = []
        for i, (rate, dur) in enumerate(stages):
            rate = float(rate)
            cfg = vs.config_of(row, stages=None, rate=rate, num_requests=1500)
            cap = capacity(cfg, rate)
            rho = rate / cap["max_sustainable_rate"] if cap["max_sustainable_rate"] else float("inf")
            out[(row.experiment, i)] = rho
            rhos.append(rho)
            print(f"  {row.experiment} stage {i}: {rate} req/s, capacity {cap['max_sustainable_rate']}, rho {rho:.2f}",
                  flush=True)
        out[(row.experiment, -1)] = max(rhos)
    return out


def carry_over() -> list:
    eng = load_engine("vllm")
    h100 = eng.fits["h100-sxm"]
    models = list_models() + list_hf_models()
    errs = []
    for hw in ("a100-sxm-80gb", "h200-sxm", "b200"):
        borrowed = dataclasses.replace(eng, fits={hw: h100})
        own = sc.step_table(models, [hw], contexts=(512, 2048))
        # the same steps with h100-sxm's efficiencies: step_table reloads the engine, so price directly
        tables = sc.load_tables(sc.TABLE_GPUS[hw])
        hwp = load_hardware(hw)
        from servesim.config import load_model
        keys = own[["model", "tp", "kind", "batch", "context", "chunk"]].drop_duplicates()
        for k in keys.itertuples(index=False):
            step = sc.Step(int(k.batch), int(k.context), int(k.chunk), budget=(k.kind == "budget"))
            parts = sc.step_classes(load_model(k.model), hwp, int(k.tp), step, borrowed, tables)
            tab = sum(t for c, (t, _) in parts.items() if c != "elementwise")
            mod = sum(m for c, (_, m) in parts.items() if c != "elementwise")
            if np.isfinite(tab) and tab > 0:
                errs.append(mod / tab - 1.0)
    return errs


RHO = {"low": 0.3, "mid": 0.65, "high": 0.9, "unknown": None}   # a rho inside each load class


def coverage(data: dict, min_class: int = me.MIN_CLASS) -> dict:
    """Per metric: share of each deployment's held-out rows inside the 80% interval that
    servesim.model_error states for its class, built from the other deployments' residuals."""
    lat = data["latency"]
    inside = {m: [] for m in METRICS}
    saved, saved_min = me.residuals, me.MIN_CLASS
    me.MIN_CLASS = min_class
    try:
        for exp in sorted({r["experiment"] for r in lat}):
            others = dict(data, latency=[r for r in lat if r["experiment"] != exp])
            me.residuals = lambda d=others: d
            mine = [r for r in lat if r["experiment"] == exp]
            for key in sorted({r["key"] for r in mine}):
                rows = [r for r in mine if r["key"] == key]
                block = me.model_error({b: {"mean": 100.0} for b in ("e2e_ms", "ttft_ms", "itl_ms")},
                                       family=rows[0]["family"], tables=True, rho=RHO[rows[0]["load"]])
                for r in rows:
                    lo, hi = block[f"{r['metric'].replace('_mean', '_ms')}_mean"]
                    inside[r["metric"]].append(lo <= 100.0 / (1.0 + r["rel_error"]) <= hi)
    finally:
        me.residuals, me.MIN_CLASS = saved, saved_min
    return {m: float(np.mean(v)) for m, v in inside.items()}


def main():
    df = vs.load()
    rows = pd.read_csv(RESULTS / "vllm_validation_rows.csv")
    held = rows[(rows.split != "fitted") & rows.metric.isin(METRICS)].copy()
    rho = stage_rho(df)
    lat = []
    for r in held.itertuples(index=False):
        x = rho.get((r.experiment, int(r.stage)), float("nan"))
        lat.append({"split": r.split, "experiment": r.experiment, "stage": int(r.stage),
                    "key": f"{r.experiment}|{r.stage}", "metric": r.metric,
                    "rel_error": round(float(r.rel_error), 5), "family": vh.family_of(r.experiment),
                    "load": me.load_class(x), "rho": round(float(x), 3)})
    srv = pd.read_csv(RESULTS / "serving_validation_rows.csv")
    tp = srv[srv.split.str.startswith("held out (offline_max_throughput)") & srv.rel_error.notna()].rel_error
    carry = carry_over()
    data = {"generated_by": "experiments/model_error.py", "level": me.LEVEL,
            "source": {"latency": "experiments/results/vllm_validation_rows.csv (held-out splits of the vLLM suite)",
                       "throughput": "experiments/results/serving_validation_rows.csv (held-out TensorRT-LLM "
                                     "maximum-throughput rows)",
                       "carry_over": "experiments/model_error.py: a100-sxm-80gb, h200-sxm, b200 steps priced with "
                                     "h100-sxm's vLLM kernel fit against their own tables"},
            "latency": lat, "throughput": {"samples": [round(float(v), 5) for v in tp]},
            "carry_over": {"samples": [round(float(v), 5) for v in carry]}}
    data["coverage"] = coverage(data)
    by_class = coverage(data, min_class=1)     # every class used, however few deployments it holds
    (RESULTS / "model_error.json").write_text(json.dumps(data, indent=0, sort_keys=False) + "\n")
    me.residuals.cache_clear()     # the simulations above read the previous file
    f = pd.DataFrame(lat)
    md = ["# Model-error intervals: the residuals and their coverage", "",
          "Generated by `python experiments/model_error.py` (method in `servesim/model_error.py`).", "",
          "80% intervals (10th-90th percentile of predicted / measured - 1) per class, held-out rows:", "",
          "| family | load (rho) | runs/stages | E2E mean | TTFT mean | ITL mean |", "|---|---|---:|---|---|---|"]
    for fam in ("dense", "moe", "all"):
        for load in ("low", "mid", "high", "all"):
            part = f[((f.family == fam) | (fam == "all")) & ((f.load == load) | (load == "all"))]
            if part.empty:
                continue
            cells = []
            for m in METRICS:
                q = me.quantiles(part[part.metric == m].rel_error)
                cells.append(f"{100 * q[0]:+.1f}% .. {100 * q[1]:+.1f}%")
            md.append(f"| {fam} | {load} | {part.key.nunique()} | " + " | ".join(cells) + " |")
    qt = me.quantiles(tp)
    qc = me.quantiles(carry)
    md += ["", f"Throughput (held-out TensorRT-LLM maximum throughput, {len(tp)} rows): {100 * qt[0]:+.1f}% .. "
               f"{100 * qt[1]:+.1f}%. Carrying h100-sxm's kernel fit to another GPU ({len(carry)} steps): "
               f"{100 * qc[0]:+.1f}% .. {100 * qc[1]:+.1f}%.", "",
           "Coverage of the stated 80% interval on each deployment's held-out rows, the interval built from the "
           f"other deployments' residuals (target 70-90%), as servesim/model_error.py states it (a class needs "
           f"residuals of {me.MIN_CLASS} deployments, else pooled): "
           + ", ".join(f"{m} {100 * v:.0f}%" for m, v in data["coverage"].items())
           + "; with every (family, load) class used however small: "
           + ", ".join(f"{m} {100 * v:.0f}%" for m, v in by_class.items()) + ".", "",
           f"Default `plan --model-margin` (the worst 10th-percentile under-prediction of the three means in the "
           f"class used for high load): {100 * me.margin_default('dense'):.1f}% dense, "
           f"{100 * me.margin_default('moe'):.1f}% MoE."]
    (RESULTS / "model_error.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
